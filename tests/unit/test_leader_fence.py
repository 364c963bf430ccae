"""A leader whose process stalls past its lease acts on nothing when it wakes: its fence (its
own clock against its last renewal) refuses decisions, Bindings and reservation writes before
they reach the API, so no GPU is promised by two replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extender.controllers.leader import LeaderElector, LeaseConfig
from extender.httpapi.app import build_app
from extender.kube.api import PODS, SLICE_RESERVATIONS
from extender.kube.binder import ApiBinder
from extender.kube.fence import Deposed, Fence
from extender.kube.pods import PodInfo
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, gang_pod, write_cluster
from extender.testing.kube import FakeKube

CFG = LeaseConfig(namespace="gs", name="ctl", duration_s=15, renew_deadline_s=10, retry_period_s=2)


async def _noop() -> None:
    return None


def _electors(api: FakeKube) -> tuple[FakeClock, list[tuple[LeaderElector, FakeClock]]]:
    """Two replicas on one Lease: a shared wall clock (the Lease's times) and a monotonic
    clock of each process (its fence)."""
    wall = FakeClock(1_756_116_000.0)
    out = []
    for name in ("a", "b"):
        mono = FakeClock(0.0)
        out.append((LeaderElector(api, CFG, name, _noop, lambda: None, wall, fence=Fence(mono)), mono))
    return wall, out


def _stall(seconds: float, *clocks: FakeClock) -> None:
    for clock in clocks:
        clock.advance(seconds)


def test_a_stalled_leader_binds_nothing_when_it_wakes() -> None:
    async def body() -> None:
        api = FakeKube()
        api.put(PODS, gang_pod("w-0", "g", 1, 4))
        wall, [(a, a_mono), (b, b_mono)] = _electors(api)
        await a.step()
        await b.step()
        assert a.leading and a.fence.holds() and not b.fence.holds()
        # a's process stops (SIGSTOP) for longer than the lease; b takes over and leads.
        _stall(CFG.duration_s + 1, wall, a_mono, b_mono)
        await b.step()
        assert b.leading and b.fence.holds()
        # a wakes: its election task has not run yet and still says it leads, but a bind
        # queued meanwhile is refused before it reaches the API.
        assert a.leading and not a.fence.holds()
        pod = PodInfo.from_obj(gang_pod("w-0", "g", 1, 4))
        with pytest.raises(Deposed, match=r"not renewed the leader lease for 6\.0 s"):
            await ApiBinder(api, a.fence).bind(pod, "h-0", {"gangslice.io/gpus": "0,1,2,3"})
        assert not [c for c in api.writes(PODS) if c.subresource == "binding"]
        assert a.fence.refused == 1
        await a.step()
        assert not a.leading
        await ApiBinder(api, b.fence).bind(pod, "h-1", {"gangslice.io/gpus": "0,1,2,3"})
        assert (api.peek(PODS, "w-0", "llm") or {})["spec"]["nodeName"] == "h-1"

    asyncio.run(body())


def test_renewals_keep_the_fence_open_and_a_failed_one_lets_it_close() -> None:
    async def body() -> None:
        api = FakeKube()
        wall, [(a, mono), _] = _electors(api)
        await a.step()
        for _ in range(10):  # renewing every 2 s keeps a's fence open
            _stall(CFG.retry_period_s, wall, mono)
            await a.step()
            assert a.fence.holds()
        api.fail_next("get leases", Exception("connection refused"))
        _stall(CFG.renew_deadline_s - 0.1, wall, mono)
        assert a.fence.holds()  # within the deadline of the last renewal
        _stall(0.2, wall, mono)
        assert not a.fence.holds()  # past it, before the election task has even run

    asyncio.run(body())


def test_a_stalled_leaders_queued_reservation_write_is_not_written(tmp_path: Path) -> None:
    """The extender's own path: the filter reserved the gang and the write was queued; the
    leader stalls; on waking, neither the write nor a bind reaches the API."""

    async def body() -> None:
        api = FakeKube()
        member = gang_pod("g-0", "g", 2, 8)
        api.put(PODS, member)
        cache = ClusterCache.from_cluster_file(write_cluster(tmp_path), store=KubeReservationStore(api))
        mono = FakeClock(0.0)
        fence = cache.book.fence
        fence.clock = mono
        fence.elect()
        fence.hold_until(CFG.renew_deadline_s)
        fence.leading = True
        app = build_app(cache, api=api)
        async with client_for(app) as client:
            body = {"Pod": member, "Nodes": None, "NodeNames": list(SMALL_CLUSTER_NODES)}
            got = await (await client.post("/gangslice/filter", json=body)).json()
            assert got["Error"] == "" and got["NodeNames"]
            written = len(api.writes(SLICE_RESERVATIONS))
            mono.advance(CFG.duration_s + 1)  # the stall
            await cache.book.flush()
            assert len(api.writes(SLICE_RESERVATIONS)) == written
            bind = {"PodName": "g-0", "PodNamespace": "llm", "PodUID": "", "Node": got["NodeNames"][0]}
            reply = await (await client.post("/gangslice/bind", json=bind)).json()
            assert "standby" in reply["Error"]
            assert not [c for c in api.writes(PODS) if c.subresource == "binding"]

    asyncio.run(body())
