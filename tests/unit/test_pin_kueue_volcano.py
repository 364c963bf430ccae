"""DRA pinning for gangs that Kueue and Volcano form: the one pod -> gang mapping, the Kueue
admission check counting a pod set's DRA GPUs and labelling it for the webhook, the webhook
pinning a Kueue or Volcano pod to its reservation's slot, and the PodGroup controller counting
the members the webhook refused for want of a slice."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from test_joint_workloads import DECODE, PREFILL, entry, submit
from test_joint_workloads import world as joint_world
from test_slot_claims import NODE, admit, patched, pcie_cache, template

from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.podgroups.controller import PodGroupController
from extender.controllers.runner import take_lead
from extender.kube import names
from extender.kube.api import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from extender.kube.pods import PodInfo
from extender.kube.slot_claims import uuid_selector
from extender.reservations import ClusterCache
from extender.testing.dra import gpu_uuid
from extender.testing.kube import FakeKube
from extender.testing.objects import make_pod_group, make_workload

NS = "llm"
WL = "job-tp4-7c1d2"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"


def pod_info(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> PodInfo:
    meta = {"name": "p", "namespace": NS, "labels": labels or {}, "annotations": annotations or {}}
    return PodInfo.from_obj({"metadata": meta})


# -- the mapping -------------------------------------------------------------------------------


def test_every_gang_source_maps_a_pod_to_its_gang_key() -> None:
    assert pod_info(labels={names.GANG: "tp4"}).gang_key == f"{NS}/tp4"
    assert pod_info({names.RESERVATION: WL}, {names.KUEUE_PODSET: "main"}).gang_key == f"{NS}/{WL}"
    assert pod_info({names.VOLCANO_GROUP: "pg"}).gang_key == f"{NS}/pg"
    # Kueue's annotation names the reservation gangslice made: it wins over anything else.
    both = pod_info({names.RESERVATION: WL, names.VOLCANO_GROUP: "pg"})
    assert both.gang_key == f"{NS}/{WL}"
    assert pod_info().gang_key is None


# -- Kueue -------------------------------------------------------------------------------------


def workload(count: int = 2) -> dict[str, Any]:
    """A Job's Workload with quota reserved and our check Pending; its pods ask for 4 GPUs each
    through the ResourceClaimTemplate ``gpus`` (no nvidia.com/gpu)."""
    at = "2026-08-25T10:05:00Z"
    return (
        make_workload(WL, NS)
        .uid("wl-uid-1")
        .resource_version("7")
        .pod_set("main", count, claim="gpus", restart_policy="Never")
        .quota_reserved(at)
        .check("gangslice", "Pending")
        .obj()
    )


def kueue_world() -> tuple[FakeKube, ClusterCache, AdmissionController]:
    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, {**template(4), "metadata": {"name": "gpus", "namespace": NS}})
    api.put(
        "admissionchecks",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": "gangslice", "generation": 1},
            "spec": {"controllerName": names.CHECK_CONTROLLER},
        },
    )
    api.put(
        "resourceflavors",
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
    )
    ctl = AdmissionController(api, cache, CheckConfig())

    async def start() -> None:
        await take_lead(cache, ctl)
        for ac in api.objects("admissionchecks"):
            await ctl.on_admission_check(None, ac)
        await ctl.on_workload(None, api.put("workloads", workload()))

    asyncio.run(start())
    return api, cache, ctl


def our_entry(api: FakeKube) -> dict[str, Any]:
    wl = api.peek("workloads", WL, NS)
    assert wl is not None
    (entry,) = [e for e in wl["status"]["admissionChecks"] if e["name"] == "gangslice"]
    return dict(entry)


def job_pod(i: int, update: dict[str, Any]) -> dict[str, Any]:
    """What the Job controller creates once Kueue unsuspended the Job with our podSetUpdates."""
    wl = workload()
    pod_template = copy.deepcopy(wl["spec"]["podSets"][0]["template"])
    labels = {**(update.get("labels") or {}), names.KUEUE_PODSET: "main", JOB_INDEX: str(i)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"tp4-{i}-x7k2p", "labels": labels, "annotations": dict(update["annotations"])},
        "spec": pod_template["spec"],
    }


def test_a_kueue_pod_set_asking_for_gpus_through_a_claim_is_reserved_and_labelled_for_the_webhook() -> None:
    api, cache, _ = kueue_world()
    entry = our_entry(api)
    assert entry["state"] == "Ready", entry
    (update,) = entry["podSetUpdates"]
    assert update["labels"] == {names.MANAGED: "true"}
    assert update["annotations"] == {names.RESERVATION: WL}
    r = cache.reservation(f"{NS}/{WL}")
    assert r is not None
    # The template's claim asks for 4 GPUs per pod: two slots of 4 (one per socket of the box).
    assert sorted(len(s.gpus) for s in r.slice.slots) == [4, 4]
    assert r.meta.get(names.META_SLOT_CLAIMS) == "true"
    (saved,) = api.objects("slicereservations")
    assert all(s.get("claim") for s in saved["status"]["slots"]), saved["status"]["slots"]


def test_the_webhook_pins_each_kueue_pod_to_the_slot_of_its_completion_index() -> None:
    api, cache, _ = kueue_world()
    (update,) = our_entry(api)["podSetUpdates"]
    r = cache.reservation(f"{NS}/{WL}")
    assert r is not None
    pods = [job_pod(1, update), job_pod(0, update)]  # out of order: the index decides, not arrival
    answers = admit(api, cache, *pods)
    assert all(a["allowed"] for a in answers), answers
    claims = {c["metadata"]["name"]: c for c in api.objects(RESOURCE_CLAIMS)}
    assert len(claims) == 2
    for pod, answer in zip(pods, answers, strict=True):
        got = patched(pod, answer)
        index = int(pod["metadata"]["labels"][JOB_INDEX])
        slot = sorted(r.slice.slots, key=lambda s: s.index)[index]
        ann = got["metadata"]["annotations"]
        assert ann[names.SLOT] == slot.key and ann[names.CLAIM_GPUS] == "4"
        (entry,) = got["spec"]["resourceClaims"]
        claim = claims[entry["resourceClaimName"]]
        expr = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        assert expr == uuid_selector([gpu_uuid(NODE, g) for g in slot.gpus])
        assert claim["metadata"]["ownerReferences"][0]["name"] == WL  # the Workload's reservation
    # The webhook reserved nothing of its own: the admission check's reservation is the only one.
    assert [x.gang for x in cache.ledger.reservations()] == [f"{NS}/{WL}"]
    assert len(api.objects("slicereservations")) == 1


def test_a_kueue_pod_whose_reservation_is_missing_is_refused_and_nothing_is_reserved() -> None:
    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, {**template(4), "metadata": {"name": "gpus", "namespace": NS}})
    pod = job_pod(0, {"annotations": {names.RESERVATION: "job-gone-1"}, "labels": {names.MANAGED: "true"}})
    (answer,) = admit(api, cache, pod)
    assert not answer["allowed"]
    message = answer["status"]["message"]
    assert message.startswith("gangslice: SliceReservation llm/job-gone-1") and "retry" in message, message
    assert api.objects(RESOURCE_CLAIMS) == [] and not list(cache.ledger.reservations())


# -- Volcano -----------------------------------------------------------------------------------


def podgroup(min_member: int = 2) -> dict[str, Any]:
    return (
        make_pod_group("pg", NS)
        .uid("pg-uid-1")
        .resource_version("3")
        .min_member(min_member)
        .phase("Inqueue")
        .obj()
    )


def volcano_pod(i: int) -> dict[str, Any]:
    """A pod as Volcano's job controller creates it: fixed name, group and task annotations."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"tp4-worker-{i}",
            "labels": {names.MANAGED: "true"},
            "annotations": {names.VOLCANO_GROUP: "pg", names.VOLCANO_TASK_SPEC: "worker"},
        },
        "spec": {
            "schedulerName": "volcano",
            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpus"}],
        },
    }


