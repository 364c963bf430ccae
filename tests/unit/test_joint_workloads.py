"""Gangs across objects on the Kueue path: a prefill Workload and a decode Workload of one
joint gang wait until both have quota, are placed as one request (decode in prefill's NVLink
clique), get one SliceReservation each and their checks Ready in one pass; a member that
never gets quota makes the other give its quota back with a message naming it."""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from extender.controllers import joint
from extender.controllers.kueue import workload_gang
from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.openapi import load_crd, validate, version_schema
from extender.controllers.runner import take_lead
from extender.placement.files import load_cluster
from extender.placement.ledger import Ledger
from extender.placement.scoring import gang_micros
from extender.placement.slice import PodSlot, Slice
from extender.placement.solver import place
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.kube import FakeKube

REPO = Path(__file__).resolve().parents[2]
KUEUE = REPO / "tests" / "fixtures" / "kueue"
VOLCANO = REPO / "tests" / "fixtures" / "volcano"
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "kueue"
T0 = datetime.fromisoformat("2026-08-25T10:00:00+00:00").timestamp()
CLIQUE = "nvidia.com/gpu.clique"


@cache
def workload_schema() -> dict[str, Any]:
    return version_schema(load_crd(UPSTREAM / "kueue.x-k8s.io_workloads.yaml"), "v1beta2")


