"""The objective and the hard rules every policy is judged by."""

from __future__ import annotations

import dataclasses
import re

import pytest

from extender import cost
from extender.cost import Comm, ModelDims
from extender.placement import scoring
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.hierarchy import Hierarchy, Level
from extender.topology.model import Tier
from extender.topology.presets import preset_graph

SPINE = "fabric.topograph.run/tier-1"
LEAF = "fabric.topograph.run/tier-0"
CLIQUE = "nvidia.com/gpu.clique"
H = Hierarchy((Level("spine", SPINE), Level("leaf", LEAF), Level("clique", CLIQUE, kind="fabric")))


def snapshot() -> ClusterSnapshot:
    hgx, pcie, tray = (preset_graph(p) for p in ("hgx-h100", "pcie-8gpu-2socket", "gb200-tray"))
    nodes = [
        NodeState("h1", {SPINE: "s1", LEAF: "l1"}, hgx, allocated=frozenset({7})),
        NodeState("h2", {SPINE: "s1", LEAF: "l1"}, hgx),
        NodeState("h3", {SPINE: "s1", LEAF: "l2"}, hgx),
        NodeState("h4", {SPINE: "s2", LEAF: "l3"}, hgx),
        NodeState("p1", {SPINE: "s1", LEAF: "l1"}, pcie),
        NodeState("t1", {SPINE: "s1", LEAF: "l2", CLIQUE: "c.0"}, tray),
        NodeState("t2", {SPINE: "s1", LEAF: "l2", CLIQUE: "c.0"}, tray),
        NodeState("t3", {SPINE: "s1", LEAF: "l2", CLIQUE: "c.1"}, tray, mnnvl_gang="other"),
    ]
    return ClusterSnapshot(nodes, H)


def slot(node: str, gpus: tuple[int, ...], k: int = 0, pod_set: str = "p") -> PodSlot:
    return PodSlot(pod_set, k, node, gpus)


def one(ps: PodSet) -> GangRequest:
    return GangRequest("g", (ps,))


# --- levels -----------------------------------------------------------------------------------


def test_resolve_level() -> None:
    assert scoring.resolve_level("leaf", H) == (1, None)
    assert scoring.resolve_level(LEAF, H) == (1, None)  # the label key works too
    assert scoring.resolve_level("node", H) == (scoring.node_scope(H), Tier.NODE)
    assert scoring.resolve_level("nvlink", H) == (None, Tier.NVLINK)
    assert scoring.resolve_level("numa", H) == (None, Tier.NUMA)
    with pytest.raises(
        scoring.LevelError, match=r"unknown level 'rack'; known levels: spine, leaf, clique, node"
    ):
        scoring.resolve_level("rack", H)


def test_resolve_need_drops_preferences_that_are_not_tighter() -> None:
    need = scoring.resolve_need(PodSet("p", 1, 2, required_level="leaf", preferred_level="spine"), H)
    assert (need.scope, need.preferred_scope) == (1, None)
    need = scoring.resolve_need(PodSet("p", 1, 2, required_level="spine", preferred_level="leaf"), H)
    assert (need.scope, need.preferred_scope) == (0, 1)
    need = scoring.resolve_need(PodSet("p", 1, 2, required_level="pcie", preferred_level="numa"), H)
    assert (need.tier, need.preferred_tier) == (Tier.PXB, None)
    need = scoring.resolve_need(PodSet("p", 1, 2), H)
    assert need == scoring.Need(scoring.ANYWHERE, None, None, None)


def test_pod_tier_default_required_and_preferred() -> None:
    snap = snapshot()
    p1 = snap.index("p1")

    def tier(ps: PodSet, preferred: bool = False) -> Tier | None:
        return scoring.pod_tier(snap, p1, ps, scoring.resolve_need(ps, H), preferred)

    assert tier(PodSet("p", 1, 2)) == Tier.PIX  # the tightest this node type offers for 2 GPUs
    assert tier(PodSet("p", 1, 4)) == Tier.NUMA
    assert tier(PodSet("p", 1, 8)) == Tier.NODE
    assert tier(PodSet("p", 1, 16)) is None
    assert tier(PodSet("p", 1, 2, required_level="numa")) == Tier.NUMA  # relaxed on request
    assert tier(PodSet("p", 1, 2, preferred_level="nvlink"), preferred=True) == Tier.NVLINK
    # A preferred tier looser than the default never loosens it.
    assert tier(PodSet("p", 1, 2, preferred_level="numa"), preferred=True) == Tier.PIX


