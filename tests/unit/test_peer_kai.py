"""The KAI Scheduler baseline against KAI's own tests (kai-scheduler/KAI-Scheduler).

Each case is the cluster, request and outcome of an upstream test, named in its docstring.
Upstream nodes have 1, 2, 4 or 10 GPUs; here every node is an 8-GPU HGX H100 with the rest
allocated, which KAI cannot tell apart: its domain accounting, domain order and binpack
score read only free ("non-allocated") GPUs. A gang's pod sets are KAI SubGroups; an
upstream PodGroup constraint is written as a colocateWith between the pod sets (KAI's
parent constraint that prefers that level); upstream pods of one job are one pod set.
"""

from __future__ import annotations

from collections.abc import Sequence

from extender.peers import kai
from extender.placement.feasibility import NodeFacts, Resources
from extender.placement.request import Colocation, GangRequest, NodeRequirement, PodRequests, PodSet
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.testing.builders import make_node
from extender.topology.hierarchy import Hierarchy, Level

ZONE = Level("zone", "k8s.io/zone")
SPINE = Level("spine", "k8s.io/spine")
RACK = Level("rack", "k8s.io/rack")
AFFINITY = "kai-test/affinity"


def node(name: str, free: int, facts: NodeFacts | None = None, **labels: str) -> NodeState:
    """An HGX H100 node with ``free`` GPUs left (the last ones) and ``k8s.io/<level>`` labels.

    A helper of this file's own rather than :func:`make_node` at each case: the cases are
    KAI's upstream tables, one node a line as upstream lists them (name, free GPUs, levels),
    and read side by side with them."""
    levels = {k if "/" in k else f"k8s.io/{k}": v for k, v in labels.items()}
    return make_node(name).hgx_h100().free_count(free).facts(facts).labels(levels).obj()


def gang(*pod_sets: PodSet) -> GangRequest:
    return GangRequest("pending_job0", tuple(pod_sets))


def nodes_of(result: Placement, pod_set: str | None = None) -> list[str]:
    """The pods' nodes in pod order (KAI's task order)."""
    assert isinstance(result, Slice), getattr(result, "reason", result)
    return [s.node for s in result.slots if pod_set is None or s.pod_set == pod_set]


def refused(result: Placement) -> Unplaceable:
    assert isinstance(result, Unplaceable), result
    assert result.reason.startswith("kai: ")
    return result


def evenly(zones: int, spines: int, racks: int, per_rack: int, free: int) -> list[NodeState]:
    """allocateTopology_test.go ``buildEvenlyDistributedTopologyNodes``: node0, node1, ...
    under zoneZ / spineS / rackR, numbered across the whole tree."""
    out = []
    for z in range(1, zones + 1):
        for s in range(1, spines + 1):
            spine = s + (z - 1) * spines
            for r in range(1, racks + 1):
                rack = r + (s - 1) * racks + (z - 1) * spines * racks
                for _ in range(per_rack):
                    out.append(
                        node(
                            f"node{len(out)}",
                            free,
                            zone=f"zone{z}",
                            spine=f"spine{spine}",
                            rack=f"rack{rack}",
                        )
                    )
    return out


def snapshot(nodes: Sequence[NodeState], *levels: Level) -> ClusterSnapshot:
    return ClusterSnapshot(list(nodes), Hierarchy(tuple(levels)))


# -- pkg/scheduler/actions/allocate/allocateTopology_test.go ----------------------------------


def test_required_rack_takes_the_rack_with_room() -> None:
    """allocateTopology_test.go, "Required topology level - schedule all tasks on the same
    rack": four 1-GPU nodes in two racks, node0 busy; two 1-GPU pods required on one rack go
    to rack2 (node2, node3), since rack1 holds only one."""
    snap = snapshot(
        [
            node("node0", 0, rack="rack1"),
            node("node1", 1, rack="rack1"),
            node("node2", 1, rack="rack2"),
            node("node3", 1, rack="rack2"),
        ],
        RACK,
    )
    assert nodes_of(kai(snap, gang(PodSet("w", 2, 1, required_level="rack")))) == ["node2", "node3"]


