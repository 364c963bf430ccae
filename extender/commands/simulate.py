"""``gangslice simulate``: one trace through gangslice and the peers' policies, side by side."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK
from extender.placement.files import FileError
from extender.placement.waiting import KeepCliques
from extender.sim.engine import IMEX_STARTUP_S


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="replay a trace of gang deployments through gangslice and the peers' policies",
        description="Replay a day of LLM inference deployments (or your trace) on a cluster (or "
        "yours) with gangslice and each baseline policy, and compare coherence, predicted "
        "communication time, waiting, allocation and fragmentation.",
    )
    p.add_argument("--cluster", metavar="FILE", help="cluster file (YAML); default: the built-in mixed fleet")
    p.add_argument(
        "--trace", metavar="FILE", help="trace file (YAML or .jsonl); default: a generated day of deployments"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the generated trace (default 1)")
    p.add_argument("--policies", metavar="A,B", help="policies to compare, comma-separated (default: all)")
    p.add_argument(
        "--no-wait", action="store_true", help="reject a gang the policy cannot place when it arrives"
    )
    p.add_argument(
        "--imex-startup-s",
        type=float,
        default=IMEX_STARTUP_S,
        metavar="SECONDS",
        help="how much longer a gang on multi-node NVLink waits for its ComputeDomain's IMEX daemons "
        f"before its pods run, every policy alike (default {IMEX_STARTUP_S:g})",
    )
    p.add_argument(
        "--keep-cliques",
        choices=[k.value for k in KeepCliques],
        default=KeepCliques.WHILE_WAITING.value,
        help="gangslice's rule for whole multi-node NVLink cliques, as serve --keep-cliques: while "
        "a gang that asks for one waits (default), or always",
    )
    p.add_argument("--out", metavar="DIR", help="write report.md, results.json, gangs.jsonl, trace and plots")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--json", action="store_true", help="print results.json's content instead of the table")
    p.add_argument(
        "--check-dominance",
        action="store_true",
        help="run the generated day with seeds 1, 2, 3 and on the fleet less a quarter of its nodes, "
        "print gangslice against each peer (and, not judged, every policy against the others), "
        "exit 1 where gangslice falls short",
    )
    p.add_argument(
        "--dominance-traces",
        metavar="A,B",
        help="with --check-dominance, these traces, comma-separated: seed-1, seed-2, seed-3, tight "
        "(default: all; the bar is all of them), or seed-N for another seed's day outside the bar",
    )
    p.set_defaults(func=run)


class ProgressLine:
    """A one-line progress indicator on a terminal; one line per policy elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.policy = ""
        self.started = 0.0
        self.shown = 0.0

    def start(self, policy: str) -> Any:
        self.policy, self.started, self.shown = policy, time.monotonic(), 0.0
        return self.update

    def update(self, fraction: float, placed: int, waiting: int) -> None:
        now = time.monotonic()
        if self.tty and (now - self.shown >= 0.1 or fraction >= 1.0):
            self.shown = now
            bar = "#" * int(20 * fraction)
            self.stream.write(
                f"\rsimulate {self.policy:<10} [{bar:<20}] {100 * fraction:3.0f}%  "
                f"placed {placed}  waiting {waiting}   "
            )
            self.stream.flush()
        if fraction >= 1.0:
            lead = "\r" if self.tty else ""
            self.stream.write(
                f"{lead}simulate {self.policy:<10} done in {now - self.started:.1f} s, {placed} gangs placed"
                + " " * 20
                + "\n"
            )
            self.stream.flush()


