"""Reservations owned by a Kubernetes object (a PodGroup, a Workload): hold one in the cache's
ledger, persist it as a SliceReservation owned by that object (spec, then status; later binds
rewrite both through the cache's store), and post Events about it.
Shared by the Kueue check controller, the PodGroup controller (each for lone and joint gangs)
and the plain-gang reporter (Events only)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from extender.controllers.objects import (
    META_OWNER_KIND,
    META_OWNER_NAME,
    META_OWNER_UID,
    object_ref,
    owner_reference,
    reservation_from_object,
    reservation_to_object,
    rfc3339,
)
from extender.kube import names
from extender.kube.api import ApiError, Conflict, NotFound
from extender.kube.crd_models import CrdError, object_name, reservation_status
from extender.logs import fields
from extender.placement.ledger import Phase, Reservation
from extender.placement.slice import Slice

log = logging.getLogger(__name__)


class EventApi(Protocol):
    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


class OwnedApi(EventApi, Protocol):
    async def get_reservation(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_reservation(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    async def apply_reservation_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...

    async def delete_reservation(self, namespace: str, name: str) -> None: ...


class Holds(Protocol):
    def restore(self, r: Reservation) -> bool: ...

    def drop(self, gang: str) -> Reservation | None: ...


def hold_all(cache: Holds, rs: Iterable[Reservation]) -> bool:
    """Hold every reservation of ``rs`` in the cache's ledger, or none: when one does not fit,
    those already held are dropped again. Call it under the cache's lock."""
    done: list[str] = []
    for r in rs:
        if not cache.restore(r):
            for gang in done:
                cache.drop(gang)
            return False
        done.append(r.gang)
    return True


def owned_reservation(sl: Slice, owner: Mapping[str, Any], expires_at: float) -> Reservation:
    """A fresh hold of ``sl`` whose meta names ``owner`` (restore it into the cache's ledger)."""
    ns, name = object_ref(owner)
    return Reservation(
        gang=sl.gang,
        slice=sl,
        expires_at=expires_at,
        phase=Phase.RESERVED,
        meta={
            "namespace": ns,
            "name": object_name(sl.gang),
            "ownerApiVersion": str(owner.get("apiVersion") or ""),
            META_OWNER_KIND: str(owner.get("kind") or ""),
            META_OWNER_NAME: name,
            META_OWNER_UID: str((owner.get("metadata") or {}).get("uid") or ""),
        },
    )


def owned_by(r: Reservation, owner: Mapping[str, Any] | None) -> bool:
    """Whether ``owner`` (None: not found) is the very object ``r`` was made for (same UID),
    not a later one of the same name."""
    uid = str(((owner or {}).get("metadata") or {}).get("uid", ""))
    return owner is not None and uid == r.meta.get(META_OWNER_UID, "")


async def persist(api: OwnedApi, r: Reservation, owner: Mapping[str, Any], now: float) -> bool:
    """Create the SliceReservation of ``r`` owned by ``owner`` (an object left from an earlier
    hold of the same gang is replaced), then write its status. False when the object could not
    be written; a failed status write is only logged (the cache's store writes it again on the
    next bind)."""
    ns, _ = object_ref(owner)
    name = object_name(r.gang)
    if not await _create(api, r, ns, name, owner, now):
        return False
    try:
        await api.apply_reservation_status(ns, name, status_body(r, ns, name, now))
    except ApiError as exc:
        log.warning(
            "SliceReservation %s/%s status: %s",
            ns,
            name,
            exc,
            extra=fields(gang=r.gang, reservation=f"{ns}/{name}"),
        )
    return True


async def _create(
    api: OwnedApi, r: Reservation, ns: str, name: str, owner: Mapping[str, Any], now: float
) -> bool:
    obj = reservation_to_object(r, ns, name, owner_reference(owner), now)
    where = fields(gang=r.gang, reservation=f"{ns}/{name}")
    try:
        await api.create_reservation(obj)
        return True
    except Conflict:
        pass
    except ApiError as exc:
        log.warning("creating SliceReservation %s/%s failed: %s", ns, name, exc, extra=where)
        return False
    try:
        existing = reservation_from_object(await api.get_reservation(ns, name))
        if existing.gang == r.gang and existing.slice.to_dict() == r.slice.to_dict():
            return True
        log.warning("replacing SliceReservation %s/%s left from an earlier hold", ns, name, extra=where)
        await delete_object(api, existing)
        await api.create_reservation(obj)
        return True
    except (ApiError, CrdError) as exc:
        log.warning("SliceReservation %s/%s: %s", ns, name, exc, extra=where)
        return False


def status_body(r: Reservation, ns: str, name: str, now: float) -> dict[str, Any]:
    """The server-side apply body that sets the status of ``r``'s SliceReservation."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": "SliceReservation",
        "metadata": {"name": name, "namespace": ns},
        "status": reservation_status(r, now),
    }


async def delete_object(api: OwnedApi, r: Reservation) -> None:
    ns = r.meta.get("namespace") or r.gang.split("/", 1)[0]
    name = r.meta.get("name") or object_name(r.gang)
    try:
        await api.delete_reservation(ns, name)
    except NotFound:
        pass
    except ApiError as exc:
        log.warning(
            "deleting SliceReservation %s/%s failed: %s",
            ns,
            name,
            exc,
            extra=fields(gang=r.gang, reservation=f"{ns}/{name}"),
        )


async def post_event(
    api: EventApi,
    obj: Mapping[str, Any],
    kind: str,
    reason: str,
    message: str,
    now: float,
    identity: str,
    component: str = names.EVENT_COMPONENT,
) -> None:
    """A core/v1 Event about ``obj`` (a PodGroup, a Pod, a Workload) from ``component`` (the
    ``reportingComponent``); failures are logged."""
    meta = obj.get("metadata") or {}
    ns, name = object_ref(obj)
    stamp = rfc3339(now)
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": ns},
        "involvedObject": {
            "apiVersion": str(obj.get("apiVersion") or "v1"),
            "kind": str(obj.get("kind") or ""),
            "name": name,
            "namespace": ns,
            "uid": str(meta.get("uid") or ""),
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "gangslice"},
        "reportingComponent": component,
        "reportingInstance": identity,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        await api.create_event(ns, event)
    except ApiError as exc:
        log.debug("event for %s/%s: %s", ns, name, exc)
