"""``gangslice simulate --check-dominance``: does gangslice beat every peer, on every axis a
user reads, on the default fleet with three seeds and on a tight variant of it?

The bar, per peer policy and per trace (one deterministic run each):

- over all gangs: gangslice places at least as many gangs, its coherent share is at least the
  peer's, its TTFT-vs-best median and p99 and its vs-same-hardware p99 are at most the peer's,
  and its waiting time p99 is at most 1.05x the peer's;
- per template that both placed at least ``MIN_PLACED`` gangs of: coherent share at least the
  peer's minus one point, TTFT-vs-best median at most 1.05x the peer's.

Every comparison is printed, and the check fails (exit status 1) where gangslice falls short.
Not judged, printed for the reader: the GPU-hours each policy served, and the same bar with
each policy in gangslice's place (its shortfalls against the other four), which says how far
any policy is from beating every other on every axis.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.placement.snapshot import ClusterSnapshot

GANGSLICE = "gangslice"
#: Per-template rows count only when both policies placed at least this many gangs.
MIN_PLACED = 10
WAIT_SLACK = 1.05
TTFT_SLACK = 1.05
COHERENT_SLACK = 0.01
SEEDS = (1, 2, 3)


@dataclass(frozen=True)
class TraceSpec:
    seed: int
    tight: bool = False
    #: What ``--dominance-traces`` calls it.
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
    """The traces a ``--dominance-traces a,b`` list names (all of the bar's when None): the
    bar's in its order, then default-fleet days of other seeds (``seed-N``, outside the bar:
    whether a rule holds on days it was not measured on), by seed. Raises ValueError naming
    an unknown trace."""
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
    so each leaf and rack loses its share."""
    nodes = [n for k, n in enumerate(cluster.nodes) if k % 4 != 3]
    return ClusterSnapshot(nodes, cluster.hierarchy)


@dataclass(frozen=True)
class Cell:
    """One comparison: gangslice's value against a peer's, and whether it clears the bar."""

    trace: str
    peer: str
    scope: str  # "all gangs" or a template name
    metric: str
    ours: float | None
    theirs: float | None
    ok: bool


def _get(d: Mapping[str, Any], *path: str) -> float | None:
    cur: Any = d
    for p in path:
        if cur is None:
            return None
        cur = cur.get(p)
    return None if cur is None else float(cur)


#: (metric, where in a policy's results, rule(ours, theirs) -> cleared)
Rule = Callable[[float, float], bool]


def _at_least(o: float, t: float) -> bool:
    return o >= t


def _at_most(o: float, t: float) -> bool:
    return o <= t + 1e-9


OVERALL: tuple[tuple[str, tuple[str, ...], Rule], ...] = (
    ("gangs placed", ("gangs", "placed"), _at_least),
    ("coherent share", ("gangs", "coherentShare"), _at_least),
    ("TTFT vs best p50", ("ttft", "vsBest", "ratio", "median"), _at_most),
    ("TTFT vs best p99", ("ttft", "vsBest", "ratio", "p99"), _at_most),
    ("vs same hw p99", ("ttft", "vsSameHardware", "ratio", "p99"), _at_most),
    ("wait p99 (<= 1.05x)", ("waitSeconds", "p99"), lambda o, t: o <= WAIT_SLACK * t + 1e-9),
)
PER_TEMPLATE: tuple[tuple[str, tuple[str, ...], Rule], ...] = (
    ("coherent share (-1 pt)", ("coherentShare",), lambda o, t: o >= t - COHERENT_SLACK - 1e-9),
    ("TTFT vs best p50 (<= 1.05x)", ("ttftRatioMedian",), lambda o, t: o <= TTFT_SLACK * t + 1e-9),
)


