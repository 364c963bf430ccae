"""``gangslice simulate --check``: does gangslice deliver more goodput than every peer, starve
no workload and keep the wait tail short, on the default fleet's days and on a tight fleet?

The bar (the targets of the placement issue; each trace is one deterministic run):

- **goodput** at least :data:`GOODPUT_SUMMED` x the best other policy's, summed over the bar's
  traces, and at least :data:`GOODPUT_EACH` x on each of them;
- **starvation gap** at most :data:`STARVATION_POINTS` points on each trace (over templates
  with at least 1 % of the day's demand, the best other policy's served share minus this one's);
- **wait p99** over every gang that arrived (never-placed ones until withdrawn) at most
  :data:`WAIT_SLACK` x the best (lowest) other policy's, on each trace.

Every policy is judged by the same rules against the others (its standing); the exit status
says whether gangslice clears the bar. Days outside the bar (``seed-N``) are judged the same
way and printed, but a summed target is over the traces run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.placement.snapshot import ClusterSnapshot

GANGSLICE = "gangslice"
GOODPUT_SUMMED = 1.10
GOODPUT_EACH = 1.03
STARVATION_POINTS = 10.0
WAIT_SLACK = 1.05
SEEDS = (1, 2, 3)


@dataclass(frozen=True)
class TraceSpec:
    seed: int
    tight: bool = False
    #: What ``--check-traces`` calls it.
    name: str = ""

    def label(self, fleet: str | None = None) -> str:
        """How the tables name the trace: the generated day of the seed on ``fleet`` (a
        ``--cluster`` file's name; None: the default fleet)."""
        if self.tight:
            where = "tight fleet" if fleet is None else f"{fleet} less a quarter of its nodes"
        else:
            where = "default fleet" if fleet is None else fleet
        return f"{where}, seed {self.seed}"


TRACES = (
    *(TraceSpec(s, name=f"seed-{s}") for s in SEEDS),
    TraceSpec(1, True, name="tight"),
)

_HELD_OUT = re.compile(r"seed-([1-9][0-9]{0,5})")


def select(names: str | None) -> tuple[TraceSpec, ...]:
    """The traces a ``--check-traces a,b`` list names (all of the bar's when None): the bar's
    in its order, then days of other seeds (``seed-N``, outside the bar), by seed. Raises
    ValueError naming an unknown trace."""
    if names is None:
        return TRACES
    known = {t.name: t for t in TRACES}
    asked = {n.strip() for n in names.split(",") if n.strip()}
    held_out = {n: m for n in asked - known.keys() if (m := _HELD_OUT.fullmatch(n))}
    unknown = sorted(asked - known.keys() - held_out.keys())
    if unknown or not asked:
        what = f"unknown trace {', '.join(map(repr, unknown))}" if unknown else "no trace named"
        raise ValueError(f"{what}; known: {', '.join(known)}, or seed-N for another seed")
    extra = sorted(int(m.group(1)) for m in held_out.values())
    return (
        *(t for t in TRACES if t.name in asked),
        *(TraceSpec(n, name=f"seed-{n}") for n in extra),
    )


def tight(cluster: ClusterSnapshot) -> ClusterSnapshot:
    """The same fleet with a quarter of its nodes removed: every fourth node in file order,
    so each leaf and rack loses its share (the day stays sized to the whole fleet)."""
    nodes = [n for k, n in enumerate(cluster.nodes) if k % 4 != 3]
    return ClusterSnapshot(nodes, cluster.hierarchy)


@dataclass(frozen=True)
class Standing:
    """One policy on one trace (or summed): its figures and the targets it misses."""

    policy: str
    goodput: float
    vs_best: float | None
    gap: float | None
    gap_template: str | None
    wait_p99: float | None
    wait_vs_best: float | None
    shortfalls: tuple[str, ...]


def _figures(results: Mapping[str, Any]) -> dict[str, tuple[float, float | None, str | None, float | None]]:
    out = {}
    for name, r in results["policies"].items():
        s = r.get("starvation") or {}
        out[name] = (r["goodput"]["gpuHours"], s.get("gapPoints"), s.get("template"), r["waitSeconds"]["p99"])
    return out


def standings(results: Mapping[str, Any]) -> list[Standing]:
    """Every policy of one trace against the others, by the per-trace targets."""
    fig = _figures(results)
    out = []
    for name, (good, gap, template, wait) in fig.items():
        others = [f for p, f in fig.items() if p != name]
        best_good = max((f[0] for f in others), default=0.0)
        best_wait = min((f[3] for f in others if f[3] is not None), default=None)
        vs = good / best_good if best_good > 0 else None
        wait_vs = wait / best_wait if wait is not None and best_wait else None
        short = []
        if vs is not None and vs < GOODPUT_EACH:
            short.append(f"goodput {vs:.3f}x the best other (target {GOODPUT_EACH:.2f}x)")
        if gap is not None and gap > STARVATION_POINTS:
            short.append(f"starvation gap {gap:.1f} points on {template} (target <= {STARVATION_POINTS:g})")
        if wait_vs is not None and wait_vs > WAIT_SLACK:
            short.append(f"wait p99 {wait_vs:.2f}x the best other (target <= {WAIT_SLACK:.2f}x)")
        out.append(Standing(name, good, vs, gap, template, wait, wait_vs, tuple(short)))
    return out


def summed(per_trace: Sequence[Sequence[Standing]]) -> list[Standing]:
    """Goodput summed over traces, each policy against the best other sum (the summed target)."""
    totals: dict[str, float] = {}
    for rows in per_trace:
        for s in rows:
            totals[s.policy] = totals.get(s.policy, 0.0) + s.goodput
    out = []
    for name, good in totals.items():
        best = max((g for p, g in totals.items() if p != name), default=0.0)
        vs = good / best if best > 0 else None
        short: tuple[str, ...] = ()
        if vs is not None and vs < GOODPUT_SUMMED:
            short = (f"goodput summed {vs:.3f}x the best other (target {GOODPUT_SUMMED:.2f}x)",)
        out.append(Standing(name, good, vs, None, None, None, None, short))
    return out


def _n(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def render(title: str, rows: Sequence[Standing]) -> str:
    header = [
        "policy",
        "goodput GPU-h",
        "vs best other",
        "starvation gap",
        "wait p99 s",
        "vs best other",
        "misses",
    ]
    body = [
        [
            s.policy,
            _n(s.goodput, ",.0f"),
            _n(s.vs_best, ".3f") + ("x" if s.vs_best is not None else ""),
            "-" if s.gap is None else f"{s.gap:.1f} ({s.gap_template})",
            _n(s.wait_p99, ",.0f"),
            _n(s.wait_vs_best, ".2f") + ("x" if s.wait_vs_best is not None else ""),
            str(len(s.shortfalls)),
        ]
        for s in rows
    ]
    widths = [max(len(r[k]) for r in [header, *body]) for k in range(len(header))]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            [cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))]
        )

    return "\n".join([title, fmt(header), *(fmt(r) for r in body)])
