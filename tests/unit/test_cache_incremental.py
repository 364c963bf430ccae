"""The cache updates its snapshot and view in place of rebuilding them; after any sequence of
events the result must equal a fresh build, and decisions must equal a fresh decider's."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.httpapi.decide import Decider
from extender.kube import names as keys
from extender.kube.api import Kind
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodInfo
from extender.placement.snapshot import ClusterSnapshot
from extender.reservations import ClusterCache
from extender.testing.extender import gang_pod, node_obj, pod_obj
from extender.testing.reserve import hold

NODES = [f"n{i}" for i in range(6)]

EVENTS = st.one_of(
    st.tuples(st.just("bind"), st.integers(0, 9), st.sampled_from(NODES), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("finish"), st.integers(0, 9)),
    st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(1, 2)),
    st.tuples(st.just("release"), st.integers(0, 2)),
    st.tuples(st.just("cordon"), st.sampled_from(NODES), st.booleans()),
)


def fresh_view(cache: ClusterCache) -> ClusterSnapshot:
    base = cache.snapshot()
    return cache.ledger.view(ClusterSnapshot(list(base.nodes), base.hierarchy))


def apply(cache: ClusterCache, event: tuple[Any, ...]) -> None:
    kind = event[0]
    if kind == "bind":
        _, i, node, gpus, annotated = event
        ann = {keys.GPUS: ",".join(str(g) for g in range(8 - gpus, 8))} if annotated else {}
        cache.apply(
            Kind.PODS, "MODIFIED", pod_obj(f"p{i}", gpus=gpus, node=node, annotations=ann, phase="Running")
        )
    elif kind == "delete":
        cache.apply(Kind.PODS, "DELETED", pod_obj(f"p{event[1]}"))
    elif kind == "finish":
        cache.apply(Kind.PODS, "MODIFIED", pod_obj(f"p{event[1]}", phase="Succeeded"))
    elif kind == "reserve":
        _, g, size = event
        request = plain_gang_request(PodInfo.from_obj(gang_pod(f"g{g}-0", f"g{g}", size, 8)))
        assert request is not None
        hold(cache, f"llm/g{g}", request)
    elif kind == "release":
        cache.drop(f"llm/g{event[1]}")
    else:
        _, node, cordoned = event
        cache.apply(Kind.NODES, "MODIFIED", node_obj(node, unschedulable=cordoned))


@settings(max_examples=60, deadline=None)
@given(events=st.lists(EVENTS, max_size=25))
def test_incremental_view_equals_a_fresh_build(events: list[tuple[Any, ...]]) -> None:
    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [node_obj(n) for n in NODES] if kind is Kind.NODES else [])
    decider = Decider(cache)
    pod = PodInfo.from_obj(pod_obj("probe", gpus=2))
    for event in events:
        apply(cache, event)
        view, fresh = cache.view(), fresh_view(cache)
        assert [n.name for n in view.nodes] == [n.name for n in fresh.nodes]
        assert [view.free_mask(i) for i in range(len(view.nodes))] == [
            fresh.free_mask(i) for i in range(len(fresh.nodes))
        ]
        assert view.reserved == fresh.reserved
        names = [*NODES, "ghost"]
        assert decider.filter(pod, names) == Decider(cache).filter(pod, names)
        assert decider.prioritize(pod, names) == Decider(cache).prioritize(pod, names)


def test_updated_falls_back_to_a_fresh_build_when_labels_change() -> None:
    cache = ClusterCache(awaiting=())
    cache.replace(Kind.NODES, [node_obj(n) for n in NODES])
    base = cache.snapshot()
    relabelled = cache.snapshot().node("n0")
    moved = type(relabelled)(
        relabelled.name, {**relabelled.labels, "fabric.topograph.run/tier-0": "leaf-9"}, relabelled.graph
    )
    got = base.updated({"n0": moved})
    assert got.node("n0").labels["fabric.topograph.run/tier-0"] == "leaf-9"
    # The label path is recomputed (a patched copy would keep n0's old path).
    assert got.path_of("n0") == cache.hierarchy.path(moved.labels)
    assert "leaf-9" in got.path_of("n0")


def test_a_status_only_pod_update_changes_nothing() -> None:
    cache = ClusterCache(awaiting=())
    cache.replace(Kind.NODES, [node_obj("n0")])
    cache.apply(Kind.PODS, "ADDED", pod_obj("p", gpus=2, node="n0", phase="Running"))
    cache.view()
    version = cache.version
    running = pod_obj("p", gpus=2, node="n0", phase="Running")
    running["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    cache.apply(Kind.PODS, "MODIFIED", running)
    assert cache.version == version
    assert cache.changes_since(version) == set()
