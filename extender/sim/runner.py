"""One simulation run: every chosen policy on the same cluster and trace, and results.json's content."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from extender import __version__
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.waiting import KeepCliques
from extender.sim.engine import IMEX_STARTUP_S, Policy, PolicyRun, Progress, Reference, Simulation, node_type
from extender.sim.metrics import policy_results
from extender.sim.trace import Trace
from extender.topology.allocation import Allocation

SCHEMA_VERSION = 1
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
) -> Outcome:
    """Simulate each policy in turn; ``progress(policy)`` gives that run's progress callback."""
    started = time.perf_counter()
    reference = Reference(cluster)
    runs = [
        Simulation(
            cluster,
            trace,
            name,
            policy,
            reference,
            no_wait,
            progress(name) if progress else None,
            imex_startup_s,
            keep_cliques,
        ).run()
        for name, policy in policies.items()
    ]
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
            "gangs": len(runs[0].gangs) if runs else 0,
            "durationSeconds": trace.end,
        },
        "policies": {run.policy: policy_results(run) for run in runs},
        "referenceErrors": reference.errors,
        "timing": {"wallSeconds": round(time.perf_counter() - started, 3)},
    }
    return Outcome(results, runs, trace, cluster)