def member(
    name: str, pod_set: str, uid: str, colocate: str | None = None, kv: bool = False
) -> dict[str, Any]:
    """The recorded LWS Workload reshaped as one 4-GPU pod of a joint gang ``disagg``."""
    wl: dict[str, Any] = copy.deepcopy(yaml.safe_load((KUEUE / "workload-lws.yaml").read_text()))
    meta = wl["metadata"]
    meta.update(name=name, uid=uid)
    meta["labels"]["gangslice.io/gang"] = "disagg"
    meta["annotations"]["gangslice.io/gang-members"] = "2"
    if colocate:
        meta["annotations"]["gangslice.io/colocate-with"] = colocate
    ps = wl["spec"]["podSets"][1]
    ps.update(name=pod_set, count=1)
    ps.pop("topologyRequest", None)
    tmpl = ps["template"]["metadata"]
    tmpl["annotations"] = {"gangslice.io/comm": "kv-transfer"} if kv else {}
    ps["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    wl["spec"]["podSets"] = [ps]
    psa = wl["status"]["admission"]["podSetAssignments"][1]
    psa.update(
        name=pod_set, count=1, flavors={"nvidia.com/gpu": "gb200"}, resourceUsage={"nvidia.com/gpu": "4"}
    )
    wl["status"]["admission"]["podSetAssignments"] = [psa]
    wl["status"]["admissionChecks"] = [e for e in wl["status"]["admissionChecks"] if e["name"] == "gangslice"]
    return wl


PREFILL = member("disagg-prefill", "prefill", "11111111-2222-4333-8444-555555555501")
DECODE = member(
    "disagg-decode", "decode", "11111111-2222-4333-8444-555555555502", "disagg-prefill@clique", True
)


def world() -> tuple[AdmissionController, FakeKube, ClusterCache, FakeClock]:
    clock = FakeClock(T0 + 5)
    api = FakeKube()
    api.put("admissionchecks", yaml.safe_load((KUEUE / "admissioncheck.yaml").read_text()))
    cache_ = ClusterCache.from_snapshot(
        load_cluster(VOLCANO / "gb200.yaml"), clock=clock, store=KubeReservationStore(api, clock)
    )
    ctl = AdmissionController(api, cache_, CheckConfig(member_wait_s=60), clock=clock)

    async def start() -> None:
        await take_lead(ctl.cache, ctl)
        for ac in api.objects("admissionchecks"):
            await ctl.on_admission_check(None, ac)

    asyncio.run(start())
    return ctl, api, cache_, clock


def submit(ctl: AdmissionController, api: FakeKube, wl: dict[str, Any]) -> None:
    asyncio.run(ctl.on_workload(None, api.put("workloads", wl)))


def entry(api: FakeKube, name: str) -> dict[str, Any]:
    wl = api.peek("workloads", name, "serving")
    assert wl is not None
    (got,) = [e for e in wl["status"]["admissionChecks"] if e["name"] == "gangslice"]
    return dict(got)


def test_the_member_workloads_are_valid_workloads() -> None:
    for wl in (PREFILL, DECODE):
        validate(workload_schema(), wl, wl["metadata"]["name"])


def test_prefill_and_decode_workloads_are_ready_together_in_one_clique() -> None:
    ctl, api, cache_, _ = world()
    submit(ctl, api, PREFILL)
    assert cache_.reservation("serving/disagg-prefill") is None
    assert entry(api, "disagg-prefill")["state"] == "Pending"
    assert "waiting for member(s) 1 unnamed member(s)" in entry(api, "disagg-prefill")["message"]
    submit(ctl, api, DECODE)
    pr, dr = cache_.reservation("serving/disagg-prefill"), cache_.reservation("serving/disagg-decode")
    assert pr is not None and dr is not None
    snap = cache_.snapshot()
    assert {snap.node(s.node).labels[CLIQUE] for s in (*pr.slice.slots, *dr.slice.slots)} == {"5e1a.2"}
    assert entry(api, "disagg-prefill")["state"] == entry(api, "disagg-decode")["state"] == "Ready"
    assert {o["metadata"]["name"] for o in api.objects("slicereservations")} == {
        "disagg-prefill",
        "disagg-decode",
    }
    # The two Ready writes came after both SliceReservations were created.
    calls = [c for c in api.labels() if c in ("apply slicereservations", "apply workloads/status")]
    ready_writes = [i for i, c in enumerate(calls) if c == "apply workloads/status"][-2:]
    creates = [i for i, c in enumerate(calls) if c == "apply slicereservations"]
    assert max(creates) < min(ready_writes)


def test_a_member_that_never_gets_quota_is_named_and_the_other_gives_its_quota_back() -> None:
    ctl, api, cache_, clock = world()
    submit(ctl, api, DECODE)
    assert "disagg-prefill" in entry(api, "disagg-decode")["message"]
    clock.now += 61
    asyncio.run(ctl.resync())
    got = entry(api, "disagg-decode")
    assert got["state"] == "Retry"
    assert "disagg-prefill" in got["message"] and "did not get quota" in got["message"]
    assert cache_.reservation("serving/disagg-decode") is None
    assert [e["reason"] for e in api.events if e["reason"] == "MemberMissing"] == ["MemberMissing"]


def test_the_joint_workloads_predict_a_cheaper_kv_transfer_than_placed_one_after_the_other() -> None:
    ctl, api, cache_, _ = world()
    submit(ctl, api, PREFILL)
    submit(ctl, api, DECODE)
    snap = load_cluster(VOLCANO / "gb200.yaml")
    requests = {
        wl["metadata"]["name"]: workload_gang.gang_from_workload(wl, snap.hierarchy).request
        for wl in (PREFILL, DECODE)
    }
    together = joint.joint_request(
        "serving/disagg", requests, {"disagg-decode": "disagg-prefill@clique"}, snap.hierarchy
    )

    def renamed(member_name: str, slots: Any) -> list[PodSlot]:
        return [
            PodSlot(f"{member_name}.{s.pod_set}", s.index, s.node, s.gpus, s.numa_nodes, s.nic) for s in slots
        ]

    held: list[PodSlot] = []
    for name in requests:
        r = cache_.reservation(f"serving/{name}")
        assert r is not None
        held += renamed(name, r.slice.slots)
    ledger = Ledger()
    alone: list[PodSlot] = []
    for name in ("disagg-prefill", "disagg-decode"):
        got = place(ledger.view(snap), requests[name])
        assert isinstance(got, Slice)
        ledger.reserve(got, 0.0)
        alone += renamed(name, got.slots)
    assert len({snap.node(s.node).labels[CLIQUE] for s in alone}) == 2
    joint_kv = gang_micros(snap, together, held)["disagg-decode.decode"]
    independent_kv = gang_micros(snap, together, alone)["disagg-decode.decode"]
    assert 0 < joint_kv < independent_kv
