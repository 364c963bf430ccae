"""The per-class tables the solver keeps across decisions (capacity entries, pod bandwidth, in
the caller's :class:`SolverMemory`) must never change an answer: a decision made with tables
warmed by other clusters, other allocations and other gangs equals the same decision made with
empty tables."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from extender.cost import Comm
from extender.placement.request import GangRequest, PodRequests, PodSet, Toleration
from extender.placement.search import capacity
from extender.placement.search.context import Decision, Taken
from extender.placement.search.memory import SolverMemory
from extender.placement.slice import Slice
from extender.placement.solver import Solver
from extender.placement.synthetic import GPU_TAINT, synthetic_cluster
from extender.topology.kubelet import TopologyPolicy
from extender.topology.presets import preset_graph

GANGS = (
    GangRequest("tp", (PodSet("server", 1, 4, Comm.ALLREDUCE),)),
    GangRequest("pp", (PodSet("stages", 6, 2, Comm.PIPELINE, preferred_level="leaf"),)),
    GangRequest(
        "ep", (PodSet("experts", 24, 1, Comm.ALLTOALL, required_level="spine", preferred_level="leaf"),)
    ),
    # Same name and rules, other shapes: nothing may be shared between them by name.
    GangRequest(
        "ep2", (PodSet("experts", 10, 2, Comm.ALLTOALL, required_level="spine", preferred_level="leaf"),)
    ),
    GangRequest(
        "ep3", (PodSet("experts", 5, 3, Comm.ALLTOALL, required_level="spine", preferred_level="leaf"),)
    ),
    GangRequest("one", (PodSet("experts", 12, 2, Comm.ALLTOALL, required_level="leaf"),)),
)


def answer(got: object) -> object:
    if isinstance(got, Slice):
        return (got.slots, got.score, got.notes, got.domains)
    return got


@pytest.mark.parametrize("preset", ["hgx-h100", "pcie-8gpu-2socket", "l40s-4gpu"])
def test_warm_tables_give_the_answers_of_empty_ones(preset: str) -> None:
    rng = random.Random(7)
    clusters = [
        synthetic_cluster(n, preset_graph(preset), fraction, seed)[0]
        for n, fraction, seed in ((96, 0.5, 1), (160, 0.7, 2), (64, 0.3, 3))
    ]
    warm = SolverMemory()
    asked = [(snap, gang) for snap in clusters for gang in GANGS]
    rng.shuffle(asked)
    warm_answers = [answer(Solver(snap, memory=warm).place(gang)) for snap, gang in asked]
    assert warm.classes._entries, "the tables were not used"
    for (snap, gang), expected in zip(asked, warm_answers, strict=True):
        got = Solver(snap, memory=SolverMemory()).place(gang)
        assert answer(got) == expected, (preset, gang.name, len(snap.nodes))


def asking(gang: GangRequest, cpus: int, guaranteed: bool) -> GangRequest:
    """``gang`` with pods that tolerate the synthetic GPU taint and ask for CPUs and memory."""
    pod_sets = tuple(
        replace(
            ps,
            tolerations=(Toleration(GPU_TAINT.key, "Exists"),),
            requests=PodRequests(
                cpus * 1000 * ps.gpus_per_pod, 64 * 2**30 * ps.gpus_per_pod, guaranteed=guaranteed
            ),
        )
        for ps in gang.pod_sets
    )
    return replace(gang, name=f"{gang.name}-{cpus}-{guaranteed}", pod_sets=pod_sets)


@pytest.mark.parametrize("preset", ["hgx-h100", "pcie-8gpu-2socket"])
def test_warm_tables_keep_numa_rules_and_room_apart(preset: str) -> None:
    """Nodes of one type and free mask differ in the kubelet's NUMA rule (what CPUs are in use,
    which policy) and in their room: tables warmed on one cluster answer another as empty ones."""
    rng = random.Random(11)
    clusters = [
        synthetic_cluster(n, preset_graph(preset), fraction, seed, facts, policy)[0]
        for n, fraction, seed, facts, policy in (
            (96, 0.5, 1, False, TopologyPolicy.SINGLE_NUMA_NODE),
            (96, 0.5, 1, False, TopologyPolicy.NONE),
            (128, 0.6, 2, True, TopologyPolicy.RESTRICTED),
            (64, 0.3, 3, True, TopologyPolicy.NONE),
            (64, 0.3, 3, True, TopologyPolicy.SINGLE_NUMA_NODE),
        )
    ]
    gangs = [*GANGS, *(asking(g, cpus, True) for g in GANGS for cpus in (8, 20)), asking(GANGS[1], 30, False)]
    warm = SolverMemory()
    asked = [(snap, gang) for snap in clusters for gang in gangs]
    rng.shuffle(asked)
    warm_answers = [answer(Solver(snap, memory=warm).place(gang)) for snap, gang in asked]
    assert any(isinstance(a, tuple) for a in warm_answers), "nothing was placed"
    for (snap, gang), expected in zip(asked, warm_answers, strict=True):
        got = Solver(snap, memory=SolverMemory()).place(gang)
        assert answer(got) == expected, (preset, gang.name, len(snap.nodes))


@pytest.mark.parametrize("policy", [TopologyPolicy.NONE, TopologyPolicy.SINGLE_NUMA_NODE])
def test_capacity_by_class_and_room_is_each_nodes_own(policy: TopologyPolicy) -> None:
    """Where nodes limit resources the capacity table is built per (node type, free mask,
    room), not node by node: every node's entry must still be its own (its GPUs' capacity
    capped by its NodeResourcesFit room; refused nodes and nodes without room absent), before
    and after the gang takes GPUs on some nodes."""
    snap = synthetic_cluster(160, preset_graph("hgx-h100"), 0.5, 4, True, policy)[0]
    assert snap.limits_resources
    capped = dropped = 0
    for gang in (asking(g, cpus, True) for g in GANGS for cpus in (8, 20, 40)):
        ps = gang.pod_sets[0]
        ctx = Decision.of(snap, gang)
        need = ctx.needs[ps.name]
        taken = Taken({i: snap.free_mask(i) & -snap.free_mask(i) for i in range(0, 160, 7)})
        for state in (Taken(), taken):
            caps = capacity.table(ctx, ps, need, state, False)
            for i in range(len(snap.nodes)):
                free = snap.free_mask(i) & ~state.gpus.get(i, 0)
                own = capacity.node_entry(ctx, ps, need, i, free, False)
                assert caps.get(i) == own, (gang.name, i)
                gpus_only = capacity.node_entry(
                    ctx, replace(ps, requests=PodRequests()), need, i, free, False
                )
                capped += own is not None and gpus_only is not None and own[0] < gpus_only[0]
                dropped += own is None and gpus_only is not None
            listed = sorted(i for members in caps.groups.values() for i in members)
            assert listed == sorted(i for i in range(len(snap.nodes)) if caps.get(i) is not None)
    assert capped and dropped, "no node's room capped or ruled out its entry: the test proves nothing"