# --- the objective ----------------------------------------------------------------------------


def test_span_of() -> None:
    snap = snapshot()
    assert scoring.span_of(snap, [slot("h1", (0, 1)), slot("h1", (2, 3))]) == scoring.Span(900.0, False, True)
    assert scoring.span_of(snap, [slot("p1", (0,)), slot("p1", (4,))]) == scoring.Span(
        cost.SYS_GBPS, False, False
    )
    assert scoring.span_of(snap, [slot("h1", (0,)), slot("h2", (0,))]) == scoring.Span(100.0, True, False)
    assert scoring.span_of(snap, [slot("h1", (0,)), slot("h3", (0,))]) == scoring.Span(50.0, True, False)
    assert scoring.span_of(snap, [slot("h1", (0,)), slot("h4", (0,))]) == scoring.Span(25.0, True, False)
    assert scoring.span_of(snap, [slot("t1", (0,)), slot("t2", (0,))]) == scoring.Span(1800.0, True, True)
    # Two cliques share only their leaf: the network, not NVLink.
    assert scoring.span_of(snap, [slot("t1", (0,)), slot("t3", (0,))]) == scoring.Span(100.0, True, False)


def test_one_pod_costs_the_seed_formula_over_its_own_gpus() -> None:
    snap = snapshot()
    ps = PodSet("p", 1, 4, Comm.ALLREDUCE)
    got = scoring.pod_set_micros(snap, ps, [slot("p1", (0, 1, 2, 3))])
    assert got == pytest.approx(cost.tp_layer_us(4, ps.model, 32.0, cost.ALPHA_PCIE_US))
    got = scoring.pod_set_micros(snap, ps, [slot("h1", (0, 1, 2, 3))])
    assert got == pytest.approx(cost.tp_layer_us(4, ps.model, 900.0, cost.ALPHA_NVLINK_US))


def test_allreduce_across_nodes_is_one_ring_at_the_slowest_hop() -> None:
    snap = snapshot()
    ps = PodSet("p", 2, 2, Comm.ALLREDUCE)
    same_leaf = scoring.pod_set_micros(snap, ps, [slot("h1", (0, 1)), slot("h2", (0, 1), 1)])
    assert same_leaf == pytest.approx(cost.tp_layer_us(4, ps.model, 100.0, cost.ALPHA_NETWORK_US))
    # A PCIe pod in the ring: its 64 GB/s switch is slower than the 100 GB/s leaf.
    with_pcie = scoring.pod_set_micros(snap, ps, [slot("h1", (0, 1)), slot("p1", (0, 1), 1)])
    assert with_pcie == pytest.approx(cost.tp_layer_us(4, ps.model, 64.0, cost.ALPHA_NETWORK_US))
    across_spines = scoring.pod_set_micros(snap, ps, [slot("h1", (0, 1)), slot("h4", (0, 1), 1)])
    assert same_leaf < with_pcie < across_spines
    in_clique = scoring.pod_set_micros(snap, ps, [slot("t1", (0, 1)), slot("t2", (0, 1), 1)])
    assert in_clique == pytest.approx(cost.tp_layer_us(4, ps.model, 1800.0, cost.ALPHA_NVLINK_US))


