"""The Kueue TAS baseline: one ResourceFlavor per GPU model, scanned the way Kueue v0.19.2's
flavor assigner scans them, and TAS inside the chosen flavor."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from extender.peers import kueue_tas
from extender.peers.common import Work
from extender.peers.kueue import UNLABELLED, Flavor, flavor_allows, resource_flavors, topology_assignment
from extender.placement.feasibility import NodeFacts, Resources
from extender.placement.request import GangRequest, NodeRequirement, NodeTerm, PodRequests, PodSet
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.gpus import PRODUCT_LABEL
from extender.topology.hierarchy import Hierarchy, Level
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph

LEAF = Level("leaf", "fabric.topograph.run/tier-0")
HGX = preset_graph("hgx-h100")
PCIE = preset_graph("pcie-8gpu-2socket")
H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
GB200 = "NVIDIA-GB200"
MEMORY = "nvidia.com/gpu.memory"


def gpu_node(
    name: str,
    product: str | None,
    leaf: str = "l0",
    allocated: Sequence[int] = (),
    graph: GpuGraph | None = None,
) -> NodeState:
    labels = {LEAF.label: leaf}
    if product is not None:
        labels[PRODUCT_LABEL] = product
    chosen = graph if graph is not None else (PCIE if product == L40S else HGX)
    return NodeState(name, labels, chosen, frozenset(allocated))


def one(*pod_sets: PodSet) -> GangRequest:
    return GangRequest("g", tuple(pod_sets))


def placed(result: Placement) -> Slice:
    assert isinstance(result, Slice), getattr(result, "reason", result)
    return result


def nodes_by_pod_set(result: Placement) -> Mapping[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in placed(result).slots:
        out.setdefault(s.pod_set, []).append(s.node)
    return out


def select(product: str) -> tuple[NodeRequirement, ...]:
    return (NodeRequirement(PRODUCT_LABEL, "In", (product,)),)


# -- the flavors ------------------------------------------------------------------------


def test_one_flavor_per_product_cheapest_first_and_the_unlabelled_nodes_last() -> None:
    snap = ClusterSnapshot(
        [
            gpu_node("h0", H100),
            gpu_node("x0", None),
            gpu_node("g0", GB200, graph=preset_graph("gb200-tray")),
            gpu_node("l0", L40S),
            gpu_node("h1", H100),
        ],
        Hierarchy((LEAF,)),
    )
    flavors = resource_flavors(snap)
    assert [f.name for f in flavors] == [L40S, H100, GB200, UNLABELLED]
    assert [f.nodes for f in flavors] == [(3,), (0, 4), (2,), (1,)]
    assert flavors[1].node_labels == {PRODUCT_LABEL: H100}
    assert flavors[3].node_labels == {}


def test_a_product_the_price_table_does_not_know_comes_after_the_known_ones() -> None:
    snap = ClusterSnapshot(
        [gpu_node("a", "NVIDIA-A10"), gpu_node("h", H100), gpu_node("l", L40S)], Hierarchy((LEAF,))
    )
    assert [f.name for f in resource_flavors(snap)] == [L40S, H100, "NVIDIA-A10"]


def test_a_flavor_is_judged_by_the_pod_requirements_on_its_own_label_keys() -> None:
    """pkg/scheduler/flavorassigner/flavorassigner_test.go (v0.19.2), TestAssignFlavors:
    "multiple flavors, fits a node selector" (requirements on other keys are ignored),
    "multiple flavors, node affinity fits any flavor" (a term left empty matches any flavor),
    "labelless flavor in group with labeled flavor, workload uses labeled selector" (a flavor
    without the key lets the selector through), "multiple flavors, doesn't fit node affinity"."""
    l40s = Flavor(L40S, {PRODUCT_LABEL: L40S}, ())
    h100 = Flavor(H100, {PRODUCT_LABEL: H100}, ())
    bare = Flavor(UNLABELLED, {}, ())
    wants_h100 = PodSet("w", 1, 1, node_selector=(*select(H100), NodeRequirement("ignored", "In", ("x",))))
    assert [flavor_allows(f, wants_h100) for f in (l40s, h100, bare)] == [False, True, True]
    big_memory = PodSet("w", 1, 1, node_selector=(NodeRequirement(MEMORY, "Gt", ("80000",)),))
    assert flavor_allows(l40s, big_memory)  # memory is no key of the flavor: TAS filters nodes
    any_term = PodSet(
        "w",
        1,
        1,
        affinity=(NodeTerm((NodeRequirement("ignored", "In", ("x",)),)), NodeTerm(select(H100))),
    )
    assert flavor_allows(l40s, any_term)
    neither = PodSet("w", 1, 1, affinity=(NodeTerm((NodeRequirement(PRODUCT_LABEL, "In", (GB200,)),)),))
    assert not flavor_allows(l40s, neither) and not flavor_allows(h100, neither)
    not_l40s = PodSet("w", 1, 1, node_selector=(NodeRequirement(PRODUCT_LABEL, "NotIn", (L40S,)),))
    assert [flavor_allows(f, not_l40s) for f in (l40s, h100, bare)] == [False, True, True]


def test_a_replica_goes_to_the_cheaper_flavor_listed_first_when_both_are_free() -> None:
    snap = ClusterSnapshot([gpu_node("h0", H100, "a"), gpu_node("l0", L40S, "b")], Hierarchy((LEAF,)))
    assert nodes_by_pod_set(kueue_tas(snap, one(PodSet("server", 1, 1)))) == {"server": ["l0"]}


def test_the_first_flavor_wins_over_a_fuller_node_of_a_later_one() -> None:
    """Fails on one flavor over the whole fleet: LeastFreeCapacity there takes the fullest node
    (the H100 with 4 GPUs free); Kueue fixes the flavor first, then runs TAS inside it."""
    snap = ClusterSnapshot(
        [gpu_node("h0", H100, "a", allocated=range(4)), gpu_node("l0", L40S, "b")], Hierarchy((LEAF,))
    )
    assert nodes_by_pod_set(kueue_tas(snap, one(PodSet("server", 1, 4)))) == {"server": ["l0"]}


def test_a_pod_set_that_selects_h100_skips_the_l40s_flavor() -> None:
    snap = ClusterSnapshot([gpu_node("l0", L40S, "a"), gpu_node("h0", H100, "b")], Hierarchy((LEAF,)))
    g = one(PodSet("server", 1, 1, node_selector=select(H100)))
    assert nodes_by_pod_set(kueue_tas(snap, g)) == {"server": ["h0"]}


def test_a_topology_miss_in_the_first_flavor_moves_on_to_the_next_one_cycle_later() -> None:
    """TAS finds no leaf with room for 2 pods of 8 GPUs in L40S (one free node per leaf); the
    assignment turns Preempt, no targets, and the next cycle resumes after L40S (flavorassigner
    ``TriedFlavorIdx``, workload ``NextFlavorToTryForPodSetResource``)."""
    nodes = [gpu_node("l0", L40S, "la"), gpu_node("l1", L40S, "lb")]
    nodes += [gpu_node("h0", H100, "ha"), gpu_node("h1", H100, "ha")]
    snap = ClusterSnapshot(nodes, Hierarchy((LEAF,)))
    g = one(PodSet("tp", 2, 8, required_level="leaf"))
    assert sorted(nodes_by_pod_set(kueue_tas(snap, g))["tp"]) == ["h0", "h1"]


def test_a_miss_in_every_flavor_leaves_the_gang_waiting() -> None:
    nodes = [gpu_node("l0", L40S, "la", allocated=range(4)), gpu_node("h0", H100, "ha", allocated=range(4))]
    snap = ClusterSnapshot(nodes, Hierarchy((LEAF,)))
    result = kueue_tas(snap, one(PodSet("w", 1, 8)))
    assert isinstance(result, Unplaceable) and result.feasible_when_empty
    assert L40S in result.reason and H100 in result.reason
    nowhere = kueue_tas(snap, one(PodSet("w", 1, 1, node_selector=select(GB200))))
    assert isinstance(nowhere, Unplaceable) and "exclude every ResourceFlavor" in nowhere.reason
    assert not nowhere.feasible_when_empty


def test_each_pod_set_takes_its_own_flavor() -> None:
    """``assignFlavors`` groups pod sets only by ``podset-group-name``; otherwise each pod set
    runs its own flavor scan, and TAS runs per flavor."""
    snap = ClusterSnapshot([gpu_node("h0", H100, "a"), gpu_node("l0", L40S, "b")], Hierarchy((LEAF,)))
    g = one(PodSet("prefill", 1, 4, node_selector=select(H100)), PodSet("decode", 1, 4))
    assert nodes_by_pod_set(kueue_tas(snap, g)) == {"prefill": ["h0"], "decode": ["l0"]}


def test_the_scan_moves_every_pod_set_on_after_a_miss() -> None:
    """After a miss the next cycle resumes every pod set after the flavor it had, not only the
    one that missed. ``prefill`` (H100 only) got H100, ``decode`` got L40S and missed (the L40S
    node is full); next cycle ``prefill`` resumes at GB200, which its selector excludes: NoFit,
    no pod set has flavors left to try (``PendingFlavors``), and the gang waits, though H100
    alone would hold both pod sets."""
    nodes = [
        gpu_node("h0", H100, "a"),
        gpu_node("l0", L40S, "b", allocated=range(8)),
        gpu_node("g0", GB200, "c", allocated=range(4), graph=preset_graph("gb200-tray")),
    ]
    snap = ClusterSnapshot(nodes, Hierarchy((LEAF,)))
    g = one(PodSet("prefill", 1, 4, node_selector=select(H100)), PodSet("decode", 1, 4))
    result = kueue_tas(snap, g)
    assert isinstance(result, Unplaceable) and result.pod_set == "decode"
    # The same gang with the pod sets' flavors in step (decode also H100 only) is admitted.
    both = one(
        PodSet("prefill", 1, 4, node_selector=select(H100)),
        PodSet("decode", 1, 4, node_selector=select(H100)),
    )
    assert nodes_by_pod_set(kueue_tas(snap, both)) == {"prefill": ["h0"], "decode": ["h0"]}


# -- TAS inside a flavor: cases of Kueue's own tests ------------------------------------
#
# pkg/cache/scheduler/tas_cache_test.go, TestFindTopologyAssignments (v0.19.2), with the
# default feature gates (TASProfileMixed on). Facts only: the levels, each node's labels and
# free capacity, the pod set's count, request and level, the expected domains or a refusal.
# Where every node holds at most 8 pods of 1 CPU, a node is an 8-GPU node with that many
# GPUs free and a pod asks for 1 GPU; otherwise the CPUs and pods are the node's allocatable
# and the pod asks for no GPU. Upstream hostnames are the node names here.

BLOCK = Level("block", "cloud.com/topology-block")
RACK = Level("rack", "cloud.com/topology-rack")
BLOCK_RACK = Hierarchy((BLOCK, RACK))

#: defaultNodes: b1 {r1: x3, r2: x5 x1 x6}, b2 {r1: x2, r2: x4}; 1 CPU each, x4 2.
DEFAULT_NODES = [
    ("x3", "b1", "r1", 1),
    ("x5", "b1", "r2", 1),
    ("x1", "b1", "r2", 1),
    ("x6", "b1", "r2", 1),
    ("x2", "b2", "r1", 1),
    ("x4", "b2", "r2", 2),
]
#: scatteredNodes: b1 {r1: x3 (4 CPUs), x5, x1}, b2 {r1: x6 (2 CPUs), x2}.
SCATTERED_NODES = [
    ("x3", "b1", "r1", 4),
    ("x5", "b1", "r1", 1),
    ("x1", "b1", "r1", 1),
    ("x6", "b2", "r1", 2),
    ("x2", "b2", "r1", 1),
]
#: binaryTreesNodes: two blocks of two racks of two nodes, 1 CPU each.
BINARY_TREE_NODES = [
    ("x3", "b1", "r1", 1),
    ("x5", "b1", "r1", 1),
    ("x1", "b1", "r2", 1),
    ("x6", "b1", "r2", 1),
    ("x2", "b2", "r1", 1),
    ("x4", "b2", "r1", 1),
    ("x7", "b2", "r2", 1),
    ("x8", "b2", "r2", 1),
]


def tas_cluster(
    nodes: Sequence[tuple[str, str, str, int]], extra: Mapping[str, Mapping[str, str]] = {}
) -> ClusterSnapshot:
    """8-GPU nodes labelled with block and rack, ``free`` GPUs each (one pod of 1 GPU per CPU)."""
    return ClusterSnapshot(
        [
            NodeState(
                host, {BLOCK.label: b, RACK.label: r, **extra.get(host, {})}, HGX, frozenset(range(8 - free))
            )
            for host, b, r, free in nodes
        ],
        BLOCK_RACK,
    )


def cpu_cluster(nodes: Sequence[tuple[str, str, str, int, int, int]]) -> ClusterSnapshot:
    """Nodes labelled with block and rack whose allocatable is (CPUs, pods, GiB of memory)."""
    return ClusterSnapshot(
        [
            NodeState(
                host,
                {BLOCK.label: b, RACK.label: r},
                HGX,
                facts=NodeFacts(allocatable=Resources(cpu * 1000, mem << 30, None, pods)),
            )
            for host, b, r, cpu, pods, mem in nodes
        ],
        BLOCK_RACK,
    )


def pods_per_node(result: Placement, pod_set: str | None = None) -> Counter[str]:
    return Counter(s.node for s in placed(result).slots if pod_set is None or s.pod_set == pod_set)


def pods_per_rack(snap: ClusterSnapshot, result: Placement) -> Counter[tuple[str, str]]:
    return Counter(
        (snap.node(s.node).labels[BLOCK.label], snap.node(s.node).labels[RACK.label])
        for s in placed(result).slots
    )


def refused(result: Placement, short_by: int) -> None:
    assert isinstance(result, Unplaceable), result
    assert result.short_by == short_by, result.reason


def test_upstream_minimize_the_number_of_used_racks_before_the_number_of_nodes() -> None:
    """tas_cache_test.go "minimize the number of used racks before optimizing the number of
    nodes; BestFit": b1 {r1: x3:2, r2: x5:2, r3: x1 x6 x2 x4 at 1}; block required, 4 pods of
    1 CPU -> x1, x2, x4, x6 (one rack), not x3 and x5 (two racks, fewer nodes)."""
    nodes = [("x3", "b1", "r1", 2), ("x5", "b1", "r2", 2)]
    nodes += [(x, "b1", "r3", 1) for x in ("x1", "x6", "x2", "x4")]
    result = kueue_tas(tas_cluster(nodes), one(PodSet("w", 4, 1, required_level="block")))
    assert pods_per_node(result) == {"x1": 1, "x2": 1, "x4": 1, "x6": 1}


def test_upstream_choose_the_node_that_can_accommodate_all_pods() -> None:
    """tas_cache_test.go "choose the node that can accommodate all Pods": b1/r1 {x3:2, x5:1,
    x1:1}; block required, 2 pods -> both on x3."""
    nodes = [("x3", "b1", "r1", 2), ("x5", "b1", "r1", 1), ("x1", "b1", "r1", 1)]
    result = kueue_tas(tas_cluster(nodes), one(PodSet("w", 2, 1, required_level="block")))
    assert pods_per_node(result) == {"x3": 2}


def test_upstream_unconstrained_pods_scatter_over_the_fullest_hosts() -> None:
    """tas_cache_test.go "unconstrained; 6 pods fit into hosts scattered across the whole
    datacenter even they could fit into single rack; BestFit" and "no annotation; implied
    default to unconstrained; ..." (same facts, same answer): scatteredNodes, 6 pods ->
    x1, x3, x5, x2 one each, x6 two."""
    result = kueue_tas(tas_cluster(SCATTERED_NODES), one(PodSet("w", 6, 1)))
    assert pods_per_node(result) == {"x1": 1, "x3": 1, "x5": 1, "x2": 1, "x6": 2}


def test_upstream_unconstrained_single_pod_least_free_capacity() -> None:
    """tas_cache_test.go "unconstrained; a single pod fits into each host; LeastFreeCapacity;
    TASProfileMixed": defaultNodes, 1 pod -> x3."""
    assert pods_per_node(kueue_tas(tas_cluster(DEFAULT_NODES), one(PodSet("w", 1, 1)))) == {"x3": 1}


