"""PNG plots of a run (matplotlib, Agg backend: no display needed).

Four pictures a reader looks at before the tables:

- ``goodput.png``: goodput over the day (GPUs serving, weighted by each replica's speed
  against its best slice), one panel per policy with that policy in colour over the others
  in grey, the schedulable GPUs dotted;
- ``served-share.png``: each template's served share of its demand, small multiples (one
  panel per template, a bar per policy), so a starved workload shows at a glance;
- ``wait-ccdf.png``: the share of gangs that waited longer than x, over every gang that
  arrived (a gang never placed waited until it was withdrawn), log y so the tail shows;
- ``step-ratio.png``: per template, each policy's median and p99 step time over the
  template's best slice (1 is as fast as the fleet allows), templates by demand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from extender.sim.metrics import demand_s, quantile, run_speed, step_ratios
from extender.sim.records import GangRecord, Point, PolicyRun

_HOUR = 3600.0


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colours(runs: Sequence[PolicyRun]) -> dict[str, Any]:
    cmap = _pyplot().get_cmap("tab10")
    return {run.policy: cmap(k % 10) for k, run in enumerate(runs)}


def _steps(run: PolicyRun, value: Callable[[Point], float]) -> tuple[list[float], list[float]]:
    """The step function up to the trace's end; the state *at* the end (everything gone)
    holds for no time and is left out."""
    shown = [p for p in run.timeline if p.t < run.end] or run.timeline[:1]
    xs = [p.t / _HOUR for p in shown]
    ys = [float(value(p)) for p in shown]
    if xs:
        xs.append(max(run.end / _HOUR, xs[-1]))
        ys.append(ys[-1])
    return xs, ys


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    _pyplot().close(fig)
    return name


def goodput(runs: Sequence[PolicyRun], out: Path) -> str:
    plt = _pyplot()
    colours = _colours(runs)
    rows = max(len(runs), 1)
    fig, axes = plt.subplots(
        rows, 1, figsize=(8.5, 1.5 * rows + 0.9), sharex=True, sharey=True, squeeze=False
    )
    for r, run in enumerate(runs):
        ax = axes[r][0]
        for other in runs:
            if other is not run:
                xs, ys = _steps(other, lambda p: p.goodput_gpus)
                ax.step(xs, ys, where="post", color="0.82", linewidth=0.7)
        xs, ys = _steps(run, lambda p: p.goodput_gpus)
        good = sum(g.gang.gpus * run_s for g in run.gangs for run_s in _good_seconds(g, run.end)) / _HOUR
        ax.step(
            xs,
            ys,
            where="post",
            color=colours[run.policy],
            linewidth=1.2,
            label=f"{run.policy}: {good:,.0f} GPU-h",
        )
        ax.axhline(run.total_gpus, color="black", linestyle=":", linewidth=0.8)
        ax.legend(loc="lower right", fontsize="small", frameon=False)
        ax.set_ylabel("GPUs", fontsize="small")
        ax.tick_params(labelsize="x-small")
    axes[-1][0].set_xlabel("time (hours)")
    fig.suptitle(
        "Goodput over the day: GPUs serving x their speed against the best slice\n"
        "(each policy in colour, the others in grey; dotted: schedulable GPUs)",
        fontsize="medium",
    )
    return _save(fig, out, "goodput.png")


def _good_seconds(g: GangRecord, end: float) -> list[float]:
    return [run.served_s(end) * run_speed(g, run) for run in g.runs]


def _templates(runs: Sequence[PolicyRun]) -> list[str]:
    demand: dict[str, float] = {}
    for g in runs[0].gangs if runs else []:
        key = g.template or g.deployment
        demand[key] = demand.get(key, 0.0) + demand_s(g, runs[0].end)
    return sorted(demand, key=lambda k: -demand[k])


def _grid(n: int, cols: int = 4) -> tuple[int, int]:
    cols = max(1, min(cols, n))
    return math.ceil(n / cols), cols


def served_share(runs: Sequence[PolicyRun], out: Path) -> str:
    plt = _pyplot()
    colours = _colours(runs)
    names = _templates(runs)
    rows, cols = _grid(len(names))
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 2.3 * rows + 0.8), sharey=True, squeeze=False)
    for k, name in enumerate(names):
        ax = axes[k // cols][k % cols]
        shares = []
        for run in runs:
            members = [g for g in run.gangs if (g.template or g.deployment) == name]
            demand = sum(demand_s(g, run.end) for g in members)
            served = sum(g.gang.gpus * r.served_s(run.end) for g in members for r in g.runs)
            shares.append(100 * served / demand if demand else 0.0)
        xs = range(len(runs))
        ax.bar(xs, shares, color=[colours[r.policy] for r in runs])
        ax.set_xticks(list(xs), [r.policy for r in runs], rotation=60, fontsize="x-small")
        ax.set_ylim(0, 110)
        ax.set_title(name, fontsize="small")
        ax.tick_params(labelsize="x-small")
        for x, v in zip(xs, shares, strict=True):
            ax.text(x, v + 2, f"{v:.0f}", ha="center", fontsize="xx-small")
    for k in range(len(names), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    fig.suptitle(
        "Served share of each template's demand, % (GPU-hours served / asked for; largest demand first)",
        fontsize="medium",
    )
    return _save(fig, out, "served-share.png")


def wait_ccdf(runs: Sequence[PolicyRun], out: Path) -> str:
    plt = _pyplot()
    colours = _colours(runs)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for run in runs:
        waits = sorted(max(g.waited_until(run.end), 1.0) for g in run.gangs)
        n = len(waits)
        if not n:
            continue
        never = sum(1 for g in run.gangs if not g.runs)
        xs = [w / 60 for w in waits]
        ys = [(n - k - 1) / n for k in range(n)]
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
        if pts:
            ax.step(
                [p[0] for p in pts],
                [p[1] for p in pts],
                where="post",
                color=colours[run.policy],
                linewidth=1.2,
                label=f"{run.policy} ({never} never placed)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("wait (minutes, log; gangs placed at once drawn at 1 s)")
    ax.set_ylabel("share of gangs that waited longer (log)")
    ax.set_title("Waits of every gang that arrived (never-placed gangs: until withdrawn)", fontsize="medium")
    ax.grid(True, which="major", linewidth=0.3)
    ax.legend(fontsize="small", frameon=False)
    return _save(fig, out, "wait-ccdf.png")


def step_ratio(runs: Sequence[PolicyRun], out: Path) -> str:
    plt = _pyplot()
    colours = _colours(runs)
    names = _templates(runs)
    fig, ax = plt.subplots(figsize=(max(7.5, 0.9 * len(names) + 2), 4.8))
    width = 0.8 / max(len(runs), 1)
    for p, run in enumerate(runs):
        medians, tops, xs = [], [], []
        for k, name in enumerate(names):
            ratios = step_ratios(g for g in run.gangs if (g.template or g.deployment) == name)
            if not ratios:
                continue
            xs.append(k + (p - (len(runs) - 1) / 2) * width)
            medians.append(quantile(ratios, 0.5))
            tops.append(quantile(ratios, 0.99))
        colour = colours[run.policy]
        ax.vlines(xs, medians, tops, color=colour, linewidth=1.2)
        ax.scatter(xs, medians, color=colour, s=22, zorder=3, label=run.policy)
        ax.scatter(xs, tops, color=colour, marker="_", s=60, zorder=3)
    for k in range(1, len(names)):
        ax.axvline(k - 0.5, color="0.9", linewidth=0.6)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize="x-small")
    ax.set_ylabel("step time / best step (log)")
    ax.set_title("Step time against the template's best slice: median (dot) to p99 (tick)", fontsize="medium")
    ax.legend(fontsize="x-small", frameon=False, ncol=min(len(runs), 6))
    return _save(fig, out, "step-ratio.png")


def draw_all(runs: Sequence[PolicyRun], out: Path) -> list[str]:
    return [goodput(runs, out), served_share(runs, out), wait_ccdf(runs, out), step_ratio(runs, out)]
