"""The DRA webhook as the default install runs it, on the real control plane: kube-apiserver
presents no client certificate to webhooks (a managed control plane cannot be told to), so
anyone who reaches gangslice's port can post an AdmissionReview.

The webhook writes nothing to the API, and reserves a plain gang only for a pod whose
controller exists (read back by name and UID): forged reviews for bare pods and for a made-up
ReplicaSet reserve nothing and create no claim; a bare gang pod created for real is refused
saying why; the gangs of the workload controllers run as they are, each pod read back against
its owner's template: a Deployment's gang on DRA nodes is pinned, its claims made once its
pods exist, and it rolls with a surge pod on a slot of its own; a JobSet's two Jobs pin each
pod to a slot of its own; the wide-EP LeaderWorkerSet example on device-plugin GB200 trays gets
one ComputeDomain and a channel per tray.

A control plane of its own (kube-controller-manager with the Deployment, ReplicaSet,
StatefulSet and Job controllers, the resourceclaim controller and the garbage collector), the
DRA node of tests/e2e/test_dra.py, and ``gangslice serve`` without ``--admission-client-names``.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import POOL as POOL_LABEL
from cluster import (
    Gangslice,
    KubeletStandIn,
    dra_webhook,
    extender_stack,
    is_ready,
    items,
    merge_patch,
    pod_name,
    remove_node,
    reservations_of,
    running_control_plane,
    slots,
    wait_for,
    wait_for_or_false,
)
from managers import JOBSET, LWS, start_manager, stop_manager
from test_dra import (
    REPO,
    RESOURCE,
    UPSTREAM,
    _device_plugin_tray,
    _dra_node,
    allocated,
    assert_claims_pin_their_slots,
    channel_allocated,
    compute_domains,
    dra_pod,
    post,
    template,
)

from extender.bench.controlplane import ControlPlane
from extender.kube import dra
from extender.kube.names import LWS_GROUP_INDEX
from extender.testing.dra import device_classes

pytestmark = pytest.mark.e2e

#: The namespace prefix (the ``ns`` fixture reads it); the node is test_dra's, in its pool.
POOL = "dra-default"
POOL_NAME = "dra"


@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    controllers = (
        *ControlPlane.CONTROLLERS,
        "deployment-controller",
        "replicaset-controller",
        "statefulset-controller",
        "job-controller",
    )
    with running_control_plane(e2e_bin_dir, controllers) as cp:
        yield cp


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    for cls in device_classes(UPSTREAM):
        post(cp, f"{RESOURCE}/deviceclasses", cls)
    args = [f"--webhook-ca-bundle={cp.ca_file}"]
    with extender_stack(cp, POOL_NAME, [], name="gangslice-dra-default", tls=True, extra_args=args) as server:
        _dra_node(cp)
        dra_webhook(cp, server)
        yield server


def forged_review(server: Gangslice, pod: dict[str, Any], uid: str) -> dict[str, Any]:
    """POST an AdmissionReview for ``pod`` to the webhook as anyone on the network can: over TLS,
    trusting the serving certificate, presenting none."""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": pod["metadata"]["namespace"],
            "name": pod["metadata"]["name"],
            "object": pod,
        },
    }
    assert server.cp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(server.cp.ca_file))
    req = urllib.request.Request(
        server.url + "/admission/pods",
        data=json.dumps(review).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
        response: dict[str, Any] = json.loads(resp.read())["response"]
    return response


def test_forged_reviews_reserve_and_create_nothing_and_a_bare_gang_pod_is_told_why(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "gpus", 4))
    claim = {"resourceClaimTemplateName": "gpus"}
    forged = [
        dra_pod(
            ns,
            f"bare-{i}",
            claim=claim,
            labels={"gangslice.io/gang": f"g{i}"},
            **{"gangslice.io/gang-size": "1"},
        )
        for i in range(4)
    ]
    ghost = dra_pod(
        ns, "ghost-0", claim=claim, labels={"gangslice.io/gang": "ghost"}, **{"gangslice.io/gang-size": "1"}
    )
    ghost["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "ghost",
            "uid": "0000-made-up",
            "controller": True,
        }
    ]
    answers = [forged_review(gangslice, pod, f"forged-{i}") for i, pod in enumerate([*forged, ghost])]
    assert not any(a["allowed"] for a in answers), answers
    assert "has no controller" in answers[0]["status"]["message"], answers[0]
    assert f"ReplicaSet {ns}/ghost does not exist" in answers[-1]["status"]["message"], answers[-1]
    # Nothing was reserved, and nothing written: no SliceReservation, no claim, in any namespace.
    assert items(cp, "SliceReservation", ns) == [] and items(cp, "ResourceClaim", ns) == []
    # The fleet's 8 GPUs are all still free: a gang of two TP=4 pods of a real owner fits after
    # the forged reviews (test below); here, a bare pod created for real is refused saying why.
    try:
        cp.request("POST", f"/api/v1/namespaces/{ns}/pods", forged[0])
        raise AssertionError("a bare DRA gang pod was admitted without kube-apiserver's certificate")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        assert e.code == 403 and "gangslice: gang" in text and "has no controller" in text, text


def test_a_deployment_gang_on_dra_nodes_rolls_with_a_surge_pod_pinned_to_a_slot_of_its_own(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """Two TP=2 replicas of a Deployment, sized by their ReplicaSet (no size annotation), on the
    default install: the webhook reads their ReplicaSet back and reserves the gang; the claims
    are made once the pods exist. A rolling update's surge pod finds every slot handed out at
    its creation: the gang grows one slot (and its claim) beside the slice, so the rollout
    completes instead of the webhook refusing the new pod forever; every claim allocates
    exactly its slot's devices, and the surplus slot and its claim go when the old pod does."""
    cp = control_plane
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "tp2-gpus", 2))
    labels = {"app": "tp2", "gangslice.io/gang": "tp2", "gangslice.io/pod-set": "server"}
    pod = dra_pod(ns, "template", claim={"resourceClaimTemplateName": "tp2-gpus"}, labels=labels)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "tp2", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "tp2"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": labels, "annotations": {}}, "spec": pod["spec"]},
        },
    }
    path = f"/apis/apps/v1/namespaces/{ns}/deployments"
    nodes = [n["metadata"]["name"] for n in items(cp, "Node", None, f"{POOL_LABEL}={POOL_NAME}")]
    kubelet = KubeletStandIn(cp, nodes).start()
    try:
        post(cp, path, deployment)

        def pods() -> list[dict[str, Any]]:
            return [p for p in items(cp, "Pod", ns, "app=tp2") if not p["metadata"].get("deletionTimestamp")]

        def running(want: int) -> list[dict[str, Any]] | None:
            got = pods()
            ok = len(got) == want and all(p["spec"].get("nodeName") and is_ready(p) for p in got)
            return got if ok else None

        before = wait_for("2 tp2 pods running", lambda: running(2), 90)
        for p in before:
            (entry,) = p["spec"]["resourceClaims"]
            claim = allocated(cp, ns, entry["resourceClaimName"])
            assert claim is not None and claim["metadata"]["ownerReferences"][0]["kind"] == "SliceReservation"
        cp.request(
            "PATCH",
            f"{path}/tp2",
            {"spec": {"template": {"metadata": {"annotations": {"e2e.gangslice.io/rolled": "1"}}}}},
            content_type="application/merge-patch+json",
        )

        def rolled() -> list[dict[str, Any]] | None:
            d = cp.request("GET", f"{path}/tp2")
            st = d.get("status") or {}
            got = running(2)
            done = st.get("observedGeneration", 0) >= d["metadata"]["generation"] and (
                st.get("updatedReplicas") == st.get("availableReplicas") == st.get("replicas") == 2
            )
            if not done or got is None or {pod_name(p) for p in got} & {pod_name(p) for p in before}:
                return None
            return got

        after = wait_for("the tp2 rollout complete", rolled, 180)
        # Each surge pod got a slot (and claim) of its own, never one an old pod still held; the
        # claims of the slots the old pods left are deleted once the slots go.
        claim_names = {pod_name(p): p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in after}
        old_claims = {p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in before}
        assert not set(claim_names.values()) & old_claims, (claim_names, old_claims)

        def only_current_claims() -> bool:
            return {c["metadata"]["name"] for c in items(cp, "ResourceClaim", ns)} == set(
                claim_names.values()
            )

        assert wait_for_or_false(only_current_claims, 30), [
            c["metadata"]["name"] for c in items(cp, "ResourceClaim", ns)
        ]
        assert_claims_pin_their_slots(cp, ns, after)

        def two_slots() -> bool:
            (r,) = reservations_of(cp, ns, "tp2")
            return len(slots(r)) == 2

        assert wait_for_or_false(two_slots, 30), reservations_of(cp, ns, "tp2")
        assert not kubelet.errors, list(kubelet.errors)
    finally:
        kubelet.stop()
        with contextlib.suppress(urllib.error.HTTPError):
            cp.request("DELETE", f"{path}/tp2", {"propagationPolicy": "Background"})
        wait_for("the tp2 pods gone", lambda: not items(cp, "Pod", ns, "app=tp2"), 60)