def test_upstream_block_required_four_pods_one_host_each() -> None:
    """tas_cache_test.go "block required; 4 pods fit into one host each; BestFit":
    binaryTreesNodes, 4 pods -> x3, x5, x1, x6 (block b1)."""
    result = kueue_tas(tas_cluster(BINARY_TREE_NODES), one(PodSet("w", 4, 1, required_level="block")))
    assert pods_per_node(result) == {"x3": 1, "x5": 1, "x1": 1, "x6": 1}


def test_upstream_host_required_single_pod() -> None:
    """tas_cache_test.go "host required; single Pod fits in the host; BestFit": defaultNodes,
    hostname required, 1 pod -> x3."""
    result = kueue_tas(tas_cluster(DEFAULT_NODES), one(PodSet("w", 1, 1, required_level="node")))
    assert pods_per_node(result) == {"x3": 1}


def test_upstream_rack_required() -> None:
    """tas_cache_test.go, defaultNodes, rack required: "rack required; single Pod fits in a
    rack; BestFit" (1 pod -> b1/r1), "rack required; multiple Pods fit in a rack; BestFit"
    (3 -> b1/r2), "rack required; multiple Pods fit in some racks; BestFit" (2 -> b2/r2),
    "rack required; too many pods to fit in any rack; BestFit" (4: "allows to fit only 3 out
    of 4 pod(s)")."""
    snap = tas_cluster(DEFAULT_NODES)
    for count, rack in ((1, ("b1", "r1")), (3, ("b1", "r2")), (2, ("b2", "r2"))):
        result = kueue_tas(snap, one(PodSet("w", count, 1, required_level="rack")))
        assert pods_per_rack(snap, result) == {rack: count}
    refused(kueue_tas(snap, one(PodSet("w", 4, 1, required_level="rack"))), 4 - 3)


