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

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cluster import (
    LEAF,
    SPINE,
    SYSTEM_NS,
    Gangslice,
    create,
    delete,
    events_for,
    extender_stack,
    get,
    gpu_pod,
    gpus_of,
    pod_token_kubeconfig,
    wait_for,
)
from cluster import POOL as POOL_LABEL
from node import PAUSE_IMAGE, RealNode, build_workload_image, oracle

from extender.agent import podresources_pb2 as pr
from extender.agent import podresources_pb2_grpc as pr_grpc
from extender.agent.fakes import fake_node
from extender.bench.controlplane import ControlPlane
from extender.topology.device_plugin import PluginView, plugin_view, preferred_allocation
from extender.topology.nvml import discover

pytestmark = pytest.mark.e2e

POOL = "rn"
NODE = f"{POOL}-a0"
IMAGE = "ghcr.io/gangslice/gangslice:0.1.0"
FAKE = "hgx-h100"
HOST_SYS = "/host/sys"


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
    cp = control_plane
    assert cp.workdir is not None
    kubeconfig = pod_token_kubeconfig(
        cp, cp.workdir / "rn-agent.kubeconfig", "gangslice-agent", NODE, image=PAUSE_IMAGE
    )
    argv = [
        str(Path(sys.executable).parent / "gangslice"), "agent", f"--node={NODE}", f"--nvml-fake={FAKE}",
        f"--sysfs-root={node.sysfs}", f"--kubelet-config={node.kubelet_config_file}",
        f"--pod-resources-socket={node.pod_resources_socket}", f"--kubeconfig={kubeconfig}",
        "--interval=1", "--jitter=0",
    ]  # fmt: skip
    cp.start_process("gangslice-rn-agent", argv)
    try:
        wait_for("the agent's NodeTopology with the kubelet's policies", lambda: _published(cp), 60)
        yield
    finally:
        cp.stop_process("gangslice-rn-agent")
        delete(cp, "Pod", f"gangslice-agent-{NODE}", SYSTEM_NS)


def _published(cp: ControlPlane) -> dict[str, Any] | None:
    topo = get(cp, "NodeTopology", NODE) or {}
    spec = topo.get("spec") or {}
    return spec if len(spec.get("gpus") or ()) == 8 and spec.get("kubelet") else None


def workload_pod(
    name: str,
    gpus: int,
    *,
    cpu: str = "100m",
    guaranteed: bool = False,
    strict: bool = False,
    scheduler: str = "gangslice-scheduler",
    node_name: str | None = None,
) -> dict[str, Any]:
    """A pod of the project's image: ``gangslice preflight`` first (``--strict-gpus`` with
    ``strict``), then ``gangslice pin`` running a command that prints what the container was given."""
    pod = gpu_pod(name, gpus, POOL, scheduler=scheduler)
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    requests = {"cpu": cpu, **limits}
    if guaranteed:
        limits |= {"cpu": cpu, "memory": "256Mi"}
        requests |= {"memory": "256Mi"}
    env = [{"name": "GANGSLICE_NVML_FAKE", "value": FAKE}]
    mounts = [
        {"name": "podinfo", "mountPath": "/etc/podinfo", "readOnly": True},
        {"name": "sys", "mountPath": HOST_SYS, "readOnly": True},
    ]
    show = (
        "import os, time; print('visible=' + os.environ.get('NVIDIA_VISIBLE_DEVICES', ''), flush=True); "
        "print('cpus=' + ','.join(map(str, sorted(os.sched_getaffinity(0)))), flush=True); time.sleep(3600)"
    )
    common = {"image": IMAGE, "imagePullPolicy": "Never", "env": env, "volumeMounts": mounts}
    pod["spec"]["initContainers"] = [
        {
            "name": "preflight",
            **common,
            "args": [
                "preflight",
                f"--expect-tp={gpus}",
                f"--sysfs-root={HOST_SYS}",
                *(["--strict-gpus"] if strict else []),
            ],
            "resources": {"limits": limits, "requests": requests},
        }
    ]
    pod["spec"]["containers"] = [
        {
            "name": "main",
            **common,
            "args": ["pin", f"--sysfs-root={HOST_SYS}", "--", "python3", "-c", show],
            "resources": {"limits": limits, "requests": requests},
        }
    ]
    pod["spec"]["volumes"] = [
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
            },
        },
        {"name": "sys", "hostPath": {"path": "/__NODE_SYSFS__", "type": "Directory"}},
    ]
    if node_name:
        pod["spec"]["nodeName"] = node_name
        del pod["spec"]["schedulerName"]
    return pod