@pytest.fixture
def lws(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[None]:
    """The LeaderWorkerSet controller (``sigs.k8s.io/lws``), its webhooks on loopback."""
    hooks = start_manager(control_plane, LWS)
    try:
        yield
    finally:
        stop_manager(control_plane, LWS, hooks)


def test_the_wide_ep_lws_example_on_device_plugin_gb200_trays_gets_one_compute_domain_and_a_channel_per_tray(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str, lws: None
) -> None:
    """``examples/k8s/plain/deepseek-wideep.yaml`` unchanged but for its namespace, run by the real
    LeaderWorkerSet controller: its group of 4 pods (a leader and 3 workers, 4 device-plugin GPUs
    each) is one gang in one clique, and every pod is given at its creation its slot and its tray's
    channel claim of the group's one ComputeDomain. The leader gets its group index from LWS's
    own pod webhook, which runs after gangslice's: gangslice pins it when called again."""
    cp = control_plane
    cp.install_crds(UPSTREAM / "resource.nvidia.com_computedomains.yaml")
    others = [n["metadata"]["name"] for n in items(cp, "Node")]
    for other in others:
        merge_patch(cp, "Node", other, {"spec": {"unschedulable": True}})
    (gpu_class,) = [c for c in device_classes(UPSTREAM) if c["metadata"]["name"] == dra.GPU_DEVICE_CLASS]
    cp.request("DELETE", f"{RESOURCE}/deviceclasses/{dra.GPU_DEVICE_CLASS}")
    trays = [f"dra-lws{i}" for i in range(5)]
    lws_path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets"
    try:
        for tray in trays:
            _device_plugin_tray(cp, tray, {"nvidia.com/gpu.product": "NVIDIA-GB200"})
        example = yaml.safe_load((REPO / "examples" / "k8s" / "plain" / "deepseek-wideep.yaml").read_text())
        example["metadata"]["namespace"] = ns
        post(cp, lws_path, example)

        def group() -> list[dict[str, Any]] | None:
            pods = [p for p in items(cp, "Pod", ns) if not p["metadata"].get("deletionTimestamp")]
            return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

        pods = wait_for("the 4 pods of the LeaderWorkerSet's group bound", group, 120)
        (domain,) = compute_domains(cp, ns, 1)
        nodes = set()
        for pod in pods:
            meta = pod["metadata"]
            assert meta["labels"][LWS_GROUP_INDEX] == "0" and meta["annotations"].get("gangslice.io/slot"), (
                meta
            )
            channel = channel_allocated(cp, ns, pod)
            params = channel["spec"]["devices"]["config"][0]["opaque"]["parameters"]
            assert params["domainID"] == domain["metadata"]["uid"], params
            (result,) = channel["status"]["allocation"]["devices"]["results"]
            assert result["pool"] == pod["spec"]["nodeName"], (result, pod["spec"]["nodeName"])
            nodes.add(pod["spec"]["nodeName"])
        assert len(nodes) == 4 and nodes <= set(trays), nodes
        (r,) = reservations_of(cp, ns, "deepseek-wideep-0")
        assert sorted(s["node"] for s in slots(r)) == sorted(nodes)
    finally:
        with contextlib.suppress(urllib.error.HTTPError):
            cp.request("DELETE", f"{lws_path}/deepseek-wideep", {"propagationPolicy": "Background"})
        wait_for_or_false(lambda: not items(cp, "StatefulSet", ns), 60)
        for other in others:
            merge_patch(cp, "Node", other, {"spec": {"unschedulable": False}})
        for tray in trays:
            remove_node(cp, tray)
        post(cp, f"{RESOURCE}/deviceclasses", gpu_class)


def test_a_jobset_of_two_jobs_on_a_dra_node_pins_each_pod_to_a_slot_of_its_own(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """A JobSet of one replicatedJob, 2 Jobs x parallelism 2, each pod claiming 2 GPUs through a
    ResourceClaimTemplate: one gang of 4 on the 8-GPU node. Each Job numbers its pods from 0, so
    the slot is the Job's share plus the completion index: the 4 pods get 4 distinct slots, each
    pinned by a claim that allocates exactly its slot's devices (before that fix the second Job's
    pods were refused as holding the first Job's slots)."""
    cp = control_plane
    hooks = start_manager(cp, JOBSET)
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
    try:
        post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "js-gpus", 2))
        pod = dra_pod(ns, "template", claim={"resourceClaimTemplateName": "js-gpus"})
        pod["spec"]["restartPolicy"] = "Never"
        labels, annotations = {"gangslice.io/gang": "js"}, {"gangslice.io/gang-size": "4"}
        job = {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod["spec"]},
        }
        post(
            cp,
            path,
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": "js", "namespace": ns},
                "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": job}}]},
            },
        )

        def pinned() -> list[dict[str, Any]] | None:
            pods = [p for p in items(cp, "Pod", ns, "jobset.sigs.k8s.io/jobset-name=js")]
            return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

        pods = wait_for("the JobSet's 4 pods bound", pinned, 90)
        keys = {p["metadata"]["annotations"]["gangslice.io/slot"] for p in pods}
        assert len(keys) == 4, keys
        assert_claims_pin_their_slots(cp, ns, pods)
        (r,) = reservations_of(cp, ns, "js")
        assert {s["podSet"] + "/" + str(s["index"]) for s in slots(r)} == keys
    finally:
        with contextlib.suppress(urllib.error.HTTPError):
            cp.request("DELETE", f"{path}/js", {"propagationPolicy": "Background"})
        wait_for_or_false(lambda: not items(cp, "Job", ns), 60)
        stop_manager(cp, JOBSET, hooks)
