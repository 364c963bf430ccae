"""The admission check controller driven with recorded Kueue objects over an in-memory API:
reserve then Ready (only our entry), Pending with the engine's reason, widening, Retry,
release on finish/evict/deactivate/delete, AdmissionCheck Active, standby silence."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from extender.controllers.kueue import assignment, workload_gang
from extender.controllers.kueue.contract import CheckConfig, Stage
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.objects import reservation_to_object, rfc3339
from extender.controllers.openapi import load_crd, validate, version_schema
from extender.controllers.runner import take_lead
from extender.kube.api import Conflict, KubeError
from extender.placement.ledger import Reservation
from extender.placement.slice import PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.builders import make_cluster, make_node_like
from extender.testing.clock import FakeClock
from extender.testing.fixtures import load_cluster_fixture, load_fixture
from extender.testing.kube import FakeKube

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "kueue"
T0 = datetime.fromisoformat("2026-08-25T10:00:00+00:00").timestamp()  # QuotaReserved of the LWS fixture
LWS = ("serving", "leaderworkerset-vllm-0-3f2a1")
KEY = "serving/leaderworkerset-vllm-0-3f2a1"
CFG = CheckConfig(widen_after_s=120, retry_after_s=300, requeue_after_s=45)


@cache
def workload_schema() -> dict[str, Any]:
    return version_schema(load_crd(UPSTREAM / "kueue.x-k8s.io_workloads.yaml"), "v1beta2")


def fixture_cluster(busy: dict[str, int] | None = None) -> ClusterSnapshot:
    """The fixture cluster (a-0..a-3 under leaf-a, b-0..b-3 under leaf-b); ``busy`` takes the
    first N GPUs of the named nodes."""
    snap = load_cluster_fixture("kueue/cluster.yaml")
    busy = busy or {}
    nodes = (make_node_like(n).busy(busy.get(n.name, 0)) for n in snap.nodes)
    return make_cluster(*nodes).hierarchy(snap.hierarchy).obj()


class World:
    """Kueue's side (objects in the fake API), the cluster cache and the controller."""

    def __init__(self, snap: ClusterSnapshot | None = None, now: float = T0 + 5, leader: bool = True) -> None:
        self.clock = FakeClock(now)
        self.api = FakeKube()
        for name in ("admissioncheck.yaml", "admissioncheck-provisioning.yaml", "resourceflavor.yaml"):
            obj = load_fixture(f"kueue/{name}")
            self.api.put(
                {"AdmissionCheck": "admissionchecks", "ResourceFlavor": "resourceflavors"}[obj["kind"]], obj
            )
        self.cache = ClusterCache.from_snapshot(
            snap or fixture_cluster(), clock=self.clock, store=KubeReservationStore(self.api, self.clock)
        )
        self.ctl = AdmissionController(self.api, self.cache, CFG, clock=self.clock)
        self.leader = leader

    async def start(self) -> None:
        if self.leader:
            await take_lead(self.ctl.cache, self.ctl)
        for ac in self.api.objects("admissionchecks"):
            await self.ctl.on_admission_check(None, ac)

    def workload(self, ns: str = LWS[0], name: str = LWS[1]) -> dict[str, Any]:
        got = self.api.peek("workloads", name, ns)
        assert got is not None
        return got

    async def kueue_writes(self, wl: dict[str, Any], event: str | None = "MODIFIED") -> dict[str, Any]:
        """Kueue changes the Workload; the watch delivers it."""
        stored = self.api.put("workloads", wl)
        await self.ctl.on_workload(event, stored)
        return stored

    def our_entry(self) -> dict[str, Any]:
        entries: dict[str, dict[str, Any]] = {
            e["name"]: e for e in self.workload()["status"]["admissionChecks"]
        }
        return entries["gangslice"]


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def set_condition(
    wl: dict[str, Any], kind: str, status: str, at: str = "2026-08-25T11:00:00Z"
) -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    wl["status"]["conditions"] = [c for c in wl["status"]["conditions"] if c["type"] != kind] + [
        {"type": kind, "status": status, "reason": kind, "message": kind, "lastTransitionTime": at}
    ]
    return wl


