"""A real node: gangslice's promise against what a real kubelet does.

One node (tests/e2e/node.py): kubelet, containerd and runc built from their modules, the
kubelet's static CPU manager and ``single-numa-node`` Topology Manager over two NUMA nodes,
and a fake-GPU device plugin advertising an HGX H100 board (GPUs 0-3 on NUMA 0, 4-7 on NUMA 1)
whose ``GetPreferredAllocation`` is NVIDIA's go-gpuallocator. gangslice's node agent reads the
kubelet's own PodResources socket and configuration file; pods run the project's image, with
``gangslice preflight`` as their init container and ``gangslice pin`` in front of their command.

What is proven: the GPUs gangslice promises are the GPUs the kubelet gives (PodResources, the
container's environment and the pod's annotation agree); a pod the Topology Manager refuses is
never bound by gangslice, while the same pod bound by hand is refused by the kubelet; a pod
shaped to pass runs where gangslice put it; ``preflight`` passes on the promised GPUs and, when
the device plugin is made to prefer others, fails naming both sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from cluster import (
    LEAF,
    SPINE,
    Gangslice,
    delete,
    events_for,
    extender_stack,
    get,
    gpus_of,
    wait_for,
)
from cluster import POOL as POOL_LABEL
from node import RealNode, build_workload_image, oracle, workload_pod

from extender.agent import podresources_pb2 as pr
from extender.agent import podresources_pb2_grpc as pr_grpc
from extender.agent.fakes import fake_node
from extender.bench.controlplane import ControlPlane
from extender.topology.device_plugin import PluginView, plugin_view, preferred_allocation
from extender.topology.nvml import discover

pytestmark = pytest.mark.e2e

POOL = "rn"
NODE = f"{POOL}-a0"
FAKE = "hgx-h100"


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(control_plane, POOL, [], name="gangslice-rn") as server:
        yield server


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[RealNode]:
    labels = {SPINE: "s1", LEAF: f"{POOL}-leaf-a", POOL_LABEL: POOL}
    real = RealNode(control_plane, NODE, labels, images=(build_workload_image(),))
    with real.running(oracle()) as running:
        yield running


@pytest.fixture(scope="module")
def agent(control_plane: ControlPlane, node: RealNode) -> Iterator[None]:
    with node.agent(FAKE):
        yield


def kubelet_devices(node: RealNode, ns: str, name: str) -> list[str]:
    """The GPUs the kubelet says the pod holds (its PodResources List, asked directly)."""
    with grpc.insecure_channel(f"unix://{node.pod_resources_socket}") as channel:
        stub: Any = pr_grpc.PodResourcesListerStub
        reply = stub(channel).List(pr.ListPodResourcesRequest(), timeout=5)
    for pod in reply.pod_resources:
        if (pod.namespace, pod.name) == (ns, name):
            return sorted(d for c in pod.containers for dev in c.devices for d in dev.device_ids)
    return []


def test_a_tp4_pod_gets_the_gpus_gangslice_predicted(
    control_plane: ControlPlane, node: RealNode, agent: None, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    node.submit(ns, workload_pod("tp4", 4, POOL, FAKE))
    pod = node.wait_running(ns, "tp4")
    promised = gpus_of(pod)
    uuids = node.plugin.uuids
    promised_uuids = sorted(uuids[i] for i in promised)
    assert pod["metadata"]["annotations"]["gangslice.io/gpu-uuids"].split(",") == [uuids[i] for i in promised]
    assert kubelet_devices(node, ns, "tp4") == promised_uuids
    assert sorted(node.printed(ns, "tp4", "visible").split(",")) == promised_uuids
    assert node.plugin.allocated[-1] and sorted(node.plugin.allocated[-1]) == sorted(promised)
    # The NICs on the GPUs' PCIe switches (mlx5_<GPU> on this board), from the annotation the bind
    # wrote, reached the container's environment through the downward API.
    nics = pod["metadata"]["annotations"]["gangslice.io/nics"]
    assert nics == ",".join(f"mlx5_{i}" for i in promised), nics
    assert node.printed(ns, "tp4", "nccl") == "=" + nics
    # The agent publishes the kubelet's allocation, read from the real PodResources socket.
    wait_for(
        "the agent's devicesInUse for the pod",
        lambda: node.in_use().get(f"{ns}/tp4") == sorted(promised),
        30,
    )
    spec = node.published()
    assert spec is not None
    kubelet = spec["kubelet"]
    assert (kubelet["topologyManagerPolicy"], kubelet["cpuManagerPolicy"]) == ("single-numa-node", "static")
    # The NUMA nodes the kubelet sees (the node's two-node tree), and the CPUs it may still hand
    # out exclusively: all but the reserved CPU 0 (the TP=4 pod is Burstable and holds none).
    numa = {n["id"]: n for n in kubelet["numaNodes"]}
    assert {i: n["cpus"] for i, n in numa.items()} == {i: ",".join(map(str, c)) for i, c in node.numa.items()}
    assert [n["allocatableCpus"] for _, n in sorted(numa.items())] == ["", "1"], numa
    with capsys.disabled():
        print(f"\nreal node: TP=4 promised GPUs {promised}; the kubelet gave {node.plugin.allocated[-1]}")


def test_a_pod_the_topology_manager_refuses_is_never_bound_and_the_kubelet_agrees(
    control_plane: ControlPlane, node: RealNode, agent: None, ns: str
) -> None:
    """Five GPUs cannot sit on one NUMA node of this board: gangslice binds the pod nowhere and
    says why; bound by hand, the kubelet refuses it at admission for the same reason."""
    cp = control_plane
    node.submit(ns, workload_pod("wide", 5, POOL, FAKE))
    refused = wait_for(
        "kube-scheduler's FailedScheduling naming the extender's reason",
        lambda: [e for e in events_for(cp, ns, "wide") if e["reason"] == "FailedScheduling"],
        60,
    )
    assert "NUMA" in refused[-1]["message"], refused[-1]["message"]
    assert not (get(cp, "Pod", "wide", ns) or {}).get("spec", {}).get("nodeName")

    node.submit(ns, workload_pod("wide-by-hand", 5, POOL, FAKE, node_name=NODE))
    status = wait_for(
        "the kubelet's verdict on the pod bound by hand",
        lambda: (
            (s := (get(cp, "Pod", "wide-by-hand", ns) or {}).get("status") or {}).get("phase") == "Failed"
            and s
        ),
        60,
    )
    assert status["reason"] == "TopologyAffinityError", status
    assert not get(cp, "Pod", "wide", ns)["spec"].get("nodeName")


def test_a_guaranteed_pod_shaped_to_pass_runs_on_its_cpus_numa_node(
    control_plane: ControlPlane, node: RealNode, agent: None, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The static CPU manager can give this pod only the CPU it does not reserve, on NUMA node 1
    of the two: single-numa-node then admits it only with GPUs of NUMA node 1. gangslice promises
    two of those; the kubelet gives two of those, the ones go-gpuallocator prefers in the order the
    kubelet listed them, which gangslice predicts exactly for that order (on an NVSwitch board
    every pair ties, so the order decides and a promise made before it is one of the possible
    answers: preflight passes, saying the kubelet's choice stands, and the agent reports it).
    ``gangslice pin`` runs the command on the pod's CPU."""
    exclusive = node.numa[1]
    node.submit(ns, workload_pod("pinned", 2, POOL, FAKE, cpu=str(len(exclusive)), guaranteed=True))
    pod = node.wait_running(ns, "pinned")
    assert pod["status"]["qosClass"] == "Guaranteed"
    promised = gpus_of(pod)
    assert set(promised) <= {4, 5, 6, 7}, promised
    given = node.plugin.indices(kubelet_devices(node, ns, "pinned"))
    assert len(given) == 2 and set(given) <= {4, 5, 6, 7}, given
    available, must, size, chosen = node.plugin.preferred[-1]
    ours = preferred_allocation(board_view(), available, size, must, order=available)
    assert ours.gpus == chosen and set(chosen) == set(given), (ours, chosen, given)
    assert frozenset(promised) in ours.possible, (promised, ours.possible)
    uuids = node.plugin.uuids
    assert sorted(node.printed(ns, "pinned", "visible").split(",")) == sorted(uuids[i] for i in given)
    assert node.printed(ns, "pinned", "cpus") == ",".join(map(str, exclusive))
    assert "ok    numa" in node.log(ns, "pinned", "preflight")
    wait_for(
        "the agent reporting the GPUs the kubelet gave",
        lambda: node.in_use().get(f"{ns}/pinned") == sorted(given),
        30,
    )
    with capsys.disabled():
        print(
            f"\nreal node: Guaranteed TP=2 on CPU {exclusive}: promised {promised}, the kubelet listed "
            f"{list(available)} and gave {list(given)}; gangslice predicted {list(ours.gpus)} for that order "
            f"({len(ours.possible)} possible answers)"
        )