def _cell(
    trace: str, peer: str, scope: str, metric: str, o: float | None, t: float | None, rule: Rule
) -> Cell:
    if o is None or t is None:
        # Nothing to compare (no gang of the kind placed): cleared only if the peer has no
        # value either, or gangslice has one where the peer has none.
        return Cell(trace, peer, scope, metric, o, t, t is None)
    return Cell(trace, peer, scope, metric, o, t, rule(o, t))


def compare(trace: str, results: Mapping[str, Any], us: str = GANGSLICE) -> list[Cell]:
    """Every comparison of policy ``us`` (gangslice) against each other policy in one run's
    results.json content."""
    policies = results["policies"]
    ours = policies[us]
    cells: list[Cell] = []
    for peer, theirs in policies.items():
        if peer == us:
            continue
        for metric, path, rule in OVERALL:
            cells.append(
                _cell(trace, peer, "all gangs", metric, _get(ours, *path), _get(theirs, *path), rule)
            )
        for name, mine in sorted(ours["byTemplate"].items()):
            other = theirs["byTemplate"].get(name)
            if other is None or min(mine["placed"], other["placed"]) < MIN_PLACED:
                continue
            for metric, path, rule in PER_TEMPLATE:
                cells.append(_cell(trace, peer, name, metric, _get(mine, *path), _get(other, *path), rule))
    return cells


def standings(results: Mapping[str, Any]) -> dict[str, int]:
    """Each policy's shortfalls when the bar judges it against all the others."""
    return {us: sum(not c.ok for c in compare("", results, us)) for us in results["policies"]}


def shortfalls_line(short: Mapping[str, int], where: str = "") -> str:
    """:func:`standings` (or their sums over traces) as one line, fewest shortfalls first."""
    got = ", ".join(f"{name} {n}" for name, n in sorted(short.items(), key=lambda kv: kv[1]))
    return f"not judged: the same bar with each policy in gangslice's place, its shortfalls{where}: {got}"


def context(results: Mapping[str, Any]) -> str:
    """What the bar does not judge but a reader of its gang counts needs: the GPU-hours each
    policy served (a 64-GPU gang counts once among the gangs placed, as a 1-GPU one does)."""
    served = ", ".join(
        f"{name} {r['allocation']['gpuHours']:,.0f}" for name, r in results["policies"].items()
    )
    return f"not judged: GPU-hours served: {served}"


def _fmt(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if "share" in metric:
        return f"{100 * v:.1f}%"
    if "TTFT" in metric or "hw" in metric:
        return f"{v:.2f}x"
    return f"{v:,.0f}"


def render(trace: str, cells: Sequence[Cell]) -> str:
    """One table per trace: a row per (scope, metric), a column per peer, each cell
    ``ours/theirs`` marked ``ok`` or ``FAIL``; per-template rows only where one fails or
    for the headline metrics."""
    peers = list(dict.fromkeys(c.peer for c in cells))
    rows: dict[tuple[str, str], dict[str, Cell]] = {}
    for c in cells:
        rows.setdefault((c.scope, c.metric), {})[c.peer] = c
    shown = [k for k, v in rows.items() if k[0] == "all gangs" or not all(c.ok for c in v.values())]
    failing = sum(not c.ok for c in cells)
    head = ["scope", "metric", *peers]
    body = []
    for scope, metric in shown:
        line = [scope, metric]
        for p in peers:
            got = rows[(scope, metric)].get(p)
            line.append(
                ""
                if got is None
                else f"{_fmt(metric, got.ours)} vs {_fmt(metric, got.theirs)} {'ok' if got.ok else 'FAIL'}"
            )
        body.append(line)
    widths = [max(len(r[k]) for r in [head, *body]) for k in range(len(head))]
    lines = [f"{trace}: gangslice vs each peer ({len(cells) - failing} of {len(cells)} comparisons cleared)"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    lines.extend("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in body)
    hidden = len(rows) - len(shown)
    if hidden:
        lines.append(f"({hidden} per-template rows where every peer is cleared are not shown)")
    return "\n".join(lines)
