"""The placement rules on hand-built clusters of real machine types (the topology presets)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from extender.cost import Comm
from extender.placement import scoring
from extender.placement.ledger import Ledger
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.search import decide as decide_module
from extender.placement.search.memory import SolverMemory
from extender.placement.slice import PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import Solver, place
from extender.testing.builders import make_cluster, make_node
from extender.testing.hardware import LEAF
from extender.topology.model import Gpu, GpuGraph, Link, PcieLevel, Tier

#: Most nodes here: an HGX H100 under spine-1 and leaf-1 (a case names what differs).
NODE = make_node().hgx_h100().spine("spine-1").leaf("leaf-1")
CLUSTER = make_cluster().levels("spine", "leaf", "clique")


def gang(*pod_sets: PodSet, name: str = "g") -> GangRequest:
    return GangRequest(name, pod_sets)


def tp(count: int, gpus: int, comm: Comm = Comm.ALLREDUCE, name: str = "p", **kw: Any) -> PodSet:
    return PodSet(name, count, gpus, comm, **kw)


def placed(snap: ClusterSnapshot, g: GangRequest) -> Slice:
    got = Solver(snap).place(g)
    assert isinstance(got, Slice), got
    assert scoring.violations(snap, g, got.slots) == []
    return got


def unplaceable(snap: ClusterSnapshot, g: GangRequest) -> Unplaceable:
    got = Solver(snap).place(g)
    assert isinstance(got, Unplaceable), got
    return got


def tier(snap: ClusterSnapshot, slot: PodSlot) -> Tier:
    shape = snap.node(slot.node).shape
    return shape.tier_of(shape.mask_of(slot.gpus))


def two_island_graph() -> GpuGraph:
    """8 GPUs in two NVLink islands of 4 (NV6 inside), PCIe SYS between the islands."""
    gpus = tuple(Gpu(i, numa_node=i // 4) for i in range(8))
    links = {
        (a, b): Link(nvlinks=6) if a // 4 == b // 4 else Link(pcie=PcieLevel.SYS)
        for a in range(8)
        for b in range(a + 1, 8)
    }
    return GpuGraph(gpus, links, model="two-islands")


# --- inside one node --------------------------------------------------------------------------


def test_tp8_on_hgx_gets_one_nvlink_island() -> None:
    snap = CLUSTER.nodes(NODE.named("n1")).obj()
    sl = placed(snap, gang(tp(1, 8)))
    (slot,) = sl.slots
    assert slot.gpus == tuple(range(8))
    assert tier(snap, slot) == Tier.NVLINK
    assert slot.numa_nodes == (0, 1)


def test_tp4_stays_inside_one_nvlink_island() -> None:
    snap = CLUSTER.nodes(NODE.named("n1").graph(two_island_graph()).allocated(0)).obj()
    sl = placed(snap, gang(tp(1, 4)))
    assert sl.slots[0].gpus == (4, 5, 6, 7)
    assert tier(snap, sl.slots[0]) == Tier.NVLINK


@pytest.mark.parametrize(
    ("gpus", "expected_tier", "sockets"),
    [(2, Tier.PIX, 1), (4, Tier.NUMA, 1), (8, Tier.NODE, 2)],
)
def test_tp_on_dual_socket_pcie_box(gpus: int, expected_tier: Tier, sockets: int) -> None:
    snap = CLUSTER.nodes(NODE.named("pcie").pcie_8gpu_2socket()).obj()
    sl = placed(snap, gang(tp(1, gpus)))
    (slot,) = sl.slots
    assert tier(snap, slot) == expected_tier
    assert len(slot.numa_nodes) == sockets
    if gpus == 2:
        assert set(slot.gpus) in ({0, 1}, {2, 3}, {4, 5}, {6, 7})  # a PIX pair behind one switch


def test_tp_group_never_crosses_a_socket_when_one_socket_could_hold_it() -> None:
    # GPU 0 is taken: socket 0 has 3 free, socket 1 has 4; a TP=4 pod takes socket 1 whole.
    snap = CLUSTER.nodes(NODE.named("pcie").pcie_8gpu_2socket().allocated(0)).obj()
    sl = placed(snap, gang(tp(1, 4)))
    assert sl.slots[0].gpus == (4, 5, 6, 7)
    # With one GPU taken on each socket no socket holds 4: unplaceable rather than split over SYS.
    snap = CLUSTER.nodes(NODE.named("pcie").pcie_8gpu_2socket().allocated(0, 4)).obj()
    reason = unplaceable(snap, gang(tp(1, 4))).reason
    assert "NUMA-local" in reason
    # Relaxing the requirement explicitly (requiredLevel: node) lets it cross.
    sl = placed(snap, gang(tp(1, 4, required_level="node")))
    assert len(sl.slots[0].numa_nodes) == 2


def test_unhealthy_gpus_are_never_chosen() -> None:
    snap = CLUSTER.nodes(NODE.named("n1").unhealthy(3)).obj()
    sl = placed(snap, gang(tp(1, 4)))
    assert 3 not in sl.slots[0].gpus
    sl = placed(snap, gang(tp(7, 1, Comm.NONE)))
    assert all(3 not in s.gpus for s in sl.slots)
    assert isinstance(place(snap, gang(tp(1, 8))), Unplaceable)


def test_remainder_stays_coherent_inside_a_pcie_box() -> None:
    snap = CLUSTER.nodes(NODE.named("pcie").pcie_8gpu_2socket()).obj()
    for comm in (Comm.NONE, Comm.ALLREDUCE):
        sl = placed(snap, gang(tp(2, 2, comm)))
        used = {g for s in sl.slots for g in s.gpus}
        assert used in ({0, 1, 2, 3}, {4, 5, 6, 7}), (comm, used)  # both pairs of one socket
        assert all(tier(snap, s) == Tier.PIX for s in sl.slots)


def test_a_single_gpu_pod_fills_a_broken_pair_first() -> None:
    snap = CLUSTER.nodes(NODE.named("pcie").pcie_8gpu_2socket().allocated(0)).obj()
    sl = placed(snap, gang(tp(1, 1, Comm.NONE)))
    assert sl.slots[0].gpus == (1,)  # keeps every whole PIX pair free


# --- across nodes -----------------------------------------------------------------------------


def test_allreduce_gang_of_4_by_8_lands_in_one_leaf() -> None:
    nodes = [NODE.named(f"a{i}").obj() for i in range(3)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").obj() for i in range(4)]
    nodes += [NODE.named(f"c{i}").leaf("leaf-3").obj() for i in range(6)]
    snap = CLUSTER.nodes(*nodes).obj()
    sl = placed(snap, gang(tp(4, 8)))
    assert {snap.path_of(n)[1] for n in sl.nodes} == {"leaf-2"}  # the leaf it fills exactly
    assert sl.domains["p"] == "leaf leaf-2"


def test_best_fit_keeps_a_free_node_whole() -> None:
    snap = CLUSTER.nodes(NODE.named("free"), NODE.named("half").allocated(0, 1, 2, 3)).obj()
    assert placed(snap, gang(tp(1, 4))).slots[0].node == "half"


def test_best_fit_keeps_a_free_leaf_whole() -> None:
    nodes = [NODE.named(f"a{i}").obj() for i in range(4)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").allocated(range(8) if i < 2 else ()).obj() for i in range(4)]
    snap = CLUSTER.nodes(*nodes).obj()
    sl = placed(snap, gang(tp(2, 8)))
    assert set(sl.nodes) == {"b2", "b3"}


def test_required_level_is_hard_and_the_reason_names_the_binding_domain() -> None:
    nodes = [NODE.named(f"a{i}").allocated(range(8) if i else ()).obj() for i in range(4)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").allocated(range(8) if i > 1 else ()).obj() for i in range(4)]
    nodes += [
        NODE.named(f"c{i}").leaf("leaf-3").allocated(range(8) if i == 3 else ()).obj() for i in range(4)
    ]
    snap = CLUSTER.nodes(*nodes).obj()
    got = unplaceable(snap, gang(tp(4, 8, required_level="leaf")))
    assert re.search(
        r"no leaf has room for 4 pods of 8 free NVLink-connected GPUs; "
        r"best is leaf leaf-3 with 3 \(needs 1 more\)$",
        got.reason,
    ), got.reason
    assert (got.pod_set, got.closest, got.short_by) == ("p", "leaf leaf-3", 1)
    assert got.feasible_when_empty
    # Without the requirement the same gang spans leaves.
    assert len({snap.path_of(n)[1] for n in placed(snap, gang(tp(4, 8))).nodes}) > 1


def test_preferred_level_is_soft_and_says_so() -> None:
    nodes = [NODE.named(f"a{i}").obj() for i in range(2)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").obj() for i in range(2)]
    snap = CLUSTER.nodes(*nodes).obj()
    sl = placed(snap, gang(tp(4, 8, preferred_level="leaf")))
    assert sl.domains["p"] == "spine spine-1"
    assert any("preferred level leaf not met; placed within spine spine-1" in n for n in sl.notes), sl.notes
    # When it fits, the preference is kept and nothing is noted.
    sl = placed(snap, gang(tp(2, 8, preferred_level="leaf")))
    assert len({snap.path_of(n)[1] for n in sl.nodes}) == 1
    assert sl.notes == ()


def test_preferred_tier_is_soft() -> None:
    snap = CLUSTER.nodes(NODE.named("pcie").pcie_8gpu_2socket()).obj()
    sl = placed(snap, gang(tp(1, 2, preferred_level="nvlink")))
    assert tier(snap, sl.slots[0]) == Tier.PIX
    assert any("preferred level nvlink not met" in n for n in sl.notes)
    assert isinstance(place(snap, gang(tp(1, 2, required_level="nvlink"))), Unplaceable)


def test_gpus_per_pod_larger_than_any_node() -> None:
    snap = CLUSTER.nodes(NODE.named("n1"), NODE.named("n2").l40s_4gpu()).obj()
    got = unplaceable(snap, gang(tp(1, 16)))
    assert got.reason == "pod set p: no node has 16 GPUs (the largest has 8)"
    assert not got.feasible_when_empty


def test_feasible_when_empty() -> None:
    # Larger than the biggest leaf: never fits, whatever is allocated.
    nodes = [NODE.named(f"a{i}").allocated([0] if i == 0 else ()).obj() for i in range(3)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").obj() for i in range(3)]
    got = unplaceable(CLUSTER.nodes(*nodes).obj(), gang(tp(4, 8, required_level="leaf")))
    assert not got.feasible_when_empty
    # Fails only because of what is allocated now.
    nodes = [NODE.named(f"a{i}").allocated([0] if i == 0 else ()).obj() for i in range(4)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").allocated([7] if i == 3 else ()).obj() for i in range(4)]
    got = unplaceable(CLUSTER.nodes(*nodes).obj(), gang(tp(4, 8, required_level="leaf")))
    assert got.feasible_when_empty


def test_feasible_when_empty_is_solved_once_per_topology_and_pod_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refusal asks whether the gang fits the emptied cluster; the answer depends on the
    topology (graphs, labels, unhealthy GPUs) and the pod sets only, so it is solved once and
    remembered (in the solver memory the snapshots share), whatever is allocated and whatever
    the gang is called."""
    memory = SolverMemory()
    solved: list[ClusterSnapshot] = []
    real = decide_module.decide

    def counting(snap: ClusterSnapshot, g: GangRequest, **kw: Any) -> Any:
        solved.append(snap)
        return real(snap, g, **kw)

    monkeypatch.setattr(decide_module, "decide", counting)

    def unplaceable(snap: ClusterSnapshot, g: GangRequest) -> Unplaceable:
        got = decide_module.decide(snap, g)
        assert isinstance(got, Unplaceable), got
        return got

    def leaves(
        allocated: dict[str, list[int]], unhealthy: dict[str, list[int]] | None = None
    ) -> ClusterSnapshot:
        sick = unhealthy or {}
        names = [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)]
        return ClusterSnapshot(
            [
                NODE.named(n)
                .leaf(f"leaf-{n[0]}")
                .allocated(allocated.get(n, ()))
                .unhealthy(sick.get(n, ()))
                .obj()
                for n in names
            ],
            CLUSTER.obj().hierarchy,
            memory=memory,
        )

    wide = tp(4, 8, required_level="leaf")
    first = unplaceable(leaves({"a0": [0], "b3": [7]}), gang(wide, name="first"))
    assert first.feasible_when_empty
    assert len(solved) == 2  # the refusal, then the emptied cluster
    # Other allocations and another gang name, same topology and pod sets: remembered.
    again = unplaceable(leaves({"a1": [0, 1], "b0": [2]}), gang(wide, name="second"))
    assert again.feasible_when_empty and len(solved) == 3
    # A reservation view of the same cluster is the same topology too.
    view = Ledger().view(leaves({"a2": [3], "b1": [3]}))
    assert unplaceable(view, gang(wide, name="third")).feasible_when_empty and len(solved) == 4
    # Other pod sets: solved afresh.
    assert unplaceable(leaves({"a0": [0], "b3": [7]}), gang(tp(4, 8, Comm.ALLTOALL, required_level="leaf")))
    assert len(solved) == 6
    # A GPU gone bad on each leaf changes the topology: now it never fits.
    sick = leaves({}, unhealthy={"a0": [0], "b3": [7]})
    never = unplaceable(sick, gang(wide, name="fourth"))
    assert not never.feasible_when_empty
    assert isinstance(real(sick.emptied(), gang(wide)), Unplaceable)
    # Another memory (another cache's, another simulation's) remembers nothing of this one.
    other = ClusterSnapshot(leaves({"a0": [0], "b3": [7]}).nodes, CLUSTER.obj().hierarchy)
    assert unplaceable(other, gang(wide, name="fifth")).feasible_when_empty and len(solved) == 9


