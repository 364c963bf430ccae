"""LeaderWorkerSets and JobSets, run by their own controllers, placed by gangslice as gangs.

A control plane of its own: etcd, kube-apiserver, kube-scheduler with the shipped extender config
calling ``gangslice serve`` (shipped RBAC, plain HTTP, the extender alone), kube-controller-manager
with only the statefulset, job and garbage-collector controllers, and the two upstream managers built
by ``hack/e2e/build.sh`` (``sigs.k8s.io/lws`` and ``sigs.k8s.io/jobset``, versions in
``hack/e2e/tools/versions.env``). :class:`KubeletStandIn` marks every pod bound to one of this
module's nodes Running and Ready, so the StatefulSets, Jobs and the LeaderWorkerSet's rolling
update progress as on a cluster.

How the two managers run, webhooks included: tests/e2e/managers.py.

Tests: an LWS of two TP=8 x PP=2 groups (leader + one worker, 8 GPUs each) binds each group as a
gang under one leaf; its rolling update (group by group) completes with the same placement rules and
no GPU handed out twice at any point; scaling it from 2 to 3 groups places the new group as a gang
and leaves the others where they are; a JobSet of two Jobs of two 4-GPU pods is one gang of four.

Nodes (pool ``lwsjs``): spine s1 with leaves a and b of four HGX H100 nodes (8 GPUs) each.
"""

from __future__ import annotations

import collections
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
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
    events_for,
    extender_stack,
    gpus_of,
    hgx_leaves,
    is_ready,
    items,
    merge_patch,
    new_namespace,
    placed,
    pod_name,
    reservations_of,
    running_control_plane,
    scheduled_condition,
    slot_places,
    slots,
    wait_for,
    wait_for_or_false,
)
from cluster import POOL as POOL_LABEL
from managers import JOBSET, JOBSET_NAME, LWS, start_manager, stop_manager

from extender.bench.controlplane import ControlPlane
from extender.kube import names

pytestmark = pytest.mark.e2e

#: The namespace prefix and the pool label value of this module's nodes.
POOL = "lwsjs"
NODES = hgx_leaves(POOL, 4)
LEAF_OF = {n.name: n.leaf for n in NODES}
GPUS_PER_NODE = 8
#: What the StatefulSets of a LeaderWorkerSet, the Jobs of a JobSet and their owner references need.
CONTROLLERS = ("statefulset-controller", "job-controller", "garbage-collector-controller")
#: The scheduler profile of the shipped extender config.
SCHEDULER = "gangslice-scheduler"

# LeaderWorkerSet (sigs.k8s.io/lws api/leaderworkerset/v1).
LWS_NAME = names.LWS_NAME
LWS_GROUP = names.LWS_GROUP_INDEX
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
# JobSet (sigs.k8s.io/jobset api/jobset/v1alpha2).
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
#: Set on the pod templates to roll a LeaderWorkerSet (any change of its template rolls it).
ROLL = "e2e.gangslice.io/rolled-at"

#: Seconds for the pods of the groups (or of a JobSet) to be created and bound.
BIND_S = 90.0
#: Seconds for a rolling update of two groups to complete (each group replaced in turn).
ROLLOUT_S = 180.0
#: Seconds for the reservations to follow the pods.
SETTLE_S = 30.0
#: Seconds for a namespace's pods to be gone after its LeaderWorkerSets and JobSets were deleted.
CLEANUP_S = 90.0


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    """This module's own control plane, with the StatefulSet, Job and garbage-collector controllers and
    the LeaderWorkerSet and JobSet managers, whose pod webhooks then see only this module's pods."""
    with running_control_plane(e2e_bin_dir, CONTROLLERS) as cp:
        hooks = {mgr: start_manager(cp, mgr) for mgr in (LWS, JOBSET)}
        try:
            yield cp
        finally:
            for mgr, created in hooks.items():
                stop_manager(cp, mgr, created)


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(control_plane, POOL, NODES, name="gangslice-lwsjs") as server:
        yield server


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(control_plane, LEAF_OF).start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