# -- reserve, then Ready -----------------------------------------------------------------------


def test_slice_is_reserved_then_the_check_is_set_ready_with_only_our_entry() -> None:
    async def body() -> None:
        w = World()
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)

        # The SliceReservation exists, owned by the Workload, and came before the Ready write.
        (obj,) = w.api.objects("slicereservations")
        assert obj["metadata"]["namespace"] == "serving"
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "Workload",
            LWS[1],
            "7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2910",
            True,
        )
        assert obj["status"]["gpus"] == 32 and obj["status"]["phase"] == "Reserved"
        calls = w.api.labels()
        assert calls.index("apply slicereservations") < calls.index("apply workloads/status")

        # One status apply, carrying only our entry, valid against Kueue's schema.
        (applied,) = w.api.applies_to("workloads")
        validate(workload_schema(), applied, "SSA body")
        assert set(applied) == {"apiVersion", "kind", "metadata", "status"}
        assert applied["metadata"]["resourceVersion"]
        (entry,) = applied["status"]["admissionChecks"]
        assert entry["name"] == "gangslice" and entry["state"] == "Ready"
        assert entry["lastTransitionTime"] == "2026-08-25T10:00:05Z"
        names = obj["metadata"]["name"]
        for update in entry["podSetUpdates"]:
            assert update["annotations"] == {"gangslice.io/reservation": names}
            assert set(update) <= {"name", "annotations", "nodeSelector"}
        by_set = {u["name"]: u for u in entry["podSetUpdates"]}
        assert by_set["worker"]["nodeSelector"]["fabric.topograph.run/tier-0"] in {"leaf-a", "leaf-b"}

        # Kueue's own entry is untouched; the ledger holds the whole gang.
        entries = {e["name"]: e for e in w.workload()["status"]["admissionChecks"]}
        assert entries["provision"] == load_fixture("kueue/workload-lws.yaml")["status"]["admissionChecks"][1]
        r = w.cache.reservation(KEY)
        assert r is not None and sum(len(s.gpus) for s in r.slice.slots) == 32
        assert len({s.node for s in r.slice.slots}) == 4
        assert [e["reason"] for e in w.api.events] == ["SliceReserved"]

        # The same Workload again (Kueue's next write) changes nothing.
        await w.ctl.on_workload("MODIFIED", w.workload())
        assert len(w.api.applies_to("workloads")) == 1
        assert len(w.api.objects("slicereservations")) == 1

    run(body)


def test_tas_workload_gets_gpus_inside_kueues_domains() -> None:
    async def body() -> None:
        w = World(now=datetime.fromisoformat("2026-08-25T10:05:01+00:00").timestamp())
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-job-tas.yaml"), None)
        entry = {
            e["name"]: e for e in w.workload("serving", "job-llama-8b-7c1d2")["status"]["admissionChecks"]
        }
        assert entry["gangslice"]["state"] == "Ready"
        (update,) = entry["gangslice"]["podSetUpdates"]
        assert "kubernetes.io/hostname" not in update.get("nodeSelector", {})
        r = w.cache.reservation("serving/job-llama-8b-7c1d2")
        assert r is not None and sorted(s.node for s in r.slice.slots) == ["b-1", "b-2"]

    run(body)


def test_a_conflicting_write_is_read_again_and_applied_once() -> None:
    async def body() -> None:
        w = World()
        await w.start()
        wl = w.api.put("workloads", load_fixture("kueue/workload-lws.yaml"))
        w.api.fail_next("apply workloads/status", Conflict(409, "the object has been modified"))
        await w.ctl.on_workload(None, wl)
        assert "get workloads" in w.api.labels()
        assert w.our_entry()["state"] == "Ready"
        assert len(w.api.objects("slicereservations")) == 1
        assert len(w.cache.ledger) == 1

    run(body)


