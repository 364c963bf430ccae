"""The run's results as a terminal table, and the report folder (report.md, results.json, plots)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from extender.sim.metrics import gang_rows
from extender.sim.records import gpu_model
from extender.sim.runner import Outcome
from extender.topology.allocation import Allocation

_DASH = "-"


def _num(x: Any, digits: int = 0) -> str:
    if x is None:
        return _DASH
    return f"{x:,.{digits}f}"


def _pct(x: Any) -> str:
    return _DASH if x is None else f"{100 * x:.1f}%"


def _ratio(x: Any) -> str:
    return _DASH if x is None else f"{x:.2f}x"


def _best_other(
    results: dict[str, Any], name: str, value: Callable[[dict[str, Any]], float | None]
) -> float | None:
    others = [value(r) for p, r in results["policies"].items() if p != name]
    known = [v for v in others if v is not None]
    return max(known) if known else None


def _vs_best_other(results: dict[str, Any], name: str) -> str:
    mine = results["policies"][name]["goodput"]["gpuHours"]
    best = _best_other(results, name, lambda r: r["goodput"]["gpuHours"])
    return _ratio(mine / best) if best else _DASH


def _gap(r: dict[str, Any]) -> str:
    s = r.get("starvation") or {}
    if s.get("gapPoints") is None:
        return _DASH
    return f"{s['gapPoints']:.0f} {s['template']}"


#: (group, header, cell) for the summary table; neighbours with the same group share its title.
#: A cell reads (results, policy name).
_COLUMNS: tuple[tuple[str, str, Callable[[dict[str, Any], str], str]], ...] = (
    ("", "policy", lambda res, p: p),
    ("goodput", "GPU-h", lambda res, p: _num(res["policies"][p]["goodput"]["gpuHours"])),
    ("goodput", "vs best", _vs_best_other),
    ("goodput", "/demand", lambda res, p: _pct(res["policies"][p]["goodput"]["share"])),
    ("served", "/demand", lambda res, p: _pct(res["policies"][p]["goodput"]["servedShare"])),
    ("never placed", "gangs", lambda res, p: _num(res["policies"][p]["goodput"]["neverPlacedGangs"])),
    ("never placed", "GPU-h", lambda res, p: _num(res["policies"][p]["goodput"]["neverPlacedGpuHours"])),
    ("wait s (all)", "p50", lambda res, p: _num(res["policies"][p]["waitSeconds"]["median"])),
    ("wait s (all)", "p99", lambda res, p: _num(res["policies"][p]["waitSeconds"]["p99"])),
    ("step vs best", "p50", lambda res, p: _ratio(res["policies"][p]["step"]["vsBest"]["median"])),
    ("step vs best", "p99", lambda res, p: _ratio(res["policies"][p]["step"]["vsBest"]["p99"])),
    ("starvation", "gap pts", lambda res, p: _gap(res["policies"][p])),
    ("restart", "GPU-h", lambda res, p: _num(res["policies"][p]["goodput"]["restartGpuHours"], 1)),
    ("GPUs", "in use", lambda res, p: _pct(res["policies"][p]["allocation"]["meanShare"])),
    ("coherent", "share", lambda res, p: _pct(res["policies"][p]["gangs"]["coherentShare"])),
    ("decisions", "per s", lambda res, p: _num(res["policies"][p]["timing"]["decisionsPerSecond"])),
)


def _rows(results: dict[str, Any]) -> list[list[str]]:
    return [[cell(results, name) for _, _, cell in _COLUMNS] for name in results["policies"]]


def table(results: dict[str, Any]) -> str:
    """The summary table for a terminal: one row per policy."""
    heads = [h for _, h, _ in _COLUMNS]
    rows = _rows(results)
    widths = [max(len(r[k]) for r in [heads, *rows]) for k in range(len(_COLUMNS))]
    spans: list[tuple[str, int]] = []
    for group, _, _ in _COLUMNS:
        if spans and group and spans[-1][0] == group:
            spans[-1] = (group, spans[-1][1] + 1)
        else:
            spans.append((group, 1))
    k = 0
    titles = []
    for group, span in spans:
        needed = len(group) - (sum(widths[k : k + span]) + 2 * (span - 1))
        if needed > 0:  # widen the group's last column so the title fits
            widths[k + span - 1] += needed
        titles.append(group.center(sum(widths[k : k + span]) + 2 * (span - 1)))
        k += span

    def fmt(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest])

    return "\n".join(["  ".join(titles).rstrip(), fmt(heads), *(fmt(r) for r in rows)])


def headline(results: dict[str, Any]) -> str:
    c, t = results["cluster"], results["trace"]
    hours = t["durationSeconds"] / 3600
    queue = "no waiting (--no-wait)" if results["noWait"] else "FIFO with backfill"
    demand = max((r["goodput"]["demandGpuHours"] for r in results["policies"].values()), default=0.0)
    capacity = c["gpus"] * hours
    load = f"; demand {demand / capacity:.2f}x capacity" if capacity else ""
    return (
        f"cluster: {c['source']} ({c['nodes']} nodes, {c['gpus']} GPUs); trace: {t['source']} "
        f"({t['deployments']} deployments, {t['scaleEvents']} scale events, {t.get('rollouts', 0)} rollouts, "
        f"{t.get('nodeFailures', 0)} node failures, {t['gangs']} gangs, {hours:.1f} h{load}); queue: {queue}"
    )


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out.extend("| " + " | ".join(r) + " |" for r in rows)
    return out


#: Per-template figures compared in :func:`contrasts`: (name, key, lower is better, how shown).
_CONTRASTED: tuple[tuple[str, str, bool, Callable[[Any], str]], ...] = (
    ("step vs best, median", "stepRatioMedian", True, _ratio),
    ("served share", "servedShare", False, _pct),
    ("goodput GPU-h", "goodputGpuHours", False, _num),
)


def contrasts(results: dict[str, Any], ours: str = "gangslice", each: int = 3) -> list[str]:
    """The per-template rows where gangslice and the best peer on that figure differ most, in
    both directions: up to ``each`` where gangslice is ahead, ``each`` where it is behind, as a
    markdown table. Differences are relative (ratios for TTFT, points for shares, relative
    goodput)."""
    policies = results["policies"]
    if ours not in policies or len(policies) < 2:
        return []
    found: list[tuple[float, list[str]]] = []
    for name, mine in sorted(policies[ours]["byTemplate"].items()):
        for label, key, lower, show in _CONTRASTED:
            peers = [
                (p, r["byTemplate"][name][key])
                for p, r in policies.items()
                if p != ours and name in r["byTemplate"] and r["byTemplate"][name][key] is not None
            ]
            if mine[key] is None or not peers:
                continue
            peer, best = (min if lower else max)(peers, key=lambda x: x[1])
            if key == "stepRatioMedian":
                gap = (best / mine[key] - 1) if mine[key] > 0 else 0.0
            elif key == "servedShare":
                gap = mine[key] - best
            else:
                gap = (mine[key] - best) / max(best, 1)
            if abs(gap) > 1e-9:
                found.append((gap, [name, label, show(mine[key]), f"{show(best)} ({peer})"]))
    ahead = sorted((f for f in found if f[0] > 0), key=lambda f: -f[0])[:each]
    behind = sorted((f for f in found if f[0] < 0), key=lambda f: f[0])[:each]
    rows = [[*row, "gangslice ahead"] for _, row in ahead] + [[*row, "gangslice behind"] for _, row in behind]
    if not rows:
        return []
    return _md_table(["template", "figure", ours, "best peer", ""], rows)


def _template_tables(results: dict[str, Any]) -> list[str]:
    policies = list(results["policies"])
    names = sorted({t for r in results["policies"].values() for t in r["byTemplate"]})
    views: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
        ("Served share of demand (GPU-hours)", lambda t: _pct(t["servedShare"])),
        ("Goodput share of demand", lambda t: _pct(t["goodputShare"])),
        ("Goodput (GPU-hours)", lambda t: _num(t["goodputGpuHours"])),
        ("Step time vs the best slice on the fleet, median", lambda t: _ratio(t["stepRatioMedian"])),
        ("Step time vs the best slice on the fleet, p99", lambda t: _ratio(t["stepRatioP99"])),
        (
            "Step time vs the best slice on the same node types, median",
            lambda t: _ratio(t["stepSameHardwareRatioMedian"]),
        ),
        ("Wait p99 over every gang that arrived (s)", lambda t: _num(t["waitSeconds"]["p99"])),
        ("Never placed (of arrived)", lambda t: f"{t['neverPlaced']}/{t['arrived']}"),
        ("Coherent share of placed", lambda t: _pct(t["coherentShare"])),
    )
    out: list[str] = []
    for title, cell in views:
        out += ["", f"### {title}", ""]
        rows = []
        for name in names:
            gpus = next(
                r["byTemplate"][name]["gpus"] for r in results["policies"].values() if name in r["byTemplate"]
            )
            row = [f"{name} ({gpus} GPUs)"]
            for p in policies:
                t = results["policies"][p]["byTemplate"].get(name)
                row.append(cell(t) if t else _DASH)
            rows.append(row)
        out += _md_table(["template", *policies], rows)
    return out


PLOTS = (
    ("goodput.png", "Goodput over the day, one panel per policy"),
    ("served-share.png", "Served share of each template's demand"),
    ("wait-ccdf.png", "Waits of every gang that arrived (CCDF, log; never-placed gangs until withdrawn)"),
    ("step-ratio.png", "Step time against each template's best slice"),
)

DEFINITIONS = """\
- **step time** of a replica: compute + communication of one step of its model on the slice
  it got. Compute by roofline on the GPU model of each pod's node (`extender/compute.py`:
  the larger of 2 x active parameters x tokens over the GPUs' dense peak x MFU 0.5 and the
  weights over their memory bandwidth x MBU 0.8; datasheet peaks in
  `extender/topology/gpus.py`); communication by the cost model every policy is priced by
  (`scoring.pod_set_micros` x layers). Pod sets add (a prefill step, then a decode step).
