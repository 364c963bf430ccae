"""``gangslice``: one command with subcommands. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from extender import __version__
from extender.commands.exits import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, UsageError

#: Modules that define ``register(subparsers)``; each subcommand sets ``func(args) -> int``.
COMMAND_MODULES = (
    "extender.commands.topo",
    "extender.commands.place",
    "extender.bench.placement",
    "extender.commands.simulate",
    "extender.commands.agent",
    "extender.commands.serve",
    "extender.commands.explain",
    "extender.commands.hypernodes",
    "extender.commands.bench_scheduler",
    "extender.commands.playground",
)


#: The kubectl plugin's executable: kubectl runs ``kubectl gangslice ...`` as this.
KUBECTL_PLUGIN = "kubectl-gangslice"


def build_parser(prog: str = "gangslice") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Topology-aware gang scheduling for LLM inference on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"gangslice {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    as_plugin = os.path.basename(sys.argv[0]) == KUBECTL_PLUGIN
    parser = build_parser("kubectl gangslice" if as_plugin else "gangslice")
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a reader that went away shows up here, not at interpreter exit
    except UsageError as exc:
        print(f"gangslice {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gangslice ... | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if not _no_cluster_configuration(exc):
            raise
        print(
            f"gangslice {args.command}: no cluster to talk to ({exc}): give --kubeconfig, set KUBECONFIG, "
            "or run inside a pod",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return code


def _no_cluster_configuration(exc: BaseException) -> bool:
    """The Kubernetes client found neither a kubeconfig nor an in-cluster service account. Looked
    up by module so that commands which never load the client do not import it here."""
    module = sys.modules.get("kubernetes.config.config_exception")
    return module is not None and isinstance(exc, module.ConfigException)


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
