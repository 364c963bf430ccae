"""``gangslice bench placement``: decision time and predicted cost of gangslice and the peer
baselines on synthetic clusters, side by side in one run.

The ``bench`` command is a group of actions. Another module adds its own action from its
``register(sub)``, in any order relative to this one::

    from extender.placement.bench import bench_subparsers

    def register(sub):
        p = bench_subparsers(sub).add_parser("extender", help="...")
        p.set_defaults(func=run_extender_bench)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import random
import statistics
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from extender.cost import Comm
from extender.placement.baselines import POLICIES, Policy
from extender.placement.feasibility import NO_FACTS, NodeFacts, Resources, Taint
from extender.placement.request import GangRequest, PodRequests, PodSet, Toleration
from extender.placement.scoring import violations
from extender.placement.slice import Slice
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import HOSTNAME_LABEL, Hierarchy, parse_levels
from extender.topology.kubelet import CpuPolicy, KubeletAlignment, NumaNode, TopologyPolicy
from extender.topology.model import GpuGraph
from extender.topology.presets import PRESETS, preset_graph

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

DEFAULT_NODES = (1000, 5000, 20000)
DEFAULT_REPEAT = 20
QUICK_REPEAT = 3

#: Targets: gangslice's p99 decision time by (cluster nodes, gang pods).
TARGETS_MS = {(5000, 64): 100.0, (5000, 512): 1000.0, (20000, 64): 20.0, (20000, 512): 100.0}
#: Target: gangslice's p99 at most this many times the kueue-tas baseline's, every row.
RATIO_POLICY = "kueue-tas"
RATIO_TARGET = 1.5


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


# -- measuring --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measurement:
    nodes: int
    gang: str
    policy: str
    placed: bool
    #: Predicted per-layer communication time (us) of the slice; None when unplaceable.
    micros: float | None
    #: Hard rules of gangslice the slice breaks (scoring.violations); 0 for gangslice.
    broken: int
    nodes_used: int
    cold_ms: float
    median_ms: float
    p99_ms: float
    reason: str | None


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (for fewer than 100 samples p99 is the maximum)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def measure(snap: ClusterSnapshot, bench: BenchGang, name: str, policy: Policy, repeat: int) -> Measurement:
    """One cold call (memo tables still filling; reported on its own), then ``repeat`` timed
    decisions on the same snapshot; nothing is committed between them."""
    # Each policy's calls start on a collected heap: a full collection set off by the garbage
    # of the runs before (tens of ms over a 20,000-node snapshot) is not this policy's
    # decision time. The collections its own garbage sets off still count.
    gc.collect()
    t = time.perf_counter()
    result = policy(snap, bench.gang)
    cold = (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        policy(snap, bench.gang)
        times.append((time.perf_counter() - t) * 1e3)
    if isinstance(result, Slice):
        broken = len(violations(snap, bench.gang, result.slots))
        micros: float | None = result.per_layer_micros
        used, reason = len(result.nodes), None
    else:
        broken, micros, used, reason = 0, None, 0, result.reason
    return Measurement(
        nodes=len(snap.nodes),
        gang=bench.label,
        policy=name,
        placed=isinstance(result, Slice),
        micros=micros,
        broken=broken,
        nodes_used=used,
        cold_ms=cold,
        median_ms=statistics.median(times),
        p99_ms=percentile(times, 99),
        reason=reason,
    )


@dataclass(frozen=True, slots=True)
class ClusterRun:
    nodes: int
    build: BuildTimes
    results: tuple[Measurement, ...]


@dataclass(frozen=True, slots=True)
class Target:
    nodes: int
    gang: str
    limit_ms: float
    p99_ms: float

    @property
    def met(self) -> bool:
        return self.p99_ms < self.limit_ms


@dataclass(frozen=True, slots=True)
class Ratio:
    """gangslice's p99 against the kueue-tas baseline's for one row, measured in one run."""

    nodes: int
    gang: str
    gangslice_p99_ms: float
    baseline_p99_ms: float

    @property
    def ratio(self) -> float:
        return self.gangslice_p99_ms / self.baseline_p99_ms if self.baseline_p99_ms > 0 else math.inf

    @property
    def met(self) -> bool:
        return self.ratio <= RATIO_TARGET


def ratios(runs: Sequence[ClusterRun]) -> list[Ratio]:
    out = []
    for run in runs:
        p99 = {(m.gang, m.policy): m.p99_ms for m in run.results}
        for g in bench_gangs():
            ours, theirs = p99.get((g.label, "gangslice")), p99.get((g.label, RATIO_POLICY))
            if ours is not None and theirs is not None:
                out.append(Ratio(run.nodes, g.label, ours, theirs))
    return out


def _guaranteed(bench: BenchGang) -> BenchGang:
    """The gang with Guaranteed pods of :data:`CPUS_PER_GPU` integer CPUs per GPU, the pods the
    static CPU manager and the Topology Manager align."""
    sets = tuple(
        dataclasses.replace(
            ps,
            requests=dataclasses.replace(
                ps.requests, cpu_millis=1000 * CPUS_PER_GPU * ps.gpus_per_pod, guaranteed=True
            ),
        )
        for ps in bench.gang.pod_sets
    )
    return dataclasses.replace(bench, gang=dataclasses.replace(bench.gang, pod_sets=sets))


def run_bench(
    sizes: Sequence[int],
    node_type: str,
    repeat: int,
    seed: int,
    policies: Sequence[str],
    node_facts: bool = False,
    topology_policy: TopologyPolicy = TopologyPolicy.NONE,
) -> tuple[list[ClusterRun], list[Target]]:
    graph = preset_graph(node_type)
    gangs = bench_gangs(node_facts)
    if topology_policy is not TopologyPolicy.NONE:
        gangs = tuple(_guaranteed(g) for g in gangs)
    runs: list[ClusterRun] = []
    targets: list[Target] = []
    for n in sizes:
        snap, build = synthetic_cluster(n, graph, 0.5, seed, node_facts, topology_policy)
        results = tuple(measure(snap, g, p, POLICIES[p], repeat) for g in gangs for p in policies)
        runs.append(ClusterRun(n, build, results))
        pods = {g.label: g.gang.pods for g in gangs}
        targets.extend(
            Target(n, m.gang, TARGETS_MS[(n, pods[m.gang])], m.p99_ms)
            for m in results
            if m.policy == "gangslice" and (n, pods[m.gang]) in TARGETS_MS
        )
    return runs, targets


# -- output -----------------------------------------------------------------------------


def _header(node_type: str, repeat: int, seed: int) -> list[str]:
    return [
        f"gangslice bench placement: {node_type} nodes ({len(preset_graph(node_type).gpus)} GPUs each), "
        f"core/spine/leaf + hostname, {NODES_PER_LEAF} nodes per leaf, {LEAVES_PER_SPINE} leaves per "
        f"spine, {SPINES_PER_CORE} spines per core; 50% of GPUs allocated at random (seed {seed}); "
        f"GPUs allocated by the {BENCH_ALLOCATION.words} on every node, the default of a node without "
        "DRA (every policy gets its answers; gangslice pays for predicting them)",
        f"each decision: 1 cold call, then {repeat} timed calls on the same snapshot "
        f"(median and nearest-rank p99, ms); us/layer = predicted communication per layer "
        f"(scoring.gang_micros); broken = gangslice rules the slice breaks (scoring.violations)",
        "gangs:",
        *(f"  {g.label:<6} {g.what}" for g in bench_gangs()),
    ]


def render(
    runs: Sequence[ClusterRun], targets: Sequence[Target], node_type: str, repeat: int, seed: int
) -> str:
    lines = _header(node_type, repeat, seed)
    lines.append("")
    lines.append("snapshot build (not part of any decision):")
    for run in runs:
        b = run.build
        lines.append(
            f"  {run.nodes:>6} nodes: {b.total_ms:8.1f} ms  (node states {b.nodes_ms:.1f}, "
            f"snapshot {b.snapshot_ms:.1f}, domain index {b.domains_ms:.1f})"
        )
    lines.append("")
    cols = f"{'nodes':>6}  {'gang':<6} {'policy':<10} {'result':<11} {'us/layer':>9} {'broken':>6} "
    cols += f"{'nodes used':>10} {'median ms':>10} {'p99 ms':>9} {'cold ms':>9}"
    lines.append(cols)
    lines.append("-" * len(cols))
    for run in runs:
        for m in run.results:
            micros = f"{m.micros:9.1f}" if m.micros is not None else f"{'-':>9}"
            lines.append(
                f"{m.nodes:>6}  {m.gang:<6} {m.policy:<10} {'placed' if m.placed else 'unplaceable':<11} "
                f"{micros} {m.broken:>6} {m.nodes_used:>10} {m.median_ms:>10.2f} {m.p99_ms:>9.2f} "
                f"{m.cold_ms:>9.2f}"
            )
    for t in targets:
        verdict = "met" if t.met else "MISSED"
        lines.append(
            f"target: gangslice {t.gang} gang on {t.nodes} nodes, p99 < {t.limit_ms:.0f} ms: "
            f"{t.p99_ms:.1f} ms ({verdict})"
        )
    for r in ratios(runs):
        verdict = "met" if r.met else "MISSED"
        lines.append(
            f"ratio: gangslice / {RATIO_POLICY} p99, {r.gang} on {r.nodes} nodes: {r.ratio:.2f}x "
            f"({r.gangslice_p99_ms:.1f} vs {r.baseline_p99_ms:.1f} ms; target <= {RATIO_TARGET}x: {verdict})"
        )
    return "\n".join(lines)


def to_json(
    runs: Sequence[ClusterRun], targets: Sequence[Target], node_type: str, repeat: int, seed: int
) -> Any:
    return {
        "nodeType": node_type,
        "repeat": repeat,
        "seed": seed,
        "allocatedFraction": 0.5,
        "allocation": str(BENCH_ALLOCATION),
        "fabric": {
            "nodesPerLeaf": NODES_PER_LEAF,
            "leavesPerSpine": LEAVES_PER_SPINE,
            "spinesPerCore": SPINES_PER_CORE,
        },
        "gangs": [{"label": g.label, "what": g.what} for g in bench_gangs()],
        "clusters": [
            {
                "nodes": r.nodes,
                "buildMs": {**asdict(r.build), "total_ms": r.build.total_ms},
                "results": [asdict(m) for m in r.results],
            }
            for r in runs
        ],
        "targets": [{**asdict(t), "met": t.met} for t in targets],
        "ratios": [{**asdict(r), "ratio": r.ratio, "met": r.met} for r in ratios(runs)],
    }


# -- command ----------------------------------------------------------------------------

_ACTIONS: weakref.WeakKeyDictionary[argparse.ArgumentParser, Any] = weakref.WeakKeyDictionary()


def bench_subparsers(sub: Any) -> Any:
    """The action subparsers of ``gangslice bench``, created on first use: call it from any
    module's ``register(sub)`` and add an action with ``.add_parser(name, help=...)``."""
    parser = sub.choices.get("bench")
    if parser is None:
        parser = sub.add_parser("bench", help="benchmarks: decision time and placement quality")
    actions = _ACTIONS.get(parser)
    if actions is None:
        actions = parser.add_subparsers(dest="bench_action", metavar="ACTION", required=True)
        _ACTIONS[parser] = actions
    return actions


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = bench_subparsers(sub).add_parser(
        "placement",
        help="decision time and predicted cost of gangslice and the baselines on synthetic clusters",
    )
    p.add_argument(
        "--nodes",
        type=int,
        nargs="+",
        default=list(DEFAULT_NODES),
        metavar="N",
        help=f"cluster sizes (default {' '.join(map(str, DEFAULT_NODES))})",
    )
    p.add_argument(
        "--repeat", type=int, default=None, help=f"timed runs per decision (default {DEFAULT_REPEAT})"
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK_REPEAT} timed runs per decision")
    p.add_argument("--seed", type=int, default=1, help="seed of the random allocation (default 1)")
    p.add_argument(
        "--node-type", default="hgx-h100", choices=sorted(PRESETS), help="node preset (default hgx-h100)"
    )
    p.add_argument(
        "--policy",
        nargs="+",
        default=list(POLICIES),
        choices=list(POLICIES),
        help="policies to run (default: all)",
    )
    p.add_argument(
        "--node-facts",
        action="store_true",
        help="give nodes taints, cordons and allocatable resources partly requested, and the gangs' "
        "pods tolerations and cpu/memory requests (kube-scheduler's filters in every decision)",
    )
    p.add_argument(
        "--topology-manager-policy",
        default=str(TopologyPolicy.NONE),
        choices=[str(t) for t in TopologyPolicy],
        help="every node's kubelet runs this Topology Manager policy with the static CPU manager "
        f"({CPUS_PER_NUMA} CPUs per NUMA node, {CPUS_PER_GPU} held per allocated GPU; default none)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    repeat = args.repeat if args.repeat is not None else QUICK_REPEAT if args.quick else DEFAULT_REPEAT
    if repeat < 1 or any(n < 1 for n in args.nodes):
        print("gangslice bench placement: --repeat and --nodes must be at least 1")
        return 2
    topology_policy = TopologyPolicy(args.topology_manager_policy)
    runs, targets = run_bench(
        args.nodes, args.node_type, repeat, args.seed, args.policy, args.node_facts, topology_policy
    )
    if args.node_facts and not args.json:
        print(
            "with node facts: 1 in 10 nodes tainted against the gangs, 1 in 50 cordoned, "
            "resources partly requested"
        )
    if args.json:
        data = to_json(runs, targets, args.node_type, repeat, args.seed)
        data["topologyManagerPolicy"] = str(topology_policy)
        print(json.dumps(data, indent=2))
    else:
        if topology_policy is not TopologyPolicy.NONE:
            print(
                f"kubelets: topologyManagerPolicy {topology_policy} with the static CPU manager "
                f"({CPUS_PER_NUMA} CPUs per NUMA node, {CPUS_PER_GPU} held per allocated GPU); "
                f"every pod Guaranteed with {CPUS_PER_GPU} CPUs per GPU"
            )
        print(render(runs, targets, args.node_type, repeat, args.seed))
    return 0
