"""``gangslice``: one command with subcommands. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
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
)


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
    except UsageError as exc:
        print(f"gangslice {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
