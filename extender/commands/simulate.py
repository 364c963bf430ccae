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
from extender.sim.generate import DEFAULT_LOAD


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="replay a trace of gang deployments through gangslice and the peers' policies",
        description="Replay a day in the life of an LLM inference fleet (deployments that arrive, "
        "autoscale, roll and lose nodes; or your trace) on a cluster (or yours) with gangslice and "
        "each peer's policy, and compare goodput (GPU-hours delivered at each workload's best "
        "speed), served shares, waits and step times.",
    )
    p.add_argument("--cluster", metavar="FILE", help="cluster file (YAML); default: the built-in mixed fleet")
    p.add_argument(
        "--trace", metavar="FILE", help="trace file (YAML or .jsonl); default: a generated day of deployments"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the generated trace (default 1)")
    p.add_argument(
        "--load",
        type=float,
        default=DEFAULT_LOAD,
        metavar="X",
        help="size the generated day so its deployments ask for X times the fleet's GPU-hours "
        f"(default {DEFAULT_LOAD:g})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="simulate the policies in N processes side by side (default: one per CPU, at most 4)",
    )
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
    p.add_argument(
        "--migrate",
        action="store_true",
        help="gangslice moves restartable replicas (one pod of a Deployment that is not rolling) off "
        "the domain cheapest to drain for a gang of 8 or more GPUs that waited 10 minutes, each to "
        "hardware at least as fast, every restart charged (as serve --migration on does with pods "
        "labelled gangslice.io/movable)",
    )
    p.add_argument("--out", metavar="DIR", help="write report.md, results.json, gangs.jsonl, trace and plots")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--json", action="store_true", help="print results.json's content instead of the table")
    p.add_argument(
        "--check",
        action="store_true",
        help="run the generated day with seeds 1, 2, 3 and on the fleet less a quarter of its nodes, "
        "print every policy's goodput, starvation gap and wait p99 against the others, exit 1 where "
        "gangslice falls short of the targets",
    )
    p.add_argument(
        "--check-traces",
        metavar="A,B",
        help="with --check, these traces, comma-separated: seed-1, seed-2, seed-3, tight "
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

    def done(self, run: Any) -> None:
        """A policy simulated in another process has finished."""
        placed = sum(1 for g in run.gangs if g.runs)
        self.stream.write(
            f"simulate {run.policy:<10} done in {run.wall_seconds:.1f} s, {placed} gangs placed\n"
        )
        self.stream.flush()

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
    from extender.sim.inputs import check_levels, fitted_day, load_sim_cluster
    from extender.sim.policies import choose
    from extender.sim.report import dumps, headline, table, write_folder
    from extender.sim.runner import default_workers, run_simulation
    from extender.sim.trace import load_trace

    try:
        policies = choose(args.policies)
    except ValueError as exc:
        print(f"gangslice simulate: --policies: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.migrate and "gangslice" in policies:
        from extender.sim.migrating import Migrating

        policies["gangslice"] = Migrating()
    problem = _bad_numbers(args)
    if problem:
        print(f"gangslice simulate: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.check_traces is not None and not args.check:
        print("gangslice simulate: --check-traces needs --check", file=sys.stderr)
        return EXIT_BAD_INPUT
    workers = args.workers or default_workers()
    try:
        cluster = load_sim_cluster(args.cluster)
        if args.check:
            return check(args, cluster, policies, workers)
        if args.trace is None:
            trace, left_out = fitted_day(args.seed, cluster, args.load)
            for line in left_out:
                print(f"gangslice simulate: {line}", file=sys.stderr)
        else:
            trace = load_trace(args.trace)
        check_levels(trace, cluster)
    except FileError as exc:
        print(f"gangslice simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    progress = None if args.quiet else ProgressLine(sys.stderr)
    outcome = run_simulation(
        cluster,
        trace,
        policies,
        seed=args.seed,
        no_wait=args.no_wait,
        cluster_source=args.cluster or "default",
        progress=progress.start if progress and workers == 1 else None,
        imex_startup_s=args.imex_startup_s,
        keep_cliques=KeepCliques(args.keep_cliques),
        workers=workers,
        done=progress.done if progress and workers > 1 else None,
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


def _bad_numbers(args: argparse.Namespace) -> str | None:
    if not 0 <= args.imex_startup_s < math.inf:
        return f"--imex-startup-s {args.imex_startup_s:g}: not a number of seconds"
    if not 0 < args.load <= 100:
        return f"--load {args.load:g}: expected a number above 0 and at most 100"
    if args.workers is not None and not 1 <= args.workers <= 64:
        return f"--workers {args.workers}: expected 1 to 64"
    return None


EXIT_SHORT = 1


def check(args: argparse.Namespace, cluster: Any, policies: Any, workers: int) -> int:
    """``simulate --check``: every trace of the bar, one table each and a summed one, and the
    exit status: 0 when gangslice clears every target, 1 otherwise."""
    from extender.sim.check import GANGSLICE, TRACES, render, select, standings, summed, tight
    from extender.sim.inputs import fitted_day
    from extender.sim.runner import run_simulation

    if GANGSLICE not in policies or len(policies) < 2:
        print("gangslice simulate: --check needs gangslice and at least one peer", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.trace is not None:
        print("gangslice simulate: --check runs the generated days; drop --trace", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        specs = select(args.check_traces)
    except ValueError as exc:
        print(f"gangslice simulate: --check-traces: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    per_trace = []
    failing: list[str] = []
    for spec in specs:
        label = spec.label(Path(args.cluster).name if args.cluster else None)
        trace, _ = fitted_day(spec.seed, cluster, args.load)
        fleet = tight(cluster) if spec.tight else cluster
        started = time.monotonic()
        outcome = run_simulation(
            fleet,
            trace,
            policies,
            seed=spec.seed,
            imex_startup_s=args.imex_startup_s,
            keep_cliques=KeepCliques(args.keep_cliques),
            workers=workers,
        )
        rows = standings(outcome.results)
        per_trace.append(rows)
        print(render(f"{label} ({time.monotonic() - started:.0f} s):", rows))
        print()
        failing += [f"{label}: {m}" for s in rows if s.policy == GANGSLICE for m in s.shortfalls]
    total = summed(per_trace)
    print(render(f"summed over the {len(specs)} traces run:", total))
    print()
    counts = Counter(s.policy for rows in per_trace for s in rows for _ in s.shortfalls)
    counts.update(s.policy for s in total for _ in s.shortfalls)
    print(
        "misses by policy, each judged against the others: " + ", ".join(f"{p} {counts[p]}" for p in policies)
    )
    failing += [m for s in total if s.policy == GANGSLICE for m in s.shortfalls]
    if failing:
        print(f"\ngangslice falls short of {len(failing)} targets:")
        for line in failing:
            print(f"  {line}")
        return EXIT_SHORT
    if len(specs) < len(TRACES) or any(s not in TRACES for s in specs):
        print(f"\ngangslice meets every target on the traces run ({', '.join(t.name for t in specs)})")
    else:
        print("\ngangslice meets every target on every trace of the bar")
    return EXIT_OK
