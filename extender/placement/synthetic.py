"""Synthetic clusters and gangs for the benchmarks: HGX-like nodes under leaf, spine and core
switches, a random share of their GPUs allocated, and one gang per size."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from extender.cost import Comm
from extender.placement.feasibility import NO_FACTS, NodeFacts, Resources, Taint
from extender.placement.request import GangRequest, PodRequests, PodSet, Toleration
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import HOSTNAME_LABEL, Hierarchy, parse_levels
from extender.topology.kubelet import CpuPolicy, KubeletAlignment, NumaNode, TopologyPolicy
from extender.topology.model import GpuGraph

#: The synthetic fabric: topograph's tier labels for core, spine and leaf, hostname last.
CORE_LABEL = "fabric.topograph.run/tier-2"
SPINE_LABEL = "fabric.topograph.run/tier-1"
LEAF_LABEL = "fabric.topograph.run/tier-0"
NODES_PER_LEAF = 32
LEAVES_PER_SPINE = 8
SPINES_PER_CORE = 4
#: Who picks the GPUs on the synthetic nodes: the stock NVIDIA device plugin, the default of a
#: node without DRA (and of a NodeTopology without spec.allocation). Every policy's slots are
#: then the plugin's answers, and gangslice pays for predicting them; on HGX boards every
#: answer is NVLink-connected, so the slices equal those of DRA nodes.
BENCH_ALLOCATION = Allocation.DEVICE_PLUGIN


@dataclass(frozen=True, slots=True)
class BenchGang:
    label: str
    what: str
    gang: GangRequest


#: With ``--node-facts``: every node tainted for GPU pods (the gangs tolerate it), one in ten
#: tainted for others, one in fifty cordoned; allocatable as an HGX H100 server reports it, a
#: random share of it requested by other pods; each pod asks 8 CPUs and 128Gi per GPU.
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
OTHER_TAINT = Taint("dedicated", "training", "NoSchedule")
ALLOCATABLE = Resources(cpu_millis=192_000, memory_bytes=2048 * 2**30, ephemeral_bytes=7000 * 2**30, pods=110)


def node_facts(i: int, rng: random.Random) -> NodeFacts:
    taints = (GPU_TAINT, OTHER_TAINT) if i % 10 == 0 else (GPU_TAINT,)
    a = ALLOCATABLE
    assert a.cpu_millis is not None and a.memory_bytes is not None
    requested = Resources(
        rng.randrange(0, a.cpu_millis // 2), rng.randrange(0, a.memory_bytes // 2), 0, rng.randrange(0, 30)
    )
    return NodeFacts(taints, i % 50 == 1, a, requested)


def bench_gangs(node_facts: bool = False) -> tuple[BenchGang, ...]:
    """One gang per size; GPUs per pod shrink with the pod count so every gang fits a
    half-allocated cluster of 1,000 nodes. With ``node_facts`` its pods tolerate the GPU
    taint and ask for CPUs and memory (see :data:`GPU_TAINT`)."""

    def one(label: str, what: str, ps: PodSet) -> BenchGang:
        if node_facts:
            asks = PodRequests(8_000 * ps.gpus_per_pod, 128 * 2**30 * ps.gpus_per_pod)
            ps = replace(ps, tolerations=(Toleration(GPU_TAINT.key, "Exists"),), requests=asks)
        return BenchGang(label, what, GangRequest(f"bench-{label}", (ps,)))

    return (
        one("1x8", "1 pod x 8 GPUs: TP=8 server", PodSet("server", 1, 8, Comm.ALLREDUCE)),
        one(
            "8x4",
            "8 pods x 4 GPUs: TP=4 x PP=8, preferred leaf",
            PodSet("stages", 8, 4, Comm.PIPELINE, preferred_level="leaf"),
        ),
        one(
            "64x2",
            "64 pods x 2 GPUs: wide EP all-to-all, required spine, preferred leaf",
            PodSet("experts", 64, 2, Comm.ALLTOALL, required_level="spine", preferred_level="leaf"),
        ),
        one(
            "512x1",
            "512 pods x 1 GPU: wide EP all-to-all, required core, preferred spine",
            PodSet("experts", 512, 1, Comm.ALLTOALL, required_level="core", preferred_level="spine"),
        ),
    )


# -- synthetic cluster ------------------------------------------------------------------


def bench_hierarchy() -> Hierarchy:
    return Hierarchy(parse_levels([CORE_LABEL, SPINE_LABEL, LEAF_LABEL, HOSTNAME_LABEL]))


def node_labels(i: int) -> dict[str, str]:
    leaf = i // NODES_PER_LEAF
    spine = leaf // LEAVES_PER_SPINE
    core = spine // SPINES_PER_CORE
    return {
        CORE_LABEL: f"core-{core}",
        SPINE_LABEL: f"spine-{spine}",
        LEAF_LABEL: f"leaf-{leaf}",
        HOSTNAME_LABEL: f"node-{i:05d}",
    }


def random_allocation(nodes: int, gpus_per_node: int, fraction: float, seed: int) -> list[frozenset[int]]:
    """Allocated GPU positions per node: ``fraction`` of all GPUs, drawn uniformly (seeded)."""
    rng = random.Random(seed)
    total = nodes * gpus_per_node
    per_node: list[set[int]] = [set() for _ in range(nodes)]
    for g in rng.sample(range(total), round(total * fraction)):
        per_node[g // gpus_per_node].add(g % gpus_per_node)
    return [frozenset(s) for s in per_node]


@dataclass(frozen=True, slots=True)
class BuildTimes:
    nodes_ms: float
    snapshot_ms: float
    domains_ms: float

    @property
    def total_ms(self) -> float:
        return self.nodes_ms + self.snapshot_ms + self.domains_ms


#: CPUs per NUMA node of a synthetic node, and how many each allocated GPU's pod holds there.
CPUS_PER_NUMA = 56
CPUS_PER_GPU = 12


def kubelet_of(graph: GpuGraph, allocated: frozenset[int], policy: TopologyPolicy) -> KubeletAlignment | None:
    """A synthetic node's kubelet: ``policy`` with the static CPU manager; each allocated GPU's
    pod holds :data:`CPUS_PER_GPU` CPUs of its NUMA node (None for policy ``none``)."""
    if policy is TopologyPolicy.NONE:
        return None
    numa = sorted({g.numa_node for g in graph.gpus if g.numa_node is not None})
    held = [g.numa_node for g in graph.gpus if g.index in allocated]
    used = {n: CPUS_PER_GPU * held.count(n) for n in numa}
    nodes = tuple(NumaNode(n, CPUS_PER_NUMA, min(CPUS_PER_NUMA, used[n])) for n in numa)
    return KubeletAlignment(policy, cpu_policy=CpuPolicy.STATIC, numa_nodes=nodes)


def synthetic_cluster(
    nodes: int,
    graph: GpuGraph,
    fraction: float = 0.5,
    seed: int = 1,
    facts: bool = False,
    policy: TopologyPolicy = TopologyPolicy.NONE,
) -> tuple[ClusterSnapshot, BuildTimes]:
    """A cluster of ``nodes`` identical nodes under leaf/spine/core switches, with ``fraction``
    of the GPUs allocated (with ``facts``, taints, cordons and resources: :func:`node_facts`)
    and every kubelet running ``policy`` (:func:`kubelet_of`); returns the snapshot and how
    long building it took (node states, the snapshot, its domain index), which no decision
    pays."""
    indices = graph.indices
    allocation = random_allocation(nodes, len(indices), fraction, seed)
    labels = [node_labels(i) for i in range(nodes)]
    rng = random.Random(seed + 1)
    node_state_facts = [node_facts(i, rng) if facts else NO_FACTS for i in range(nodes)]
    t0 = time.perf_counter()
    states = []
    for i in range(nodes):
        taken = frozenset(indices[p] for p in allocation[i])
        kubelet = kubelet_of(graph, taken, policy)
        states.append(
            NodeState(
                labels[i][HOSTNAME_LABEL],
                labels[i],
                graph,
                taken,
                facts=node_state_facts[i],
                kubelet=kubelet,
                allocation=BENCH_ALLOCATION,
            )
        )
    t1 = time.perf_counter()
    snap = ClusterSnapshot(states, bench_hierarchy())
    t2 = time.perf_counter()
    snap.domains()
    t3 = time.perf_counter()
    return snap, BuildTimes((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (for fewer than 100 samples p99 is the maximum)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
