"""The peer baselines: capacity rules always hold, each behaves like the peer it models, and
the same yardstick (scoring.gang_micros) prices their choices; plus the placement benchmark."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import cli, cost
from extender.bench.placement import bench_subparsers
from extender.bench.placement import register as register_bench
from extender.cost import Comm
from extender.peers import POLICIES, binpack, kueue_tas, spread, volcano
from extender.peers.common import first_free
from extender.placement import scoring, solver
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.testing.builders import make_node
from extender.testing.hardware import hgx_h100, pcie_8gpu_2socket
from extender.topology.hierarchy import Hierarchy, Level
from extender.topology.model import Tier

SPINE = Level("spine", "fabric.topograph.run/tier-1")
LEAF = Level("leaf", "fabric.topograph.run/tier-0")
HIER = Hierarchy((SPINE, LEAF))
HGX = hgx_h100()
PCIE = pcie_8gpu_2socket()
BASELINES = ("spread", "binpack", "kueue-tas", "volcano", "kai")


#: An HGX H100 under spine s0, device plugin; a case names the leaf and what differs.
NODE = make_node().hgx_h100().spine("s0")


def gang(*pod_sets: PodSet) -> GangRequest:
    return GangRequest("g", tuple(pod_sets))


def placed(result: Placement) -> Slice:
    assert isinstance(result, Slice), getattr(result, "reason", result)
    return result


def nodes_of(result: Placement, pod_set: str | None = None) -> list[str]:
    return [s.node for s in placed(result).slots if pod_set is None or s.pod_set == pod_set]


def leaves_of(snap: ClusterSnapshot, result: Placement) -> set[str]:
    return {snap.node(n).labels[LEAF.label] for n in nodes_of(result)}


def assert_capacity_rules(snap: ClusterSnapshot, g: GangRequest, result: Slice) -> None:
    """Only free GPUs, none twice, the right number of pods and GPUs per pod."""
    used: dict[str, set[int]] = {}
    for s in result.slots:
        assert set(s.gpus) <= snap.free_gpus(s.node), f"{s.key}: {s.gpus} not free on {s.node}"
        assert not used.setdefault(s.node, set()) & set(s.gpus), f"{s.key}: GPU booked twice"
        used[s.node].update(s.gpus)
        assert len(s.gpus) == g.pod_set(s.pod_set).gpus_per_pod
    for ps in g.pod_sets:
        indices = sorted(s.index for s in result.slots if s.pod_set == ps.name)
        assert indices == list(range(ps.count))
    rules = scoring.violations(snap, g, result.slots)
    capacity = [p for p in rules if "not free" in p or "given twice" in p or "slots for" in p]
    assert capacity == []


def test_policies_are_the_six_with_the_solver_first() -> None:
    assert list(POLICIES) == ["gangslice", "spread", "binpack", "kueue-tas", "volcano", "kai"]
    assert POLICIES["gangslice"] is solver.place


def test_first_free_takes_the_lowest_free_positions() -> None:
    assert first_free(0b1011_0110, 3) == 0b0001_0110
    assert first_free(0b1000_0001, 3) is None
    assert first_free(0b1, 0) == 0


# -- capacity rules on random clusters ---------------------------------------------------


@st.composite
def cluster_and_gang(draw: st.DrawFn) -> tuple[ClusterSnapshot, GangRequest]:
    count = draw(st.integers(2, 6))
    nodes = []
    for i in range(count):
        graph = draw(st.sampled_from((HGX, PCIE)))
        allocated = draw(st.sets(st.integers(0, 7), max_size=8))
        nodes.append(
            NODE.named(f"n{i}").graph(graph).leaf(f"leaf-{i % 2}").allocated(sorted(allocated)).obj()
        )
    levels = (None, "leaf", "spine", "node", "nvlink")
    sets = [
        PodSet(
            f"ps{k}",
            draw(st.integers(1, 4)),
            draw(st.sampled_from((0, 1, 2, 4))),
            draw(st.sampled_from(list(Comm))),
            required_level=draw(st.sampled_from(levels)),
            preferred_level=draw(st.sampled_from(levels)),
        )
        for k in range(draw(st.integers(1, 2)))
    ]
    if len(sets) == 2 and draw(st.booleans()):
        sets[1] = PodSet(
            sets[1].name,
            sets[1].count,
            sets[1].gpus_per_pod,
            Comm.KV_TRANSFER,
            colocate_with=Colocation("ps0", "leaf"),
        )
    return ClusterSnapshot(nodes, HIER), gang(*sets)


@settings(max_examples=40, deadline=None)
@given(cluster_and_gang())
def test_baselines_never_book_a_gpu_that_is_taken_or_twice(case: tuple[ClusterSnapshot, GangRequest]) -> None:
    snap, g = case
    for name in BASELINES:
        result = POLICIES[name](snap, g)
        if isinstance(result, Slice):
            assert_capacity_rules(snap, g, result)
            assert result.pod_set_micros == scoring.gang_micros(snap, g, result.slots)
            for s in result.slots:
                shape = snap.node(s.node).shape
                assert s.numa_nodes == shape.numa_of(shape.mask_of(s.gpus))
        else:
            assert result.reason.startswith(f"{name}: ")


def test_a_gang_that_does_not_fit_is_unplaceable_as_a_whole() -> None:
    snap = ClusterSnapshot(
        [
            NODE.named("a").leaf("l0").allocated(range(4)).obj(),
            NODE.named("b").leaf("l0").allocated(range(4)).obj(),
        ],
        HIER,
    )
    g = gang(PodSet("w", 3, 4))  # 8 free GPUs, 12 needed
    for name in BASELINES:
        result = POLICIES[name](snap, g)
        assert isinstance(result, Unplaceable), name
        assert result.feasible_when_empty, name
    too_big = gang(PodSet("w", 1, 16))
    for name in BASELINES:
        result = POLICIES[name](snap, too_big)
        assert isinstance(result, Unplaceable) and not result.feasible_when_empty, name


# -- spread and binpack ------------------------------------------------------------------


def test_spread_puts_pods_on_different_nodes_and_binpack_packs_them() -> None:
    snap = ClusterSnapshot([NODE.named(f"n{i}").leaf("l0").obj() for i in range(4)], HIER)
    g = gang(PodSet("w", 4, 2))
    assert sorted(nodes_of(spread(snap, g))) == ["n0", "n1", "n2", "n3"]
    assert nodes_of(binpack(snap, g)) == ["n0"] * 4
    assert [s.gpus for s in placed(binpack(snap, g)).slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_spread_prefers_the_emptiest_node_and_binpack_the_fullest_that_fits() -> None:
    snap = ClusterSnapshot(
        [
            NODE.named("full").leaf("l0").allocated(range(7)).obj(),
            NODE.named("half").leaf("l0").allocated(range(4)).obj(),
            NODE.named("empty").leaf("l0").obj(),
        ],
        HIER,
    )
    g = gang(PodSet("w", 1, 2))
    assert nodes_of(spread(snap, g)) == ["empty"]
    assert nodes_of(binpack(snap, g)) == ["half"]
    assert placed(binpack(snap, g)).slots[0].gpus == (4, 5)


# -- kueue-tas ---------------------------------------------------------------------------


def test_kueue_tas_keeps_a_required_leaf_and_takes_the_best_fitting_one() -> None:
    nodes = [
        NODE.named(f"a{i}").leaf("leaf-a").allocated(range(6)).obj() for i in range(2)
    ]  # 2 pods of 2 GPUs
    nodes += [NODE.named(f"b{i}").leaf("leaf-b").allocated(range(4)).obj() for i in range(2)]  # 4 pods
    nodes += [NODE.named(f"c{i}").leaf("leaf-c").obj() for i in range(2)]  # 8 pods
    snap = ClusterSnapshot(nodes, HIER)
    g = gang(PodSet("w", 3, 2, required_level="leaf"))
    assert leaves_of(snap, kueue_tas(snap, g)) == {"leaf-b"}  # BestFit: least room left over
    big = gang(PodSet("w", 6, 2, required_level="leaf"))
    assert leaves_of(snap, kueue_tas(snap, big)) == {"leaf-c"}
    assert nodes_of(kueue_tas(snap, big)).count("c0") == 4  # fewest nodes, largest first
    too_big = gang(PodSet("w", 9, 2, required_level="leaf"))
    result = kueue_tas(snap, too_big)
    assert isinstance(result, Unplaceable) and "no leaf has room" in result.reason
    assert isinstance(spread(snap, too_big), Slice)  # the cluster has room, just not in one leaf


def test_kueue_tas_climbs_from_a_preferred_level() -> None:
    nodes = [NODE.named(f"a{i}").leaf("leaf-a").allocated(range(4)).obj() for i in range(2)]
    nodes += [NODE.named(f"b{i}").spine("s1").leaf("leaf-b").allocated(range(4)).obj() for i in range(2)]
    snap = ClusterSnapshot(nodes, HIER)
    fits_leaf = gang(PodSet("w", 2, 4, preferred_level="leaf"))
    assert len(leaves_of(snap, kueue_tas(snap, fits_leaf))) == 1
    spans = gang(PodSet("w", 3, 4, preferred_level="leaf"))  # no leaf or spine holds 3: distributed
    assert leaves_of(snap, kueue_tas(snap, spans)) == {"leaf-a", "leaf-b"}
    required = gang(PodSet("w", 3, 4, preferred_level="leaf", required_level="spine"))
    assert isinstance(kueue_tas(snap, required), Unplaceable)


def test_kueue_tas_unconstrained_sorts_every_node_at_once_fullest_first() -> None:
    """Implied TAS (no topology annotation): the lowest level, every node sorted by pods that
    fit, fewest first, then topology path; the first that holds every pod. The old fill from
    the top level down took the fullest leaf first and split the pods there."""
    nodes = [
        NODE.named(f"a{i}").leaf("leaf-a").allocated(range(6)).obj() for i in range(2)
    ]  # leaf-a: 2+2 free
    nodes += [
        NODE.named("b0").leaf("leaf-b").allocated(range(3)).obj(),
        NODE.named("b1").leaf("leaf-b").obj(),
    ]  # leaf-b: 5+8 free
    snap = ClusterSnapshot(nodes, HIER)
    g = gang(PodSet("w", 4, 1))
    # Fullest node that holds all four pods: b0 (5 free), though leaf-a is the fullest leaf.
    assert nodes_of(kueue_tas(snap, g)) == ["b0"] * 4
    # No node holds nine: fill in the same order, fullest first (a0, a1, b0).
    assert nodes_of(kueue_tas(snap, gang(PodSet("w", 9, 1)))) == ["a0"] * 2 + ["a1"] * 2 + ["b0"] * 5


def test_kueue_tas_unconstrained_ties_by_topology_path_not_file_order() -> None:
    nodes = [
        NODE.named("z").leaf("leaf-b").obj(),
        NODE.named("y").leaf("leaf-a").obj(),
        NODE.named("x").leaf("leaf-a").obj(),
    ]
    for order in (nodes, nodes[::-1]):
        snap = ClusterSnapshot(list(order), HIER)
        assert nodes_of(kueue_tas(snap, gang(PodSet("w", 1, 8)))) == ["x"]


def test_kueue_tas_required_and_preferred_take_the_fullest_domain_that_fits() -> None:
    """BestFit for required and preferred levels: two leaves with 4 and 3 free single-GPU
    slots; a one-pod gang goes to the 3-slot leaf, so a four-pod gang still fits."""
    nodes = [NODE.named(f"a{i}").leaf("leaf-a").allocated(range(7)).obj() for i in range(4)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-b").allocated(range(7)).obj() for i in range(3)]
    snap = ClusterSnapshot(nodes, HIER)
    for wish in ({"required_level": "leaf"}, {"preferred_level": "leaf"}):
        assert leaves_of(snap, kueue_tas(snap, gang(PodSet("w", 1, 1, **wish)))) == {"leaf-b"}


def test_kueue_tas_counts_gpus_and_ignores_nvlink_coherence() -> None:
    snap = ClusterSnapshot([NODE.named("p").pcie_8gpu_2socket().leaf("l0").allocated(0, 2, 4, 6).obj()], HIER)
    g = gang(PodSet("tp", 2, 2, Comm.NONE, required_level="nvlink"))  # PCIe node: no NVLink at all
    result = placed(kueue_tas(snap, g))
    assert [s.gpus for s in result.slots] == [(1, 3), (5, 7)]
    assert any("are " in p and "need" in p for p in scoring.violations(snap, g, result.slots))


# -- volcano -----------------------------------------------------------------------------


def test_volcano_keeps_the_job_within_the_highest_tier_allowed() -> None:
    nodes = [NODE.named(f"a{i}").leaf("leaf-a").allocated(range(4)).obj() for i in range(2)]
    nodes += [NODE.named(f"b{i}").leaf("leaf-b").allocated(range(4)).obj() for i in range(2)]
    snap = ClusterSnapshot(nodes, HIER)
    assert len(leaves_of(snap, volcano(snap, gang(PodSet("w", 2, 4, required_level="leaf"))))) == 1
    three = gang(PodSet("w", 3, 4, required_level="leaf"))
    result = volcano(snap, three)
    assert isinstance(result, Unplaceable) and "tier 1 (leaf)" in result.reason
    assert leaves_of(snap, volcano(snap, gang(PodSet("w", 3, 4, required_level="spine")))) == {
        "leaf-a",
        "leaf-b",
    }
    assert leaves_of(snap, volcano(snap, gang(PodSet("w", 3, 4)))) == {"leaf-a", "leaf-b"}


def test_volcano_places_an_unconstrained_job_pod_by_pod_on_the_fullest_nodes() -> None:
    """No required level: no HyperNode search (allocate.go sends only hard-topology or
    subgroup-policy jobs there); each pod goes where GPU bin-pack plus the network-topology
    plugin's per-tier HyperNode bin-pack score most: the half-full leaf's nodes."""
    nodes = [NODE.named(f"a{i}").leaf("leaf-a").obj() for i in range(2)]  # empty leaf
    nodes += [NODE.named(f"b{i}").leaf("leaf-b").allocated(range(4)).obj() for i in range(2)]  # half full
    nodes += [NODE.named(f"c{i}").leaf("leaf-c").allocated(range(7)).obj() for i in range(2)]  # too full
    snap = ClusterSnapshot(nodes, HIER)
    result = volcano(snap, gang(PodSet("w", 2, 4)))
    assert leaves_of(snap, result) == {"leaf-b"}
    assert sorted(nodes_of(result)) == ["b0", "b1"]


def test_volcano_binds_a_node_scope_gang_by_pod_affinity() -> None:
    """requiredLevel node is a required pod affinity on the hostname (Volcano has no tier for
    one node): the first pod goes where bin-pack scores best, the others must join it (the
    predicates plugin's InterPodAffinity filter), and allocate does not backtrack when they
    cannot: three pods refused though node b holds them."""
    snap = ClusterSnapshot(
        [
            NODE.named("a").leaf("l0").allocated(range(4)).obj(),
            NODE.named("b").leaf("l0").allocated(range(2)).obj(),
        ],
        HIER,
    )
    assert set(nodes_of(volcano(snap, gang(PodSet("w", 2, 2, required_level="node"))))) == {"a"}
    three = volcano(snap, gang(PodSet("w", 3, 2, required_level="node")))
    assert isinstance(three, Unplaceable) and "pod affinity" in three.reason
    assert isinstance(volcano(snap, gang(PodSet("w", 4, 2, required_level="node"))), Unplaceable)


# -- the point of it all: first-free GPUs on a PCIe node -------------------------------


def test_first_free_gets_a_pair_across_sockets_where_gangslice_gets_a_pix_pair() -> None:
    # Free GPUs 3, 4, 6, 7 of a dual-socket PCIe node: 3 and 4 sit on different sockets (SYS),
    # 6 and 7 share a PCIe switch (PIX). A DRA node: the peers' claims name no devices, so
    # they get the lowest free ones, while gangslice's claim names its own choice.
    snap = ClusterSnapshot(
        [NODE.named("p").pcie_8gpu_2socket().leaf("l0").allocated(0, 1, 2, 5).dra().obj()], HIER
    )
    g = gang(PodSet("tp", 1, 2, Comm.ALLREDUCE))
    ours = placed(solver.place(snap, g))
    assert ours.slots[0].gpus == (6, 7)
    shape = snap.node("p").shape
    for name in BASELINES:
        theirs = placed(POLICIES[name](snap, g))
        assert theirs.slots[0].gpus == (3, 4), name
        assert shape.tier_of(shape.mask_of((3, 4))) == Tier.NODE
        assert theirs.pod_set_micros["tp"] > ours.pod_set_micros["tp"], name
        # The whole difference is the bottleneck link: the socket hop against the PCIe switch.
        dims = g.pod_sets[0].model
        assert theirs.pod_set_micros["tp"] == cost.tp_layer_us(2, dims, cost.SYS_GBPS, cost.ALPHA_PCIE_US)
        assert ours.pod_set_micros["tp"] == cost.tp_layer_us(2, dims, PCIE.pcie_gbps, cost.ALPHA_PCIE_US)
        assert scoring.violations(snap, g, theirs.slots), name
        assert scoring.violations(snap, g, ours.slots) == []


def test_on_a_device_plugin_node_every_policy_gets_the_plugins_choice() -> None:
    """The same free GPUs on a device-plugin node: the plugin scores the PIX pair 6,7 highest
    and hands it out whoever chose the node, so the peers' pod is as coherent as gangslice's."""
    snap = ClusterSnapshot([NODE.named("p").pcie_8gpu_2socket().leaf("l0").allocated(0, 1, 2, 5).obj()], HIER)
    g = gang(PodSet("tp", 1, 2, Comm.ALLREDUCE))
    ours = placed(solver.place(snap, g))
    for name in BASELINES:
        theirs = placed(POLICIES[name](snap, g))
        assert theirs.slots == ours.slots, name
        assert theirs.slots[0].gpus == (6, 7), name
        assert scoring.violations(snap, g, theirs.slots) == [], name


# -- gangslice place --policy and the benchmark ------------------------------------------


def test_place_command_runs_a_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "nodes:\n  - {name: p, gpuTopology: pcie-8gpu-2socket, allocatedGpus: [0, 1, 2, 5],"
        " allocation: dra}\n"
    )
    gang_file = tmp_path / "gang.yaml"
    gang_file.write_text("name: g\npodSets:\n  - {name: tp, count: 1, gpusPerPod: 2, comm: allreduce}\n")
    assert (
        cli.main(
            ["place", "--cluster", str(cluster), "--gang", str(gang_file), "--policy", "spread", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["placed"] and out["pods"][0]["gpus"] == [3, 4]


def _rows(out: str) -> Mapping[tuple[str, str], list[str]]:
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 10 and cells[0].isdigit():
            rows[(cells[1], cells[2])] = cells
    return rows


def test_bench_placement_quick_lists_every_policy_for_every_gang(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "placement", "--quick", "--nodes", "50"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    for gang_label in ("1x8", "8x4", "64x2", "512x1"):
        for policy in POLICIES:
            assert (gang_label, policy) in rows, (gang_label, policy)
    assert "snapshot build" in out and "50 nodes" in out
    for gang_label in ("1x8", "8x4", "64x2", "512x1"):
        assert f"ratio: gangslice / kueue-tas p99, {gang_label} on 50 nodes: " in out
    assert rows[("8x4", "gangslice")][3] == "placed"
    assert rows[("512x1", "gangslice")][3] == "unplaceable"  # 200 free GPUs for 512 pods


def test_bench_placement_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            [
                "bench",
                "placement",
                "--repeat",
                "1",
                "--nodes",
                "40",
                "--policy",
                "gangslice",
                "spread",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    (cluster,) = data["clusters"]
    assert cluster["nodes"] == 40 and cluster["buildMs"]["total_ms"] > 0
    assert {(r["gang"], r["policy"]) for r in cluster["results"]} == {
        (g, p) for g in ("1x8", "8x4", "64x2", "512x1") for p in ("gangslice", "spread")
    }
    for r in cluster["results"]:
        assert r["p99_ms"] >= r["median_ms"] > 0
        assert (r["micros"] is not None) == r["placed"]
        if r["policy"] == "gangslice":
            assert r["broken"] == 0
    assert data["targets"] == []  # targets are judged on 5,000 and 20,000 nodes only
    assert data["ratios"] == []  # no kueue-tas row to compare with


def test_bench_targets_cover_20000_nodes() -> None:
    from extender.bench.placement import DEFAULT_NODES, TARGETS_MS

    assert 20000 in DEFAULT_NODES
    assert TARGETS_MS[(20000, 64)] == 20.0 and TARGETS_MS[(20000, 512)] == 100.0


def test_another_module_can_add_a_bench_action() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register_bench(sub)
    other = bench_subparsers(sub).add_parser("extender")
    other.set_defaults(func="extender-bench")
    assert bench_subparsers(sub) is bench_subparsers(sub)
    assert parser.parse_args(["bench", "extender"]).func == "extender-bench"
    assert parser.parse_args(["bench", "placement", "--quick"]).quick


def test_bench_placement_with_node_facts_keeps_every_filter(capsys: pytest.CaptureFixture[str]) -> None:
    """With ``--node-facts`` (taints, cordons, resources partly requested) every policy's slice
    still breaks no rule: scoring.violations, the ``broken`` column, names filter refusals too."""
    # One timed call after the cold one: the slices judged are the cold calls'.
    assert cli.main(["bench", "placement", "--repeat", "1", "--nodes", "200", "--node-facts"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("with node facts:")
    rows = _rows(out)
    assert rows[("8x4", "gangslice")][3] == "placed"
    for cells in rows.values():
        if cells[3] == "placed":
            assert cells[5] == "0", cells  # broken
