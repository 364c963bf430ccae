"""SliceReservation status: written by whoever writes the object (the cluster cache's store for
plain gangs, the controllers for Workloads and PodGroups), rewritten when a slot binds or is
freed (Bound once every slot is), valid against the CRD, shown by its printer columns, and
never read back: a restart rebuilds the same ledger from spec."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.openapi import load_crd, validate, version_schema
from extender.controllers.podgroups.controller import PodGroupController
from extender.controllers.runner import take_lead
from extender.kube.api import Kind
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodInfo
from extender.placement.files import load_cluster
from extender.placement.ledger import Phase, Reservation
from extender.placement.slice import Slice
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore, KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.extender import gang_pod, node_obj
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube
from extender.testing.reserve import hold, reserve_gang

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crds" / "gangslice.io_slicereservations.yaml"
KUEUE = REPO / "tests" / "fixtures" / "kueue"
VOLCANO = REPO / "tests" / "fixtures" / "volcano"
T0 = datetime.fromisoformat("2026-08-25T10:00:00+00:00").timestamp()
PLURAL = "slicereservations"


def schema() -> dict[str, Any]:
    return version_schema(load_crd(CRD), "v1alpha1")


def status_writes(api: FakeKube) -> int:
    return api.labels().count("apply slicereservations/status")


def assert_status_matches(obj: dict[str, Any] | None, r: Reservation) -> dict[str, Any]:
    """The object's status says what the ledger holds; returns it."""
    assert obj is not None
    validate(schema(), obj, "SliceReservation")
    status: dict[str, Any] = obj["status"]
    assert status["phase"] == r.phase.value
    assert status["boundPods"] == dict(r.bound)
    assert status["nodes"] == ",".join(r.slice.nodes) and status["nodes"]
    assert status["gpus"] == r.slice.gpus > 0
    (held,) = status["conditions"]
    assert (held["type"], held["status"], held["reason"]) == ("Held", "True", r.phase.value)
    return status


def slots(r: Reservation) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(s.key, s.node, tuple(s.gpus)) for s in r.slice.slots]


def bind_all(cache: ClusterCache, gang: str, pod_names: list[str]) -> Reservation:
    r = cache.reservation(gang)
    assert r is not None
    for slot, pod in zip(r.slice.slots, pod_names, strict=True):
        r = cache.bind_slot(gang, slot.key, pod)
    return r


# -- the printer columns ------------------------------------------------------------------------


def test_the_printer_columns_read_phase_nodes_and_gpus_from_status() -> None:
    (version,) = load_crd(CRD)["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Nodes"] == ".status.nodes"
    assert columns["GPUs"] == ".status.gpus"
    assert columns["Age"] == ".metadata.creationTimestamp"


# -- plain gangs: the cluster cache's store ----------------------------------------------------


def plain_gang_cache(api: FakeKube, clock: FakeClock) -> ClusterCache:
    cache = ClusterCache(store=KubeReservationStore(api, clock), awaiting=(), clock=clock)
    cache.replace(Kind.NODES, [node_obj("a"), node_obj("b")])
    return cache


def two_pod_request() -> Any:
    request = plain_gang_request(PodInfo.from_obj(gang_pod("g-0", "g", 2, 8)))
    assert request is not None
    return request


def test_a_plain_gang_hold_writes_its_status_and_each_bind_rewrites_it() -> None:
    api = FakeKube()
    clock = FakeClock(T0)
    cache = plain_gang_cache(api, clock)

    async def go() -> None:
        assert isinstance(await reserve_gang(cache, "llm/g", two_pod_request()), Slice)
        r = cache.reservation("llm/g")
        assert r is not None
        first = assert_status_matches(api.peek(Kind.SLICE_RESERVATIONS, "g", "llm"), r)
        assert first["phase"] == "Reserved" and first["boundPods"] == {}
        assert first["gpus"] == 16 and sorted(first["nodes"].split(",")) == ["a", "b"]

        clock.now += 10
        one, two = (s.key for s in r.slice.slots)
        r = cache.bind_slot("llm/g", one, "g-0")
        await cache.flush()
        status = assert_status_matches(api.peek(Kind.SLICE_RESERVATIONS, "g", "llm"), r)
        assert status["phase"] == "Reserved" and status["boundPods"] == {one: "g-0"}

        r = cache.bind_slot("llm/g", two, "g-1")
        await cache.flush()
        status = assert_status_matches(api.peek(Kind.SLICE_RESERVATIONS, "g", "llm"), r)
        assert status["phase"] == "Bound" and status["boundPods"] == {one: "g-0", two: "g-1"}
        # Still held: the condition did not change, nor did its transition time.
        assert status["conditions"][0]["lastTransitionTime"] == first["conditions"][0]["lastTransitionTime"]

        r = cache.unbind_slot("llm/g", one)
        await cache.flush()
        status = assert_status_matches(api.peek(Kind.SLICE_RESERVATIONS, "g", "llm"), r)
        assert status["phase"] == "Reserved" and status["boundPods"] == {two: "g-1"}

        await cache.release_gang("llm/g")
        assert api.peek(Kind.SLICE_RESERVATIONS, "g", "llm") is None

    asyncio.run(go())
    assert status_writes(api) == 4