def test_volcano_pods_refused_for_want_of_a_slice_count_as_members_then_are_pinned_on_retry() -> None:
    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, {**template(4), "metadata": {"name": "gpus", "namespace": NS}})
    group = api.put("podgroups", podgroup())
    pods = [volcano_pod(0), volcano_pod(1)]

    # Volcano's job controller creates both pods; the PodGroup has no slice yet.
    first = admit(api, cache, *pods)
    assert not any(a["allowed"] for a in first)
    assert all("PodGroup llm/pg has no slice reserved yet" in a["status"]["message"] for a in first), first
    assert api.objects(RESOURCE_CLAIMS) == []
    seen = cache.pods_of_gang(f"{NS}/pg")
    assert sorted(p.name for p in seen) == ["tp4-worker-0", "tp4-worker-1"]
    assert all(p.gpus == 4 for p in seen)  # the claim's GPUs, though the pods ask no nvidia.com/gpu

    # The PodGroup controller has watched no member pod, yet places the gang from those two.
    ctl = PodGroupController(api, cache)

    async def reconcile() -> None:
        await take_lead(cache, ctl)
        await ctl.on_podgroup(None, group)

    asyncio.run(reconcile())
    r = cache.reservation(f"{NS}/pg")
    assert r is not None and sorted(len(s.gpus) for s in r.slice.slots) == [4, 4]
    assert r.meta.get(names.META_SLOT_CLAIMS) == "true"  # its status names each slot's claim

    # The job controller retries: each pod gets its own slot and claim, owned by the reservation.
    second = admit(api, cache, *pods)
    assert all(a["allowed"] for a in second), second
    got = [patched(p, a) for p, a in zip(pods, second, strict=True)]
    slots = {g["metadata"]["annotations"][names.SLOT] for g in got}
    assert slots == {s.key for s in r.slice.slots}
    claims = {c["metadata"]["name"]: c for c in api.objects(RESOURCE_CLAIMS)}
    assert {g["spec"]["resourceClaims"][0]["resourceClaimName"] for g in got} == set(claims)
    (saved,) = api.objects("slicereservations")
    assert saved["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"
    assert all(
        c["metadata"]["ownerReferences"][0]["name"] == saved["metadata"]["name"] for c in claims.values()
    )
    assert [x.gang for x in cache.ledger.reservations()] == [f"{NS}/pg"]


def test_members_only_the_webhook_saw_are_forgotten_with_their_podgroup() -> None:
    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, {**template(4), "metadata": {"name": "gpus", "namespace": NS}})
    group = api.put("podgroups", podgroup())
    admit(api, cache, volcano_pod(0), volcano_pod(1))
    assert len(cache.pods_of_gang(f"{NS}/pg")) == 2
    ctl = PodGroupController(api, cache)
    asyncio.run(ctl.on_podgroup("DELETED", group))
    assert cache.pods_of_gang(f"{NS}/pg") == []  # a new PodGroup of that name starts from nothing


