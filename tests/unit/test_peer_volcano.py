"""The Volcano baseline against Volcano's own allocate tests (v1.14.1,
pkg/scheduler/actions/allocate/allocate_test.go, the network-topology tables: facts only, each
case named in its test's docstring), the gang -> Volcano Job mapping, and one test per defect
the old baseline had.

Translating upstream facts: upstream nodes and pods are sized in CPUs so that each pod fills a
node ("2" CPU pods on "2" CPU nodes); here a node is an 8-GPU HGX H100 and a pod asks for all 8
GPUs, so each pod fills a node again. Upstream's tier-1 HyperNodes ``s0``, ``s1`` are leaves, the
tier-2 ``s2`` a spine; the HyperNodes here are those ``gangslice hypernodes`` renders for the
node labels (tier 1 the finest labelled level), plus Volcano's virtual root."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from extender.controllers.podgroups.hypernodes import from_snapshot
from extender.peers.volcano import SubGroupPolicy, Topology, VolcanoJob, _tree, allocate, volcano, volcano_job
from extender.placement.request import Colocation, GangRequest, NodeRequirement, PodSet
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.hierarchy import Hierarchy, Level
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph

SPINE = Level("spine", "fabric.topograph.run/tier-1")
LEAF = Level("leaf", "fabric.topograph.run/tier-0")
CLIQUE = Level("clique", "nvidia.com/gpu.clique", kind="fabric")
HIER = Hierarchy((SPINE, LEAF))
HGX = preset_graph("hgx-h100")
TRAY = preset_graph("gb200-tray")
HARD_1, HARD_2 = Topology(True, 1), Topology(True, 2)


def hn(
    name: str,
    leaf: str,
    spine: str = "s2",
    used: int = 0,
    graph: GpuGraph = HGX,
    labels: dict[str, str] | None = None,
) -> NodeState:
    """A node under ``leaf`` (tier 1) and ``spine`` (tier 2) with its first ``used`` GPUs taken."""
    node_labels = {SPINE.label: spine, LEAF.label: leaf, **(labels or {})}
    return NodeState(name, node_labels, graph, frozenset(range(used)))


def gang(*pod_sets: PodSet) -> GangRequest:
    return GangRequest("g", tuple(pod_sets))


def binds(result: Placement) -> dict[str, list[str]]:
    assert isinstance(result, Slice), getattr(result, "reason", result)
    out: dict[str, list[str]] = {}
    for s in result.slots:
        out.setdefault(s.pod_set, []).append(s.node)
    return out


def nodes_of(result: Placement) -> list[str]:
    return [n for placed in binds(result).values() for n in placed]


def leaves(snap: ClusterSnapshot, names: Sequence[str]) -> list[str]:
    return sorted(snap.node(n).labels[LEAF.label] for n in names)


def four_nodes() -> ClusterSnapshot:
    """Upstream's usual tree: s0 = {s0-n1, s0-n2}, s1 = {s1-n3, s1-n4}, s2 over both."""
    return ClusterSnapshot([hn("s0-n1", "s0"), hn("s0-n2", "s0"), hn("s1-n3", "s1"), hn("s1-n4", "s1")], HIER)


MASTER_WORKERS = gang(PodSet("master", 1, 8), PodSet("worker", 2, 8))


# -- TestAllocateWithNetWorkTopologies --------------------------------------------------------


def test_hard_tier_1_refuses_a_job_no_leaf_holds() -> None:
    """Upstream "hard network topology constrain, can not allocate job when cross
    highestTierAllowed tier": 3 pods, hard tier 1, leaves of 2 nodes: nothing bound."""
    result = allocate(four_nodes(), MASTER_WORKERS, VolcanoJob(HARD_1))
    assert isinstance(result, Unplaceable) and "tier 1 (leaf)" in result.reason
    assert result.feasible_when_empty is False


def test_hard_tier_2_places_a_job_across_leaves() -> None:
    """Upstream "hard network topology constrain, can allocate job when highestTierAllowed not
    reached": the same job with hard tier 2 binds its 3 pods."""
    snap = four_nodes()
    assert len(nodes_of(allocate(snap, MASTER_WORKERS, VolcanoJob(HARD_2)))) == 3


