"""Reservations owned by a Kubernetes object (a PodGroup, a Workload): the reservation a
controller holds for it (its meta names the owner, so the cache's store writes the
SliceReservation owned by that object), whether an object is still that owner, and Events.
Shared by the Kueue check controller, the PodGroup controller (each for lone and joint gangs)
and the plain-gang reporter (Events only)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from extender.controllers.objects import (
    META_OWNER_KIND,
    META_OWNER_NAME,
    META_OWNER_UID,
    object_ref,
)
from extender.kube import events, names
from extender.kube.api import EVENTS, KubeClient, KubeError
from extender.kube.crd_models import object_name
from extender.kube.events import ObjectRef
from extender.placement.ledger import Reservation
from extender.reservations.reserve import Claim
from extender.reservations.store import ReservationRef

log = logging.getLogger(__name__)


def owner_claim(gang: str, owner: Mapping[str, Any], expires_at: float, **extra: str) -> Claim:
    """What a controller reserves for ``owner`` (a Workload, a PodGroup): the hold's meta
    names it, so the store writes the SliceReservation in its namespace, owned by it."""
    ns, name = object_ref(owner)
    meta = {
        "namespace": ns,
        "name": object_name(gang),
        names.META_OWNER_API_VERSION: str(owner.get("apiVersion") or ""),
        META_OWNER_KIND: str(owner.get("kind") or ""),
        META_OWNER_NAME: name,
        META_OWNER_UID: str((owner.get("metadata") or {}).get("uid") or ""),
        **extra,
    }
    return Claim(gang, meta, expires_at)


def owned_by(r: Reservation, owner: Mapping[str, Any] | None) -> bool:
    """Whether ``owner`` (None: not found) is the very object ``r`` was made for (same UID),
    not a later one of the same name."""
    uid = str(((owner or {}).get("metadata") or {}).get("uid", ""))
    return owner is not None and uid == ReservationRef.of(r).owner_uid


async def post_event(
    api: KubeClient,
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
    about = ObjectRef(
        str(obj.get("apiVersion") or "v1"), str(obj.get("kind") or ""), name, ns, str(meta.get("uid") or "")
    )
    event = events.event(about, reason, message, now, type=kind, component=component, instance=identity)
    try:
        await api.create(EVENTS, event)
    except KubeError as exc:
        log.debug("event for %s/%s: %s", ns, name, exc)