def run(args: argparse.Namespace) -> int:
    from extender.sim.inputs import check_levels, fit_generated, load_sim_cluster, load_sim_trace
    from extender.sim.policies import choose
    from extender.sim.report import dumps, headline, table, write_folder
    from extender.sim.runner import run_simulation

    try:
        policies = choose(args.policies)
    except ValueError as exc:
        print(f"gangslice simulate: --policies: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        cluster = load_sim_cluster(args.cluster)
        trace = load_sim_trace(args.trace, args.seed)
        if args.trace is None:
            trace, left_out = fit_generated(trace, cluster)
            for line in left_out:
                print(f"gangslice simulate: {line}", file=sys.stderr)
        check_levels(trace, cluster)
    except FileError as exc:
        print(f"gangslice simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not 0 <= args.imex_startup_s < math.inf:
        print(
            f"gangslice simulate: --imex-startup-s {args.imex_startup_s:g}: not a number of seconds",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    progress = None if args.quiet else ProgressLine(sys.stderr)
    if args.dominance_traces is not None and not args.check_dominance:
        print("gangslice simulate: --dominance-traces needs --check-dominance", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.check_dominance:
        return check_dominance(args, cluster, policies, progress)
    outcome = run_simulation(
        cluster,
        trace,
        policies,
        seed=args.seed,
        no_wait=args.no_wait,
        cluster_source=args.cluster or "default",
        progress=progress.start if progress else None,
        imex_startup_s=args.imex_startup_s,
        keep_cliques=KeepCliques(args.keep_cliques),
    )
    if args.out:
        write_folder(outcome, Path(args.out))
    if args.json:
        print(dumps(outcome.results))
    else:
        print(headline(outcome.results))
        print()
        print(table(outcome.results))
        if args.out:
            print(f"\nreport: {Path(args.out) / 'report.md'}")
    return EXIT_OK


EXIT_SHORT = 1


def check_dominance(
    args: argparse.Namespace, cluster: Any, policies: Any, progress: ProgressLine | None
) -> int:
    """``simulate --check-dominance``: every trace of the bar, one table each, and the exit
    status: 0 when gangslice clears every comparison, 1 otherwise."""
    from extender.sim.dominance import (
        GANGSLICE,
        TRACES,
        compare,
        context,
        render,
        select,
        shortfalls_line,
        standings,
        tight,
    )
    from extender.sim.generate import generate_trace
    from extender.sim.inputs import fit_generated
    from extender.sim.runner import run_simulation

    if GANGSLICE not in policies or len(policies) < 2:
        print("gangslice simulate: --check-dominance needs gangslice and at least one peer", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.trace is not None:
        print(
            "gangslice simulate: --check-dominance runs the generated traces; drop --trace", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    try:
        specs = select(args.dominance_traces)
    except ValueError as exc:
        print(f"gangslice simulate: --dominance-traces: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    failing = []
    standing: Counter[str] = Counter()
    for spec in specs:
        fleet = tight(cluster) if spec.tight else cluster
        label = spec.label(Path(args.cluster).name if args.cluster else None)
        trace, _ = fit_generated(generate_trace(spec.seed), fleet)
        if progress is not None:
            print(f"{label}:", file=sys.stderr)
        outcome = run_simulation(
            fleet,
            trace,
            policies,
            seed=spec.seed,
            progress=progress.start if progress else None,
            imex_startup_s=args.imex_startup_s,
            keep_cliques=KeepCliques(args.keep_cliques),
        )
        cells = compare(label, outcome.results)
        print(render(label, cells))
        short = standings(outcome.results)
        print(context(outcome.results))
        print(shortfalls_line(short))
        print()
        failing += [c for c in cells if not c.ok]
        standing.update(short)
    if len(specs) > 1:
        print(shortfalls_line(standing, " over the traces run"))
        print()
    if failing:
        print(f"gangslice falls short in {len(failing)} comparisons:")
        for c in failing:
            print(f"  {c.trace}: vs {c.peer}: {c.scope}: {c.metric}: {c.ours} vs {c.theirs}")
        return EXIT_SHORT
    if len(specs) < len(TRACES):
        print(f"gangslice clears the bar on the traces run ({', '.join(t.name for t in specs)}), not all")
    else:
        print("gangslice clears the bar against every peer on every trace")
    return EXIT_OK
