"""The cluster as the service sees it: the informer with its book of reservations.

:class:`ClusterCache` is what the extender, the controllers and the admission webhook are
handed: the informer's reads (:class:`~extender.kube.cache.ClusterInformer`) and the book's
(:class:`~extender.reservations.book.ReservationBook`), which listens to it. Every change to
a reservation goes through :attr:`ClusterCache.book`; the methods here only pass on to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from extender.kube.api import ALL_KINDS, Kind
from extender.kube.cache import ClusterInformer
from extender.kube.devices import DeviceMismatch
from extender.kube.pods import PodInfo
from extender.placement.feasibility import IMEX_DAEMON, Resources
from extender.placement.ledger import DEFAULT_TTL_S, Ledger, Reservation
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.waiting import KeepCliques, WaitingGangs
from extender.reservations.book import ReservationBook
from extender.reservations.store import WRITE_BEHIND_S, ReservationStore
from extender.topology.hierarchy import Hierarchy


class ClusterCache(ClusterInformer):
    """The informer and the book that listens to it; see the module docstring."""

    def __init__(
        self,
        *,
        hierarchy: Hierarchy | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        store: ReservationStore | None = None,
        clock: Callable[[], float] = time.time,
        awaiting: Iterable[Kind] = ALL_KINDS,
        imex_daemon: Resources = IMEX_DAEMON,
        keep_cliques: KeepCliques = KeepCliques.WHILE_WAITING,
        write_behind_s: float = WRITE_BEHIND_S,
    ) -> None:
        super().__init__(hierarchy=hierarchy, clock=clock, awaiting=awaiting, imex_daemon=imex_daemon)
        self.book = ReservationBook(
            self,
            ttl_s=ttl_s,
            store=store,
            clock=clock,
            keep_cliques=keep_cliques,
            write_behind_s=write_behind_s,
        )
        self.listen(self.book)
        self.reservation_gang = self.book.gang_named

    # -- the book's state ----------------------------------------------------------------
    @property
    def lock(self) -> asyncio.Lock:
        return self.book.lock

    @property
    def ledger(self) -> Ledger:
        return self.book.ledger

    @property
    def store(self) -> ReservationStore:
        return self.book.store

    @property
    def waiting(self) -> WaitingGangs:
        return self.book.waiting

    @property
    def rebuilds(self) -> int:
        return self.book.rebuilds

    @property
    def mismatches_found(self) -> dict[str, int]:
        return self.book.mismatches_found

    @property
    def mismatch_evictions(self) -> dict[str, int]:
        return self.book.mismatch_evictions

    @property
    def unflushed(self) -> int:
        return self.book.unflushed

    def view(self, exclude: Iterable[str] = ()) -> ClusterSnapshot:
        return self.book.view(exclude)

    # -- reading -------------------------------------------------------------------------
    def reservation(self, gang: str) -> Reservation | None:
        return self.book.reservation(gang)

    def reservation_named(self, namespace: str, name: str) -> Reservation | None:
        return self.book.reservation_named(namespace, name)

    def reservation_of(self, pod: PodInfo) -> Reservation | None:
        return self.book.reservation_of(pod)

    def running_members(self, gang: str) -> int | None:
        return self.book.running_members(gang)

    def held_for(self, who: str) -> list[str]:
        return self.book.held_for(who)

    def device_mismatches(self, gang: str | None = None) -> list[DeviceMismatch]:
        return self.book.device_mismatches(gang)

    def save_error(self, gang: str) -> str | None:
        return self.book.save_error(gang)

    # -- lifecycle -----------------------------------------------------------------------
    def drop(self, gang: str) -> Reservation | None:
        return self.book.drop(gang)

    async def release_gang(self, gang: str) -> Reservation | None:
        return await self.book.release_gang(gang)

    def bind_slot(self, gang: str, slot_key: str, pod: str) -> Reservation:
        return self.book.bind_slot(gang, slot_key, pod)

    def unbind_slot(self, gang: str, slot_key: str) -> Reservation:
        return self.book.unbind_slot(gang, slot_key)

    def move_slot(
        self, gang: str, slot_key: str, gpus: Iterable[int], numa_nodes: Iterable[int] | None = None
    ) -> Reservation:
        return self.book.move_slot(gang, slot_key, gpus, numa_nodes)

    def expire(self) -> list[Reservation]:
        return self.book.expire()

    def hold_all(self, rs: Iterable[Reservation]) -> bool:
        return self.book.hold_all(rs)

    def restore(self, r: Reservation) -> bool:
        return self.book.restore(r)

    def rebuild(self, rs: Iterable[Reservation]) -> list[Reservation]:
        return self.book.rebuild(rs)

    async def rebuild_ledger(self) -> int:
        return await self.book.rebuild_ledger()

    def note_eviction(self, pod_key: str, result: str, text: str) -> None:
        self.book.note_eviction(pod_key, result, text)

    # -- the write queue -----------------------------------------------------------------
    async def flush(self) -> None:
        await self.book.flush()

    async def persist(self, gang: str) -> bool:
        return await self.book.persist(gang)

    async def discard(self, r: Reservation) -> None:
        await self.book.discard(r)

    def flush_soon(self) -> None:
        self.book.flush_soon()
