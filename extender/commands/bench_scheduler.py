"""``gangslice bench scheduler``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from extender.bench.placement import bench_subparsers
from extender.commands.exits import EXIT_FAILED, EXIT_OK, UsageError


def register(sub: Any) -> None:
    defaults = _defaults()
    p: argparse.ArgumentParser = bench_subparsers(sub).add_parser(
        "scheduler",
        help="pods per second through a real kube-scheduler: alone, with the extender, with plain gangs",
    )
    p.add_argument(
        "--nodes", type=int, default=defaults.nodes, help=f"fake HGX H100 nodes (default {defaults.nodes})"
    )
    p.add_argument("--pods", type=int, default=defaults.pods, help=f"pods per case (default {defaults.pods})")
    p.add_argument(
        "--gpus", type=int, default=defaults.gpus, help=f"GPUs per pod, 1-8 (default {defaults.gpus})"
    )
    p.add_argument(
        "--gang-sizes",
        type=int,
        nargs="*",
        default=list(defaults.gang_sizes),
        metavar="N",
        help="sizes of the plain-gang cases (default 4 16; none: no gang case)",
    )
    p.add_argument(
        "--nodes-per-leaf",
        type=int,
        default=defaults.nodes_per_leaf,
        help=f"nodes under one leaf switch (default {defaults.nodes_per_leaf})",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the default scheduler alone")
    p.add_argument("--no-plain", action="store_true", help="skip the extender with pods outside gangs")
    p.add_argument(
        "--bin-dir",
        metavar="DIR",
        help="folder with etcd, kube-apiserver, kube-scheduler (default: $GANGSLICE_E2E_BIN, "
        "else where hack/e2e/build.sh puts them)",
    )
    p.add_argument(
        "--timeout", type=float, default=defaults.timeout_s, help="seconds one case may take (default 900)"
    )
    p.add_argument(
        "--log-level",
        default=defaults.log_level,
        choices=["debug", "info", "warning", "error"],
        help="log level of gangslice serve",
    )
    p.add_argument("--keep", action="store_true", help="keep the control plane's folder with every log")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=run)


def _defaults() -> Any:
    from extender.bench.scheduler import SchedulerBenchOptions

    return SchedulerBenchOptions()


def run(args: argparse.Namespace) -> int:
    from extender.bench.controlplane import ControlPlaneError, default_bin_dir
    from extender.bench.scheduler import SchedulerBenchOptions, render, run_scheduler_bench, to_json

    if min(args.nodes, args.pods, args.nodes_per_leaf, args.timeout) <= 0:
        raise UsageError("--nodes, --pods, --nodes-per-leaf and --timeout must be > 0")
    if not 1 <= args.gpus <= 8:
        raise UsageError(f"--gpus {args.gpus}: an HGX node has 8 GPUs")
    if any(n < 2 for n in args.gang_sizes):
        raise UsageError("--gang-sizes: a gang has at least 2 pods")
    if args.pods * args.gpus > args.nodes * 8:
        raise UsageError(f"{args.pods} pods of {args.gpus} GPUs do not fit {args.nodes} nodes of 8 GPUs")
    short = [n for n in args.gang_sizes if args.pods < n]
    if short:
        raise UsageError(f"--pods {args.pods} is fewer than a gang of {short[0]}")
    options = SchedulerBenchOptions(
        nodes=args.nodes,
        pods=args.pods,
        gpus=args.gpus,
        gang_sizes=tuple(args.gang_sizes),
        nodes_per_leaf=args.nodes_per_leaf,
        baseline=not args.no_baseline,
        plain=not args.no_plain,
        bin_dir=Path(args.bin_dir) if args.bin_dir else None,
        timeout_s=args.timeout,
        log_level=args.log_level,
        keep=args.keep,
    )
    try:
        bin_dir = options.bin_dir or default_bin_dir()
        results = run_scheduler_bench(options, bin_dir, lambda line: print(line, file=sys.stderr, flush=True))
    except ControlPlaneError as exc:
        print(f"gangslice bench scheduler: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        import json

        print(json.dumps(to_json(options, results), indent=2))
    else:
        print(render(options, results))
    return EXIT_OK