def test_upstream_block_required() -> None:
    """tas_cache_test.go, defaultNodes, block required: "block required; single Pod fits in a
    block and a single rack; BestFit" (1 pod -> b2/r1), "block required; Pods fit in a block
    spread across two racks; BestFit" (4 -> b1/r1 1, b1/r2 3), "block required; single Pod
    which cannot be split; BestFit" (1 pod of 4 CPUs: refused), "block required; too many Pods
    to fit requested; BestFit" (5: "allows to fit only 4 out of 5 pod(s)")."""
    snap = tas_cluster(DEFAULT_NODES)
    single = kueue_tas(snap, one(PodSet("w", 1, 1, required_level="block")))
    assert pods_per_rack(snap, single) == {("b2", "r1"): 1}
    four = kueue_tas(snap, one(PodSet("w", 4, 1, required_level="block")))
    assert pods_per_rack(snap, four) == {("b1", "r1"): 1, ("b1", "r2"): 3}
    refused(kueue_tas(snap, one(PodSet("w", 1, 4, required_level="block"))), 1)
    refused(kueue_tas(snap, one(PodSet("w", 5, 1, required_level="block"))), 5 - 4)


def test_upstream_preferred_climbs_and_then_spreads() -> None:
    """tas_cache_test.go, defaultNodes: "rack preferred; but only block can accommodate the
    workload; BestFit" (4 -> b1/r1 1, b1/r2 3), "rack preferred; but only multiple blocks can
    accommodate the workload; BestFit" and "block preferred; but only multiple blocks can
    accommodate the workload; BestFit" (6 -> b1/r1 1, b1/r2 3, b2/r2 2), "block preferred; but
    the workload cannot be accommodate in entire topology; BestFit" (10: only 7 fit)."""
    snap = tas_cluster(DEFAULT_NODES)
    four = kueue_tas(snap, one(PodSet("w", 4, 1, preferred_level="rack")))
    assert pods_per_rack(snap, four) == {("b1", "r1"): 1, ("b1", "r2"): 3}
    for level in ("rack", "block"):
        six = kueue_tas(snap, one(PodSet("w", 6, 1, preferred_level=level)))
        assert pods_per_rack(snap, six) == {("b1", "r1"): 1, ("b1", "r2"): 3, ("b2", "r2"): 2}
    refused(kueue_tas(snap, one(PodSet("w", 10, 1, preferred_level="block"))), 10 - 7)


