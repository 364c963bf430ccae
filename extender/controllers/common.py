"""What the reconcilers share: the cluster cache as they see it, and a periodic resync."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from extender.kube.owners import OwnerTable
from extender.kube.pods import PodInfo
from extender.placement.ledger import Ledger, Reservation
from extender.placement.snapshot import ClusterSnapshot
from extender.reservations.book import ReservationBook
from extender.reservations.reserve import Reserving

log = logging.getLogger(__name__)


class Cache(Reserving, Protocol):
    """What the controllers need of :class:`extender.reservations.cluster.ClusterCache`."""

    @property
    def ready(self) -> bool: ...

    @property
    def ledger(self) -> Ledger: ...

    @property
    def book(self) -> ReservationBook: ...

    def snapshot(self) -> ClusterSnapshot: ...

    @property
    def node_generation(self) -> int: ...

    def view(self, exclude: Iterable[str] = ()) -> ClusterSnapshot: ...

    def reservation(self, gang: str) -> Reservation | None: ...

    def pods_of_gang(self, gang: str) -> list[PodInfo]: ...

    @property
    def owners(self) -> OwnerTable: ...

    def forget_gang(self, key: str) -> None: ...

    def device_class_drivers(self, name: str) -> frozenset[str] | None: ...

    def restore(self, r: Reservation) -> bool: ...

    def hold_all(self, rs: Iterable[Reservation]) -> bool: ...

    def drop(self, gang: str) -> Reservation | None: ...

    async def flush(self) -> None: ...

    async def persist(self, gang: str) -> bool: ...

    async def rebuild_ledger(self) -> int: ...


async def resync_until(
    stop: asyncio.Event, period_s: float, resync: Callable[[], Awaitable[None]], what: str
) -> None:
    """Call ``resync`` every ``period_s`` seconds until ``stop`` is set; a failure is logged
    (as ``<what> failed``) and the loop goes on."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
        if not stop.is_set():
            try:
                await resync()
            except Exception:
                log.exception("%s failed", what)