def test_topology_ignores_allocation_and_sees_graphs_labels_and_health() -> None:
    base = CLUSTER.nodes(NODE.named("n1"), NODE.named("n2").leaf("leaf-2")).obj()
    same = CLUSTER.nodes(NODE.named("n1").allocated(0, 1), NODE.named("n2").leaf("leaf-2")).obj()
    assert base.topology() == same.topology() and hash(base.topology()) == hash(same.topology())
    assert Ledger().view(same).topology() == base.topology()
    for other in (
        CLUSTER.nodes(NODE.named("n1").unhealthy(2), NODE.named("n2").leaf("leaf-2")).obj(),
        CLUSTER.nodes(NODE.named("n1"), NODE.named("n2").leaf("leaf-3")).obj(),
        CLUSTER.nodes(NODE.named("n1"), NODE.named("n2").dgx_a100().leaf("leaf-2")).obj(),
        CLUSTER.nodes(NODE.named("n1"), NODE.named("n3").leaf("leaf-2")).obj(),
    ):
        assert other.topology() != base.topology()
    emptied = same.emptied()
    assert [emptied.free_mask(i) for i in range(2)] == [base.free_mask(i) for i in range(2)]
    assert emptied.topology() == base.topology()


# --- gangs of several pod sets ----------------------------------------------------------------