def test_an_unchanged_status_is_not_written_again() -> None:
    api = FakeKube()
    clock = FakeClock(T0)
    store = KubeReservationStore(api, clock)
    cache = plain_gang_cache(api, clock)
    assert isinstance(hold(cache, "llm/g", two_pod_request()), Slice)
    r = cache.reservation("llm/g")
    assert r is not None

    async def go() -> None:
        await store.save(r)
        clock.now += 30
        await store.save(r)  # a refreshed hold, say: spec again, the same status

    asyncio.run(go())
    assert status_writes(api) == 1
    assert api.labels().count("apply slicereservations") == 1


def test_a_failed_status_write_stays_queued_and_is_retried() -> None:
    api = FakeKube()
    clock = FakeClock(T0)
    cache = plain_gang_cache(api, clock)

    async def go() -> None:
        api.fail_next("apply slicereservations/status", RuntimeError("the API server is away"))
        await reserve_gang(cache, "llm/g", two_pod_request())
        assert cache.unflushed == 1
        obj = api.peek(Kind.SLICE_RESERVATIONS, "g", "llm")
        assert obj is not None and "status" not in obj
        await cache.flush()
        assert cache.unflushed == 0

    asyncio.run(go())
    r = cache.reservation("llm/g")
    assert r is not None
    assert_status_matches(api.peek(Kind.SLICE_RESERVATIONS, "g", "llm"), r)


def test_the_in_memory_store_keeps_status_too() -> None:
    clock = FakeClock(T0)
    store = InMemoryReservationStore(clock)
    cache = ClusterCache(store=store, awaiting=(), clock=clock)
    cache.replace(Kind.NODES, [node_obj("a"), node_obj("b")])

    async def go() -> None:
        await reserve_gang(cache, "llm/g", two_pod_request())
        bind_all(cache, "llm/g", ["g-0", "g-1"])
        await cache.flush()

    asyncio.run(go())
    r = cache.reservation("llm/g")
    assert r is not None and r.phase is Phase.BOUND
    assert assert_status_matches(store.objects[("llm", "g")], r)["phase"] == "Bound"


def test_a_restarted_cache_rebuilds_the_bound_plain_gang_from_spec_once() -> None:
    api = FakeKube()
    clock = FakeClock(T0)
    first = plain_gang_cache(api, clock)

    async def go() -> None:
        await reserve_gang(first, "llm/g", two_pod_request())
        bind_all(first, "llm/g", ["g-0", "g-1"])
        await first.flush()

        second = plain_gang_cache(api, clock)
        assert await second.rebuild_ledger() == 1
        assert await second.rebuild_ledger() == 1  # the same objects again: nothing doubled
        before, after = first.reservation("llm/g"), second.reservation("llm/g")
        assert before is not None and after is not None
        assert slots(after) == slots(before)
        assert after.bound == before.bound and after.phase is Phase.BOUND
        assert len(second.ledger) == 1
        assert second.ledger.held() == first.ledger.held()
        # Bound holds do not expire, after a restart as before it.
        clock.now += 10 * second.ledger.ttl_s
        assert second.expire() == []

    asyncio.run(go())


# -- Workloads (Kueue) ---------------------------------------------------------------------------


def kueue_world(api: FakeKube, clock: FakeClock, identity: str) -> tuple[ClusterCache, AdmissionController]:
    cache = ClusterCache.from_snapshot(
        load_cluster(KUEUE / "cluster.yaml"),
        clock=clock,
        store=KubeReservationStore(api, clock),
    )
    return cache, AdmissionController(api, cache, CheckConfig(), clock=clock, identity=identity)


