"""Faults: ``gangslice serve`` killed with SIGKILL between reservation and binding; kube-apiserver restarted.

Nodes (pool ``flt``): spine s1, leaves a and b of two HGX H100 nodes each. A gang of two 8-GPU pods fills one
leaf; with only its first member created, its reservation holds a whole node that kube-scheduler sees as free
and nothing else may take. Both faults happen while that hold exists.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    LEAF,
    Gangslice,
    create,
    delete,
    double_booked,
    dump,
    extender_stack,
    gang_pods,
    get,
    gpu_pod,
    gpus_of,
    hgx_leaves,
    items,
    node_of,
    reserved_nodes,
    scheduled_condition,
    wait_for,
    wait_for_or_false,
)

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

POOL = "flt"
NODES = hgx_leaves(POOL, 2)
LEAF_OF = {n.name: n.leaf for n in NODES}


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(control_plane, POOL, NODES, name="gangslice-faults") as server:
        yield server


def in_ns(pod: dict[str, Any], ns: str) -> dict[str, Any]:
    return {**pod, "metadata": {**pod["metadata"], "namespace": ns}}


def unschedulable(cp: ControlPlane, ns: str, name: str) -> bool:
    cond = scheduled_condition(get(cp, "Pod", name, ns) or {})
    return bool(cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable")


def hold_one_member(cp: ControlPlane, ns: str) -> tuple[str, str]:
    """Create only the first member of a 2 x 8-GPU plain gang: gangslice reserves the whole gang's slice and
    binds that one. Returns (the first member's node, the node held for the second), both on one leaf.

    The held node is free as far as kube-scheduler can tell; only gangslice's ledger keeps it."""
    first, _ = gang_pods("llm", 2, 8, POOL)
    create(cp, in_ns(first, ns))
    first_node = wait_for("llm-0 bound", lambda: node_of(cp, ns, "llm-0"), 60)
    (reservation,) = wait_for("the gang's SliceReservation", lambda: items(cp, "SliceReservation", ns), 30)
    slot_nodes = reserved_nodes(reservation)
    assert first_node in slot_nodes and len(set(slot_nodes)) == 2, slot_nodes
    (held,) = set(slot_nodes) - {first_node}
    assert LEAF_OF[held] == LEAF_OF[first_node]
    return first_node, held


def rival_kept_off(cp: ControlPlane, ns: str, held: str) -> None:
    """A rival 8-GPU pod allowed only on the gang's leaf must not get the node held for llm-1."""
    rival = gpu_pod("rival", 8, POOL)
    rival["spec"]["nodeSelector"][LEAF] = LEAF_OF[held]
    create(cp, in_ns(rival, ns))
    wait_for("rival marked Unschedulable", lambda: unschedulable(cp, ns, "rival"), 60)
    assert node_of(cp, ns, "rival") is None, f"rival bound to {node_of(cp, ns, 'rival')}, held {held}"


def late_member_lands_on(cp: ControlPlane, ns: str, held: str) -> None:
    _, second = gang_pods("llm", 2, 8, POOL)
    create(cp, in_ns(second, ns))
    assert wait_for("llm-1 bound", lambda: node_of(cp, ns, "llm-1"), 60) == held
    assert sorted(gpus_of(get(cp, "Pod", "llm-1", ns) or {})) == list(range(8))
    assert not double_booked(cp, LEAF_OF), double_booked(cp, LEAF_OF)


def gang_ends_and_rival_binds(cp: ControlPlane, ns: str) -> None:
    """The gang's pods go: its reservation goes away (seen through gangslice's watches), and the rival
    can have a node of the leaf."""
    for name in ("llm-0", "llm-1"):
        delete(cp, "Pod", name, ns)
    left: list[dict[str, Any]] = []

    def reservation_gone() -> bool:
        left[:] = items(cp, "SliceReservation", ns)
        return not left

    assert wait_for_or_false(reservation_gone, 60), (
        f"SliceReservation leaked: {dump([r['spec'] for r in left])}"
    )
    assert wait_for("rival bound once the gang is gone", lambda: node_of(cp, ns, "rival"), 60) in LEAF_OF
    assert not double_booked(cp, LEAF_OF)


def test_kill9_between_reservation_and_binding_double_books_nothing_and_leaks_nothing(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    _, held = hold_one_member(cp, ns)

    gangslice.kill9()
    gangslice.start()

    rival_kept_off(cp, ns, held)
    late_member_lands_on(cp, ns, held)
    gang_ends_and_rival_binds(cp, ns)


def test_apiserver_restart_cache_recovers(control_plane: ControlPlane, gangslice: Gangslice, ns: str) -> None:
    cp = control_plane
    _, held = hold_one_member(cp, ns)

    cp.restart_apiserver(down_s=2.0)
    # Every watch of gangslice broke; it must list again, keep the hold and be ready.
    gangslice.wait_ready(90)
    assert gangslice.process.alive()

    # Only gangslice knows the held node is taken: a cache that lost the hold would hand it to the rival.
    rival_kept_off(cp, ns, held)
    late_member_lands_on(cp, ns, held)
    # Deletions after the restart reach the cache: the hold is released and the rival binds.
    gang_ends_and_rival_binds(cp, ns)