def test_hard_tier_1_places_a_job_one_leaf_holds_inside_that_leaf() -> None:
    """Upstream "hard network topology constrain, can allocate job when multi hyperNodes are
    available": 2 pods, hard tier 1: both bound, in one leaf."""
    snap = four_nodes()
    job = gang(PodSet("master", 1, 8), PodSet("worker", 1, 8))
    placed = nodes_of(allocate(snap, job, VolcanoJob(HARD_1)))
    assert len(placed) == 2 and len(set(leaves(snap, placed))) == 1


def test_hard_tier_1_follows_the_node_selector_into_the_other_leaf() -> None:
    """Upstream "hard network topology constrain, two available hyperNodes, can allocate job to
    nodes with affinity": s0 = {s0-n1}, s1 = {s1-n2 labelled nodeRole=master}; the pod selects
    nodeRole=master and is bound to s1-n2."""
    snap = ClusterSnapshot([hn("s0-n1", "s0"), hn("s1-n2", "s1", labels={"nodeRole": "master"})], HIER)
    pod = PodSet("master", 1, 8, node_selector=(NodeRequirement("nodeRole", "In", ("master",)),))
    assert binds(allocate(snap, gang(pod), VolcanoJob(HARD_1))) == {"master": ["s1-n2"]}


def test_soft_mode_places_the_job_pod_by_pod() -> None:
    """Upstream "soft network topology constrain, can allocate job when resources are enough":
    soft (highestTierAllowed 0), 3 pods on 4 nodes: all 3 bound. At v1.14.1 soft mode is not hard
    mode, so the job skips the HyperNode search."""
    assert len(nodes_of(allocate(four_nodes(), MASTER_WORKERS, VolcanoJob(Topology(False, 0))))) == 3


# -- TestNodeLevelScoreWithNetWorkTopologies, TestHyperNodeBinpackWithNetWorkTopologies --------


def test_the_fullest_leaf_wins_and_binpack_fills_its_fullest_nodes() -> None:
    """Upstream "hard network topology constrain, allocate job to highest score hypeNode with node
    level binpack": s0-n1 (4 of which 2 used), s0-n2 (8, 4 used), s1-n3 (4), s1-n4 (8); a 2 and a
    4 pod, hard tier 1: leaf s0 is fuller, p1 -> s0-n1, p2 -> s0-n2."""
    snap = ClusterSnapshot(
        [
            hn("s0-n1", "s0", used=2, graph=TRAY),
            hn("s0-n2", "s0", used=4),
            hn("s1-n3", "s1", graph=TRAY),
            hn("s1-n4", "s1"),
        ],
        HIER,
    )
    job = gang(PodSet("master", 1, 2), PodSet("worker", 1, 4))
    assert binds(allocate(snap, job, VolcanoJob(HARD_1))) == {"master": ["s0-n1"], "worker": ["s0-n2"]}


def test_pods_follow_the_lowest_common_hypernode_of_the_pods_before_them() -> None:
    """Upstream "hard network topology constrain, allocate task to node under LCAHyperNode":
    leaves s0, s1, s2 of two 4-wide nodes under tier-2 s3, 4 pods of 4, hard tier 2: the pods
    fill two leaves (2 + 2), not three. The nodes are listed leaf by leaf interleaved here
    (upstream iterates a map), so the lowest index alone would spread them."""
    names = [
        ("s0-n1", "s0"),
        ("s1-n3", "s1"),
        ("s2-n5", "s2"),
        ("s0-n2", "s0"),
        ("s1-n4", "s1"),
        ("s2-n6", "s2"),
    ]
    snap = ClusterSnapshot([hn(n, leaf, spine="s3", graph=TRAY) for n, leaf in names], HIER)
    job = gang(PodSet("master", 1, 4), PodSet("worker", 3, 4))
    placed = nodes_of(allocate(snap, job, VolcanoJob(HARD_2)))
    counts = sorted(leaves(snap, placed).count(leaf) for leaf in set(leaves(snap, placed)))
    assert counts == [2, 2]


