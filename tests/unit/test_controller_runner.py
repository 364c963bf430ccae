"""The one runner of the reconcile loops: the housekeeping pass on the leader only, a replica
that decides alone, and pods watched once (the cache's watch hands pod events to the
PodGroup controller and the plain-gang reporter; kopf watches no pods)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kopf

from extender.controllers.handlers import register
from extender.controllers.housekeeping import Housekeeping
from extender.controllers.pods import PodFeed
from extender.controllers.runner import run_controller
from extender.kube import names as keys
from extender.kube.api import Kind
from extender.kube.watch import Watcher
from extender.placement.request import GangRequest, PodSet
from extender.reservations import ClusterCache
from extender.testing.extender import gang_pod, node_obj, pod_obj, write_cluster
from extender.testing.kube import FakeKube
from extender.testing.reserve import hold


def expired_hold(tmp_path: Path) -> ClusterCache:
    now = [0.0]
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path), ttl_s=10.0, clock=lambda: now[0])
    hold(cache, "llm/g", GangRequest("g", (PodSet("w", 1, 8),)))
    now[0] = 100.0  # long past the TTL
    return cache


def test_housekeeping_expires_holds_on_the_leader_only(tmp_path: Path) -> None:
    cache = expired_hold(tmp_path)
    leading = [False]

    async def two_rounds() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(Housekeeping(cache, every_s=0.01).run(stop, lambda: leading[0]))
        await asyncio.sleep(0.1)
        assert cache.reservation("llm/g") is not None  # the standby leaves it alone
        leading[0] = True
        await asyncio.sleep(0.1)
        stop.set()
        await task

    asyncio.run(two_rounds())
    assert cache.reservation("llm/g") is None


def test_a_replica_deciding_alone_runs_the_housekeeping_without_an_api(tmp_path: Path) -> None:
    cache = expired_hold(tmp_path)

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_controller(cache, stop=stop, housekeeping=Housekeeping(cache, every_s=0.01), elect=False)
        )
        for _ in range(200):
            if cache.reservation("llm/g") is None:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(go())
    assert cache.reservation("llm/g") is None


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str]] = []

    async def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        self.seen.append((event_type, obj["metadata"]["name"]))


def test_pod_events_reach_the_controllers_from_the_caches_own_watch() -> None:
    api = FakeKube()
    api.put(Kind.NODES, node_obj("a"))
    api.put(Kind.PODS, gang_pod("listed", "g", 2, 1))  # there before the watch: a list item
    cache = ClusterCache()
    podgroups, plain = Recorder(), Recorder()

    async def go() -> None:
        feed = PodFeed()
        watcher = Watcher(api, cache, watch_timeout_s=0.5, retry_s=0.05)
        watcher.listen(Kind.PODS, feed.tell)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(watcher.run()), asyncio.create_task(feed.run(stop, podgroups, plain))]
        while not cache.ready:
            await asyncio.sleep(0.01)
        api.put(Kind.PODS, pod_obj("member", annotations={keys.VOLCANO_GROUP: "pg"}))
        api.put(Kind.PODS, pod_obj("stranger"))  # neither: nobody hears of it
        api.remove(Kind.PODS, "listed", "llm")
        for _ in range(200):
            if len(plain.seen) == 2 and podgroups.seen and feed.pending == 0:
                break
            await asyncio.sleep(0.01)
        # The cache saw every pod: the reactions come from the one watch that fed it.
        assert cache.pods_watched and cache.pod("llm", "stranger") is not None
        stop.set()
        watcher.stop()
        api.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    assert podgroups.seen == [("ADDED", "member")]
    assert plain.seen == [(None, "listed"), ("DELETED", "listed")]


def test_kopf_watches_no_pods() -> None:
    class Controller:
        kueue = True

        async def on_podgroup(self, event_type: str | None, obj: Mapping[str, Any]) -> None: ...

    registry = kopf.OperatorRegistry()
    register(registry, Controller(), None, Controller())  # type: ignore[arg-type]
    watched = {h.selector.any_name for h in registry._watching.get_all_handlers()}
    assert watched == {"admissionchecks", "workloads", "podgroups"}