def test_a_domain_the_pods_cannot_use_is_rolled_back_and_the_next_tried() -> None:
    """allocateTopology_test.go, "Required topology level - could not schedule on first
    domain due to affinity, goes to next": two empty racks tie, rack1 first by id, but only
    rack2's nodes match the pods' node affinity; the allocation there fails, is rolled back,
    and rack2 takes both pods."""
    snap = snapshot(
        [
            node("node0", 1, rack="rack1"),
            node("node1", 1, rack="rack1"),
            node("node2", 1, rack="rack2", **{AFFINITY: "affinity1"}),
            node("node3", 1, rack="rack2", **{AFFINITY: "affinity1"}),
        ],
        RACK,
    )
    ps = PodSet(
        "w", 2, 1, required_level="rack", node_selector=(NodeRequirement(AFFINITY, "In", ("affinity1",)),)
    )
    assert nodes_of(kai(snap, gang(ps))) == ["node2", "node3"]


def test_required_spine_under_a_rack_level() -> None:
    """allocateTopology_test.go, "Required topology with multiple levels - schedule all tasks
    on the same spine": levels rack then spine (rack the coarser); node0 (rack1/spine1) has one
    of its 2 GPUs free, node1 (rack1/spine2) both: two pods required on one spine go to node1."""
    snap = snapshot(
        [node("node0", 1, rack="rack1", spine="spine1"), node("node1", 2, rack="rack1", spine="spine2")],
        RACK,
        SPINE,
    )
    assert nodes_of(kai(snap, gang(PodSet("w", 2, 1, required_level="spine")))) == ["node1", "node1"]


def test_required_rack_fills_the_fullest_node_first() -> None:
    """allocateTopology_test.go, "Required topology with multiple levels - schedule all tasks
    on the same rack": 2-GPU nodes, node0 with one busy; four pods fit rack2 only, and there
    binpack fills node2 before node3 (equal free GPUs, then by name)."""
    snap = snapshot(
        [
            node("node0", 1, rack="rack1", spine="spine1"),
            node("node1", 2, rack="rack1", spine="spine2"),
            node("node2", 2, rack="rack2", spine="spine1"),
            node("node3", 2, rack="rack2", spine="spine2"),
        ],
        RACK,
        SPINE,
    )
    got = kai(snap, gang(PodSet("w", 4, 1, required_level="rack")))
    assert nodes_of(got) == ["node2", "node2", "node3", "node3"]


def test_inside_the_domain_binpack_takes_the_partly_used_node_first() -> None:
    """allocateTopology_test.go, "Required topology with multiple levels - schedule all tasks
    on the same partially occupied rack": node0 has 1 of 2 GPUs free, node1 2; the first pod
    goes to node0 (fewest free GPUs), the second to node1."""
    snap = snapshot(
        [node("node0", 1, rack="rack1", spine="spine1"), node("node1", 2, rack="rack1", spine="spine2")],
        RACK,
        SPINE,
    )
    assert nodes_of(kai(snap, gang(PodSet("w", 2, 1, required_level="rack")))) == ["node0", "node1"]


def test_no_rack_holds_the_job_so_it_stays_pending() -> None:
    """allocateTopology_test.go, "Required topology with multiple levels - job remains pending
    as no available rack can be found": 3 free GPUs per rack, four pods: "node-group rack1 can
    allocate only 3 of 4 required pods"."""
    snap = snapshot(
        [
            node("node0", 1, rack="rack1", spine="spine1"),
            node("node1", 2, rack="rack1", spine="spine2"),
            node("node2", 1, rack="rack2", spine="spine1"),
            node("node3", 2, rack="rack2", spine="spine2"),
        ],
        RACK,
        SPINE,
    )
    result = refused(kai(snap, gang(PodSet("w", 4, 1, required_level="rack"))))
    assert "no rack can allocate all 4 pods (rack rack1 can allocate only 3)" in result.reason
    assert result.short_by == 1 and result.feasible_when_empty


