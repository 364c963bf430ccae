"""``gangslice place``: one placement from files, printed and explained."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNPLACEABLE
from extender.placement.files import FileError, load_cluster, load_gang
from extender.placement.request import GangRequest
from extender.placement.slice import Placement, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.step import StepTime, slice_step
from extender.topology.allocation import Allocation

#: Slices the search for the fastest one tries at most for ``place`` (see extender.sim.reference).
BEST_BUDGET = 20_000


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "place", help="place one gang on a cluster file and explain the slice"
    )
    p.add_argument("--cluster", required=True, help="cluster file (YAML)")
    p.add_argument("--gang", required=True, help="gang file (YAML)")
    p.add_argument("--policy", default="gangslice", help="gangslice (default) or a baseline policy")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Speed:
    """A slice's step time, and the fastest step any valid slice of the gang gets on the
    cluster as the file has it (None where the search found none)."""

    step: StepTime
    best_us: float | None
    exact: bool

    @property
    def share(self) -> float | None:
        """The slice's speed as a share of the fastest: what a GPU-hour on it delivers."""
        if self.best_us is None or self.step.total_us <= 0:
            return None
        return min(1.0, self.best_us / self.step.total_us)


def speed_of(cluster: ClusterSnapshot, gang: GangRequest, result: Slice) -> Speed:
    from extender.sim.reference import best_slice

    best = best_slice(cluster, gang, budget=BEST_BUDGET)
    step = slice_step(cluster, gang, result.slots)
    return Speed(step, None if best is None else best.step_us, best is None or best.exact)


def placement_json(
    result: Placement, cluster: ClusterSnapshot | None = None, speed: Speed | None = None
) -> dict[str, Any]:
    """The placement as JSON; with ``cluster``, also how the nodes' GPUs are allocated: the
    count of nodes per mode, and for a slice the mode of each node it uses; with ``speed``,
    the step time and its share of the fastest slice's speed."""
    modes: dict[str, Any] = {}
    if speed is not None:
        modes["step"] = {
            "millis": round(speed.step.total_us / 1000, 3),
            "computeMillis": round(speed.step.compute_us / 1000, 3),
            "commMillis": round(speed.step.comm_us / 1000, 3),
            "bestMillis": None if speed.best_us is None else round(speed.best_us / 1000, 3),
            "bestProven": speed.exact,
            "speed": None if speed.share is None else round(speed.share, 4),
        }
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


def speed_line(speed: Speed) -> str:
    """``  step 84.8 ms (compute 66.7, communication 18.1); the fastest slice ...``"""
    step = speed.step
    line = (
        f"  step {step.total_us / 1000:.1f} ms (compute {step.compute_us / 1000:.1f}, "
        f"communication {step.comm_us / 1000:.1f})"
    )
    if speed.best_us is not None and speed.share is not None:
        proven = "" if speed.exact else ", not proven the fastest"
        line += (
            f"; the fastest slice this cluster has room for: {speed.best_us / 1000:.1f} ms{proven}, so a "
            f"GPU-hour here serves {100 * speed.share:.0f}% of what it could"
        )
    return line


def render(result: Placement, cluster: ClusterSnapshot | None = None, speed: Speed | None = None) -> str:
    modes = [allocation_line(result, cluster)] if cluster is not None else []
    if not isinstance(result, Slice):
        never = (
            ""
            if result.feasible_when_empty
            else "\n  (this gang cannot fit this cluster even when it is empty)"
        )
        return "\n".join([f"gang {result.gang}: unplaceable\n  {result.reason}{never}", *modes])
    lines = [f"gang {result.gang}: placed, predicted {result.per_layer_micros:.1f} us/layer of communication"]
    if speed is not None:
        lines.append(speed_line(speed))
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
    speed = speed_of(cluster, gang, result) if isinstance(result, Slice) else None
    print(
        json.dumps(placement_json(result, cluster, speed), indent=2)
        if args.json
        else render(result, cluster, speed)
    )
    return EXIT_OK if isinstance(result, Slice) else EXIT_UNPLACEABLE