def test_preflight_passes_on_the_promised_gpus_and_names_both_sets_on_a_swap(
    control_plane: ControlPlane, node: RealNode, agent: None, ns: str
) -> None:
    """``--strict-gpus`` passes on a promise only one answer can meet (four GPUs of a NUMA node)
    and fails, naming both sets, when the device plugin is made to prefer two other GPUs."""
    cp = control_plane
    node.submit(ns, workload_pod("kept", 4, POOL, FAKE, strict=True))
    node.wait_running(ns, "kept")
    assert "ok    gpus" in node.log(ns, "kept", "preflight")
    delete(cp, "Pod", "kept", ns)
    wait_for("the pod gone", lambda: get(cp, "Pod", "kept", ns) is None or None, 60)
    swap = (2, 3)
    node.plugin.force = swap
    try:
        node.submit(ns, workload_pod("swapped", 2, POOL, FAKE, strict=True))
        log = wait_for(
            "preflight failing on the swapped GPUs",
            lambda: (text := node.log(ns, "swapped", "preflight")) and "FAIL" in text and text,
            90,
        )
    finally:
        node.plugin.force = None
    promised = gpus_of(get(cp, "Pod", "swapped", ns) or {})
    assert tuple(sorted(promised)) != swap, "gangslice promised the forced GPUs: the swap proves nothing"
    assert node.plugin.indices(kubelet_devices(node, ns, "swapped")) == swap
    said = ",".join(map(str, promised))
    assert f"visible GPUs {swap[0]},{swap[1]} differ from the promised {said}" in log, log


def board_view() -> PluginView:
    """The fake board as NVIDIA's device plugin sees it (go-gpuallocator's links)."""
    with fake_node(FAKE) as (fake, sysfs):
        return plugin_view(discover(fake, sysfs_root=sysfs))