def test_all_or_nothing_when_a_later_pod_set_fails() -> None:
    snap = CLUSTER.nodes(NODE.named("n1"), NODE.named("n2")).obj()
    before = [snap.free_mask(i) for i in range(len(snap.nodes))]
    ledger = Ledger()
    g = gang(tp(2, 8, name="big"), tp(1, 4, name="extra"))
    got = Solver(snap).place(g)
    assert isinstance(got, Unplaceable)
    assert got.pod_set in ("big", "extra")
    assert [snap.free_mask(i) for i in range(len(snap.nodes))] == before
    assert ledger.held() == {}
    # Everything is still free for the next gang.
    assert len(placed(ledger.view(snap), gang(tp(2, 8))).slots) == 2


def test_colocate_with_puts_decode_in_the_prefill_leaf_and_kv_is_cheaper_there() -> None:
    nodes = [NODE.named(f"a{i}").allocated(range(4) if i == 0 else ()).obj() for i in range(2)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-2").obj() for i in range(2)]
    snap = CLUSTER.nodes(*nodes).obj()
    prefill = tp(1, 8, name="prefill")
    decode = tp(1, 4, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "leaf"))
    g = gang(prefill, decode)
    sl = placed(snap, g)
    leaf_of = {s.pod_set: snap.path_of(s.node)[1] for s in sl.slots}
    assert leaf_of["decode"] == leaf_of["prefill"]
    # The same decode pod moved to the other leaf hands its KV cache over a slower path.
    other_leaf = "leaf-2" if leaf_of["prefill"] == "leaf-1" else "leaf-1"
    apart = next(n.name for n in snap.nodes if snap.path_of(n.name)[1] == other_leaf)
    moved = PodSlot("decode", 0, apart, (4, 5, 6, 7))
    prefill_slots = [s for s in sl.slots if s.pod_set == "prefill"]
    here = scoring.pod_set_micros(snap, decode, [sl.slot("decode/0")], prefill_slots)
    there = scoring.pod_set_micros(snap, decode, [moved], prefill_slots)
    assert here < there
    assert sl.pod_set_micros["decode"] == pytest.approx(here)


