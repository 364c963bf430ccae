"""The Kueue TAS baseline: one ResourceFlavor per GPU model, scanned the way Kueue v0.19.2's
flavor assigner scans them, and TAS inside the chosen flavor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from extender.peers import kueue_tas
from extender.peers.kueue import UNLABELLED, Flavor, flavor_allows, resource_flavors
from extender.placement.request import GangRequest, NodeRequirement, NodeTerm, PodSet
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
