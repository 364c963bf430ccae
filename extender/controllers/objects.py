"""SliceReservation objects for reservations the controller makes for a Workload or PodGroup.

The spec format is :func:`extender.kube.crd_models.reservation_object`'s (the ledger's
``Reservation.to_dict()``), so the cluster cache and this controller read each other's
objects; this module adds what an owned reservation needs on top: the owner reference
(``controller: true``, so deleting the gang's Workload deletes its reservation), a label
for the owner, and a ``status`` mirror (phase, bound pods, nodes, GPU count, a condition).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from extender.kube import names
from extender.kube.crd_models import reservation_from_object, reservation_status, rfc3339
from extender.placement.ledger import Reservation
from extender.reservations.store import reservation_manifest

__all__ = [
    "object_ref",
    "reservation_from_object",
    "reservation_status",
    "reservation_to_object",
    "rfc3339",
]

#: Meta keys (``Reservation.meta``) this controller keeps with a reservation.
META_OWNER_KIND = names.META_OWNER_KIND
META_OWNER_NAME = names.META_OWNER_NAME
META_OWNER_UID = names.META_OWNER_UID
#: When the owner's quota was reserved (Kueue's QuotaReserved transition time): a reservation
#: made for an earlier admission attempt is stale once the Workload has been requeued.
META_ATTEMPT = "attempt"


def parse_rfc3339(text: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 string (or a datetime, as a typed client gives
    it); None for anything else."""
    if isinstance(text, datetime):
        return text.timestamp()
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("z", "Z")).timestamp()
    except ValueError:
        return None


def object_ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    """An object's (namespace, name); the namespace defaults to ``default``."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def reservation_to_object(
    r: Reservation, namespace: str, name: str, owner: Mapping[str, Any] | None, now: float | None = None
) -> dict[str, Any]:
    """The SliceReservation the cache's store writes for ``r`` as ``namespace/name``, owned by
    ``owner`` (an ``ownerReferences`` entry, or None), with its status: what an earlier
    process left, for a restart to rebuild from."""
    held = Reservation(
        r.gang, r.slice, r.expires_at, r.bound, r.phase, {**r.meta, "namespace": namespace, "name": name}
    )
    obj = reservation_manifest(held, owner)
    obj["status"] = reservation_status(held, now if now is not None else r.expires_at)
    return obj
