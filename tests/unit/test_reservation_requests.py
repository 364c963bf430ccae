"""A reservation holds what its pods request of their nodes, not only their GPUs: until a
slot's pod binds, its CPU, memory and pod slot count as requested on the slot's node, so two
reserved gangs never overfill one node; once the pod binds its own requests count instead
(never both), and a restart reads the held requests back from the SliceReservation."""

from __future__ import annotations

from extender.kube.crd_models import SliceReservationObject, reservation_from_object, reservation_object
from extender.placement.feasibility import NOTHING, NodeFacts, Resources
from extender.placement.request import GangRequest, PodRequests, PodSet
from extender.placement.slice import Slice
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore
from extender.testing.builders import make_cluster, make_node
from extender.testing.reserve import hold

GI = 2**30


#: An HGX H100 that can hold 200 CPUs, 100Gi of pod memory and 110 pods.
ROOMY = (
    make_node()
    .hgx_h100()
    .hostname()
    .facts(NodeFacts(allocatable=Resources(cpu_millis=200_000, memory_bytes=100 * GI, pods=110)))
)
TWO_NODES = make_cluster(ROOMY.named("n1"), ROOMY.named("n2"))


def gang(name: str, gpus: int, memory_gi: int) -> GangRequest:
    ps = PodSet("main", 1, gpus, requests=PodRequests(cpu_millis=8000, memory_bytes=memory_gi * GI))
    return GangRequest(name, (ps,))


def test_a_second_gang_does_not_take_the_memory_a_reserved_pod_will_need() -> None:
    cache = ClusterCache.from_snapshot(TWO_NODES.obj())
    first = hold(cache, "llm/a", gang("llm/a", 4, 64))
    assert isinstance(first, Slice)
    (slot,) = first.slots
    assert slot.requests.memory_bytes == 64 * GI
    node = slot.node
    i = cache.view().index(node)
    assert cache.view().nodes[i].facts.requested == Resources(8000, 64 * GI, 0, 1)
    # Its GPUs alone would let the second gang onto the same node (4 of 8 GPUs are free
    # there, and the fuller node is the better fit); its memory does not.
    second = hold(cache, "llm/b", gang("llm/b", 4, 64))
    assert isinstance(second, Slice) and second.slots[0].node != node
    # Without the held memory the second gang would share the node: the rule is what decides.
    lighter = hold(cache, "llm/c", gang("llm/c", 4, 30))
    assert isinstance(lighter, Slice) and lighter.slots[0].node == node


def same_as_fresh(cache: ClusterCache) -> None:
    """The cache's incrementally kept view counts what a view built afresh counts."""
    fresh = cache.ledger.view(cache.snapshot())
    assert [n.facts for n in cache.view().nodes] == [n.facts for n in fresh.nodes]


def test_a_bound_pod_counts_once_and_a_dropped_reservation_holds_nothing() -> None:
    cache = ClusterCache.from_snapshot(TWO_NODES.obj())
    placed = hold(cache, "llm/a", gang("llm/a", 4, 64))
    assert isinstance(placed, Slice)
    same_as_fresh(cache)
    (slot,) = placed.slots
    i = cache.view().index(slot.node)
    cache.bind_slot("llm/a", slot.key, "a-0")
    # Bound: the reservation no longer holds the requests (the pod, once seen, counts them).
    assert cache.view().nodes[i].facts.requested == NOTHING
    same_as_fresh(cache)
    cache.unbind_slot("llm/a", slot.key)
    assert cache.view().nodes[i].facts.requested.memory_bytes == 64 * GI
    same_as_fresh(cache)
    assert isinstance(hold(cache, "llm/b", gang("llm/b", 2, 8)), Slice)
    same_as_fresh(cache)
    cache.drop("llm/a")
    assert cache.view().nodes[i].facts.requested.memory_bytes in (0, 8 * GI)
    same_as_fresh(cache)
    assert cache.view(["llm/a", "llm/b"]).nodes[i].facts.requested == NOTHING


