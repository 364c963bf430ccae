"""``gangslice place``: one placement from files, printed and explained."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNPLACEABLE
from extender.placement.files import FileError, load_cluster, load_gang
from extender.placement.slice import Placement, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.allocation import Allocation


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "place", help="place one gang on a cluster file and explain the slice"
    )
    p.add_argument("--cluster", required=True, help="cluster file (YAML)")
    p.add_argument("--gang", required=True, help="gang file (YAML)")
    p.add_argument("--policy", default="gangslice", help="gangslice (default) or a baseline policy")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    p.set_defaults(func=run)


def placement_json(result: Placement, cluster: ClusterSnapshot | None = None) -> dict[str, Any]:
    """The placement as JSON; with ``cluster``, also how the nodes' GPUs are allocated: the
    count of nodes per mode, and for a slice the mode of each node it uses."""
    modes: dict[str, Any] = {}
    if cluster is not None:
        modes["allocation"] = {str(a): sum(n.allocation == a for n in cluster.nodes) for a in Allocation}
        if isinstance(result, Slice):
            used = dict.fromkeys(s.node for s in result.slots)
            modes["nodeAllocation"] = {n: str(cluster.node(n).allocation) for n in used}
    if isinstance(result, Slice):
        d = result.to_dict()
        return {"placed": True, **d, "reason": None, **modes}
    return {"placed": False, "pods": [], "cost": None, **result.to_dict(), **modes}


def allocation_line(result: Placement, cluster: ClusterSnapshot) -> str:
    """Who hands out the GPUs: on the slice's nodes for a placement, in the cluster otherwise."""
    if isinstance(result, Slice):
        nodes = [cluster.node(n) for n in dict.fromkeys(s.node for s in result.slots)]
        where = "the slice's nodes"
    else:
        nodes, where = cluster.nodes, "the cluster"
    counts = {a: sum(n.allocation == a for n in nodes) for a in Allocation}
    parts = [f"{a.words} on {k} node{'s' if k != 1 else ''}" for a, k in counts.items() if k]
    line = f"  GPU allocation on {where}: {', '.join(parts) or 'no nodes'}"
    if isinstance(result, Slice) and counts[Allocation.DEVICE_PLUGIN]:
        line += " (there each pod's GPUs are the device plugin's predicted answer)"
    return line


def render(result: Placement, cluster: ClusterSnapshot | None = None) -> str:
    modes = [allocation_line(result, cluster)] if cluster is not None else []
    if not isinstance(result, Slice):
        never = (
            ""
            if result.feasible_when_empty
            else "\n  (this gang cannot fit this cluster even when it is empty)"
        )
        return "\n".join([f"gang {result.gang}: unplaceable\n  {result.reason}{never}", *modes])
    lines = [f"gang {result.gang}: placed, predicted {result.per_layer_micros:.1f} us/layer of communication"]
    lines.extend(modes)
    for name, micros in result.pod_set_micros.items():
        where = result.domains.get(name, "")
        lines.append(f"  pod set {name}: {micros:.1f} us/layer, within {where}")
    for s in result.slots:
        numa = ",".join(map(str, s.numa_nodes)) or "-"
        nic = f" nic {s.nic}" if s.nic else ""
        lines.append(f"    {s.key:<16} {s.node:<20} gpus {','.join(map(str, s.gpus)):<16} numa {numa}{nic}")
    lines.extend(f"  note: {n}" for n in result.notes)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from extender.peers import POLICIES

    policy = POLICIES.get(args.policy)
    if policy is None:
        known = ", ".join(POLICIES)
        print(f"gangslice place: --policy: unknown policy {args.policy!r}; known: {known}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        cluster = load_cluster(args.cluster)
        gang = load_gang(args.gang, cluster.hierarchy)  # its level names checked against the cluster's
    except FileError as exc:
        print(f"gangslice place: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = policy(cluster, gang)
    print(json.dumps(placement_json(result, cluster), indent=2) if args.json else render(result, cluster))
    return EXIT_OK if isinstance(result, Slice) else EXIT_UNPLACEABLE
