"""Kueue's manager (v0.19.2) with a ClusterQueue whose admission check is gangslice's.

Kueue runs out of cluster with the admin kubeconfig: internal cert management off, no webhook
configurations registered (Workloads are created directly, or from a Job created already suspended, the
paths that need no webhook; its webhook server still starts on loopback with a certificate from the
cluster CA). Kueue v0.19 reads its metrics certificate from the hard-coded ``/etc/kueue/metrics/certs``,
so it runs in a private mount namespace (``unshare -m``) with a tmpfs on ``/etc`` holding that
certificate; nothing on the machine changes.

gangslice runs with the controller (Lease in gangslice-system) under the shipped RBAC; the Retry test
restarts it with short waits (``--widen-after``, ``--retry-after``, ``--requeue-after``, ``--resync``).

Nodes (pool ``kq``): spine s1, leaves a and b of two HGX H100 nodes each (the feasibility test adds
and removes a leaf f of its own).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import pytest
from cluster import (
    GPU,
    LEAF,
    FakeNode,
    Gangslice,
    KubeletStandIn,
    create,
    delete,
    double_booked,
    events_for,
    extender_stack,
    get,
    gpu_pod,
    gpus_of,
    hgx_leaves,
    is_ready,
    items,
    make_node,
    merge_patch,
    movable_replica,
    node_of,
    remove_crds,
    remove_node,
    reserved_nodes,
    scheduled_condition,
    wait_for,
)
from cluster import POOL as POOL_LABEL
from managers import start_kueue, stop_kueue

from extender.bench.controlplane import ControlPlane
from extender.controllers.migration.reporter import REASON as MIGRATION_PLANNED

pytestmark = pytest.mark.e2e

POOL = "kq"
NODES = hgx_leaves(POOL, 2)
LEAF_OF = {n.name: n.leaf for n in NODES}
CHECK = "gangslice-e2e"
FLAVOR = "kq-gpu"
CLUSTER_QUEUE = "kq-gpu"
LOCAL_QUEUE = "gpu"


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    crds = start_kueue(cp)
    try:
        with extender_stack(cp, POOL, NODES, controller=True, name="gangslice-kueue") as server:
            create(
                cp,
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ResourceFlavor",
                    "metadata": {"name": FLAVOR},
                    "spec": {"nodeLabels": {POOL_LABEL: POOL}},
                },
            )
            create(
                cp,
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "AdmissionCheck",
                    "metadata": {"name": CHECK},
                    "spec": {"controllerName": "gangslice.io/topology"},
                },
            )
            create(
                cp,
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ClusterQueue",
                    "metadata": {"name": CLUSTER_QUEUE},
                    "spec": {
                        "namespaceSelector": {},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                "flavors": [
                                    {
                                        "name": FLAVOR,
                                        "resources": [
                                            {"name": "cpu", "nominalQuota": "1000"},
                                            {"name": "memory", "nominalQuota": "100Ti"},
                                            {"name": "nvidia.com/gpu", "nominalQuota": "64"},
                                        ],
                                    }
                                ],
                            }
                        ],
                        "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
                    },
                },
            )

            def check_active() -> bool:
                ac = get(cp, "AdmissionCheck", CHECK) or {}
                conds = (ac.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

            wait_for("our AdmissionCheck Active (set by gangslice)", check_active, 60)

            def cq_active() -> bool:
                cq = get(cp, "ClusterQueue", CLUSTER_QUEUE) or {}
                conds = (cq.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

            wait_for("the ClusterQueue Active (set by Kueue)", cq_active, 60)
            try:
                yield server
            finally:
                for kind, name in (
                    ("ClusterQueue", CLUSTER_QUEUE),
                    ("AdmissionCheck", CHECK),
                    ("ResourceFlavor", FLAVOR),
                ):
                    cp.request("DELETE", f"/apis/kueue.x-k8s.io/v1beta2/{kind.lower()}s/{name}")
    finally:
        stop_kueue(cp)
        # Leave the cluster as this module found it: later modules run without Kueue installed.
        remove_crds(cp, crds)


@pytest.fixture
def ns(ns: str, control_plane: ControlPlane) -> str:
    """conftest's namespace, with the LocalQueue every Workload here names."""
    create(
        control_plane,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": ns},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    return ns


def workload(ns: str, name: str, count: int, required_level: str | None = "leaf") -> dict[str, Any]:
    template = gpu_pod("worker", 8, POOL)
    if required_level:
        template["metadata"]["annotations"]["gangslice.io/required-level"] = required_level
    template.pop("apiVersion")
    template.pop("kind")
    template["metadata"].pop("name")
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "queueName": LOCAL_QUEUE,
            "podSets": [{"name": "workers", "count": count, "template": template}],
        },
    }


