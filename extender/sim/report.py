"""The run's results as a terminal table, and the report folder (report.md, results.json, plots)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from extender.sim.engine import gpu_model
from extender.sim.metrics import gang_rows
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


#: (group, header, cell) for the summary table; neighbours with the same group share its title.
_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("", "policy", lambda r: ""),
    ("gangs", "placed", lambda r: _num(r["gangs"]["placed"])),
    ("never", "placed", lambda r: _num(r["gangs"]["neverPlaced"])),
    ("coherent", "share", lambda r: _pct(r["gangs"]["coherentShare"])),
    ("comm us/layer", "p50", lambda r: _num(r["perLayerMicros"]["median"], 1)),
    ("comm us/layer", "p99", lambda r: _num(r["perLayerMicros"]["p99"], 1)),
    ("TTFT comm vs best", "p50", lambda r: _ratio(r["ttft"]["vsBest"]["ratio"]["median"])),
    ("TTFT comm vs best", "p99", lambda r: _ratio(r["ttft"]["vsBest"]["ratio"]["p99"])),
    ("TTFT comm vs best", "+ms p99", lambda r: _num(r["ttft"]["vsBest"]["extraMillis"]["p99"], 1)),
    ("vs same hw", "p50", lambda r: _ratio(r["ttft"]["vsSameHardware"]["ratio"]["median"])),
    ("vs same hw", "p99", lambda r: _ratio(r["ttft"]["vsSameHardware"]["ratio"]["p99"])),
    ("wait s", "p50", lambda r: _num(r["waitSeconds"]["median"])),
    ("wait s", "p99", lambda r: _num(r["waitSeconds"]["p99"])),
    ("GPUs", "in use", lambda r: _pct(r["allocation"]["meanShare"])),
    ("whole free", "nodes", lambda r: _num(r["fragmentation"]["meanWholeFreeNodes"], 1)),
    ("decisions", "per s", lambda r: _num(r["timing"]["decisionsPerSecond"])),
)


def _rows(results: dict[str, Any]) -> list[list[str]]:
    return [[name, *(cell(r) for _, _, cell in _COLUMNS[1:])] for name, r in results["policies"].items()]


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
    return (
        f"cluster: {c['source']} ({c['nodes']} nodes, {c['gpus']} GPUs); trace: {t['source']} "
        f"({t['deployments']} deployments, {t['scaleEvents']} scale events, {t['gangs']} gangs, "
        f"{hours:.1f} h); queue: {queue}"
    )


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out.extend("| " + " | ".join(r) + " |" for r in rows)
    return out


#: Per-template figures compared in :func:`contrasts`: (name, key, lower is better, how shown).
_CONTRASTED: tuple[tuple[str, str, bool, Callable[[Any], str]], ...] = (
    ("TTFT vs best, median", "ttftRatioMedian", True, _ratio),
    ("coherent share", "coherentShare", False, _pct),
    ("placed", "placed", False, _num),
)


def contrasts(results: dict[str, Any], ours: str = "gangslice", each: int = 3) -> list[str]:
    """The per-template rows where gangslice and the best peer on that figure differ most, in
    both directions: up to ``each`` where gangslice is ahead, ``each`` where it is behind, as a
    markdown table. Differences are relative (ratios for TTFT, points for shares, relative
    counts for gangs placed)."""
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
            if key == "ttftRatioMedian":
                gap = (best / mine[key] - 1) if mine[key] > 0 else 0.0
            elif key == "coherentShare":
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
        ("Never placed (of arrived)", lambda t: f"{t['neverPlaced']}/{t['arrived']}"),
        ("Coherent share of placed", lambda t: _pct(t["coherentShare"])),
        ("Waiting time p99 (s)", lambda t: _num(t["waitSeconds"]["p99"])),
        (
            "TTFT communication vs the best slice on the empty cluster, median",
            lambda t: _ratio(t["ttftRatioMedian"]),
        ),
        (
            "TTFT communication vs the best slice on the same node types, median",
            lambda t: _ratio(t["ttftSameHardwareRatioMedian"]),
        ),
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
    ("allocation.png", "GPUs allocated over time, one panel per policy"),
    ("wait-cdf.png", "Waiting time of every arrived gang, per workload class (CDF; never placed below 1)"),
    ("comm-cdf.png", "Each gang's TTFT communication against its own best slice, per workload class (CDF)"),
    (
        "fragmentation.png",
        "Fragmentation over time, one row per policy: whole free nodes, and the largest free block "
        "under one leaf",
    ),
)

DEFINITIONS = """\
- **placed / never placed**: gangs (one per replica) that started / that were rejected (the
  policy cannot place them even on the cluster with no simulated gang, or, with `--no-wait`,
  not when they arrive) or withdrawn (their deployment ended or scaled down while they waited).
