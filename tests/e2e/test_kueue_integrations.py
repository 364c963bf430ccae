"""Kueue's LeaderWorkerSet and pod-group integrations, placed by gangslice's admission check, on the real
control plane.

A control plane of its own: kube-controller-manager with the statefulset and garbage-collector
controllers, the LeaderWorkerSet manager and Kueue's manager (``tests/e2e/managers.py``), both with
their webhooks registered on loopback, Kueue's ``leaderworkerset.x-k8s.io/leaderworkerset``
and ``pod`` integrations on, and ``gangslice serve`` with its controller under
the shipped RBAC. :class:`KubeletStandIn` marks bound pods Running and Ready.

What the parts do: Kueue's LeaderWorkerSet webhook labels both pod templates with the queue; its pod
webhook gates every pod of a group (``kueue.x-k8s.io/admission``) and makes the group one Workload with
a ``leader`` and a ``worker`` pod set; gangslice's admission check reserves the group's slice and hands
Kueue the ``podSetUpdates`` naming the reservation; Kueue admits and ungates; kube-scheduler's
gangslice profile binds each pod to its slot.

Tests: an LWS of TP=8 x PP=2 (a leader and a worker of 8 GPUs, ``required-level: leaf``) in a
LocalQueue binds as one reserved slice under one leaf, no GPU twice; scaled to 2 groups, the second
group is a Workload and a slice of its own, and the first stays where it was. A plain pod group
(``kueue.x-k8s.io/pod-group-name``, its total count) is one Workload, held until its slice is
reserved, then bound on it.

Nodes (pool ``kqlws``): spine s1 with leaves a and b of two HGX H100 nodes (8 GPUs) each.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    GPU,
    Gangslice,
    KubeletStandIn,
    clean_namespace,
    create,
    double_booked,
    extender_stack,
    get,
    gpu_pod,
    hgx_leaves,
    items,
    new_namespace,
    placed,
    running_control_plane,
    slot_places,
    wait_for,
    wait_for_or_false,
)
from cluster import POOL as POOL_LABEL
from managers import LWS, start_kueue, start_manager, stop_kueue, stop_manager

from extender.bench.controlplane import ControlPlane
from extender.kube import names

pytestmark = pytest.mark.e2e

POOL = "kqlws"
NODES = hgx_leaves(POOL, 2)
LEAF_OF = {n.name: n.leaf for n in NODES}
CONTROLLERS = ("statefulset-controller", "garbage-collector-controller")
CHECK = "gangslice-lws"
FLAVOR = "kqlws-gpu"
CLUSTER_QUEUE = "kqlws-gpu"
LOCAL_QUEUE = "gpu"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
LWS_PATH = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets"
#: Seconds for a group's pods to be created, admitted and bound.
BIND_S = 90.0


@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    with running_control_plane(e2e_bin_dir, CONTROLLERS) as cp:
        hooks = start_manager(cp, LWS)
        start_kueue(cp, frameworks=("pod", "leaderworkerset.x-k8s.io/leaderworkerset"), webhooks=True)
        try:
            yield cp
        finally:
            stop_kueue(cp)
            stop_manager(cp, LWS, hooks)


def _active(cp: ControlPlane, kind: str, name: str) -> bool:
    obj = get(cp, kind, name) or {}
    return any(
        c["type"] == "Active" and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    with extender_stack(cp, POOL, NODES, controller=True, name="gangslice-kqlws") as server:
        quota = [
            {"name": "cpu", "nominalQuota": "1000"},
            {"name": "memory", "nominalQuota": "100Ti"},
            {"name": GPU, "nominalQuota": "32"},
        ]
        for kind, obj in (
            ("ResourceFlavor", {"metadata": {"name": FLAVOR}, "spec": {"nodeLabels": {POOL_LABEL: POOL}}}),
            (
                "AdmissionCheck",
                {"metadata": {"name": CHECK}, "spec": {"controllerName": "gangslice.io/topology"}},
            ),
            (
                "ClusterQueue",
                {
                    "metadata": {"name": CLUSTER_QUEUE},
                    "spec": {
                        "namespaceSelector": {},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu", "memory", GPU],
                                "flavors": [{"name": FLAVOR, "resources": quota}],
                            }
                        ],
                        "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
                    },
                },
            ),
        ):
            create(cp, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, **obj})
        wait_for("our AdmissionCheck Active", lambda: _active(cp, "AdmissionCheck", CHECK), 60)
        wait_for("the ClusterQueue Active", lambda: _active(cp, "ClusterQueue", CLUSTER_QUEUE), 60)
        try:
            yield server
        finally:
            for plural, name in (
                ("clusterqueues", CLUSTER_QUEUE),
                ("admissionchecks", CHECK),
                ("resourceflavors", FLAVOR),
            ):
                cp.request("DELETE", f"{KUEUE}/{plural}/{name}")


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(control_plane, LEAF_OF).start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


@pytest.fixture
def ns(control_plane: ControlPlane, gangslice: Gangslice, kubelet: KubeletStandIn) -> Iterator[str]:
    cp = control_plane
    name = new_namespace(cp, f"{POOL}-{uuid.uuid4().hex[:6]}")
    create(
        cp,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": name},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    try:
        yield name
    finally:
        for lws in cp.request("GET", LWS_PATH.format(ns=name))["items"]:
            cp.request(
                "DELETE",
                f"{LWS_PATH.format(ns=name)}/{lws['metadata']['name']}",
                {"propagationPolicy": "Background"},
            )
        wait_for_or_false(lambda: not items(cp, "StatefulSet", name), 60)
        clean_namespace(cp, name)


# ---------------------------------------------------------------------------------------------- objects
def leader_worker_set(ns: str, name: str, replicas: int) -> dict[str, Any]:
    """TP=8 x PP=2 under Kueue: a leader and a worker of 8 GPUs per group, required under one leaf,
    no gangslice gang label (the Kueue Workload is the gang)."""
    template = {
        "metadata": {"annotations": {names.REQUIRED_LEVEL: "leaf", names.COMM: "pipeline"}},
        "spec": gpu_pod("template", 8, POOL)["spec"],
    }
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template,
                "workerTemplate": json.loads(json.dumps(template)),
            },
        },
    }


def grouped_pod(ns: str, name: str, group: str, total: int, gpus: int) -> dict[str, Any]:
    """A bare pod of Kueue's pod-group integration."""
    labels = {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE, "kueue.x-k8s.io/pod-group-name": group}
    annotations = {"kueue.x-k8s.io/pod-group-total-count": str(total), names.REQUIRED_LEVEL: "leaf"}
    pod = gpu_pod(name, gpus, POOL, labels=labels, annotations=annotations)
    pod["metadata"]["namespace"] = ns
    return pod