def test_the_held_requests_are_persisted_and_read_back() -> None:
    store = InMemoryReservationStore()
    cache = ClusterCache.from_snapshot(TWO_NODES.obj(), store=store)
    placed = hold(cache, "llm/a", gang("llm/a", 4, 64))
    assert isinstance(placed, Slice)
    r = cache.reservation("llm/a")
    assert r is not None
    obj = reservation_object(r)
    (pod,) = obj["spec"]["slice"]["pods"]
    assert pod["requests"] == {"cpuMillis": 8000, "memoryBytes": 64 * GI, "ephemeralStorageBytes": 0}
    SliceReservationObject.model_validate(obj)  # the CRD's schema takes it
    back = reservation_from_object(obj)
    assert back.slice.slots[0].requests == placed.slots[0].requests
    # An object written before slots held requests reads as holding none.
    del obj["spec"]["slice"]["pods"][0]["requests"]
    assert reservation_from_object(obj).slice.slots[0].requests == PodRequests()


def test_the_live_cache_keeps_the_held_requests_across_pod_events() -> None:
    from extender.kube.api import Kind
    from extender.testing.extender import node_obj, pod_obj

    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    for name in ("n1", "n2"):
        obj = node_obj(name)
        obj["status"]["allocatable"].update(memory="100Gi", pods="110")
        cache.apply(Kind.NODES, "ADDED", obj)
    placed = hold(cache, "llm/a", gang("llm/a", 4, 64))
    assert isinstance(placed, Slice)
    node = placed.slots[0].node
    i = cache.view().index(node)
    other = pod_obj("web", node=node, phase="Running")
    other["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "10Gi"}}
    cache.apply(Kind.PODS, "ADDED", other)
    assert cache.view().nodes[i].facts.requested == Resources(9000, 74 * GI, 0, 2)
    same_as_fresh(cache)
    cache.apply(Kind.PODS, "DELETED", other)
    assert cache.view().nodes[i].facts.requested == Resources(8000, 64 * GI, 0, 1)
    same_as_fresh(cache)


def test_a_node_that_starts_reporting_allocatable_counts_the_held_requests_at_once() -> None:
    from extender.kube.api import Kind
    from extender.testing.extender import node_obj

    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    bare = node_obj("n1")
    bare["status"]["allocatable"] = {"nvidia.com/gpu": "8"}  # a Node written by hand: no cpu/memory
    cache.apply(Kind.NODES, "ADDED", bare)
    placed = hold(cache, "llm/a", gang("llm/a", 4, 64))
    assert isinstance(placed, Slice)
    assert cache.view().node("n1").facts.requested == NOTHING  # nothing limits there
    same_as_fresh(cache)
    full = node_obj("n1")
    full["status"]["allocatable"].update(memory="100Gi")
    cache.apply(Kind.NODES, "MODIFIED", full)
    assert cache.view().node("n1").facts.requested == Resources(8000, 64 * GI, 0, 1)
    same_as_fresh(cache)


def test_a_reservation_holds_the_imex_daemon_room_of_its_compute_domain_nodes() -> None:
    """A wide gang's slice spans two trays of a clique: until its ComputeDomain's daemon pod runs
    there, the room for that pod is held, so a gang placed next cannot take the last pod slot."""
    from dataclasses import replace

    from extender.cost import Comm
    from extender.placement.feasibility import NodeFacts
    from extender.placement.snapshot import ClusterSnapshot, NodeState
    from extender.topology.hierarchy import Hierarchy, Level
    from extender.topology.presets import preset_graph

    levels = Hierarchy((Level("clique", "nvidia.com/gpu.clique", kind="fabric"),))
    facts = NodeFacts(allocatable=Resources(pods=2))
    nodes = [
        replace(
            NodeState(f"tray{i}", {"nvidia.com/gpu.clique": "nvl72.0"}, preset_graph("gb200-tray")),
            facts=facts,
        )
        for i in range(2)
    ]
    cache = ClusterCache.from_snapshot(ClusterSnapshot(nodes, levels))
    wide = GangRequest("llm/ep", (PodSet("ep", 2, 2, Comm.ALLTOALL),))
    first = hold(cache, "llm/ep", wide)
    assert isinstance(first, Slice) and len(first.mnnvl_nodes) == 2
    for name in first.mnnvl_nodes:
        # The gang's pod and the daemon: both pod slots of each tray are held.
        assert cache.view().node(name).facts.requested.pods == 2
    quiet = hold(cache, "llm/q", GangRequest("llm/q", (PodSet("q", 1, 2),)))
    assert not isinstance(quiet, Slice), "a pod took the slot the IMEX daemon needs"