def test_the_members_of_a_joint_kueue_gang_are_counted_and_labelled_for_the_webhook_too() -> None:
    ctl, api, cache, _ = joint_world()
    api.put(RESOURCE_CLAIM_TEMPLATES, {**template(4), "metadata": {"name": "gpus", "namespace": "serving"}})
    members = []
    for wl in (PREFILL, DECODE):
        wl = copy.deepcopy(wl)
        spec = wl["spec"]["podSets"][0]["template"]["spec"]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}  # no nvidia.com/gpu
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "gpus"}]
        members.append(wl)
        submit(ctl, api, wl)
    for wl in members:
        name = wl["metadata"]["name"]
        got = entry(api, name)
        assert got["state"] == "Ready", got
        (update,) = got["podSetUpdates"]
        assert update["labels"] == {names.MANAGED: "true"}, update
        r = cache.reservation(f"serving/{name}")
        assert r is not None and [len(s.gpus) for s in r.slice.slots] == [4]
        assert r.meta.get(names.META_SLOT_CLAIMS) == "true"


def test_a_joint_kueue_gang_whose_claim_template_read_fails_at_ready_holds_nothing_and_readies_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from extender.controllers.kueue.workload_gang import WorkloadError

    ctl, api, cache, _ = joint_world()
    api.put(RESOURCE_CLAIM_TEMPLATES, {**template(4), "metadata": {"name": "gpus", "namespace": "serving"}})
    real = ctl._claim_gpus
    calls: list[str] = []

    async def flaky(wl: Any) -> Any:
        calls.append(wl["metadata"]["name"])
        if len(calls) == 3:  # the two reads of the hold pass; the first read at Ready fails
            raise WorkloadError("ResourceClaimTemplate serving/gpus: 503 etcd is slow")
        return await real(wl)

    monkeypatch.setattr(ctl, "_claim_gpus", flaky)
    for wl in (PREFILL, DECODE):
        wl = copy.deepcopy(wl)
        spec = wl["spec"]["podSets"][0]["template"]["spec"]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "gpus"}]
        submit(ctl, api, wl)
    assert len(calls) >= 3, calls
    for wl in (PREFILL, DECODE):
        got = entry(api, wl["metadata"]["name"])
        assert got["state"] != "Ready", got
        assert cache.reservation(f"serving/{wl['metadata']['name']}") is None
