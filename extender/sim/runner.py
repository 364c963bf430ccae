"""One simulation run: every chosen policy on the same cluster and trace, and results.json's content.

Policies run one after the other, or side by side in ``workers`` processes (forked, so each
inherits the cluster, the trace and the best slices already found); each policy's simulation
is the same either way.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from extender import __version__
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.waiting import KeepCliques
from extender.sim.engine import IMEX_STARTUP_S, Policy, Progress, Simulation
from extender.sim.metrics import policy_results, starvation
from extender.sim.records import PolicyRun, node_type
from extender.sim.reference import Reference
from extender.sim.trace import Trace
from extender.topology.allocation import Allocation

SCHEMA_VERSION = 2
QUEUE = "fifo-backfill"


@dataclass
class Outcome:
    results: dict[str, Any]
    runs: list[PolicyRun]
    trace: Trace
    cluster: ClusterSnapshot


def _node_types(cluster: ClusterSnapshot) -> dict[str, int]:
    kinds = Counter(node_type(cluster, k) for k in range(len(cluster.nodes)))
    return dict(sorted(kinds.items()))


def _node_allocation(cluster: ClusterSnapshot) -> dict[str, dict[str, int]]:
    """Per node type, how many of its nodes hand out GPUs by each allocation mode."""
    out: dict[str, dict[str, int]] = {}
    for k, n in enumerate(cluster.nodes):
        modes = out.setdefault(node_type(cluster, k), {str(a): 0 for a in Allocation})
        modes[str(n.allocation)] += 1
    return dict(sorted(out.items()))


def default_workers() -> int:
    """Processes for the policies: one per CPU this process may use, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


@dataclass
class _Job:
    cluster: ClusterSnapshot
    trace: Trace
    reference: Reference
    no_wait: bool
    imex_startup_s: float
    keep_cliques: KeepCliques
    policies: Mapping[str, Policy]


#: The job a forked worker runs (set in the parent before the pool forks).
_JOB: _Job | None = None


def _simulate(name: str, progress: Progress | None = None) -> PolicyRun:
    job = _JOB
    assert job is not None
    return Simulation(
        job.cluster,
        job.trace,
        name,
        job.policies[name],
        job.reference,
        job.no_wait,
        progress,
        job.imex_startup_s,
        job.keep_cliques,
    ).run()


def run_simulation(
    cluster: ClusterSnapshot,
    trace: Trace,
    policies: Mapping[str, Policy],
    *,
    seed: int,
    no_wait: bool = False,
    cluster_source: str = "default",
    progress: Callable[[str], Progress] | None = None,
    imex_startup_s: float = IMEX_STARTUP_S,
    keep_cliques: KeepCliques = KeepCliques.WHILE_WAITING,
    workers: int = 1,
    done: Callable[[PolicyRun], None] | None = None,
) -> Outcome:
    """Simulate each policy; ``progress(policy)`` gives that run's progress callback (one
    process only), ``done(run)`` is called as each policy's run finishes."""
    global _JOB
    started = time.perf_counter()
    reference = Reference(cluster)
    for d in trace.deployments:  # found once here, inherited by every worker
        reference.best(d.gang)
    _JOB = _Job(cluster, trace, reference, no_wait, imex_startup_s, keep_cliques, policies)
    names = list(policies)
    runs: list[PolicyRun]
    try:
        if workers > 1 and len(names) > 1 and "fork" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(min(workers, len(names)), mp_context=context) as pool:
                futures = [pool.submit(_simulate, name) for name in names]
                runs = []
                for f in futures:
                    runs.append(f.result())
                    if done is not None:
                        done(runs[-1])
        else:
            runs = []
            for name in names:
                runs.append(_simulate(name, progress(name) if progress else None))
                if done is not None:
                    done(runs[-1])
    finally:
        _JOB = None
    by_policy = {run.policy: policy_results(run) for run in runs}
    hunger = starvation(by_policy)
    for name, r in by_policy.items():
        r["starvation"] = hunger[name]
    results: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "tool": f"gangslice simulate {__version__}",
        "seed": seed,
        "noWait": no_wait,
        "imexStartupSeconds": imex_startup_s,
        "keepCliques": str(keep_cliques),
        "queue": "reject" if no_wait else QUEUE,
        "cluster": {
            "source": cluster_source,
            "nodes": len(cluster.nodes),
            "gpus": runs[0].total_gpus if runs else cluster.total_gpus,
            "nodeTypes": _node_types(cluster),
            "nodeAllocation": _node_allocation(cluster),
        },
        "trace": {
            "source": trace.source,
            "deployments": len(trace.deployments),
            "scaleEvents": len(trace.scales),
            "rollouts": len(trace.rollouts),
            "nodeFailures": len(trace.node_downs),
            "gangs": len(runs[0].gangs) if runs else 0,
            "durationSeconds": trace.end,
        },
        "best": {
            name: None if best is None else {"stepMillis": round(best.step_us / 1000, 6), "exact": best.exact}
            for name, best in sorted(reference.templates(trace).items())
        },
        "policies": by_policy,
        "referenceErrors": reference.errors,
        "timing": {"wallSeconds": round(time.perf_counter() - started, 3), "workers": workers},
    }
    return Outcome(results, runs, trace, cluster)
