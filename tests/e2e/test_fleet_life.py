"""Gangs made of Deployments roll, scale and heal on the real control plane.

A control plane of its own: etcd, kube-apiserver, kube-scheduler with the shipped extender config
calling ``gangslice serve`` (shipped RBAC, plain HTTP, the extender alone), and kube-controller-manager
with only the deployment, replicaset and garbage-collector controllers. No kubelet runs:
:class:`KubeletStandIn` marks every pod bound to one of this module's nodes Running and Ready, and
finishes the pods that are deleted there, so rollouts progress as on a cluster.

The pods of a gang carry only the labels ``gangslice.io/gang`` and ``gangslice.io/pod-set`` (no
``gang-size`` or ``pod-set-size`` annotation): the size of each pod set comes from its owner, the
ReplicaSet the Deployment controller annotates with ``deployment.kubernetes.io/desired-replicas`` and
``deployment.kubernetes.io/max-replicas``. A surge pod of a rolling update, or a scale-up's new pod,
gets a slot near the gang's slice; slots above the desired count are released when their pod leaves,
and a slot within it is kept for the pod's replacement.

Tests: a prefill/decode pair of Deployments deploys as one gang under one leaf; a rolling update with
surge and one without complete, with the slice back to the desired size; scaling through the scale
subresource grows and shrinks the slice (freed GPUs go to another pod); a deleted pod's replacement
takes the same node and GPUs; a drained (cordoned) node's pod is replaced beside the gang; a
StatefulSet's gang rolls pod by pod and scales.

Nodes (pool ``fleet``): spine s1 with leaves a and b of four HGX H100 nodes (8 GPUs) each.
"""

from __future__ import annotations

import collections
import time
import urllib.error
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import (
    GPU,
    REPO,
    Gangslice,
    KubeletStandIn,
    clean_namespace,
    create,
    delete_owners,
    double_booked,
    extender_stack,
    get,
    gpu_pod,
    gpus_of,
    hgx_leaves,
    is_ready,
    items,
    make_node,
    merge_patch,
    new_namespace,
    placed,
    pod_name,
    remove_node,
    reservations_of,
    running_control_plane,
    scheduled_condition,
    slot_places,
    slots,
    wait_for,
    wait_for_or_false,
)
from cluster import POOL as POOL_LABEL

from extender.bench.controlplane import ControlPlane
from extender.kube import names

pytestmark = pytest.mark.e2e

#: The namespace prefix and the pool label value of this module's nodes.
POOL = "fleet"
NODES = hgx_leaves(POOL, 4)
LEAF_OF = {n.name: n.leaf for n in NODES}
GPUS_PER_NODE = 8
#: kube-controller-manager v1.36's names (``--controllers`` in its ``--help``).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "garbage-collector-controller",
)
#: The scheduler profile of the shipped extender config.
SCHEDULER = "gangslice-scheduler"
APPS = "/apis/apps/v1"
#: The label every pod of a Deployment carries (its selector).
APP = "app.kubernetes.io/name"
#: Set on a pod template to roll a Deployment (any change of the template rolls it).
ROLL = "e2e.gangslice.io/rolled-at"

#: Seconds for every pod of a gang (or a scale-up's new pods) to bind.
BIND_S = 60.0
#: Seconds for a rolling update to complete (every pod replaced, one or two at a time).
ROLLOUT_S = 60.0
#: Seconds for the reservation to follow the pods (slots released, a slot rebound).
SETTLE_S = 30.0
#: Seconds for a namespace's pods to be gone after its Deployments were deleted.
CLEANUP_S = 60.0


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    """This module's own control plane: the Deployment, ReplicaSet and garbage-collector controllers run
    here only, so the other modules' pods are never owned and recreated by anything."""
    with running_control_plane(e2e_bin_dir, CONTROLLERS) as cp:
        yield cp


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(control_plane, POOL, NODES, name="gangslice-fleet") as server:
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
    """A fresh namespace; afterwards its Deployments, ReplicaSets and StatefulSets are deleted first
    (else their controllers would recreate the pods that :func:`clean_namespace` deletes), then the rest."""
    cp = control_plane
    name = new_namespace(cp, f"{POOL}-{uuid.uuid4().hex[:6]}")
    try:
        yield name
    finally:
        delete_owners(cp, name, ("deployments", "replicasets", "statefulsets"))
        clean_namespace(cp, name)
        wait_for(f"the pods of namespace {name} gone", lambda: not items(cp, "Pod", name), CLEANUP_S, 0.5)


