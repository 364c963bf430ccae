"""kube-scheduler with the shipped HTTPS extender config calling ``gangslice serve`` (shipped RBAC, no
controller) over TLS with a certificate from the cluster CA.

Nodes (pool ``ext``): spine s1 with leaves a and b of four HGX H100 nodes each; spine s2 with leaf c of two
dual-socket PCIe nodes (GPU pairs 0-1, 2-3, 4-5, 6-7 share a PCIe switch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    LEAF,
    FakeNode,
    Gangslice,
    create,
    double_booked,
    events_for,
    extender_stack,
    gang_pods,
    get,
    gpu_pod,
    gpus_of,
    hgx_leaves,
    items,
    scheduled_condition,
    wait_for,
)

from extender.bench.controlplane import ControlPlane
from extender.topology.model import PcieLevel
from extender.topology.presets import preset_graph

pytestmark = pytest.mark.e2e

POOL = "ext"
HGX = hgx_leaves(POOL, 4)
PCIE = [FakeNode(f"ext-c{i}", "pcie-8gpu-2socket", "s2", "ext-leaf-c") for i in range(2)]
NODES = HGX + PCIE
LEAF_OF = {n.name: n.leaf for n in NODES}


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    # HTTPS with the shipped TLS variant of the scheduler config (the other modules use plain HTTP).
    with extender_stack(control_plane, POOL, NODES, tls=True) as server:
        yield server


def bound_pods(cp: ControlPlane, ns: str, names: list[str], timeout: float = 60.0) -> list[dict[str, Any]]:
    def all_bound() -> list[dict[str, Any]] | None:
        pods = [get(cp, "Pod", n, ns) for n in names]
        if all(p and p["spec"].get("nodeName") for p in pods):
            return [p for p in pods if p]
        return None

    return wait_for(f"pods {names} bound", all_bound, timeout)


def test_plain_gang_of_four_lands_on_one_leaf_with_gpu_annotations(
    control_plane: ControlPlane, ns: str
) -> None:
    pods = gang_pods("llm", 4, 8, POOL)
    for pod in pods:
        create(control_plane, {**pod, "metadata": {**pod["metadata"], "namespace": ns}})
    bound = bound_pods(control_plane, ns, [p["metadata"]["name"] for p in pods])

    nodes = [p["spec"]["nodeName"] for p in bound]
    assert len(set(nodes)) == 4, nodes
    assert len({LEAF_OF[n] for n in nodes}) == 1, f"gang spread over leaves: {nodes}"
    for pod in bound:
        assert sorted(gpus_of(pod)) == list(range(8)), pod["metadata"].get("annotations")
    # The plain gang's slice is persisted as a SliceReservation in its namespace, and its
    # status (written through the status subresource) says every slot is bound.
    names = {p["metadata"]["name"] for p in bound}

    def bound_status() -> dict[str, Any] | None:
        for r in items(control_plane, "SliceReservation", ns):
            status = r.get("status") or {}
            if status.get("phase") == "Bound" and set((status.get("boundPods") or {}).values()) == names:
                return status
        return None

    status = wait_for("the SliceReservation status to say Bound", bound_status, 30)
    assert status["nodes"] and status["gpus"] == 32, status
    assert not double_booked(control_plane, LEAF_OF)


def pix_pairs() -> set[frozenset[int]]:
    graph = preset_graph("pcie-8gpu-2socket")
    pairs = {
        frozenset((a, b))
        for a in graph.indices
        for b in graph.indices
        if a < b and graph.link(a, b).pcie is PcieLevel.PIX
    }
    assert len(pairs) == 4  # the preset: one PCIe switch per GPU pair
    return pairs


def tp2_pod(ns: str, name: str, node: str | None = None) -> dict[str, Any]:
    pod = gpu_pod(name, 2, POOL)
    pod["metadata"]["namespace"] = ns
    pod["spec"]["nodeSelector"][LEAF] = "ext-leaf-c"
    if node:
        pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
    return pod


def test_tp2_pods_on_pcie_nodes_get_a_pair_inside_one_pcie_switch(
    control_plane: ControlPlane, ns: str
) -> None:
    pairs = pix_pairs()
    bound = []
    for i in range(4):  # one at a time: see the concurrent test below
        create(control_plane, tp2_pod(ns, f"tp2-{i}"))
        bound += bound_pods(control_plane, ns, [f"tp2-{i}"])
    for pod in bound:
        pair = frozenset(gpus_of(pod))
        assert pair in pairs, f"{pod['metadata']['name']} on {pod['spec']['nodeName']} got {sorted(pair)}"
    assert not double_booked(control_plane, LEAF_OF)


def test_tp2_pods_created_together_never_share_a_gpu(control_plane: ControlPlane, ns: str) -> None:
    """Eight 2-GPU pods created at once on the two PCIe nodes: every pod gets its own PIX pair.

    kube-scheduler binds asynchronously, so the extender's bind for one pod can run while the watch
    events of the previous pod's bind (annotation PATCH first, Binding second) are arriving.
    """
    pairs = pix_pairs()
    names = [f"burst-{i}" for i in range(8)]
    for name in names:
        create(control_plane, tp2_pod(ns, name))
    bound = bound_pods(control_plane, ns, names)
    got = {pod["metadata"]["name"]: (pod["spec"]["nodeName"], sorted(gpus_of(pod))) for pod in bound}
    assert not double_booked(control_plane, LEAF_OF), f"GPUs handed out twice: {got}"
    for node in ("ext-c0", "ext-c1"):
        on_node = {frozenset(g) for n, g in got.values() if n == node}
        assert on_node == pairs, got


def test_gang_larger_than_any_leaf_stays_pending_with_a_reason(control_plane: ControlPlane, ns: str) -> None:
    pods = gang_pods("huge", 5, 8, POOL, extra={"gangslice.io/required-level": "leaf"})
    names = [p["metadata"]["name"] for p in pods]
    for pod in pods:
        create(control_plane, {**pod, "metadata": {**pod["metadata"], "namespace": ns}})

    def all_unschedulable() -> list[dict[str, Any]] | None:
        conds = [scheduled_condition(get(control_plane, "Pod", n, ns) or {}) for n in names]
        if all(c and c["status"] == "False" and c.get("reason") == "Unschedulable" for c in conds):
            return [c for c in conds if c]
        return None

    conds = wait_for("every member of the oversized gang marked Unschedulable", all_unschedulable, 60)
    # The message kube-scheduler records names the gang and why the extender refused it.
    for cond in conds:
        assert "huge" in cond["message"], cond["message"]
    events = [e for n in names for e in events_for(control_plane, ns, n) if e["reason"] == "FailedScheduling"]
    assert events, "no FailedScheduling event"
    assert any("huge" in e["message"] for e in events), [e["message"] for e in events]
    # Not one member is bound, and nothing is held for it.
    assert all(not (get(control_plane, "Pod", n, ns) or {})["spec"].get("nodeName") for n in names)
    assert not items(control_plane, "SliceReservation", ns)


def test_pod_without_gpus_is_scheduled_normally(control_plane: ControlPlane, ns: str) -> None:
    pod = gpu_pod("web", 0, POOL)
    pod["metadata"]["namespace"] = ns
    create(control_plane, pod)
    (bound,) = bound_pods(control_plane, ns, ["web"])
    assert bound["spec"]["nodeName"] in LEAF_OF
    assert "gangslice.io/gpus" not in (bound["metadata"].get("annotations") or {})
    assert not items(control_plane, "SliceReservation", ns)