def submit(cp: ControlPlane, node: RealNode, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["namespace"] = ns
    for volume in pod["spec"]["volumes"]:
        if volume["name"] == "sys":
            volume["hostPath"]["path"] = str(node.sysfs)
    return create(cp, pod)


def phase(cp: ControlPlane, ns: str, name: str) -> str | None:
    pod = get(cp, "Pod", name, ns)
    return ((pod or {}).get("status") or {}).get("phase")


def running(cp: ControlPlane, node: RealNode, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    def up() -> dict[str, Any] | None:
        pod = get(cp, "Pod", name, ns) or {}
        status = pod.get("status") or {}
        if status.get("phase") in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {ns}/{name} ended {status.get('phase')}: {status}")
        return pod if status.get("phase") == "Running" else None

    try:
        return wait_for(f"pod {ns}/{name} Running", up, timeout)
    except AssertionError as exc:
        logs = {c: container_log(node, ns, name, c)[-3000:] for c in ("preflight", "main")}
        raise AssertionError(f"{exc}\ncontainer logs: {logs}") from None


def container_log(node: RealNode, ns: str, name: str, container: str) -> str:
    pod_dirs = list(node.pod_logs.glob(f"{ns}_{name}_*"))
    text = ""
    for d in pod_dirs:
        for f in sorted((d / container).glob("*.log")):
            text += f.read_text()
    return text


def printed(node: RealNode, ns: str, name: str, key: str) -> str:
    def line() -> str | None:
        for raw in container_log(node, ns, name, "main").splitlines():
            _, _, message = raw.partition(" stdout F ")
            if message.startswith(key + "="):
                return message.split("=", 1)[1]
        return None

    return wait_for(f"{ns}/{name} printing {key}", line, 60)


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
    cp = control_plane
    submit(cp, node, ns, workload_pod("tp4", 4))
    pod = running(cp, node, ns, "tp4")
    promised = gpus_of(pod)
    uuids = node.plugin.uuids
    promised_uuids = sorted(uuids[i] for i in promised)
    assert pod["metadata"]["annotations"]["gangslice.io/gpu-uuids"].split(",") == [uuids[i] for i in promised]
    assert kubelet_devices(node, ns, "tp4") == promised_uuids
    assert sorted(printed(node, ns, "tp4", "visible").split(",")) == promised_uuids
    assert node.plugin.allocated[-1] and sorted(node.plugin.allocated[-1]) == sorted(promised)
    # The agent publishes the kubelet's allocation, read from the real PodResources socket.
    wait_for(
        "the agent's devicesInUse for the pod",
        lambda: _in_use(cp).get(f"{ns}/tp4") == sorted(promised),
        30,
    )
    spec = _published(cp)
    assert spec is not None
    kubelet = spec["kubelet"]
    assert (kubelet["topologyManagerPolicy"], kubelet["cpuManagerPolicy"]) == ("single-numa-node", "static")
    with capsys.disabled():
        print(f"\nreal node: TP=4 promised GPUs {promised}; the kubelet gave {node.plugin.allocated[-1]}")


def _in_use(cp: ControlPlane) -> dict[str, list[int]]:
    topo = get(cp, "NodeTopology", NODE) or {}
    out: dict[str, list[int]] = {}
    for d in (topo.get("spec") or {}).get("devicesInUse") or ():
        out.setdefault(f"{d['namespace']}/{d['pod']}", []).append(d["index"])
    return {k: sorted(v) for k, v in out.items()}


def test_a_pod_the_topology_manager_refuses_is_never_bound_and_the_kubelet_agrees(
    control_plane: ControlPlane, node: RealNode, agent: None, ns: str
) -> None:
    """Five GPUs cannot sit on one NUMA node of this board: gangslice binds the pod nowhere and
    says why; bound by hand, the kubelet refuses it at admission for the same reason."""
    cp = control_plane
    submit(cp, node, ns, workload_pod("wide", 5))
    refused = wait_for(
        "kube-scheduler's FailedScheduling naming the extender's reason",
        lambda: [e for e in events_for(cp, ns, "wide") if e["reason"] == "FailedScheduling"],
        60,
    )
    assert "NUMA" in refused[-1]["message"], refused[-1]["message"]
    assert not (get(cp, "Pod", "wide", ns) or {}).get("spec", {}).get("nodeName")

    submit(cp, node, ns, workload_pod("wide-by-hand", 5, node_name=NODE))
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
    cp = control_plane
    exclusive = node.numa[1]
    submit(cp, node, ns, workload_pod("pinned", 2, cpu=str(len(exclusive)), guaranteed=True))
    pod = running(cp, node, ns, "pinned")
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
    assert sorted(printed(node, ns, "pinned", "visible").split(",")) == sorted(uuids[i] for i in given)
    assert printed(node, ns, "pinned", "cpus") == ",".join(map(str, exclusive))
    assert "ok    numa" in container_log(node, ns, "pinned", "preflight")
    wait_for(
        "the agent reporting the GPUs the kubelet gave",
        lambda: _in_use(cp).get(f"{ns}/pinned") == sorted(given),
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
    submit(cp, node, ns, workload_pod("kept", 4, strict=True))
    running(cp, node, ns, "kept")
    assert "ok    gpus" in container_log(node, ns, "kept", "preflight")
    delete(cp, "Pod", "kept", ns)
    wait_for("the pod gone", lambda: get(cp, "Pod", "kept", ns) is None or None, 60)
    swap = (2, 3)
    node.plugin.force = swap
    try:
        submit(cp, node, ns, workload_pod("swapped", 2, strict=True))
        log = wait_for(
            "preflight failing on the swapped GPUs",
            lambda: (text := container_log(node, ns, "swapped", "preflight")) and "FAIL" in text and text,
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