def our_check(wl: dict[str, Any] | None) -> dict[str, Any] | None:
    for entry in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if entry["name"] == CHECK:
            return dict(entry)
    return None


def condition(wl: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((wl or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def is_true(wl: dict[str, Any] | None, kind: str) -> bool:
    c = condition(wl, kind)
    return bool(c and c["status"] == "True")


def pending_with_message(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    wl = get(cp, "Workload", name, ns)
    check = our_check(wl)
    if is_true(wl, "QuotaReserved") and check and check["state"] == "Pending" and check.get("message"):
        return check
    return None


def test_workload_held_until_its_slice_is_reserved_then_admitted_and_pods_land_on_it(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    # One 8-GPU pod on a node of each leaf: no leaf has two free nodes, so no slice exists yet.
    for node in ("kq-a0", "kq-b0"):
        blocker = gpu_pod(f"blocker-{node}", 8, POOL)
        blocker["metadata"]["namespace"] = ns
        blocker["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
        create(cp, blocker)
        name = str(blocker["metadata"]["name"])
        wait_for(f"{name} bound", partial(node_of, cp, ns, name), 60)

    create(cp, workload(ns, "llm", 2))
    check = wait_for(
        "Workload quota-reserved with our check Pending and a message",
        lambda: pending_with_message(cp, ns, "llm"),
        60,
    )
    assert "waiting for a slice" in check["message"], check
    wl = get(cp, "Workload", "llm", ns)
    assert not is_true(wl, "Admitted"), wl
    assert not items(cp, "SliceReservation", ns)

    for node in ("kq-a0", "kq-b0"):
        delete(cp, "Pod", f"blocker-{node}", ns)

    def admitted() -> dict[str, Any] | None:
        wl = get(cp, "Workload", "llm", ns)
        return wl if is_true(wl, "Admitted") else None

    admitted_wl = wait_for("Kueue to admit the Workload once our check is Ready", admitted, 60)
    ready = our_check(admitted_wl)
    assert ready and ready["state"] == "Ready", ready
    (reservation,) = items(cp, "SliceReservation", ns)
    slot_nodes = reserved_nodes(reservation)
    assert len(set(slot_nodes)) == 2 and len({LEAF_OF[n] for n in slot_nodes}) == 1, slot_nodes
    updates = {u["name"]: u for u in ready.get("podSetUpdates") or []}
    annotations = (updates.get("workers") or {}).get("annotations") or {}
    assert annotations.get("gangslice.io/reservation") == reservation["metadata"]["name"], updates

    # Play the job controller: create the pods with what the check's podSetUpdates say.
    update = updates["workers"]
    for i in range(2):
        pod = gpu_pod(f"llm-{i}", 8, POOL, labels=update.get("labels"), annotations=annotations)
        pod["metadata"]["namespace"] = ns
        pod["spec"]["nodeSelector"].update(update.get("nodeSelector") or {})
        create(cp, pod)
    nodes = [wait_for(f"{name} bound", partial(node_of, cp, ns, name), 60) for name in ("llm-0", "llm-1")]
    assert sorted(nodes) == sorted(slot_nodes), (nodes, slot_nodes)
    for i in range(2):
        assert sorted(gpus_of(get(cp, "Pod", f"llm-{i}", ns) or {})) == list(range(8))
    assert not double_booked(cp, LEAF_OF)


def test_a_workload_that_waits_hears_the_migration_plan_on_itself(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """``serve --migration report`` for a Kueue gang: its Workload waits with no pod while a
    replica labelled movable holds a node of the leaf it could fit, and the MigrationPlanned
    Event naming the move is on the Workload; nothing is evicted."""
    cp = control_plane
    kubelet = KubeletStandIn(cp, [n.name for n in NODES]).start()
    try:
        with serving_with(gangslice, ["--migrate-after=0"]):
            # Leaf b: a pod that does not move, on kq-b0. Leaf a: a 1-GPU movable replica of a
            # ReplicaSet, on kq-a0 (the other nodes cordoned until it runs: pinned by a
            # nodeSelector it could not move). No leaf has two whole nodes.
            blocker = gpu_pod("blocker", 1, POOL)
            blocker["metadata"]["namespace"] = ns
            blocker["spec"]["nodeSelector"]["kubernetes.io/hostname"] = "kq-b0"
            others = ("kq-a1", "kq-b0", "kq-b1")
            try:
                for pod, cordoned in ((blocker, ()), (movable_replica(cp, ns, "server", 1, POOL), others)):
                    for node in cordoned:
                        merge_patch(cp, "Node", node, {"spec": {"unschedulable": True}})
                    create(cp, pod)
                    name = str(pod["metadata"]["name"])
                    wait_for(
                        f"{name} running", lambda name=name: is_ready(get(cp, "Pod", name, ns) or {}), 60
                    )
            finally:
                for node in others:
                    merge_patch(cp, "Node", node, {"spec": {"unschedulable": False}})
            assert node_of(cp, ns, "server") == "kq-a0"
            create(cp, workload(ns, "wide", 2))

            def planned() -> dict[str, Any] | None:
                found = [e for e in events_for(cp, ns, "wide") if e.get("reason") == MIGRATION_PLANNED]
                return found[0] if found else None

            event = wait_for("a MigrationPlanned Event on the waiting Workload", planned, 90)
            wl = get(cp, "Workload", "wide", ns)
            assert wl is not None and not is_true(wl, "Admitted"), wl
            involved = event["involvedObject"]
            assert (involved["apiVersion"], involved["kind"]) == ("kueue.x-k8s.io/v1beta2", "Workload")
            assert involved["uid"] == wl["metadata"]["uid"], involved
            message = event["message"]
            assert f"{ns}/server from kq-a0 to kq-" in message and "nothing evicted" in message, message
            pod = get(cp, "Pod", "server", ns)
            assert pod is not None and not pod["metadata"].get("deletionTimestamp"), pod
            assert pod["spec"]["nodeName"] == "kq-a0"
            assert not kubelet.errors, list(kubelet.errors)
    finally:
        kubelet.stop()
        delete(cp, "Workload", "wide", ns)


@contextlib.contextmanager
def serving_with(server: Gangslice, extra_args: Sequence[str]) -> Iterator[None]:
    """Restart the module's ``gangslice serve`` with ``extra_args``; back to the plain one on exit."""
    server.stop()
    server.extra_args = tuple(extra_args)
    try:
        server.start()
        yield
    finally:
        server.stop()
        server.extra_args = ()
        server.start()


def workload_writes(
    cp: ControlPlane, ns: str, name: str, since: str, timeout: int
) -> Iterator[dict[str, Any]]:
    """Every version of the Workload written after resourceVersion ``since`` (a watch, so none is missed)."""
    assert cp.ca_file is not None
    query = urllib.parse.urlencode(
        {
            "watch": "true",
            "fieldSelector": f"metadata.name={name}",
            "resourceVersion": since,
            "timeoutSeconds": str(timeout),
        }
    )
    req = urllib.request.Request(f"{cp.server}/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads?{query}")
    req.add_header("Authorization", f"Bearer {cp.admin_token}")
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    with urllib.request.urlopen(req, context=ctx, timeout=timeout + 10) as resp:
        for line in resp:
            event = json.loads(line)
            assert event["type"] in ("ADDED", "MODIFIED"), event
            yield event["object"]


def quota_released(wl: dict[str, Any]) -> bool:
    return not is_true(wl, "QuotaReserved") and not (wl.get("status") or {}).get("admission")


def suspended_job(ns: str, name: str, count: int, required_level: str) -> dict[str, Any]:
    """A batch/v1 Job in our LocalQueue, created suspended (the part of Kueue's webhook this tier lacks).

    A job, not a bare Workload: on eviction it is Kueue's job reconciler that stops the job and clears
    the Workload's quota reservation; a Workload with no job stays QuotaReserved and Evicted."""
    template = gpu_pod("worker", 8, POOL, annotations={"gangslice.io/required-level": required_level})
    template.pop("apiVersion")
    template.pop("kind")
    template["metadata"].pop("name")
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}},
        "spec": {"suspend": True, "parallelism": count, "completions": count, "template": template},
    }


def test_gang_that_cannot_fit_stays_pending_with_our_message_then_retries_and_gives_its_quota_back(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    requeue_after = 3
    short_waits = ["--widen-after=1", "--retry-after=20", f"--requeue-after={requeue_after}", "--resync=1"]
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    with serving_with(gangslice, short_waits):
        # Three 8-GPU pods within one leaf: no leaf has three nodes. Kueue's quota (64 GPUs) is not the limit.
        cp.request("POST", jobs, suspended_job(ns, "huge", 3, "leaf"))
        try:
            retry_then_release(cp, ns, requeue_after)
        finally:
            # Before clean_namespace deletes the Workload, or Kueue makes the job a new one.
            cp.request("DELETE", f"{jobs}/huge?propagationPolicy=Background")


def retry_then_release(cp: ControlPlane, ns: str, requeue_after: int) -> None:
    def the_workload() -> str | None:
        found = items(cp, "Workload", ns)
        return str(found[0]["metadata"]["name"]) if found else None

    name = wait_for("Kueue to create the job's Workload", the_workload, 60)
    check = wait_for(
        "Workload quota-reserved with our check Pending and a message",
        lambda: pending_with_message(cp, ns, name),
        60,
    )
    assert "waiting for a slice" in check["message"], check
    wl = get(cp, "Workload", name, ns)
    assert not is_true(wl, "Admitted"), wl
    assert not items(cp, "SliceReservation", ns)
    reasons = {e["reason"] for e in events_for(cp, ns, name)}
    assert "WaitingForSlice" in reasons, reasons

    def in_retry() -> dict[str, Any] | None:
        wl = get(cp, "Workload", name, ns)
        check = our_check(wl)
        return wl if check and check["state"] == "Retry" else None

    retrying = wait_for("our check in Retry after --widen-after + --retry-after", in_retry, 60)
    retry = our_check(retrying)
    assert retry is not None
    assert retry["message"].startswith("no slice after 21s, giving the quota back: "), retry
    assert retry.get("requeueAfterSeconds") == requeue_after, retry
    # Kueue holds the quota until requeueAfterSeconds has passed since the Retry, then evicts the
    # Workload: the quota and the admission are released and every check goes back to Pending.
    seen: list[dict[str, Any]] = []
    released = None
    for version in workload_writes(cp, ns, name, retrying["metadata"]["resourceVersion"], 60):
        seen.append(version)
        if quota_released(version):
            released = version
            break
    history = [
        (
            (condition(v, "QuotaReserved") or {}).get("status"),
            bool((v.get("status") or {}).get("admission")),
            (our_check(v) or {}).get("state"),
            (condition(v, "Evicted") or {}).get("reason"),
        )
        for v in seen
    ]
    assert released is not None, f"Kueue never released the quota; writes seen: {history}"
    evicted = condition(released, "Evicted")
    assert evicted and evicted["status"] == "True" and evicted["reason"] == "AdmissionCheck", released
    reset = our_check(released)
    assert reset and reset["state"] == "Pending", reset
    assert "Previously: Retry" in reset["message"], reset
    assert not items(cp, "SliceReservation", ns)
    reasons = {e["reason"] for e in events_for(cp, ns, name)}
    assert "SliceRetry" in reasons, reasons


def leading(server: Gangslice) -> bool:
    """The restarted process holds the Lease (a kill -9 leaves the old one to expire)."""
    try:
        with urllib.request.urlopen(server.url + "/readyz", timeout=3, context=server._ssl()) as resp:
            return "(leader)" in resp.read().decode()
    except OSError:
        return False


def restart_after_kill9(server: Gangslice) -> None:
    server.kill9()
    server.start()
    wait_for("the restarted gangslice to lead", lambda: leading(server), 60, 0.5)


def member(ns: str, name: str, update: dict[str, Any]) -> dict[str, Any]:
    pod = gpu_pod(name, 8, POOL, labels=update.get("labels"), annotations=update.get("annotations"))
    pod["metadata"]["namespace"] = ns
    pod["spec"]["nodeSelector"].update(update.get("nodeSelector") or {})
    return pod


def test_kill9_after_the_reservation_is_saved_and_during_the_binds_promises_no_gpu_twice(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """Kill -9 (1) once the Workload's SliceReservation is saved and its check Ready, before any
    member binds, and (2) after its first member bound: each restart rebuilds the same
    reservation, a rival pod on the gang's leaf is kept off the nodes only gangslice's ledger
    holds, the gang completes on its slots, and once it ends nothing is left."""
    cp = control_plane

    def admitted() -> dict[str, Any] | None:
        wl = get(cp, "Workload", "llm", ns)
        return wl if is_true(wl, "Admitted") else None

    create(cp, workload(ns, "llm", 2))
    ready = our_check(wait_for("the Workload admitted with our check Ready", admitted, 60))
    assert ready and ready["state"] == "Ready", ready
    (saved,) = items(cp, "SliceReservation", ns)
    slot_nodes = reserved_nodes(saved)
    leaf = LEAF_OF[slot_nodes[0]]
    update = {u["name"]: u for u in ready.get("podSetUpdates") or []}["workers"]

    restart_after_kill9(gangslice)
    (kept,) = items(cp, "SliceReservation", ns)
    assert kept["metadata"]["uid"] == saved["metadata"]["uid"] and reserved_nodes(kept) == slot_nodes

    rival = gpu_pod("rival", 8, POOL)
    rival["metadata"]["namespace"] = ns
    rival["spec"]["nodeSelector"][LEAF] = leaf
    create(cp, rival)

    def rival_unschedulable() -> bool:
        cond = scheduled_condition(get(cp, "Pod", "rival", ns) or {})
        return bool(cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable")

    wait_for("the rival marked Unschedulable", rival_unschedulable, 60)

    create(cp, member(ns, "llm-0", update))
    first = wait_for("llm-0 bound", partial(node_of, cp, ns, "llm-0"), 60)
    assert first in slot_nodes

    restart_after_kill9(gangslice)
    create(cp, member(ns, "llm-1", update))
    second = wait_for("llm-1 bound", partial(node_of, cp, ns, "llm-1"), 90)
    assert sorted([first, second]) == sorted(slot_nodes)
    for name in ("llm-0", "llm-1"):
        assert sorted(gpus_of(get(cp, "Pod", name, ns) or {})) == list(range(8))
    assert node_of(cp, ns, "rival") is None
    assert not double_booked(cp, LEAF_OF), double_booked(cp, LEAF_OF)

    # The gang ends: its reservation goes, and the rival gets a node of the leaf.
    for name in ("llm-0", "llm-1"):
        delete(cp, "Pod", name, ns)
    delete(cp, "Workload", "llm", ns)
    wait_for("the reservation released", lambda: not items(cp, "SliceReservation", ns) or None, 60)
    assert LEAF_OF[wait_for("the rival bound", partial(node_of, cp, ns, "rival"), 60)] == leaf
    assert not double_booked(cp, LEAF_OF)


# -- pod feasibility ---------------------------------------------------------------------------------
DISK = "e2e.gangslice.io/disk"
#: Leaf f: each of f1..f4 is refused by one of kube-scheduler's filters for the Workload's pods; f5 is
#: the only node they may use. f5 sorts last, so a slice that ignored a filter would pick another.
FEASIBILITY_NODES = [
    FakeNode(f"kq-f{i}-{what}", "hgx-h100", "s1", "kq-leaf-f")
    for i, what in enumerate(("taint", "cordon", "full", "hdd", "good"), start=1)
]


def feasibility_nodes(cp: ControlPlane, ns: str) -> None:
    """Leaf f as described at :data:`FEASIBILITY_NODES`."""
    for node in FEASIBILITY_NODES:
        make_node(cp, node, POOL)
        disk = "hdd" if node.name.endswith("hdd") else "nvme"
        spec: dict[str, Any] = {}
        if node.name.endswith("taint"):
            spec["taints"] = [
                {"key": "e2e.gangslice.io/dedicated", "value": "training", "effect": "NoSchedule"}
            ]
        if node.name.endswith("good"):  # a taint the pods tolerate
            spec["taints"] = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
        if node.name.endswith("cordon"):
            spec["unschedulable"] = True
        merge_patch(cp, "Node", node.name, {"metadata": {"labels": {DISK: disk}}, "spec": spec})
    # f3: 100Gi allocatable, of which a pod already bound there requests 60Gi; the Workload's pods ask 64Gi.
    full = FEASIBILITY_NODES[2].name
    resources = {"cpu": "128", "memory": "100Gi", "pods": "110", GPU: "8"}
    merge_patch(cp, "Node", full, {"status": {"capacity": resources, "allocatable": resources}}, sub="status")
    squatter = gpu_pod("squatter", 0, POOL)
    squatter["metadata"]["namespace"] = ns
    squatter["spec"]["nodeName"] = full
    squatter["spec"]["containers"][0]["resources"] = {"requests": {"memory": "60Gi"}}
    create(cp, squatter)


def feasibility_workload(ns: str, name: str) -> dict[str, Any]:
    wl = workload(ns, name, 1, required_level=None)
    template = wl["spec"]["podSets"][0]["template"]
    template["spec"]["nodeSelector"][DISK] = "nvme"
    template["spec"]["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    template["spec"]["containers"][0]["resources"]["requests"]["memory"] = "64Gi"
    return wl


def test_a_workloads_reservation_keeps_to_nodes_its_pods_pass_kube_schedulers_filters_on(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    try:
        feasibility_nodes(cp, ns)
        wait_for(
            "gangslice to see leaf f",
            lambda: all(get(cp, "NodeTopology", n.name) for n in FEASIBILITY_NODES),
            30,
        )
        create(cp, feasibility_workload(ns, "fits"))

        def admitted(name: str) -> dict[str, Any] | None:
            wl = get(cp, "Workload", name, ns)
            return wl if is_true(wl, "Admitted") else None

        wait_for("Kueue to admit the Workload once our check is Ready", lambda: admitted("fits"), 60)
        (reservation,) = items(cp, "SliceReservation", ns)
        assert reserved_nodes(reservation) == ["kq-f5-good"], reservation["spec"]

        # f5 is held now: a second such Workload has no node, and says which filters refused the others.
        create(cp, feasibility_workload(ns, "waits"))
        check = wait_for(
            "the second Workload pending with our message",
            lambda: pending_with_message(cp, ns, "waits"),
            60,
        )
        for words in (
            "TaintToleration",
            "e2e.gangslice.io/dedicated=training:NoSchedule",
            "NodeUnschedulable",
            "NodeResourcesFit",
            "insufficient memory",
        ):
            assert words in check["message"], (words, check["message"])
        assert len(items(cp, "SliceReservation", ns)) == 1
    finally:
        delete(cp, "Pod", "squatter", ns)
        for name in ("fits", "waits"):
            delete(cp, "Workload", name, ns)
        for node in FEASIBILITY_NODES:
            remove_node(cp, node.name)
