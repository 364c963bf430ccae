"""Plain gangs whose pods a ReplicaSet (a Deployment's) or a StatefulSet owns: the owners size
the pod sets (no size annotation), a rolling update's surge pod and a scale-up's new pod get a
slot near the slice, and slots nobody wants any more are freed (a scale-down, the old pod of a
rolling update gone). No GPU is ever promised twice."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from extender.httpapi.decide import Decider
from extender.kube.api import Kind
from extender.kube.names import GANG, POD_SET, REQUIRED_LEVEL
from extender.kube.owners import OwnerTable, PodSetSize
from extender.kube.pods import PodInfo
from extender.placement.growth import near_slice
from extender.placement.ledger import Ledger, LedgerError, Reservation
from extender.placement.request import PodSet
from extender.placement.slice import PodSlot, Slice
from extender.reservations import ClusterCache
from extender.testing.builders import make_cluster, make_node
from extender.testing.clock import FakeClock
from extender.testing.extender import node_obj
from extender.testing.hardware import LEAF
from extender.testing.objects import PodBuilder, make_node_topology, make_pod, make_replica_set

GANG_KEY = "llm/pd"


def cluster(leaves: dict[str, list[str]]) -> ClusterCache:
    """8-GPU HGX nodes under leaves, fed as the watches feed them."""
    cache = ClusterCache(clock=FakeClock(100.0))
    for kind in Kind:
        cache.replace(kind, [])
    for leaf, nodes in leaves.items():
        for name in nodes:
            cache.apply(Kind.NODES, "ADDED", node_obj(name, labels={LEAF: leaf}))
            cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(name).hgx_h100().obj())
    return cache


def member(name: str, role: str, gpus: int, **annotations: str) -> PodBuilder:
    return make_pod(name).gpus(gpus).label(GANG, "pd").label(POD_SET, role).annotations(annotations)


def owner(
    cache: ClusterCache, role: str, gpus: int, desired: int, most: int, revision: int = 1, **ann: str
) -> None:
    rs = make_replica_set(f"{role}-r{revision}").template(member("t", role, gpus, **ann))
    cache.apply(
        Kind.REPLICA_SETS, "ADDED", rs.deployment(role, desired, most, revision).replicas(desired).obj()
    )


def filtered(cache: ClusterCache, decider: Decider, pod: PodBuilder) -> tuple[Any, PodInfo]:
    info = PodInfo.from_obj(pod.obj())
    cache.apply(Kind.PODS, "ADDED", pod.obj())
    return decider.filter(info, cache.node_names()), info


def bind(cache: ClusterCache, decider: Decider, pod: PodBuilder) -> str:
    """Filter ``pod``, bind it on the first node offered and see it Running."""
    out, info = filtered(cache, decider, pod)
    assert out.passed, out.failed
    node = out.passed[0]
    plan = decider.plan_bind(info, node)
    annotations = plan.annotations()
    cache.apply(Kind.PODS, "MODIFIED", pod.on_node(node).running().annotations(annotations).obj())
    return node


def gone(cache: ClusterCache, pod: PodBuilder) -> None:
    cache.apply(Kind.PODS, "DELETED", pod.obj())


def slots(cache: ClusterCache) -> Counter[str]:
    r = cache.book.reservation(GANG_KEY)
    assert r is not None
    return Counter(s.pod_set for s in r.slice.slots)


def assert_no_gpu_twice(cache: ClusterCache) -> None:
    r = cache.book.reservation(GANG_KEY)
    assert r is not None
    held = [(s.node, g) for s in r.slice.slots for g in s.gpus]
    assert len(held) == len(set(held)), held


def test_the_owners_size_a_gang_whose_pods_carry_no_size() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    owner(cache, "prefill", 1, desired=2, most=3)
    owner(cache, "decode", 2, desired=2, most=3)
    out, _ = filtered(cache, Decider(cache), member("p-0", "prefill", 1))
    assert out.outcome == "reserved"
    assert slots(cache) == Counter({"prefill": 2, "decode": 2})


def test_a_gang_without_owners_or_sizes_is_not_a_gang_of_known_size() -> None:
    cache = cluster({"leaf-1": ["a"]})
    out, _ = filtered(cache, Decider(cache), member("p-0", "prefill", 1))
    assert out.outcome == "waiting" and not out.passed
    assert cache.book.reservation(GANG_KEY) is None


def test_a_surge_pod_gets_a_slot_beside_its_pod_set_and_the_old_pods_slot_goes_with_it() -> None:
    cache = cluster({"leaf-1": ["a", "b"], "leaf-2": ["c"]})
    decider = Decider(cache)
    owner(cache, "decode", 2, desired=2, most=3)
    old = [member(f"d-{i}", "decode", 2) for i in range(2)]
    nodes = {bind(cache, decider, p) for p in old}
    # The rollout: revision 2 gets one pod while both old ones still run.
    owner(cache, "decode", 2, desired=2, most=3, revision=2)
    surge = member("d-new", "decode", 2)
    out, _ = filtered(cache, decider, surge)
    assert out.outcome == "reserved" and set(out.passed) <= nodes, out
    assert slots(cache) == Counter({"decode": 3})
    bind(cache, decider, surge)
    assert_no_gpu_twice(cache)
    # The old pod leaves: its slot goes (the owners want 2), the others stay bound.
    gone(cache, old[0])
    assert slots(cache) == Counter({"decode": 2})
    r = cache.book.reservation(GANG_KEY)
    assert r is not None and sorted(r.bound.values()) == ["d-1", "d-new"]


def test_without_surge_the_new_pod_waits_for_the_old_ones_slot_and_takes_it() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    decider = Decider(cache)
    owner(cache, "decode", 4, desired=2, most=2)
    old = [member(f"d-{i}", "decode", 4) for i in range(2)]
    for p in old:
        bind(cache, decider, p)
    r = cache.book.reservation(GANG_KEY)
    assert r is not None
    freed = r.slot_of("d-0")
    assert freed is not None
    new = member("d-new", "decode", 4)
    out, _ = filtered(cache, decider, new)
    why = next(iter(out.failed.values()))
    assert not out.passed and "no free slot for pod set decode" in why
    assert "its owners let 2 pods of it hold slots at once: waiting for one to leave" in why
    gone(cache, old[0])
    assert slots(cache) == Counter({"decode": 2})
    node = bind(cache, decider, new)
    r = cache.book.reservation(GANG_KEY)
    assert r is not None
    mine = r.slot_of("d-new")
    assert mine is not None and (node, mine.gpus) == (freed.node, freed.gpus)


def test_scale_up_grows_each_new_pod_and_scale_down_frees_slots_as_pods_leave() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    decider = Decider(cache)
    owner(cache, "decode", 2, desired=2, most=3)
    pods = [member(f"d-{i}", "decode", 2) for i in range(5)]
    for p in pods[:2]:
        bind(cache, decider, p)
    owner(cache, "decode", 2, desired=5, most=6)
    for p in pods[2:]:
        bind(cache, decider, p)
    assert slots(cache) == Counter({"decode": 5})
    assert_no_gpu_twice(cache)
    owner(cache, "decode", 2, desired=1, most=2)
    assert slots(cache) == Counter({"decode": 5})  # every slot is still some pod's
    for p in pods[1:]:
        gone(cache, p)
    assert slots(cache) == Counter({"decode": 1})
    r = cache.book.reservation(GANG_KEY)
    assert r is not None and r.complete


def test_growth_keeps_the_required_level_and_says_why_it_cannot() -> None:
    cache = cluster({"leaf-1": ["a"], "leaf-2": ["c"]})
    decider = Decider(cache)
    owner(cache, "decode", 4, desired=2, most=3, **{REQUIRED_LEVEL: "leaf"})
    for i in range(2):
        bind(cache, decider, member(f"d-{i}", "decode", 4, **{REQUIRED_LEVEL: "leaf"}))
    out, _ = filtered(cache, decider, member("d-new", "decode", 4, **{REQUIRED_LEVEL: "leaf"}))
    assert not out.passed
    why = next(iter(out.failed.values()))
    assert "no room for one more pod of pod set decode in its required domain" in why
    assert slots(cache) == Counter({"decode": 2})


def test_a_hold_of_owned_pods_outlives_its_ttl_while_a_pod_lives() -> None:
    clock = FakeClock(100.0)
    cache = ClusterCache(clock=clock, ttl_s=30)
    for kind in Kind:
        cache.replace(kind, [])
    for name in ("a", "b"):
        cache.apply(Kind.NODES, "ADDED", node_obj(name))
    decider = Decider(cache)
    owner(cache, "decode", 4, desired=2, most=2)
    pods = [member(f"d-{i}", "decode", 4) for i in range(2)]
    for p in pods:
        bind(cache, decider, p)
    gone(cache, pods[0])  # its replacement is slow to come
    clock.now += 31
    assert cache.book.expire() == []
    assert slots(cache) == Counter({"decode": 2})


def test_owner_table_sizes_a_deployment_by_its_newest_revision_and_sums_workloads() -> None:
    table = OwnerTable()
    tpl = member("t", "decode", 2)
    table.put("ReplicaSet", make_replica_set("d-1").template(tpl).deployment("d", 3, 4, 1).obj())
    table.put("ReplicaSet", make_replica_set("d-2").template(tpl).deployment("d", 5, 6, 2).obj())
    table.put("StatefulSet", make_replica_set("s").template(tpl).replicas(2).stateful().obj())
    assert table.sizes(GANG_KEY) == {"decode": PodSetSize(7, 8)}
    # A status update changes nothing the table keeps; a scale does.
    assert (
        table.put("ReplicaSet", make_replica_set("d-2").template(tpl).deployment("d", 5, 6, 2).obj()) == set()
    )
    assert table.put("ReplicaSet", make_replica_set("d-2").template(tpl).deployment("d", 1, 2, 2).obj()) == {
        GANG_KEY
    }
    assert table.sizes(GANG_KEY) == {"decode": PodSetSize(3, 4)}
    # A LeaderWorkerSet's template is left to the LeaderWorkerSet rules.
    lws = tpl.label("leaderworkerset.sigs.k8s.io/name", "w")
    table.put("StatefulSet", make_replica_set("w").template(lws).stateful().obj())
    assert table.sizes(GANG_KEY) == {"decode": PodSetSize(3, 4)}
    assert table.sizes("llm/other") is None


def _slice(*slots: PodSlot) -> Slice:
    return Slice("g", slots, {})


@pytest.mark.parametrize(
    ("required", "expected"),
    [
        (None, [{"a1"}, {"a1", "a2"}, {"a1", "a2", "a3"}, {"a1", "a2", "a3", "b1"}]),
        ("leaf", [{"a1"}, {"a1", "a2"}, {"a1", "a2", "a3"}]),
        ("node", [{"a1"}]),
    ],
)
def test_one_more_pod_is_looked_for_beside_its_pod_set_then_its_gang_then_outwards(
    required: str | None, expected: list[set[str]]
) -> None:
    view = make_cluster(
        make_node("a1").hgx_h100().leaf("A"),
        make_node("a2").hgx_h100().leaf("A"),
        make_node("a3").hgx_h100().leaf("A"),
        make_node("b1").hgx_h100().leaf("B"),
    ).obj()
    sl = _slice(PodSlot("decode", 0, "a1", (0, 1)), PodSlot("prefill", 0, "a2", (0,)))
    ps = PodSet("decode", 1, 2, required_level=required)
    assert [set(s) for s in near_slice(view, sl, ps)] == expected


def test_the_ledger_grows_and_shrinks_a_slice_without_promising_a_gpu_twice() -> None:
    ledger = Ledger()
    ledger.reserve(_slice(PodSlot("decode", 0, "a", (0, 1))), now=0)
    ledger.reserve(Slice("h", (PodSlot("x", 0, "a", (2, 3)),), {}), now=0)
    with pytest.raises(LedgerError, match="already reserved"):
        ledger.add_slot("g", PodSlot("decode", 1, "a", (2, 3)))
    with pytest.raises(LedgerError, match="another slot's"):
        ledger.add_slot("g", PodSlot("decode", 1, "a", (1, 4)))
    r: Reservation = ledger.add_slot("g", PodSlot("decode", 1, "a", (4, 5)))
    assert [s.key for s in r.slice.slots] == ["decode/0", "decode/1"]
    assert ledger.held()["a"] == frozenset({0, 1, 2, 3, 4, 5})
    ledger.bind("g", "decode/1", "p", now=0)
    with pytest.raises(LedgerError, match="bound to p"):
        ledger.remove_slot("g", "decode/1")
    r = ledger.remove_slot("g", "decode/0")
    assert [s.key for s in r.slice.slots] == ["decode/1"] and r.complete
    ledger.unbind("g", "decode/1")
    with pytest.raises(LedgerError, match="its last"):
        ledger.remove_slot("g", "decode/1")
    assert ledger.held()["a"] == frozenset({2, 3, 4, 5})


def _lose(cache: ClusterCache, node: str, how: str) -> None:
    if how == "deleted":
        cache.apply(Kind.NODES, "DELETED", node_obj(node))
    elif how == "not ready":
        cache.apply(Kind.NODES, "MODIFIED", node_obj(node, labels={LEAF: "leaf-1"}, ready=False))
    else:
        cache.apply(Kind.NODES, "MODIFIED", node_obj(node, labels={LEAF: "leaf-1"}, unschedulable=True))


@pytest.mark.parametrize("how", ["deleted", "not ready", "cordoned"])
def test_a_pod_lost_with_its_node_is_replaced_beside_its_gang(how: str) -> None:
    cache = cluster({"leaf-1": ["a", "b", "c"], "leaf-2": ["x"]})
    decider = Decider(cache)
    leaf = {REQUIRED_LEVEL: "leaf"}
    owner(cache, "decode", 8, desired=2, most=2, **leaf)
    pods = [member(f"d-{i}", "decode", 8, **leaf) for i in range(2)]
    nodes = [bind(cache, decider, p) for p in pods]
    lost = nodes[0]
    _lose(cache, lost, how)
    gone(cache, pods[0])
    node = bind(cache, decider, member("d-new", "decode", 8, **leaf))
    assert node not in (lost, "x") and node != nodes[1]
    r = cache.book.reservation(GANG_KEY)
    assert r is not None and lost not in r.slice.nodes and len(r.slice.slots) == 2 and r.complete
    assert_no_gpu_twice(cache)


def test_a_gang_sized_by_annotation_heals_too_and_one_that_lost_every_slot_is_placed_afresh() -> None:
    cache = cluster({"leaf-1": ["a", "b", "c"]})
    decider = Decider(cache)
    sized = {"gangslice.io/gang-size": "2"}
    pods = [member(f"d-{i}", "decode", 8, **sized) for i in range(2)]
    nodes = [bind(cache, decider, p) for p in pods]
    _lose(cache, nodes[0], "deleted")
    gone(cache, pods[0])
    node = bind(cache, decider, member("d-new", "decode", 8, **sized))
    assert node not in nodes
    assert slots(cache) == Counter({"decode": 2})
    # Both nodes of the gang's slice go while one pod is still to come: placed afresh.
    solo = {"gangslice.io/gang-size": "1"}
    cache.apply(Kind.PODS, "DELETED", member("d-1", "decode", 8, **sized).obj())
    cache.apply(Kind.PODS, "DELETED", member("d-new", "decode", 8, **sized).obj())
    assert cache.book.reservation(GANG_KEY) is None
    first = member("s-0", "decode", 8, **solo)
    out, _ = filtered(cache, decider, first)
    assert out.outcome == "reserved"
    r = cache.book.reservation(GANG_KEY)
    assert r is not None
    _lose(cache, r.slice.nodes[0], "cordoned")
    out, _ = filtered(cache, decider, first)
    assert out.outcome == "reserved" and out.passed and r.slice.nodes[0] not in out.passed


@pytest.mark.parametrize("room_beside", [True, False])
def test_a_pod_set_whose_owner_comes_after_the_placement_is_placed_whole_beside_the_gang(
    room_beside: bool,
) -> None:
    """The prefill Deployment's pods were placed before the decode Deployment existed: the
    decode pod set is a unit of its own, all its pods placed at its first pod (never one in
    another pod set's slot): under the gang's leaf where there is room, else whole under
    another leaf (its required level binds its own pods, not the gang)."""
    leaf_of = {"a": "leaf-1", "b": "leaf-1", "x": "leaf-2", "y": "leaf-2"}
    layout = {"leaf-1": ["a", "b"], "leaf-2": ["x", "y"] if room_beside else ["x"]}
    cache = cluster(layout)
    decider = Decider(cache)
    leaf = {REQUIRED_LEVEL: "leaf"}
    owner(cache, "prefill", 4, desired=2, most=3, **leaf)
    prefill = {bind(cache, decider, member(f"p-{i}", "prefill", 4, **leaf)) for i in range(2)}
    assert slots(cache) == Counter({"prefill": 2})
    owner(cache, "decode", 4, desired=2, most=3, **leaf)
    out, _ = filtered(cache, decider, member("d-0", "decode", 4, **leaf))
    assert out.outcome == "reserved" and out.passed
    assert slots(cache) == Counter({"prefill": 2, "decode": 2})
    decode = {bind(cache, decider, member(f"d-{i}", "decode", 4, **leaf)) for i in range(2)}
    assert len({leaf_of[n] for n in decode}) == 1
    (gang_leaf,) = {leaf_of[n] for n in prefill}
    # Prefill fills one node; its leaf has room for decode where it has a second node.
    room = len(layout[gang_leaf]) > 1
    assert ({leaf_of[n] for n in decode} == {gang_leaf}) == room, (layout, prefill, decode)
    r = cache.book.reservation(GANG_KEY)
    assert r is not None and r.complete
    assert_no_gpu_twice(cache)


def test_the_periodic_pass_frees_a_surplus_slot_an_event_did_not() -> None:
    cache = cluster({"leaf-1": ["a", "b"]})
    decider = Decider(cache)
    owner(cache, "decode", 2, desired=2, most=3)
    for i in range(2):
        bind(cache, decider, member(f"d-{i}", "decode", 2))
    r = cache.book.reservation(GANG_KEY)
    assert r is not None
    free = sorted(set(range(8)) - {g for s in r.slice.slots if s.node == "b" for g in s.gpus})[:2]
    cache.book.add_slot(GANG_KEY, PodSlot("decode", 9, "b", tuple(free)))  # no pod ever came for it
    assert slots(cache) == Counter({"decode": 3})
    cache.book.trim_all()
    assert slots(cache) == Counter({"decode": 2})
    r = cache.book.reservation(GANG_KEY)
    assert r is not None and r.complete
