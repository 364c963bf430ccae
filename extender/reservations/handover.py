"""Holds kept for someone else: what a migration reserves before it evicts anything.

Carrying out a migration plan (:mod:`extender.controllers.migration`) first holds the waiting
gang's slice and each moved replica's new slot. Neither is the gang's or the replica's own
reservation yet, so each names in its meta (``heldFor``) whom it is kept for:

- ``gang:<key>``: the slice, for the gang's reserve path. That path sees through the hold and
  drops it in the same step as it holds the gang's own reservation
  (:func:`~extender.reservations.reserve.reserve_all`), wherever the solver then places it.
- ``owner:<uid>``: one slot for the next pod of that controller (the ReplicaSet of the evicted
  replica). Its replacement is that hold's pod (:meth:`ReservationBook.gang_of`), binds to the
  slot's GPUs, and the hold ends once the watch shows the pod there.

Both lapse with the ledger's TTL when nobody comes for them, and are written like any
reservation, so a restart keeps them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from extender.kube import names
from extender.kube.crd_models import gang_namespace, object_name
from extender.kube.pods import PodInfo
from extender.placement.ledger import Phase, Reservation
from extender.placement.migration import Drain
from extender.placement.request import GangRequest
from extender.placement.slice import PodSlot, Slice

GANG = "gang:"
OWNER = "owner:"


def for_gang(gang: str) -> str:
    return GANG + gang


def for_owner(uid: str) -> str:
    return OWNER + uid


def owner_of(pod: PodInfo) -> str | None:
    """Whom a hold for this pod's replacement is kept for: its controller (None without one:
    a bare pod has no replacement)."""
    return for_owner(pod.controller[3]) if pod.controller is not None and pod.controller[3] else None


def held_for(r: Reservation) -> str | None:
    return r.meta.get(names.META_HELD_FOR) or None


def _hold(key: str, name: str, who: str, sl: Slice, expires_at: float) -> Reservation:
    ns = gang_namespace(key)
    meta = {"namespace": ns, "name": object_name(f"{ns}/{name}"), names.META_HELD_FOR: who}
    return Reservation(key, dataclasses.replace(sl, gang=key), expires_at, {}, Phase.RESERVED, meta)


def drain_holds(
    plan: Drain, gang: GangRequest, movers: Mapping[str, PodInfo], expires_at: float
) -> list[Reservation] | None:
    """The holds that carry ``plan`` out, lapsing at ``expires_at``: the gang's slice (later by
    the longest grace period the moved replicas have to stop), and one new slot per moved
    replica (``movers``: pod key -> pod). None when a mover has no controller to replace it."""
    ns, obj = gang_namespace(gang.name), object_name(gang.name)
    stop_s = max((movers[m.gang].grace_s for m in plan.moves), default=0.0)
    out = [_hold(f"{ns}/drain:{obj}", f"drain-{obj}", for_gang(gang.name), plan.slice, expires_at + stop_s)]
    for move in plan.moves:
        pod = movers[move.gang]
        who = owner_of(pod)
        if who is None:
            return None
        ps = pod.alone()
        slots: Sequence[PodSlot] = [dataclasses.replace(s, requests=ps.requests) for s in move.slots]
        sl = Slice(move.gang, tuple(slots), {}, domains={ps.name: f"node {slots[0].node}"})
        out.append(_hold(f"{pod.namespace}/move:{pod.name}", f"move-{pod.name}", who, sl, expires_at))
    return out
