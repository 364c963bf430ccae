"""Draining a domain for a waiting gang by moving restartable replicas off it.

Inference replicas behind a gateway are stateless: moving one costs a model load, not lost
work. When a gang that needs a whole domain (a leaf of H100 nodes for wide expert
parallelism, an NVL72 rack, one whole node for TP=8) finds none, and movable replicas hold
part of one, :func:`plan_drain` looks for the domain cheapest to drain:

1. the domains at the gang's required level (one node for a one-pod gang without one),
   those whose movers restart for the fewest GPU-seconds first, at most :data:`DOMAINS`;
2. on each, with its movers' GPUs counted free, the gang's slice inside the domain;
3. the movers whose GPUs that slice takes, each placed again outside the slice on hardware at
   least as fast as it has now (its compute speed, :mod:`~extender.placement.hardware`),
   largest first, each slot taken before the next is placed;
4. the plan whose moves restart for the fewest GPU-seconds (GPUs x model load) wins.

A plan is all or nothing: every displaced mover has a slot, and the gang's slice is free once
they leave. Who plans, and for whom, is one rule here (:func:`due`, :data:`MAX_MOVER_GPUS`)
for the simulator's policy (:mod:`extender.sim.migrating`) and ``serve --migration``
(:mod:`extender.controllers.migration`), which reports a plan or carries it out: the gang's
slice and the movers' new slots held (:mod:`extender.reservations.handover`) before anything
is evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.placement import hardware
from extender.placement.request import GangRequest
from extender.placement.scoring import ANYWHERE, node_scope, resolve_need
from extender.placement.slice import PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.topology.gpus import GpuSpec

#: At most this many domains are tried per decision (the cheapest to drain first).
DOMAINS = 8
#: At most this many replicas move for one gang.
MAX_MOVES = 32
#: Seconds a gang waits (since it was first refused) before replicas may move for it.
AFTER_S = 600.0
#: Gangs smaller than this wait without moves (they fit the holes small replicas leave).
MIN_GPUS = 8
#: Replicas of more GPUs than this are not moved (a whole node frees nothing by moving).
MAX_MOVER_GPUS = 4


@dataclass(frozen=True, slots=True)
class Mover:
    """A running replica that may be moved: its request (one pod), where it runs, and how long
    it takes to serve again once moved (its model load)."""

    gang: GangRequest
    slots: tuple[PodSlot, ...]
    restart_s: float

    @property
    def gpus(self) -> int:
        return sum(len(s.gpus) for s in self.slots)

    @property
    def restart_gpu_s(self) -> float:
        return self.gpus * self.restart_s


@dataclass(frozen=True, slots=True)
class Move:
    """Where one mover goes."""

    gang: str
    slots: tuple[PodSlot, ...]


@dataclass(frozen=True, slots=True)
class Drain:
    """A plan: the gang's slice once the movers have left, where each goes, what it costs."""

    slice: Slice
    moves: tuple[Move, ...]
    domain: str
    restart_gpu_s: float


def one_pod(gang: GangRequest) -> bool:
    """Whether a replica of this shape may be moved at all: one pod (a multi-pod gang restarts
    as a whole and may be mid-rollout)."""
    return len(gang.pod_sets) == 1 and gang.pod_sets[0].count == 1


def due(gang: GangRequest, waited_s: float, after_s: float = AFTER_S) -> bool:
    """Whether replicas may move for ``gang``, refused after waiting ``waited_s``."""
    return gang.gpus >= MIN_GPUS and waited_s >= after_s


