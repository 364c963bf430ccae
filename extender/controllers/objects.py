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
from extender.kube.crd_models import reservation_from_object, reservation_object, reservation_status, rfc3339
from extender.placement.ledger import Reservation

__all__ = [
    "object_ref",
    "owner_reference",
    "reservation_from_object",
    "reservation_status",
    "reservation_to_object",
    "rfc3339",
]

#: Meta keys (``Reservation.meta``) this controller keeps with a reservation.
META_OWNER_KIND = names.META_OWNER_KIND
META_OWNER_NAME = "ownerName"
META_OWNER_UID = "ownerUid"
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


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one (for fields of untrusted objects)."""
    return value if isinstance(value, Mapping) else {}


def object_ref(obj: Mapping[str, Any]) -> tuple[str, str]:
    """An object's (namespace, name); the namespace defaults to ``default``."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def owner_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ownerReferences`` entry that makes ``obj`` (a Workload, a PodGroup) the controller."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": str(obj["apiVersion"]),
        "kind": str(obj["kind"]),
        "name": str(meta["name"]),
        "uid": str(meta.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _label_value(text: str) -> str:
    """A label value: at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:63]
    return cleaned.strip("._-")


def reservation_to_object(
    r: Reservation, namespace: str, name: str, owner: Mapping[str, Any] | None, now: float | None = None
) -> dict[str, Any]:
    """The SliceReservation for ``r``; ``owner`` is an ``ownerReferences`` entry (see
    :func:`owner_reference`) or None for an unowned reservation. ``status`` is included for
    stores that write it; the API server ignores it on create (status subresource)."""
    meta = {k: v for k, v in r.meta.items() if k not in ("namespace", "name")}
    obj = reservation_object(
        Reservation(
            r.gang, r.slice, r.expires_at, r.bound, r.phase, {**meta, "namespace": namespace, "name": name}
        )
    )
    obj["spec"]["meta"] = meta
    labels = dict(obj["metadata"].get("labels") or {})
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [dict(owner)]
        labels[names.OWNER_KIND_LABEL] = _label_value(str(owner["kind"]).lower())
        labels[names.OWNER_NAME_LABEL] = _label_value(str(owner["name"]))
    labels[names.GANG] = _label_value(str(labels.get(names.GANG, name)))
    obj["metadata"]["labels"] = labels
    obj["status"] = reservation_status(r, now if now is not None else r.expires_at)
    return obj