def test_prefill_spreads_so_each_decode_pod_sits_on_its_prefill_pods_node() -> None:
    """Two free HGX nodes, two prefill and two decode pods of 4 GPUs: packing prefill on one
    node sends every KV cache over the network; one of each per node keeps it on NVLink."""
    snap = CLUSTER.nodes(NODE.named("a"), NODE.named("b")).obj()
    prefill = tp(2, 4, Comm.NONE, name="prefill")
    decode = tp(2, 4, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "leaf"))
    sl = placed(snap, gang(prefill, decode))
    nodes = {ps: sorted(s.node for s in sl.slots if s.pod_set == ps) for ps in ("prefill", "decode")}
    assert nodes == {"prefill": ["a", "b"], "decode": ["a", "b"]}
    packed = [
        PodSlot("prefill", 0, "a", (0, 1, 2, 3)),
        PodSlot("prefill", 1, "a", (4, 5, 6, 7)),
        PodSlot("decode", 0, "b", (0, 1, 2, 3)),
        PodSlot("decode", 1, "b", (4, 5, 6, 7)),
    ]
    packed_micros = sum(scoring.gang_micros(snap, gang(prefill, decode), packed).values())
    assert sl.per_layer_micros < packed_micros


@pytest.mark.parametrize("free_nodes", [3, 4, 8, 16])
def test_more_free_nodes_never_make_prefill_decode_worse(free_nodes: int) -> None:
    """The same P/D gang on two free HGX nodes and on more: more room never costs more (it
    did: with room for a node per pod set, both prefill pods took one node, both decode
    pods another, and every KV cache crossed the network)."""
    prefill = tp(2, 4, Comm.NONE, name="prefill")
    decode = tp(2, 4, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "leaf"))
    two = placed(
        CLUSTER.nodes(NODE.named("a"), NODE.named("b")).obj(), gang(prefill, decode)
    ).per_layer_micros
    more = CLUSTER.nodes(
        *(NODE.named(f"n{i:02d}").leaf(f"leaf-{i % 2}").obj() for i in range(free_nodes))
    ).obj()
    assert placed(more, gang(prefill, decode)).per_layer_micros <= two + 1e-6