def test_alltoall_pipeline_none_and_kv() -> None:
    snap = snapshot()
    slots = [slot("h1", (0, 1)), slot("h3", (0, 1), 1)]
    dims = ModelDims()
    intra = cost.tp_layer_us(2, dims, 900.0, cost.ALPHA_NVLINK_US)
    ep = scoring.pod_set_micros(snap, PodSet("p", 2, 2, Comm.ALLTOALL), slots)
    assert ep == pytest.approx(cost.ep_layer_us(4, dims, 50.0, cost.ALPHA_NETWORK_US))
    pp = scoring.pod_set_micros(snap, PodSet("p", 2, 2, Comm.PIPELINE), slots)
    assert pp == pytest.approx(intra + cost.pipeline_layer_us(2, dims, 50.0, cost.ALPHA_NETWORK_US))
    none = scoring.pod_set_micros(snap, PodSet("p", 2, 2, Comm.NONE), slots)
    assert none == pytest.approx(intra)
    kv = PodSet("d", 1, 2, Comm.KV_TRANSFER)
    near = scoring.pod_set_micros(snap, kv, [slot("h1", (4, 5))], [slot("h1", (0, 1))])
    far = scoring.pod_set_micros(snap, kv, [slot("h4", (4, 5))], [slot("h1", (0, 1))])
    assert near == pytest.approx(intra + cost.kv_layer_us(dims, 900.0, cost.ALPHA_NVLINK_US))
    assert far == pytest.approx(intra + cost.kv_layer_us(dims, 25.0, cost.ALPHA_NETWORK_US))
    assert scoring.pod_set_micros(snap, kv, [slot("h4", (4, 5))]) == pytest.approx(intra)  # no partner


def test_pod_set_cost_matches_pod_set_micros() -> None:
    snap = snapshot()
    for comm in Comm:
        ps = PodSet("p", 2, 2, comm)
        slots = [slot("h1", (0, 1)), slot("p1", (0, 1), 1)]
        span = scoring.span_of(snap, slots)
        assert scoring.pod_set_cost(ps, [900.0, 64.0], span) == pytest.approx(
            scoring.pod_set_micros(snap, ps, slots)
        )


def test_gang_micros_prices_kv_against_the_colocate_with_set() -> None:
    snap = snapshot()
    prefill = PodSet("prefill", 1, 4, Comm.ALLREDUCE)
    decode = PodSet("decode", 1, 2, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "leaf"))
    gang = GangRequest("g", (prefill, decode))
    slots = [slot("h1", (0, 1, 2, 3), pod_set="prefill"), slot("h2", (0, 1), pod_set="decode")]
    got = scoring.gang_micros(snap, gang, slots)
    assert set(got) == {"prefill", "decode"}
    assert got["decode"] == pytest.approx(scoring.pod_set_micros(snap, decode, slots[1:], slots[:1]))


def test_each_decode_pod_takes_its_kv_cache_from_the_nearest_prefill_pod() -> None:
    """Two prefill and two decode pods on two nodes: one of each per node moves every KV
    cache over NVLink; prefill on one node and decode on the other sends it all over the
    network. The same nodes, the same pod sets, priced apart by the pairing alone."""
    snap = snapshot()
    decode = PodSet("decode", 2, 4, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "leaf"))

    def kv_micros(prefill_nodes: tuple[str, str], decode_nodes: tuple[str, str]) -> float:
        prefill = [slot(n, (0, 1, 2, 3), k, "prefill") for k, n in enumerate(prefill_nodes)]
        halves = {n: iter(((0, 1, 2, 3), (4, 5, 6, 7))) for n in ("h2", "h3")}
        for n in prefill_nodes:
            next(halves[n])
        ours = [slot(n, next(halves[n]), k, "decode") for k, n in enumerate(decode_nodes)]
        return scoring.pod_set_micros(snap, decode, ours, prefill)

    paired = kv_micros(("h2", "h3"), ("h2", "h3"))
    apart = kv_micros(("h2", "h2"), ("h3", "h3"))
    nvlink = scoring.span_of(snap, [slot("h2", (0, 1, 2, 3, 4, 5, 6, 7))])
    network = scoring.span_of(snap, [slot("h2", (0,)), slot("h3", (0,))])
    kv_gap = cost.kv_layer_us(decode.model, network.gbps, network.alpha_us) - cost.kv_layer_us(
        decode.model, nvlink.gbps, nvlink.alpha_us
    )
    assert apart - paired == pytest.approx(kv_gap) and kv_gap > 0


# --- the rules --------------------------------------------------------------------------------


def test_a_valid_slice_has_no_violations() -> None:
    snap = snapshot()
    assert (
        scoring.violations(
            snap, one(PodSet("p", 2, 4)), [slot("h1", (0, 1, 2, 3)), slot("h2", (0, 1, 2, 3), 1)]
        )
        == []
    )


