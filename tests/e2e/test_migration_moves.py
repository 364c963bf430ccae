"""``serve --migration on`` on a real control plane (kube-controller-manager's Deployment,
ReplicaSet, disruption and garbage-collector controllers): a wide gang that waits while a
replica labelled ``gangslice.io/movable`` holds part of the leaf it needs gets the leaf. The
replica is evicted through ``pods/eviction``, its ReplicaSet's replacement lands on the slot
held for it in the other leaf, and no GPU is promised twice (by two pods, or by two
SliceReservations, at any poll). A PodDisruptionBudget that allows no disruption refuses the
plan: nothing is evicted or held, and the gang waits.

Nodes (pool ``mv``): leaf a of two HGX H100 nodes, leaf c of one. Each test: a Deployment of
one 1-GPU replica placed in leaf a (leaf c cordoned meanwhile), then a gang of two 8-GPU pods
that requires one leaf.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    POOL as POOL_LABEL,
)
from cluster import (
    FakeNode,
    Gangslice,
    KubeletStandIn,
    clean_namespace,
    create,
    delete_owners,
    double_booked,
    events_for,
    extender_stack,
    gang_pods,
    gpus_of,
    is_ready,
    items,
    merge_patch,
    new_namespace,
    reserved_nodes,
    running_control_plane,
    slot_places,
    wait_for,
)

from extender.bench.controlplane import ControlPlane
from extender.controllers.migration.reporter import REFUSED, STARTED
from extender.kube import names

pytestmark = pytest.mark.e2e

POOL = "mv"
NODES = [
    FakeNode("mv-a0", "hgx-h100", "s1", "mv-leaf-a"),
    FakeNode("mv-a1", "hgx-h100", "s1", "mv-leaf-a"),
    FakeNode("mv-c0", "hgx-h100", "s1", "mv-leaf-c"),
]
#: kube-controller-manager's names (``--controllers``): the replica's owners and its budget.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "garbage-collector-controller",
)
APPS = "/apis/apps/v1"
APP = "app.kubernetes.io/name"
#: Seconds for the plan, the eviction, the replacement and the gang to bind (housekeeping runs
#: every 5 s; kube-scheduler retries the gang's pods).
MOVE_S = 90.0


@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    with running_control_plane(e2e_bin_dir, CONTROLLERS) as cp:
        yield cp


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    args = ["--migration=on", "--migrate-after=0"]
    with extender_stack(
        control_plane, POOL, NODES, controller=True, name="gangslice-moves", extra_args=args
    ) as s:
        yield s


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(control_plane, [n.name for n in NODES]).start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


@pytest.fixture
def ns(control_plane: ControlPlane, gangslice: Gangslice, kubelet: KubeletStandIn) -> Iterator[str]:
    """A fresh namespace; afterwards its Deployments go first (else their ReplicaSets would make
    the pods again), then the rest."""
    cp = control_plane
    name = new_namespace(cp, f"{POOL}-{uuid.uuid4().hex[:6]}")
    try:
        yield name
    finally:
        delete_owners(cp, name, ("deployments", "replicasets"))
        clean_namespace(cp, name)
        wait_for(f"the pods of namespace {name} gone", lambda: not items(cp, "Pod", name), 60, 0.5)


def replica_deployment(ns: str, name: str) -> dict[str, Any]:
    """One movable 1-GPU replica whose model load takes 45 s."""
    gpu = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {APP: name}},
            "template": {
                "metadata": {
                    "labels": {APP: name, names.MOVABLE: "true"},
                    "annotations": {names.RESTART_SECONDS: "45"},
                },
                "spec": {
                    "schedulerName": "gangslice-scheduler",
                    "nodeSelector": {POOL_LABEL: POOL},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "10m", **gpu}, "limits": gpu},
                        }
                    ],
                },
            },
        },
    }


def replicas(cp: ControlPlane, ns: str, app: str) -> list[dict[str, Any]]:
    return [p for p in items(cp, "Pod", ns, f"{APP}={app}") if not p["metadata"].get("deletionTimestamp")]


def running_in_leaf_a(cp: ControlPlane, ns: str, app: str) -> dict[str, Any]:
    """Deploy ``app`` and wait for its one replica running in leaf a (leaf c cordoned meanwhile)."""
    merge_patch(cp, "Node", "mv-c0", {"spec": {"unschedulable": True}})
    create(cp, replica_deployment(ns, app))

    def running() -> dict[str, Any] | None:
        found = [p for p in replicas(cp, ns, app) if is_ready(p)]
        return found[0] if found else None

    try:
        pod = wait_for(f"the movable replica of {app} running", running, 60)
    finally:
        merge_patch(cp, "Node", "mv-c0", {"spec": {"unschedulable": False}})
    assert pod["spec"]["nodeName"] in ("mv-a0", "mv-a1"), pod["spec"]["nodeName"]
    return pod


def wide_gang(cp: ControlPlane, ns: str) -> None:
    for pod in gang_pods("wide", 2, 8, POOL, extra={names.REQUIRED_LEVEL: "leaf"}):
        create(cp, {**pod, "metadata": {**pod["metadata"], "namespace": ns}})


def event(cp: ControlPlane, ns: str, reason: str) -> dict[str, Any] | None:
    found = [e for e in events_for(cp, ns, "wide-0") if e.get("reason") == reason]
    return found[0] if found else None


def promised_twice(cp: ControlPlane) -> dict[str, list[int]]:
    """GPUs two pods claim, or two SliceReservations hold, per node (empty when none). A hold
    over GPUs a leaving replica still runs on is by design: it keeps them for the gang."""
    twice = double_booked(cp, [n.name for n in NODES])
    held: dict[str, list[int]] = {}
    for r in items(cp, "SliceReservation"):
        for node, gpus in slot_places(r):
            held.setdefault(node, []).extend(gpus)
    twice.update({n: g for n, g in held.items() if len(g) != len(set(g))})
    return twice


def holds(cp: ControlPlane, ns: str) -> list[str]:
    """The SliceReservations of the namespace kept for someone else (a migration's)."""
    return [
        r["metadata"]["name"]
        for r in items(cp, "SliceReservation", ns)
        if names.META_HELD_FOR in r["spec"]["meta"]
    ]


def test_the_replica_moves_to_its_held_slot_and_the_gang_gets_the_leaf(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    before = running_in_leaf_a(cp, ns, "server")
    wide_gang(cp, ns)
    # Before the eviction the migration holds a slot for the replacement (until the
    # replacement runs there: seconds) and the leaf for the gang (until the gang's own
    # reservation takes it: perhaps too briefly for a poll to see).
    seen: dict[str, dict[str, Any]] = {}

    def held() -> bool:
        assert promised_twice(cp) == {}
        for r in items(cp, "SliceReservation", ns):
            who = r["spec"]["meta"].get(names.META_HELD_FOR, "")
            if who:
                seen.setdefault(who.split(":", 1)[0], r)
        return "owner" in seen

    wait_for("the replacement's slot held", held, MOVE_S, 0.1)
    owner = before["metadata"]["ownerReferences"][0]["uid"]
    assert seen["owner"]["spec"]["meta"][names.META_HELD_FOR] == f"owner:{owner}"
    if "gang" in seen:
        assert seen["gang"]["spec"]["meta"][names.META_HELD_FOR] == f"gang:{ns}/wide"
        assert sorted(reserved_nodes(seen["gang"])) == ["mv-a0", "mv-a1"]
    started = wait_for(
        "a MigrationStarted Event on the wide gang's pod", lambda: event(cp, ns, STARTED), MOVE_S
    )
    message = started["message"]
    prefix = f"{ns}/{before['metadata']['name']} from {before['spec']['nodeName']} to mv-c0 (GPUs "
    assert "off leaf mv-leaf-a" in message and prefix in message and "45 GPU-seconds" in message, message
    promised = [int(g) for g in message.split(prefix, 1)[1].split(")", 1)[0].split(",")]

    def gang_bound() -> list[dict[str, Any]] | None:
        assert promised_twice(cp) == {}
        pods = [p for p in items(cp, "Pod", ns, "gangslice.io/gang=wide") if p["spec"].get("nodeName")]
        return pods if len(pods) == 2 else None

    gang = wait_for("the wide gang bound", gang_bound, MOVE_S)
    assert sorted(p["spec"]["nodeName"] for p in gang) == ["mv-a0", "mv-a1"]
    assert all(sorted(gpus_of(p)) == list(range(8)) for p in gang)

    def replaced() -> dict[str, Any] | None:
        assert promised_twice(cp) == {}
        found = [p for p in replicas(cp, ns, "server") if is_ready(p)]
        return found[0] if found and found[0]["metadata"]["uid"] != before["metadata"]["uid"] else None

    after = wait_for("the replacement replica running", replaced, MOVE_S)
    # The replacement landed on the slot held for it, not where the plain rule would put it.
    assert after["spec"]["nodeName"] == "mv-c0" and gpus_of(after) == promised, (after["spec"], promised)
    assert slot_places(seen["owner"]) == [("mv-c0", tuple(promised))]
    assert promised_twice(cp) == {}
    wait_for("the migration's holds released", lambda: not holds(cp, ns), 30)
    metrics = gangslice.metrics()
    assert 'gangslice_migration_evictions_total{result="evicted"} 1.0' in metrics, metrics


def test_a_budget_that_allows_no_disruption_evicts_nothing_and_the_gang_waits(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    before = running_in_leaf_a(cp, ns, "guarded")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {APP: "guarded"}}},
    }
    create(cp, budget)
    wide_gang(cp, ns)
    refused = wait_for(
        "a MigrationRefused Event on the wide gang's pod", lambda: event(cp, ns, REFUSED), MOVE_S
    )
    assert f"PodDisruptionBudget of pod {ns}/{before['metadata']['name']}" in refused["message"], refused
    assert "nothing evicted, the gang waits" in refused["message"]
    # Nothing moved or held: the same replica where it ran, the gang unbound.
    (now,) = replicas(cp, ns, "guarded")
    assert now["metadata"]["uid"] == before["metadata"]["uid"]
    assert now["spec"]["nodeName"] == before["spec"]["nodeName"]
    assert not [p for p in items(cp, "Pod", ns, "gangslice.io/gang=wide") if p["spec"].get("nodeName")]
    assert holds(cp, ns) == [] and not items(cp, "SliceReservation", ns)
    assert double_booked(cp, [n.name for n in NODES]) == {}
    assert 'gangslice_migration_evictions_total{result="blocked"}' in gangslice.metrics()
