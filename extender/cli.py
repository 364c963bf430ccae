"""``gangslice``: one command with subcommands. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from extender import __version__

#: Modules that define ``register(subparsers)``; each subcommand sets ``func(args) -> int``.
COMMAND_MODULES = (
    "extender.topology.commands",
    "extender.placement.commands",
    "extender.placement.bench",
    "extender.sim.commands",
    "extender.agent.commands",
    "extender.webhook.commands",
    "extender.admission.commands",
    "extender.bench.commands",
)


#: What a shell reports for a process the reader of its pipe went away from (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gangslice",
        description="Topology-aware gang scheduling for LLM inference on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gangslice {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a reader that went away shows up here, not at interpreter exit
    except UsageError as exc:
        print(f"gangslice {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gangslice ... | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the flush at interpreter exit does not raise again
    (the recipe in the Python docs' note on SIGPIPE)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a non-file stream (tests)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