def test_upstream_block_preferred_pods_fit_in_two_blocks() -> None:
    """tas_cache_test.go "block preferred; Pods fit in 2 blocks; BestFit": one level (block),
    b1:2, b2:1, b3:4; 5 pods -> b2 1, b3 4."""
    nodes = [
        NodeState(b, {BLOCK.label: b}, HGX, frozenset(range(8 - free)))
        for b, free in (("b1", 2), ("b2", 1), ("b3", 4))
    ]
    result = kueue_tas(
        ClusterSnapshot(nodes, Hierarchy((BLOCK,))), one(PodSet("w", 5, 1, preferred_level="block"))
    )
    assert pods_per_node(result) == {"b2": 1, "b3": 4}


def test_upstream_only_nodes_with_the_flavors_labels_are_considered() -> None:
    """tas_cache_test.go "only nodes with matching labels are considered; no matching node;
    BestFit" and "...; matching node is found; BestFit": the flavor's nodeLabels pick its nodes
    (here nvidia.com/gpu.product for zone); hostname required, 1 pod. Inside the H100 flavor
    only the H100 node counts, though the L40S node sorts first; an H100 flavor whose node is
    full has no room, whatever the L40S node has."""
    snap = ClusterSnapshot([gpu_node("a-l40s", L40S), gpu_node("b-h100", H100)], Hierarchy((LEAF,)))
    h100 = next(f for f in resource_flavors(snap) if f.name == H100)
    work = Work(snap, snap.free_masks())
    assert topology_assignment(snap, work, PodSet("w", 1, 1, required_level="node"), h100) is None
    assert [s.node for s in work.slots["w"]] == ["b-h100"]
    full = ClusterSnapshot(
        [gpu_node("a-l40s", L40S), gpu_node("b-h100", H100, allocated=range(8))], Hierarchy((LEAF,))
    )
    h100 = next(f for f in resource_flavors(full) if f.name == H100)
    miss = topology_assignment(
        full, Work(full, full.free_masks()), PodSet("w", 1, 1, required_level="node"), h100
    )
    assert miss is not None and miss.short_by == 1