def groups_bound(cp: ControlPlane, ns: str, count: int) -> dict[str, list[dict[str, Any]]] | None:
    """The live pods by group index, once ``count`` groups of 2 are all bound."""
    pods = [p for p in items(cp, "Pod", ns) if not p["metadata"].get("deletionTimestamp")]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        by_group.setdefault(p["metadata"]["labels"].get(names.LWS_GROUP_INDEX, "?"), []).append(p)
    done = len(by_group) == count and all(
        len(g) == 2 and all(p["spec"].get("nodeName") for p in g) for g in by_group.values()
    )
    return by_group if done else None


def reservation_of_group(cp: ControlPlane, ns: str, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The one SliceReservation the group's pods name (``gangslice.io/reservation``, from Kueue's
    podSetUpdates)."""
    (name,) = {p["metadata"]["annotations"].get(names.RESERVATION) for p in pods}
    assert name, [p["metadata"]["annotations"] for p in pods]
    found = get(cp, "SliceReservation", str(name), ns)
    assert found is not None, name
    return found


# ---------------------------------------------------------------------------------------------- tests
def test_a_leaderworkerset_under_kueue_is_admitted_on_a_reserved_slice_and_scales_group_by_group(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    cp.request("POST", LWS_PATH.format(ns=ns), leader_worker_set(ns, "tp8pp2", replicas=1))
    first = wait_for("group 0 admitted and bound", lambda: groups_bound(cp, ns, 1), BIND_S)["0"]
    workloads = items(cp, "Workload", ns)
    assert len(workloads) == 1, [w["metadata"]["name"] for w in workloads]
    assert sorted(ps["name"] for ps in workloads[0]["spec"]["podSets"]) == ["leader", "worker"]
    r = reservation_of_group(cp, ns, first)
    assert slot_places(r) == placed(first), (slot_places(r), placed(first))
    assert len({LEAF_OF[p["spec"]["nodeName"]] for p in first}) == 1
    assert double_booked(cp, LEAF_OF) == {}

    # Scale to 2 groups: the second is a Workload and a slice of its own; the first stays.
    cp.request(
        "PATCH",
        f"{LWS_PATH.format(ns=ns)}/tp8pp2/scale",
        {"spec": {"replicas": 2}},
        content_type="application/merge-patch+json",
    )
    groups = wait_for("both groups admitted and bound", lambda: groups_bound(cp, ns, 2), BIND_S)
    assert placed(groups["0"]) == placed(first)
    second = reservation_of_group(cp, ns, groups["1"])
    assert second["metadata"]["name"] != r["metadata"]["name"]
    assert slot_places(second) == placed(groups["1"])
    assert len({LEAF_OF[p["spec"]["nodeName"]] for p in groups["1"]}) == 1
    assert len(items(cp, "Workload", ns)) == 2 and double_booked(cp, LEAF_OF) == {}


def test_a_kueue_pod_group_is_one_workload_held_until_its_slice_is_reserved_then_bound_on_it(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    pods = [grouped_pod(ns, f"pg-{i}", "pg", 3, 4) for i in range(3)]
    for pod in pods:
        create(cp, pod)
    gated = get(cp, "Pod", "pg-0", ns) or {}
    assert {"name": "kueue.x-k8s.io/admission"} in (gated["spec"].get("schedulingGates") or []), gated["spec"]

    def bound() -> list[dict[str, Any]] | None:
        got = [get(cp, "Pod", f"pg-{i}", ns) or {} for i in range(3)]
        return got if all(p.get("spec", {}).get("nodeName") for p in got) else None

    got = wait_for("the pod group admitted and bound", bound, BIND_S)
    (workload,) = items(cp, "Workload", ns)
    assert sum(ps["count"] for ps in workload["spec"]["podSets"]) == 3, workload["spec"]["podSets"]
    r = reservation_of_group(cp, ns, got)
    assert slot_places(r) == placed(got), (slot_places(r), placed(got))
    assert len({LEAF_OF[p["spec"]["nodeName"]] for p in got}) == 1 and double_booked(cp, LEAF_OF) == {}
