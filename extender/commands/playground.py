"""``gangslice playground``: try gangslice without a cluster, a container engine or kind.

In one command: etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback
(built from the pinned sources by hack/e2e/build.sh, which needs Go the first time); fake GPU
nodes (HGX H100, L40S PCIe, the trays of a GB200 NVL72 rack) with their NodeTopology objects;
gangslice installed from charts/gangslice; an example gang applied and bound. No kubelet runs,
so no container starts: the controller (``gangslice serve``) and the gangslice-scheduler run as
local processes. It prints what was bound and the commands to look at it, then stays up until
Ctrl-C (or SIGTERM) and stops every process it started; ``--once`` stops right after printing.
Run it from a clone of the repository.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from extender.commands.exits import EXIT_FAILED, EXIT_OK, UsageError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "playground",
        help="try gangslice on a control plane on loopback with fake GPU nodes (no Docker, no kind)",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="working folder (kubeconfig, certificates, logs); what a playground left there is "
        "deleted first, a folder with other files refused (default "
        "${GANGSLICE_CACHE:-~/.cache/gangslice}/playground)",
    )
    p.add_argument(
        "--example",
        dest="examples",
        action="append",
        metavar="FILE",
        help="manifests to apply and wait for (repeatable; default "
        "examples/k8s/plain/prefill-decode.yaml, a prefill/decode gang)",
    )
    p.add_argument("--once", action="store_true", help="stop everything after printing (for tests)")
    p.add_argument(
        "--bin-dir",
        metavar="DIR",
        help="folder with etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, helm "
        "(default: $GANGSLICE_E2E_BIN, else hack/e2e/build.sh builds them)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds the example's pods may take to bind (default 180)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level of gangslice serve",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from extender.bench.controlplane import ControlPlaneError
    from extender.bench.playground import (
        DEFAULT_EXAMPLE,
        Playground,
        PlaygroundError,
        PlaygroundOptions,
        default_folder,
        render,
    )

    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: must be > 0")
    examples = tuple(Path(e) for e in args.examples or ()) or (DEFAULT_EXAMPLE,)
    missing = [str(e) for e in examples if not e.is_file()]
    if missing:
        raise UsageError(f"--example: no file {', '.join(missing)}")
    options = PlaygroundOptions(
        folder=Path(args.dir).expanduser().absolute() if args.dir else default_folder(),
        bin_dir=Path(args.bin_dir) if args.bin_dir else None,
        examples=examples,
        timeout_s=args.timeout,
        log_level=args.log_level,
    )
    playground = Playground(options, say)
    # SIGINT too: a shell starts a background job with SIGINT ignored, and Python then leaves it so.
    _stop_on(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    try:
        try:
            summary = playground.up()
        except (PlaygroundError, ControlPlaneError) as exc:
            print(f"gangslice playground: {exc}", file=sys.stderr)
            return EXIT_FAILED
        say(render(summary))
        if args.once:
            say("\n--once: stopping.")
            return EXIT_OK
        say("\nUp. Ctrl-C stops every process it started.")
        try:
            while (dead := playground.dead()) is None:
                time.sleep(1.0)
        except KeyboardInterrupt:
            say("\nStopping.")
            return EXIT_OK
        print(
            f"gangslice playground: {dead.name} exited; its log ends:\n{dead.log_tail(30)}", file=sys.stderr
        )
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the teardown short
        started = playground.cp is not None
        playground.down()
        if started:
            say(f"Stopped every process it started; their logs stay in {options.folder / 'logs'}.")


def say(text: str) -> None:
    print(text, flush=True)


def _stop_on(*signals: signal.Signals) -> None:
    """Turn these signals into Ctrl-C, so the same teardown runs."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    for sig in signals:
        signal.signal(sig, interrupt)