@pytest.mark.parametrize(
    ("ps", "slots", "problem"),
    [
        (PodSet("p", 1, 2), [slot("h1", (6, 7))], r"GPUs \[7\] on h1 are not free"),
        (PodSet("p", 2, 2), [slot("h2", (0, 1)), slot("h2", (1, 2), 1)], r"GPUs \[1\] on h2 given twice"),
        (PodSet("p", 2, 2), [slot("h2", (0, 1))], "1 slots for 2 pods"),
        (PodSet("p", 1, 2), [slot("h2", (0, 1, 2))], "3 GPUs for a pod of 2"),
        (PodSet("p", 1, 2), [slot("p1", (0, 2))], "are NUMA, need PIX"),
        (PodSet("p", 1, 4), [slot("p1", (0, 1, 4, 5))], "are NODE, need NUMA"),
        (PodSet("p", 1, 2, required_level="nvlink"), [slot("p1", (0, 1))], "need NVLINK"),
        (
            PodSet("p", 2, 1, required_level="node"),
            [slot("h1", (0,)), slot("h2", (0,), 1)],
            "required one node",
        ),
        (
            PodSet("p", 2, 1, required_level="leaf"),
            [slot("h1", (0,)), slot("h3", (0,), 1)],
            "more than one leaf",
        ),
        (
            PodSet("p", 2, 1, Comm.ALLREDUCE),
            [slot("t1", (0,)), slot("t3", (0,), 1)],
            "several NVLink cliques",
        ),
        (
            PodSet("p", 2, 1, Comm.ALLTOALL),
            [slot("t1", (0,)), slot("h3", (0,), 1)],
            "mixes clique and non-clique",
        ),
        (PodSet("p", 2, 1), [slot("h1", (0,)), slot("nowhere", (0,), 1)], "unknown node nowhere"),
    ],
)
def test_each_rule(ps: PodSet, slots: list[PodSlot], problem: str) -> None:
    problems = scoring.violations(snapshot(), one(ps), slots)
    assert problems, problem
    assert any(re.search(problem, p) for p in problems), problems


def test_held_nvlink_channel_blocks_only_multi_node_use() -> None:
    snap = snapshot()
    three = ClusterSnapshot(
        [*snap.nodes, NodeState("t4", {SPINE: "s1", LEAF: "l2", CLIQUE: "c.1"}, preset_graph("gb200-tray"))],
        H,
    )
    ps = PodSet("p", 2, 2, Comm.ALLREDUCE)
    problems = scoring.violations(three, one(ps), [slot("t3", (0, 1)), slot("t4", (0, 1), 1)])
    assert problems == ["pod set p: node t3's NVLink channel is held by gang other"]
    assert scoring.violations(three, one(dataclasses.replace(ps, count=1)), [slot("t3", (0, 1))]) == []
    # The gang that holds it may use it.
    own = GangRequest("other", (ps,))
    assert scoring.violations(three, own, [slot("t3", (0, 1)), slot("t4", (0, 1), 1)]) == []


def test_unknown_pod_set_and_gpuless_pods() -> None:
    snap = snapshot()
    assert any(
        "unknown pod set" in p
        for p in scoring.violations(
            snap, one(PodSet("p", 1, 1)), [slot("h2", (0,), pod_set="q"), slot("h2", (1,))]
        )
    )
    # A pod without GPUs (a launcher, say) has no in-node tier to keep.
    assert scoring.violations(snap, one(PodSet("p", 1, 0)), [slot("h1", ())]) == []


def test_pods_that_do_not_talk_are_under_no_clique_rule() -> None:
    """A pod set whose pods do not talk (comm none, or kv-transfer with no colocateWith set)
    uses no NVLink across nodes: it may mix cliques, and another gang's IMEX channel is no
    obstacle; it claims no channel either."""
    snap = snapshot()
    mixed = [slot("t1", (0,)), slot("t3", (0,), 1), slot("h3", (0,), 2)]
    for comm in (Comm.NONE, Comm.KV_TRANSFER):
        ps = PodSet("p", 3, 1, comm)
        assert not scoring.pods_talk(ps)
        assert scoring.violations(snap, one(ps), mixed) == []
        assert scoring.mnnvl_nodes(snap, one(ps), mixed) == ()
    talking = PodSet("p", 2, 1, Comm.PIPELINE)
    pair = [slot("t1", (0,)), slot("t2", (0,), 1)]
    assert scoring.pods_talk(talking)
    assert scoring.mnnvl_nodes(snap, one(talking), pair) == ("t1", "t2")
    assert scoring.mnnvl_nodes(snap, one(talking), pair[:1]) == ()  # one node: no channel