def test_upstream_node_selector_filters_the_nodes_of_the_flavor() -> None:
    """tas_cache_test.go "skip node which doesn't match node selector, missing label; BestFit",
    "skip node which doesn't match node selector, label exists, value doesn't match; BestFit",
    "allow to schedule on node which matches node; BestFit": hostname required, 1 pod."""
    nodes = [("x3", "b1", "r1", 1), ("x5", "b1", "r1", 1)]
    snap = tas_cluster(nodes, {"x3": {"custom-label-1": "value-1"}, "x5": {"custom-label-1": "value-2"}})

    def wants(value: str) -> GangRequest:
        need = (NodeRequirement("custom-label-1", "In", (value,)),)
        return one(PodSet("w", 1, 1, required_level="node", node_selector=need))

    assert pods_per_node(kueue_tas(snap, wants("value-2"))) == {"x5": 1}
    refused(kueue_tas(snap, wants("value-3")), 1)
    bare = tas_cluster([("x3", "b1", "r1", 1)])
    refused(kueue_tas(bare, wants("custom-value-1")), 1)


#: multipodNodeset: b1 {r1: x3, r2: x5 x1 x6}, b2 {r1: x2, r2: x4}: (CPUs, pods, GiB).
MULTIPOD_NODES = [
    ("x3", "b1", "r1", 10, 10, 1),
    ("x5", "b1", "r2", 10, 10, 1),
    ("x1", "b1", "r2", 10, 10, 1),
    ("x6", "b1", "r2", 10, 10, 1),
    ("x2", "b2", "r1", 10, 10, 1),
    ("x4", "b2", "r2", 20, 40, 4),
]


