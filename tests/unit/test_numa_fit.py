"""The kubelet's Topology Manager as a placement rule (extender/placement/numa_fit.py), on the
shipped topologies: hgx-h100 (GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1, all NVLink) and
pcie-8gpu-2socket (the same split, PCIe only), through the solver, the exact search, the
baselines and the slice checker."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import peers as baselines
from extender.cli import main
from extender.placement import numa_fit, scoring
from extender.placement.exact import exact_slice
from extender.placement.request import GangRequest, PodRequests, PodSet
from extender.placement.slice import PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import Solver, place
from extender.testing.builders import make_node
from extender.testing.hardware import hgx_h100
from extender.topology.allocation import Allocation
from extender.topology.kubelet import (
    CpuPolicy,
    KubeletAlignment,
    MemoryPolicy,
    NumaNode,
    TopologyPolicy,
)

SINGLE = TopologyPolicy.SINGLE_NUMA_NODE
RESTRICTED = TopologyPolicy.RESTRICTED
GiB = 2**30


def kubelet(
    policy: TopologyPolicy = SINGLE,
    cpus: Sequence[int] = (56, 56),
    in_use: Sequence[int] = (0, 0),
    memory: Sequence[int] | None = None,
    memory_in_use: Sequence[int] = (0, 0),
) -> KubeletAlignment:
    nodes = tuple(
        NumaNode(n, cpus[n], in_use[n], memory[n] if memory else None, memory_in_use[n] if memory else 0)
        for n in range(len(cpus))
    )
    return KubeletAlignment(
        policy,
        cpu_policy=CpuPolicy.STATIC,
        memory_policy=MemoryPolicy.STATIC if memory else MemoryPolicy.NONE,
        numa_nodes=nodes,
    )


#: An unlabelled HGX H100 whose kubelet aligns to single NUMA nodes (:func:`kubelet`).
NODE = make_node("n0").hgx_h100().kubelet(kubelet())


def gang(
    gpus: int,
    count: int = 1,
    cpu: int = 0,
    guaranteed: bool = False,
    memory: int = 0,
    required: str | None = None,
) -> GangRequest:
    req = PodRequests(cpu_millis=cpu, memory_bytes=memory, guaranteed=guaranteed)
    return GangRequest("g", (PodSet("w", count, gpus, required_level=required, requests=req),))


def placements(snap: ClusterSnapshot, g: GangRequest) -> dict[str, object]:
    """Every policy's answer, the exact search's too."""
    needs = {ps.name: scoring.resolve_need(ps, snap.hierarchy) for ps in g.pod_sets}
    return {
        "gangslice": place(snap, g),
        "exact": exact_slice(snap, g, needs),
        **{p.__name__: p(snap, g) for p in (baselines.spread, baselines.binpack, baselines.kueue_tas)},
        "volcano": baselines.volcano(snap, g),
        "kai": baselines.kai(snap, g),
    }


def gpus_of(result: object) -> list[tuple[str, tuple[int, ...]]]:
    assert isinstance(result, Slice), result
    return [(s.node, s.gpus) for s in result.slots]


# -- the case: TP=8 across both sockets ---------------------------------------------


def test_tp8_on_hgx_is_unplaceable_under_single_numa_node_in_every_policy() -> None:
    snap = ClusterSnapshot([NODE.obj()])
    for name, got in placements(snap, gang(8)).items():
        if name == "exact":
            assert got is None
            continue
        assert isinstance(got, Unplaceable), name
        assert "topologyManagerPolicy single-numa-node on n0" in got.reason, (name, got.reason)
        assert "no NUMA node has 8 GPUs (the most is 4)" in got.reason, (name, got.reason)
        assert not got.feasible_when_empty


@pytest.mark.parametrize("policy", [TopologyPolicy.NONE, TopologyPolicy.BEST_EFFORT])
def test_policies_that_never_refuse_set_no_rule(policy: TopologyPolicy) -> None:
    snap = ClusterSnapshot([NODE.kubelet(kubelet(policy)).obj()])
    assert numa_fit.rule_for(snap.nodes[0], gang(8, cpu=16000, guaranteed=True).pod_sets[0]) is None
    assert gpus_of(place(snap, gang(8))) == [("n0", tuple(range(8)))]


def test_another_node_without_the_policy_takes_tp8() -> None:
    snap = ClusterSnapshot(
        [NODE.named("a").obj(), NODE.named("b").kubelet(kubelet(TopologyPolicy.BEST_EFFORT)).obj()]
    )
    for name, got in placements(snap, gang(8)).items():
        if name in ("spread", "binpack", "kueue-tas", "kueue_tas", "volcano", "kai"):
            # Peers do not know the policy: by snapshot order they may pick node a and be refused.
            continue
        assert gpus_of(got) == [("b", tuple(range(8)))], name


def test_two_tp4_pods_take_one_numa_node_each_lowest_first() -> None:
    snap = ClusterSnapshot([NODE.obj()])
    for name, got in placements(snap, gang(4, count=2)).items():
        assert sorted(gpus_of(got)) == [("n0", (0, 1, 2, 3)), ("n0", (4, 5, 6, 7))], name
    one = place(snap, gang(4))
    assert gpus_of(one) == [("n0", (0, 1, 2, 3))]  # the kubelet fills NUMA node 0 first


def test_a_half_busy_numa_node_leaves_no_room_for_tp4() -> None:
    snap = ClusterSnapshot([NODE.allocated(0, 5).obj()])
    got = place(snap, gang(4))
    assert isinstance(got, Unplaceable)
    assert "no NUMA node has 4 GPUs free" in got.reason
    assert got.feasible_when_empty
    # Without the policy the same node holds a TP=4 pod across both sockets.
    free = ClusterSnapshot([NODE.kubelet(kubelet(TopologyPolicy.NONE)).allocated(0, 5).obj()])
    assert len(gpus_of(place(free, gang(4)))[0][1]) == 4


# -- CPUs and memory of Guaranteed pods -------------------------------------------------------


def test_integer_cpus_of_a_guaranteed_pod_follow_its_gpus() -> None:
    # NUMA node 0 has 20 free CPUs: a Guaranteed pod asking 24 goes to NUMA node 1's GPUs.
    snap = ClusterSnapshot([NODE.kubelet(kubelet(in_use=(36, 0))).obj()])
    assert gpus_of(place(snap, gang(2, cpu=24000, guaranteed=True))) == [("n0", (4, 5))]
    # Two such pods: NUMA node 1 has CPUs for two (48 of 56), so both go there.
    got = place(snap, gang(2, count=2, cpu=24000, guaranteed=True))
    assert sorted(gpus_of(got)) == [("n0", (4, 5)), ("n0", (6, 7))]
    # Three do not fit: the third would need CPUs on a NUMA node with free GPUs and 24 CPUs.
    three = place(snap, gang(2, count=3, cpu=24000, guaranteed=True))
    assert isinstance(three, Unplaceable)
    for name, answer in placements(snap, gang(2, count=3, cpu=24000, guaranteed=True)).items():
        assert answer is None or isinstance(answer, Unplaceable), name


@pytest.mark.parametrize(
    "requests",
    [
        PodRequests(cpu_millis=24500, guaranteed=True),  # not an integer number of CPUs
        PodRequests(cpu_millis=24000, guaranteed=False),  # Burstable: the shared pool
    ],
    ids=["fractional", "burstable"],
)
def test_cpus_outside_the_static_cpu_manager_are_not_aligned(requests: PodRequests) -> None:
    snap = ClusterSnapshot([NODE.kubelet(kubelet(in_use=(56, 56))).obj()])
    ps = PodSet("w", 1, 2, requests=requests)
    rule = numa_fit.rule_for(snap.nodes[0], ps)
    assert rule is not None and rule.cpus == 0 and rule.gpus_aligned
    assert gpus_of(place(snap, GangRequest("g", (ps,)))) == [("n0", (0, 1))]


def test_memory_is_aligned_where_the_memory_manager_is_static() -> None:
    k = kubelet(memory=(256 * GiB, 256 * GiB), memory_in_use=(200 * GiB, 0))
    snap = ClusterSnapshot([NODE.kubelet(k).obj()])
    g = gang(2, cpu=8000, guaranteed=True, memory=100 * GiB)
    assert gpus_of(place(snap, g)) == [("n0", (4, 5))]
    too_big = place(snap, gang(2, cpu=8000, guaranteed=True, memory=300 * GiB))
    assert isinstance(too_big, Unplaceable)
    assert "no NUMA node has 300 GiB of memory" in too_big.reason


# -- restricted: the narrowest alignment for every resource -----------------------------------


def test_restricted_admits_tp8_when_only_gpus_are_aligned() -> None:
    snap = ClusterSnapshot([NODE.kubelet(kubelet(RESTRICTED)).obj()])
    assert gpus_of(place(snap, gang(8))) == [("n0", tuple(range(8)))]


def test_restricted_refuses_tp8_whose_cpus_fit_one_numa_node() -> None:
    snap = ClusterSnapshot([NODE.kubelet(kubelet(RESTRICTED)).obj()])
    got = place(snap, gang(8, cpu=16000, guaranteed=True))
    assert isinstance(got, Unplaceable)
    assert "topologyManagerPolicy restricted" in got.reason
    assert "the 8 GPUs need 2 NUMA nodes, the 16 CPUs need 1 NUMA node" in got.reason
    # CPUs that need both NUMA nodes too: one alignment is the narrowest for both.
    assert gpus_of(place(snap, gang(8, cpu=100000, guaranteed=True))) == [("n0", tuple(range(8)))]


def test_restricted_refuses_gpus_split_across_numa_nodes_that_one_could_hold() -> None:
    snap = ClusterSnapshot([NODE.kubelet(kubelet(RESTRICTED)).allocated(0, 1, 4, 5).obj()])
    got = place(snap, gang(4, required="node"))
    assert isinstance(got, Unplaceable)
    assert "no NUMA node has 4 GPUs free" in got.reason


# -- who picks the GPUs -----------------------------------------------------------------------


def test_dra_gpus_are_not_aligned_but_cpus_still_are() -> None:
    # DRA devices give the Topology Manager no hints: only the CPUs must fit one NUMA node.
    snap = ClusterSnapshot([NODE.dra().obj()])
    assert gpus_of(place(snap, gang(8))) == [("n0", tuple(range(8)))]
    assert gpus_of(place(snap, gang(8, cpu=16000, guaranteed=True))) == [("n0", tuple(range(8)))]
    busy = ClusterSnapshot([NODE.kubelet(kubelet(in_use=(50, 50))).dra().obj()])
    got = place(busy, gang(2, cpu=16000, guaranteed=True))
    assert isinstance(got, Unplaceable)
    assert "no NUMA node has 16 CPUs free" in got.reason


def test_pcie_node_keeps_the_pods_tier_inside_the_numa_node() -> None:
    snap = ClusterSnapshot([NODE.pcie_8gpu_2socket().allocated(0, 4).obj()])
    got = place(snap, gang(2, count=2, required="node"))
    assert isinstance(got, Slice)
    for s in got.slots:
        assert len(s.numa_nodes) == 1
    # TP=4 with each socket holding 3 free GPUs: only across sockets, which the policy refuses.
    assert isinstance(place(snap, gang(4, required="node")), Unplaceable)
    free = ClusterSnapshot(
        [NODE.pcie_8gpu_2socket().kubelet(kubelet(TopologyPolicy.NONE)).allocated(0, 4).obj()]
    )
    assert isinstance(place(free, gang(4, required="node")), Slice)


def test_offer_is_the_kubelets_hint_after_earlier_pods() -> None:
    n = NODE.kubelet(kubelet(in_use=(30, 0))).obj()
    ps = gang(2, cpu=10000, guaranteed=True).pod_sets[0]
    full = n.shape.full_mask
    assert numa_fit.offer(n, [], ps, full) == 0b00001111  # NUMA node 0: 26 CPUs free
    first = 0b00000011
    assert numa_fit.offer(n, [(ps, first)], ps, full & ~first) == 0b00001100  # 16 left there
    second = 0b00001100
    # NUMA node 0 has 6 CPUs left: the third pod goes to NUMA node 1.
    assert numa_fit.offer(n, [(ps, first), (ps, second)], ps, full & ~(first | second)) == 0b11110000
    big = gang(8).pod_sets[0]
    assert numa_fit.offer(n, [], big, full) is None


def test_the_slice_checker_names_gpus_across_numa_nodes() -> None:
    snap = ClusterSnapshot([NODE.obj()])
    g = gang(4, count=2)
    slots = [PodSlot("w", 0, "n0", (0, 1, 4, 5)), PodSlot("w", 1, "n0", (2, 3, 6, 7))]
    problems = scoring.violations(snap, g, slots)
    assert any("GPUs [0, 1, 4, 5] lie on NUMA nodes 0,1" in p for p in problems), problems
    ok = [PodSlot("w", 0, "n0", (0, 1, 2, 3)), PodSlot("w", 1, "n0", (4, 5, 6, 7))]
    assert scoring.violations(snap, g, ok) == []


def test_one_numa_node_sets_no_rule() -> None:
    graph = hgx_h100()
    flat = dataclasses.replace(graph, gpus=tuple(dataclasses.replace(g, numa_node=0) for g in graph.gpus))
    n = NodeState("n0", {}, flat, kubelet=kubelet(cpus=(112,), in_use=(0,)))
    assert numa_fit.rule_for(n, gang(8, cpu=16000, guaranteed=True).pod_sets[0]) is None


def test_bad_alignment_data_is_refused() -> None:
    with pytest.raises(ValueError, match="duplicate NUMA node ids"):
        KubeletAlignment(numa_nodes=(NumaNode(0, 4), NumaNode(0, 4)))
    with pytest.raises(ValueError, match="must be >= 0"):
        NumaNode(0, -1)


# -- against an exhaustive search -------------------------------------------------------------


@st.composite
def instances(draw: st.DrawFn) -> tuple[ClusterSnapshot, GangRequest]:
    nodes = []
    for i in range(draw(st.integers(1, 2))):
        allocated = draw(st.sets(st.integers(0, 7), max_size=5))
        in_use = (draw(st.integers(0, 56)), draw(st.integers(0, 56)))
        policy = draw(st.sampled_from([SINGLE, RESTRICTED]))
        allocation = draw(st.sampled_from([Allocation.DEVICE_PLUGIN, Allocation.DRA]))
        k = kubelet(policy, in_use=in_use)
        nodes.append(NODE.named(f"n{i}").kubelet(k).allocated(sorted(allocated)).allocation(allocation).obj())
    sets = []
    for j in range(draw(st.integers(1, 2))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        cpu = draw(st.sampled_from([0, 8000, 24000, 40000]))
        req = PodRequests(cpu_millis=cpu, guaranteed=draw(st.booleans()))
        sets.append(PodSet(f"s{j}", draw(st.integers(1, 2)), gpus, required_level="node", requests=req))
    return ClusterSnapshot(nodes), GangRequest("g", tuple(sets))


def _feasible(snap: ClusterSnapshot, g: GangRequest) -> bool:
    """Whether any assignment of (node, GPU set) per pod passes the slice checker. The
    assignments are tried in order, pod by pod; one that gives a GPU to two pods is not put to
    the checker (it refuses every such slice: "given twice"), nor is anything built on it."""
    pods = [(ps.name, k, ps.gpus_per_pod) for ps in g.pod_sets for k in range(ps.count)]
    options = {
        size: [
            (n.name, combo)
            for n in snap.nodes
            for combo in itertools.combinations(sorted(snap.free_gpus(n.name)), size)
        ]
        for size in {size for *_, size in pods}
    }

    def extend(slots: list[PodSlot], used: dict[str, frozenset[int]]) -> bool:
        if len(slots) == len(pods):
            return not scoring.violations(snap, g, slots)
        name, k, size = pods[len(slots)]
        for node, combo in options[size]:
            taken = used.get(node, frozenset())
            if taken.isdisjoint(combo) and extend(
                [*slots, PodSlot(name, k, node, combo)], {**used, node: taken | set(combo)}
            ):
                return True
        return False

    return extend([], {})


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(instances())
def test_the_solver_places_exactly_what_the_kubelets_admit(inst: tuple[ClusterSnapshot, GangRequest]) -> None:
    snap, g = inst
    pods = sum(ps.count for ps in g.pod_sets)
    if pods > 3:
        return
    got = Solver(snap).place(g)
    if isinstance(got, Slice):
        assert scoring.violations(snap, g, list(got.slots)) == []
    else:
        assert not _feasible(snap, g), got.reason


# -- gangslice place on the example cluster ---------------------------------------------------

EXAMPLES = Path(__file__).parents[2] / "examples"
TP8 = str(EXAMPLES / "gangs" / "llama-70b-tp8.yaml")


def test_place_sends_tp8_to_the_nodes_without_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = EXAMPLES / "clusters" / "hgx-h100-single-numa.yaml"
    code = main(
        ["place", "--cluster", str(cluster), "--gang", str(EXAMPLES / "gangs" / "llama-70b-tp8.yaml")]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "plain-h100-0" in out and "aligned-h100" not in out


def test_place_names_the_policy_when_no_node_admits_the_pod(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = yaml.safe_load((EXAMPLES / "clusters" / "hgx-h100-single-numa.yaml").read_text())
    data["nodes"] = data["nodes"][:1]  # the aligned nodes only
    cluster = tmp_path / "aligned.yaml"
    cluster.write_text(yaml.safe_dump(data))
    code = main(
        ["place", "--cluster", str(cluster), "--gang", str(EXAMPLES / "gangs" / "llama-70b-tp8.yaml")]
    )
    out = capsys.readouterr().out
    assert code == 3, out
    assert "topologyManagerPolicy single-numa-node on aligned-h100-0: no NUMA node has 8 GPUs" in out
    assert "(and 3 more nodes)" in out


def test_bench_placement_with_single_numa_node_kubelets(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "placement", "--repeat", "1", "--nodes", "40", "--policy", "gangslice", "spread"]
    assert main([*args, "--topology-manager-policy", "single-numa-node", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["topologyManagerPolicy"] == "single-numa-node"
    rows = {(r["gang"], r["policy"]): r for r in data["clusters"][0]["results"]}
    for policy in ("gangslice", "spread"):
        assert not rows[("1x8", policy)]["placed"]  # TP=8 needs both sockets of an HGX node
    # 12 CPUs held per allocated GPU: a pod of 4 GPUs and 48 CPUs finds too few NUMA nodes.
    assert "no NUMA node has 4 GPUs and 48 CPUs free" in rows[("8x4", "gangslice")]["reason"]
    for gang in ("1x8", "8x4", "64x2", "512x1"):
        # broken counts what the kubelets would refuse too (scoring.violations)
        assert rows[(gang, "gangslice")]["broken"] == 0