@pytest.fixture
def ns(control_plane: ControlPlane, gangslice: Gangslice, kubelet: KubeletStandIn) -> Iterator[str]:
    """A fresh namespace; afterwards its LeaderWorkerSets and JobSets are deleted first (their owner
    references take the StatefulSets, Jobs and pods with them; otherwise the controllers would recreate
    what :func:`clean_namespace` deletes), then the rest."""
    cp = control_plane
    name = new_namespace(cp, f"{POOL}-{uuid.uuid4().hex[:6]}")
    try:
        yield name
    finally:
        for kind in ("LeaderWorkerSet", "JobSet"):
            for obj in items(cp, kind, name):
                path = f"{_path(kind, name)}/{obj['metadata']['name']}"
                try:
                    cp.request("DELETE", path, {"propagationPolicy": "Background"})
                except urllib.error.HTTPError as e:
                    if e.code != 404:
                        raise
        gone = wait_for_or_false(lambda: not items(cp, "Pod", name), CLEANUP_S, 0.5)
        clean_namespace(cp, name)
        assert gone, f"the pods of {name} still there {CLEANUP_S}s after their owners were deleted"


def _path(kind: str, namespace: str) -> str:
    api = {"LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1", "JobSet": "/apis/jobset.x-k8s.io/v1alpha2"}
    return f"{api[kind]}/namespaces/{namespace}/{kind.lower()}s"


# ---------------------------------------------------------------------------------------------- objects
def pod_template(gang: str, gang_size: int, gpus: int, **extra: str) -> dict[str, Any]:
    """A pod template of gang ``gang`` (``gang_size`` pods) under one leaf, asking ``gpus`` GPUs."""
    gpu = {GPU: str(gpus)}
    return {
        "metadata": {
            "labels": {names.GANG: gang},
            "annotations": {names.GANG_SIZE: str(gang_size), names.REQUIRED_LEVEL: "leaf", **extra},
        },
        "spec": {
            "schedulerName": SCHEDULER,
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
    }


def leader_worker_set(ns: str, name: str, *, gang: str, replicas: int, size: int = 2) -> dict[str, Any]:
    """TP=8 x PP=``size``, as ``examples/k8s/plain/llama-405b-tp8-pp2.yaml``: a leader and ``size - 1``
    workers of 8 GPUs per group, the gang label and size in both templates; each group is a gang of its
    own (``<gang>-<group index>``)."""
    template = pod_template(gang, size, GPUS_PER_NODE, **{names.COMM: "pipeline"})
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template,
                "workerTemplate": json.loads(json.dumps(template)),
            },
        },
    }


def job_set(ns: str, name: str, *, gang: str, jobs: int, parallelism: int, gpus: int) -> dict[str, Any]:
    """A JobSet of one replicatedJob: ``jobs`` Jobs of ``parallelism`` pods, all of them one gang."""
    template = pod_template(gang, jobs * parallelism, gpus)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "workers",
                    "replicas": jobs,
                    "template": {
                        "spec": {
                            "parallelism": parallelism,
                            "completions": parallelism,
                            "backoffLimit": 0,
                            "template": template,
                        }
                    },
                }
            ]
        },
    }


