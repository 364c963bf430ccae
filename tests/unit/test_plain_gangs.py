"""Plain gangs (kube-scheduler + the extender only): a hold that expires before its members
bind is released and placed again on the next member's filter; a gang that can never fit
gets a Warning Event on each of its pods, once (nothing is written on the pods); a
LeaderWorkerSet whose templates carry the labels works unchanged, one gang per replica
group."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from extender.controllers.plain_gangs.reporter import PlainGangReporter, never_fits
from extender.httpapi.decide import Decider
from extender.kube.api import Kind
from extender.kube.gangs import Incomplete, plain_gang_request
from extender.kube.names import STATUS
from extender.kube.pods import PodInfo
from extender.placement.files import load_cluster
from extender.placement.request import Colocation, GangRequest
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore
from extender.testing.clock import FakeClock
from extender.testing.extender import gang_pod, node_obj
from extender.testing.kube import FakeKube
from extender.testing.objects import make_node_topology

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "volcano"
GANG = "serving/vllm-0"


def lws_pods() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((FIXTURES / "lws-pods.yaml").read_text()))


def cache_with(ttl_s: float = 30.0) -> tuple[ClusterCache, FakeClock, InMemoryReservationStore]:
    clock = FakeClock(100.0)
    store = InMemoryReservationStore()
    cache = ClusterCache.from_snapshot(
        load_cluster(FIXTURES / "cluster.yaml"), ttl_s=ttl_s, store=store, clock=clock
    )
    return cache, clock, store


def test_lws_pods_form_one_gang_per_group_placed_on_first_sight_and_pinned() -> None:
    cache, _, _ = cache_with()
    leader, worker = (PodInfo.from_obj(p) for p in lws_pods())
    assert leader.gang == worker.gang == GANG
    decider = Decider(cache)
    names = cache.node_names()
    got = decider.filter(leader, names)
    assert got.outcome == "reserved"
    r = cache.reservation(GANG)
    assert r is not None and len(r.slice.slots) == 2
    assert set(got.passed) <= set(r.slice.nodes)
    decider.plan_bind(leader, got.passed[0])
    w = decider.filter(worker, names)
    r = cache.reservation(GANG)
    assert r is not None and r.slot_of(leader.name) is not None
    free = {s.node for s in r.free_slots()}
    assert set(w.passed) == free and w.passed
    # Group 1 of the same LeaderWorkerSet is a gang of its own.
    other = copy.deepcopy(lws_pods()[0])
    other["metadata"]["name"] = "vllm-1"
    other["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] = "1"
    assert PodInfo.from_obj(other).gang == "serving/vllm-1"


def test_an_expired_hold_is_released_and_placed_again_on_the_next_members_filter() -> None:
    cache, clock, store = cache_with(ttl_s=30)
    leader, worker = (PodInfo.from_obj(p) for p in lws_pods())
    decider = Decider(cache)
    names = cache.node_names()
    assert decider.filter(leader, names).outcome == "reserved"
    asyncio.run(cache.flush())
    assert ("serving", "vllm-0") in store.objects
    clock.now += 31
    assert [r.gang for r in cache.expire()] == [GANG]
    asyncio.run(cache.flush())
    assert cache.reservation(GANG) is None and ("serving", "vllm-0") not in store.objects
    again = decider.filter(worker, names)
    assert again.outcome == "reserved"
    r = cache.reservation(GANG)
    assert r is not None and r.expires_at == clock.now + 30
    asyncio.run(cache.flush())
    assert ("serving", "vllm-0") in store.objects


def huge(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["annotations"]["gangslice.io/gang-size"] = "9"  # 72 GPUs; the cluster has 64
    return pod


def test_a_gang_that_can_never_fit_gets_a_warning_event_on_each_pod_once() -> None:
    cache, clock, _ = cache_with()
    api = FakeKube()
    reporter = PlainGangReporter(api, cache, clock=clock)
    reporter.leader = True
    pods = [huge(p) for p in lws_pods()]
    for p in pods:
        api.put("pods", p)
    for p in pods:
        asyncio.run(reporter.on_pod("ADDED", p))
    for p in pods:
        got = api.peek("pods", p["metadata"]["name"], "serving")
        assert got is not None and STATUS not in got["metadata"]["annotations"]
    # No write to any pod: the controller needs no pods: patch outside its namespace.
    assert [c.label for c in api.writes()] == ["create events"] * 2
    assert [(e["type"], e["reason"], e["involvedObject"]["name"]) for e in api.events] == [
        ("Warning", "NeverFits", p["metadata"]["name"]) for p in pods
    ]
    assert api.events[0]["message"].startswith(f"gang {GANG} can never fit")
    # The watch delivers the pod again (kube-scheduler's condition changed): nothing new is said.
    again = api.peek("pods", pods[0]["metadata"]["name"], "serving")
    assert again is not None
    asyncio.run(reporter.on_pod("MODIFIED", again))
    assert len(api.events) == 2
    # The extender answers the same gang unresolvable everywhere.
    out = Decider(cache).filter(PodInfo.from_obj(pods[0]), cache.node_names())
    assert not out.passed and set(out.unresolvable) == set(cache.node_names())


def test_a_gang_that_only_waits_for_capacity_is_not_reported() -> None:
    cache, clock, _ = cache_with()
    api = FakeKube()
    reporter = PlainGangReporter(api, cache, clock=clock)
    reporter.leader = True
    pod = lws_pods()[0]
    api.put("pods", pod)
    asyncio.run(reporter.on_pod("ADDED", pod))
    assert api.events == []
    request = plain_gang_request(PodInfo.from_obj(pod))
    assert request is not None
    assert never_fits(request, cache.snapshot()) is None
    assert never_fits(plain_gang_request(PodInfo.from_obj(huge(pod))), cache.snapshot()) is not None  # type: ignore[arg-type]


def test_a_hold_that_expires_after_some_members_bound_is_placed_again_for_the_rest_only() -> None:
    clock = FakeClock(100.0)
    cache = ClusterCache(ttl_s=30, clock=clock)
    for kind in Kind:
        cache.replace(kind, [])
    for name in ("a", "b", "c"):
        cache.apply(Kind.NODES, "ADDED", node_obj(name))
    pods = [gang_pod(f"g-{i}", "g", 3, 8) for i in range(3)]
    decider = Decider(cache)
    names = cache.node_names()
    first = decider.filter(PodInfo.from_obj(pods[0]), names)
    assert first.outcome == "reserved"
    r = cache.reservation("llm/g")
    assert r is not None
    slot = r.slice.slots[0]
    # g-0 binds and runs; the other two do not come within the TTL.
    decider.plan_bind(PodInfo.from_obj(pods[0]), slot.node)
    cache.apply(Kind.PODS, "ADDED", gang_pod("g-0", "g", 3, 8, node=slot.node, phase="Running"))
    clock.now += 31
    assert [x.gang for x in cache.expire()] == ["llm/g"]
    # The next member's filter places the two members still to come, not three.
    again = decider.filter(PodInfo.from_obj(pods[1]), names)
    assert again.outcome == "reserved"
    r = cache.reservation("llm/g")
    assert r is not None and len(r.slice.slots) == 2
    assert slot.node not in r.slice.nodes  # g-0's node is full


def test_a_gang_of_several_pod_sets_is_built_from_the_first_pod_of_each() -> None:
    def member(name: str, role: str, size: int, gpus: int, **extra: str) -> PodInfo:
        annotations = {"gangslice.io/gang-size": "6", "gangslice.io/pod-set-size": str(size), **extra}
        labels = {"gangslice.io/gang": "pd", "gangslice.io/pod-set": role}
        obj = gang_pod(name, "pd", 6, gpus)
        obj["metadata"]["labels"] = labels
        obj["metadata"]["annotations"] = annotations
        return PodInfo.from_obj(obj)

    prefill = member("p-0", "prefill", 2, 4, **{"gangslice.io/colocate-with": "decode@leaf"})
    waiting = plain_gang_request(prefill, [prefill])
    assert isinstance(waiting, Incomplete) and "2 of 6 pods" in waiting.reason
    decode = member("d-0", "decode", 4, 8, **{"gangslice.io/comm": "allreduce"})
    request = plain_gang_request(prefill, [decode, member("p-1", "prefill", 2, 4)])
    assert isinstance(request, GangRequest)
    sets = {ps.name: ps for ps in request.pod_sets}
    assert (sets["prefill"].count, sets["prefill"].gpus_per_pod) == (2, 4)
    decode_set = sets["decode"]
    assert (decode_set.count, decode_set.gpus_per_pod, decode_set.comm.value) == (4, 8, "allreduce")
    assert sets["prefill"].colocate_with == Colocation("decode", "leaf")
    # A finished pod of another pod set counts for nothing.
    gone = member("d-9", "decode", 4, 8)
    gone = dataclasses.replace(gone, phase="Succeeded")
    assert isinstance(plain_gang_request(prefill, [gone]), Incomplete)


def kube_cluster(*nodes: str) -> ClusterCache:
    """A cache fed as the watches feed it: 8-GPU HGX nodes, each with its NodeTopology."""
    cache = ClusterCache(clock=FakeClock(100.0))
    for kind in Kind:
        cache.replace(kind, [])
    for name in nodes:
        add_node(cache, name)
    return cache


def add_node(cache: ClusterCache, name: str) -> None:
    cache.apply(Kind.NODES, "ADDED", node_obj(name))
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(name).hgx_h100().obj())


def test_a_gang_that_never_fit_becomes_placeable_when_a_node_joins() -> None:
    cache = kube_cluster("a")
    api = FakeKube()
    reporter = PlainGangReporter(api, cache, clock=FakeClock(100.0))
    reporter.leader = True
    pods = [gang_pod(f"g-{i}", "g", 2, 8) for i in range(2)]
    for p in pods:
        api.put("pods", p)
    asyncio.run(reporter.on_pod("ADDED", pods[0]))
    assert [e["reason"] for e in api.events] == ["NeverFits"]
    generation = cache.node_generation
    add_node(cache, "b")
    assert cache.node_generation > generation
    # The next member is judged on the grown cluster: nothing said, and the extender places it.
    asyncio.run(reporter.on_pod("ADDED", pods[1]))
    assert [e["reason"] for e in api.events] == ["NeverFits"]
    out = Decider(cache).filter(PodInfo.from_obj(pods[1]), cache.node_names())
    assert out.outcome == "reserved"
    assert sorted(out.passed) == ["a", "b"]
    # Placed: its verdict is forgotten.
    asyncio.run(reporter.on_pod("MODIFIED", pods[0]))
    assert reporter.remembered == 0


def test_pod_churn_does_not_make_the_gang_judged_again() -> None:
    cache = kube_cluster("a")
    reporter = PlainGangReporter(FakeKube(), cache, clock=FakeClock(100.0))
    reporter.leader = True
    generation = cache.node_generation
    cache.apply(Kind.PODS, "ADDED", gang_pod("other", "x", 1, 1, node="a", phase="Running"))
    assert cache.node_generation == generation


def test_the_verdicts_are_forgotten_with_their_gangs_and_bounded(monkeypatch: Any) -> None:
    cache = kube_cluster("a")
    api = FakeKube()
    reporter = PlainGangReporter(api, cache, clock=FakeClock(100.0))
    reporter.leader = True
    for i in range(20):
        asyncio.run(reporter.on_pod("ADDED", gang_pod(f"g{i}-0", f"g{i}", 2, 8)))
    assert reporter.remembered == 20
    for i in range(20):
        asyncio.run(reporter.on_pod("DELETED", gang_pod(f"g{i}-0", f"g{i}", 2, 8)))
    assert reporter.remembered == 0
    monkeypatch.setattr("extender.controllers.plain_gangs.reporter.MAX_VERDICTS", 5)
    for i in range(20):
        asyncio.run(reporter.on_pod("ADDED", gang_pod(f"h{i}-0", f"h{i}", 2, 8)))
    assert reporter.remembered == 5
