"""Volcano's scheduler (v1.14.1) with the shipped ``volcano-scheduler.conf`` (extender plugin) calling
``gangslice serve`` with the controller, whose PodGroup controller reserves each PodGroup's slice.

No Volcano controller-manager or admission webhook runs: the test creates the ``default`` Queue (and opens
it, as the queue controller would), the PodGroup and its pods itself.

Nodes (pool ``vc``): spine s1, leaves a and b of four HGX H100 nodes each.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import yaml
from cluster import (
    MANIFESTS,
    Gangslice,
    create,
    double_booked,
    extender_stack,
    get,
    gpu_pod,
    hgx_leaves,
    items,
    merge_patch,
    node_of,
    reserved_nodes,
    wait_for,
)

from extender.bench.controlplane import ControlPlane, free_ports

pytestmark = pytest.mark.e2e

POOL = "vc"
NODES = hgx_leaves(POOL, 4)
LEAF_OF = {n.name: n.leaf for n in NODES}


def start_volcano(cp: ControlPlane, extender_url: str) -> None:
    assert cp.workdir is not None and cp.kubeconfig is not None
    conf = yaml.safe_load((MANIFESTS / "scheduler" / "volcano-scheduler.conf").read_text())
    for tier in conf["tiers"]:
        for plugin in tier["plugins"]:
            if plugin["name"] == "extender":
                plugin["arguments"]["extender.urlPrefix"] = f"{extender_url}/gangslice/volcano"
    conf_file = cp.workdir / "volcano-scheduler.conf"
    conf_file.write_text(yaml.safe_dump(conf))
    listen, healthz = free_ports(2)
    cp.start_process(
        "vc-scheduler",
        [
            str(cp.bin_dir / "vc-scheduler"),
            f"--kubeconfig={cp.kubeconfig}",
            f"--scheduler-conf={conf_file}",
            "--schedule-period=1s",
            "--leader-elect=false",
            f"--listen-address=127.0.0.1:{listen}",
            "--enable-healthz=true",
            f"--healthz-address=127.0.0.1:{healthz}",
            f"--cache-dump-dir={cp.workdir}",
            "--v=3",
        ],
    )
    cp.wait_ready("vc-scheduler", f"http://127.0.0.1:{healthz}/healthz", lambda body: True)


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    # Before gangslice starts: it looks for the PodGroup API once, at start-up.
    cp.install_crds(cp.crd_dir / "volcano")
    queue = create(
        cp,
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "default"},
            "spec": {"weight": 1, "reclaimable": True},
        },
        exist_ok=True,
    )
    merge_patch(cp, "Queue", queue["metadata"]["name"], {"status": {"state": "Open"}}, sub="status")
    with extender_stack(cp, POOL, NODES, controller=True, name="gangslice-volcano") as server:
        start_volcano(cp, server.url)
        try:
            yield server
        finally:
            cp.stop_process("vc-scheduler")


def podgroup(ns: str, name: str, min_member: int, gpus: int, one_leaf: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "minMember": min_member,
        "queue": "default",
        "minResources": {"nvidia.com/gpu": str(min_member * gpus)},
    }
    if one_leaf:
        # Volcano's own way to say "one leaf": hard network topology, tier 1 (the finest level).
        spec["networkTopology"] = {"mode": "hard", "highestTierAllowed": 1}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def volcano_pod(ns: str, group: str, i: int, gpus: int) -> dict[str, Any]:
    pod = gpu_pod(f"{group}-{i}", gpus, POOL, scheduler="volcano")
    pod["metadata"]["namespace"] = ns
    pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = group
    return pod


def phase(cp: ControlPlane, ns: str, name: str) -> str:
    return str(((get(cp, "PodGroup", name, ns) or {}).get("status") or {}).get("phase") or "")


def block_one_node_per_leaf(cp: ControlPlane, ns: str) -> None:
    """One 8-GPU pod (kube-scheduler + extender) on a node of each leaf: no leaf has four free nodes."""
    for node in ("vc-a0", "vc-b0"):
        blocker = gpu_pod(f"blocker-{node}", 8, POOL)
        blocker["metadata"]["namespace"] = ns
        blocker["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
        create(cp, blocker)
        name = str(blocker["metadata"]["name"])
        wait_for(f"{name} bound", partial(node_of, cp, ns, name), 60)


def submit(cp: ControlPlane, ns: str, group: str, size: int, one_leaf: bool = False) -> list[str]:
    create(cp, podgroup(ns, group, size, 8, one_leaf))
    for i in range(size):
        create(cp, volcano_pod(ns, group, i, 8))
    return [f"{group}-{i}" for i in range(size)]


def test_podgroup_is_not_enqueued_while_no_slice_is_reserved(control_plane: ControlPlane, ns: str) -> None:
    cp = control_plane
    block_one_node_per_leaf(cp, ns)
    # Required within one leaf, and no leaf has four free nodes: no slice exists.
    names = submit(cp, ns, "llm", 4, one_leaf=True)
    # Volcano has looked at the group (it records the phase) and keeps it out of the queue: the extender's
    # jobEnqueueable says no while the group has no SliceReservation.
    wait_for("Volcano to record the PodGroup's phase", lambda: phase(cp, ns, "llm"), 60)
    unschedulable = wait_for(
        "Volcano to record why the PodGroup waits",
        lambda: [
            c
            for c in ((get(cp, "PodGroup", "llm", ns) or {}).get("status") or {}).get("conditions") or []
            if c.get("type") == "Unschedulable"
        ],
        60,
    )
    assert phase(cp, ns, "llm") == "Pending", (get(cp, "PodGroup", "llm", ns), unschedulable)
    assert all(node_of(cp, ns, n) is None for n in names)
    assert not items(cp, "SliceReservation", ns)


def test_podgroup_enqueued_once_its_slice_is_reserved_and_lands_on_one_leaf(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    names = submit(cp, ns, "llm", 4)
    (reservation,) = wait_for(
        "the PodGroup controller to reserve the group's slice",
        lambda: items(cp, "SliceReservation", ns),
        60,
    )
    slot_nodes = reserved_nodes(reservation)
    assert len(set(slot_nodes)) == 4 and len({LEAF_OF[n] for n in slot_nodes}) == 1, slot_nodes
    # The reservation is written first and the PodGroup's annotations after it: wait for both.
    wait_for(
        "the PodGroup controller to name the reservation on the PodGroup",
        lambda: (
            (((get(cp, "PodGroup", "llm", ns) or {}).get("metadata") or {}).get("annotations") or {}).get(
                "gangslice.io/reservation"
            )
            == reservation["metadata"]["name"]
        ),
        30,
    )

    def all_bound() -> list[str] | None:
        nodes = [node_of(cp, ns, n) for n in names]
        return [n for n in nodes if n] if all(nodes) else None

    nodes = wait_for("every member bound by vc-scheduler", all_bound, 90)
    assert sorted(nodes) == sorted(slot_nodes), (nodes, slot_nodes)
    assert phase(cp, ns, "llm") in ("Inqueue", "Running"), get(cp, "PodGroup", "llm", ns)
    assert not double_booked(cp, LEAF_OF)
