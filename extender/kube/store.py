"""Where reservations persist, so a restart rebuilds the same ledger.

The store is the only writer of ``SliceReservation`` objects (see
:mod:`extender.kube.crd_models`), spec and status alike, for plain gangs, Workloads and
PodGroups: the controllers and the extender change the cluster cache's ledger, and the cache
hands each change to the store. ``save`` creates or updates the object and writes its
status (phase, bound pods, nodes, GPUs), ``delete`` forgets (a missing object is not an
error), ``load`` returns everything persisted. The ledger is rebuilt from spec alone;
status is for people and kubectl.

:class:`KubeReservationStore` writes with server-side apply as the one field manager
``gangslice`` (forced): the object (metadata, owner reference, spec) on the main resource,
then the status on its subresource, each only when it differs from what this store last
wrote. The CRD declares ``spec.bound``, ``spec.meta`` and ``status.boundPods`` atomic maps,
so an apply sets each whole: a freed slot's entry goes, whoever wrote the map before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from extender.kube import names
from extender.kube.api import SLICE_RESERVATIONS, KubeClient, KubeError, NotFound
from extender.kube.crd_models import (
    CrdError,
    reservation_from_object,
    reservation_object,
    reservation_status,
)
from extender.kube.devices import DeviceMismatch
from extender.placement.ledger import Reservation

log = logging.getLogger(__name__)

_Ref = tuple[str, str]


class ReservationStore(Protocol):
    async def save(self, r: Reservation, mismatches: Sequence[DeviceMismatch] = ()) -> None:
        """Write ``r``'s object; raises :class:`StatusNotSaved` when only its status failed.
        ``mismatches``: its pods the kubelet reports on other GPUs (a status condition)."""
        ...

    async def save_object(self, r: Reservation) -> None:
        """Write ``r``'s object alone (metadata, owner, spec: what a restart rebuilds the
        ledger from), not its status; the next :meth:`save` writes that."""
        ...

    async def delete(self, r: Reservation) -> None: ...

    async def load(self) -> list[Reservation]: ...


class StatusNotSaved(Exception):
    """The object was written, its status was not (the cache retries the status later)."""


def owner_reference_of(r: Reservation) -> dict[str, Any] | None:
    """The ``ownerReferences`` entry of the object ``r`` was made for (a Workload, a
    PodGroup; from its meta), or None for a plain gang's reservation."""
    meta = r.meta
    kind, name = meta.get(names.META_OWNER_KIND), meta.get(names.META_OWNER_NAME)
    api_version = meta.get(names.META_OWNER_API_VERSION)
    if not (kind and name and api_version):
        return None
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": meta.get(names.META_OWNER_UID, ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def reservation_manifest(r: Reservation, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The SliceReservation (without status) the store applies for ``r``: its namespace and
    name from its meta, owned by ``owner`` (an ``ownerReferences`` entry; by default the
    object its meta names)."""
    obj = reservation_object(r)
    labels = dict(obj["metadata"].get("labels") or {})
    owner = dict(owner) if owner is not None else owner_reference_of(r)
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [owner]
        labels[names.OWNER_KIND_LABEL] = names.label_value(str(owner["kind"]).lower())
        labels[names.OWNER_NAME_LABEL] = names.label_value(str(owner["name"]))
    labels[names.GANG] = names.label_value(str(labels.get(names.GANG) or obj["metadata"]["name"]))
    obj["metadata"]["labels"] = labels
    return obj


def status_manifest(obj: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The apply body of the status subresource of ``obj``."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": copy.deepcopy(dict(status)),
    }


def _ref(obj: Mapping[str, Any]) -> _Ref:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


class InMemoryReservationStore:
    """SliceReservation objects (spec and status) in a dict, keyed (namespace, name)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.objects: dict[_Ref, dict[str, Any]] = {}
        self.writes = 0
        self.clock = clock

    async def save(self, r: Reservation, mismatches: Sequence[DeviceMismatch] = ()) -> None:
        obj = reservation_manifest(r)
        ref = _ref(obj)
        previous = self.objects.get(ref, {}).get("status")
        obj["status"] = reservation_status(r, self.clock(), previous, mismatches)
        self.objects[ref] = copy.deepcopy(obj)
        self.writes += 1

    async def save_object(self, r: Reservation) -> None:
        obj = reservation_manifest(r)
        ref = _ref(obj)
        previous = self.objects.get(ref, {}).get("status")
        if previous is not None:
            obj["status"] = previous
        self.objects[ref] = copy.deepcopy(obj)
        self.writes += 1

    async def delete(self, r: Reservation) -> None:
        self.objects.pop(_ref(reservation_object(r)), None)
        self.writes += 1

    async def load(self) -> list[Reservation]:
        return [reservation_from_object(o) for o in self.objects.values()]


class KubeReservationStore:
    """SliceReservation objects in the API server, written through the one client."""

    def __init__(self, api: KubeClient, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.clock = clock
        #: The object (without status) last applied to each ref: an unchanged one is not sent.
        self._applied: dict[_Ref, dict[str, Any]] = {}
        #: The status last written to each object: an unchanged one is not written again.
        self._status: dict[_Ref, dict[str, Any]] = {}

    async def save(self, r: Reservation, mismatches: Sequence[DeviceMismatch] = ()) -> None:
        """Apply the object, then its status; an error from the object's write propagates,
        one from the status's becomes :class:`StatusNotSaved` (the cache retries either)."""
        obj, ref = await self._save_object(r)
        previous = self._status.get(ref)
        status = reservation_status(r, self.clock(), previous, mismatches)
        if status == previous:
            return
        try:
            await self.api.apply(SLICE_RESERVATIONS, status_manifest(obj, status), subresource="status")
        except KubeError as exc:
            raise StatusNotSaved(f"SliceReservation {ref[0]}/{ref[1]} status: {exc}") from exc
        self._status[ref] = status

    async def save_object(self, r: Reservation) -> None:
        await self._save_object(r)

    async def _save_object(self, r: Reservation) -> tuple[dict[str, Any], _Ref]:
        obj = reservation_manifest(r)
        ref = _ref(obj)
        if self._applied.get(ref) != obj:
            got = await self.api.apply(SLICE_RESERVATIONS, obj)
            if _foreign_owners(got, obj):
                # Left from an earlier hold by a writer that is not this field manager (an
                # older gangslice): its owner reference is not ours to drop by apply.
                log.warning("replacing SliceReservation %s/%s left from an earlier hold", *ref)
                await self._delete(ref)
                await self.api.apply(SLICE_RESERVATIONS, obj)
            self._applied[ref] = obj
        return obj, ref

    async def delete(self, r: Reservation) -> None:
        await self._delete(_ref(reservation_object(r)))

    async def _delete(self, ref: _Ref) -> None:
        self._applied.pop(ref, None)
        self._status.pop(ref, None)
        with contextlib.suppress(NotFound):
            await self.api.delete(SLICE_RESERVATIONS, ref[1], ref[0])

    async def load(self) -> list[Reservation]:
        listing = await self.api.list(SLICE_RESERVATIONS)
        out = []
        for obj in listing.items:
            try:
                out.append(reservation_from_object(obj))
            except CrdError as exc:
                log.warning("ignoring %s", exc)
        return out


def _foreign_owners(got: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    have = {str(o.get("uid")) for o in (got.get("metadata") or {}).get("ownerReferences") or ()}
    want = {str(o.get("uid")) for o in wanted["metadata"].get("ownerReferences") or ()}
    return bool(have - want)