# ---------------------------------------------------------------------------------------------- objects
def deployment(
    ns: str,
    name: str,
    *,
    gang: str,
    pod_set: str,
    replicas: int,
    gpus: int,
    max_surge: int = 1,
    max_unavailable: int = 0,
) -> dict[str, Any]:
    """A Deployment whose pods form (part of) gang ``gang`` as pod set ``pod_set``: the two labels and
    the required level, no size annotation."""
    gpu = {GPU: str(gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {APP: name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
            },
            "template": {
                "metadata": {
                    "labels": {APP: name, names.GANG: gang, names.POD_SET: pod_set},
                    "annotations": {names.REQUIRED_LEVEL: "leaf"},
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
            },
        },
    }


def deploy(cp: ControlPlane, obj: dict[str, Any]) -> None:
    ns = obj["metadata"]["namespace"]
    try:
        cp.request("POST", f"{APPS}/namespaces/{ns}/deployments", obj)
    except urllib.error.HTTPError as e:
        raise AssertionError(
            f"creating Deployment {obj['metadata']['name']}: HTTP {e.code} {e.read()[:400]!r}"
        ) from e


def get_deployment(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.request("GET", f"{APPS}/namespaces/{ns}/deployments/{name}")
    return found


def patch_deployment(cp: ControlPlane, ns: str, name: str, patch: dict[str, Any], sub: str = "") -> None:
    path = f"{APPS}/namespaces/{ns}/deployments/{name}" + (f"/{sub}" if sub else "")
    cp.request("PATCH", path, patch, content_type="application/merge-patch+json")


def roll(cp: ControlPlane, ns: str, name: str) -> None:
    """Change the pod template (an annotation), as ``kubectl rollout restart`` does."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    patch_deployment(cp, ns, name, {"spec": {"template": {"metadata": {"annotations": {ROLL: stamp}}}}})


def scale(cp: ControlPlane, ns: str, name: str, replicas: int) -> None:
    """PATCH the Deployment's scale subresource, as ``kubectl scale`` and autoscalers do."""
    patch_deployment(cp, ns, name, {"spec": {"replicas": replicas}}, sub="scale")


# ---------------------------------------------------------------------------------------------- reading
def pods_of(cp: ControlPlane, ns: str, app: str) -> list[dict[str, Any]]:
    """The Deployment's pods that are not being deleted, by name."""
    pods = items(cp, "Pod", ns, f"{APP}={app}")
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=pod_name)


def all_bound(pods: list[dict[str, Any]], count: int) -> bool:
    return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)


def reservation_of(cp: ControlPlane, ns: str, gang: str) -> dict[str, Any] | None:
    found = reservations_of(cp, ns, gang)
    return found[0] if len(found) == 1 else None


def slot_key(slot: dict[str, Any]) -> str:
    return f"{slot['podSet']}/{slot['index']}"


def per_pod_set(reservation: dict[str, Any] | None) -> dict[str, int]:
    return dict(collections.Counter(str(s["podSet"]) for s in slots(reservation)))


def leaves(places: Iterable[tuple[str, tuple[int, ...]]]) -> set[str]:
    return {LEAF_OF.get(node, f"<{node} is no node of this module>") for node, _ in places}


def only_leaf(reservation: dict[str, Any], cp: ControlPlane, ns: str, kubelet: KubeletStandIn) -> str:
    """The one leaf of a reservation's slots (its pods require one)."""
    found = leaves(slot_places(reservation))
    assert len(found) == 1, f"the slice spans leaves {sorted(found)}\n{observed(cp, ns, kubelet)}"
    return found.pop()


