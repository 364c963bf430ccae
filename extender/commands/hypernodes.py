"""``gangslice hypernodes``: print our level hierarchy as Volcano ``HyperNode`` objects."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNREACHABLE
from extender.controllers import hypernodes
from extender.placement.files import FileError, load_cluster


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "hypernodes",
        help="print our level hierarchy as Volcano HyperNode objects (YAML)",
        description=(hypernodes.__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--cluster", help="cluster file")
    src.add_argument("--kubeconfig", help="kubeconfig of the live cluster (its Node labels)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        objs = (
            hypernodes.from_snapshot(load_cluster(args.cluster))
            if args.cluster
            else hypernodes.from_live(args.kubeconfig)
        )
    except FileError as exc:
        print(f"gangslice hypernodes: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        print(f"gangslice hypernodes: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    sys.stdout.write(hypernodes.render(objs))
    return EXIT_OK