# ---------------------------------------------------------------------------------------------- reading
def live(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods not being deleted, by name."""
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=pod_name)


def lws_pods(cp: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    return live(items(cp, "Pod", ns, f"{LWS_NAME}={name}"))


def by_group(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for p in pods:
        groups[str(p["metadata"]["labels"].get(LWS_GROUP, "<no group-index label>"))].append(p)
    return dict(groups)


def leaves(places: Iterable[tuple[str, tuple[int, ...]]]) -> set[str]:
    return {LEAF_OF.get(node, f"<{node} is no node of this module>") for node, _ in places}


def observed(cp: ControlPlane, ns: str, kubelet: KubeletStandIn | None = None) -> str:
    """What the namespace holds, for a failure message: each pod (phase, node, GPUs, its group or Job,
    its PodScheduled condition), each reservation's slots (and which pod holds each), the
    LeaderWorkerSets, StatefulSets, JobSets and Jobs."""
    lines = [f"namespace {ns}:"]
    for pod in sorted(items(cp, "Pod", ns), key=pod_name):
        meta, status = pod["metadata"], pod.get("status") or {}
        labels = meta.get("labels") or {}
        cond = scheduled_condition(pod) or {}
        why = f"{cond.get('reason') or ''} {cond.get('message') or ''}".strip()
        where = (
            f"group={labels.get(LWS_GROUP, '-')} rev={labels.get(LWS_REVISION, '-')}"
            if LWS_NAME in labels
            else f"job-index={labels.get(JOBSET_JOB_INDEX, '-')}"
        )
        lines.append(
            f"  pod {meta['name']}: {where} phase={status.get('phase')} ready={is_ready(pod)} "
            f"node={pod['spec'].get('nodeName') or '-'} gpus={gpus_of(pod)}"
            + (" deleting" if meta.get("deletionTimestamp") else "")
            + f" PodScheduled={cond.get('status')} {why}".rstrip()
        )
    for r in items(cp, "SliceReservation", ns):
        spec, status = r["spec"], r.get("status") or {}
        bound = spec.get("bound") or {}
        lines.append(
            f"  reservation {r['metadata']['name']} gang={spec['gang']} phase={spec.get('phase')}"
            f"/{status.get('phase')}, {len(slots(r))} slots:"
        )
        for s in slots(r):
            key = f"{s['podSet']}/{s['index']}"
            lines.append(f"    {key} on {s['node']} gpus={s['gpus']} pod={bound.get(key, '-')}")
    for lws in items(cp, "LeaderWorkerSet", ns):
        st = lws.get("status") or {}
        conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
        lines.append(
            f"  leaderworkerset {lws['metadata']['name']}: replicas={lws['spec'].get('replicas')} "
            f"generation={lws['metadata'].get('generation')} observed={st.get('observedGeneration')} "
            f"status.replicas={st.get('replicas')} updated={st.get('updatedReplicas')} "
            f"ready={st.get('readyReplicas')} conditions={conds}"
        )
    for sts in items(cp, "StatefulSet", ns):
        st = sts.get("status") or {}
        lines.append(
            f"  statefulset {sts['metadata']['name']}: replicas={sts['spec'].get('replicas')} "
            f"status.replicas={st.get('replicas')} ready={st.get('readyReplicas')} "
            f"updated={st.get('updatedReplicas')}"
        )
    for js in items(cp, "JobSet", ns):
        conds = {c["type"]: c["status"] for c in (js.get("status") or {}).get("conditions") or []}
        lines.append(f"  jobset {js['metadata']['name']}: conditions={conds}")
    for job in items(cp, "Job", ns):
        st = job.get("status") or {}
        lines.append(
            f"  job {job['metadata']['name']}: parallelism={job['spec'].get('parallelism')} "
            f"active={st.get('active')} ready={st.get('ready')} failed={st.get('failed')}"
        )
    if kubelet is not None and kubelet.errors:
        lines.append(f"  kubelet stand-in errors: {list(kubelet.errors)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- checks
def wait_lws_bound(
    cp: ControlPlane, ns: str, name: str, groups: int, size: int, kubelet: KubeletStandIn
) -> dict[str, list[dict[str, Any]]]:
    """Wait until the LeaderWorkerSet has ``groups`` groups of ``size`` pods, every pod bound; return
    the pods by group index."""
    got: dict[str, list[dict[str, Any]]] = {}

    def bound() -> bool:
        nonlocal got
        pods = lws_pods(cp, ns, name)
        got = by_group(pods)
        return (
            sorted(got) == [str(g) for g in range(groups)]
            and all(len(members) == size for members in got.values())
            and all(p["spec"].get("nodeName") for p in pods)
        )

    assert wait_for_or_false(bound, BIND_S), (
        f"{name}: not {groups} groups of {size} pods, all bound, within {BIND_S}s\n"
        f"{observed(cp, ns, kubelet)}"
    )
    return got


def assert_gang_placed(
    cp: ControlPlane, ns: str, gang: str, pods: list[dict[str, Any]], gpus: int, kubelet: KubeletStandIn
) -> None:
    """``pods`` are gang ``gang``: one reservation of as many slots, every pod bound on a slot (its node
    and exactly its GPUs), ``gpus`` GPUs each, all under one leaf."""
    found: list[dict[str, Any]] = []

    def settled() -> bool:
        nonlocal found
        found = reservations_of(cp, ns, gang)
        return len(found) == 1 and slot_places(found[0]) == placed(pods)

    ok = wait_for_or_false(settled, SETTLE_S)
    assert len(found) == 1, (
        f"gang {gang}: {len(found)} reservations, not one, after {SETTLE_S}s\n{observed(cp, ns, kubelet)}"
    )
    assert ok, (
        f"gang {gang}: pods (node, GPUs) {placed(pods)} are not the slots {slot_places(found[0])}\n"
        f"{observed(cp, ns, kubelet)}"
    )
    for pod in pods:
        assert len(gpus_of(pod)) == gpus, f"{pod_name(pod)} got GPUs {gpus_of(pod)}, not {gpus}"
    assert len(leaves(placed(pods))) == 1, (
        f"gang {gang} spread over leaves: {placed(pods)}\n{observed(cp, ns, kubelet)}"
    )


def assert_groups_placed(
    cp: ControlPlane,
    ns: str,
    name: str,
    gang: str,
    groups: dict[str, list[dict[str, Any]]],
    kubelet: KubeletStandIn,
) -> None:
    """Each group of the LeaderWorkerSet is gang ``<gang>-<group index>``, placed as one; nothing is
    double-booked."""
    for index, pods in sorted(groups.items()):
        assert_gang_placed(cp, ns, f"{gang}-{index}", pods, GPUS_PER_NODE, kubelet)
    assert_nothing_double_booked(cp, ns, kubelet)


def assert_nothing_double_booked(cp: ControlPlane, ns: str, kubelet: KubeletStandIn) -> None:
    twice = double_booked(cp, LEAF_OF)
    assert not twice, f"GPUs handed out twice: {twice}\n{observed(cp, ns, kubelet)}"


def revisions(pods: Iterable[dict[str, Any]]) -> set[str]:
    return {str(p["metadata"]["labels"].get(LWS_REVISION)) for p in pods}


def rollout_complete(cp: ControlPlane, ns: str, name: str, size: int, old: set[str]) -> bool:
    """The LeaderWorkerSet's status says every group is updated and ready for its newest generation, no
    update is in progress, and its pods are ``replicas`` groups of ``size``, all of one new revision."""
    lws = _get_lws(cp, ns, name)
    st, replicas = lws.get("status") or {}, lws["spec"]["replicas"]
    if st.get("observedGeneration", 0) < lws["metadata"]["generation"]:
        return False
    if not st.get("updatedReplicas") == st.get("readyReplicas") == st.get("replicas") == replicas:
        return False
    conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
    if conds.get("UpdateInProgress") == "True" or conds.get("Available") != "True":
        return False
    pods = items(cp, "Pod", ns, f"{LWS_NAME}={name}")  # including any still being deleted
    new = revisions(pods)
    return len(pods) == replicas * size and len(new) == 1 and not new & old


def _get_lws(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.request("GET", f"{_path('LeaderWorkerSet', ns)}/{name}")
    return found


# ---------------------------------------------------------------------------------------------- tests
def test_lws_groups_are_gangs_under_one_leaf(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    cp = control_plane
    create(cp, leader_worker_set(ns, "llama", gang="llama", replicas=2))
    groups = wait_lws_bound(cp, ns, "llama", 2, 2, kubelet)
    for index, pods in groups.items():
        workers = sorted(p["metadata"]["labels"].get(LWS_WORKER) for p in pods)
        assert workers == ["0", "1"], f"group {index}: worker indices {workers}\n{observed(cp, ns, kubelet)}"
    assert_groups_placed(cp, ns, "llama", "llama", groups, kubelet)


def test_lws_rolling_update_completes_group_by_group(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    cp = control_plane
    create(cp, leader_worker_set(ns, "roll", gang="roll", replicas=2))
    before = wait_lws_bound(cp, ns, "roll", 2, 2, kubelet)
    assert_groups_placed(cp, ns, "roll", "roll", before, kubelet)
    old = revisions(p for pods in before.values() for p in pods)
    assert len(old) == 1, f"pods of several revisions before the update: {old}\n{observed(cp, ns, kubelet)}"

    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    annotations = {"metadata": {"annotations": {ROLL: stamp}}}
    merge_patch(
        cp,
        "LeaderWorkerSet",
        "roll",
        {"spec": {"leaderWorkerTemplate": {"leaderTemplate": annotations, "workerTemplate": annotations}}},
        ns,
    )
    # Sampled until the update completes: the first double booking seen, and the most reservations of
    # one group's gang and slots of one reservation (LWS replaces a group in place, maxSurge 0: a group
    # never needs a second reservation or a slot more than its size).
    twice: dict[str, list[int]] = {}
    most = collections.Counter[str]()
    widest = 0

    def done() -> bool:
        nonlocal twice, widest
        twice = twice or double_booked(cp, LEAF_OF)
        found = items(cp, "SliceReservation", ns)
        for gang, n in collections.Counter(str(r["spec"]["gang"]) for r in found).items():
            most[gang] = max(most[gang], n)
        widest = max([widest, *(len(slots(r)) for r in found)])
        return rollout_complete(cp, ns, "roll", 2, old)

    assert wait_for_or_false(done, ROLLOUT_S, 0.2), (
        f"roll: rolling update not complete within {ROLLOUT_S}s\n{observed(cp, ns, kubelet)}"
    )
    assert not twice, f"GPUs handed out twice during the rolling update: {twice}\n{observed(cp, ns, kubelet)}"
    assert max(most.values(), default=0) <= 1 and widest <= 2, (
        f"during the update: reservations per gang {dict(most)}, up to {widest} slots in one\n"
        f"{observed(cp, ns, kubelet)}"
    )
    # One group at a time (LWS's maxUnavailable 1): its events name each group it updated.
    notes: set[str] = set()

    def each_group_updated() -> bool:
        nonlocal notes
        notes = {
            str(e.get("message")) for e in events_for(cp, ns, "roll") if e.get("reason") == "GroupsUpdating"
        }
        return {"Updating replica 0", "Updating replica 1"} <= notes

    assert wait_for_or_false(each_group_updated, SETTLE_S), (
        f"the LeaderWorkerSet's GroupsUpdating events: {sorted(notes)}\n{observed(cp, ns, kubelet)}"
    )
    after = wait_lws_bound(cp, ns, "roll", 2, 2, kubelet)
    kept = sorted(
        {p["metadata"]["uid"] for g in after.values() for p in g}
        & {p["metadata"]["uid"] for g in before.values() for p in g}
    )
    assert not kept, f"pods {kept} were never replaced\n{observed(cp, ns, kubelet)}"
    assert_groups_placed(cp, ns, "roll", "roll", after, kubelet)


def test_lws_scale_up_places_the_new_group_as_a_gang(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    cp = control_plane
    create(cp, leader_worker_set(ns, "grow", gang="grow", replicas=2))
    before = wait_lws_bound(cp, ns, "grow", 2, 2, kubelet)
    assert_groups_placed(cp, ns, "grow", "grow", before, kubelet)

    # As `kubectl scale` and autoscalers do: the scale subresource.
    cp.request(
        "PATCH",
        f"{_path('LeaderWorkerSet', ns)}/grow/scale",
        {"spec": {"replicas": 3}},
        content_type="application/merge-patch+json",
    )
    after = wait_lws_bound(cp, ns, "grow", 3, 2, kubelet)
    assert_groups_placed(cp, ns, "grow", "grow", after, kubelet)
    for index, pods in before.items():
        was = {pod_name(p): (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in pods}
        now = {pod_name(p): (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in after[index]}
        assert now == was, f"group {index} moved or was replaced: {was} -> {now}\n{observed(cp, ns, kubelet)}"


def test_jobset_is_one_gang_over_its_jobs(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    """JobSet copies the pod template into each Job unchanged but for its own labels, so the pods of
    both Jobs carry the same ``gangslice.io/gang``: one gang of jobs x parallelism = 4 pods (a JobSet runs
    or restarts as a whole), its size in ``gangslice.io/gang-size``."""
    cp = control_plane
    jobs, parallelism, gpus = 2, 2, 4
    create(cp, job_set(ns, "train", gang="train", jobs=jobs, parallelism=parallelism, gpus=gpus))
    pods: list[dict[str, Any]] = []

    def bound() -> bool:
        nonlocal pods
        pods = live(items(cp, "Pod", ns, f"{JOBSET_NAME}=train"))
        return len(pods) == jobs * parallelism and all(p["spec"].get("nodeName") for p in pods)

    assert wait_for_or_false(bound, BIND_S), (
        f"train: not {jobs * parallelism} pods bound within {BIND_S}s\n{observed(cp, ns, kubelet)}"
    )
    per_job = collections.Counter(str(p["metadata"]["labels"].get(JOBSET_JOB_INDEX)) for p in pods)
    assert per_job == {str(j): parallelism for j in range(jobs)}, (
        f"pods per Job {dict(per_job)}\n{observed(cp, ns, kubelet)}"
    )
    assert_gang_placed(cp, ns, "train", pods, gpus, kubelet)
    assert_nothing_double_booked(cp, ns, kubelet)
    wait_for(
        "both Jobs counting their pods ready",
        lambda: [(j.get("status") or {}).get("ready") for j in items(cp, "Job", ns)] == [parallelism] * jobs,
        SETTLE_S,
    )
