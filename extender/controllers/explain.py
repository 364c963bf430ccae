"""What ``gangslice explain`` says about one gang: what it asks for, what it holds, why it
waits. Facts are gathered by :mod:`extender.commands.explain` (from files or the API);
this module only turns them into one screen of text or a JSON object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from extender.placement.ledger import Reservation
from extender.placement.migration import Drain
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.topology.serialize import index_ranges


@dataclass(frozen=True)
class CheckState:
    """Our admission check entry on a Workload (or a PodGroup's own condition)."""

    state: str
    message: str
    since: str | None = None


@dataclass
class Facts:
    target: str
    gang: GangRequest | None = None
    notes: list[str] = field(default_factory=list)
    check: CheckState | None = None
    reservation: Reservation | None = None
    #: A fresh placement of the gang on the current snapshot (its own hold excluded).
    dry_run: Placement | None = None
    #: Why something above could not be worked out (the gang request, the cluster).
    problems: list[str] = field(default_factory=list)
    #: DRA: slot key -> (the devices its claim pins, what the claim says now).
    slot_claims: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Bound pods the kubelet reports on other GPUs than promised, one line each.
    mismatches: list[str] = field(default_factory=list)
    #: For a gang with no slice now: the migration plan (moves of movable replicas), a
    #: migration under way, or why there is none, in words; and the plan itself.
    migration: str = ""
    plan: Drain | None = None


def _ask_lines(gang: GangRequest) -> list[str]:
    lines = [f"asks for: {gang.pods} pod(s), {gang.gpus} GPU(s)"]
    for ps in gang.pod_sets:
        bits = [f"{ps.count} pod(s) x {ps.gpus_per_pod} GPU(s)"]
        if ps.comm.value != "none":
            bits.append(ps.comm.value)
        if ps.required_level:
            bits.append(f"required {ps.required_level}")
        if ps.preferred_level:
            bits.append(f"preferred {ps.preferred_level}")
        if ps.colocate_with:
            bits.append(f"with {ps.colocate_with.pod_set} in one {ps.colocate_with.level}")
        lines.append(f"  {ps.name:<12} " + ", ".join(bits))
        needs = _needs_words(ps)
        if needs:
            lines.append(f"  {'':<12} of its node: {needs}")
    return lines


def _needs_words(ps: PodSet) -> str:
    """What the pod set's pods ask of a node, as kube-scheduler's filters read it."""
    out = []
    if ps.node_selector:
        out.append("nodeSelector " + ", ".join(str(r) for r in ps.node_selector))
    if ps.affinity:
        out.append("node affinity " + " or ".join(f"({t})" for t in ps.affinity))
    if ps.tolerations:
        out.append("tolerates " + ", ".join(str(t) for t in ps.tolerations))
    r = ps.requests
    asked = [
        f"{what} {amount}"
        for what, amount in (
            ("cpu", f"{r.cpu_millis}m" if r.cpu_millis else ""),
            ("memory", f"{r.memory_bytes / 2**30:g}Gi" if r.memory_bytes else ""),
            ("ephemeral-storage", f"{r.ephemeral_bytes / 2**30:g}Gi" if r.ephemeral_bytes else ""),
        )
        if amount
    ]
    if asked:
        out.append("requests " + ", ".join(asked))
    return "; ".join(out)


def _slots(sl: Slice, limit: int = 12, claims: dict[str, tuple[str, str]] | None = None) -> list[str]:
    out = []
    for s in sl.slots[:limit]:
        numa = ",".join(map(str, s.numa_nodes)) or "-"
        gpus = index_ranges(s.gpus) or "-"
        out.append(f"    {s.key:<16} {s.node:<20} gpus {gpus:<10} numa {numa}")
        if claims and s.key in claims:
            pins, state = claims[s.key]
            out.append(f"      pins {pins}; {state}")
    if len(sl.slots) > limit:
        out.append(f"    ... and {len(sl.slots) - limit} more pod(s)")
    return out


def _reservation_lines(r: Reservation | None, claims: dict[str, tuple[str, str]] | None = None) -> list[str]:
    if r is None:
        return ["reservation: none"]
    sl = r.slice
    gpus = sl.gpus
    name = r.meta.get("name", r.gang)
    lines = [
        f"reservation: {name} ({r.phase.value}, {len(r.bound)}/{len(sl.slots)} pods bound)",
        f"  {gpus} GPU(s) on {', '.join(sl.nodes)}; predicted {sl.per_layer_micros:.1f} us/layer"
        + (
            " (" + ", ".join(f"{k} {v:.1f}" for k, v in sl.pod_set_micros.items()) + ")"
            if sl.pod_set_micros
            else ""
        ),
    ]
    return lines + _slots(sl, claims=claims)


def _dry_run_lines(result: Placement | None, gang: GangRequest | None) -> list[str]:
    if result is None:
        return []
    if isinstance(result, Slice):
        where = "; ".join(f"{k} in {v}" for k, v in result.domains.items())
        lines = [
            f"dry run now: a slice exists: {len(result.slots)} pod(s) on {', '.join(result.nodes)}, "
            f"predicted {result.per_layer_micros:.1f} us/layer" + (f" ({where})" if where else "")
        ]
        lines.extend(f"  note: {n}" for n in result.notes)
        return lines
    lines = ["dry run now: no slice", f"  why: {result.reason}"]
    lines.extend(_lack_lines(result, gang))
    if not result.feasible_when_empty:
        lines.append("  this gang does not fit this cluster even when it is empty")
    return lines


def _lack_lines(result: Unplaceable, gang: GangRequest | None) -> list[str]:
    if result.closest is None and not result.short_by:
        return []
    per_pod, count = 0, 0
    if gang is not None and result.pod_set is not None:
        try:
            ps = gang.pod_set(result.pod_set)
            per_pod, count = ps.gpus_per_pod, ps.count
        except KeyError:
            pass
    pods = f"{result.short_by} pod(s) of pod set {result.pod_set}"
    if per_pod:
        pods += f" ({result.short_by * per_pod} GPUs)"
    if result.closest is None or result.short_by >= count > 0:
        return [f"  no domain holds even one of its pods: short by {pods}"]
    lacks = pods.replace(" pod(s)", " more pod(s)", 1)
    return [f"  closest: {result.closest}; lacks {lacks}"]


def render(f: Facts) -> str:
    lines = [f.target]
    if f.gang is not None:
        lines.extend(_ask_lines(f.gang))
    lines.extend(f"  note: {n}" for n in f.notes)
    if f.check is not None:
        since = f" since {f.check.since}" if f.check.since else ""
        lines.append(f"admission check: {f.check.state}{since}")
        if f.check.message:
            lines.append(f"  {f.check.message}")
    lines.extend(_reservation_lines(f.reservation, f.slot_claims))
    lines.extend(f"  devices differ: {m}" for m in f.mismatches)
    lines.extend(_dry_run_lines(f.dry_run, f.gang))
    if f.migration:
        lines.append(f"migration: {f.migration}")
    lines.extend(f"problem: {p}" for p in f.problems)
    return "\n".join(lines)


def to_json(f: Facts) -> dict[str, Any]:
    dry: dict[str, Any] | None = None
    if isinstance(f.dry_run, Slice):
        dry = {"placed": True, **f.dry_run.to_dict()}
    elif isinstance(f.dry_run, Unplaceable):
        dry = {"placed": False, **f.dry_run.to_dict()}
    return {
        "target": f.target,
        "gang": None
        if f.gang is None
        else {
            "name": f.gang.name,
            "pods": f.gang.pods,
            "gpus": f.gang.gpus,
            "podSets": [
                {
                    "name": ps.name,
                    "count": ps.count,
                    "gpusPerPod": ps.gpus_per_pod,
                    "comm": ps.comm.value,
                    "requiredLevel": ps.required_level,
                    "preferredLevel": ps.preferred_level,
                }
                for ps in f.gang.pod_sets
            ],
        },
        "notes": list(f.notes),
        "check": None
        if f.check is None
        else {"state": f.check.state, "message": f.check.message, "since": f.check.since},
        "reservation": None if f.reservation is None else f.reservation.to_dict(),
        "slotClaims": {k: {"pins": pins, "claim": state} for k, (pins, state) in f.slot_claims.items()},
        "devicesMismatch": list(f.mismatches),
        "dryRun": dry,
        "migration": None
        if not f.migration
        else {
            "says": f.migration,
            "plan": None
            if f.plan is None
            else {
                "domain": f.plan.domain,
                "restartGpuSeconds": f.plan.restart_gpu_s,
                "slice": f.plan.slice.to_dict(),
                "moves": [{"pod": m.gang, "to": [s.to_dict() for s in m.slots]} for m in f.plan.moves],
            },
        },
        "problems": list(f.problems),
    }