def test_preferred_rack_keeps_the_job_on_one_rack() -> None:
    """allocateTopology_test.go, "Preferred topology - schedule job on the same rack": node0
    (rack1) has 1 GPU free, node1 (rack2) 2; two pods preferring a rack both go to node1."""
    snap = snapshot([node("node0", 1, rack="rack1"), node("node1", 2, rack="rack2")], RACK)
    assert nodes_of(kai(snap, gang(PodSet("w", 2, 1, preferred_level="rack")))) == ["node1", "node1"]


def test_preferred_rack_that_cannot_be_met_still_places_the_job() -> None:
    """allocateTopology_test.go, "Preferred topology - schedule job even if preferred
    constraint can't be met": one free GPU per rack; the job spans both, and the first pod
    takes rack2, ranked above rack1 (rank 10 against 5: the racks tie, rack1 sorts first and
    ranks lowest)."""
    snap = snapshot([node("node0", 1, rack="rack1"), node("node1", 1, rack="rack2")], RACK)
    assert nodes_of(kai(snap, gang(PodSet("w", 2, 1, preferred_level="rack")))) == ["node1", "node0"]


def test_required_and_preferred_rank_the_emptiest_preferred_domain_first() -> None:
    """allocateTopology_test.go, "Combined preferred and required topology constraints -
    schedule job although preferred constraint cannot be satisfied": required rack, preferred
    spine (under it), one free GPU on node1, node2, node3; rack2 holds the two pods, and the
    spine walk (rack1: spine1, spine2; rack2: spine1, spine2) ranks rack2/spine2 highest, so
    node3 then node2."""
    snap = snapshot(
        [
            node("node0", 0, rack="rack1", spine="spine1"),
            node("node1", 1, rack="rack1", spine="spine2"),
            node("node2", 1, rack="rack2", spine="spine1"),
            node("node3", 1, rack="rack2", spine="spine2"),
        ],
        RACK,
        SPINE,
    )
    got = kai(snap, gang(PodSet("w", 2, 1, required_level="rack", preferred_level="spine")))
    assert nodes_of(got) == ["node3", "node2"]


def test_subgroups_each_on_a_rack_inside_the_podgroups_zone() -> None:
    """allocateTopology_test.go, "Required topology at multiple subgroup hierarchy levels -
    subgroup on the same rack and workload in the same zone": 2-GPU nodes, node0 busy; sub-a
    and sub-b (one 2-GPU pod each, required rack) in a PodGroup kept to a zone (here preferred,
    through colocateWith): zone1 holds one such pod, zone2 both; sub-a takes rack3 (node2),
    sub-b rack4 (node3)."""
    snap = snapshot(
        [
            node("node0", 0, zone="zone1", rack="rack1"),
            node("node1", 2, zone="zone1", rack="rack2"),
            node("node2", 2, zone="zone2", rack="rack3"),
            node("node3", 2, zone="zone2", rack="rack4"),
        ],
        ZONE,
        RACK,
    )
    g = gang(
        PodSet("sub-a", 1, 2, required_level="rack"),
        PodSet("sub-b", 1, 2, required_level="rack", colocate_with=Colocation("sub-a", "zone")),
    )
    got = kai(snap, g)
    assert nodes_of(got, "sub-a") == ["node2"] and nodes_of(got, "sub-b") == ["node3"]


def test_required_rack_prefers_the_packed_rack() -> None:
    """allocateTopology_test.go, "Required topology constraint - prefer packed domain": two
    racks of one node, node1 with one GPU busy; two 1-GPU pods required on a rack go to rack2
    (the higher request-to-free ratio)."""
    snap = snapshot([node("node0", 8, rack="rack1"), node("node1", 7, rack="rack2")], RACK)
    assert nodes_of(kai(snap, gang(PodSet("sub-a", 2, 1, required_level="rack")))) == ["node1", "node1"]