def plan_drain(snap: ClusterSnapshot, gang: GangRequest, movers: Sequence[Mover]) -> Drain | None:
    """The cheapest plan that places ``gang`` by moving some of ``movers`` (module docstring;
    only one-pod replicas of at most :data:`MAX_MOVER_GPUS` GPUs move), or None."""
    movers = [
        m for m in movers if one_pod(m.gang) and 0 < m.gpus <= MAX_MOVER_GPUS and m.gang.name != gang.name
    ]
    if not movers:
        return None
    domains = _domains(snap, gang)
    if not domains:
        return None
    where: dict[str, list[Mover]] = {}
    for m in movers:
        for s in m.slots:
            where.setdefault(s.node, []).append(m)
    candidates = []
    for label, names in domains:
        found = list({id(m): m for n in names for m in where.get(n, ())}.values())
        if found:
            candidates.append((sum(m.restart_gpu_s for m in found), label, names, found))
    candidates.sort(key=lambda c: (c[0], c[1]))
    best: Drain | None = None
    for _, label, names, inside in candidates[:DOMAINS]:
        got = _drain(snap, gang, label, names, inside)
        if got is not None and (best is None or got.restart_gpu_s < best.restart_gpu_s):
            best = got
    return best


def _domains(snap: ClusterSnapshot, gang: GangRequest) -> list[tuple[str, list[str]]]:
    """The domains a slice of ``gang`` must fit in: its coarsest required level's, or single
    nodes for a one-pod gang without one (label, node names)."""
    h = snap.hierarchy
    scope = min(resolve_need(ps, h).scope for ps in gang.pod_sets)
    if scope == ANYWHERE:
        if sum(ps.count for ps in gang.pod_sets) != 1:
            return []
        scope = node_scope(h)
    if scope == node_scope(h):
        return [(f"node {n.name}", [n.name]) for n in snap.nodes]
    out = []
    for key, members in snap.domains().items():
        if key[0] == scope:
            out.append((f"{h.levels[scope].name} {key[1][-1]}", [snap.nodes[i].name for i in members]))
    return out


def _drain(
    snap: ClusterSnapshot, gang: GangRequest, label: str, names: Sequence[str], inside: Sequence[Mover]
) -> Drain | None:
    freed = snap.without(_merge(m.slots for m in inside))
    got = place(freed.only(names), gang)
    if not isinstance(got, Slice):
        return None
    taken = _merge([got.slots])
    displaced = [m for m in inside if any(taken.get(s.node, frozenset()) & set(s.gpus) for s in m.slots)]
    if not displaced or len(displaced) > MAX_MOVES:
        return None
    rest = snap.without(_merge(m.slots for m in displaced)).with_taken(got.slots)
    moves = []
    for m in sorted(displaced, key=lambda m: (-m.gpus, m.gang.name)):
        allowed = _as_fast(rest, m)
        if not allowed:
            return None
        new = place(rest.only(allowed), m.gang)
        if not isinstance(new, Slice):
            return None
        moves.append(Move(m.gang.name, new.slots))
        rest = rest.with_taken(new.slots)
    return Drain(got, tuple(moves), label, sum(m.restart_gpu_s for m in displaced))


def _merge(groups: Iterable[Sequence[PodSlot]]) -> dict[str, frozenset[int]]:
    """The GPUs of every group's slots, by node."""
    out: dict[str, set[int]] = {}
    for slots in groups:
        for s in slots:
            out.setdefault(s.node, set()).update(s.gpus)
    return {n: frozenset(g) for n, g in out.items()}


def _as_fast(snap: ClusterSnapshot, m: Mover) -> list[str]:
    """The nodes where ``m`` computes at least as fast as it does now (every node when its
    speeds are not known: the objective's other terms decide)."""
    ps = m.gang.pod_sets[0]
    speeds = hardware.speeds(snap, ps)
    models = hardware.node_models(snap)
    if speeds is None:
        return [n.name for n in snap.nodes]
    now = min(_speed(speeds, models[snap.index(s.node)]) for s in m.slots)
    return [n.name for i, n in enumerate(snap.nodes) if _speed(speeds, models[i]) >= now - 1e-9]


def _speed(speeds: Mapping[str, float], spec: GpuSpec | None) -> float:
    return 0.0 if spec is None else speeds.get(spec.name, 0.0)