# -- TestAllocateWithPartitionPolicyNetworkTopology ---------------------------------------------


def test_each_subgroup_keeps_its_own_tier_and_the_job_its_own() -> None:
    """Upstream "podgroup hard network topology constrain and subGroup hard network topology
    constrain, can allocate job according to the network topology constrain of subGroup policy":
    job hard tier 2; task1 (the master, subGroupSize 1) and task2 (two workers, subGroupSize 2)
    each hard tier 1; s0 = {s0-n1, s0-n2}, s1 = {s1-n3}: all 3 bound, the workers in s0."""
    snap = ClusterSnapshot([hn("s0-n1", "s0"), hn("s0-n2", "s0"), hn("s1-n3", "s1")], HIER)
    job = VolcanoJob(
        HARD_2,
        (SubGroupPolicy("task1", ("master",), 1, HARD_1), SubGroupPolicy("task2", ("worker",), 2, HARD_1)),
    )
    got = binds(allocate(snap, MASTER_WORKERS, job))
    assert got == {"master": ["s1-n3"], "worker": ["s0-n1", "s0-n2"]}


def test_soft_job_with_hard_subgroups_places_each_subgroup_in_a_leaf() -> None:
    """Upstream "podgroup soft network topology constrain and subGroup hard network topology
    constrain, can allocate job when resources are enough": job soft; task1 (two masters,
    subGroupSize 2) and task2 (one worker) hard tier 1; s0 = {s0-n1, s0-n2}, s1 = {s1-n3}: all 3
    bound."""
    snap = ClusterSnapshot([hn("s0-n1", "s0"), hn("s0-n2", "s0"), hn("s1-n3", "s1")], HIER)
    two_masters = gang(PodSet("master", 2, 8), PodSet("worker", 1, 8))
    job = VolcanoJob(
        Topology(False, 0),
        (SubGroupPolicy("task1", ("master",), 2, HARD_1), SubGroupPolicy("task2", ("worker",), 1, HARD_1)),
    )
    got = binds(allocate(snap, two_masters, job))
    assert leaves(snap, got["master"]) == ["s0", "s0"] and got["worker"] == ["s1-n3"]


def test_a_subgroup_that_crosses_its_tier_refuses_the_job() -> None:
    """Upstream "podgroup soft network topology constrain and subGroup hard network topology
    constrain, can not allocate job when cross highestTierAllowed tier": job soft; task1 (by
    task-spec, subGroupSize 1, hard tier 1) makes a sub-group of the master and one of the three
    workers, whose leaf (two nodes) cannot hold them: nothing bound."""
    job = VolcanoJob(Topology(False, 0), (SubGroupPolicy("task1", ("master", "worker"), 1, HARD_1),))
    result = allocate(four_nodes(), gang(PodSet("master", 1, 8), PodSet("worker", 3, 8)), job)
    assert isinstance(result, Unplaceable)


def test_subgroup_of_one_pod_at_a_time_stays_in_the_leaf_of_its_first_pod() -> None:
    """Upstream "podgroup hard network topology constrain and subGroup hard network topology
    constrain, can allocate job when highestTierAllowed not reached": job hard tier 2, task1 (by
    task-spec, subGroupSize 1) hard tier 1; master + 2 workers on four nodes: all 3 bound, the
    workers' sub-group (placed a pod at a time) inside one leaf (getSearchRoot)."""
    snap = four_nodes()
    job = VolcanoJob(HARD_2, (SubGroupPolicy("task1", ("master", "worker"), 1, HARD_1),))
    got = binds(allocate(snap, MASTER_WORKERS, job))
    assert len(got["master"]) == 1 and len(set(leaves(snap, got["worker"]))) == 1


def test_no_topology_but_a_subgroup_policy_still_takes_the_job_path() -> None:
    """Upstream "no network topology at job or subgroup level but has SubJobPolicy, can allocate
    job successfully": a policy without networkTopology sends the job through allocateForJob
    (ContainsSubJobPolicy) and it is placed."""
    job = VolcanoJob(None, (SubGroupPolicy("task1", ("master", "worker"), 1, None),))
    assert len(nodes_of(allocate(four_nodes(), MASTER_WORKERS, job))) == 3


