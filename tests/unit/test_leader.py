"""Leader election on a coordination.k8s.io Lease: one leader at a time, take-over only after
the lease lapses, the ledger rebuilt before the leader decides, a clean hand-over on exit."""

from __future__ import annotations

import asyncio
from typing import Any

from extender.controllers.leader import (
    LeaderElector,
    LeaseConfig,
    LeaseRecord,
    claim,
    lease_body,
    lease_from_object,
)
from extender.kube.api import ApiError, Conflict
from extender.testing.clock import FakeClock
from extender.testing.controller_api import FakeControllerApi

CFG = LeaseConfig(
    namespace="gangslice-system", name="gangslice", duration_s=15, renew_deadline_s=10, retry_period_s=2
)
T0 = 1_756_116_000.0


class Candidate:
    def __init__(self, api: FakeControllerApi, clock: FakeClock, name: str, log: list[str]) -> None:
        self.log = log
        self.name = name
        self.elector = LeaderElector(api, CFG, name, self.started, self.stopped, clock)

    async def started(self) -> None:
        # The controller rebuilds its ledger here; it is not yet allowed to decide.
        assert not self.elector.leading
        self.log.append(f"{self.name} started")

    def stopped(self) -> None:
        self.log.append(f"{self.name} stopped")


def test_claim_rules() -> None:
    new = claim(None, "a", T0, 15)
    assert new == LeaseRecord("a", 15, T0, T0, 0)
    held = LeaseRecord("a", 15, T0, T0, 0, "7")
    assert claim(held, "a", T0 + 5, 15) == LeaseRecord("a", 15, T0, T0 + 5, 0, "7")
    assert claim(held, "b", T0 + 14.9, 15) is None
    taken = claim(held, "b", T0 + 15, 15)
    assert taken is not None and (taken.holder, taken.acquired, taken.transitions) == ("b", T0 + 15, 1)
    released = LeaseRecord(None, 15, T0, None, 3, "9")
    got = claim(released, "b", T0 + 1, 15)
    assert got is not None and (got.holder, got.transitions) == ("b", 4)


def test_lease_object_round_trip() -> None:
    rec = LeaseRecord("pod-a_1234", 15, T0 + 0.5, T0 + 2.25, 2, "41")
    body = lease_body(CFG, rec)
    assert body["apiVersion"] == "coordination.k8s.io/v1" and body["kind"] == "Lease"
    assert body["metadata"] == {"name": "gangslice", "namespace": "gangslice-system", "resourceVersion": "41"}
    assert body["spec"]["renewTime"] == "2025-08-25T10:00:02.250000Z"
    assert lease_from_object(body) == rec


def test_one_leader_and_take_over_only_after_the_lease_lapses() -> None:
    async def body() -> None:
        api, clock, log = FakeControllerApi(), FakeClock(T0), list[str]()
        a, b = Candidate(api, clock, "a", log), Candidate(api, clock, "b", log)
        await a.elector.step()
        await b.elector.step()
        assert (a.elector.leading, b.elector.leading) == (True, False)
        for _ in range(5):  # a keeps renewing; b keeps waiting
            clock.now += CFG.retry_period_s * 3
            await a.elector.step()
            await b.elector.step()
            assert (a.elector.leading, b.elector.leading) == (True, False)
        # a hangs (no more renewals); b takes over once the lease has lapsed, not before.
        clock.now += CFG.duration_s - 1
        await b.elector.step()
        assert not b.elector.leading
        clock.now += 1
        await b.elector.step()
        assert b.elector.leading
        lease = api.get("leases", "gangslice", "gangslice-system")
        assert lease is not None and lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        # a wakes up: it cannot renew, and steps down once its renew deadline has passed.
        await a.elector.step()
        assert not a.elector.leading
        assert log == ["a started", "b started", "a stopped"]

    asyncio.run(body())


def test_a_leader_that_cannot_reach_the_api_steps_down_after_the_renew_deadline() -> None:
    async def body() -> None:
        api, clock, log = FakeControllerApi(), FakeClock(T0), list[str]()
        a = Candidate(api, clock, "a", log)
        await a.elector.step()
        assert a.elector.leading
        clock.now += CFG.renew_deadline_s - 1
        api.fail_next("get_lease", ApiError(0, "connection refused"))
        await a.elector.step()
        assert a.elector.leading  # still within the deadline
        clock.now += 1
        api.fail_next("get_lease", ApiError(0, "connection refused"))
        await a.elector.step()
        assert not a.elector.leading
        assert log == ["a started", "a stopped"]

    asyncio.run(body())


def test_a_lost_write_race_does_not_make_a_leader() -> None:
    async def body() -> None:
        api, clock, log = FakeControllerApi(), FakeClock(T0), list[str]()
        a = Candidate(api, clock, "a", log)
        api.fail_next("create_lease", Conflict(409, "leases gangslice already exists"))
        await a.elector.step()
        assert not a.elector.leading and log == []

    asyncio.run(body())


def test_a_failed_rebuild_is_retried_before_leading() -> None:
    async def body() -> None:
        api, clock = FakeControllerApi(), FakeClock(T0)
        calls: list[str] = []

        async def started() -> None:
            calls.append("rebuild")
            if len(calls) == 1:
                raise ApiError(503, "the server is currently unable to handle the request")

        elector = LeaderElector(api, CFG, "a", started, lambda: None, clock)
        await elector.step()
        assert not elector.leading
        clock.now += CFG.retry_period_s
        await elector.step()
        assert elector.leading and calls == ["rebuild", "rebuild"]

    asyncio.run(body())


def test_run_gives_the_lease_up_on_stop() -> None:
    async def body() -> None:
        api, log = FakeControllerApi(), []
        fast = LeaseConfig(CFG.namespace, CFG.name, duration_s=15, renew_deadline_s=10, retry_period_s=0.01)
        a = LeaderElector(api, fast, "a", _noop, lambda: log.append("a stopped"))
        stop = asyncio.Event()
        task = asyncio.create_task(a.run(stop))
        while not a.leading:
            await asyncio.sleep(0.01)
        stop.set()
        await task
        assert log == ["a stopped"]
        lease: Any = api.get("leases", "gangslice", "gangslice-system")
        assert lease["spec"]["holderIdentity"] is None
        # Another candidate takes it at once, without waiting for it to lapse.
        b = LeaderElector(api, fast, "b", _noop, lambda: None)
        await b.step()
        assert b.leading

    asyncio.run(body())


async def _noop() -> None:
    return None
