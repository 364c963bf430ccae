"""``gangslice bench placement``: decision time and predicted cost of gangslice and the peer
baselines on synthetic clusters, side by side in one run.

The ``bench`` command is a group of actions. Another module adds its own action from its
``register(sub)``, in any order relative to this one::

    from extender.bench.placement import bench_subparsers

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
import statistics
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from extender.peers import POLICIES, Policy
from extender.placement.scoring import violations
from extender.placement.slice import Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.synthetic import (
    BENCH_ALLOCATION,
    CPUS_PER_GPU,
    CPUS_PER_NUMA,
    LEAVES_PER_SPINE,
    NODES_PER_LEAF,
    SPINES_PER_CORE,
    BenchGang,
    BuildTimes,
    bench_gangs,
    percentile,
    synthetic_cluster,
)
from extender.topology.kubelet import TopologyPolicy
from extender.topology.presets import PRESETS, preset_graph

DEFAULT_NODES = (1000, 5000, 20000)
DEFAULT_REPEAT = 20
QUICK_REPEAT = 3
#: Timed calls per decision a target is judged on: a p99 of fewer (``--quick``'s 3) is
#: indicative only, and the targets and ratios are shown but not judged met or MISSED.
JUDGED_REPEAT = DEFAULT_REPEAT

#: Targets: gangslice's p99 decision time by (cluster nodes, gang pods).
TARGETS_MS = {(5000, 64): 100.0, (5000, 512): 1000.0, (20000, 64): 20.0, (20000, 512): 100.0}
#: Target: gangslice's p99 at most this many times the kueue-tas baseline's, every row.
RATIO_POLICY = "kueue-tas"
RATIO_TARGET = 1.5


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
    judged = repeat >= JUDGED_REPEAT
    shown = ratios(runs)
    if (targets or shown) and not judged:
        lines.append(
            f"indicative figures: {repeat} timed runs per decision, fewer than the {JUDGED_REPEAT} the "
            f"targets are judged on; rerun without --quick (or with --repeat {JUDGED_REPEAT}) to judge them"
        )
    for t in targets:
        verdict = ("met" if t.met else "MISSED") if judged else "indicative"
        lines.append(
            f"target: gangslice {t.gang} gang on {t.nodes} nodes, p99 < {t.limit_ms:.0f} ms: "
            f"{t.p99_ms:.1f} ms ({verdict})"
        )
    for r in shown:
        verdict = ("met" if r.met else "MISSED") if judged else "indicative"
        lines.append(
            f"ratio: gangslice / {RATIO_POLICY} p99, {r.gang} on {r.nodes} nodes: {r.ratio:.2f}x "
            f"({r.gangslice_p99_ms:.1f} vs {r.baseline_p99_ms:.1f} ms; target <= {RATIO_TARGET}x: {verdict})"
        )
    return "\n".join(lines)


def to_json(
    runs: Sequence[ClusterRun], targets: Sequence[Target], node_type: str, repeat: int, seed: int
) -> Any:
    judged = repeat >= JUDGED_REPEAT
    return {
        "nodeType": node_type,
        "repeat": repeat,
        # False below JUDGED_REPEAT timed runs: every "met" is then null, not judged.
        "judged": judged,
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
        "targets": [{**asdict(t), "met": t.met if judged else None} for t in targets],
        "ratios": [{**asdict(r), "ratio": r.ratio, "met": r.met if judged else None} for r in ratios(runs)],
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
        "--repeat",
        type=int,
        default=None,
        help=f"timed runs per decision (default {DEFAULT_REPEAT}); with fewer than {JUDGED_REPEAT} the "
        "figures are indicative and the targets are not judged",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_REPEAT} timed runs per decision: indicative figures, targets not judged",
    )
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
        print("gangslice bench placement: --repeat and --nodes must be at least 1", file=sys.stderr)
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
