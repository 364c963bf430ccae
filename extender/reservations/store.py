"""Where reservations persist, so a restart rebuilds the same ledger, and the queue of writes.

The store is the only writer of ``SliceReservation`` objects (see
:mod:`extender.kube.crd_models`), spec and status alike, for plain gangs, Workloads and
PodGroups: the controllers and the extender change the book's ledger
(:mod:`extender.reservations.book`), and the book queues each change here
(:class:`WriteQueue`), which hands it to the store. :class:`ReservationRef` names a
reservation's object (and its owner) from the meta kept with it.

``save`` creates or updates the object and writes its status (phase, bound pods, nodes,
GPUs), ``delete`` forgets (a missing object is not an error), ``load`` returns everything
persisted. The ledger is rebuilt from spec alone; status is for people and kubectl.

:class:`KubeReservationStore` writes with server-side apply as the one field manager
``gangslice`` (forced): the object (metadata, owner reference, spec) on the main resource,
then the status on its subresource, each only when it differs from what this store last
wrote. The CRD declares ``spec.bound``, ``spec.meta`` and ``status.boundPods`` atomic maps,
so an apply sets each whole: a freed slot's entry goes, whoever wrote the map before.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube import names
from extender.kube.api import SLICE_RESERVATIONS, KubeClient, KubeError, NotFound
from extender.kube.crd_models import (
    CrdError,
    gang_namespace,
    object_name,
    reservation_from_object,
    reservation_object,
    reservation_status,
)
from extender.kube.devices import DeviceMismatch
from extender.kube.fence import Fence
from extender.logs import fields
from extender.placement.ledger import Reservation

log = logging.getLogger(__name__)

_Ref = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationRef:
    """A reservation's gang key, its SliceReservation (namespace, name) and the object that
    owns it (a Workload, a PodGroup; empty for a plain gang)."""

    gang: str
    namespace: str
    name: str
    owner_kind: str = ""
    owner_name: str = ""
    owner_uid: str = ""
    owner_api_version: str = ""
    #: Its slots are ResourceClaims the admission webhook created (DRA).
    slot_claims: bool = False

    @classmethod
    def of(cls, r: Reservation) -> ReservationRef:
        return cls.parse(r.gang, r.meta)

    @classmethod
    def parse(cls, gang: str, meta: Mapping[str, str] | None) -> ReservationRef:
        m = meta or {}
        return cls(
            gang=gang,
            namespace=m.get("namespace") or gang_namespace(gang),
            name=m.get("name") or object_name(gang),
            owner_kind=m.get(names.META_OWNER_KIND, ""),
            owner_name=m.get(names.META_OWNER_NAME, ""),
            owner_uid=m.get(names.META_OWNER_UID, ""),
            owner_api_version=m.get(names.META_OWNER_API_VERSION, ""),
            slot_claims=m.get(names.META_SLOT_CLAIMS) == "true",
        )

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name) of the SliceReservation."""
        return self.namespace, self.name

    @property
    def names_owner(self) -> bool:
        """Its meta names the object it was made for (a Workload, a PodGroup)."""
        return bool(self.owner_kind and self.owner_name and self.owner_api_version)

    @property
    def owner_managed(self) -> bool:
        """Held until its controller releases it (a Workload's, a PodGroup's): no TTL."""
        return self.owner_kind in names.OWNER_MANAGED_KINDS

    @property
    def label(self) -> str:
        return f"reservation {self.namespace}/{self.name} (gang {self.gang})"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


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
    ref = ReservationRef.of(r)
    if not ref.names_owner:
        return None
    return {
        "apiVersion": ref.owner_api_version,
        "kind": ref.owner_kind,
        "name": ref.owner_name,
        "uid": ref.owner_uid,
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


#: Seconds a background write of queued ledger changes waits to begin (see
#: :meth:`WriteQueue.flush_soon`): the binds of a gang that come together are written in one.
WRITE_BEHIND_S = 0.5


class _KeyedLocks:
    """One asyncio lock per key, kept only while someone holds it or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def held(self) -> list[str]:
        """The keys held or waited for now."""
        return list(self._locks)


class WriteQueue:
    """Ledger changes waiting for the store, per gang: ``await flush()`` writes them (the
    housekeeping loop also flushes, and retries what failed)."""

    def __init__(
        self,
        store: ReservationStore,
        current: Callable[[str], Reservation | None],
        mismatches: Callable[[str], Sequence[DeviceMismatch]],
        *,
        write_behind_s: Callable[[], float] = lambda: WRITE_BEHIND_S,
        fence: Fence | None = None,
    ) -> None:
        self.store = store
        #: Checked before every write: a deposed leader's queued change is not written.
        self.fence = fence or Fence()
        #: Seconds a background write (:meth:`flush_soon`) waits to begin, to gather changes.
        self._write_behind_s = write_behind_s
        #: One lock per gang whose reservation is being written: its writes keep their order,
        #: and a new reservation's write (:meth:`persist`) never waits on another gang's.
        self._gang_locks = _KeyedLocks()
        #: The reservation the book holds now for a gang (None: released).
        self._current = current
        self._mismatches = mismatches
        #: Gang -> the reservation to delete (released), or None (write what is held).
        self._pending: dict[str, Reservation | None] = {}
        #: Gangs whose change the store is writing now: an echo of an older write must not
        #: undo it (see :meth:`extender.reservations.book.ReservationBook.reservation_deleted`).
        self._writing: set[str] = set()
        #: Gangs whose reservation object the store could not write, with the error.
        self._unsaved: dict[str, str] = {}
        self._flush_lock: asyncio.Lock | None = None
        #: The background write :meth:`flush_soon` started and that has not begun yet.
        self._flush_queued: asyncio.Task[None] | None = None

    def changed(self, gang: str, deleted: Reservation | None = None) -> None:
        """Queue a gang's change: ``deleted``, the reservation released."""
        if deleted is not None:
            self._pending[gang] = deleted
        else:
            self._pending.setdefault(gang, None)
            if self._pending[gang] is not None and self._current(gang) is not None:
                self._pending[gang] = None

    def status_changed(self, gang: str) -> None:
        """A held reservation's status must be written again (its spec did not change)."""
        self._pending.setdefault(gang, None)

    def busy(self, gang: str) -> bool:
        """Whether a change of ``gang`` is queued or being written."""
        return gang in self._pending or gang in self._writing

    def clear(self) -> None:
        self._pending.clear()
        self._unsaved.clear()

    async def flush(self) -> None:
        """Write queued ledger changes to the store, one gang after another, and wait for
        the writes in flight (a :meth:`persist` of its own); a failed write stays queued."""
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        async with self._flush_lock:
            for gang in [*self._pending, *(g for g in self._gang_locks.held() if g not in self._pending)]:
                async with self._gang_locks.hold(gang):
                    if gang in self._pending:
                        await self._write(gang)

    async def persist(self, gang: str, *, status: bool = True) -> bool:
        """Write gang's queued change now: the promise, which must be durable before anyone
        is told the slice is theirs (a controller's Ready, the reserving filter's reply).
        Another gang's write in flight is not waited for (each gang's writes keep their
        order, not all of them). ``status=False``: only the object (a restart rebuilds the
        ledger from it alone); its status (for people) stays queued for the next flush, as
        the reserving filter does, which kube-scheduler's one scheduling loop waits on.
        False when the object could not be written (it stays queued)."""
        for other in self._replaced(gang):
            # The store never holds two reservations of one GPU: a released one this one
            # takes GPUs of (a migration's hold, say) is deleted first.
            async with self._gang_locks.hold(other):
                if other in self._pending and not await self._write(other):
                    return False
        async with self._gang_locks.hold(gang):
            if gang not in self._pending:
                return True  # nothing queued: already written
            return await self._write(gang, status=status)

    def _replaced(self, gang: str) -> list[str]:
        """The released reservations whose deletion is queued and which held GPUs ``gang``'s
        reservation holds now."""
        released = [
            (other, deleted)
            for other, deleted in self._pending.items()
            if deleted is not None and other != gang and self._current(other) is None
        ]
        current = self._current(gang) if released else None
        if current is None:
            return []
        mine = current.slice.held()
        return [
            other
            for other, deleted in released
            if any(mine.get(node, frozenset()) & gpus for node, gpus in deleted.slice.held().items())
        ]

    async def _write(self, gang: str, status: bool = True) -> bool:
        """Write gang's queued change: its object, and its status unless ``status`` is False
        (the gang then stays queued for it)."""
        deleted = self._pending.pop(gang)
        current = self._current(gang)
        self._writing.add(gang)
        try:
            self.fence.check(f"writing the reservation of gang {gang}")
            if current is not None and not status:
                await self.store.save_object(current)
                self._pending.setdefault(gang, deleted)
            elif current is not None:
                await self.store.save(current, self._mismatches(gang))
            elif deleted is not None:
                await self.store.delete(deleted)
            self._unsaved.pop(gang, None)
            return True
        except StatusNotSaved as exc:
            self._unsaved.pop(gang, None)
            log.warning("%s; will retry", exc, extra=fields(gang=gang))
            self._pending.setdefault(gang, deleted)
            return True
        except Exception as exc:
            r = current or deleted
            where = str(ReservationRef.of(r)) if r else ""
            log.warning(
                "persisting reservation of gang %s failed: %s",
                gang,
                exc,
                extra=fields(gang=gang, reservation=where),
            )
            self._pending.setdefault(gang, deleted)
            if current is not None:
                self._unsaved[gang] = str(exc)
            return False
        finally:
            self._writing.discard(gang)

    async def discard(self, r: Reservation) -> None:
        """Delete a persisted reservation the book does not hold (one that overlaps another
        found at a rebuild); a failure is logged."""
        try:
            await self.store.delete(r)
        except Exception as exc:
            log.warning(
                "deleting the reservation of gang %s failed: %s", r.gang, exc, extra=fields(gang=r.gang)
            )

    def flush_soon(self) -> None:
        """Write queued ledger changes in the background, on the running loop, without
        waiting for them: write-behind. The write begins ``write_behind_s`` after the
        first change queued since the last one began, so the changes of that window (the
        binds of a gang, say) are written together, one write per reservation instead of
        one per change. Nothing queued here is a promise: a new reservation is
        :meth:`persist`-ed before it is promised, and a bind's truth is its Binding and the
        pod's GPU annotation, which the pod watch brings back after a restart (the book's
        ``pod_bound``). Without a pod watch (a cluster file) the reservation is that
        record, and the book asks for no wait. What fails stays queued for the next flush
        (housekeeping retries)."""
        if not self._pending or self._flush_queued is not None:
            return
        delay = self._write_behind_s()

        async def write() -> None:
            if delay > 0:
                await asyncio.sleep(delay)
            self._flush_queued = None  # changes queued from here on start a write of their own
            await self.flush()

        self._flush_queued = asyncio.get_running_loop().create_task(write())

    def save_error(self, gang: str) -> str | None:
        """Why the reservation object of ``gang`` last failed to be written, if it did."""
        return self._unsaved.get(gang)

    @property
    def unflushed(self) -> int:
        return len(self._pending)
