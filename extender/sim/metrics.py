"""From simulated gangs and the cluster timeline to the numbers of results.json.

Definitions (SCHEMA.md says the same for readers of the file):

- quantiles interpolate linearly between the two nearest ranks (numpy's default): the p99
  of [1, 2, 3] is 2.98;
- time averages weigh each timeline point by how long it held, from 0 to the trace's end;
- a gang *communicates* when its per-layer time is above zero here or in its ideal slice
  (a one-GPU replica does not); per-layer statistics are over placed gangs that do;
- the *best* slice of a request is the gangslice solver's slice for it on the cluster with
  no simulated gang; the *same-hardware* slice is the solver's slice on that cluster cut
  down to the node types the gang got. The *TTFT inflation* of a placed gang is its prefill
  step's communication time (per-layer time x layers, summed over pod sets) minus the
  reference's, in milliseconds (``extraMillis``), and the ratio of the two (``ratio``; 1 is
  as good as the reference; a policy that beats the solver's empty-cluster slice gets below 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from extender.sim.engine import PLACED, REJECTED, WITHDRAWN, GangRecord, Point, PolicyRun
from extender.sim.judge import REASONS

TIMELINE_COLUMNS = ("t", "allocatedGpus", "waitingGangs", "wholeFreeNodes", "largestFreeLeafGpus")


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; ``values`` need not be sorted, not empty."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: Iterable[float]) -> dict[str, Any]:
    """count, median, p99, mean, max (the last four null when there are no values)."""
    vals = list(values)
    if not vals:
        return {"count": 0, "median": None, "p99": None, "mean": None, "max": None}
    return {
        "count": len(vals),
        "median": _r(quantile(vals, 0.5)),
        "p99": _r(quantile(vals, 0.99)),
        "mean": _r(sum(vals) / len(vals)),
        "max": _r(max(vals)),
    }


def _r(x: float) -> float:
    """Round for the report: 6 significant digits keep files stable and diffable."""
    return float(f"{x:.6g}")


def step_mean(points: Sequence[Point], value: Callable[[Point], float], end: float) -> float:
    """Time average of a step function over [0, end]."""
    if end <= 0 or not points:
        return float(value(points[-1])) if points else 0.0
    total = 0.0
    for a, b in zip(points, [*points[1:], None], strict=True):
        stop = min(b.t if b is not None else end, end)
        if stop > a.t:
            total += (stop - a.t) * value(a)
    return total / end


def communicates(g: GangRecord) -> bool:
    return (g.micros or 0.0) > 0 or (g.ideal is not None and g.ideal.micros > 0)


def _ttft(placed: Sequence[GangRecord], same_hardware: bool = False) -> tuple[list[float], list[float]]:
    extra: list[float] = []
    ratio: list[float] = []
    for g in placed:
        ideal = g.ideal_same_hardware if same_hardware else g.ideal
        if ideal is None or ideal.comm_ms <= 0 or g.comm_ms is None:
            continue
        extra.append(g.comm_ms - ideal.comm_ms)
        ratio.append(g.comm_ms / ideal.comm_ms)
    return extra, ratio


def _ttft_summary(placed: Sequence[GangRecord], same_hardware: bool) -> dict[str, Any]:
    extra, ratio = _ttft(placed, same_hardware)
    return {"extraMillis": summary(extra), "ratio": summary(ratio)}


def gang_counts(gangs: Sequence[GangRecord]) -> dict[str, Any]:
    placed = [g for g in gangs if g.placed_at is not None]
    coherent = sum(1 for g in placed if not g.incoherent)
    rejected = sum(1 for g in gangs if g.outcome == REJECTED)
    withdrawn = sum(1 for g in gangs if g.outcome == WITHDRAWN)
    return {
        "arrived": len(gangs),
        "placed": len(placed),
        "rejected": rejected,
        "withdrawn": withdrawn,
        "neverPlaced": rejected + withdrawn,
        "coherent": coherent,
        "coherentShare": _r(coherent / len(placed)) if placed else None,
        "coherentShareOfArrived": _r(coherent / len(gangs)) if gangs else None,
        "incoherentBy": {r: sum(1 for g in placed if r in g.incoherent) for r in REASONS},
    }


def policy_results(run: PolicyRun) -> dict[str, Any]:
    gangs = run.gangs
    placed = [g for g in gangs if g.outcome == PLACED]
    tl = run.timeline
    total = run.total_gpus
    mean_alloc = step_mean(tl, lambda p: p.allocated_gpus, run.end)
    decisions = run.decision_seconds
    policy_s = sum(decisions)
    return {
        "gangs": gang_counts(gangs),
        "perLayerMicros": summary(g.micros for g in placed if communicates(g) and g.micros is not None),
        "ttft": {"vsBest": _ttft_summary(placed, False), "vsSameHardware": _ttft_summary(placed, True)},
        "waitSeconds": summary(g.waited for g in placed if g.waited is not None),
        "imexStartup": {
            "gangs": sum(1 for g in placed if g.imex_s),
            "seconds": _r(sum(g.imex_s for g in placed)),
        },
        "allocation": {
            "meanGpus": _r(mean_alloc),
            "meanShare": _r(mean_alloc / total) if total else None,
            "peakGpus": max((p.allocated_gpus for p in tl), default=0),
            "gpuHours": _r(mean_alloc * run.end / 3600),
        },
        "fragmentation": {
            "meanWholeFreeNodes": _r(step_mean(tl, lambda p: p.whole_free_nodes, run.end)),
            "minWholeFreeNodes": min((p.whole_free_nodes for p in tl), default=0),
            "meanLargestFreeLeafGpus": _r(step_mean(tl, lambda p: p.largest_free_leaf_gpus, run.end)),
            "minLargestFreeLeafGpus": min((p.largest_free_leaf_gpus for p in tl), default=0),
        },
        "decisions": {
            "calls": len(decisions),
            "refusals": run.failed_calls,
            "errors": run.error_count,
            "errorSamples": run.errors,
        },
        "byTemplate": by_template(gangs, run.node_types),
        "timeline": {
            "columns": list(TIMELINE_COLUMNS),
            "points": [
                [_r(p.t), p.allocated_gpus, p.waiting_gangs, p.whole_free_nodes, p.largest_free_leaf_gpus]
                for p in tl
            ],
        },
        "timing": {
            "wallSeconds": round(run.wall_seconds, 3),
            "policySeconds": round(policy_s, 3),
            "decisionsPerSecond": round(len(decisions) / policy_s, 1) if policy_s > 0 else None,
            "meanDecisionMillis": round(1000 * policy_s / len(decisions), 3) if decisions else None,
            "p99DecisionMillis": round(1000 * quantile(decisions, 0.99), 3) if decisions else None,
        },
    }


def by_template(gangs: Sequence[GangRecord], node_types: Sequence[str]) -> dict[str, Any]:
    groups: dict[str, list[GangRecord]] = {}
    for g in gangs:
        groups.setdefault(g.template or g.deployment, []).append(g)
    out: dict[str, Any] = {}
    for name in sorted(groups):
        members = groups[name]
        placed = [g for g in members if g.outcome == PLACED]
        _, ratio = _ttft(placed)
        _, same = _ttft(placed, same_hardware=True)
        counts = gang_counts(members)
        out[name] = {
            "gpus": members[0].gang.gpus,
            "arrived": counts["arrived"],
            "placed": counts["placed"],
            "neverPlaced": counts["neverPlaced"],
            "coherentShare": counts["coherentShare"],
            "waitSeconds": summary(g.waited for g in placed if g.waited is not None),
            "ttftRatioMedian": _r(quantile(ratio, 0.5)) if ratio else None,
            "ttftSameHardwareRatioMedian": _r(quantile(same, 0.5)) if same else None,
            "gpuHoursByNodeType": gpu_hours_by_type(placed, node_types),
        }
    return out


def gpu_hours_by_type(placed: Iterable[GangRecord], node_types: Sequence[str]) -> dict[str, float]:
    """GPU-hours the gangs held, per node type (``node_types``, by node index), from
    placement to the end of their run."""
    seconds: dict[str, float] = {}
    for g in placed:
        if g.placed_at is None or g.ended_at is None:
            continue
        held = g.ended_at - g.placed_at
        for i, mask in g.held.items():
            kind = node_types[i]
            seconds[kind] = seconds.get(kind, 0.0) + mask.bit_count() * held
    return {kind: _r(s / 3600) for kind, s in sorted(seconds.items())}


def gang_rows(run: PolicyRun) -> Iterable[dict[str, Any]]:
    """One plain record per gang (the lines of gangs.jsonl)."""
    for g in run.gangs:
        yield {
            "policy": run.policy,
            "gang": g.name,
            "deployment": g.deployment,
            "template": g.template,
            "gpus": g.gang.gpus,
            "arrivedAt": g.arrived,
            "placedAt": g.placed_at,
            "endedAt": g.ended_at,
            "outcome": g.outcome,
            "nodes": g.nodes,
            "imexStartupSeconds": g.imex_s,
            "perLayerMicros": None if g.micros is None else _r(g.micros),
            "idealPerLayerMicros": None if g.ideal is None else _r(g.ideal.micros),
            "commMillis": None if g.comm_ms is None else _r(g.comm_ms),
            "idealCommMillis": None if g.ideal is None else _r(g.ideal.comm_ms),
            "sameHardwareIdealCommMillis": None
            if g.ideal_same_hardware is None
            else _r(g.ideal_same_hardware.comm_ms),
            "coherent": g.coherent,
            "incoherent": list(g.incoherent),
        }
