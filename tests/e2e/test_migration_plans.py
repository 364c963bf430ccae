"""``serve --migration report`` on a real control plane: a wide gang that waits while a replica
labelled ``gangslice.io/movable`` (owned by a ReplicaSet) holds part of the leaf it fits hears
the plan (an Event on its pod naming the move and its restart), and nothing is evicted or
bound.

Nodes (pool ``mig``): leaf a of two HGX H100 nodes, leaf c of one; a 1-GPU replica placed in leaf
a (leaf c cordoned meanwhile); a gang of two 8-GPU pods that requires one leaf.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    FakeNode,
    Gangslice,
    KubeletStandIn,
    create,
    events_for,
    extender_stack,
    gang_pods,
    get,
    is_ready,
    merge_patch,
    movable_replica,
    wait_for,
)

from extender.bench.controlplane import ControlPlane
from extender.controllers.migration.reporter import REASON

pytestmark = pytest.mark.e2e

POOL = "mig"
NODES = [
    FakeNode("mig-a0", "hgx-h100", "s1", "mig-leaf-a"),
    FakeNode("mig-a1", "hgx-h100", "s1", "mig-leaf-a"),
    FakeNode("mig-c0", "hgx-h100", "s1", "mig-leaf-c"),
]


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(
        control_plane, POOL, NODES, controller=True, extra_args=["--migrate-after=0"]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(control_plane, [n.name for n in NODES]).start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


def test_report_only_tells_the_plan_and_evicts_nothing(
    control_plane: ControlPlane, gangslice: Gangslice, kubelet: KubeletStandIn, ns: str
) -> None:
    cp = control_plane
    # The replica must land in leaf a: mig-c0 is cordoned until it runs there.
    merge_patch(cp, "Node", "mig-c0", {"spec": {"unschedulable": True}})
    replica = movable_replica(cp, ns, "server", 1, POOL, annotations={"gangslice.io/restart-seconds": "45"})
    create(cp, replica)

    def running() -> dict[str, Any] | None:
        pod = get(cp, "Pod", "server", ns)
        return pod if pod and is_ready(pod) else None

    try:
        before = wait_for("the movable replica running", running, 60)
    finally:
        merge_patch(cp, "Node", "mig-c0", {"spec": {"unschedulable": False}})
    node = before["spec"]["nodeName"]
    assert node in ("mig-a0", "mig-a1"), node
    for pod in gang_pods("wide", 2, 8, POOL, extra={"gangslice.io/required-level": "leaf"}):
        pod["metadata"]["namespace"] = ns
        create(cp, pod)

    def planned() -> dict[str, Any] | None:
        found = [e for e in events_for(cp, ns, "wide-0") if e.get("reason") == REASON]
        return found[0] if found else None

    event = wait_for("a MigrationPlanned Event on the wide gang's pod", planned, 60)
    message = event["message"]
    assert "off leaf mig-leaf-a" in message, message
    assert f"{ns}/server from {node} to mig-c0" in message, message
    assert "45 GPU-seconds" in message and "nothing evicted" in message, message
    # Nothing moved: the replica runs where it ran, the same pod; the gang waits unbound.
    after = get(cp, "Pod", "server", ns)
    assert after is not None and not after["metadata"].get("deletionTimestamp")
    assert after["metadata"]["uid"] == before["metadata"]["uid"] and after["spec"]["nodeName"] == node
    for name in ("wide-0", "wide-1"):
        pod = get(cp, "Pod", name, ns)
        assert pod is not None and not pod["spec"].get("nodeName"), name
    # explain shows the same plan and its cost.
    exe = Path(sys.executable).parent / "gangslice"
    run = subprocess.run(
        [str(exe), "explain", f"gang/{ns}/wide", "--json", f"--kubeconfig={cp.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    facts = json.loads(run.stdout)
    plan = facts["migration"]["plan"]
    assert plan["domain"] == "leaf mig-leaf-a" and plan["restartGpuSeconds"] == 45.0, facts["migration"]
    assert [m["pod"] for m in plan["moves"]] == [f"{ns}/server"], plan
    assert [s["node"] for s in plan["moves"][0]["to"]] == ["mig-c0"], plan
    metrics = gangslice.metrics()
    assert "gangslice_migration_plans_total 1.0" in metrics, metrics
    assert "gangslice_migration_restart_gpu_seconds_total 45.0" in metrics