def test_preferred_spine_gathers_pods_on_the_emptiest_spines() -> None:
    """allocateTopology_test.go, "Combined preferred and required topology constraints -
    preferred level respected when possible": eight 1-GPU nodes on one rack, two per spine;
    three pods required on the rack, preferring a spine: the spines tie and rank in id order,
    spine4 highest, so node6, node7, then node4 (spine3)."""
    nodes = [node(f"node{k}", 1, rack="rack1", spine=f"spine{k // 2 + 1}") for k in range(8)]
    got = kai(
        snapshot(nodes, RACK, SPINE), gang(PodSet("w", 3, 1, required_level="rack", preferred_level="spine"))
    )
    assert nodes_of(got) == ["node6", "node7", "node4"]


def test_podgroup_preference_orders_subgroups_without_their_own() -> None:
    """allocateTopology_test.go, "Hierarchical Preferred Topology - PodGroup prefers Spine,
    SubGroups has no preference - should allocate on closest Spine nodes": six 1-pod
    subgroups, the PodGroup prefers a spine; no spine holds six, zone1 does; the subgroups, in
    name order, take spine2 (ranked highest) first: node4..node7, then node0, node1."""
    snap = snapshot(evenly(1, 2, 2, 2, free=1), ZONE, SPINE, RACK)
    names = ["pod-a-1", "pod-a-2", "pod-a-3", "pod-b-1", "pod-b-2", "pod-b-3"]
    g = gang(
        PodSet(names[0], 1, 1),
        *(PodSet(n, 1, 1, colocate_with=Colocation(names[0], "spine")) for n in names[1:]),
    )
    got = kai(snap, g)
    assert [nodes_of(got, n)[0] for n in names] == ["node4", "node5", "node6", "node7", "node0", "node1"]


def test_subgroup_preference_overrides_the_podgroups() -> None:
    """allocateTopology_test.go, "Hierarchical Conflicting Preferred Topology - PodGroup
    prefers Spine, SubGroups prefer Rack - should allocate on closest Rack nodes": subgroup-a
    (3 pods, preferring a rack) takes spine1, rack2 first (node2, node3, node0); then spine1
    has one GPU left, so subgroup-b goes to spine2, rack4 first (node6, node7, node4)."""
    snap = snapshot(evenly(1, 2, 2, 2, free=1), ZONE, SPINE, RACK)
    g = gang(
        PodSet("subgroup-a", 3, 1, preferred_level="rack"),
        PodSet("subgroup-b", 3, 1, preferred_level="rack", colocate_with=Colocation("subgroup-a", "spine")),
    )
    got = kai(snap, g)
    assert nodes_of(got, "subgroup-a") == ["node2", "node3", "node0"]
    assert nodes_of(got, "subgroup-b") == ["node6", "node7", "node4"]


def test_bin_packing_takes_the_most_occupied_spine() -> None:
    """allocateTopology_test.go, "Bin Packing - allocate on domain with least free resources
    (most occupied)": spine1 has one free GPU (node3), spine2 four; one pod preferring a spine
    goes to node3."""
    nodes = evenly(1, 2, 2, 2, free=1)
    nodes[:3] = [node(n.name, 0, **{k.split("/")[1]: v for k, v in n.labels.items()}) for n in nodes[:3]]
    got = kai(snapshot(nodes, ZONE, SPINE, RACK), gang(PodSet("w", 1, 1, preferred_level="spine")))
    assert nodes_of(got) == ["node3"]


def test_bin_packing_packs_the_top_most_domain_first() -> None:
    """allocateTopology_test.go, "Bin Packing - Pack Top-Most domain first": spine1 has three
    1-GPU racks, spine2 one 2-GPU rack; one pod preferring a rack goes to spine2's rack4
    (node3): the fuller spine is walked first, though spine1's racks are fuller still."""
    nodes = [
        node("node0", 1, zone="zone1", spine="spine1", rack="rack1"),
        node("node1", 1, zone="zone1", spine="spine1", rack="rack2"),
        node("node2", 1, zone="zone1", spine="spine1", rack="rack3"),
        node("node3", 1, zone="zone1", spine="spine2", rack="rack4"),
        node("node4", 1, zone="zone1", spine="spine2", rack="rack4"),
    ]
    got = kai(snapshot(nodes, ZONE, SPINE, RACK), gang(PodSet("w", 1, 1, preferred_level="rack")))
    assert nodes_of(got) == ["node3"]