# -- the HyperNodes and the gang -> job mapping -----------------------------------------------------


def gb200_and_h100() -> ClusterSnapshot:
    """One NVL72-like clique of two trays under leaf l-nvl, two HGX H100 (no clique) under l-h."""
    h = Hierarchy((LEAF, CLIQUE))
    trays = [NodeState(f"t{i}", {LEAF.label: "l-nvl", CLIQUE.label: "c1"}, TRAY) for i in range(2)]
    h100 = [NodeState(f"h{i}", {LEAF.label: "l-h"}, HGX) for i in range(2)]
    return ClusterSnapshot([*trays, *h100], h)


def real_nodes(objs: dict[str, dict[str, Any]], name: str) -> frozenset[str]:
    """The nodes under a rendered HyperNode, through its HyperNode members."""
    out: set[str] = set()
    for m in objs[name]["spec"]["members"]:
        target = m["selector"]["exactMatch"]["name"]
        out |= {target} if m["type"] == "Node" else real_nodes(objs, target)
    return frozenset(out)


def test_the_hypernodes_are_those_gangslice_hypernodes_renders() -> None:
    """The baseline's HyperNodes are ``gangslice hypernodes``' (the same tiers, the same nodes
    under each), plus the virtual root one tier above (framework/session.go
    ``addClusterTopHyperNode``)."""
    for snap in (four_nodes(), gb200_and_h100()):
        objs = {o["metadata"]["name"]: o for o in from_snapshot(snap)}
        rendered = {(o["spec"]["tier"], real_nodes(objs, name)) for name, o in objs.items()}
        tree = _tree(snap)
        ours = {
            (x.tier, frozenset(snap.nodes[i].name for i in x.nodes))
            for x in tree.hns.values()
            if x.tier < tree.tiers[-1]
        }
        assert ours == rendered
        assert tree.tiers[-1] == max(t for t, _ in rendered) + 1


def test_a_gang_maps_onto_a_volcano_job_as_the_podgroup_reader_reads_one_back() -> None:
    snap = gb200_and_h100()  # tier 1 clique, tier 2 leaf
    one = gang(PodSet("w", 4, 4, required_level="clique"))
    assert volcano_job(snap, one) == VolcanoJob(Topology(True, 1))
    assert volcano_job(snap, gang(PodSet("w", 2, 8, preferred_level="leaf"))) == VolcanoJob(
        Topology(False, 2)
    )
    assert volcano_job(snap, gang(PodSet("w", 1, 8, preferred_level="nvlink"))) == VolcanoJob()
    pd = gang(
        PodSet("prefill", 2, 4, required_level="clique"),
        PodSet("decode", 4, 4, required_level="clique", colocate_with=Colocation("prefill", "leaf")),
    )
    assert volcano_job(snap, pd) == VolcanoJob(
        Topology(True, 2),  # the colocation, hard: see volcano_job
        (
            SubGroupPolicy("prefill", ("prefill",), 2, Topology(True, 1)),
            SubGroupPolicy("decode", ("decode",), 4, Topology(True, 1)),
        ),
    )
    same_node = gang(PodSet("tp", 2, 2, required_level="node"))
    assert volcano_job(snap, same_node) == VolcanoJob(None, (), frozenset({"tp"}))


# -- one test per defect of the old baseline ------------------------------------------------------


def test_defect_1_an_unconstrained_replica_is_placed_pod_by_pod_not_by_a_hypernode_search() -> None:
    """allocate.go: a job without hard topology or subgroup policy is placed task by task
    (binpack + the network-topology plugin's normal-pod score, fading per tier). Leaf a: a0 with
    2 free, a1 empty; leaf b: b0 and b1 with 4 free each. The old baseline searched the leaves
    first and took the fullest leaf (b); per pod, a0 (full after it) beats b0."""
    snap = ClusterSnapshot(
        [hn("a0", "a", used=6), hn("a1", "a"), hn("b0", "b", used=4), hn("b1", "b", used=4)], HIER
    )
    assert nodes_of(volcano(snap, gang(PodSet("server", 1, 2)))) == ["a0"]