def kueue_api() -> FakeKube:
    api = FakeKube()
    api.put("admissionchecks", load_fixture("kueue/admissioncheck.yaml"))
    api.put("resourceflavors", load_fixture("kueue/resourceflavor.yaml"))
    api.put("workloads", load_fixture("kueue/workload-lws.yaml"))
    return api


def test_a_workload_hold_writes_status_then_bound_through_the_cache_and_survives_a_restart() -> None:
    key = "serving/leaderworkerset-vllm-0-3f2a1"
    name = "leaderworkerset-vllm-0-3f2a1"

    async def go() -> None:
        clock = FakeClock(T0 + 5)
        api = kueue_api()
        cache, ctl = kueue_world(api, clock, "first")
        await take_lead(ctl.cache, ctl)
        for ac in api.objects("admissionchecks"):
            await ctl.on_admission_check(None, ac)
        for wl in api.objects("workloads"):
            await ctl.on_workload(None, wl)

        r = cache.reservation(key)
        assert r is not None
        status = assert_status_matches(api.peek(PLURAL, name, "serving"), r)
        assert status["phase"] == "Reserved" and status["gpus"] == 32
        assert api.labels().count("apply slicereservations/status") == 1

        pods = [f"vllm-{i}" for i in range(len(r.slice.slots))]
        r = bind_all(cache, key, pods)
        await cache.flush()
        obj = api.peek(PLURAL, name, "serving")
        status = assert_status_matches(obj, r)
        assert status["phase"] == "Bound"
        assert sorted(status["boundPods"].values()) == sorted(pods)
        assert obj is not None and obj["metadata"]["ownerReferences"][0]["kind"] == "Workload"

        # A new process rebuilds the same ledger from the object: bound, held once.
        again, second = kueue_world(api, clock, "second")
        for wl in api.objects("workloads"):
            await second.on_workload(None, wl)
        await take_lead(second.cache, second)
        back = again.reservation(key)
        assert back is not None
        assert slots(back) == slots(r)
        assert back.bound == r.bound and back.phase is Phase.BOUND
        assert len(again.ledger) == 1
        assert again.ledger.held() == cache.ledger.held()
        assert len(api.objects(PLURAL)) == 1

    asyncio.run(go())


# -- PodGroups (Volcano) ----------------------------------------------------------------------


def test_a_podgroup_hold_writes_status_then_bound_through_the_cache() -> None:
    key = "llm/llama-70b"

    async def go() -> None:
        clock = FakeClock(1_000.0)
        api = FakeKube()
        kube = api
        cache = ClusterCache.from_snapshot(
            load_cluster(VOLCANO / "cluster.yaml"), clock=clock, store=KubeReservationStore(kube, clock)
        )
        ctl = PodGroupController(api, cache, clock=clock)
        ctl.leader = True
        await ctl.on_podgroup("ADDED", api.put("podgroups", load_fixture("volcano/podgroup-llama.yaml")))
        pods = load_fixture("volcano/pods-llama.yaml")
        for p in pods:
            await ctl.on_pod("ADDED", p)

        r = cache.reservation(key)
        assert r is not None
        status = assert_status_matches(api.peek(PLURAL, "llama-70b", "llm"), r)
        assert status["phase"] == "Reserved" and status["gpus"] == 32
        assert len(status["nodes"].split(",")) == 4

        names = [p["metadata"]["name"] for p in pods]
        r = bind_all(cache, key, names)
        await cache.flush()
        obj = api.peek(PLURAL, "llama-70b", "llm")
        status = assert_status_matches(obj, r)
        assert status["phase"] == "Bound" and sorted(status["boundPods"].values()) == sorted(names)
        assert obj is not None and obj["metadata"]["ownerReferences"][0]["kind"] == "PodGroup"

        # The restore path reads the same reservation back from the object.
        again = ClusterCache.from_snapshot(
            load_cluster(VOLCANO / "cluster.yaml"), clock=clock, store=KubeReservationStore(kube, clock)
        )
        assert await again.rebuild_ledger() == 1
        back = again.reservation(key)
        assert back is not None and back.bound == r.bound and back.phase is Phase.BOUND

    asyncio.run(go())
