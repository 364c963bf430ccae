"""A controller stopped between "SliceReservation created" and "check set Ready" comes back,
rebuilds its ledger from the stored objects, and finishes the job with the same slice:
nothing double-booked, nothing leaked."""

from __future__ import annotations

import asyncio
import copy
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.leader import LeaderElector, LeaseConfig
from extender.controllers.objects import reservation_from_object
from extender.controllers.runner import take_lead
from extender.placement.files import load_cluster
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "kueue"
T0 = datetime.fromisoformat("2026-08-25T10:00:00+00:00").timestamp()
LWS = ("serving", "leaderworkerset-vllm-0-3f2a1")
KEY = "serving/leaderworkerset-vllm-0-3f2a1"
LEASE = LeaseConfig(namespace="gangslice-system", name="gangslice", duration_s=15, renew_deadline_s=10)


class Crash(BaseException):
    """The process dies here: nothing in the controller catches it."""


def other_workload(name: str, uid: str) -> dict[str, Any]:
    """A second gang in the same namespace: 2 pods x 8 GPUs."""
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["metadata"].update(name=name, uid=uid)
    wl["spec"]["podSets"] = wl["spec"]["podSets"][1:]
    wl["spec"]["podSets"][0]["count"] = 2
    wl["status"]["admission"]["podSetAssignments"] = wl["status"]["admission"]["podSetAssignments"][1:]
    wl["status"]["admission"]["podSetAssignments"][0]["count"] = 2
    wl["status"]["admissionChecks"] = wl["status"]["admissionChecks"][:1]
    return wl


def kueue_api() -> FakeKube:
    api = FakeKube()
    api.put("admissionchecks", load_fixture("kueue/admissioncheck.yaml"))
    api.put("resourceflavors", load_fixture("kueue/resourceflavor.yaml"))
    return api


class Process:
    """One controller process: its own cluster cache (and so its own ledger)."""

    def __init__(self, api: FakeKube, clock: FakeClock, identity: str) -> None:
        self.cache = ClusterCache.from_snapshot(
            load_cluster(FIXTURES / "cluster.yaml"), clock=clock, store=KubeReservationStore(api, clock)
        )
        self.ctl = AdmissionController(api, self.cache, CheckConfig(), clock=clock, identity=identity)
        self.elector = LeaderElector(
            api, LEASE, identity, lambda: take_lead(self.cache, self.ctl), self.ctl.lose_leadership, clock
        )

    async def watch_all(self, api: FakeKube) -> None:
        """kopf's initial listing: every AdmissionCheck and Workload, in order."""
        for ac in api.objects("admissionchecks"):
            await self.ctl.on_admission_check(None, ac)
        for wl in api.objects("workloads"):
            await self.ctl.on_workload(None, wl)


def entry(api: FakeKube, name: str) -> dict[str, Any]:
    wl = api.peek("workloads", name, "serving")
    assert wl is not None
    got: dict[str, Any] = {e["name"]: e for e in wl["status"]["admissionChecks"]}["gangslice"]
    return got


def workload(api: FakeKube, name: str) -> dict[str, Any]:
    wl = api.peek("workloads", name, "serving")
    assert wl is not None
    return wl


def held_gpus(cache: ClusterCache) -> list[tuple[str, int]]:
    return [(s.node, g) for r in cache.ledger.reservations() for s in r.slice.slots for g in s.gpus]


async def lws_leader() -> tuple[FakeClock, FakeKube, Process]:
    """The LWS Workload in a fresh fake API and a first controller process, made leader."""
    clock = FakeClock(T0 + 5)
    api = kueue_api()
    api.put("workloads", load_fixture("kueue/workload-lws.yaml"))
    first = Process(api, clock, "first")
    await take_lead(first.ctl.cache, first.ctl)
    return clock, api, first