def test_colocation_binds_both_sides_whichever_the_search_places_first() -> None:
    """Prefill is cheapest on one whole node, and leaf-2 has several, but only leaf-1's nodes
    take decode (its node selector). With decode placed first on leaf-1's whole node, prefill
    must stay in that leaf too (on the two half-free nodes): the search used to let it go to
    leaf-2, and so found only slices that miss the colocation while one keeps it."""
    import dataclasses

    from extender.placement.request import NodeRequirement

    def pool(n: NodeState) -> NodeState:
        return dataclasses.replace(n, labels={**n.labels, "pool": "decode"})

    snap = CLUSTER.nodes(
        pool(NODE.named("h0").obj()),
        pool(NODE.named("h1").allocated(range(4)).obj()),
        pool(NODE.named("h2").allocated(range(4)).obj()),
        *(NODE.named(f"g{i}").leaf("leaf-2").obj() for i in range(3)),
    ).obj()
    prefill = tp(2, 4, name="prefill")
    decode = PodSet(
        "decode",
        1,
        8,
        Comm.KV_TRANSFER,
        colocate_with=Colocation("prefill", "leaf"),
        node_selector=(NodeRequirement("pool", "In", ("decode",)),),
    )
    g = gang(prefill, decode)
    sl = placed(snap, g)
    assert {snap.path_of(s.node)[1] for s in sl.slots} == {"leaf-1"}, sl.slots
    assert not scoring.colocation_misses(snap, g, sl.slots)
    apart = [
        PodSlot("prefill", 0, "g0", (0, 1, 2, 3)),
        PodSlot("prefill", 1, "g0", (4, 5, 6, 7)),
        PodSlot("decode", 0, "h0", tuple(range(8))),
    ]
    assert scoring.colocation_misses(snap, g, apart)
    assert scoring.pod_set_micros(snap, prefill, apart[:2]) < scoring.pod_set_micros(
        snap, prefill, [s for s in sl.slots if s.pod_set == "prefill"]
    )


