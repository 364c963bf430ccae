"""The cluster cache: what it takes from a cluster file, from Nodes, Pods and NodeTopologies,
how it keeps the ledger, and its reservation bookkeeping as pods come and go."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extender.kube import names as keys
from extender.kube.api import Kind
from extender.kube.crd_models import reservation_object
from extender.kube.gangs import plain_gang_request
from extender.kube.node_graphs import UNIFORM, fallback_preset
from extender.kube.pods import PodInfo
from extender.placement.ledger import Phase
from extender.placement.request import GangRequest, NodeNeeds, Toleration
from extender.placement.slice import Slice, Unplaceable
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore
from extender.testing.extender import gang_pod, node_obj, pod_obj, write_cluster
from extender.testing.objects import make_node_topology
from extender.testing.reserve import hold, reserve_gang
from extender.topology.presets import preset_graph

#: When the NodeTopology objects below were published (the cache does not read it).


def kube_cache(**kw: object) -> ClusterCache:
    cache = ClusterCache(**kw)  # type: ignore[arg-type]
    for kind in Kind:
        cache.replace(kind, [])
    return cache


def gang_request(pod: str, gang: str, pods: int, gpus: int) -> GangRequest:
    """The plain gang request pod ``pod`` of gang ``gang`` (``pods`` pods of ``gpus`` GPUs) makes."""
    request = plain_gang_request(PodInfo.from_obj(gang_pod(pod, gang, pods, gpus)))
    assert request is not None
    return request


def test_cluster_file_gives_the_file_nodes_and_allocations(tmp_path: Path) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    assert cache.ready
    assert cache.node_names() == ["h-0", "h-1", "h-2", "h-3", "l-0", "p-0", "p-1"]
    assert cache.snapshot().free_gpus("h-3") == frozenset({4, 5, 6, 7})
    assert cache.snapshot().hierarchy.levels[-1].label == "fabric.topograph.run/tier-0"


DRA_KINDS = (Kind.RESOURCE_SLICES, Kind.DEVICE_CLASSES, Kind.RESOURCE_CLAIMS)
OWNER_KINDS = (Kind.REPLICA_SETS, Kind.STATEFUL_SETS, Kind.WORKLOAD_POD_GROUPS)


def test_not_ready_until_every_kind_is_listed() -> None:
    cache = ClusterCache()
    for kind in (Kind.NODES, Kind.PODS, Kind.NODE_TOPOLOGIES, *DRA_KINDS, *OWNER_KINDS):
        cache.replace(kind, [])
        assert not cache.ready
    assert cache.awaiting == {Kind.SLICE_RESERVATIONS}
    cache.replace(Kind.SLICE_RESERVATIONS, [])
    assert cache.ready


@pytest.mark.parametrize(
    ("count", "product", "preset"),
    [
        (8, "NVIDIA-H100-80GB-HBM3", "hgx-h100"),
        (8, "NVIDIA-A100-SXM4-80GB", "dgx-a100"),
        (8, "NVIDIA-L40S", "pcie-8gpu-2socket"),
        (8, "NVIDIA-H100-PCIe", "pcie-8gpu-2socket"),
        (4, "NVIDIA-GB200", "gb200-tray"),
        (4, "NVIDIA-L40S", "l40s-4gpu"),
        (2, "NVIDIA-H100-80GB-HBM3", UNIFORM),
        (8, None, UNIFORM),
    ],
)
def test_fallback_preset_by_count_and_product(count: int, product: str | None, preset: str) -> None:
    assert fallback_preset(count, product) == preset


def test_gpu_node_without_node_topology_gets_its_fallback_graph() -> None:
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    cache.apply(Kind.NODES, "ADDED", node_obj("b", gpus=2, product=None))
    cache.apply(Kind.NODES, "ADDED", node_obj("cpu", gpus=0))
    snap = cache.snapshot()
    assert [n.name for n in snap.nodes] == ["a", "b"]
    assert snap.node("a").graph == preset_graph("hgx-h100")
    assert snap.node("b").graph.model == "uniform-2"


def test_node_topology_wins_over_the_fallback_and_its_removal_restores_it() -> None:
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a", gpus=8, product="NVIDIA-H100-80GB-HBM3"))
    pcie = preset_graph("pcie-8gpu-2socket")
    # Written as the node agent writes it.
    topo = make_node_topology("a").graph(pcie).obj()
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", topo)
    assert cache.snapshot().node("a").graph == pcie
    cache.apply(Kind.NODE_TOPOLOGIES, "DELETED", topo)
    assert cache.snapshot().node("a").graph == preset_graph("hgx-h100")


def test_not_ready_nodes_are_left_out_and_cordoned_ones_admit_only_pods_that_tolerate_it() -> None:
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a"))
    cache.apply(Kind.NODES, "ADDED", node_obj("b", unschedulable=True))
    cache.apply(Kind.NODES, "ADDED", node_obj("c", ready=False))
    assert cache.node_names() == ["a", "b"]
    snap = cache.snapshot()
    assert snap.node("b").facts.unschedulable and not snap.node("a").facts.unschedulable
    assert snap.admitted(NodeNeeds()) == frozenset({snap.index("a")})
    tolerant = NodeNeeds(tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists"),))
    assert snap.admitted(tolerant) is None  # every node


def test_bound_pods_take_annotated_gpus_then_first_free_for_the_rest() -> None:
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a"))
    annotated = pod_obj("x", gpus=2, node="a", annotations={keys.GPUS: "0,1"}, phase="Running")
    plain = pod_obj("y", gpus=3, node="a", phase="Running")
    done = pod_obj("z", gpus=2, node="a", phase="Succeeded")
    pending = pod_obj("w", gpus=2)
    for p in (annotated, plain, done, pending):
        cache.apply(Kind.PODS, "ADDED", p)
    assert cache.snapshot().node("a").allocated == frozenset({0, 1, 2, 3, 4})
    assert cache.gpus_of("llm/y") == frozenset({2, 3, 4})
    cache.apply(Kind.PODS, "DELETED", annotated)
    assert cache.snapshot().node("a").allocated == frozenset({0, 1, 2})


def test_forged_gpu_annotations_take_no_gpu() -> None:
    """Anyone who may create a pod may write gangslice's annotations on it: a pod holds what
    the kubelet says, or what it requests from the device plugin, never more."""
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a"))
    every = ",".join(map(str, range(8)))
    forged = [
        pod_obj("cpu-only", node="a", annotations={keys.GPUS: every}, phase="Running"),
        pod_obj("claims", node="a", annotations={keys.GPUS: every, keys.CLAIM_GPUS: "8"}, phase="Running"),
        pod_obj("one", gpus=1, node="a", annotations={keys.GPUS: every}, phase="Running"),
    ]
    for p in forged:
        cache.apply(Kind.PODS, "ADDED", p)
    assert cache.snapshot().node("a").allocated == frozenset({0})
    assert cache.gpus_of("llm/cpu-only") in (None, frozenset())
    assert cache.gpus_of("llm/one") == frozenset({0})


def test_the_echo_of_our_annotation_patch_does_not_unbind_a_noted_pod() -> None:
    """bind patches the GPU annotation, then posts the Binding; the watch delivers the patch
    (no nodeName yet) after ``note_bound``. The pod must stay on its node, or its GPUs look
    free and the next pod is given the same ones."""
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a"))
    pending = pod_obj("x", gpus=2, uid="u-x")
    cache.apply(Kind.PODS, "ADDED", pending)
    cache.note_bound(
        PodInfo.from_obj(pod_obj("x", gpus=2, uid="u-x", node="a", annotations={keys.GPUS: "0,1"}))
    )
    assert cache.snapshot().node("a").allocated == frozenset({0, 1})
    echo = pod_obj("x", gpus=2, uid="u-x", annotations={keys.GPUS: "0,1"})
    cache.apply(Kind.PODS, "MODIFIED", echo)
    assert cache.snapshot().node("a").allocated == frozenset({0, 1})
    # A different pod of the same name (a new uid) is not bound by the old record.
    cache.apply(Kind.PODS, "MODIFIED", pod_obj("x", gpus=2, uid="u-x2"))
    assert cache.snapshot().node("a").allocated == frozenset()


def test_an_event_older_than_a_noted_bind_keeps_what_the_bind_wrote() -> None:
    """The watch may lag a bind by more than its own echo: an update from before the bind (a
    Kueue admission lifting the pod's gate, read again from the API server by the verb that
    bound it) still comes after ``note_bound``. It lacks the node and the GPU annotation the
    Binding carries; the pod keeps both, or its GPUs look free (here: the first free ones)."""
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a"))
    gated = pod_obj("x", gpus=2, uid="u-x")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    cache.apply(Kind.PODS, "ADDED", gated)
    admitted = pod_obj("x", gpus=2, uid="u-x", annotations={keys.RESERVATION: "wl"})
    cache.note_bound(
        PodInfo.from_obj(
            pod_obj("x", gpus=2, uid="u-x", node="a", annotations={keys.RESERVATION: "wl", keys.GPUS: "6,7"})
        )
    )
    cache.apply(Kind.PODS, "MODIFIED", admitted)  # the admission's update, after the bind was noted
    assert cache.snapshot().node("a").allocated == frozenset({6, 7})
    assert cache.gpus_of("llm/x") == frozenset({6, 7})
    bound = cache.watched_pod("llm", "x")
    assert bound is not None and bound.reservation_name == "wl" and not bound.gated


def test_devices_the_kubelet_reports_in_use_beat_the_first_free_guess() -> None:
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj("a"))
    topology = make_node_topology("a").hgx_h100().in_use("y", 6, container="").obj()
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", topology)
    cache.apply(Kind.PODS, "ADDED", pod_obj("y", gpus=1, node="a", phase="Running"))
    cache.apply(Kind.PODS, "ADDED", pod_obj("v", gpus=1, node="a", phase="Running"))
    assert cache.gpus_of("llm/y") == frozenset({6})
    assert cache.gpus_of("llm/v") == frozenset({0})


def test_view_hides_reserved_gpus_and_hold_is_idempotent(tmp_path: Path) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    request = gang_request("g-0", "g", 2, 8)
    first = hold(cache, "llm/g", request)
    assert isinstance(first, Slice)
    assert first.gang == "llm/g"
    again = hold(cache, "llm/g", request)
    assert again == first
    assert len(cache.ledger) == 1
    for node, gpus in first.held().items():
        assert not cache.view().free_gpus(node) & gpus
        assert cache.snapshot().free_gpus(node) >= gpus
    assert cache.reservation_named("llm", "g") is cache.reservation("llm/g")


def test_hold_too_big_for_the_cluster_is_unplaceable_forever(tmp_path: Path) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    request = gang_request("g-0", "g", 100, 8)
    got = hold(cache, "llm/g", request)
    assert isinstance(got, Unplaceable)
    assert not got.feasible_when_empty
    assert len(cache.ledger) == 0


def test_flush_persists_and_a_new_cache_rebuilds_the_same_ledger(tmp_path: Path) -> None:
    store = InMemoryReservationStore()
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path), store=store)
    request = gang_request("g-0", "g", 2, 8)

    async def go() -> ClusterCache:
        placed = await reserve_gang(cache, "llm/g", request)
        assert isinstance(placed, Slice)
        cache.bind_slot("llm/g", placed.slots[0].key, "g-0")
        await cache.flush()
        again = ClusterCache.from_cluster_file(write_cluster(tmp_path), store=store)
        assert await again.rebuild_ledger() == 1
        assert await again.rebuild_ledger() == 1  # the same objects again: nothing doubled
        assert len(again.ledger) == 1
        return again

    rebuilt = asyncio.run(go())
    assert rebuilt.ledger.to_dict() == cache.ledger.to_dict()
    assert len(store.objects) == 1


def test_release_deletes_the_persisted_object(tmp_path: Path) -> None:
    store = InMemoryReservationStore()
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path), store=store)
    request = gang_request("g-0", "g", 1, 8)

    async def go() -> None:
        await reserve_gang(cache, "llm/g", request)
        assert len(store.objects) == 1
        released = await cache.release_gang("llm/g")
        assert released is not None and released.phase is Phase.RELEASED

    asyncio.run(go())
    assert store.objects == {}
    assert cache.reservation("llm/g") is None


def test_expired_holds_are_dropped_but_fully_bound_ones_stay(tmp_path: Path) -> None:
    now = [1000.0]
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path), ttl_s=10, clock=lambda: now[0])
    for gang in ("a", "b"):
        request = gang_request(f"{gang}-0", gang, 1, 4)
        assert isinstance(hold(cache, f"llm/{gang}", request), Slice)
    cache.bind_slot("llm/b", "pods/0", "b-0")
    now[0] += 11
    gone = cache.expire()
    assert [r.gang for r in gone] == ["llm/a"]
    assert cache.reservation("llm/b") is not None


def _reserved_kube_cache() -> tuple[ClusterCache, Slice]:
    cache = kube_cache()
    for name in ("a", "b"):
        cache.apply(Kind.NODES, "ADDED", node_obj(name))
    request = gang_request("g-0", "g", 2, 8)
    placed = hold(cache, "llm/g", request)
    assert isinstance(placed, Slice)
    return cache, placed


def test_a_gang_pod_seen_bound_takes_its_slot() -> None:
    cache, placed = _reserved_kube_cache()
    slot = placed.slots[1]
    pod = gang_pod("g-1", "g", 2, 8, node=slot.node, phase="Running")
    cache.apply(Kind.PODS, "ADDED", pod)
    r = cache.reservation("llm/g")
    assert r is not None and r.bound == {slot.key: "g-1"}


def test_a_deleted_gang_pod_frees_its_slot_and_the_last_one_releases_the_gang() -> None:
    cache, placed = _reserved_kube_cache()
    pods = [gang_pod(f"g-{i}", "g", 2, 8, node=s.node, phase="Running") for i, s in enumerate(placed.slots)]
    for p in pods:
        cache.apply(Kind.PODS, "ADDED", p)
    r = cache.reservation("llm/g")
    assert r is not None and r.phase is Phase.BOUND
    cache.apply(Kind.PODS, "DELETED", pods[0])
    r = cache.reservation("llm/g")
    assert r is not None and len(r.bound) == 1 and r.phase is Phase.RESERVED
    cache.apply(Kind.PODS, "MODIFIED", {**pods[1], "status": {"phase": "Succeeded"}})
    assert cache.reservation("llm/g") is None


def test_reservations_come_back_by_the_rebuild_alone_and_once() -> None:
    cache, _ = _reserved_kube_cache()
    r = cache.reservation("llm/g")
    assert r is not None
    other = ClusterCache()
    for kind in (Kind.NODES, Kind.PODS, Kind.NODE_TOPOLOGIES, *DRA_KINDS, *OWNER_KINDS):
        other.replace(kind, [])
    for name in ("a", "b"):
        other.apply(Kind.NODES, "ADDED", node_obj(name))
    obj = reservation_object(r)
    # The watch's list and events feed nothing into the ledger: only the rebuild does.
    other.replace(Kind.SLICE_RESERVATIONS, [obj, obj])
    other.apply(Kind.SLICE_RESERVATIONS, "MODIFIED", obj)
    assert other.ready and len(other.ledger) == 0
    assert other.rebuild([r, r]) == []  # the same one twice: held once, nothing refused
    assert other.rebuilds == 1
    assert other.ledger.to_dict()["reservations"] == cache.ledger.to_dict()["reservations"]
    # deleted by someone else: released here too
    other.apply(Kind.SLICE_RESERVATIONS, "DELETED", obj)
    assert other.reservation("llm/g") is None


def test_cache_expiry_keeps_workload_and_podgroup_holds(tmp_path: Path) -> None:
    """Holds of an admitted Workload or a live PodGroup are released by their controller,
    never by the TTL; a plain gang's hold expires."""
    from extender.placement.ledger import Reservation
    from extender.placement.slice import PodSlot, Slice

    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    cache.clock = lambda: 1_000.0
    node = cache.snapshot().nodes[0].name
    for gang, gpu, kind in (("ns/wl", 0, "Workload"), ("ns/pg", 1, "PodGroup"), ("ns/plain", 2, None)):
        meta = {"ownerKind": kind} if kind else {}
        r = Reservation(gang, Slice(gang, (PodSlot("p", 0, node, (gpu,)),), {"p": 0.0}), 10.0, meta=meta)
        assert cache.restore(r)
    gone = cache.expire()
    assert [r.gang for r in gone] == ["ns/plain"]
    assert cache.reservation("ns/wl") is not None and cache.reservation("ns/pg") is not None