- **best slice** of a template: the fastest valid slice on the cluster with no simulated gang,
  found by an exhaustive search of its own (`extender/sim/reference.py`), not by gangslice's
  solver. A replica's **speed** is the best step over its own (1 at best).
- **goodput**: GPUs x hours served x speed, summed over every run of every replica; a replica
  serves from the end of its model load (and, on multi-node NVLink, its ComputeDomain's IMEX
  start-up) until it goes. **vs best**: over the best goodput among the *other* policies.
- **demand**: GPUs x hours from each gang's arrival to its departure (scaled down, retired by
  a rollout, its deployment's end), never-placed gangs included. **served**: GPU-hours served
  at any speed. Shares are of demand.
- **never placed**: gangs that never started (the policy cannot place them even on the
  cluster with no simulated gang, or they were withdrawn while waiting), and the GPU-hours
  they asked for.
- **wait**: seconds from arrival until the pods first run, over *every* gang that arrived: a
  gang never placed counts until it was withdrawn (or the day's end), so never placing a gang
  does not shorten the tail.
- **starvation gap**: over templates with at least 1 % of the day's demand, the best other
  policy's served share of the template minus this policy's, in points; the largest and its
  template.
- **restart GPU-h**: GPU-hours held while replicas loaded again after a node failure or a move.
- **GPUs in use**: time-averaged share of the cluster's schedulable GPUs held by gangs.
- **coherent**: the share of placed gangs whose slice breaks no rule of `scoring.violations`,
  gives every pod GPUs at its node type's tightest tier, keeps every pod set whose pods talk
  inside one leaf or NVLink clique, and meets every `colocateWith`.
- **decisions per s**: policy calls per second of wall time spent inside the policy; the only
  figures that change between runs, with the machine's load.
- The fleet lives: deployments scale with a diurnal load, roll to new revisions (maxSurge and
  maxUnavailable as their owner says), and lose nodes to failures until repaired. The queue:
  FIFO; behind the first gang the policy cannot place, only gangs asking for no more GPUs
  than it are tried (backfill). Quantiles interpolate linearly between nearest ranks.
"""


def _node_types(r: dict[str, Any]) -> list[str]:
    """What the in-node figures rest on: who hands out each node type's GPUs."""
    cluster = r["cluster"]
    modes: dict[str, dict[str, int]] = cluster.get("nodeAllocation") or {
        name: {str(Allocation.DEVICE_PLUGIN): count} for name, count in cluster["nodeTypes"].items()
    }
    rows = ["| node type | nodes | device plugin | DRA |", "|---|---:|---:|---:|"]
    for name, count in cluster["nodeTypes"].items():
        by = modes.get(name, {})
        plugin, dra = by.get(str(Allocation.DEVICE_PLUGIN), 0), by.get(str(Allocation.DRA), 0)
        rows.append(f"| {name} | {count} | {plugin} | {dra} |")
    return [
        "## Node types",
        "",
        *rows,
        "",
        "On device-plugin nodes the NVIDIA device plugin picks each pod's GPUs (go-gpuallocator's "
        "best-effort policy, from the free GPUs and a count), so every policy, gangslice included, "
        "gets the plugin's choice there: gangslice places by its prediction of that choice and "
        "takes a node only where every answer the plugin may give keeps the pod set's rule; the "
        "peers get whatever it answers. On DRA nodes a ResourceClaim names the GPUs: gangslice's "
        "claims name the GPUs it chose, the peers' name none and get the lowest free ones. The "
        "in-node figures (coherent share, step time) are computed on the GPUs each node hands out, "
        "so gangslice's in-node advantage is claimed only where its choice can be delivered: on "
        "the DRA nodes.",
        "",
    ]


#: Gang sizes the trade-off table groups by: (label, fewest GPUs, most GPUs).
_SIZES = (("1-4 GPUs", 1, 4), ("8-16 GPUs", 5, 16), ("24+ GPUs", 17, 1 << 30))


def _by_size(r: dict[str, Any]) -> list[str]:
    """Gangs placed per policy by gang size, and the trade gangslice makes between them."""
    rows = []
    for policy, x in r["policies"].items():
        cells = []
        for _, lo, hi in _SIZES:
            t = [v for v in x["byTemplate"].values() if lo <= v["gpus"] <= hi]
            cells.append(f"{sum(v['placed'] for v in t):,} of {sum(v['arrived'] for v in t):,}")
        rows.append([policy, *cells, _pct(x["allocation"]["meanShare"])])
    return [
        "## Gangs placed by size",
        "",
        *_md_table(["policy", *(label for label, _, _ in _SIZES), "GPUs in use"], rows),
        "",
        "Gangs placed out of those that arrived, by gang size: a count of gangs weighs a 64-GPU "
        "gang like a 1-GPU replica, so read it beside the served shares and goodput.",
        "",
    ]


def _hardware(r: dict[str, Any]) -> list[str]:
    """Where each template's GPU-hours ran, per policy: the hardware half of every trade."""
    policies = list(r["policies"])
    names = sorted({t for x in r["policies"].values() for t in x["byTemplate"]})
    rows = []
    for name in names:
        row = [name]
        for p in policies:
            by_type = (r["policies"][p]["byTemplate"].get(name) or {}).get("gpuHoursByNodeType") or {}
            hours: dict[str, float] = {}
            for kind, h in by_type.items():
                hours[gpu_model(kind)] = hours.get(gpu_model(kind), 0.0) + h
            total = sum(hours.values())
            shares = sorted(((h / total, model) for model, h in hours.items() if total), reverse=True)
            cells = [f"{model} {100 * share:.0f}%" for share, model in shares if share >= 0.005]
            row.append(", ".join(cells) or _DASH)
        rows.append(row)
    return [
        "## Where each workload ran",
        "",
        "Share of each template's GPU-hours by GPU model (`gpuHoursByNodeType` in results.json; "
        "shares under 0.5% left out). A template's step time follows the GPU model it ran on, "
        "and its room came from where the others ran.",
        "",
        *_md_table(["template", *policies], rows),
        "",
    ]


def markdown(outcome: Outcome, plots: Sequence[str]) -> str:
    r = outcome.results
    lines = [
        "# gangslice simulate: report",
        "",
        headline(r),
        "",
        f"Policies: {', '.join(r['policies'])}. Seed {r['seed']}. "
        f"gangslice keeps whole NVLink cliques: {r['keepCliques']} (`--keep-cliques`). "
        f"Wall time {r['timing']['wallSeconds']:.1f} s.",
        "",
        "## Summary",
        "",
        "```",
        table(r),
        "```",
        "",
        *(
            ["Per template, where gangslice and the best peer differ most:", "", *contrasts(r), ""]
            if contrasts(r)
            else []
        ),
        *_node_types(r),
        *_by_size(r),
        *_hardware(r),
        "## Definitions",
        "",
        DEFINITIONS,
        "## Per template",
        *_template_tables(r),
        "",
    ]
    if plots:
        lines += ["## Plots", ""]
        titles = dict(PLOTS)
        for name in plots:
            lines += [f"### {titles.get(name, name)}", "", f"![{titles.get(name, name)}]({name})", ""]
    errors = {p: x["decisions"] for p, x in r["policies"].items() if x["decisions"]["errors"]}
    if errors:
        lines += ["## Policy errors", ""]
        for p, d in errors.items():
            lines.append(f"- {p}: {d['errors']} errors; first ones:")
            lines.extend(f"  - t={e['at']:g} s, gang {e['gang']}: {e['error']}" for e in d["errorSamples"])
        lines.append("")
    if r["referenceErrors"]:
        lines += ["## Errors of the reference solver", ""]
        lines.extend(f"- gang {e['gang']}: {e['error']}" for e in r["referenceErrors"])
        lines.append("")
    lines += [
        "## Files",
        "",
        "- `results.json`: every figure above, per policy (schema: `extender/sim/SCHEMA.md`).",
        "- `gangs.jsonl`: one line per policy and gang.",
        "- `trace.yaml`: the trace that ran, as a trace file (`gangslice simulate --trace trace.yaml`).",
        "",
    ]
    return "\n".join(lines)


_NUMBER_LIST = re.compile(r"\[\s+((?:-?[0-9][0-9.e+-]*,\s+)*-?[0-9][0-9.e+-]*)\s+\]")


def dumps(results: dict[str, Any]) -> str:
    """Indented JSON with lists of numbers (timeline points) kept on one line each."""
    text = json.dumps(results, indent=1)
    return _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(dumps(results) + "\n")


def write_folder(outcome: Outcome, out: Path, with_plots: bool = True) -> list[Path]:
    """Write the report folder; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    plots: list[str] = []
    if with_plots:
        from extender.sim.plots import draw_all

        plots = draw_all(outcome.runs, out)
        written += [out / p for p in plots]
    write_json(outcome.results, out / "results.json")
    with (out / "gangs.jsonl").open("w") as f:
        for run in outcome.runs:
            for row in gang_rows(run):
                f.write(json.dumps(row) + "\n")
    header = f"# The trace of this run ({outcome.trace.source}).\n"
    (out / "trace.yaml").write_text(header + yaml.safe_dump(outcome.trace.to_data(), sort_keys=False))
    (out / "report.md").write_text(markdown(outcome, plots))
    written += [out / n for n in ("results.json", "gangs.jsonl", "trace.yaml", "report.md")]
    return written
