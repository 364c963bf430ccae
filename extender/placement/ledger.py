"""The reservation ledger: slices held for gangs until their pods bind or the hold expires.

Keyed by gang. Reserving a gang twice returns the same reservation; a hold expires after
its TTL unless pods keep binding (each bind refreshes it); a fully bound reservation does
not expire. No two reservations share a GPU, nor a node's multi-node NVLink (IMEX) channel.
The ledger serialises to plain dicts so an adapter can persist each reservation (as a
``SliceReservation`` object) and rebuild the same ledger after a restart; an entry that
would break those rules is left out and reported, never double-booked.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from extender.placement.feasibility import NOTHING, Resources, usage, with_imex_daemon
from extender.placement.slice import PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot, NodeState

DEFAULT_TTL_S = 300.0


class Phase(enum.StrEnum):
    RESERVED = "Reserved"
    BOUND = "Bound"
    RELEASED = "Released"
    EXPIRED = "Expired"


class LedgerError(ValueError):
    pass


@dataclass(frozen=True)
class Skipped:
    """A persisted reservation :meth:`Ledger.from_dict` left out, and why."""

    gang: str
    reason: str


@dataclass(frozen=True)
class Reservation:
    gang: str
    slice: Slice
    expires_at: float
    #: slot key (``podSet/index``) -> pod name bound to it
    bound: Mapping[str, str] = field(default_factory=dict)
    phase: Phase = Phase.RESERVED
    #: Opaque data an adapter keeps with the reservation (owner, namespace, object name).
    meta: Mapping[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.bound) == len(self.slice.slots)

    def free_slots(self) -> list[PodSlot]:
        return [s for s in self.slice.slots if s.key not in self.bound]

    def slot_of(self, pod: str) -> PodSlot | None:
        for key, name in self.bound.items():
            if name == pod:
                return self.slice.slot(key)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gang": self.gang,
            "slice": self.slice.to_dict(),
            "expiresAt": self.expires_at,
            "bound": dict(self.bound),
            "phase": self.phase.value,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reservation:
        return cls(
            gang=str(d["gang"]),
            slice=Slice.from_dict(d["slice"]),
            expires_at=float(d["expiresAt"]),
            bound={str(k): str(v) for k, v in (d.get("bound") or {}).items()},
            phase=Phase(d.get("phase", Phase.RESERVED.value)),
            meta={str(k): str(v) for k, v in (d.get("meta") or {}).items()},
        )


class Ledger:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._by_gang: dict[str, Reservation] = {}
        #: Node -> the gangs whose slices hold GPUs or the NVLink (IMEX) channel there, in the
        #: order they came: what a node's held GPUs and requests are read from, so a change
        #: of one reservation is brought into a view without a walk over every other one.
        self._on_node: dict[str, dict[str, None]] = {}
        #: Entries the last :meth:`from_dict` left out (conflicting, duplicated, unreadable).
        self.skipped: tuple[Skipped, ...] = ()

    def __len__(self) -> int:
        return len(self._by_gang)

    def __contains__(self, gang: object) -> bool:
        return gang in self._by_gang

    def get(self, gang: str) -> Reservation | None:
        return self._by_gang.get(gang)

    def reservations(self) -> list[Reservation]:
        return list(self._by_gang.values())

    def reserve(self, sl: Slice, now: float, meta: Mapping[str, str] | None = None) -> Reservation:
        """Hold ``sl`` for its gang. Idempotent: an existing reservation is returned as is.
        Refuses a slice that overlaps GPUs another reservation holds, or that uses the
        multi-node NVLink channel of a node another reservation uses."""
        existing = self._by_gang.get(sl.gang)
        if existing is not None:
            return existing
        clash = self._conflict(sl)
        if clash is not None:
            raise LedgerError(f"gang {sl.gang}: {clash}")
        r = Reservation(sl.gang, sl, now + self.ttl_s, {}, Phase.RESERVED, dict(meta or {}))
        self._add(r)
        return r

    def _add(self, r: Reservation) -> None:
        self._by_gang[r.gang] = r
        for node in _nodes_of(r.slice):
            self._on_node.setdefault(node, {})[r.gang] = None

    def _remove(self, gang: str) -> Reservation | None:
        r = self._by_gang.pop(gang, None)
        if r is not None:
            for node in _nodes_of(r.slice):
                gangs = self._on_node.get(node)
                if gangs is not None:
                    gangs.pop(gang, None)
                    if not gangs:
                        del self._on_node[node]
        return r

    def gangs_on(self, nodes: Iterable[str]) -> list[str]:
        """The gangs whose slices hold GPUs or the NVLink channel on any of ``nodes``."""
        out: dict[str, None] = {}
        for node in nodes:
            out.update(self._on_node.get(node, {}))
        return list(out)

    def _conflict(self, sl: Slice) -> str | None:
        """What another gang's reservation already holds of ``sl``, in words (None: nothing)."""
        touched = _nodes_of(sl)
        held = self.held(exclude=[sl.gang], nodes=touched)
        for node, gpus in sl.held().items():
            clash = gpus & held.get(node, frozenset())
            if clash:
                return f"GPUs {sorted(clash)} on {node} are already reserved"
        channels = self.mnnvl(exclude=[sl.gang], nodes=touched)
        for node in sl.mnnvl_nodes:
            owner = channels.get(node)
            if owner is not None:
                return f"the NVLink (IMEX) channel of {node} is already reserved by gang {owner}"
        return None

    def bind(self, gang: str, slot_key: str, pod: str, now: float) -> Reservation:
        """Record that ``pod`` took ``slot_key``; refreshes the TTL. Re-binding the same pod
        to the same slot is a no-op; another pod on a taken slot is an error."""
        r = self._require(gang)
        r.slice.slot(slot_key)  # KeyError for an unknown slot
        current = r.bound.get(slot_key)
        if current == pod:
            return r
        if current is not None:
            raise LedgerError(f"gang {gang}: slot {slot_key} is already bound to {current}")
        bound = {**r.bound, slot_key: pod}
        phase = Phase.BOUND if len(bound) == len(r.slice.slots) else Phase.RESERVED
        r = replace(r, bound=bound, phase=phase, expires_at=now + self.ttl_s)
        self._by_gang[gang] = r
        return r

    def move_slot(
        self, gang: str, slot_key: str, gpus: Iterable[int], numa_nodes: Iterable[int] | None = None
    ) -> Reservation:
        """Point a slot at other GPUs of its node (and their NUMA nodes): the ones its pod
        really holds, since the kubelet's report wins over the promise. Refuses GPUs another
        reservation, or another slot of the same one, holds (LedgerError)."""
        r = self._require(gang)
        slot = r.slice.slot(slot_key)  # KeyError for an unknown slot
        moved = tuple(sorted(gpus))
        if moved == tuple(sorted(slot.gpus)):
            return r
        others = self.held(exclude=[gang], nodes=[slot.node]).get(slot.node, frozenset())
        clash = others & set(moved)
        if clash:
            holders = sorted(
                o.gang
                for o in map(self._by_gang.__getitem__, self.gangs_on([slot.node]))
                if o.gang != gang and clash & o.slice.held().get(slot.node, frozenset())
            )
            raise LedgerError(
                f"gang {gang}: GPUs {sorted(clash)} on {slot.node} are reserved for {', '.join(holders)}"
            )
        mine = {s.key: s.gpus for s in r.slice.slots if s.key != slot_key and s.node == slot.node}
        inside = {g for gs in mine.values() for g in gs} & set(moved)
        if inside:
            raise LedgerError(f"gang {gang}: GPUs {sorted(inside)} on {slot.node} are another slot's")
        numa = tuple(sorted(numa_nodes)) if numa_nodes is not None else slot.numa_nodes
        slots = tuple(
            replace(s, gpus=moved, numa_nodes=numa) if s.key == slot_key else s for s in r.slice.slots
        )
        r = replace(r, slice=replace(r.slice, slots=slots))
        self._by_gang[gang] = r
        return r

    def add_slot(self, gang: str, slot: PodSlot) -> Reservation:
        """Grow a held slice by one slot (a pod set scaled up, a rolling update's surge pod).
        Refuses a slot key the slice has, or GPUs another reservation or another slot of this
        one holds (LedgerError)."""
        r = self._require(gang)
        if any(s.key == slot.key for s in r.slice.slots):
            raise LedgerError(f"gang {gang}: slot {slot.key} exists")
        own = {g for s in r.slice.slots if s.node == slot.node for g in s.gpus} & set(slot.gpus)
        if own:
            raise LedgerError(f"gang {gang}: GPUs {sorted(own)} on {slot.node} are another slot's")
        grown = replace(r.slice, slots=(*r.slice.slots, slot))
        clash = self._conflict(grown)
        if clash is not None:
            raise LedgerError(f"gang {gang}: {clash}")
        self._remove(gang)
        r = replace(r, slice=grown, phase=Phase.RESERVED)
        self._add(r)
        return r

    def remove_slot(self, gang: str, slot_key: str) -> Reservation:
        """Shrink a held slice by one slot no pod holds (a pod set scaled down, a rolling
        update's old pod gone). Refuses a bound slot or the last one (LedgerError)."""
        r = self._require(gang)
        r.slice.slot(slot_key)  # KeyError for an unknown slot
        if slot_key in r.bound:
            raise LedgerError(f"gang {gang}: slot {slot_key} is bound to {r.bound[slot_key]}")
        if len(r.slice.slots) == 1:
            raise LedgerError(f"gang {gang}: slot {slot_key} is its last")
        slots = tuple(s for s in r.slice.slots if s.key != slot_key)
        self._remove(gang)
        phase = Phase.BOUND if len(r.bound) == len(slots) else Phase.RESERVED
        r = replace(r, slice=replace(r.slice, slots=slots), phase=phase)
        self._add(r)
        return r

    def unbind(self, gang: str, slot_key: str) -> Reservation:
        r = self._require(gang)
        bound = {k: v for k, v in r.bound.items() if k != slot_key}
        r = replace(r, bound=bound, phase=Phase.RESERVED)
        self._by_gang[gang] = r
        return r

    def release(self, gang: str) -> Reservation | None:
        r = self._remove(gang)
        return replace(r, phase=Phase.RELEASED) if r is not None else None

    def expire(self, now: float, keep: Callable[[Reservation], bool] | None = None) -> list[Reservation]:
        """Drop holds past their TTL that are not fully bound; returns them as Expired.
        ``keep`` spares holds whose lifetime an owner manages (an admitted Workload, a live
        PodGroup): their controller releases them, the clock does not."""
        gone = [
            r
            for r in self._by_gang.values()
            if r.phase != Phase.BOUND and r.expires_at <= now and not (keep and keep(r))
        ]
        for r in gone:
            self._remove(r.gang)
        return [replace(r, phase=Phase.EXPIRED) for r in gone]

    def _among(self, exclude: Iterable[str], nodes: Iterable[str] | None) -> list[Reservation]:
        """The reservations but ``exclude``'s; only those on ``nodes`` when given."""
        skip = set(exclude)
        every = (
            self._by_gang.values() if nodes is None else map(self._by_gang.__getitem__, self.gangs_on(nodes))
        )
        return [r for r in every if r.gang not in skip]

    def held(
        self, exclude: Iterable[str] = (), nodes: Iterable[str] | None = None
    ) -> dict[str, frozenset[int]]:
        """Node -> the GPUs reservations (but ``exclude``'s) hold there; only ``nodes`` when given."""
        wanted = None if nodes is None else set(nodes)
        out: dict[str, set[int]] = {}
        for r in self._among(exclude, wanted):
            for node, gpus in r.slice.held().items():
                if wanted is None or node in wanted:
                    out.setdefault(node, set()).update(gpus)
        return {k: frozenset(v) for k, v in out.items()}

    def held_requests(
        self, snapshot: ClusterSnapshot, exclude: Iterable[str] = (), nodes: Iterable[str] | None = None
    ) -> dict[str, Resources]:
        """Node -> what reservations hold of it besides GPUs: the requests of the slots no pod
        is bound to yet (one pod slot each; a bound pod's requests are its node's own from then
        on), and the IMEX daemon pod's room on each multi-node NVLink node of a slice whose
        ComputeDomain does not run there yet (the driver's label names no domain of the gang;
        once it does, the daemon is one of the node's pods). Only ``nodes`` when given."""
        wanted = None if nodes is None else set(nodes)
        out: dict[str, Resources] = {}
        for r in self._among(exclude, wanted):
            for s in r.slice.slots:
                if s.key not in r.bound and (wanted is None or s.node in wanted):
                    out[s.node] = out.get(s.node, NOTHING).plus(usage(s.requests))
            for name in r.slice.mnnvl_nodes:
                if wanted is not None and name not in wanted:
                    continue
                if snapshot.has_node(name) and snapshot.node(name).mnnvl_gang != r.gang:
                    node = snapshot.node(name)
                    out[name] = with_imex_daemon(out.get(name), node.facts)
        return out

    def mnnvl(self, exclude: Iterable[str] = (), nodes: Iterable[str] | None = None) -> dict[str, str]:
        """Node -> the gang whose reservation (not ``exclude``'s) holds its NVLink (IMEX)
        channel; only ``nodes`` when given."""
        wanted = None if nodes is None else set(nodes)
        return {
            n: r.gang
            for r in self._among(exclude, wanted)
            for n in r.slice.mnnvl_nodes
            if wanted is None or n in wanted
        }

    def view(self, snapshot: ClusterSnapshot, exclude: Iterable[str] = ()) -> ClusterSnapshot:
        """The snapshot a solver sees: every reservation's GPUs (but ``exclude``'s) taken out,
        and what their unbound pods request of their nodes counted as requested there.
        Bound slots' GPUs are held too; once the pod shows up as allocated it is simply taken twice."""
        ex = list(exclude)
        return hold_requests(
            snapshot.with_held(self.held(ex), self.mnnvl(ex)), self.held_requests(snapshot, ex)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"ttlSeconds": self.ttl_s, "reservations": [r.to_dict() for r in self._by_gang.values()]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ledger:
        """Rebuild a ledger. Entries are restored in order; one that cannot be read, repeats a
        gang already restored, or conflicts with one restored before it is left out and
        listed in the new ledger's :attr:`skipped`, and the rest still come back."""
        ledger = cls(float(d.get("ttlSeconds", DEFAULT_TTL_S)))
        skipped: list[Skipped] = []
        for k, item in enumerate(d.get("reservations", ())):
            try:
                r = Reservation.from_dict(item)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                gang = str(item.get("gang", f"#{k}")) if isinstance(item, Mapping) else f"#{k}"
                skipped.append(Skipped(gang, f"entry {k} cannot be read: {type(exc).__name__}: {exc}"))
                continue
            if r.gang in ledger._by_gang:
                skipped.append(Skipped(r.gang, f"entry {k} repeats gang {r.gang}; the first one is kept"))
                continue
            try:
                ledger.restore(r)
            except LedgerError as exc:
                skipped.append(Skipped(r.gang, f"entry {k}: {exc}"))
        ledger.skipped = tuple(skipped)
        return ledger

    def restore(self, r: Reservation) -> None:
        """Put back a persisted reservation (after a restart). The same gang twice keeps the
        first; one that overlaps GPUs or NVLink channels of a reservation already restored
        raises LedgerError and is not restored, so nothing is ever double-booked."""
        if r.gang in self._by_gang or r.phase in (Phase.RELEASED, Phase.EXPIRED):
            return
        clash = self._conflict(r.slice)
        if clash is not None:
            raise LedgerError(f"gang {r.gang}: persisted reservation conflicts with another: {clash}")
        self._add(r)

    def _require(self, gang: str) -> Reservation:
        r = self._by_gang.get(gang)
        if r is None:
            raise LedgerError(f"gang {gang}: no reservation")
        return r


def _nodes_of(sl: Slice) -> tuple[str, ...]:
    """The nodes a slice holds something on: its slots' and its NVLink (IMEX) channels'."""
    return (*sl.nodes, *(n for n in sl.mnnvl_nodes if n not in sl.nodes))


def hold_requests(
    view: ClusterSnapshot, held: Mapping[str, Resources], base: ClusterSnapshot | None = None
) -> ClusterSnapshot:
    """``view`` with ``held`` added to what each node's pods request, on the nodes that report
    what they can hold (elsewhere nothing limits, and the node states stay as they are).
    ``base``: the snapshot whose node states are the unheld ones (default ``view``'s own)."""
    base = base or view
    states: dict[str, NodeState] = {}
    for name, extra in held.items():
        if not base.has_node(name):
            continue
        node = base.node(name)
        if node.facts.allocatable.reported:
            facts = replace(node.facts, requested=node.facts.requested.plus(extra))
            states[name] = replace(node, facts=facts)
    return view.updated(states) if states else view