def test_stop_between_reservation_and_ready_then_restart_uses_the_same_slice() -> None:
    async def body() -> None:
        clock = FakeClock(T0 + 5)
        api = kueue_api()
        api.put("workloads", other_workload("other", "uid-other"))
        first = Process(api, clock, "first")
        await first.elector.step()
        assert first.elector.leading
        await first.watch_all(api)
        assert entry(api, "other")["state"] == "Ready"

        # The LWS gang: its SliceReservation is created, then the process dies before Ready.
        api.put("workloads", load_fixture("kueue/workload-lws.yaml"))
        api.fail_next("apply workloads/status", Crash())
        with pytest.raises(Crash):
            await first.ctl.on_workload(None, workload(api, LWS[1]))
        assert entry(api, LWS[1])["state"] == "Pending"
        stored = {o["spec"]["gang"]: o for o in api.objects("slicereservations")}
        assert set(stored) == {KEY, "serving/other"}
        before = reservation_from_object(stored[KEY]).slice.to_dict()

        # A new process: standby until the dead leader's lease runs out; it sees the Workloads
        # but decides nothing before it leads and has rebuilt its ledger.
        second = Process(api, clock, "second")
        await second.watch_all(api)
        await second.elector.step()
        assert not second.elector.leading and len(second.cache.ledger) == 0
        assert entry(api, LWS[1])["state"] == "Pending"
        clock.now += LEASE.duration_s + 1
        await second.elector.step()
        assert second.elector.leading

        # The same slice, the same object, Ready now.
        done = entry(api, LWS[1])
        assert done["state"] == "Ready"
        assert {u["annotations"]["gangslice.io/reservation"] for u in done["podSetUpdates"]} == {
            stored[KEY]["metadata"]["name"]
        }
        r = second.cache.reservation(KEY)
        assert r is not None and r.slice.to_dict() == before
        after = {o["spec"]["gang"]: o for o in api.objects("slicereservations")}
        assert set(after) == {KEY, "serving/other"}
        assert after[KEY]["spec"] == stored[KEY]["spec"]

        # Nothing double-booked: each GPU is held once, and a third gang gets other GPUs.
        held = held_gpus(second.cache)
        assert len(held) == len(set(held)) == 32 + 16
        api.put("workloads", other_workload("third", "uid-third"))
        await second.ctl.on_workload(None, workload(api, "third"))
        assert entry(api, "third")["state"] == "Ready"
        held = held_gpus(second.cache)
        assert len(held) == len(set(held)) == 32 + 16 + 16

        # Nothing leaks: once every Workload has finished, no hold and no object is left.
        for name in (LWS[1], "other", "third"):
            wl = copy.deepcopy(workload(api, name))
            wl["status"]["conditions"].append(
                {
                    "type": "Finished",
                    "status": "True",
                    "reason": "Succeeded",
                    "message": "done",
                    "lastTransitionTime": "2026-08-25T11:00:00Z",
                }
            )
            await second.ctl.on_workload("MODIFIED", api.put("workloads", wl))
        assert len(second.cache.ledger) == 0
        assert api.objects("slicereservations") == []

    asyncio.run(body())


def test_stop_before_the_object_is_written_places_afresh_after_restart() -> None:
    async def body() -> None:
        clock, api, first = await lws_leader()
        api.fail_next("apply slicereservations", Crash())
        with pytest.raises(Crash):
            await first.watch_all(api)
        assert api.objects("slicereservations") == []

        second = Process(api, clock, "second")
        await take_lead(second.ctl.cache, second.ctl)
        await second.watch_all(api)
        assert entry(api, LWS[1])["state"] == "Ready"
        assert len(api.objects("slicereservations")) == 1
        assert len(second.cache.ledger) == 1

    asyncio.run(body())


def test_a_workload_deleted_while_down_has_its_reservation_released_on_restart() -> None:
    async def body() -> None:
        clock, api, first = await lws_leader()
        await first.watch_all(api)
        assert len(api.objects("slicereservations")) == 1

        # Deleted while no controller ran (and the garbage collector has not got to it yet).
        api.remove("workloads", LWS[1], LWS[0])
        second = Process(api, clock, "second")
        await take_lead(second.ctl.cache, second.ctl)
        assert len(second.cache.ledger) == 0
        assert api.objects("slicereservations") == []

    asyncio.run(body())


def test_overlapping_stored_reservations_are_never_both_restored() -> None:
    async def body() -> None:
        clock, api, first = await lws_leader()
        await first.watch_all(api)
        (obj,) = api.objects("slicereservations")
        # A second object claiming the same GPUs (a bug, or a hand edit) for another gang.
        twin = copy.deepcopy(obj)
        twin["metadata"]["name"] = "twin"
        twin["spec"]["gang"] = twin["spec"]["slice"]["gang"] = "serving/twin"
        twin["spec"]["meta"] = {}
        api.put("slicereservations", twin)

        second = Process(api, clock, "second")
        await take_lead(second.ctl.cache, second.ctl)
        assert len(second.cache.ledger) == 1 and second.cache.reservation(KEY) is not None
        held = held_gpus(second.cache)
        assert len(held) == len(set(held)) == 32
        assert len(api.objects("slicereservations")) == 1

    asyncio.run(body())