def test_pd_pair_example_keeps_each_hand_off_inside_a_node() -> None:
    from pathlib import Path

    from extender.placement.files import load_cluster, load_gang

    root = Path(__file__).resolve().parents[2] / "examples"
    snap = load_cluster(root / "clusters" / "hgx-h100-4leaf.yaml")
    sl = placed(snap, load_gang(root / "gangs" / "pd-pair.yaml"))
    assert round(sl.per_layer_micros, 1) == 506.0
    for k in range(2):
        assert sl.slot(f"decode/{k}").node in {sl.slot("prefill/0").node, sl.slot("prefill/1").node}
    assert sl.slot("prefill/0").node != sl.slot("prefill/1").node


@pytest.mark.parametrize("policy", ["gangslice", "kueue-tas"])
def test_equal_cost_prefers_the_fullest_domain_so_a_later_gang_fits(policy: str) -> None:
    """Two leaves with 4 and 3 free single-GPU slots, a one-pod leaf-required gang, then a
    four-pod one: taking the slot from the 3-slot leaf (Kueue BestFit) leaves room for both."""
    from extender.peers import POLICIES

    nodes = [NODE.named(f"a{i}").leaf("leaf-a").allocated(range(7)).obj() for i in range(4)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-b").allocated(range(7)).obj() for i in range(3)]
    snap = CLUSTER.nodes(*nodes).obj()
    first = POLICIES[policy](snap, gang(tp(1, 1, Comm.NONE, required_level="leaf")))
    assert isinstance(first, Slice) and first.slots[0].node.startswith("b")
    taken = {s.node: set(s.gpus) for s in first.slots}
    after = CLUSTER.nodes(
        *(
            NODE.named(n.name)
            .leaf(n.labels[LEAF])
            .allocated(set(n.allocated) | taken.get(n.name, set()))
            .obj()
            for n in nodes
        )
    ).obj()
    assert isinstance(POLICIES[policy](after, gang(tp(4, 1, Comm.NONE, required_level="leaf"))), Slice)


def test_exact_ties_follow_topology_path_then_name_not_file_order() -> None:
    nodes = [
        NODE.named("z").obj(),
        NODE.named("a").leaf("leaf-2").obj(),
        NODE.named("m").obj(),
        NODE.named("b").leaf("leaf-2").obj(),
    ]
    for order in (nodes, nodes[::-1], [nodes[1], nodes[3], nodes[0], nodes[2]]):
        sl = placed(CLUSTER.nodes(*order).obj(), gang(tp(1, 8)))
        assert sl.slots[0].node == "m"  # leaf-1 before leaf-2, then m before z


def test_the_faster_node_type_with_room_wins_over_keeping_blocks_whole() -> None:
    """A TP=8 x PP=2 gang that has room on HGX nodes (one leaf, partly used) and on a whole
    leaf of PCIe boxes: the PCIe leaf stays whole only at many times the cost, so HGX wins."""
    h100 = [NODE.named(f"h{i}").leaf("leaf-h").allocated(range(8) if i < 2 else ()).obj() for i in range(4)]
    pcie = [NODE.named(f"p{i}").pcie_8gpu_2socket().leaf("leaf-p").obj() for i in range(4)]
    snap = CLUSTER.nodes(*pcie, *h100).obj()
    stages = tp(2, 8, Comm.PIPELINE, required_level="leaf", preferred_level="nvlink")
    sl = placed(snap, gang(stages))
    assert {s.node[0] for s in sl.slots} == {"h"}
    on_pcie = placed(CLUSTER.nodes(*pcie).obj(), gang(stages))
    assert on_pcie.per_layer_micros > 5 * sl.per_layer_micros


def test_colocate_with_in_a_clique_and_kv_over_nvlink() -> None:
    trays = [NODE.named(f"x{i}").gb200_tray().clique("nvl72.0").obj() for i in range(2)]
    trays += [NODE.named(f"y{i}").gb200_tray().clique("nvl72.1").obj() for i in range(2)]
    prefill = tp(2, 4, name="prefill")
    decode = tp(1, 4, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "clique"))
    # The prefill set needs two trays of one clique; decode needs a third: only a clique of 3 works.
    snap = CLUSTER.nodes(*trays, NODE.named("x2").gb200_tray().clique("nvl72.0")).obj()
    sl = placed(snap, gang(prefill, decode))
    cliques = {snap.path_of(s.node)[2] for s in sl.slots}
    assert cliques == {"nvl72.0"}
    assert set(sl.mnnvl_nodes) == {s.node for s in sl.slots if s.pod_set == "prefill"}
    span = scoring.span_of(snap, sl.slots)
    assert span.nvlink and span.crosses_nodes