def test_a_failed_create_leaves_no_hold_and_the_resync_retries(caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        w = World()
        await w.start()
        w.api.fail_next("apply slicereservations", KubeError(500, "etcd timeout"))
        with caplog.at_level(logging.WARNING, logger="extender.controllers"):
            await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        (failed,) = [r for r in caplog.records if "etcd timeout" in r.getMessage()]
        # The structured fields name the gang and its reservation object.
        assert getattr(failed, "gang", None) == KEY
        assert getattr(failed, "reservation", "").startswith("serving/")
        assert w.cache.reservation(KEY) is None
        assert w.api.applies_to("workloads") == []
        await w.ctl.resync()
        assert w.our_entry()["state"] == "Ready"
        assert w.cache.reservation(KEY) is not None

    run(body)


def test_invalid_gang_settings_reject_the_workload() -> None:
    async def body() -> None:
        w = World()
        await w.start()
        wl = load_fixture("kueue/workload-lws.yaml")
        wl["spec"]["podSets"][1]["template"]["metadata"]["annotations"]["gangslice.io/required-level"] = (
            "rack"
        )
        await w.kueue_writes(wl, None)
        entry = w.our_entry()
        assert entry["state"] == "Rejected"
        assert "unknown level 'rack'" in entry["message"]
        assert w.api.objects("slicereservations") == []

    run(body)


# -- waiting -----------------------------------------------------------------------------------


def test_pending_message_is_the_engines_reason_and_is_not_rewritten() -> None:
    # Only a-0 and b-0 are free: no leaf, and not the cluster, holds 4 pods of 8 GPUs.
    busy = {n: 8 for n in ("a-1", "a-2", "a-3", "b-1", "b-2", "b-3")}

    async def body() -> None:
        w = World(fixture_cluster(busy))
        await w.start()
        wl = await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        gang = workload_gang.gang_from_workload(wl, w.cache.snapshot().hierarchy).request
        allowed = assignment.pod_set_nodes(wl, {"h100": {"gangslice.io/pool": "h100"}})
        expected = assignment.solve(w.cache.view([KEY]), gang, Stage.STRICT, allowed, "2026-08-25T10:02:00Z")
        assert not hasattr(expected, "slots")
        entry = w.our_entry()
        assert entry["state"] == "Pending"
        assert entry["message"] == f"waiting for a slice: {expected.reason}"
        assert "holding out for the preferred levels" in entry["message"]
        assert "until 2026-08-25T10:02:00Z" in entry["message"]
        assert [e["reason"] for e in w.api.events] == ["WaitingForSlice"]
        assert w.api.objects("slicereservations") == [] and len(w.cache.ledger) == 0
        # Nothing changed: no second write, no second event.
        w.clock.now += 10
        await w.ctl.resync()
        assert len(w.api.applies_to("workloads")) == 1 and len(w.api.events) == 1

    run(body)


def test_preferred_level_widens_to_the_required_level_after_the_wait() -> None:
    # Two free nodes under each leaf: 4 nodes exist, but no one leaf has them.
    busy = {n: 8 for n in ("a-2", "a-3", "b-2", "b-3")}

    async def body() -> None:
        w = World(fixture_cluster(busy))
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        assert w.our_entry()["state"] == "Pending"
        assert "holding out for the preferred levels" in w.our_entry()["message"]

        w.clock.now = T0 + CFG.widen_after_s - 1
        await w.ctl.resync()
        assert w.our_entry()["state"] == "Pending"

        w.clock.now = T0 + CFG.widen_after_s
        await w.ctl.resync()
        entry = w.our_entry()
        assert entry["state"] == "Ready"
        r = w.cache.reservation(KEY)
        assert r is not None
        assert {s.node for s in r.slice.slots} == {"a-0", "a-1", "b-0", "b-1"}
        assert any("preferred level" in n for n in r.slice.notes)
        # The workers span two leaves, so only the spine is shared.
        worker = {u["name"]: u for u in entry["podSetUpdates"]}["worker"]
        assert worker["nodeSelector"] == {"fabric.topograph.run/tier-1": "spine-1"}

    run(body)


def _blocker(nodes: list[str]) -> Reservation:
    """Another gang's reservation holding every GPU of ``nodes``."""
    slots = tuple(PodSlot("p", i, n, tuple(range(8))) for i, n in enumerate(nodes))
    return Reservation("other/blocker", Slice("other/blocker", slots, {"p": 0.0}), T0 + 3600)


def test_retry_after_the_second_wait_then_a_fresh_placement_after_requeue() -> None:
    async def body() -> None:
        w = World()
        await w.start()
        assert w.cache.restore(_blocker(["a-1", "a-2", "a-3", "b-1", "b-2", "b-3"]))
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        w.clock.now = T0 + CFG.widen_after_s + 1
        await w.ctl.resync()
        assert w.our_entry()["state"] == "Pending"
        assert "holding out" not in w.our_entry()["message"]

        w.clock.now = T0 + CFG.widen_after_s + CFG.retry_after_s
        await w.ctl.resync()
        entry = w.our_entry()
        assert entry["state"] == "Retry"
        assert entry["requeueAfterSeconds"] == CFG.requeue_after_s
        assert entry["podSetUpdates"] == []
        assert "giving the quota back" in entry["message"]
        assert w.api.events[-1]["reason"] == "SliceRetry"
        validate(workload_schema(), w.api.applies_to("workloads")[-1])

        # Kueue evicts: quota released, our check reset to Pending. Nothing for us to do.
        wl = set_condition(w.workload(), "Evicted", "True")
        wl = set_condition(wl, "QuotaReserved", "False")
        wl["status"]["admissionChecks"][0].update(state="Pending", retryCount=1)
        applies = len(w.api.applies_to("workloads"))
        await w.kueue_writes(wl)
        assert len(w.api.applies_to("workloads")) == applies

        # The other gang is done; Kueue reserves quota again: a new wait, a new slice at once.
        w.cache.drop("other/blocker")
        w.clock.now += 30
        at = rfc3339(w.clock.now)
        wl = set_condition(set_condition(w.workload(), "QuotaReserved", "True", at), "Evicted", "False", at)
        await w.kueue_writes(wl)
        assert w.our_entry()["state"] == "Ready"
        r = w.cache.reservation(KEY)
        assert r is not None and r.meta["attempt"] == at

    run(body)


# -- release -----------------------------------------------------------------------------------


def _finished(wl: dict[str, Any]) -> dict[str, Any]:
    return set_condition(wl, "Finished", "True")


def _evicted(wl: dict[str, Any]) -> dict[str, Any]:
    return set_condition(wl, "Evicted", "True")


def _deactivated(wl: dict[str, Any]) -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    wl["spec"]["active"] = False
    return wl


def _quota_gone(wl: dict[str, Any]) -> dict[str, Any]:
    wl = set_condition(wl, "QuotaReserved", "False")
    del wl["status"]["admission"]
    return wl


@pytest.mark.parametrize("change", [_finished, _evicted, _deactivated, _quota_gone, None])
def test_the_reservation_is_released(change: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
    async def body() -> None:
        w = World()
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        assert w.cache.reservation(KEY) is not None and len(w.api.objects("slicereservations")) == 1
        if change is None:
            wl = w.workload()
            w.api.remove("workloads", LWS[1], LWS[0])
            await w.ctl.on_workload("DELETED", wl)
        else:
            await w.kueue_writes(change(w.workload()))
            assert w.api.events[-1]["reason"] == "SliceReleased"
        assert w.cache.reservation(KEY) is None
        assert w.api.objects("slicereservations") == []
        assert len(w.cache.ledger) == 0
        assert w.cache.view().reserved == {}

    run(body)


def test_an_evicted_workload_gets_a_fresh_placement_when_it_returns() -> None:
    async def body() -> None:
        w = World()
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        first = w.cache.reservation(KEY)
        assert first is not None
        wl = _evicted(w.workload())
        wl["status"]["admissionChecks"][0].update(state="Pending", message="Reset to Pending after eviction")
        await w.kueue_writes(wl)
        assert w.cache.reservation(KEY) is None
        w.clock.now = T0 + 600
        wl = set_condition(w.workload(), "Evicted", "False", "2026-08-25T10:10:00Z")
        wl = set_condition(wl, "QuotaReserved", "True", "2026-08-25T10:10:00Z")
        await w.kueue_writes(wl)
        again = w.cache.reservation(KEY)
        assert again is not None and again.meta["attempt"] == "2026-08-25T10:10:00Z"
        assert w.our_entry()["state"] == "Ready"
        assert len(w.api.objects("slicereservations")) == 1

    run(body)


def test_a_reservation_from_an_earlier_admission_is_replaced() -> None:
    async def body() -> None:
        w = World()
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        # Kueue requeued the Workload while we were not looking: Pending again, new quota time.
        w.clock.now = T0 + 900
        wl = set_condition(w.workload(), "QuotaReserved", "True", "2026-08-25T10:14:00Z")
        wl["status"]["admissionChecks"][0].update(state="Pending")
        await w.kueue_writes(wl)
        r = w.cache.reservation(KEY)
        assert r is not None and r.meta["attempt"] == "2026-08-25T10:14:00Z"
        assert [e["reason"] for e in w.api.events] == ["SliceReserved", "SliceReleased", "SliceReserved"]
        assert len(w.api.objects("slicereservations")) == 1

    run(body)


# -- AdmissionChecks and leadership ------------------------------------------------------------


def test_our_admission_checks_are_set_active_and_others_left_alone() -> None:
    async def body() -> None:
        w = World()
        w.api.put("admissionchecks", load_fixture("kueue/admissioncheck-bad-params.yaml"))
        await w.start()
        applied = {
            b["metadata"]["name"]: b["status"]["conditions"][0] for b in w.api.applies_to("admissionchecks")
        }
        assert set(applied) == {"gangslice", "gangslice-tuned"}
        assert (applied["gangslice"]["status"], applied["gangslice"]["reason"]) == ("True", "Active")
        assert (applied["gangslice-tuned"]["status"], applied["gangslice-tuned"]["reason"]) == (
            "False",
            "BadParametersRef",
        )
        stored = w.api.peek("admissionchecks", "gangslice")
        assert stored is not None and stored["status"]["conditions"][0]["status"] == "True"
        # Seen again with the condition in place: no write.
        count = len(w.api.applies_to("admissionchecks"))
        await w.ctl.on_admission_check("MODIFIED", stored)
        assert len(w.api.applies_to("admissionchecks")) == count

    run(body)


def test_a_standby_decides_nothing() -> None:
    async def body() -> None:
        w = World(leader=False)
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        assert w.api.applies == [] and w.api.objects("slicereservations") == []
        assert len(w.cache.ledger) == 0
        # Becoming leader acts on what the standby has seen.
        await take_lead(w.ctl.cache, w.ctl)
        assert w.our_entry()["state"] == "Ready"
        w.ctl.lose_leadership()
        await w.kueue_writes(_finished(w.workload()))
        assert w.cache.reservation(KEY) is not None

    run(body)


def test_without_kueue_the_leader_rebuilds_the_ledger_and_reads_nothing_of_kueue() -> None:
    """A cluster without Kueue's CRDs: becoming leader must not wait on AdmissionChecks
    (a 404 there would keep the replica from ever leading), yet reservations come back."""
    world = World()
    ctl = AdmissionController(world.api, world.cache, CFG, clock=world.clock, kueue=False)
    blocker = _blocker(["a-0"])
    world.api.put("slicereservations", reservation_to_object(blocker, "other", "held", None))

    async def body() -> None:
        await take_lead(ctl.cache, ctl)

    run(body)
    assert ctl.leader and ctl.checks == {}
    assert "list admissionchecks" not in world.api.labels()
    assert world.cache.reservation(blocker.gang) is not None
