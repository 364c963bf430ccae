"""Upstream Workload API PodGroups (``scheduling.k8s.io/v1beta1``) as gangs: a pod that joins one
through ``spec.schedulingGroup`` is in its gang, sized by ``minCount`` and the pods that live
(never by a hand-kept count), bound to the level its topology key names; a cluster that does not
serve the API is ready all the same."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from extender.httpapi.decide import Decider
from extender.kube.api import WORKLOAD_POD_GROUPS, Kind
from extender.kube.gangs import Incomplete, plain_gang_request
from extender.kube.names import GANG, POD_SET
from extender.kube.pod_groups import read_pod_group
from extender.kube.pods import PodError, PodInfo
from extender.kube.watch import Watcher
from extender.reservations import ClusterCache
from extender.testing.clock import FakeClock
from extender.testing.extender import node_obj
from extender.testing.hardware import CLIQUE, LEAF
from extender.testing.kube import FakeKube
from extender.testing.objects import (
    PodBuilder,
    make_node_topology,
    make_pod,
    make_pod_group,
    make_workload_pod_group,
)

GROUP = "llm/ep"


def cluster(leaves: dict[str, list[str]]) -> ClusterCache:
    cache = ClusterCache(clock=FakeClock(100.0))
    for kind in Kind:
        cache.replace(kind, [])
    for leaf, nodes in leaves.items():
        for name in nodes:
            cache.apply(Kind.NODES, "ADDED", node_obj(name, labels={LEAF: leaf, CLIQUE: f"c-{name}"}))
            cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(name).hgx_h100().obj())
    return cache


def group(cache: ClusterCache, **spec: Any) -> None:
    cache.apply(Kind.WORKLOAD_POD_GROUPS, "ADDED", make_workload_pod_group("ep", **spec))


def member(name: str, gpus: int = 4, role: str | None = None) -> PodBuilder:
    pod = make_pod(name).gpus(gpus).joins("ep")
    return pod.annotation(POD_SET, role) if role else pod


def filtered(cache: ClusterCache, decider: Decider, pod: PodBuilder) -> Any:
    cache.apply(Kind.PODS, "ADDED", pod.obj())
    return decider.filter(PodInfo.from_obj(pod.obj()), cache.node_names())


def why(out: Any) -> str:
    """The one reason the filter gave every node (failed or unresolvable)."""
    reasons = {**out.failed, **out.unresolvable}
    assert reasons, out
    return str(next(iter(reasons.values())))


def bind(cache: ClusterCache, decider: Decider, pod: PodBuilder) -> str:
    out = filtered(cache, decider, pod)
    assert out.passed, out.failed
    node = str(out.passed[0])
    plan = decider.plan_bind(PodInfo.from_obj(pod.obj()), node)
    cache.apply(Kind.PODS, "MODIFIED", pod.on_node(node).running().annotations(plan.annotations()).obj())
    return node


def slots(cache: ClusterCache) -> Counter[str]:
    r = cache.book.reservation(GROUP)
    assert r is not None
    return Counter(s.pod_set for s in r.slice.slots)


def test_a_pod_joins_the_gang_of_its_pod_group_unless_a_label_names_another() -> None:
    assert PodInfo.from_obj(member("a").obj()).gang == GROUP
    labelled = PodInfo.from_obj(member("a").label(GANG, "pd").obj())
    assert labelled.gang == "llm/pd" and not labelled.joins_pod_group
    assert PodInfo.from_obj(make_pod("a").obj()).pod_group is None


def test_min_count_sizes_the_gang_and_it_is_placed_whole_on_the_first_pod() -> None:
    cache = cluster({"leaf-1": ["a", "b"], "leaf-2": ["c", "d"]})
    group(cache, min_count=4, topology=LEAF)
    decider = Decider(cache)
    out = filtered(cache, decider, member("ep-0"))
    assert out.outcome == "reserved", out
    assert slots(cache) == Counter({"pods": 4})
    r = cache.book.reservation(GROUP)
    assert r is not None
    leaves = {cache.snapshot().node(s.node).labels[LEAF] for s in r.slice.slots}
    assert len(leaves) == 1, leaves  # the topology key bounds the gang to one leaf
    nodes = [bind(cache, decider, member(f"ep-{i}")) for i in range(4)]
    r = cache.book.reservation(GROUP)
    assert r is not None and r.complete and len(r.bound) == 4, nodes


def test_the_topology_key_is_required_and_a_gang_that_cannot_keep_it_waits() -> None:
    # Each node is its own clique: 4 pods of 4 GPUs cannot share one.
    cache = cluster({"leaf-1": ["a", "b"]})
    group(cache, min_count=4, topology=CLIQUE)
    out = filtered(cache, Decider(cache), member("ep-0"))
    assert not out.passed and cache.book.reservation(GROUP) is None
    assert "clique" in why(out)


def test_a_topology_key_that_names_no_level_is_refused_naming_the_levels() -> None:
    cache = cluster({"leaf-1": ["a"]})
    group(cache, min_count=2, topology="example.com/row")
    out = filtered(cache, Decider(cache), member("ep-0"))
    reason = why(out)
    assert not out.passed and "example.com/row" in reason and LEAF in reason, reason


def test_scale_up_grows_the_gang_and_scale_down_frees_the_slots() -> None:
    cache = cluster({"leaf-1": ["a", "b", "c"]})
    group(cache, min_count=2, topology=LEAF)
    decider = Decider(cache)
    pods = [member(f"ep-{i}") for i in range(4)]
    for p in pods[:2]:
        bind(cache, decider, p)
    assert slots(cache) == Counter({"pods": 2})
    for p in pods[2:]:
        bind(cache, decider, p)  # no hand-kept size follows the scale: the pods are counted
    assert slots(cache) == Counter({"pods": 4})
    for p in pods[2:]:
        cache.apply(Kind.PODS, "DELETED", p.obj())
    assert slots(cache) == Counter({"pods": 2})  # minCount stays held


def test_a_lost_pods_replacement_takes_its_slot() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    group(cache, min_count=2)
    decider = Decider(cache)
    pods = [member(f"ep-{i}") for i in range(2)]
    placed = [bind(cache, decider, p) for p in pods]
    r = cache.book.reservation(GROUP)
    assert r is not None
    lost = r.slot_of("ep-0")
    cache.apply(Kind.PODS, "DELETED", pods[0].obj())
    assert slots(cache) == Counter({"pods": 2})
    node = bind(cache, decider, member("ep-0b"))
    r = cache.book.reservation(GROUP)
    mine = r.slot_of("ep-0b") if r is not None else None
    assert lost is not None and mine is not None
    assert (node, mine.gpus) == (lost.node, lost.gpus), placed


def test_pod_sets_that_differ_wait_for_min_count_pods_then_are_placed_together() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    group(cache, min_count=3)
    decider = Decider(cache)
    out = filtered(cache, decider, member("lead", 2, role="leader"))
    assert out.outcome == "reserved"  # one pod set so far: minCount pods alike
    cache = cluster({"leaf-1": ["a", "b"]})
    group(cache, min_count=3)
    decider = Decider(cache)
    cache.apply(Kind.PODS, "ADDED", member("lead", 2, role="leader").obj())
    out = filtered(cache, decider, member("w-0", 4, role="worker"))
    assert not out.passed and "2 of its minCount 3 pods live" in why(out)
    out = filtered(cache, decider, member("w-1", 4, role="worker"))
    assert out.outcome == "reserved", out
    assert slots(cache) == Counter({"leader": 1, "worker": 2})


def test_a_labelled_plain_gang_keeps_its_own_size_beside_a_pod_group_of_its_name() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    group(cache, min_count=4, topology=CLIQUE)  # each node its own clique: 4 x 4 GPUs cannot fit
    pod = make_pod("ep-0").gpus(4).gang("ep", 2)
    out = filtered(cache, Decider(cache), pod)
    assert out.outcome == "reserved", out
    assert slots(cache) == Counter({"pods": 2})  # gangslice.io/gang-size, not minCount 4


def test_a_pod_whose_pod_group_is_not_seen_waits_saying_so() -> None:
    cache = cluster({"leaf-1": ["a"]})
    got = plain_gang_request(PodInfo.from_obj(member("ep-0").obj()), (), cache.owners)
    assert isinstance(got, Incomplete) and "PodGroup llm/ep" in got.reason


def test_a_basic_pod_group_is_a_group_of_its_live_pods() -> None:
    pg = read_pod_group(make_workload_pod_group("ep", topology=LEAF))
    assert pg.min_count == 1 and pg.topology_keys == (LEAF,) and pg.problem is None


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"schedulingPolicy": {"gang": {"minCount": 0}}}, "minCount 0"),
        ({"schedulingPolicy": {"gang": {"minCount": "4"}}}, "minCount '4'"),
        ({"schedulingConstraints": {"topology": [{"key": ""}]}}, "topology[0].key"),
    ],
)
def test_a_pod_group_that_cannot_be_read_refuses_its_pods_naming_the_field(
    spec: dict[str, Any], words: str
) -> None:
    obj = {"metadata": {"name": "ep", "namespace": "llm"}, "spec": spec}
    assert words in (read_pod_group(obj).problem or "")
    cache = cluster({"leaf-1": ["a"]})
    cache.apply(Kind.WORKLOAD_POD_GROUPS, "ADDED", obj)
    with pytest.raises(PodError, match="PodGroup llm/ep"):
        plain_gang_request(PodInfo.from_obj(member("ep-0").obj()), (), cache.owners)


def test_volcano_and_workload_pod_groups_do_not_meet_in_the_fake_api() -> None:
    kube = FakeKube()
    kube.put(WORKLOAD_POD_GROUPS, make_workload_pod_group("ep", min_count=2))
    kube.put("podgroups", make_pod_group("ep").obj())
    assert [o["kind"] for o in kube.objects(WORKLOAD_POD_GROUPS)] == ["PodGroup"]
    assert kube.objects(WORKLOAD_POD_GROUPS)[0]["apiVersion"] == "scheduling.k8s.io/v1beta1"
    (volcano,) = kube.objects("podgroups")
    assert volcano["apiVersion"].startswith("scheduling.volcano.sh"), volcano


def test_a_cluster_that_does_not_serve_pod_groups_is_listed_empty_and_asked_again() -> None:
    async def main() -> tuple[set[Kind], int, bool]:
        kube = FakeKube()
        kube.unserved.add("scheduling.k8s.io")
        cache = ClusterCache(clock=FakeClock(100.0))
        watcher = Watcher(kube, cache, (Kind.WORKLOAD_POD_GROUPS,), absent_retry_s=0.05)
        task = asyncio.create_task(watcher.run())
        await asyncio.sleep(0.3)
        listed = {k for k in Kind if k not in cache.awaiting}
        kube.unserved.clear()
        kube.put(WORKLOAD_POD_GROUPS, make_workload_pod_group("ep", min_count=2))
        await asyncio.sleep(0.3)
        seen = cache.owners.group("llm/ep") is not None
        watcher.stop()
        kube.close()
        await asyncio.wait_for(task, 5)
        return listed, watcher.stats.errors, seen

    listed, errors, seen = asyncio.run(main())
    assert Kind.WORKLOAD_POD_GROUPS in listed and errors == 0
    assert seen  # served later: read then
