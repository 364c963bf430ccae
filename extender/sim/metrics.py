"""From simulated gangs and the cluster timeline to the numbers of results.json.

Definitions (SCHEMA.md says the same for readers of the file):

- a run's **speed** is its template's best step on the fleet (:mod:`extender.sim.reference`)
  over the run's own step (compute + communication; 1 at best);
- **goodput**: the sum over runs of GPUs x hours served x speed, hours served counting from
  the end of the model load to the run's end;
- **demand**: the sum over every gang that arrived of GPUs x hours from arrival to departure
  (scaled down, retired by a rollout, its deployment's end), never-placed gangs included;
- a **served share** is served GPU-hours (at any speed) over demand GPU-hours;
- **waits** count every gang that arrived: arrival to first start for placed gangs, arrival to
  withdrawal (or the trace's end) for gangs never placed;
- quantiles interpolate linearly between the two nearest ranks (numpy's default: the p99 of
  [1, 2, 3] is 2.98); time averages weigh each timeline point by how long it held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from extender.sim.judge import REASONS
from extender.sim.records import (
    MOVED,
    NODE_LOST,
    PLACED,
    REJECTED,
    WITHDRAWN,
    GangRecord,
    Point,
    PolicyRun,
    Run,
    speed,
)

TIMELINE_COLUMNS = (
    "t",
    "allocatedGpus",
    "waitingGangs",
    "wholeFreeNodes",
    "largestFreeLeafGpus",
    "servingGpus",
    "goodputGpus",
    "nodesDown",
)
#: Templates with less than this share of a day's demand are not judged for starvation.
STARVATION_MIN_DEMAND = 0.01


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


def _share(part: float, whole: float) -> float | None:
    return _r(part / whole) if whole > 0 else None


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
    return (g.micros or 0.0) > 0 or (g.ideal is not None and g.ideal.step.comm_us > 0)


def demand_s(g: GangRecord, end: float) -> float:
    """GPU-seconds a gang asked for: its GPUs from arrival to departure."""
    stop = g.ended_at if g.ended_at is not None else end
    return g.gang.gpus * max(0.0, stop - g.arrived)


def run_speed(g: GangRecord, run: Run) -> float:
    return speed(g.ideal, run.step)


def _served(gangs: Iterable[GangRecord], end: float) -> tuple[float, float]:
    """(served GPU-seconds, goodput GPU-seconds)."""
    served = good = 0.0
    for g in gangs:
        for run in g.runs:
            s = g.gang.gpus * run.served_s(end)
            served += s
            good += s * run_speed(g, run)
    return served, good


def step_ratios(gangs: Iterable[GangRecord], same_hardware: bool = False) -> list[float]:
    """Each run's step over its template's best (or best on the node types it got)."""
    out: list[float] = []
    for g in gangs:
        ideal = g.ideal_same_hardware if same_hardware else g.ideal
        if ideal is None or ideal.step_us <= 0:
            continue
        out.extend(run.step.total_us / ideal.step_us for run in g.runs)
    return out


def goodput(gangs: Sequence[GangRecord], end: float) -> dict[str, Any]:
    served, good = _served(gangs, end)
    demand = sum(demand_s(g, end) for g in gangs)
    never = [g for g in gangs if not g.runs]
    load = restart = 0.0
    restarts = {NODE_LOST: 0, MOVED: 0}
    for g in gangs:
        for k, run in enumerate(g.runs):
            held = g.gang.gpus * run.loading_s(end)
            if run.restart:
                restart += held
            else:
                load += held
            if run.cause in restarts and k + 1 < len(g.runs):
                restarts[run.cause] += 1
    return {
        "gpuHours": _r(good / 3600),
        "servedGpuHours": _r(served / 3600),
        "demandGpuHours": _r(demand / 3600),
        "share": _share(good, demand),
        "servedShare": _share(served, demand),
        "loadGpuHours": _r(load / 3600),
        "restartGpuHours": _r(restart / 3600),
        "restarts": {"nodeLost": restarts[NODE_LOST], "moved": restarts[MOVED]},
        "neverPlacedGangs": len(never),
        "neverPlacedGpus": sum(g.gang.gpus for g in never),
        "neverPlacedGpuHours": _r(sum(demand_s(g, end) for g in never) / 3600),
    }


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


def _step_split(gangs: Sequence[GangRecord]) -> dict[str, Any]:
    runs = [run for g in gangs for run in g.runs]
    return {
        "vsBest": summary(step_ratios(gangs)),
        "vsSameHardware": summary(step_ratios(gangs, same_hardware=True)),
        "millis": summary(run.step.total_us / 1000 for run in runs),
        "computeMillis": summary(run.step.compute_us / 1000 for run in runs),
        "commMillis": summary(run.step.comm_us / 1000 for run in runs),
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
        "goodput": goodput(gangs, run.end),
        "gangs": gang_counts(gangs),
        "step": _step_split(gangs),
        "perLayerMicros": summary(g.micros for g in placed if communicates(g) and g.micros is not None),
        "waitSeconds": summary(g.waited_until(run.end) for g in gangs),
        "waitSecondsPlaced": summary(g.waited for g in gangs if g.waited is not None),
        "imexStartup": {
            "gangs": sum(1 for g in gangs for r in g.runs if r.imex_s),
            "seconds": _r(sum(r.imex_s for g in gangs for r in g.runs)),
        },
        "moves": run.moves,
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
        "byTemplate": by_template(gangs, run.node_types, run.end),
        "timeline": {
            "columns": list(TIMELINE_COLUMNS),
            "points": [
                [
                    _r(p.t),
                    p.allocated_gpus,
                    p.waiting_gangs,
                    p.whole_free_nodes,
                    p.largest_free_leaf_gpus,
                    p.serving_gpus,
                    _r(p.goodput_gpus),
                    p.nodes_down,
                ]
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


def by_template(gangs: Sequence[GangRecord], node_types: Sequence[str], end: float) -> dict[str, Any]:
    groups: dict[str, list[GangRecord]] = {}
    for g in gangs:
        groups.setdefault(g.template or g.deployment, []).append(g)
    out: dict[str, Any] = {}
    for name in sorted(groups):
        members = groups[name]
        placed = [g for g in members if g.outcome == PLACED]
        counts = gang_counts(members)
        served, good = _served(members, end)
        demand = sum(demand_s(g, end) for g in members)
        ratio = step_ratios(members)
        same = step_ratios(members, same_hardware=True)
        best = members[0].ideal
        out[name] = {
            "gpus": members[0].gang.gpus,
            "arrived": counts["arrived"],
            "placed": counts["placed"],
            "neverPlaced": counts["neverPlaced"],
            "coherentShare": counts["coherentShare"],
            "demandGpuHours": _r(demand / 3600),
            "servedGpuHours": _r(served / 3600),
            "goodputGpuHours": _r(good / 3600),
            "servedShare": _share(served, demand),
            "goodputShare": _share(good, demand),
            "bestStepMillis": None if best is None else _r(best.step_us / 1000),
            "stepRatioMedian": _r(quantile(ratio, 0.5)) if ratio else None,
            "stepRatioP99": _r(quantile(ratio, 0.99)) if ratio else None,
            "stepSameHardwareRatioMedian": _r(quantile(same, 0.5)) if same else None,
            "waitSeconds": summary(g.waited_until(end) for g in members),
            "gpuHoursByNodeType": gpu_hours_by_type(placed, node_types, end),
        }
    return out


def gpu_hours_by_type(
    placed: Iterable[GangRecord], node_types: Sequence[str], end: float
) -> dict[str, float]:
    """GPU-hours the gangs held, per node type (``node_types``, by node index), over every run."""
    seconds: dict[str, float] = {}
    for g in placed:
        for run in g.runs:
            held = (run.ended_at if run.ended_at is not None else end) - run.placed_at
            for i, mask in run.held.items():
                kind = node_types[i]
                seconds[kind] = seconds.get(kind, 0.0) + mask.bit_count() * held
    return {kind: _r(s / 3600) for kind, s in sorted(seconds.items())}


def starvation(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy, the starvation gap: over templates with at least
    :data:`STARVATION_MIN_DEMAND` of its day's demand, the best other policy's served share of
    the template minus its own, in points; the largest, and per template."""
    out: dict[str, dict[str, Any]] = {}
    for name, r in policies.items():
        total = r["goodput"]["demandGpuHours"]
        gaps: dict[str, float] = {}
        for template, mine in r["byTemplate"].items():
            if (
                not total
                or mine["demandGpuHours"] < STARVATION_MIN_DEMAND * total
                or mine["servedShare"] is None
            ):
                continue
            others = [
                o["byTemplate"][template]["servedShare"]
                for other, o in policies.items()
                if other != name
                and template in o["byTemplate"]
                and o["byTemplate"][template]["servedShare"] is not None
            ]
            if others:
                gaps[template] = _r(100 * (max(others) - mine["servedShare"]))
        worst = max(gaps, key=lambda k: (gaps[k], k), default=None)
        out[name] = {
            "gapPoints": gaps[worst] if worst is not None else None,
            "template": worst,
            "byTemplate": dict(sorted(gaps.items())),
        }
    return out