def test_colocation_that_cannot_be_met_is_a_note() -> None:
    snap = CLUSTER.nodes(NODE.named("a0"), NODE.named("b0").leaf("leaf-2")).obj()
    prefill = tp(1, 8, name="prefill")
    decode = tp(1, 8, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "leaf"))
    sl = placed(snap, gang(prefill, decode))
    assert any("share a leaf with prefill" in n for n in sl.notes), sl.notes


def test_colocation_with_a_pod_set_spread_over_two_leaves_is_a_note() -> None:
    """Decode next to one of prefill's pods but not the other does not share a leaf with
    prefill; the simulator found this silent before."""
    snap = CLUSTER.nodes(
        NODE.named("h1").allocated(range(4)),
        NODE.named("h2"),
        NODE.named("p1").pcie_8gpu_2socket().leaf("leaf-2").allocated(range(4, 8)),
    ).obj()
    prefill = tp(2, 4, Comm.NONE, name="prefill")
    decode = tp(1, 8, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "leaf"))
    g = gang(prefill, decode)
    sl = placed(snap, g)
    assert sl.slot("decode/0").node == "h2"  # the only whole node
    assert {s.node for s in sl.slots if s.pod_set == "prefill"} == {"h1", "p1"}
    assert scoring.colocation_misses(snap, g, sl.slots) == {
        "decode": "not sharing a leaf with prefill (prefill itself spans more than one leaf)"
    }
    assert any(
        n.startswith("pod set decode: not sharing a leaf with prefill (prefill itself spans")
        for n in sl.notes
    ), sl.notes


@pytest.mark.parametrize(
    ("taken", "gpus", "switch_local"),
    [
        ((1,), 1, True),  # the broken pair's GPU 0 alone would put decode across switches
        ((1, 3), 1, True),
        ((0, 3, 5), 1, True),
        ((1,), 2, False),  # 2+2 fit no one switch: one socket at least, not across it
    ],
)
def test_a_prefill_decode_pair_on_one_node_shares_a_pcie_switch_when_one_fits(
    taken: tuple[int, ...], gpus: int, switch_local: bool
) -> None:
    """Picked alone, a 1-GPU prefill fills the broken pair first and its decode lands across
    PCIe switches; the pair's GPUs are chosen together where gangslice chooses them (DRA)."""
    box = NODE.named("p").pcie_8gpu_2socket().dra().allocated(taken)
    snap = CLUSTER.nodes(box).obj()
    prefill = tp(1, gpus, Comm.NONE, name="prefill")
    decode = tp(1, gpus, Comm.KV_TRANSFER, name="decode", colocate_with=Colocation("prefill", "node"))
    g = gang(prefill, decode)
    sl = placed(snap, g)
    both = sl.slot("prefill/0").gpus + sl.slot("decode/0").gpus
    assert not set(both) & set(taken)
    shape = snap.node("p").shape
    pair_tier = shape.tier_of(shape.mask_of(both))
    assert pair_tier == (Tier.PIX if switch_local else Tier.NUMA), (both, pair_tier)
    # Cheaper than the pick of each side alone, which the device plugin's node keeps.
    plugin = CLUSTER.nodes(NODE.named("p").pcie_8gpu_2socket().device_plugin().allocated(taken)).obj()
    alone = placed(plugin, g)
    if switch_local:
        assert sl.score < alone.score
        kept = alone.slot("prefill/0").gpus + alone.slot("decode/0").gpus
        assert shape.tier_of(shape.mask_of(kept)) != Tier.PIX, kept


