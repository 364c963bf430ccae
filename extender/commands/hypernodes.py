"""``gangslice hypernodes``: print our level hierarchy as Volcano ``HyperNode`` objects."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNREACHABLE
from extender.controllers.podgroups import hypernodes
from extender.placement.files import FileError, load_cluster

#: What ``--help`` says: written for an operator (the module docstring of
#: extender.controllers.podgroups.hypernodes is written for a developer).
DESCRIPTION = """\
Print the cluster's level hierarchy as Volcano HyperNode objects (YAML), so that
Volcano's network-topology plugin and gangslice see the same network domains.

Tiers follow the order of the levels the nodes are labelled with: the finest such
level is tier 1, the next coarser one tier 2, and so on, the numbering a PodGroup's
networkTopology.highestTierAllowed is read with. Each object's tierName is its
level's name. A domain at a node's finest labelled level lists its nodes
(type: Node); a coarser one lists the finer domains under it (type: HyperNode),
all by exactMatch."""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "hypernodes",
        help="print our level hierarchy as Volcano HyperNode objects (YAML)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--cluster", metavar="FILE", help="cluster file (YAML)")
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