def test_fabric_waste_counts_clique_gpus_of_pod_sets_off_the_fabric() -> None:
    snap = snapshot()
    # One pod on one tray: its GPUs do not use the fabric.
    assert scoring.fabric_waste(snap, one(PodSet("p", 1, 2)), [slot("t1", (0, 1))]) == 2
    assert scoring.fabric_waste(snap, one(PodSet("p", 1, 2)), [slot("h2", (0, 1))]) == 0
    # Pods that talk across two trays of one clique use it; pods that do not, do not.
    pair = [slot("t1", (0, 1)), slot("t2", (0, 1), 1)]
    assert scoring.fabric_waste(snap, one(PodSet("p", 2, 2, Comm.ALLTOALL)), pair) == 0
    assert scoring.fabric_waste(snap, one(PodSet("p", 2, 2)), pair) == 4
    # Mixed: only the clique node's GPUs count.
    assert (
        scoring.fabric_waste(snap, one(PodSet("p", 2, 2)), [slot("t1", (0, 1)), slot("h2", (0, 1), 1)]) == 2
    )
    # A kv-transfer pod on one tray takes its KV cache over the fabric from a partner on another
    # tray of the clique, not from one on the same tray or outside the clique.
    prefill = PodSet("prefill", 1, 2, Comm.ALLREDUCE)
    decode = PodSet("decode", 1, 2, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "clique"))
    gang = GangRequest("g", (prefill, decode))
    over = [slot("t1", (0, 1), pod_set="prefill"), slot("t2", (0, 1), pod_set="decode")]
    same = [slot("t1", (0, 1), pod_set="prefill"), slot("t1", (2, 3), pod_set="decode")]
    assert scoring.fabric_waste(snap, gang, over) == 2  # prefill's own pod is off the fabric
    assert scoring.fabric_waste(snap, gang, same) == 4
    # The objective puts it first, then the cost.
    waste, _, micros = scoring.objective(snap, gang, over)
    assert waste == 2
    assert micros == pytest.approx(sum(scoring.gang_micros(snap, gang, over).values()))
    assert scoring.objective(snap, gang, over) < scoring.objective(snap, gang, same)
    # Without a fabric level nothing is ever wasted.
    flat = ClusterSnapshot(list(snap.nodes), Hierarchy((Level("leaf", LEAF),)))
    assert scoring.fabric_waste(flat, one(PodSet("p", 1, 2)), [slot("t1", (0, 1))]) == 0


def test_colocation_misses_need_every_pod_in_one_domain() -> None:
    snap = snapshot()
    prefill = PodSet("prefill", 2, 2)
    decode = PodSet("decode", 1, 2, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "leaf"))
    gang = GangRequest("g", (prefill, decode))

    def misses(prefill_nodes: tuple[str, str], decode_node: str) -> dict[str, str]:
        slots = [slot(n, (0, 1), k, "prefill") for k, n in enumerate(prefill_nodes)]
        return scoring.colocation_misses(snap, gang, [*slots, slot(decode_node, (2, 3), pod_set="decode")])

    assert misses(("h2", "p1"), "h1") == {}  # all in leaf l1
    assert misses(("h2", "p1"), "h3") == {"decode": "not sharing a leaf with prefill"}
    # Prefill spans two leaves: decode next to one of its pods does not meet the wish.
    assert misses(("h2", "h3"), "h1") == {
        "decode": "not sharing a leaf with prefill (prefill itself spans more than one leaf)"
    }
    # An in-node level is not judged.
    nvlink = GangRequest(
        "g", (prefill, dataclasses.replace(decode, colocate_with=Colocation("prefill", "nvlink")))
    )
    assert (
        scoring.colocation_misses(
            snap,
            nvlink,
            [
                slot("h2", (0, 1), 0, "prefill"),
                slot("h3", (0, 1), 1, "prefill"),
                slot("h4", (0, 1), pod_set="decode"),
            ],
        )
        == {}
    )