- **coherent**: the share of placed gangs whose slice breaks no rule of
  `scoring.violations`, gives every pod GPUs at its node type's tightest tier (one NVLink
  island, one PCIe switch, one socket, as the node type allows for that many GPUs), keeps
  every pod set whose pods talk to each other (all-reduce, all-to-all, pipeline) inside one
  leaf or one NVLink clique, and meets every `colocateWith`.
- **comm us/layer**: predicted per-layer communication time of a placed gang (the sum over its
  pod sets of `scoring.pod_set_micros`, the yardstick every policy is judged by), over gangs
  that communicate at all.
- **TTFT comm vs best**: a prefill step's communication time (per-layer time x the model's
  layers, summed over pod sets) relative to the same for the gang's *best* slice, the one the
  gangslice solver picks on the cluster with no simulated gang; `+ms` is the difference in
  milliseconds. Compute is not modelled, so this is the communication part of time to first
  token. Over placed gangs whose reference slice communicates. On a mixed fleet the best slice
  is often on faster hardware (a GB200 tray's NVLink 5) than the gang could get under load.
- **vs same hw**: the same ratio against the solver's slice on the empty cluster cut down to the
  node types the gang actually got, each in the allocation mode it got them in (device plugin
  or DRA): what placement *within* that hardware costs (an NVLink island or socket split, a
  leaf crossed, prefill and decode apart).
- **wait s**: seconds from a gang's arrival until its pods run, over placed gangs: in the queue,
  and for a gang on multi-node NVLink (its pod sets span nodes of a clique, every policy's
  answer judged by the same rule) the IMEX start-up of its ComputeDomain after placement
  (`imexStartupSeconds` in results.json, `--imex-startup-s`).
- **GPUs in use**: time-averaged share of the cluster's schedulable GPUs held by gangs.
- **whole free nodes**: time-averaged number of nodes with every GPU free (for every built-in
  node type, a free NVLink island or whole PCIe box: what a full-node pod or a wide gang needs);
  the fragmentation plot also shows the most GPUs on whole free nodes under one leaf.
- **decisions per s**: policy calls per second of wall time spent inside the policy (not
  simulator time); the only figures that change between runs, with the machine's load.
- Quantiles interpolate linearly between nearest ranks; time averages weigh each state by how
  long it held. The queue: FIFO; behind the first gang the policy cannot place, only gangs asking
  for no more GPUs than it are tried (backfill of smaller gangs). Each policy call is told whether
  another gang in the queue asks for a clique (what the extender knows: a scheduler asks for each
  gang on sight, and the extender notes every gang it refuses); only gangslice reads it.
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
        "in-node figures (coherent share, per-layer and TTFT communication, vs same hw) are computed "
        "on the GPUs each node hands out, so gangslice's in-node advantage is claimed only where "
        "its choice can be delivered: on the DRA nodes. 'vs same hw' compares with the best slice "
        "on the same node types in the same allocation mode.",
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
        "A trade gangslice makes on purpose: while a gang that asks for a multi-node NVLink "
        "clique waits, cliques (GB200 NVL72 racks) are kept for the pod sets that span them, and a "
        "pod set that does not use multi-node NVLink takes clique nodes only when nothing else "
        "fits, or when its rack already carries such pods (that rack is no longer whole for a gang "
        "that needs all of it, so it takes further small replicas and the other racks stay whole); "
        "with no such gang waiting, a whole rack is capacity like any other. That is what lets "
        "gangslice place the wide-EP and prefill/decode gangs that need a whole rack's NVLink; "
        "the peers fill every rack's trays with small replicas and so place few of those, but "
        "they gain the trays as spare room for small replicas, which leaves more whole 8-GPU "
        "nodes for the gangs that can run only there (TP=8, 405B, P/D pairs on HGX or PCIe "
        "boxes). On a busy day gangslice can therefore place fewer of those and keep them "
        "waiting longer at p99 while keeping more GPUs in use.",
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
        "shares under 0.5% left out). gangslice puts a gang where its communication is cheapest "
        "among the slices with room (a colocateWith it asks for first); the peers choose nodes "
        "without a cost model. A template's TTFT figures follow where it ran, and its room came "
        "from where the others ran.",
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
