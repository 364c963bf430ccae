"""PNG plots of a run (matplotlib, Agg backend: no display needed).

Small multiples rather than one tangle of lines: the time series get one panel per policy
(that policy in colour, the others in grey behind it), the distributions one panel per
workload class (a line per policy). The wait CDF counts every arrived gang, so a policy that
never places some gangs tops out below 1 and says how many in its legend; the communication
CDF is of each gang's TTFT communication over its own best slice, so placing fewer large
gangs does not make a policy look better.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from extender.sim.engine import PLACED, GangRecord, Point, PolicyRun

_HOUR = 3600.0

#: Workload classes of the distribution panels, in panel order.
ONE_NODE = "one node (TP within a node)"
MULTI_NODE = "several nodes (PP, wide EP)"
DISAGGREGATED = "prefill/decode (several pod sets)"
CLASSES = (ONE_NODE, MULTI_NODE, DISAGGREGATED)


def workload_class(g: GangRecord) -> str:
    if len(g.gang.pod_sets) > 1:
        return DISAGGREGATED
    return ONE_NODE if g.gang.pods == 1 else MULTI_NODE


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


def _per_policy(
    runs: Sequence[PolicyRun],
    out: Path,
    series: Sequence[tuple[str, Callable[[Point], float]]],
    title: str,
    name: str,
    reference: Callable[[PolicyRun], float] | None = None,
) -> str:
    """A grid: a row per policy, a column per series; each panel draws its policy in colour
    over the other policies in grey, so each line can be read and compared."""
    plt = _pyplot()
    colours = _colours(runs)
    rows, cols = max(len(runs), 1), len(series)
    fig, axes = plt.subplots(
        rows, cols, figsize=(5.2 * cols, 1.55 * rows + 0.9), sharex=True, sharey="col", squeeze=False
    )
    for r, run in enumerate(runs):
        for c, (label, value) in enumerate(series):
            ax = axes[r][c]
            for other in runs:
                if other is not run:
                    xs, ys = _steps(other, value)
                    ax.step(xs, ys, where="post", color="0.8", linewidth=0.7)
            xs, ys = _steps(run, value)
            ax.step(xs, ys, where="post", color=colours[run.policy], linewidth=1.1, label=run.policy)
            if reference is not None and c == 0:
                ax.axhline(reference(run), color="black", linestyle=":", linewidth=0.8)
            ax.legend(loc="lower right", fontsize="x-small", frameon=False)
            if r == 0:
                ax.set_title(label, fontsize="small")
            if r == rows - 1:
                ax.set_xlabel("time (hours)")
            ax.tick_params(labelsize="x-small")
    fig.suptitle(title, fontsize="medium")
    return _save(fig, out, name)


def allocation(runs: Sequence[PolicyRun], out: Path) -> str:
    return _per_policy(
        runs,
        out,
        [("GPUs allocated (dotted: schedulable GPUs)", lambda p: p.allocated_gpus)],
        "GPU allocation over time (each policy in colour, the others in grey)",
        "allocation.png",
        reference=lambda run: run.total_gpus,
    )


def fragmentation(runs: Sequence[PolicyRun], out: Path) -> str:
    return _per_policy(
        runs,
        out,
        [
            ("nodes with every GPU free", lambda p: p.whole_free_nodes),
            ("GPUs on whole free nodes under one leaf (most)", lambda p: p.largest_free_leaf_gpus),
        ],
        "Fragmentation over time (each policy in colour, the others in grey)",
        "fragmentation.png",
    )


def _by_class(
    runs: Sequence[PolicyRun],
    out: Path,
    draw: Callable[[Any, PolicyRun, list[GangRecord], Any], bool],
    axis: tuple[str, str],
    title: str,
    name: str,
    scale: Callable[[Any], None],
) -> str:
    """A panel per workload class (those any gang of the run belongs to), a line per policy."""
    plt = _pyplot()
    colours = _colours(runs)
    present = [c for c in CLASSES if any(workload_class(g) == c for run in runs for g in run.gangs)]
    present = present or [ONE_NODE]
    fig, axes = plt.subplots(1, len(present), figsize=(4.6 * len(present), 4.2), squeeze=False)
    for k, cls in enumerate(present):
        ax = axes[0][k]
        drawn = False
        for run in runs:
            gangs = [g for g in run.gangs if workload_class(g) == cls]
            drawn = draw(ax, run, gangs, colours[run.policy]) or drawn
        scale(ax)
        ax.set_title(cls, fontsize="small")
        ax.set_xlabel(axis[0], fontsize="small")
        if k == 0:
            ax.set_ylabel(axis[1], fontsize="small")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize="x-small")
        if drawn:
            ax.legend(loc="lower right", fontsize="x-small")
        else:
            ax.text(0.5, 0.5, "no gang of this class\ncommunicates", ha="center", transform=ax.transAxes)
    fig.suptitle(title, fontsize="medium")
    return _save(fig, out, name)


def _ecdf_over(ax: Any, values: Sequence[float], total: int, colour: Any, label: str) -> None:
    """The share of ``total`` gangs at or below each value (tops out below 1 when some
    gangs have no value: never placed)."""
    ordered = sorted(values)
    if not ordered or total == 0:
        ax.plot([], [], color=colour, label=label)
        return
    xs = [ordered[0], *ordered]
    ys = [0.0, *((k + 1) / total for k in range(len(ordered)))]
    ax.step(xs, ys, where="post", color=colour, label=label, linewidth=1.1)


def wait_cdf(runs: Sequence[PolicyRun], out: Path) -> str:
    def draw(ax: Any, run: PolicyRun, gangs: list[GangRecord], colour: Any) -> bool:
        waits = [g.waited for g in gangs if g.outcome == PLACED and g.waited is not None]
        never = len(gangs) - len(waits)
        share = f"{100 * never / len(gangs):.1f}%" if gangs else "0%"
        _ecdf_over(ax, waits, len(gangs), colour, f"{run.policy} (never placed {never}, {share})")
        return bool(gangs)

    def scale(ax: Any) -> None:
        ax.set_xscale("symlog", linthresh=60.0)
        ax.set_xlim(left=0)

    return _by_class(
        runs,
        out,
        draw,
        ("waiting time (s; linear to 60 s, log above)", "share of arrived gangs placed within"),
        "Waiting time of every arrived gang (never-placed gangs keep the line below 1)",
        "wait-cdf.png",
        scale,
    )


def comm_cdf(runs: Sequence[PolicyRun], out: Path) -> str:
    def draw(ax: Any, run: PolicyRun, gangs: list[GangRecord], colour: Any) -> bool:
        ratios = [
            g.comm_ms / g.ideal.comm_ms
            for g in gangs
            if g.outcome == PLACED and g.comm_ms is not None and g.ideal is not None and g.ideal.comm_ms > 0
        ]
        if not ratios:
            return False
        median = sorted(ratios)[len(ratios) // 2]
        _ecdf_over(ax, ratios, len(ratios), colour, f"{run.policy} (median {median:.2f}x)")
        return True

    def scale(ax: Any) -> None:
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ax.set_xlim(max(lo, 0.9), max(hi, 2.0))
        ax.xaxis.set_major_formatter(_pyplot().FuncFormatter(lambda v, _: f"{v:g}x"))

    return _by_class(
        runs,
        out,
        draw,
        ("TTFT communication / the gang's best slice (log)", "share of placed gangs that communicate"),
        "Each gang's TTFT communication against its own best slice (1x = as good as it gets)",
        "comm-cdf.png",
        scale,
    )


def draw_all(runs: Sequence[PolicyRun], out: Path) -> list[str]:
    """Draw every plot into ``out``; returns the file names, in report order."""
    return [f(runs, out) for f in (allocation, wait_cdf, comm_cdf, fragmentation)]
