"""The one reserve path: place a gang on the book's view and hold the slice.

Plain gangs (the extender, on a member's first filter), Volcano PodGroups and Kueue
Workloads (their controllers), alone or as one member of a joint gang, all reserve here
(and a held plain gang whose owner wants one more pod grows here, :func:`grow`)::

    got = await book.hold(request, Claim(gang, meta))   # Reservation | Unplaceable, locked
    await book.persist(gang)                              # the store writes it

The decision is this module's: the view (every other reservation's GPUs taken out, and
whether a gang that asks for a multi-node NVLink clique waits: a gang refused here counts as
waiting until it is placed, :mod:`extender.placement.waiting`), the solver (``place`` unless
the caller brings its own, as the Kueue check does for its waiting stages), the split of a
joint gang's slice into one reservation per member. The book only records:
:meth:`ReservationBook.hold_all` enters the reservations in the ledger, all or none, and queues
them for its store; :meth:`ReservationBook.restore` only puts back what an earlier process
persisted.

``reserve`` is synchronous: call it under the book's lock (``ReservationBook.hold`` and
``deciding`` take it; no other decision on the loop may see the capacity free between
placing and holding).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from extender.kube import names
from extender.kube.crd_models import gang_namespace, object_name
from extender.kube.gangs import Incomplete, plain_gang_request
from extender.kube.owners import OwnerTable
from extender.kube.pods import PodInfo
from extender.logs import fields
from extender.placement.growth import near_slice
from extender.placement.ledger import Ledger, Phase, Reservation
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.placement.waiting import WaitingGangs
from extender.reservations import handover
from extender.reservations.store import ReservationRef

log = logging.getLogger(__name__)

#: Places a request on a view: :func:`~extender.placement.solver.place` by default.
Solver = Callable[[ClusterSnapshot, GangRequest], Placement]
#: Cuts a joint gang's slice into one slice per member gang key.
Split = Callable[[Slice], Mapping[str, Slice]]


@dataclass(frozen=True, slots=True)
class Claim:
    """Whom a reservation is for: its gang key, the meta kept with it (the owner object, for
    a controller's reservation; the store names the SliceReservation and its owner reference
    from it) and when the hold lapses (None: the ledger's TTL from now)."""

    gang: str
    meta: Mapping[str, str] = field(default_factory=dict)
    expires_at: float | None = None


class Reserving(Protocol):
    """What :func:`reserve` needs of :class:`extender.reservations.book.ReservationBook`."""

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def ledger(self) -> Ledger: ...

    def view(self, exclude: Iterable[str] = ()) -> ClusterSnapshot: ...

    def reservation(self, gang: str) -> Reservation | None: ...

    def running_members(self, gang: str) -> int | None: ...

    def hold_all(self, rs: Iterable[Reservation]) -> bool: ...

    def drop(self, gang: str) -> Reservation | None: ...

    def held_for(self, who: str) -> list[str]: ...

    @property
    def waiting(self) -> WaitingGangs: ...


class Growing(Reserving, Protocol):
    """What :func:`grow` needs besides: a slot added to a held reservation."""

    def add_slot(self, gang: str, slot: PodSlot) -> Reservation: ...


def reserve(
    cache: Reserving, request: GangRequest, claim: Claim, *, solve: Solver | None = None
) -> Reservation | Unplaceable:
    """Reserve a slice for one gang; an existing reservation of ``claim.gang`` is returned as
    is. Raises ValueError for a request the solver cannot read (an unknown level name)."""
    existing = cache.reservation(claim.gang)
    if existing is not None:
        return existing
    if request.name != claim.gang:
        request = dataclasses.replace(request, name=claim.gang)
    request_or_why = _less_bound_members(cache, claim.gang, request)
    if isinstance(request_or_why, Unplaceable):
        return request_or_why
    got = reserve_all(cache, request_or_why, [claim], solve=solve)
    return got if isinstance(got, Unplaceable) else got[0]


def reserve_pinned_gang(
    cache: Reserving, pod: PodInfo, peers: Iterable[PodInfo], owners: OwnerTable
) -> Reservation | Unplaceable | Incomplete | None:
    """Reserve the plain gang of ``pod`` (DRA: its slots' ResourceClaims pin them) from the pod
    and the others of its gang seen (``peers``); a held one is returned as is. None when the
    pod says no size, Incomplete until a pod of every pod set was seen. Raises PodError for a
    pod whose pod set cannot be read, LevelError for an unknown level."""
    assert pod.gang is not None
    request = plain_gang_request(pod, peers, owners)
    if request is None or isinstance(request, Incomplete):
        return request
    return reserve(cache, request, Claim(pod.gang, {names.META_SLOT_CLAIMS: "true"}))


def reserve_all(
    cache: Reserving,
    request: GangRequest,
    claims: Iterable[Claim],
    *,
    split: Split | None = None,
    solve: Solver | None = None,
) -> list[Reservation] | Unplaceable:
    """Reserve one slice for ``request`` and hold it as one reservation per claim, all or
    none: a joint gang's members (``split`` cuts the slice by member gang key), or one gang.
    Members' existing reservations are left out of the view (a re-placement replaces them)."""
    by_gang = {c.gang: c for c in claims}
    # A migration's hold of a slice for this gang (:mod:`~extender.reservations.handover`) is
    # the gang's to take: seen through, and dropped as the gang's own is held.
    kept = [h for g in dict.fromkeys((request.name, *by_gang)) for h in cache.held_for(handover.for_gang(g))]
    view = cache.view([*by_gang, *kept])
    if request.gpus > view.total_gpus:
        return Unplaceable(
            request.name,
            f"the gang needs {request.gpus} GPUs; the cluster has {view.total_gpus}",
            feasible_when_empty=False,
        )
    now = cache.clock()
    view = cache.waiting.view(view, now, exclude=[request.name, *by_gang])
    cache.waiting.asked(view, request, now)
    result = (solve or place)(view, request)
    if not isinstance(result, Slice):
        if result.feasible_when_empty:
            claim = by_gang.get(request.name)
            cache.waiting.refused(view, request, now, claim.meta if claim is not None else None)
        return result
    for gang in (request.name, *by_gang):
        cache.waiting.placed(gang)
    result = _holding_requests(result, request)
    parts = split(result) if split is not None else {request.name: result}
    rs = []
    for gang, part in parts.items():
        claim = by_gang[gang]
        meta = {"namespace": gang_namespace(gang), "name": object_name(gang), **claim.meta}
        expires = claim.expires_at if claim.expires_at is not None else now + cache.ledger.ttl_s
        rs.append(Reservation(gang, part, expires, {}, Phase.RESERVED, meta))
    dropped = [r for r in map(cache.drop, kept) if r is not None]
    if not cache.hold_all(rs):
        cache.hold_all(dataclasses.replace(r, phase=Phase.RESERVED) for r in dropped)
        return Unplaceable(request.name, "the slice was taken while it was being reserved")
    for r in rs:
        log.info(
            "reserved %d pods on %s, %.1f us/layer",
            len(r.slice.slots),
            ",".join(r.slice.nodes),
            r.slice.per_layer_micros,
            extra=fields(gang=r.gang, reservation=str(ReservationRef.of(r))),
        )
    return rs


def grow(
    cache: Growing, r: Reservation, ps: PodSet, count: int = 1, *, solve: Solver | None = None
) -> Reservation | Unplaceable:
    """Hold ``count`` more slots for pod set ``ps`` of the held gang ``r``, all or none (its
    owner wants more pods, a rolling update's surge pod came, or a pod set the slice lacks
    appeared), as near the slice as there is room
    (:func:`~extender.placement.growth.near_slice`). Raises LevelError for an unknown level."""
    view = cache.view()
    unit = GangRequest(r.gang, (dataclasses.replace(ps, count=count, colocate_with=None),))
    taken = [s.index for s in r.slice.slots if s.pod_set == ps.name]
    first = max(taken, default=-1) + 1
    for nodes in near_slice(view, r.slice, ps):
        got = (solve or place)(view.only(nodes), unit)
        if isinstance(got, Slice):
            grown = r
            for i, slot in enumerate(got.slots):
                slot = dataclasses.replace(slot, index=first + i, requests=ps.requests)
                grown = cache.add_slot(r.gang, slot)
            log.info(
                "pod set %s grew to %d pods: %s",
                ps.name,
                len(taken) + count,
                ", ".join(f"slot {s.pod_set}/{first + i} on {s.node}" for i, s in enumerate(got.slots)),
                extra=fields(gang=r.gang, reservation=str(ReservationRef.of(grown))),
            )
            return grown
    where = "its required domain" if ps.required_level else "the cluster"
    what = "one more pod" if count == 1 else f"{count} more pods"
    return Unplaceable(r.gang, f"no room for {what} of pod set {ps.name} in {where}", ps.name)


def _holding_requests(result: Slice, request: GangRequest) -> Slice:
    """The slice with each slot carrying its pod set's requests, which the reservation holds
    on the slot's node until its pod binds (the ledger counts them as requested there)."""
    by_set = {ps.name: ps.requests for ps in request.pod_sets}
    slots = tuple(dataclasses.replace(s, requests=by_set.get(s.pod_set, s.requests)) for s in result.slots)
    return dataclasses.replace(result, slots=slots)


def _less_bound_members(cache: Reserving, gang: str, request: GangRequest) -> GangRequest | Unplaceable:
    """A plain gang placed again (its hold expired before every member bound) whose members
    already run: place only the members still to come, so the new hold is one the remaining
    pods can fill."""
    if len(request.pod_sets) != 1:
        return request
    running = cache.running_members(gang)
    if not running:
        return request
    ps = request.pod_sets[0]
    if running >= ps.count:
        return Unplaceable(gang, f"all {ps.count} pods of gang {gang} are already bound", ps.name)
    log.info(
        "gang %s: %d of %d pods already bound; placing the other %d",
        gang,
        running,
        ps.count,
        ps.count - running,
        extra=fields(gang=gang),
    )
    return dataclasses.replace(request, pod_sets=(dataclasses.replace(ps, count=ps.count - running),))