# -- pkg/scheduler/plugins/topology: job_filtering_test.go, common_test.go ----------------------


def cpu_node(name: str, millis: int, **labels: str) -> NodeState:
    return node(name, 8, NodeFacts(allocatable=Resources(cpu_millis=millis, pods=100)), **labels)


def test_subset_takes_the_rack_whose_nodes_fit_the_pods() -> None:
    """job_filtering_test.go TestTopologyPlugin_subsetNodesFn, "successful topology allocation
    - right nodes": two 500m pods, required zone, preferred rack; node-1 (rack1) has 1000m,
    node-2 (rack2) 400m: rack1 holds both pods, so node-1 takes them."""
    snap = snapshot(
        [
            cpu_node("node-1", 1000, zone="zone1", rack="rack1"),
            cpu_node("node-2", 400, zone="zone1", rack="rack2"),
        ],
        ZONE,
        RACK,
    )
    ps = PodSet(
        "w", 2, 0, required_level="zone", preferred_level="rack", requests=PodRequests(cpu_millis=500)
    )
    assert nodes_of(kai(snap, gang(ps))) == ["node-1", "node-1"]


def test_subset_refuses_a_domain_without_room() -> None:
    """job_filtering_test.go TestTopologyPlugin_subsetNodesFn, "insufficient allocatable pods -
    no domains found": a 2000m pod, required zone, the zone's one node has 1000m: "not enough
    resources in zone1 to allocate the job"."""
    snap = snapshot([cpu_node("node-1", 1000, zone="zone1")], ZONE)
    ps = PodSet("w", 1, 0, required_level="zone", requests=PodRequests(cpu_millis=2000))
    result = refused(kai(snap, gang(ps)))
    assert "not enough free resources in zone zone1 for 1 pods" in result.reason
    assert not result.feasible_when_empty


def test_pods_with_and_without_gpus_are_counted_by_their_summed_requests() -> None:
    """job_filtering_test.go TestTopologyPlugin_subsetNodesFn, "successful allocation with
    mixed GPU tasks - usePodCountAccounting returns false": a GPU pod and a CPU-only pod of
    2000m each; each rack's node has 2000m, so no rack holds the 4000m asked and the zone's
    node set (both nodes) is the one offered: one pod on each. ``cpu`` goes first (name
    order) to the rack ranked highest by the preferred level (rack2: the racks tie, rack1
    sorts first and ranks lowest), ``gpu`` to the node with cpu left."""
    snap = snapshot(
        [
            cpu_node("node-1", 2000, zone="zone1", rack="rack1"),
            cpu_node("node-2", 2000, zone="zone1", rack="rack2"),
        ],
        ZONE,
        RACK,
    )
    cpu = PodRequests(cpu_millis=2000)
    g = gang(
        PodSet("gpu", 1, 1, requests=cpu),
        PodSet("cpu", 1, 0, requests=cpu, colocate_with=Colocation("gpu", "rack")),
    )
    got = kai(snap, g)
    assert nodes_of(got, "cpu") == ["node-2"] and nodes_of(got, "gpu") == ["node-1"]