def test_defect_1_small_replicas_stay_off_the_gb200_trays() -> None:
    """The normal-pod score gives a node full marks at a tier where it has no HyperNode: an H100
    outside any clique beats a GB200 tray for a one-GPU replica, where the old baseline tried the
    cliques (tier 1) first. A four-GPU replica fills a tray, and node-level binpack then wins."""
    snap = gb200_and_h100()
    assert nodes_of(volcano(snap, gang(PodSet("server", 1, 1)))) == ["h0"]
    assert nodes_of(volcano(snap, gang(PodSet("server", 1, 4)))) == ["t0"]


def test_defect_2_subgroup_tiers_are_not_the_job_tier() -> None:
    """The upstream case of test_each_subgroup_keeps_its_own_tier_and_the_job_its_own, as a gang:
    two pod sets each required on a leaf, colocated on the spine. The old baseline made the
    largest pod-set tier the whole job's and refused it (no leaf holds three pods)."""
    snap = ClusterSnapshot([hn("s0-n1", "s0"), hn("s0-n2", "s0"), hn("s1-n3", "s1")], HIER)
    g = gang(
        PodSet("master", 1, 8, required_level="leaf"),
        PodSet("worker", 2, 8, required_level="leaf", colocate_with=Colocation("master", "spine")),
    )
    got = binds(volcano(snap, g))
    assert got == {"master": ["s1-n3"], "worker": ["s0-n1", "s0-n2"]}


def test_defect_3_the_job_hypernode_is_chosen_by_its_subgroups_scores() -> None:
    """allocate.go selectBestHyperNodeForJob: the sum of the sub-jobs' HyperNodeOrderFn scores,
    not the bin-pack of the job's HyperNode. Spine x: leaves a, b (one node, 4 used, each) and a
    leaf e of nodes with 3 free (no 4-GPU pod fits); spine y: leaves c, d (one node, 2 used,
    each). Spine y is fuller as a whole, but each sub-group fills its leaf of x."""
    nodes = [hn("a0", "a", "x", used=4), hn("b0", "b", "x", used=4)]
    nodes += [hn(f"e{i}", "e", "x", used=5) for i in range(8)]
    nodes += [hn("c0", "c", "y", used=2), hn("d0", "d", "y", used=2)]
    snap = ClusterSnapshot(nodes, HIER)
    g = gang(PodSet("p", 1, 4), PodSet("q", 1, 4))
    job = VolcanoJob(HARD_2, (SubGroupPolicy("p", ("p",), 1, HARD_1), SubGroupPolicy("q", ("q",), 1, HARD_1)))
    assert sorted(nodes_of(allocate(snap, g, job))) == ["a0", "b0"]


def test_defect_3_soft_mode_is_pod_by_pod_at_v1_14() -> None:
    """v1.14.1 does not rewrite soft to hard (only the newest code does): a soft job is placed pod
    by pod, each pod after the first scored by how close it is to the pods before it. Leaf a: a0
    with 4 free; leaf b: b0, b1 empty. The first pod fills a0; the second goes to b0. The old
    baseline searched the leaves and put both on b0."""
    snap = ClusterSnapshot([hn("a0", "a", used=4), hn("b0", "b"), hn("b1", "b")], HIER)
    assert nodes_of(volcano(snap, gang(PodSet("w", 2, 4, preferred_level="leaf")))) == ["a0", "b0"]


def test_defect_3_tasks_are_taken_by_pod_index_across_roles() -> None:
    """controllers/job/helpers CompareTask: pods are ordered by their index, across the job's
    tasks: a-0, b-0, a-1. n0 has 6 free, n1 8: a-0 fills n0 to 4 free, b-0 (6 GPUs) takes n1, a-1
    then packs n1. The old baseline placed pod set by pod set and put a-1 on n0."""
    snap = ClusterSnapshot([hn("n0", "l", used=2), hn("n1", "l")], HIER)
    got = binds(volcano(snap, gang(PodSet("a", 2, 2), PodSet("b", 1, 6))))
    assert got == {"a": ["n0", "n1"], "b": ["n1"]}
