"""Faults: ``gangslice serve`` killed with SIGKILL between reservation and binding; kube-apiserver restarted.

Nodes (pool ``flt``): spine s1, leaves a and b of two HGX H100 nodes each. A gang of two 8-GPU pods fills one
leaf, so its reservation holds a whole node that nothing else may take.
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
from controlplane import ControlPlane

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


def test_kill9_between_reservation_and_binding_double_books_nothing_and_leaks_nothing(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    first, second = gang_pods("llm", 2, 8, POOL)
    # Only the first member exists: gangslice reserves the whole gang's slice and binds that one.
    create(cp, in_ns(first, ns))
    first_node = wait_for("llm-0 bound", lambda: node_of(cp, ns, "llm-0"), 60)
    (reservation,) = wait_for("the gang's SliceReservation", lambda: items(cp, "SliceReservation", ns), 30)
    slot_nodes = reserved_nodes(reservation)
    assert first_node in slot_nodes and len(set(slot_nodes)) == 2, slot_nodes
    (held,) = set(slot_nodes) - {first_node}
    assert LEAF_OF[held] == LEAF_OF[first_node]

    gangslice.kill9()
    gangslice.start()

    # A rival 8-GPU pod allowed only on the gang's leaf must not get the node held for llm-1.
    rival = gpu_pod("rival", 8, POOL)
    rival["spec"]["nodeSelector"][LEAF] = LEAF_OF[held]
    create(cp, in_ns(rival, ns))
    wait_for("rival marked Unschedulable", lambda: unschedulable(cp, ns, "rival"), 60)
    assert node_of(cp, ns, "rival") is None

    # The late member lands on the node its slot names, after the restart.
    create(cp, in_ns(second, ns))
    assert wait_for("llm-1 bound", lambda: node_of(cp, ns, "llm-1"), 60) == held
    assert sorted(gpus_of(get(cp, "Pod", "llm-1", ns) or {})) == list(range(8))
    assert not double_booked(cp, LEAF_OF), double_booked(cp, LEAF_OF)

    # The gang ends: its reservation goes away, and the rival can have the node.
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


def test_apiserver_restart_cache_recovers(control_plane: ControlPlane, gangslice: Gangslice, ns: str) -> None:
    cp = control_plane
    create(cp, in_ns(gpu_pod("before", 8, POOL), ns))
    before_node = wait_for("'before' bound", lambda: node_of(cp, ns, "before"), 60)

    cp.restart_apiserver(down_s=2.0)
    # Every watch of gangslice broke; it must list again and be ready.
    gangslice.wait_ready(90)
    assert gangslice.process.alive()

    create(cp, in_ns(gpu_pod("after", 8, POOL), ns))
    after_node = wait_for("'after' bound after the restart", lambda: node_of(cp, ns, "after"), 90)
    # The cache still knows 'before' holds all eight GPUs of its node.
    assert after_node != before_node
    assert sorted(gpus_of(get(cp, "Pod", "after", ns) or {})) == list(range(8))
    assert not double_booked(cp, LEAF_OF)