def gang_rows(run: PolicyRun) -> Iterable[dict[str, Any]]:
    """One plain record per gang (the lines of gangs.jsonl)."""
    for g in run.gangs:
        first = g.first
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
            "waitSeconds": _r(g.waited_until(run.end)),
            "nodes": g.nodes,
            "imexStartupSeconds": g.imex_s,
            "loadSeconds": _r(g.load_s),
            "runs": len(g.runs),
            "servedSeconds": _r(sum(r.served_s(run.end) for r in g.runs)),
            "restarts": [r.cause for r in g.runs[:-1]],
            "bestStepMillis": None if g.ideal is None else _r(g.ideal.step_us / 1000),
            "stepMillis": None if first is None else _r(first.step.total_us / 1000),
            "speed": None if first is None else _r(run_speed(g, first)),
            "podSets": None
            if first is None
            else {
                name: {
                    "gpus": dict(s.gpus),
                    "computeMillis": _r(s.compute_us / 1000),
                    "commMillis": _r(s.comm_us / 1000),
                }
                for name, s in first.step.by_pod_set.items()
            },
            "perLayerMicros": None if g.micros is None else _r(g.micros),
            "commMillis": None if g.comm_ms is None else _r(g.comm_ms),
            "coherent": g.coherent,
            "incoherent": list(g.incoherent),
        }