def test_upstream_multiple_pod_sets_rack_required_for_both() -> None:
    """tas_cache_test.go "multiple podsets: rack required for both, different resource
    requests; BestFit": podset1 2 pods of 1 CPU, podset2 1 pod of 1 KiB memory, both rack
    required -> both b1/r1."""
    snap = cpu_cluster(MULTIPOD_NODES)
    g = one(
        PodSet("podset1", 2, 0, required_level="rack", requests=PodRequests(cpu_millis=1000)),
        PodSet("podset2", 1, 0, required_level="rack", requests=PodRequests(memory_bytes=1024)),
    )
    assert pods_per_rack(snap, kueue_tas(snap, g)) == {("b1", "r1"): 3}


def test_upstream_multiple_pod_sets_block_required_and_unconstrained() -> None:
    """tas_cache_test.go "multiple podsets: block required for one, unconstrained for another;
    TASProfileMixed": podset1 8 pods of 1 CPU, block required -> x2 8; podset2 2 pods,
    unconstrained -> x2 2 (the fullest node after podset1: 2 pods fit there, 10 elsewhere)."""
    snap = cpu_cluster(MULTIPOD_NODES)
    g = one(
        PodSet("podset1", 8, 0, required_level="block", requests=PodRequests(cpu_millis=1000)),
        PodSet("podset2", 2, 0, requests=PodRequests(cpu_millis=1000)),
    )
    result = kueue_tas(snap, g)
    assert pods_per_node(result, "podset1") == {"x2": 8}
    assert pods_per_node(result, "podset2") == {"x2": 2}
