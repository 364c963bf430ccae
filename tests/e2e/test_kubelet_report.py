"""The kubelet's report is the truth, on a real API server: the node agent (``gangslice agent``,
fake NVML) reads a fake kubelet's PodResources socket that reports a bound pod holding other GPUs
than its ``gangslice.io/gpus`` annotation. gangslice serve (shipped RBAC, ``--on-mismatch=evict``)
then counts the pod's GPUs as reported, moves the gang's SliceReservation slot onto them and sets
its ``DevicesMismatch`` condition naming both sets, tells the pod by a Warning Event, counts it in
``gangslice_devices_mismatch_total``; the next gang is given the GPUs the first was promised and
does not hold, never the ones it holds. The eviction meets the API server's own answer for a
PodDisruptionBudget that allows no disruption (429: reported, retried), and goes through once
the budget is gone.

Nodes (pool ``dvm``): one HGX H100 node whose NodeTopology the agent publishes.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    SYSTEM_NS,
    FakeNode,
    Gangslice,
    create,
    delete,
    events_for,
    extender_stack,
    gang_pods,
    get,
    gpus_of,
    merge_patch,
    node_of,
    pod_token_kubeconfig,
    wait_for,
)

from extender.bench.controlplane import ControlPlane
from extender.testing.kubelet import FakeKubelet, serve

pytestmark = pytest.mark.e2e

POOL = "dvm"
NODE = FakeNode(f"{POOL}-a0", "hgx-h100", "s1", f"{POOL}-leaf-a")


class Agent:
    """``gangslice agent`` on NODE every second, reading ``kubelet`` on a unix socket."""

    def __init__(self, cp: ControlPlane, kubelet: FakeKubelet, socket: Path) -> None:
        self.cp, self.kubelet, self.socket = cp, kubelet, socket

    def uuids(self) -> dict[int, str]:
        """GPU index -> UUID as the agent published them."""
        topo = get(self.cp, "NodeTopology", NODE.name) or {}
        return {g["index"]: g["uuid"] for g in topo.get("spec", {}).get("gpus", ()) if g.get("uuid")}

    def in_use(self) -> dict[str, list[int]]:
        topo = get(self.cp, "NodeTopology", NODE.name) or {}
        out: dict[str, list[int]] = {}
        for d in topo.get("spec", {}).get("devicesInUse", ()):
            out.setdefault(f"{d['namespace']}/{d['pod']}", []).append(d.get("index"))
        return {k: sorted(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(
        control_plane, POOL, [NODE], name="gangslice-dvm", extra_args=["--on-mismatch=evict"]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def agent(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[Agent]:
    cp = control_plane
    assert cp.workdir is not None
    kubelet = FakeKubelet()
    # Short: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dvm") as d, serve(kubelet, Path(d) / "k.sock") as sock:
        kubeconfig = pod_token_kubeconfig(
            cp, cp.workdir / "dvm-agent.kubeconfig", "gangslice-agent", NODE.name
        )
        exe = Path(sys.executable).parent / "gangslice"
        argv = [
            str(exe), "agent", f"--node={NODE.name}", "--nvml-fake=hgx-h100", f"--kubeconfig={kubeconfig}",
            f"--pod-resources-socket={sock}", "--interval=1", "--jitter=0",
        ]  # fmt: skip
        cp.start_process("gangslice-dvm-agent", argv)
        node_agent = Agent(cp, kubelet, sock)
        try:
            uuids = wait_for(
                "the agent's NodeTopology with GPU UUIDs", lambda: len(node_agent.uuids()) == 8, 60
            )
            assert uuids
            kubelet.allocatable = {"nvidia.com/gpu": list(node_agent.uuids().values())}
            yield node_agent
        finally:
            cp.stop_process("gangslice-dvm-agent")
            delete(cp, "Pod", f"gangslice-agent-{NODE.name}", SYSTEM_NS)


def bound(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pod = get(cp, "Pod", name, ns)
        return pod if pod and node_of(cp, ns, name) == NODE.name and gpus_of(pod) else None

    return wait_for(f"pod {ns}/{name} bound with GPUs", ready, 60)


def devices_condition(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    obj = get(cp, "SliceReservation", name, ns) or {}
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == "DevicesMismatch":
            return dict(c)
    return None


def test_the_ledger_follows_the_kubelet_and_the_next_gang_is_not_promised_its_gpus(
    control_plane: ControlPlane, gangslice: Gangslice, agent: Agent, ns: str
) -> None:
    cp = control_plane
    uuids = agent.uuids()
    # No controller-manager computes the budget's status, so the API server allows no eviction
    # of a running pod it covers (429) until the budget is deleted.
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "g", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"gangslice.io/gang": "g"}}},
    }
    create(cp, budget)
    for pod in gang_pods("g", 1, 4, POOL):
        pod["metadata"]["namespace"] = ns
        create(cp, pod)
    first = bound(cp, ns, "g-0")
    # As its kubelet would say once it runs (a pending pod is evicted whatever its budget says).
    merge_patch(cp, "Pod", "g-0", {"status": {"phase": "Running"}}, ns, sub="status")
    promised = gpus_of(first)
    annotations = first["metadata"]["annotations"]
    # Bind wrote the UUIDs of the promised GPUs, from the graph the agent published.
    assert annotations["gangslice.io/gpu-uuids"] == ",".join(uuids[i] for i in promised)
    # The device plugin gave the pod other GPUs than promised: the kubelet reports those.
    reported = sorted(set(range(8)) - set(promised))[:4]
    agent.kubelet.assign(ns, "g-0", "main", [uuids[i] for i in reported])
    wait_for(
        "the agent to report the kubelet's allocation",
        lambda: agent.in_use().get(f"{ns}/g-0") == reported,
        30,
    )
    cond = wait_for(
        "DevicesMismatch=True on the SliceReservation",
        lambda: (c := devices_condition(cp, ns, "g")) and c["status"] == "True" and c,
        30,
    )
    assert cond["reason"] == "DevicesDiffer", cond
    for i in (*promised, *reported):
        assert uuids[i] in cond["message"], cond["message"]
    assert "meets the pod set's rule" in cond["message"] and "follows the kubelet" in cond["message"]
    reservation = get(cp, "SliceReservation", "g", ns)
    assert reservation is not None
    assert reservation["spec"]["slice"]["pods"][0]["gpus"] == reported
    events = wait_for(
        "a Warning Event on the pod",
        lambda: [e for e in events_for(cp, ns, "g-0") if e["reason"] == "DevicesMismatch"],
        30,
    )
    assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "Pod"
    assert f'gangslice_devices_mismatch_total{{node="{NODE.name}"}} 1.0' in gangslice.metrics()
    assert "gangslice_devices_mismatched_pods 1.0" in gangslice.metrics()
    # --on-mismatch=evict: the budget holds the eviction off; said, and tried again.
    blocked = wait_for(
        "the eviction held off by the PodDisruptionBudget",
        lambda: [e for e in events_for(cp, ns, "g-0") if e["reason"] == "DevicesMismatchEvictionBlocked"],
        30,
    )
    assert "PodDisruptionBudget" in blocked[0]["message"]
    wait_for(
        "the condition to say the budget held the eviction off",
        lambda: "PodDisruptionBudget" in ((devices_condition(cp, ns, "g") or {}).get("message") or ""),
        30,
    )
    assert 'gangslice_mismatch_evictions_total{result="blocked"}' in gangslice.metrics()
    assert get(cp, "Pod", "g-0", ns) is not None
    # The next gang gets the GPUs the first was promised and does not hold.
    for pod in gang_pods("h", 1, 4, POOL):
        pod["metadata"]["namespace"] = ns
        create(cp, pod)
    second = bound(cp, ns, "h-0")
    assert not set(gpus_of(second)) & set(reported), (gpus_of(second), reported)
    assert sorted(gpus_of(second)) == sorted(promised)
    # The pod's report goes (the kubelet forgets it): the condition turns False.
    agent.kubelet.remove(ns, "g-0")
    cond = wait_for(
        "DevicesMismatch=False once the kubelet no longer reports a difference",
        lambda: (c := devices_condition(cp, ns, "g")) and c["status"] == "False" and c,
        30,
    )
    assert cond["reason"] == "DevicesMatch"
    # Reported again, and the budget deleted: the pod is evicted (to be placed again).
    agent.kubelet.assign(ns, "g-0", "main", [uuids[i] for i in reported])
    wait_for(
        "the second difference counted",
        lambda: f'gangslice_devices_mismatch_total{{node="{NODE.name}"}} 2.0' in gangslice.metrics(),
        30,
    )
    delete(cp, "PodDisruptionBudget", "g", ns)
    wait_for(
        "pod g-0 evicted",
        lambda: (p := get(cp, "Pod", "g-0", ns)) is None or bool(p["metadata"].get("deletionTimestamp")),
        30,
    )
    wait_for(
        "the eviction told on the pod",
        lambda: [e for e in events_for(cp, ns, "g-0") if e["reason"] == "DevicesMismatchEvicted"],
        30,
    )
    assert 'gangslice_mismatch_evictions_total{result="evicted"} 1.0' in gangslice.metrics()