# --- multi-node NVLink cliques ------------------------------------------------------------------


def test_clique_is_all_or_nothing() -> None:
    trays = [
        NODE.named(f"x{i}").gb200_tray().clique("nvl72.0").allocated([0, 1] if i else ()).obj()
        for i in range(2)
    ]
    trays.append(NODE.named("y0").gb200_tray().clique("nvl72.1").obj())
    snap = CLUSTER.nodes(*trays, NODE.named("h0").allocated(range(4))).obj()
    # 3 pods of 2 GPUs: x0 holds 2 and x1 one more, inside clique nvl72.0.
    sl = placed(snap, gang(tp(3, 2)))
    assert {snap.path_of(n)[2] for n in sl.nodes} == {"nvl72.0"}
    assert sl.mnnvl_nodes == sl.nodes
    # 4 pods of 2: clique nvl72.0 holds 3, and a pod set may not mix cliques or add the HGX
    # node outside them; no node holds 4 alone: unplaceable, and the reason says why.
    got = unplaceable(snap, gang(tp(4, 2)))
    assert got.reason.endswith(
        "no clique, nor the nodes outside cliques, has room for 4 pods of 2 free NVLink-connected GPUs; "
        "best is clique nvl72.0 with 3 (needs 1 more)"
    ), got.reason
    # A slice that mixes cliques is refused by the rules themselves.
    mixed = [PodSlot("p", 0, "x0", (0, 1)), PodSlot("p", 1, "y0", (0, 1))]
    assert any("cliques" in v for v in scoring.violations(snap, gang(tp(2, 2)), mixed))


def test_one_multi_node_nvlink_gang_per_node_through_the_ledger() -> None:
    trays = [NODE.named(f"x{i}").gb200_tray().clique("nvl72.0").obj() for i in range(3)]
    snap = CLUSTER.nodes(*trays).obj()
    ledger = Ledger()
    first = placed(snap, gang(tp(3, 2), name="first"))  # two trays: 2 pods + 1 pod
    assert len(first.mnnvl_nodes) == 2
    ledger.reserve(first, now=0.0)
    view = ledger.view(snap)
    half = next(n for n in first.mnnvl_nodes if len(view.free_gpus(n)) == 2)
    free_tray = next(n.name for n in snap.nodes if n.name not in first.mnnvl_nodes)
    # 6 GPUs are free in the clique (2 on a tray of the first gang, 4 on the third tray), but the
    # first gang holds that tray's NVLink channel: a second multi-node gang cannot use it.
    second = gang(tp(3, 2), name="second")
    got = Solver(view).place(second)
    assert isinstance(got, Unplaceable), got
    crossing = [
        PodSlot("p", 0, half, tuple(sorted(view.free_gpus(half)))),
        PodSlot("p", 1, free_tray, (0, 1)),
        PodSlot("p", 2, free_tray, (2, 3)),
    ]
    assert any(
        "NVLink channel is held by gang first" in v for v in scoring.violations(view, second, crossing)
    )
    # A pod on one node does not use the channel: that tray's two free GPUs still serve it.
    sl = placed(view, gang(tp(1, 2), name="third"))
    assert sl.mnnvl_nodes == ()
    # Once the first gang is released, the second fits.
    ledger.release("first")
    assert isinstance(Solver(ledger.view(snap)).place(second), Slice)


def test_held_channel_from_node_state_blocks_multi_node_use() -> None:
    trays = [NODE.named(f"x{i}").gb200_tray().clique("nvl72.0").obj() for i in range(2)]
    trays[1].mnnvl_gang = "other"
    snap = CLUSTER.nodes(*trays).obj()
    assert isinstance(place(snap, gang(tp(2, 4))), Unplaceable)
    assert len(placed(snap, gang(tp(1, 4))).slots) == 1
