"""Feeding the cache from the (fake) API server: list, watch, relist after 410 Gone, and the
Kubernetes reservation store and binder over the same fake."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from extender.kube import names as keys
from extender.kube.api import Kind, KubeError
from extender.kube.binder import ApiBinder
from extender.kube.crd_models import reservation_object
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodInfo
from extender.kube.watch import Watcher
from extender.placement.slice import Slice
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.extender import gang_pod, node_obj, pod_obj
from extender.testing.kube import FakeKube
from extender.testing.reserve import hold, reserve_gang

T = TypeVar("T")


async def eventually(check: Callable[[], bool], what: str, tries: int = 400) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


def with_watcher(api: FakeKube, cache: ClusterCache, body: Callable[[Watcher], Awaitable[T]]) -> T:
    async def go() -> T:
        watcher = Watcher(api, cache, watch_timeout_s=0.5, retry_s=0.05)
        task = asyncio.create_task(watcher.run())
        try:
            return await body(watcher)
        finally:
            watcher.stop()
            api.close()
            task.cancel()

    return asyncio.run(go())


def test_ready_after_the_first_list_of_every_kind_and_events_apply() -> None:
    api = FakeKube()
    api.put(Kind.NODES, node_obj("a"))
    api.put(Kind.PODS, pod_obj("x", gpus=2, node="a", annotations={keys.GPUS: "6,7"}, phase="Running"))
    cache = ClusterCache()
    assert not cache.ready

    async def body(w: Watcher) -> None:
        await eventually(lambda: cache.ready, "cache ready")
        assert cache.snapshot().free_gpus("a") == frozenset(range(6))
        api.put(Kind.NODES, node_obj("b"))
        api.put(Kind.PODS, pod_obj("y", gpus=1, node="b", phase="Running"))
        await eventually(lambda: cache.node_names() == ["a", "b"], "node b seen")
        await eventually(lambda: cache.snapshot().free_gpus("b") == frozenset(range(1, 8)), "pod y seen")
        api.remove(Kind.PODS, "x", "llm")
        await eventually(lambda: cache.snapshot().free_gpus("a") == frozenset(range(8)), "pod x gone")

    with_watcher(api, cache, body)


def test_410_gone_relists_without_dropping_state() -> None:
    api = FakeKube()
    api.put(Kind.NODES, node_obj("a"))
    cache = ClusterCache()

    async def body(w: Watcher) -> None:
        await eventually(lambda: cache.ready, "cache ready")
        lists_before = w.stats.lists[Kind.NODES]
        api.compact()  # history gone: the next watch from an old resourceVersion is 410
        api.put(Kind.NODES, node_obj("b"))
        await eventually(lambda: w.stats.lists[Kind.NODES] > lists_before, "nodes listed again")
        await eventually(lambda: cache.node_names() == ["a", "b"], "node b after relist")
        assert cache.ready

    with_watcher(api, cache, body)
    assert "list nodes" in api.labels()


def test_a_failing_watch_is_retried() -> None:
    api = FakeKube()
    api.fail_next("list", KubeError(0, "connection refused"))
    api.put(Kind.NODES, node_obj("a"))
    cache = ClusterCache(awaiting=[Kind.NODES])

    async def body(w: Watcher) -> None:
        await eventually(lambda: cache.ready, "cache ready after a failed list")
        assert w.stats.errors >= 1
        assert cache.node_names() == ["a"]

    with_watcher(api, cache, body)


def test_reservation_objects_from_the_api_rebuild_the_ledger_after_a_restart() -> None:
    api = FakeKube()
    for n in ("a", "b"):
        api.put(Kind.NODES, node_obj(n))
    first = ClusterCache(store=KubeReservationStore(api))
    request = plain_gang_request(PodInfo.from_obj(gang_pod("g-0", "g", 2, 8)))
    assert request is not None

    async def place(w: Watcher) -> Slice:
        await eventually(lambda: first.ready, "first ready")
        got = await reserve_gang(first, "llm/g", request)
        assert isinstance(got, Slice)
        return got

    placed = with_watcher(api, first, place)
    objs = api.objects(Kind.SLICE_RESERVATIONS)
    assert len(objs) == 1 and objs[0]["metadata"] == {**objs[0]["metadata"], "namespace": "llm", "name": "g"}

    second = ClusterCache(store=KubeReservationStore(api))
    api.closed = False

    async def rebuilt(w: Watcher) -> None:
        await eventually(lambda: second.ready, "second ready")
        assert len(second.ledger) == 0  # the watch feeds the cache; the ledger waits for the lead
        assert await second.rebuild_ledger() == 1

    with_watcher(api, second, rebuilt)
    r = second.reservation("llm/g")
    assert r is not None and r.slice.to_dict() == placed.to_dict()
    assert len(second.ledger) == 1


def test_kube_store_updates_and_deletes_its_object() -> None:
    api = FakeKube()
    cache = ClusterCache(store=KubeReservationStore(api), awaiting=())
    cache.replace(Kind.NODES, [node_obj("a")])
    request = plain_gang_request(PodInfo.from_obj(gang_pod("g-0", "g", 1, 8)))
    assert request is not None

    async def go() -> None:
        await reserve_gang(cache, "llm/g", request)
        cache.bind_slot("llm/g", "pods/0", "g-0")
        await cache.flush()
        obj = api.peek(Kind.SLICE_RESERVATIONS, "g", "llm")
        assert obj is not None and obj["spec"]["bound"] == {"pods/0": "g-0"}
        cache.unbind_slot("llm/g", "pods/0")
        await cache.flush()
        obj = api.peek(Kind.SLICE_RESERVATIONS, "g", "llm")
        assert obj is not None and obj["spec"]["bound"] == {}
        await cache.release_gang("llm/g")
        assert api.peek(Kind.SLICE_RESERVATIONS, "g", "llm") is None

    asyncio.run(go())


def test_a_failed_save_stays_queued_and_is_retried() -> None:
    api = FakeKube()
    cache = ClusterCache(store=KubeReservationStore(api), awaiting=())
    cache.replace(Kind.NODES, [node_obj("a")])
    request = plain_gang_request(PodInfo.from_obj(gang_pod("g-0", "g", 1, 8)))
    assert request is not None
    api.fail_next("apply slicereservations", KubeError(500, "etcd is sad"))

    async def go() -> None:
        await reserve_gang(cache, "llm/g", request)
        assert cache.unflushed == 1
        assert api.objects(Kind.SLICE_RESERVATIONS) == []
        await cache.flush()
        assert cache.unflushed == 0

    asyncio.run(go())
    assert len(api.objects(Kind.SLICE_RESERVATIONS)) == 1


def test_api_binder_binds_with_the_annotations_in_one_write() -> None:
    api = FakeKube()
    api.put(Kind.PODS, pod_obj("x", gpus=2, uid="u-x"))
    pod = PodInfo.from_obj(pod_obj("x", gpus=2, uid="u-x"))
    asyncio.run(ApiBinder(api).bind(pod, "a", {keys.GPUS: "0,1", keys.NUMA_NODE: "0"}))
    stored = api.peek(Kind.PODS, "x", "llm")
    assert stored is not None
    assert stored["spec"]["nodeName"] == "a"
    assert stored["metadata"]["annotations"][keys.GPUS] == "0,1"
    assert api.labels() == ["create pods/binding"]
    assert api.writes()[0].caller == "extender.kube.binder"


def test_reservation_object_shape_matches_the_crd_contract() -> None:
    cache = ClusterCache(awaiting=())
    cache.replace(Kind.NODES, [node_obj("a")])
    request = plain_gang_request(PodInfo.from_obj(gang_pod("g-0", "g", 1, 8)))
    assert request is not None
    assert isinstance(hold(cache, "llm/g", request), Slice)
    r = cache.reservation("llm/g")
    assert r is not None
    obj = reservation_object(r)
    assert obj["apiVersion"] == "gangslice.io/v1alpha1" and obj["kind"] == "SliceReservation"
    assert set(obj["spec"]) == {"gang", "slice", "expiresAt", "bound", "phase", "meta"}
    assert obj["spec"] == r.to_dict()
