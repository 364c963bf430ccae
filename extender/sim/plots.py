"""PNG plots of a run, one line per policy (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from extender.sim.engine import PLACED, Point, PolicyRun
from extender.sim.metrics import communicates

_HOUR = 3600.0


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def _ecdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(k + 1) / n for k in range(n)]


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    _pyplot().close(fig)
    return name


def allocation(runs: Sequence[PolicyRun], out: Path) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run in runs:
        xs, ys = _steps(run, lambda p: p.allocated_gpus)
        ax.step(xs, ys, where="post", label=run.policy, linewidth=0.9, alpha=0.85)
    if runs:
        ax.axhline(runs[0].total_gpus, color="grey", linestyle=":", linewidth=1, label="schedulable GPUs")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPUs allocated")
    ax.set_title("GPU allocation over time")
    ax.legend(loc="lower center", ncol=3, fontsize="small")
    return _save(fig, out, "allocation.png")


def _cdf(
    runs: Sequence[PolicyRun],
    out: Path,
    values: Callable[[PolicyRun], list[float]],
    xscale: tuple[str, dict[str, float]],
    labels: tuple[str, str, str],
    name: str,
) -> str:
    """One empirical CDF per policy of ``values(run)``; ``labels`` are x, y and title."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        got = values(run)
        if got:
            xs, ys = _ecdf(got)
            ax.step(xs, ys, where="post", label=run.policy)
    ax.set_xscale(xscale[0], **xscale[1])
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2])
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, out, name)


def wait_cdf(runs: Sequence[PolicyRun], out: Path) -> str:
    def minutes(run: PolicyRun) -> list[float]:
        return [g.waited / 60 for g in run.gangs if g.outcome == PLACED and g.waited is not None]

    labels = ("waiting time (minutes, log scale above 1)", "share of placed gangs", "Waiting time")
    return _cdf(runs, out, minutes, ("symlog", {"linthresh": 1.0}), labels, "wait-cdf.png")


def comm_cdf(runs: Sequence[PolicyRun], out: Path) -> str:
    def positive_micros(run: PolicyRun) -> list[float]:
        micros = [
            g.micros for g in run.gangs if g.outcome == PLACED and g.micros is not None and communicates(g)
        ]
        return [m for m in micros if m > 0]

    labels = (
        "predicted communication per layer (us, log scale)",
        "share of placed gangs that communicate",
        "Per-layer communication time",
    )
    return _cdf(runs, out, positive_micros, ("log", {}), labels, "comm-cdf.png")


def fragmentation(runs: Sequence[PolicyRun], out: Path) -> str:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for run in runs:
        xs, ys = _steps(run, lambda p: p.whole_free_nodes)
        top.step(xs, ys, where="post", label=run.policy, linewidth=0.9, alpha=0.85)
        xs, ys = _steps(run, lambda p: p.largest_free_leaf_gpus)
        bottom.step(xs, ys, where="post", label=run.policy, linewidth=0.9, alpha=0.85)
    top.set_ylabel("nodes with every GPU free")
    top.set_title("Fragmentation over time")
    bottom.set_ylabel("GPUs on whole free nodes\nunder one leaf (most)")
    bottom.set_xlabel("time (hours)")
    top.legend(loc="upper center", ncol=3, fontsize="small")
    return _save(fig, out, "fragmentation.png")


def draw_all(runs: Sequence[PolicyRun], out: Path) -> list[str]:
    """Draw every plot into ``out``; returns the file names, in report order."""
    return [f(runs, out) for f in (allocation, wait_cdf, comm_cdf, fragmentation)]