def test_allocatable_pods_sum_over_a_domains_nodes() -> None:
    """job_filtering_test.go TestTopologyPlugin_calcTreeAllocatable, "children cannot allocate
    full job individually - parent sums allocations": two 800m pods, one 1000m node per rack:
    each rack can allocate 1, the zone 2; so a rack cannot take the job and the zone can."""
    snap = snapshot(
        [
            cpu_node("node-1", 1000, zone="zone1", rack="rack1"),
            cpu_node("node-2", 1000, zone="zone1", rack="rack2"),
        ],
        ZONE,
        RACK,
    )
    req = PodRequests(cpu_millis=800)
    result = refused(kai(snap, gang(PodSet("w", 2, 0, required_level="rack", requests=req))))
    assert "can allocate only 1" in result.reason
    assert sorted(nodes_of(kai(snap, gang(PodSet("w", 2, 0, required_level="zone", requests=req))))) == [
        "node-1",
        "node-2",
    ]


def test_a_node_without_a_topology_label_is_outside_the_topology() -> None:
    """common_test.go TestLowestCommonDomainID, "invalid nodes are filtered out" (and
    ``isNodePartOfTopology``): node-2 lacks the rack label, so a pod set preferring a rack is
    never offered it, even with room there; a zone constraint's Topology has no rack level,
    and there node-2 is used."""
    snap = snapshot([node("node-1", 1, zone="z1", rack="r1"), node("node-2", 8, zone="z1")], ZONE, RACK)
    refused(kai(snap, gang(PodSet("w", 2, 1, preferred_level="rack"))))
    assert nodes_of(kai(snap, gang(PodSet("w", 2, 1, required_level="zone")))) == ["node-1", "node-2"]


# -- the mapping of our gangs ------------------------------------------------------------------


def test_unconstrained_pods_binpack_across_the_cluster_by_name_on_ties() -> None:
    """No topology constraint: subSetNodesFn offers every node at once, and nodeplacement's
    binpack puts each pod on the node with the fewest free GPUs that fits, then by name
    (session.go ``sortNodesByScore``), whatever the snapshot's order."""
    nodes = [node("b", 4, rack="r1"), node("a", 4, rack="r2"), node("c", 2, rack="r1")]
    for order in (nodes, nodes[::-1]):
        snap = snapshot(order, RACK)
        assert nodes_of(kai(snap, gang(PodSet("w", 3, 2)))) == ["c", "a", "a"]


def test_a_clique_constraint_uses_the_clique_topology_and_a_leaf_one_every_leaf() -> None:
    """A Topology per constraint, from the labels nodes carry: ``clique`` only on the nodes
    that carry the clique label (the GB200 trays), ``leaf`` on every leaf, the fuller one
    (the trays' leaf) first while it holds the pods, the H100 leaf when it does not."""
    leaf, clique = Level("leaf", "k8s.io/leaf"), Level("clique", "nvidia.com/gpu.clique", kind="fabric")
    nodes = [node(f"h{k}", 8, leaf="leaf-h") for k in range(2)]
    nodes += [node(f"t{k}", 6, leaf="leaf-t", **{"nvidia.com/gpu.clique": "c1"}) for k in range(2)]
    snap = snapshot(nodes, leaf, clique)
    assert set(nodes_of(kai(snap, gang(PodSet("w", 2, 4, required_level="clique"))))) <= {"t0", "t1"}
    assert set(nodes_of(kai(snap, gang(PodSet("w", 2, 4, required_level="leaf"))))) <= {"t0", "t1"}
    assert set(nodes_of(kai(snap, gang(PodSet("w", 4, 4, required_level="leaf"))))) == {"h0", "h1"}
    refused(kai(snap, gang(PodSet("w", 4, 4, required_level="clique"))))


def test_subgroups_are_allocated_in_name_order() -> None:
    """subgrouporder ranks unsatisfied subgroups alike and the session falls back to names
    (session_plugins.go ``SubGroupOrderFn``): ``decode`` is placed before ``prefill`` and
    takes the fullest node though it is listed second."""
    snap = snapshot([node("n0", 4, rack="r1"), node("n1", 8, rack="r1")], RACK)
    g = gang(PodSet("prefill", 1, 4), PodSet("decode", 1, 4))
    got = kai(snap, g)
    assert nodes_of(got, "decode") == ["n0"] and nodes_of(got, "prefill") == ["n1"]
