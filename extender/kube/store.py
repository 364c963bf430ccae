"""Where reservations persist, so a restart rebuilds the same ledger.

Every store keeps reservations as ``SliceReservation`` objects (see
:mod:`extender.kube.crd_models`): the in-memory store for file mode and tests, the
Kubernetes store in a cluster. ``save`` creates or updates, ``delete`` forgets (a missing
object is not an error), ``load`` returns everything persisted.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any, Protocol

from extender.kube.api import Conflict, Kind, KubeApi, NotFound
from extender.kube.crd_models import CrdError, reservation_from_object, reservation_object
from extender.placement.ledger import Reservation


class ReservationStore(Protocol):
    async def save(self, r: Reservation) -> None: ...

    async def delete(self, r: Reservation) -> None: ...

    async def load(self) -> list[Reservation]: ...


def _ref(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


class InMemoryReservationStore:
    """SliceReservation objects in a dict, keyed (namespace, name)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0

    async def save(self, r: Reservation) -> None:
        obj = reservation_object(r)
        self.objects[_ref(obj)] = copy.deepcopy(obj)
        self.writes += 1

    async def delete(self, r: Reservation) -> None:
        self.objects.pop(_ref(reservation_object(r)), None)
        self.writes += 1

    async def load(self) -> list[Reservation]:
        return [reservation_from_object(o) for o in self.objects.values()]


class KubeReservationStore:
    """SliceReservation objects in the API server, written through :class:`KubeApi` in a thread."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        #: Objects known to exist: updated with a patch first, created only when missing.
        self._exists: set[tuple[str, str]] = set()

    async def save(self, r: Reservation) -> None:
        obj = reservation_object(r)
        ref = _ref(obj)
        if ref in self._exists:
            try:
                await asyncio.to_thread(self.api.patch_reservation_spec, *ref, obj["spec"])
                return
            except NotFound:
                self._exists.discard(ref)
        try:
            await asyncio.to_thread(self.api.create_reservation, obj)
        except Conflict:
            await asyncio.to_thread(self.api.patch_reservation_spec, *ref, obj["spec"])
        self._exists.add(ref)

    async def delete(self, r: Reservation) -> None:
        ref = _ref(reservation_object(r))
        self._exists.discard(ref)
        with contextlib.suppress(NotFound):
            await asyncio.to_thread(self.api.delete_reservation, *ref)

    async def load(self) -> list[Reservation]:
        listing = await asyncio.to_thread(self.api.list, Kind.SLICE_RESERVATIONS)
        out = []
        for obj in listing.items:
            try:
                out.append(reservation_from_object(obj))
            except CrdError:
                continue
        return out