def observed(cp: ControlPlane, ns: str, kubelet: KubeletStandIn | None = None) -> str:
    """What the namespace holds, for a failure message: each pod (phase, node, GPUs, its PodScheduled
    condition), each reservation's slots (and which pod holds each), each Deployment and ReplicaSet."""
    lines = [f"namespace {ns}:"]
    for pod in sorted(items(cp, "Pod", ns), key=pod_name):
        meta, status = pod["metadata"], pod.get("status") or {}
        cond = scheduled_condition(pod) or {}
        why = f"{cond.get('reason') or ''} {cond.get('message') or ''}".strip()
        lines.append(
            f"  pod {meta['name']}: phase={status.get('phase')} ready={is_ready(pod)} "
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
            lines.append(
                f"    {slot_key(s)} on {s['node']} gpus={s['gpus']} pod={bound.get(slot_key(s), '-')}"
            )
    for d in cp.request("GET", f"{APPS}/namespaces/{ns}/deployments")["items"]:
        st = d.get("status") or {}
        lines.append(
            f"  deployment {d['metadata']['name']}: replicas={d['spec']['replicas']} "
            f"generation={d['metadata'].get('generation')} observed={st.get('observedGeneration')} "
            f"status.replicas={st.get('replicas')} updated={st.get('updatedReplicas')} "
            f"ready={st.get('readyReplicas')} available={st.get('availableReplicas')}"
        )
    for rs in cp.request("GET", f"{APPS}/namespaces/{ns}/replicasets")["items"]:
        ann = rs["metadata"].get("annotations") or {}
        lines.append(
            f"  replicaset {rs['metadata']['name']}: replicas={rs['spec'].get('replicas')} "
            f"desired-replicas={ann.get('deployment.kubernetes.io/desired-replicas')} "
            f"max-replicas={ann.get('deployment.kubernetes.io/max-replicas')}"
        )
    if kubelet is not None and kubelet.errors:
        lines.append(f"  kubelet stand-in errors: {list(kubelet.errors)}")
    return "\n".join(lines)


def wait_bound(
    cp: ControlPlane, ns: str, app: str, count: int, kubelet: KubeletStandIn
) -> list[dict[str, Any]]:
    """Wait until the Deployment ``app`` has ``count`` pods, all bound; return them."""
    got: list[dict[str, Any]] = []

    def bound() -> bool:
        nonlocal got
        got = pods_of(cp, ns, app)
        return all_bound(got, count)

    assert wait_for_or_false(bound, BIND_S), (
        f"{app}: not {count} pods bound within {BIND_S}s\n{observed(cp, ns, kubelet)}"
    )
    return got


def wait_slots(cp: ControlPlane, ns: str, gang: str, count: int, kubelet: KubeletStandIn) -> dict[str, Any]:
    """Wait until gang ``gang`` has exactly one reservation, of ``count`` slots; return it."""
    found: dict[str, Any] | None = None

    def settled() -> bool:
        nonlocal found
        found = reservation_of(cp, ns, gang)
        return len(slots(found)) == count

    assert wait_for_or_false(settled, SETTLE_S), (
        f"gang {gang}: no single reservation of {count} slots within {SETTLE_S}s\n{observed(cp, ns, kubelet)}"
    )
    assert found is not None
    return found


def assert_pods_hold_the_slots(
    cp: ControlPlane,
    ns: str,
    pods: list[dict[str, Any]],
    reservation: dict[str, Any],
    kubelet: KubeletStandIn,
) -> None:
    """Every pod sits on a slot of the reservation (its node and exactly its GPUs), one pod per slot."""
    assert placed(pods) == slot_places(reservation), (
        f"pods (node, GPUs) {placed(pods)} are not the slots {slot_places(reservation)}\n"
        f"{observed(cp, ns, kubelet)}"
    )


def assert_nothing_double_booked(cp: ControlPlane, ns: str, kubelet: KubeletStandIn) -> None:
    twice = double_booked(cp, LEAF_OF)
    assert not twice, f"GPUs handed out twice: {twice}\n{observed(cp, ns, kubelet)}"


def rollout_complete(cp: ControlPlane, ns: str, app: str, old_hash: str) -> bool:
    """The Deployment's status says every replica is updated and available for the newest generation,
    and its pods are ``replicas`` pods of one pod-template-hash, not ``old_hash``."""
    d = get_deployment(cp, ns, app)
    st, replicas = d.get("status") or {}, d["spec"]["replicas"]
    if st.get("observedGeneration", 0) < d["metadata"]["generation"]:
        return False
    if not st.get("updatedReplicas") == st.get("availableReplicas") == st.get("replicas") == replicas:
        return False
    pods = items(cp, "Pod", ns, f"{APP}={app}")  # including any still being deleted
    hashes = {p["metadata"]["labels"].get("pod-template-hash") for p in pods}
    return len(pods) == replicas and len(hashes) == 1 and old_hash not in hashes


def template_hash(pods: list[dict[str, Any]]) -> str:
    (only,) = {str(p["metadata"]["labels"]["pod-template-hash"]) for p in pods}
    return only


def rolls_to_completion(
    cp: ControlPlane, ns: str, gang: str, app: str, replicas: int, max_slots: int, kubelet: KubeletStandIn
) -> None:
    """Roll the Deployment ``app`` (a gang of its own, ``replicas`` pods running) and follow it to the end:
    the reservation never holds more than ``max_slots`` slots meanwhile; at the end every pod is new and
    bound on a slot, the slots are ``replicas`` again under the gang's first leaf, nothing double-booked."""
    before = wait_bound(cp, ns, app, replicas, kubelet)
    first = wait_slots(cp, ns, gang, replicas, kubelet)
    leaf = only_leaf(first, cp, ns, kubelet)
    old = template_hash(before)
    roll(cp, ns, app)

    most = 0

    def done() -> bool:
        nonlocal most
        most = max(most, len(slots(reservation_of(cp, ns, gang))))
        return rollout_complete(cp, ns, app, old)

    assert wait_for_or_false(done, ROLLOUT_S, 0.5), (
        f"{app}: rollout not complete within {ROLLOUT_S}s\n{observed(cp, ns, kubelet)}"
    )
    assert most <= max_slots, (
        f"the reservation held {most} slots during the rollout, more than {max_slots}\n"
        f"{observed(cp, ns, kubelet)}"
    )
    after = wait_bound(cp, ns, app, replicas, kubelet)
    kept = sorted({pod_name(p) for p in after} & {pod_name(p) for p in before})
    assert not kept, f"pods {kept} were never replaced\n{observed(cp, ns, kubelet)}"
    final = wait_slots(cp, ns, gang, replicas, kubelet)
    assert per_pod_set(final) == {"decode": replicas}, observed(cp, ns, kubelet)
    assert_pods_hold_the_slots(cp, ns, after, final, kubelet)
    assert leaves(placed(after)) == {leaf}, (
        f"pods left leaf {leaf}: {placed(after)}\n{observed(cp, ns, kubelet)}"
    )
    assert_nothing_double_booked(cp, ns, kubelet)


# ---------------------------------------------------------------------------------------------- tests
def test_pd_deployments_without_sizes_deploy_as_one_gang(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    cp = control_plane
    sizes = {"prefill": (2, 2), "decode": (2, 4)}  # pod set -> (replicas, GPUs per pod)
    for role, (replicas, gpus) in sizes.items():
        deploy(cp, deployment(ns, f"llm-{role}", gang="llm", pod_set=role, replicas=replicas, gpus=gpus))
    pods = [p for role, (n, _) in sizes.items() for p in wait_bound(cp, ns, f"llm-{role}", n, kubelet)]

    found = reservations_of(cp, ns, "llm")
    assert len(found) == 1, f"{len(found)} reservations for gang llm, not one\n{observed(cp, ns, kubelet)}"
    (reservation,) = found
    assert per_pod_set(reservation) == {role: n for role, (n, _) in sizes.items()}, observed(cp, ns, kubelet)
    assert_pods_hold_the_slots(cp, ns, pods, reservation, kubelet)
    assert len(leaves(placed(pods))) == 1, (
        f"gang spread over leaves: {placed(pods)}\n{observed(cp, ns, kubelet)}"
    )
    for pod in pods:
        role = pod["metadata"]["labels"][names.POD_SET]
        assert len(gpus_of(pod)) == sizes[role][1], (
            f"{pod_name(pod)} got GPUs {gpus_of(pod)}, not {sizes[role][1]}"
        )
    assert_nothing_double_booked(cp, ns, kubelet)


def test_rolling_update_with_surge_completes(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    replicas = 2
    deploy(
        control_plane,
        deployment(
            ns,
            "surge",
            gang="surge",
            pod_set="decode",
            replicas=replicas,
            gpus=4,
            max_surge=1,
            max_unavailable=0,
        ),
    )
    # The surge pod gets a slot of its own: the reservation reaches replicas + maxSurge, never more.
    rolls_to_completion(control_plane, ns, "surge", "surge", replicas, replicas + 1, kubelet)


def test_rolling_update_without_surge_completes(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    replicas = 2
    deploy(
        control_plane,
        deployment(
            ns,
            "nosurge",
            gang="nosurge",
            pod_set="decode",
            replicas=replicas,
            gpus=4,
            max_surge=0,
            max_unavailable=1,
        ),
    )
    # Each new pod takes the slot its predecessor left: the reservation never grows.
    rolls_to_completion(control_plane, ns, "nosurge", "nosurge", replicas, replicas, kubelet)


def test_scale_up_and_down_through_the_scale_subresource(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    cp = control_plane
    start, up, down, gpus = 2, 4, 1, 4
    deploy(cp, deployment(ns, "scaled", gang="scaled", pod_set="decode", replicas=start, gpus=gpus))
    wait_bound(cp, ns, "scaled", start, kubelet)
    leaf = only_leaf(wait_slots(cp, ns, "scaled", start, kubelet), cp, ns, kubelet)

    scale(cp, ns, "scaled", up)
    pods = wait_bound(cp, ns, "scaled", up, kubelet)
    grown = wait_slots(cp, ns, "scaled", up, kubelet)
    assert per_pod_set(grown) == {"decode": up}, observed(cp, ns, kubelet)
    assert_pods_hold_the_slots(cp, ns, pods, grown, kubelet)
    assert leaves(placed(pods)) == {leaf}, (
        f"new pods left leaf {leaf}: {placed(pods)}\n{observed(cp, ns, kubelet)}"
    )
    assert_nothing_double_booked(cp, ns, kubelet)

    scale(cp, ns, "scaled", down)
    pods = wait_bound(cp, ns, "scaled", down, kubelet)
    shrunk = wait_slots(cp, ns, "scaled", down, kubelet)
    assert_pods_hold_the_slots(cp, ns, pods, shrunk, kubelet)

    # The freed GPUs go to someone else: on a node that lost a slot, a pod asking for every GPU not held
    # now (by the remaining slot or any bound pod) binds only if the released slots' GPUs are free.
    lost = collections.Counter(n for n, _ in slot_places(grown))
    lost.subtract(n for n, _ in slot_places(shrunk))
    node, _ = lost.most_common(1)[0]
    held = {g for n, gs in slot_places(shrunk) if n == node for g in gs}
    held |= {g for p in items(cp, "Pod") if p["spec"].get("nodeName") == node for g in gpus_of(p)}
    want = GPUS_PER_NODE - len(held)
    assert want >= gpus, f"{node} keeps {sorted(held)} of its GPUs held\n{observed(cp, ns, kubelet)}"
    pod = gpu_pod("reuse", want, POOL, scheduler=SCHEDULER)
    pod["metadata"]["namespace"] = ns
    pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
    create(cp, pod)
    ok = wait_for_or_false(lambda: bool((get(cp, "Pod", "reuse", ns) or {})["spec"].get("nodeName")), BIND_S)
    assert ok, (
        f"a pod for the {want} free GPUs of {node} did not bind within {BIND_S}s\n{observed(cp, ns, kubelet)}"
    )
    reuse = get(cp, "Pod", "reuse", ns) or {}
    assert not set(gpus_of(reuse)) & held, (
        f"reuse got GPUs {gpus_of(reuse)} of {node}, held there: {sorted(held)}\n{observed(cp, ns, kubelet)}"
    )
    assert_nothing_double_booked(cp, ns, kubelet)


def test_deleted_pod_replacement_takes_its_slot(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    cp = control_plane
    replicas = 2
    deploy(cp, deployment(ns, "heal", gang="heal", pod_set="decode", replicas=replicas, gpus=4))
    before = wait_bound(cp, ns, "heal", replicas, kubelet)
    wait_slots(cp, ns, "heal", replicas, kubelet)
    victim = before[0]
    name, node, gpus = pod_name(victim), victim["spec"]["nodeName"], sorted(gpus_of(victim))
    keys: list[str] = []

    def holds_a_slot() -> bool:
        nonlocal keys
        bound = (reservation_of(cp, ns, "heal") or {"spec": {}})["spec"].get("bound") or {}
        keys = [key for key, pod in bound.items() if pod == name]
        return len(keys) == 1

    assert wait_for_or_false(holds_a_slot, SETTLE_S), (
        f"{name} holds slots {keys}, not one, after {SETTLE_S}s\n{observed(cp, ns, kubelet)}"
    )
    (key,) = keys

    # As `kubectl delete pod` does: no grace period given (the pod's own, 0, applies).
    cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    after = wait_bound(cp, ns, "heal", replicas, kubelet)
    new = [p for p in after if pod_name(p) not in {pod_name(b) for b in before}]
    assert len(new) == 1, f"{len(new)} new pods, not one replacement of {name}\n{observed(cp, ns, kubelet)}"
    (replacement,) = new
    got = (replacement["spec"]["nodeName"], sorted(gpus_of(replacement)))
    assert got == (node, gpus), (
        f"{pod_name(replacement)} got {got}, not the slot {key} of {name} ({node}, {gpus})\n"
        f"{observed(cp, ns, kubelet)}"
    )

    def rebound() -> bool:
        r = reservation_of(cp, ns, "heal")
        return len(slots(r)) == replicas and (r or {})["spec"].get("bound", {}).get(key) == pod_name(
            replacement
        )

    assert wait_for_or_false(rebound, SETTLE_S), (
        f"slot {key} not held by {pod_name(replacement)} within {SETTLE_S}s\n{observed(cp, ns, kubelet)}"
    )
    assert_nothing_double_booked(cp, ns, kubelet)


def test_a_pod_lost_with_its_cordoned_node_is_replaced_beside_its_gang(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    """`kubectl drain`: the node is cordoned and its pod evicted. The replacement cannot take the
    slot the pod left (kube-scheduler offers no cordoned node), so the slot is freed and one is
    placed beside the gang, under its leaf; the cordoned node holds nothing of the gang."""
    cp = control_plane
    replicas = 2
    # Whole nodes: the replacement cannot share the lost pod's node with anything.
    deploy(cp, deployment(ns, "drain", gang="drain", pod_set="decode", replicas=replicas, gpus=GPUS_PER_NODE))
    before = wait_bound(cp, ns, "drain", replicas, kubelet)
    leaf = only_leaf(wait_slots(cp, ns, "drain", replicas, kubelet), cp, ns, kubelet)
    victim = before[0]
    lost = victim["spec"]["nodeName"]
    merge_patch(cp, "Node", lost, {"spec": {"unschedulable": True}})
    try:
        cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod_name(victim)}")
        after = wait_bound(cp, ns, "drain", replicas, kubelet)
        new = [p for p in after if pod_name(p) not in {pod_name(b) for b in before}]
        assert len(new) == 1, f"{len(new)} new pods, not one replacement\n{observed(cp, ns, kubelet)}"
        node = new[0]["spec"]["nodeName"]
        assert node != lost and LEAF_OF[node] == leaf, (
            f"the replacement went to {node} (leaf {LEAF_OF.get(node)}), not beside the gang under {leaf}\n"
            f"{observed(cp, ns, kubelet)}"
        )

        def moved() -> bool:
            r = reservation_of(cp, ns, "drain")
            return len(slots(r)) == replicas and lost not in {node for node, _ in slot_places(r)}

        assert wait_for_or_false(moved, SETTLE_S), (
            f"the reservation still holds {lost} or is not {replicas} slots\n{observed(cp, ns, kubelet)}"
        )
        assert_nothing_double_booked(cp, ns, kubelet)
    finally:
        merge_patch(cp, "Node", lost, {"spec": {"unschedulable": False}})


@pytest.mark.parametrize("loss", ["deleted", "NotReady"])
def test_a_pod_lost_with_its_node_is_replaced_beside_its_gang(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn, loss: str
) -> None:
    """A node is lost (its Node object deleted, or its kubelet stops reporting Ready) and its pod
    with it (the pod garbage collector or the node lifecycle controller deletes it; the test does
    it at once). The replacement is placed beside the gang under its leaf, and the reservation
    holds nothing on the lost node."""
    cp = control_plane
    replicas = 2
    deploy(cp, deployment(ns, "lost", gang="lost", pod_set="decode", replicas=replicas, gpus=GPUS_PER_NODE))
    before = wait_bound(cp, ns, "lost", replicas, kubelet)
    leaf = only_leaf(wait_slots(cp, ns, "lost", replicas, kubelet), cp, ns, kubelet)
    victim = before[0]
    lost = str(victim["spec"]["nodeName"])
    node = next(n for n in NODES if n.name == lost)
    if loss == "deleted":
        remove_node(cp, lost)
    else:
        ready = {"type": "Ready", "status": "False", "reason": "NodeStatusUnknown", "message": "e2e: lost"}
        merge_patch(cp, "Node", lost, {"status": {"conditions": [ready]}}, sub="status")
    try:
        cp.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod_name(victim)}", {"gracePeriodSeconds": 0})
        after = wait_bound(cp, ns, "lost", replicas, kubelet)
        new = [p for p in after if pod_name(p) not in {pod_name(b) for b in before}]
        assert len(new) == 1, f"{len(new)} new pods, not one replacement\n{observed(cp, ns, kubelet)}"
        placed_on = new[0]["spec"]["nodeName"]
        assert placed_on != lost and LEAF_OF[placed_on] == leaf, (
            f"the replacement went to {placed_on}, not beside the gang under {leaf}\n"
            f"{observed(cp, ns, kubelet)}"
        )

        def moved() -> bool:
            r = reservation_of(cp, ns, "lost")
            return len(slots(r)) == replicas and lost not in {n for n, _ in slot_places(r)}

        assert wait_for_or_false(moved, SETTLE_S), (
            f"the reservation still holds {lost} or is not {replicas} slots\n{observed(cp, ns, kubelet)}"
        )
        assert_nothing_double_booked(cp, ns, kubelet)
    finally:
        if loss == "deleted":
            make_node(cp, node, POOL)
        else:
            ready = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "fake node for e2e",
            }
            merge_patch(cp, "Node", lost, {"status": {"conditions": [ready]}}, sub="status")


def test_a_statefulset_gang_rolls_and_scales(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    """A StatefulSet's replicas size its pod set too. Its rolling update deletes each pod before it
    creates its successor of the same name, which takes the slot the old one left; a scale-up
    grows the slice beside the gang."""
    cp = control_plane
    replicas = 2
    sts = deployment(ns, "sts", gang="sts", pod_set="decode", replicas=replicas, gpus=4)
    sts["kind"] = "StatefulSet"
    spec = sts["spec"]
    del spec["strategy"]
    spec.update({"serviceName": "sts", "podManagementPolicy": "Parallel"})
    path = f"{APPS}/namespaces/{ns}/statefulsets"
    cp.request("POST", path, sts)
    before = wait_bound(cp, ns, "sts", replicas, kubelet)
    leaf = only_leaf(wait_slots(cp, ns, "sts", replicas, kubelet), cp, ns, kubelet)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    roll_patch = {"spec": {"template": {"metadata": {"annotations": {ROLL: stamp}}}}}
    cp.request("PATCH", f"{path}/sts", roll_patch, content_type="application/merge-patch+json")
    old = {p["metadata"]["labels"].get("controller-revision-hash") for p in before}

    def rolled() -> bool:
        st = cp.request("GET", f"{path}/sts").get("status") or {}
        pods = items(cp, "Pod", ns, f"{APP}=sts")
        revisions = {p["metadata"]["labels"].get("controller-revision-hash") for p in pods}
        return (
            st.get("updatedReplicas") == st.get("readyReplicas") == replicas
            and len(pods) == replicas
            and not revisions & old
            and all(p["spec"].get("nodeName") for p in pods)
        )

    assert wait_for_or_false(rolled, ROLLOUT_S, 0.5), (
        f"sts: rolling update not complete within {ROLLOUT_S}s\n{observed(cp, ns, kubelet)}"
    )
    after = wait_bound(cp, ns, "sts", replicas, kubelet)
    final = wait_slots(cp, ns, "sts", replicas, kubelet)
    assert_pods_hold_the_slots(cp, ns, after, final, kubelet)
    assert leaves(placed(after)) == {leaf}, (
        f"pods left leaf {leaf}: {placed(after)}\n{observed(cp, ns, kubelet)}"
    )
    cp.request(
        "PATCH", f"{path}/sts/scale", {"spec": {"replicas": 3}}, content_type="application/merge-patch+json"
    )
    grown = wait_bound(cp, ns, "sts", 3, kubelet)
    assert_pods_hold_the_slots(cp, ns, grown, wait_slots(cp, ns, "sts", 3, kubelet), kubelet)
    assert leaves(placed(grown)) == {leaf}, f"the new pod left leaf {leaf}\n{observed(cp, ns, kubelet)}"
    assert_nothing_double_booked(cp, ns, kubelet)


LLM_D_EXAMPLE = REPO / "examples" / "k8s" / "llm-d" / "llama-70b-pd.yaml"
RDMA = "rdma/rdma_shared_device_a"


def test_the_llm_d_example_deploys_rolls_and_scales_unchanged(
    control_plane: ControlPlane, ns: str, kubelet: KubeletStandIn
) -> None:
    """docs/llm-d.md's recipe on examples/k8s/llm-d/llama-70b-pd.yaml, only its namespace changed:
    the prefill (2) and decode (1) Deployments deploy as one gang under one leaf; the decode pool
    rolls to a new template; ``kubectl scale`` takes prefill to 3 and back to 2. The slice follows
    with no size written anywhere, and no GPU is promised twice."""
    cp = control_plane
    gang = "llama-70b-llmd"
    # The example's pods ask for the RDMA shared device (as llm-d's do, for NIXL): the nodes offer
    # it, as a cluster with NVIDIA's RDMA shared device plugin does.
    for node in NODES:
        rdma = {RDMA: "1k"}
        patch = {"status": {"capacity": rdma, "allocatable": rdma}}
        merge_patch(cp, "Node", node.name, patch, sub="status")
    objects = [d for d in yaml.safe_load_all(LLM_D_EXAMPLE.read_text()) if d]
    for d in objects:
        d["metadata"]["namespace"] = ns
        deploy(cp, d)
    name = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d["metadata"]["name"] for d in objects}

    def pool(role: str) -> list[dict[str, Any]]:
        pods = items(cp, "Pod", ns, f"app.kubernetes.io/component={role}")
        return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=pod_name)

    def settle(prefill: int, decode: int) -> dict[str, Any]:
        def bound() -> bool:
            return all(all_bound(pool(role), n) for role, n in (("prefill", prefill), ("decode", decode)))

        assert wait_for_or_false(bound, BIND_S), (
            f"pools not {prefill}+{decode} bound\n{observed(cp, ns, kubelet)}"
        )
        r = wait_slots(cp, ns, gang, prefill + decode, kubelet)
        assert per_pod_set(r) == {"prefill": prefill, "decode": decode}, observed(cp, ns, kubelet)
        assert_pods_hold_the_slots(cp, ns, pool("prefill") + pool("decode"), r, kubelet)
        only_leaf(r, cp, ns, kubelet)
        assert_nothing_double_booked(cp, ns, kubelet)
        return r

    settle(2, 1)
    old = {pod_name(p) for p in pool("decode")}
    roll(cp, ns, name["decode"])

    def rolled() -> bool:
        d = get_deployment(cp, ns, name["decode"])
        st = d.get("status") or {}
        done = st.get("observedGeneration", 0) >= d["metadata"]["generation"] and (
            st.get("updatedReplicas") == st.get("availableReplicas") == st.get("replicas") == 1
        )
        return done and all_bound(pool("decode"), 1) and not {pod_name(p) for p in pool("decode")} & old

    assert wait_for_or_false(rolled, ROLLOUT_S, 0.5), f"decode did not roll\n{observed(cp, ns, kubelet)}"
    settle(2, 1)
    scale(cp, ns, name["prefill"], 3)
    settle(3, 1)
    scale(cp, ns, name["prefill"], 2)
    settle(2, 1)
