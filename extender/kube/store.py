"""Where reservations persist, so a restart rebuilds the same ledger.

Every store keeps reservations as ``SliceReservation`` objects (see
:mod:`extender.kube.crd_models`): the in-memory store for file mode and tests, the
Kubernetes store in a cluster. ``save`` creates or updates the object and writes its status
(phase, bound pods, nodes, GPUs), ``delete`` forgets (a missing object is not an error),
``load`` returns everything persisted. The ledger is rebuilt from spec alone; status is for
people and kubectl.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from extender.kube.api import JSON_PATCH, SLICE_RESERVATIONS, Conflict, KubeClient, NotFound
from extender.kube.crd_models import (
    CrdError,
    reservation_from_object,
    reservation_object,
    reservation_status,
)
from extender.placement.ledger import Reservation

log = logging.getLogger(__name__)

_Ref = tuple[str, str]


class ReservationStore(Protocol):
    async def save(self, r: Reservation) -> None: ...

    async def delete(self, r: Reservation) -> None: ...

    async def load(self) -> list[Reservation]: ...


def _ref(obj: dict[str, Any]) -> _Ref:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


class InMemoryReservationStore:
    """SliceReservation objects (spec and status) in a dict, keyed (namespace, name)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.objects: dict[_Ref, dict[str, Any]] = {}
        self.writes = 0
        self.clock = clock

    async def save(self, r: Reservation) -> None:
        obj = reservation_object(r)
        ref = _ref(obj)
        previous = self.objects.get(ref, {}).get("status")
        obj["status"] = reservation_status(r, self.clock(), previous)
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
        #: Objects known to exist: updated with a patch first, created only when missing.
        self._exists: set[_Ref] = set()
        #: The status last written to each object: an unchanged one is not written again.
        self._status: dict[_Ref, dict[str, Any]] = {}

    async def save(self, r: Reservation) -> None:
        """Write spec, then status; an error from either propagates (the cache retries)."""
        obj = reservation_object(r)
        ref = _ref(obj)
        await self._write_spec(ref, obj)
        await self._write_status(ref, r)

    async def _write_spec(self, ref: _Ref, obj: dict[str, Any]) -> None:
        if ref in self._exists:
            try:
                await self._patch(ref, "spec", obj["spec"])
                return
            except NotFound:
                self._exists.discard(ref)
                self._status.pop(ref, None)
        try:
            await self.api.create(SLICE_RESERVATIONS, obj)
        except Conflict:
            await self._patch(ref, "spec", obj["spec"])
        self._exists.add(ref)

    async def _write_status(self, ref: _Ref, r: Reservation) -> None:
        previous = self._status.get(ref)
        status = reservation_status(r, self.clock(), previous)
        if status == previous:
            return
        # A whole-status replace: a merge patch would keep boundPods of slots freed since.
        await self._patch(ref, "status", status)
        self._status[ref] = status

    async def _patch(self, ref: _Ref, member: str, value: dict[str, Any]) -> None:
        """Set a whole top-level member (a merge patch would keep unbound slots)."""
        body = [{"op": "add", "path": f"/{member}", "value": dict(value)}]
        sub = "status" if member == "status" else ""
        await self.api.patch(
            SLICE_RESERVATIONS, ref[1], body, namespace=ref[0], subresource=sub, patch_type=JSON_PATCH
        )

    async def delete(self, r: Reservation) -> None:
        ref = _ref(reservation_object(r))
        self._exists.discard(ref)
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
