"""The book of reservations: the ledger and every step of a reservation's life.

A reservation is held (:meth:`ReservationBook.hold_all`, through the reserve path of
:mod:`extender.reservations.reserve`), its slots are bound to pods and freed again
(:meth:`~ReservationBook.bind_slot`, :meth:`~ReservationBook.unbind_slot`), a slot follows the
GPUs the kubelet reports its pod holds (:meth:`~ReservationBook.move_slot`), and the hold ends
when its gang is done (:meth:`~ReservationBook.drop`) or its TTL runs out
(:meth:`~ReservationBook.expire`). After a restart the ledger is rebuilt from the store and
matched against the pods (:meth:`~ReservationBook.rebuild_ledger`). Each change is queued
for the store (:class:`~extender.reservations.store.WriteQueue`).

The book listens to the informer (:class:`extender.kube.cache.ClusterInformer`), which only
says what it saw: a pod gone or bound, a SliceReservation deleted, the kubelet's report of a
node's devices. What follows from it (free a slot, release the gang, take a slot for a pod
bound elsewhere, move a slot) is decided here. Decisions that span an ``await`` take
:attr:`ReservationBook.lock`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from extender.kube import names
from extender.kube.api import Kind
from extender.kube.cache import ClusterInformer
from extender.kube.devices import DeviceMismatch, node_mismatches
from extender.kube.fence import Fence
from extender.kube.gangs import DEFAULT_POD_SET, Incomplete, member_pod_set, plain_gang_request
from extender.kube.owners import PodSetSize
from extender.kube.pods import PodError, PodInfo
from extender.kube.slot_claims import handed_out
from extender.logs import fields
from extender.placement.feasibility import NOTHING
from extender.placement.ledger import DEFAULT_TTL_S, Ledger, LedgerError, Phase, Reservation, hold_requests
from extender.placement.request import GangRequest
from extender.placement.slice import PodSlot, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.waiting import KeepCliques, WaitingGangs
from extender.reservations import handover
from extender.reservations.reserve import Claim, Solver, Split, grow, reserve, reserve_all
from extender.reservations.store import (
    WRITE_BEHIND_S,
    InMemoryReservationStore,
    ReservationRef,
    ReservationStore,
    WriteQueue,
)
from extender.topology.model import GpuGraph

log = logging.getLogger(__name__)

#: A slot handed out at admission whose pod has not shown up on the watch is free again after
#: this long (the API server may have refused the pod after the webhook).
HANDING_S = 60.0

T = TypeVar("T")


@dataclass
class GangRef:
    """A pod's gang: its key, its reservation if any, and what to do without one."""

    key: str
    reservation_label: str
    request: GangRequest | None = None
    waiting: str = ""


@dataclass(frozen=True, slots=True)
class BindPlan:
    pod: PodInfo
    node: str
    gpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    gang: str | None = None
    slot: str | None = None
    #: The pod as the cache had it before the plan recorded it bound (for undo).
    previous: PodInfo | None = None
    noted: bool = False
    #: The GPUs' UUIDs from the node's graph, in the order of ``gpus`` (empty when the graph
    #: has none, e.g. one parsed from ``nvidia-smi topo -m``).
    uuids: tuple[str, ...] = ()
    #: The RDMA NICs next to ``gpus`` (:meth:`GpuGraph.near_nics`); empty when the graph has none.
    nics: tuple[str, ...] = ()

    def annotations(self) -> dict[str, str]:
        if not self.gpus:
            return {}
        out = {names.GPUS: ",".join(map(str, self.gpus))}
        if self.numa_nodes:
            out[names.NUMA_NODE] = ",".join(map(str, self.numa_nodes))
        if self.uuids:
            out[names.GPU_UUIDS] = ",".join(self.uuids)
        if self.nics:
            out[names.NICS] = ",".join(self.nics)
            out[names.NCCL_IB_HCA] = "=" + ",".join(self.nics)
            out[names.UCX_NET_DEVICES] = ",".join(f"{nic}:1" for nic in self.nics)
        return out


class Refused(Exception):
    """A bind or allocation that cannot be done; the message says why."""


#: Picks the GPUs of a pod in no gang on a node (the extender's own choice); raises Refused.
PlainPick = Callable[[PodInfo, str], BindPlan]


class ReservationBook:
    """The ledger and its lifecycle over one informer; see the module docstring."""

    def __init__(
        self,
        informer: ClusterInformer,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        store: ReservationStore | None = None,
        clock: Callable[[], float] | None = None,
        keep_cliques: KeepCliques = KeepCliques.WHILE_WAITING,
        write_behind_s: float = WRITE_BEHIND_S,
    ) -> None:
        self.informer = informer
        self.clock = clock or informer.clock
        self._ledger = Ledger(ttl_s)
        #: Whether this replica may decide and write now (:mod:`extender.kube.fence`).
        self.fence = Fence()
        self._queue = WriteQueue(
            store if store is not None else InMemoryReservationStore(self.clock),
            self._ledger.get,
            self.device_mismatches,
            # Without a pod watch (a cluster file) the reservation is the only record of a
            # bind: written at once.
            write_behind_s=lambda: write_behind_s if informer.pods_watched else 0.0,
            fence=self.fence,
        )
        #: The gangs the reserve path refused and has not placed since
        #: (:mod:`extender.placement.waiting`).
        self.waiting = WaitingGangs(started_at=self.clock(), keep=keep_cliques)
        self._lock: asyncio.Lock | None = None
        self._view: ClusterSnapshot | None = None
        #: Nodes whose reserved GPUs changed since the view was last brought up to date.
        self._held_dirty: set[str] = set()
        #: Nodes where reserved pods not bound yet request something (their states in
        #: ``_view`` count it where the node reports what it can hold).
        self._folded: set[str] = set()
        self._named: dict[tuple[str, str], str] | None = None
        #: Whom holds are kept for (:mod:`~extender.reservations.handover`) -> their gang keys.
        self._for: dict[str, list[str]] | None = None
        #: Gang -> (the meta it was read from, its ref): a bind replaces the reservation but
        #: keeps its meta, so each is read once (see :meth:`ref_of`).
        self._refs: dict[str, tuple[Mapping[str, str], ReservationRef]] = {}
        #: How many times the ledger was rebuilt from the store (:meth:`rebuild`).
        self.rebuilds = 0
        #: Bound pods whose GPUs, as the kubelet reports them, differ from their annotation
        #: (pod key -> mismatch).
        self._mismatches: dict[str, DeviceMismatch] = {}
        #: Slots handed out at admission (DRA) whose pods the watch has not shown yet: gang ->
        #: slot key -> (pod name, monotonic time handed out) (:meth:`handed`).
        self._handing: dict[str, dict[str, tuple[str, float]]] = {}
        #: Slots a gang with slot claims (DRA) no longer has, by (namespace, SliceReservation):
        #: their claims are the claims sync's to delete (:meth:`take_dropped_slots`).
        self._dropped_slots: dict[tuple[str, str], set[PodSlot]] = {}
        #: Mismatches found, per node, and evictions of mismatched pods, per result (counters).
        self.mismatches_found: dict[str, int] = {}
        self.mismatch_evictions: dict[str, int] = {}
        #: Migration plans told (:mod:`extender.controllers.migration`): how many, the replicas
        #: they would move and the restart GPU-seconds they would cost.
        self.migration_plans = 0
        self.migration_moves = 0
        self.migration_restart_gpu_s = 0.0
        #: Evictions of migration plans carried out, per result (``evicted``; ``blocked``,
        #: ``failed``: a plan refused).
        self.migration_evictions: dict[str, int] = {}

    # -- state ---------------------------------------------------------------------------
    @property
    def lock(self) -> asyncio.Lock:
        """The one lock around decisions (created on first use, inside the running loop)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @property
    def ledger(self) -> Ledger:
        """The ledger, for reading; change it only through this book."""
        return self._ledger

    @property
    def store(self) -> ReservationStore:
        return self._queue.store

    def view(self, exclude: Iterable[str] = ()) -> ClusterSnapshot:
        """The snapshot decisions read: every reservation's GPUs (but ``exclude``'s) taken out."""
        # A gang the ledger does not hold takes nothing out: the view as it is (the reserve
        # path asks for a gang not placed yet; a fresh view costs a walk over every node).
        ex = [g for g in exclude if g in self._ledger]
        snap = self.informer.snapshot()
        if ex:
            return self._ledger.view(snap, ex)
        if self._view is None:
            self._view = self._ledger.view(snap)
            self._folded = set(self._ledger.held_requests(snap))
        elif self._held_dirty:
            # Only the dirty nodes' holds are read again (through the ledger's node index),
            # not every reservation's: a bind or a reserve changes a few nodes.
            dirty = self._held_dirty
            reserved, channels = dict(self._view.reserved), dict(self._view.reserved_mnnvl)
            held, mnnvl = self._ledger.held(nodes=dirty), self._ledger.mnnvl(nodes=dirty)
            for n in dirty:
                _put_or_drop(reserved, n, held.get(n))
                _put_or_drop(channels, n, mnnvl.get(n))
            view = self._view.updated({}, reserved, channels, dirty)
            requests = self._ledger.held_requests(snap, nodes=dirty)
            again = {n: requests.get(n, NOTHING) for n in dirty if n in requests or n in self._folded}
            self._view = hold_requests(view, again, base=snap)
            self._folded = (self._folded - dirty) | set(requests)
        self._held_dirty.clear()
        return self._view

    async def deciding(self, decide: Callable[[], T]) -> T:
        """Run one synchronous decision (a filter that may reserve, a preemption) with the
        book's lock held: no other decision sees the ledger between its reading and its
        changes."""
        async with self.lock:
            return decide()

    # -- reading -------------------------------------------------------------------------
    def reservation(self, gang: str) -> Reservation | None:
        return self._ledger.get(gang)

    def reservation_named(self, namespace: str, name: str) -> Reservation | None:
        """The reservation whose SliceReservation is ``namespace/name`` (the Kueue path's
        ``gangslice.io/reservation`` annotation), or whose gang key is ``namespace/name``."""
        if self._named is None:
            self._named = {}
            for r in self._ledger.reservations():
                self._named[self.ref_of(r).key] = r.gang
        gang = self._named.get((namespace, name))
        if gang is None:
            return self._ledger.get(f"{namespace}/{name}")
        return self._ledger.get(gang)

    def ref_of(self, r: Reservation) -> ReservationRef:
        """Who ``r`` is for, read once per reservation meta."""
        got = self._refs.get(r.gang)
        if got is None or got[0] is not r.meta:
            got = self._refs[r.gang] = (r.meta, ReservationRef.of(r))
        return got[1]

    def gang_named(self, namespace: str, name: str) -> str | None:
        """The gang of the reservation :meth:`reservation_named` finds."""
        r = self.reservation_named(namespace, name)
        return r.gang if r is not None else None

    def reservation_of(self, pod: PodInfo) -> Reservation | None:
        """The reservation of the gang ``pod`` belongs to (:attr:`PodInfo.gang_key`), if held."""
        if pod.reservation_name:
            return self.reservation_named(pod.namespace, pod.reservation_name)
        key = pod.gang_key
        return self._ledger.get(key) if key is not None and key in self._ledger else None

    def running_members(self, gang: str) -> int | None:
        """How many pods of plain gang ``gang`` run and hold GPUs (None: pods are not watched
        or not listed yet, so nobody can tell)."""
        if not self.informer.pods_listed:
            return None
        return sum(1 for p in self.informer.pods_of_gang(gang) if p.holds_gpus and not p.deleting)

    def gang_of(self, pod: PodInfo, job: str | None = None) -> GangRef | None:
        """The pod's gang, or None for a pod in no gang. Raises PodError for bad annotations."""
        if pod.problems:
            raise PodError(pod.problems[0])
        if pod.reservation_name:
            r = self.reservation_named(pod.namespace, pod.reservation_name)
            label = f"reservation {pod.namespace}/{pod.reservation_name}"
            if r is None:
                return GangRef(
                    f"{pod.namespace}/{pod.reservation_name}", label, waiting=f"{label} does not exist"
                )
            return GangRef(r.gang, label)
        key = pod.gang or job
        if key is None:
            return self._handed_over(pod)
        r = self.reservation(key)
        label = self.ref_of(r).label if r is not None else ReservationRef.parse(key, None).label
        if r is not None:
            return GangRef(key, label)
        waiting = f"gang {key} has no reservation yet"
        got = (
            plain_gang_request(pod, self.informer.pods_of_gang(key), self.informer.owners)
            if pod.gang
            else None
        )
        if isinstance(got, Incomplete):
            return GangRef(key, label, None, f"gang {key}: {got.reason}")
        return GangRef(key, label, got, waiting)

    def held_for(self, who: str) -> list[str]:
        """The gang keys of the holds kept for ``who`` (:mod:`~extender.reservations.handover`)."""
        return list(self._held_for().get(who, ()))

    def _held_for(self) -> dict[str, list[str]]:
        if self._for is None:
            self._for = {}
            for r in self._ledger.reservations():
                got = handover.held_for(r)
                if got is not None:
                    self._for.setdefault(got, []).append(r.gang)
        return self._for

    def _handed_over(self, pod: PodInfo) -> GangRef | None:
        """For a GPU pod in no gang: the hold a migration keeps for its controller's next pod
        (the replacement of a moved replica), with a slot free for it or already its own."""
        if pod.gpus <= 0 or not self._ledger:
            return None
        who = handover.owner_of(pod)
        for gang in self.held_for(who) if who is not None else ():
            r = self._ledger.get(gang)
            if r is None:
                continue
            if r.slot_of(pod.name) is not None or self._usable(pod, free_slots(r, pod)):
                return GangRef(gang, self.ref_of(r).label)
        return None

    def _usable(self, pod: PodInfo, slots: list[PodSlot]) -> bool:
        """Whether ``pod`` may run on the node of one of ``slots``: a hold on a node gone,
        cordoned or tainted against it since is not handed to it (it lapses with its TTL)."""
        snap = self.informer.snapshot()
        on = [s for s in slots if snap.has_node(s.node)]
        admitted = snap.admitted(pod.alone().node_needs) if on else None
        return any(admitted is None or snap.index(s.node) in admitted for s in on)

    # -- holding a slice -----------------------------------------------------------------
    async def hold(
        self, request: GangRequest, claim: Claim, *, solve: Solver | None = None
    ) -> Reservation | Unplaceable:
        """Place one gang and hold its slice (:func:`~extender.reservations.reserve.reserve`)
        under the lock; :meth:`persist` writes it."""
        async with self.lock:
            return reserve(self, request, claim, solve=solve)

    async def hold_joint(
        self,
        request: GangRequest,
        claims: Iterable[Claim],
        *,
        split: Split | None = None,
        solve: Solver | None = None,
    ) -> list[Reservation] | Unplaceable:
        """Place one slice and hold it as one reservation per claim, all or none
        (:func:`~extender.reservations.reserve.reserve_all`), under the lock."""
        async with self.lock:
            return reserve_all(self, request, claims, split=split, solve=solve)

    async def replan(self, r: Reservation, request: GangRequest) -> Reservation | Unplaceable:
        """Place a held gang afresh on the cluster as it is now (devices of its slots were
        taken): the new reservation, or why none fits, the old one then held again."""
        async with self.lock:
            self.drop(r.gang)
            placed = reserve(self, request, Claim(r.gang, r.meta))
            if isinstance(placed, Unplaceable):
                self.hold_all([r])  # keep the old plan: the device may come free
            return placed

    # -- a gang that rolls and scales -------------------------------------------------------
    def grow(self, pod: PodInfo) -> Reservation | Unplaceable | None:
        """A pod of a held plain gang found no free slot: when the owners of its pod set want
        more pods than the slice has slots for it (a scale-up) or let more run at once (a
        rolling update's surge pod), or the slice lost a slot of it (:meth:`heal`), hold one
        more slot near the slice (:func:`~extender.reservations.reserve.grow`). A pod set the
        slice has no slot of (its owner came after the gang was placed) is a unit: all the
        pods its owners want, or none. None when nothing is due (the pod waits for a slot to
        come free). Call it under :attr:`lock`. Raises PodError for a pod whose pod set
        cannot be read, LevelError for an unknown level."""
        r = self._plain_reservation(pod)
        sizes = self._sizes(pod) if r is not None else None
        if r is None or sizes is None:
            return None
        ps = member_pod_set(pod, self.informer.owners)
        size = sizes.get(ps.name)
        have = sum(1 for s in r.slice.slots if s.pod_set == ps.name)
        if size is None or have >= size.limit:
            return None
        if not have and self.informer.owners.sizes(r.gang) is None:
            return None  # sized by annotation: a pod set the slice lacks is a mistake to report
        grown = grow(self, r, ps, 1 if have else max(size.desired, 1))
        if not isinstance(grown, Unplaceable):
            self._ledger_changed(r.gang, _held_nodes(grown))
        return grown

    def lacks_pod_set(self, pod: PodInfo) -> bool:
        """Whether the slice of the pod's plain gang has no slot of the pod's pod set (its
        owner came after the gang was placed): then no other pod set's slot is the pod's."""
        r = self._plain_reservation(pod)
        role = pod.pod_set or DEFAULT_POD_SET
        return r is not None and all(s.pod_set != role for s in r.slice.slots)

    def _plain_reservation(self, pod: PodInfo) -> Reservation | None:
        """The reservation of the plain gang ``pod`` belongs to (None for a Kueue or Volcano
        gang's pod: their controllers size and place them)."""
        gang = pod.gang
        return self._ledger.get(gang) if gang is not None and pod.gang_key == gang else None

    def _sizes(self, pod: PodInfo) -> Mapping[str, PodSetSize] | None:
        """The sizes of the pod's plain gang's pod sets: its owners', else what its pods'
        size annotations say (as many at once as wanted)."""
        assert pod.gang is not None
        sizes = self.informer.owners.sizes(pod.gang)
        if sizes is not None:
            return sizes
        got = plain_gang_request(pod, self.informer.pods_of_gang(pod.gang))
        if not isinstance(got, GangRequest):
            return None
        return {ps.name: PodSetSize(ps.count, ps.count) for ps in got.pod_sets}

    def heal(self, pod: PodInfo) -> bool:
        """Free the slots of the pod's plain gang that the pod would take but cannot: their
        node is gone, NotReady, or cordoned or tainted against it. The pod then gets a slot
        beside the slice (:meth:`grow`). When no slot would be left the reservation is
        released (True), and the gang is placed afresh. Call it under :attr:`lock`. Raises
        PodError for a pod whose pod set cannot be read."""
        r = self._plain_reservation(pod)
        if r is None or r.slot_of(pod.name) is not None:
            return False
        free = free_slots(r, pod)
        snap = self.informer.snapshot()
        if all(snap.has_node(s.node) and not snap.node(s.node).facts.constrains for s in free):
            return False  # the common case, decided without reading the pod's needs
        admitted = snap.admitted(member_pod_set(pod).node_needs)
        lost = [
            s
            for s in free
            if not snap.has_node(s.node) or (admitted is not None and snap.index(s.node) not in admitted)
        ]
        if not lost:
            return False
        nodes = sorted({s.node for s in lost})
        if len(lost) == len(r.slice.slots):
            log.info("gang %s: every slot is on nodes it cannot use (%s); released", r.gang, ",".join(nodes))
            self.drop(r.gang)
            return True
        for s in lost:
            self._remove_slot(r.gang, s)
        log.info(
            "gang %s: freed %d slots on nodes its pods cannot use (%s)",
            r.gang,
            len(lost),
            ",".join(nodes),
            extra=fields(gang=r.gang),
        )
        self._ledger_changed(r.gang, nodes)
        return False

    def _remove_slot(self, gang: str, slot: PodSlot) -> Reservation:
        """Take a slot no pod holds out of ``gang``'s slice; its claim (DRA) is left for the
        claims sync to delete."""
        r = self._ledger.remove_slot(gang, slot.key)
        ref = self.ref_of(r)
        if ref.slot_claims:
            self._dropped_slots.setdefault(ref.key, set()).add(slot)
        return r

    def take_dropped_slots(self) -> dict[tuple[str, str], set[PodSlot]]:
        """The slots taken out of gangs with slot claims since the last call, by (namespace,
        SliceReservation): their claims are to be deleted (unless a slot of that key came back)."""
        out, self._dropped_slots = self._dropped_slots, {}
        return out

    def return_dropped_slots(self, key: tuple[str, str], slots: Iterable[PodSlot]) -> None:
        """Slots whose claims could not be deleted yet: to be taken again next time."""
        self._dropped_slots.setdefault(key, set()).update(slots)

    # -- slots handed out at admission (DRA) ---------------------------------------------
    def handed(self, gang: str) -> dict[str, str]:
        """Slot key -> the pod it went to at admission: the live pods' (their
        ``gangslice.io/slot``), and those handed out in the last :data:`HANDING_S` to pods the
        watch has not shown yet (the API server may still refuse one after the webhook)."""
        now = time.monotonic()
        for other in [g for g in self._handing if g not in self._ledger]:
            del self._handing[other]  # released gangs: nothing of theirs is handed out any more
        pods = [p for p in self.informer.pods_of_gang(gang) if not p.terminal and not p.deleting]
        live = handed_out(pods)
        # A slot a live pod on the watch carries is that pod's to say from now on (a pod that
        # left may carry the key of a slot handed out again since: that does not count).
        mine = {
            k: v for k, v in self._handing.get(gang, {}).items() if now - v[1] < HANDING_S and k not in live
        }
        if mine:
            self._handing[gang] = mine
        else:
            self._handing.pop(gang, None)
        return {**{k: name for k, (name, _) in mine.items()}, **live}

    def hand(self, gang: str, slot_key: str, pod: str) -> None:
        """Slot ``slot_key`` of ``gang`` went to ``pod`` at its admission."""
        self._handing.setdefault(gang, {})[slot_key] = (pod, time.monotonic())

    def unhand(self, gang: str, slot_key: str) -> None:
        """The admission that took ``slot_key`` was refused after all: the slot is free."""
        self._handing.get(gang, {}).pop(slot_key, None)

    def add_slot(self, gang: str, slot: PodSlot) -> Reservation:
        """Hold one more slot for ``gang`` (:meth:`Ledger.add_slot`; LedgerError passes through)."""
        return self._ledger.add_slot(gang, slot)

    def trim(self, gang: str, freed_first: str | None = None) -> None:
        """Free the slots of ``gang`` no pod holds beyond what its owners want of each pod set
        and the pods that live need (a scale-down, a rolling update's old pod gone); no owner
        sizes the gang: nothing. A slot a live pod was handed at its creation (DRA) stays;
        ``freed_first``, the slot a pod just left, goes before any other."""
        r = self._ledger.get(gang)
        sizes = self.informer.owners.sizes(gang) if r is not None else None
        if r is None or sizes is None:
            return
        pods = [p for p in self.informer.pods_of_gang(gang) if not p.terminal and not p.deleting]
        alive = Counter(p.pod_set or DEFAULT_POD_SET for p in pods)
        handed = self.handed(gang)
        freed: list[str] = []
        for role in sorted({s.pod_set for s in r.slice.slots}):
            slots = [s for s in r.slice.slots if s.pod_set == role]
            want = max(sizes[role].desired if role in sizes else 0, alive[role])
            spare = [s for s in slots if s.key not in r.bound and s.key not in handed]
            spare.sort(key=lambda s: (s.key != freed_first, -s.index))
            for s in spare[: max(len(slots) - want, 0)]:
                if len(r.slice.slots) == 1:
                    break
                r = self._remove_slot(gang, s)
                freed.append(s.node)
        if freed:
            log.info(
                "gang %s: freed %d slots its owners no longer want", gang, len(freed), extra=fields(gang=gang)
            )
            self._ledger_changed(gang, freed)

    def trim_all(self) -> None:
        """:meth:`trim` every gang (the periodic pass: a slot whose admission entry lapsed, or
        an event missed, is freed all the same)."""
        for r in self._ledger.reservations():
            self.trim(r.gang)

    # -- kube-scheduler's Reserve and Unreserve --------------------------------------------
    async def reserve_pod(self, pod: PodInfo, node: str, plain: PlainPick) -> BindPlan:
        """Take the pod's slot on ``node`` (a gang's) or its GPUs there (``plain`` picks them
        for a pod in no gang) and record the pod bound, before the API call binds it;
        :meth:`unreserve` reverts. Raises :class:`Refused`."""
        async with self.lock:
            return self.plan_bind(pod, node, plain)

    async def unreserve(self, plan: BindPlan) -> None:
        """The bind of ``plan`` failed: free what :meth:`reserve_pod` took."""
        async with self.lock:
            self.undo_bind(plan)
        self.flush_soon()

    def plan_bind(self, pod: PodInfo, node: str, plain: PlainPick) -> BindPlan:
        """:meth:`reserve_pod` without the lock."""
        try:
            ref = self.gang_of(pod)
        except PodError as exc:
            raise Refused(str(exc)) from None
        r = self.reservation(ref.key) if ref is not None else None
        if ref is not None and r is not None:
            if outside_slice(ref.reservation_label, r, pod):
                return BindPlan(pod, node, (), ())
            slot = r.slot_of(pod.name)
            if slot is None or slot.node != node:
                given = pod.annotations.get(names.SLOT)  # handed out at its admission
                free = sorted((s for s in free_slots(r, pod) if s.node == node), key=lambda s: s.key != given)
                if not free:
                    raise Refused(f"{ref.reservation_label} has no free slot for pod {pod.name} on {node}")
                if slot is not None:
                    self.unbind_slot(r.gang, slot.key)
                slot = free[0]
            self.bind_slot(r.gang, slot.key, pod.name)
            plan = BindPlan(pod, node, slot.gpus, slot.numa_nodes, r.gang, slot.key)
        elif ref is not None and pod.gpus > 0:
            raise Refused(ref.waiting)
        elif pod.gpus > 0:
            plan = plain(pod, node)
        else:
            plan = BindPlan(pod, node, (), ())
        if plan.gpus:
            plan = self._identified(plan)
            bound = replace(pod, node=node, annotations={**pod.annotations, **plan.annotations()})
            plan = replace(plan, previous=self.informer.note_bound(bound), noted=True)
        return plan

    def _identified(self, plan: BindPlan) -> BindPlan:
        """``plan`` with its GPUs' UUIDs (``gangslice.io/gpu-uuids``) and the NICs next to them,
        from the node's graph; neither when the graph lacks one of the GPUs."""
        snap = self.informer.snapshot()
        if not snap.has_node(plan.node):
            return plan
        graph = snap.node(plan.node).graph
        if any(g not in graph.indices for g in plan.gpus):
            return plan
        return replace(plan, uuids=graph.uuids(plan.gpus) or (), nics=graph.near_nics(plan.gpus))

    def undo_bind(self, plan: BindPlan) -> None:
        """:meth:`unreserve` without the lock or the write."""
        r = self.reservation(plan.gang) if plan.gang is not None else None
        if r is not None and plan.slot is not None and r.bound.get(plan.slot) == plan.pod.name:
            self.unbind_slot(r.gang, plan.slot)
        if plan.noted:
            self.informer.restore_pod(plan.pod.key, plan.previous)
            if plan.previous is None:
                self.informer.remember(plan.pod)

    # -- Volcano allocate / deallocate ---------------------------------------------------
    def allocate(self, pod: PodInfo, node: str, job: str | None) -> None:
        """Volcano allocated a task in its session: take the matching slot. Raises Refused."""
        try:
            ref = self.gang_of(pod, job)
        except PodError as exc:
            raise Refused(str(exc)) from None
        r = self.reservation(ref.key) if ref is not None else None
        if ref is None or r is None:
            return
        if outside_slice(ref.reservation_label, r, pod):
            return
        mine = r.slot_of(pod.name)
        if mine is not None and mine.node == node:
            return
        free = [s for s in free_slots(r, pod) if s.node == node]
        if not free:
            raise Refused(f"{ref.reservation_label} has no free slot for task {pod.name} on {node}")
        if mine is not None:
            self.unbind_slot(r.gang, mine.key)
        self.bind_slot(r.gang, free[0].key, pod.name)

    def deallocate(self, pod: PodInfo, job: str | None) -> None:
        """Volcano took a task's allocation back: free its slot."""
        try:
            ref = self.gang_of(pod, job)
        except PodError:
            return
        r = self.reservation(ref.key) if ref is not None else None
        if r is None:
            return
        mine = r.slot_of(pod.name)
        if mine is not None:
            self.unbind_slot(r.gang, mine.key)

    # -- lifecycle -----------------------------------------------------------------------
    def drop(self, gang: str) -> Reservation | None:
        """Release a gang's reservation (sync; :meth:`flush` deletes the persisted object)."""
        r = self._ledger.release(gang)
        if r is not None:
            self._ledger_changed(gang, _held_nodes(r), deleted=r)
        return r

    async def release_gang(self, gang: str) -> Reservation | None:
        async with self.lock:
            r = self.drop(gang)
        await self.flush()
        return r

    def bind_slot(self, gang: str, slot_key: str, pod: str) -> Reservation:
        """Mark a slot taken by ``pod`` (refreshes the hold); LedgerError/KeyError if not possible."""
        r = self._ledger.bind(gang, slot_key, pod, self.clock())
        self._ledger_changed(gang)
        self._held_changed(self._holding(r.slice.slot(slot_key).node))
        return r

    def unbind_slot(self, gang: str, slot_key: str) -> Reservation:
        """Free a slot again, refreshing the hold so a replacement pod has time to come."""
        r = self._ledger.unbind(gang, slot_key)
        released = self._ledger.release(gang)
        assert released is not None
        r = dataclasses.replace(r, phase=Phase.RESERVED, expires_at=self.clock() + self._ledger.ttl_s)
        self._ledger.restore(r)
        self._ledger_changed(gang)
        self._held_changed(self._holding(r.slice.slot(slot_key).node))
        return r

    def _holding(self, node: str) -> list[str]:
        """``[node]`` where the view counts reserved pods' requests (the node reports what it
        can hold: a bind or unbind changes what is held there), else nothing: there a bind
        changes no node's offer."""
        snap = self.informer.built
        limits = snap is not None and snap.has_node(node) and snap.node(node).facts.allocatable.reported
        return [node] if limits else []

    def expire(self) -> list[Reservation]:
        """Drop holds past their TTL that are not fully bound; holds owned by a Workload or a
        PodGroup stay until their controller releases them, and so does a hold whose slots are
        ResourceClaims (the pods point at those claims), or whose pods a ReplicaSet or
        StatefulSet owns (it replaces the ones lost), while a pod of its gang lives."""

        def keep(r: Reservation) -> bool:
            ref = self.ref_of(r)
            if ref.owner_managed:
                return True
            if not ref.slot_claims and self.informer.owners.sizes(r.gang) is None:
                return False
            return any(not p.terminal and not p.deleting for p in self.informer.pods_of_gang(r.gang))

        for gang in self._handed_over_done():
            self.drop(gang)
        gone = self._ledger.expire(self.clock(), keep=keep)
        for r in gone:
            self._ledger_changed(r.gang, _held_nodes(r), deleted=r)
        return gone

    def _handed_over_done(self) -> list[str]:
        """Holds kept for a controller's next pod whose pods the watch shows running on their
        slots' nodes: the pods hold the GPUs themselves from then on."""
        done = []
        for who, gangs in self._held_for().items():
            if not who.startswith(handover.OWNER):
                continue
            for gang in gangs:
                r = self._ledger.get(gang)
                if r is None or not r.complete:
                    continue
                ns = self.ref_of(r).namespace
                seen = [
                    (self.informer.watched_pod(ns, pod), r.slice.slot(k).node) for k, pod in r.bound.items()
                ]
                if all(p is not None and p.node == n and p.phase == "Running" for p, n in seen):
                    done.append(gang)
        return done

    def hold_all(self, rs: Iterable[Reservation]) -> bool:
        """Hold every reservation of ``rs`` (placed by a controller) in the ledger, or none
        when one does not fit; each held one is queued for the store (:meth:`persist` or
        :meth:`flush` writes it). Call it under :attr:`lock`."""
        done: list[Reservation] = []
        for r in rs:
            if not self.restore(r):
                for d in done:
                    self._ledger.release(d.gang)
                    self._held_changed(_held_nodes(d))
                return False
            done.append(r)
        for r in done:
            self._ledger_changed(r.gang)
        return True

    def restore(self, r: Reservation) -> bool:
        """Put back a persisted reservation; False when it is already there or refused."""
        if r.gang in self._ledger or r.phase in (Phase.RELEASED, Phase.EXPIRED):
            return False
        try:
            self._ledger.restore(r)
        except LedgerError as exc:
            log.warning("not restoring reservation: %s", exc)
            return False
        self._named = self._for = None
        self._held_changed(_held_nodes(r))
        return True

    def rebuild(self, rs: Iterable[Reservation]) -> list[Reservation]:
        """The ledger from persisted reservations, replacing what it held (a standby's idea of
        it is stale), then matched against the pods (a pod bound or gone while no one led).
        Returns the reservations refused because they overlap one rebuilt before them, for
        the caller to delete. See :meth:`rebuild_ledger`."""
        for r in self._ledger.reservations():
            self._ledger.release(r.gang)
            self._held_changed(_held_nodes(r))
        self._queue.clear()
        self._named = self._for = None
        self._refs.clear()
        refused = [
            r
            for r in rs
            if not self.restore(r)
            and r.gang not in self._ledger  # a second copy of one already held is no clash
            and r.phase not in (Phase.RELEASED, Phase.EXPIRED)
        ]
        self.rebuilds += 1
        self._reconcile_bindings()
        # The rebuilt slots are the persisted ones: make them follow the kubelet again.
        self.informer.recheck_devices(m.node for m in self._mismatches.values())
        return refused

    async def rebuild_ledger(self) -> int:
        """Rebuild the ledger from the store, once, when this replica starts to decide (it
        became leader, or it runs without an election); returns how many came back. An object
        that overlaps another is deleted: never double-book."""
        await self.flush()
        refused = self.rebuild(await self.store.load())
        for r in refused:
            log.error(
                "reservation of gang %s overlaps another; deleting it", r.gang, extra=fields(gang=r.gang)
            )
            await self.discard(r)
        await self.flush()
        return len(self._ledger)

    def move_slot(
        self, gang: str, slot_key: str, gpus: Iterable[int], numa_nodes: Iterable[int] | None = None
    ) -> Reservation:
        """Point a slot of ``gang`` at other GPUs of its node (see :meth:`Ledger.move_slot`,
        whose LedgerError and KeyError pass through) and queue the reservation to be written."""
        before = self._ledger.get(gang)
        moved = self._ledger.move_slot(gang, slot_key, gpus, numa_nodes)
        if moved is not before:
            self._ledger_changed(gang, [moved.slice.slot(slot_key).node])
        return moved

    # -- the write queue -----------------------------------------------------------------
    async def flush(self) -> None:
        """Write queued ledger changes to the store; a failed write stays queued."""
        await self._queue.flush()

    async def persist(self, gang: str, *, status: bool = True) -> bool:
        """Write gang's queued change now (a controller does before it tells its owner the
        slice is reserved; ``status=False``: the object alone, see
        :meth:`WriteQueue.persist`); False when its object could not be written (it stays
        queued)."""
        return await self._queue.persist(gang, status=status)

    async def discard(self, r: Reservation) -> None:
        await self._queue.discard(r)

    def flush_soon(self) -> None:
        self._queue.flush_soon()

    def save_error(self, gang: str) -> str | None:
        """Why the reservation object of ``gang`` is not saved (its last write failed), or
        None once it is (a status not yet written does not count: the spec is the record)."""
        return self._queue.save_error(gang) if gang in self._ledger else None

    @property
    def unflushed(self) -> int:
        return self._queue.unflushed

    async def promise(self, gang: str | None) -> str | None:
        """Write what a filter changed before its reply; None when its promise holds.

        The filter that places a plain gang (the first member's) holds the slice, and its
        reply lets kube-scheduler bind the member on it; that promise must outlive this
        process, so the reservation it placed (``gang``) is written now. When the store cannot
        write it, the hold is released (a restart would not know of it, and a pod bound on its
        strength would hold GPUs nobody reserved) and the reason is returned; the next member's
        filter places the gang afresh. Other queued changes (binds' updates) are written in the
        background, since kube-scheduler's one scheduling loop waits on the reply."""
        if gang is None:
            self.flush_soon()
            return None
        # Only the new reservation's object gates the reply: it is the promise a restart
        # rebuilds. Its status follows write-behind, with the binds of the gang.
        await self.persist(gang, status=False)
        self.flush_soon()
        why = self.save_error(gang)
        if why is None:
            return None
        # The object may exist after all (a write that timed out): the release deletes it.
        await self.release_gang(gang)
        log.warning(
            "gang %s: its reservation could not be saved (%s); released the hold",
            gang,
            why,
            extra=fields(gang=gang),
        )
        return why

    # -- what the informer tells -----------------------------------------------------------
    def pod_gone(self, pod: PodInfo) -> None:
        """A pod that held a slot finished or was deleted: free its slot for a replacement
        (with a fresh TTL), or release the reservation when no pod of the gang is left; a
        slot its owners no longer want goes (:meth:`trim`)."""
        left: str | None = None
        for r in self._ledger.reservations():
            ns = self.ref_of(r).namespace
            if ns != pod.namespace:
                continue
            slot = r.slot_of(pod.name)
            if slot is None:
                continue
            others = [
                name for key, name in r.bound.items() if key != slot.key and self.informer.pod_alive(ns, name)
            ]
            if not others:
                # Nothing of the gang runs any more: done, or being recreated (a plain gang
                # is then placed afresh on first sight; a controller re-reserves its own).
                self.drop(r.gang)
            else:
                self.unbind_slot(r.gang, slot.key)
                left = slot.key
        if pod.gang is not None:
            self.trim(pod.gang, left)

    def pod_bound(self, pod: PodInfo) -> None:
        """A gang pod that shows up bound but is not in the ledger (bound by someone else, or
        before a restart): take the matching slot so it is not handed out twice."""
        r = self.reservation_of(pod)
        if r is None or r.slot_of(pod.name) is not None:
            return
        assigned = set(pod.assigned_gpus or ())
        pod_sets = {s.pod_set for s in r.slice.slots}
        candidates = [
            s
            for s in r.free_slots()
            if s.node == pod.node and (pod.pod_set not in pod_sets or s.pod_set == pod.pod_set)
        ]
        # The slot the admission webhook gave it (DRA), else the one with its GPUs.
        given = pod.annotations.get(names.SLOT)
        candidates.sort(key=lambda s: (s.key != given, set(s.gpus) != assigned, s.key))
        if candidates:
            self.bind_slot(r.gang, candidates[0].key, pod.name)

    def owners_changed(self, gangs: Iterable[str]) -> None:
        """Owners of these gangs' pods were scaled or rolled: free the slots they no longer want."""
        for gang in gangs:
            self.trim(gang)

    def reservation_deleted(self, r: Reservation) -> None:
        """Someone else deleted the object: release, unless it is an older hold than ours."""
        mine = self._ledger.get(r.gang)
        ours = self._queue.busy(r.gang)
        if mine is not None and mine.slice.to_dict() == r.slice.to_dict() and not ours:
            self._ledger.release(r.gang)
            self._named = self._for = None
            self._refs.pop(r.gang, None)
            self._held_changed(_held_nodes(mine))

    def listed(self, kind: Kind) -> None:
        """The first full list of ``kind`` is in: match the ledger against the pods."""
        if kind in (Kind.PODS, Kind.SLICE_RESERVATIONS):
            self._reconcile_bindings()
        if self.informer.ready:
            # Build the view now, before /readyz says ready: the first build walks every
            # node (seconds at 5,000 nodes) and would otherwise stall the first filter
            # kube-scheduler sends.
            self.view()

    def nodes_rebuilt(self, changed: Mapping[str, NodeState] | None) -> None:
        """The informer rebuilt these nodes' states (None: the whole snapshot)."""
        if changed is None:
            self._view = None
        elif self._view is not None:
            self._view = self._view.updated(changed)
            # Their fresh states lack the held requests: view() counts them again (and on a
            # node a reservation holds, what it holds may now differ: the IMEX daemon's room
            # follows the node's ComputeDomain label).
            self._held_dirty.update(n for n in changed if n in self._folded or self._ledger.gangs_on((n,)))

    def devices_reported(self, nodes: Iterable[str]) -> None:
        """On the nodes whose pods or NodeTopology changed: compare what the kubelet reports
        each bound pod holds with its ``gangslice.io/gpus``, record the differences, and move
        each such pod's reservation slot onto the GPUs it really holds (see
        :mod:`extender.kube.devices`)."""
        for node in sorted(nodes):
            topo = self.informer.topology(node)
            graph = topo.graph if topo is not None else None
            pods = self.informer.pods_on(node)
            found = node_mismatches(
                node, pods, topo, self.informer.hierarchy, self._claim_promises(node, pods)
            )
            for key in [k for k, m in self._mismatches.items() if m.node == node and k not in found]:
                gone = self._mismatches.pop(key)
                log.info("pod %s: the kubelet's report and the promise agree again (or it is gone)", key)
                self._status_changed(gone.gang)
            for key, m in found.items():
                old = self._mismatches.get(key)
                fresh = old is None or old.sets != m.sets
                m = self._follow_kubelet(m, graph)
                if not fresh and old is not None:
                    m = dataclasses.replace(m, eviction=old.eviction)
                else:
                    self.mismatches_found[node] = self.mismatches_found.get(node, 0) + 1
                    log.warning("GPUs differ from the promise: %s", m.message(), extra=fields(gang=m.gang))
                self._mismatches[key] = m
                if m != old:
                    self._status_changed(m.gang)

    # -- the kubelet's report ------------------------------------------------------------
    def device_mismatches(self, gang: str | None = None) -> list[DeviceMismatch]:
        """Bound pods the kubelet reports holding other GPUs than their annotation says (of
        ``gang``'s reservation only, when given), in pod order."""
        found = [m for m in self._mismatches.values() if gang is None or m.gang == gang]
        return sorted(found, key=lambda m: m.pod)

    def note_eviction(self, pod_key: str, result: str, text: str) -> None:
        """What evicting a mismatched pod came to (``result``: evicted, blocked, failed);
        ``text`` goes into its reservation's condition."""
        self.mismatch_evictions[result] = self.mismatch_evictions.get(result, 0) + 1
        m = self._mismatches.get(pod_key)
        if m is not None and m.eviction != text:
            self._mismatches[pod_key] = m = dataclasses.replace(m, eviction=text)
            self._status_changed(m.gang)

    def note_migration_plan(self, moves: int, restart_gpu_s: float) -> None:
        self.migration_plans += 1
        self.migration_moves += moves
        self.migration_restart_gpu_s += restart_gpu_s

    def note_migration_eviction(self, result: str) -> None:
        self.migration_evictions[result] = self.migration_evictions.get(result, 0) + 1

    def _status_changed(self, gang: str | None) -> None:
        """A reservation's status must be written again (its spec did not change)."""
        if gang is not None and gang in self._ledger:
            self._queue.status_changed(gang)

    def _slot_held(self, pod: PodInfo) -> tuple[Reservation, PodSlot] | None:
        """The reservation slot bound to the pod, with its reservation."""
        r = self.reservation_of(pod)
        slot = r.slot_of(pod.name) if r is not None else None
        if r is not None and slot is not None:
            return r, slot
        for r in self._ledger.reservations():
            if self.ref_of(r).namespace == pod.namespace:
                slot = r.slot_of(pod.name)
                if slot is not None:
                    return r, slot
        return None

    def _claim_promises(self, node: str, pods: Iterable[PodInfo]) -> dict[str, tuple[int, ...]]:
        """On a DRA node, what each pod with a slot there was promised: its slot's GPUs, which
        its claim pins. The pod's ``gangslice.io/gpus`` is what its admission planned; a
        re-plan (:mod:`extender.controllers.claims.sync`) replaces the claim and the slot, not
        the pod's annotation."""
        topo = self.informer.topology(node)
        if not self.informer.is_dra(node) or topo is None:
            return {}
        out = {}
        for pod in pods:
            if pod.key not in topo.in_use:
                continue  # no report to compare
            held = self._slot_held(pod)
            if held is not None and held[1].node == node:
                out[pod.key] = tuple(held[1].gpus)
        return out

    def _follow_kubelet(self, m: DeviceMismatch, graph: GpuGraph | None) -> DeviceMismatch:
        """Move the pod's reservation slot onto the GPUs the kubelet reports it holds, so the
        GPUs it was promised are free again and the ones it holds are not handed out."""
        pod = self.informer.watched_pod(*m.pod.split("/", 1))
        held = self._slot_held(pod) if pod is not None else None
        if held is None:
            return m
        r, slot = held
        m = dataclasses.replace(m, gang=r.gang, slot=slot.key)
        if slot.node != m.node:
            return dataclasses.replace(m, not_corrected=f"its slot is on node {slot.node}")
        if self.informer.is_dra(m.node):
            # The slot is the promise here (its claim pins it) and the allocated claims are
            # what is taken: moving the slot would only hide the difference.
            return dataclasses.replace(m, not_corrected="on a DRA node the slot stays what its claim pins")
        numa = None
        if graph is not None and all(g in graph.indices for g in m.reported):
            numa = graph.shape.numa_of(graph.shape.mask_of(m.reported))
        try:
            self.move_slot(r.gang, slot.key, m.reported, numa)
        except (LedgerError, KeyError) as exc:
            return dataclasses.replace(m, not_corrected=str(exc))
        return m

    # -- internals -----------------------------------------------------------------------
    def _reconcile_bindings(self) -> None:
        if not self.informer.pods_listed:
            return
        for r in self._ledger.reservations():
            ns = self.ref_of(r).namespace
            for name in list(r.bound.values()):
                if not self.informer.pod_alive(ns, name):
                    info = self.informer.watched_pod(ns, name) or PodInfo(namespace=ns, name=name)
                    self.pod_gone(info)
        for pod in self.informer.pods():
            if pod.holds_gpus and not pod.deleting:
                self.pod_bound(pod)

    def _held_changed(self, nodes: Iterable[str]) -> None:
        nodes = list(nodes)
        self._held_dirty.update(nodes)
        self.informer.note_changed(nodes)

    def _ledger_changed(
        self, gang: str, nodes: Iterable[str] = (), deleted: Reservation | None = None
    ) -> None:
        """``nodes``: where the reserved GPUs changed (none for a bind or unbind)."""
        nodes = list(nodes)
        self._named = None
        if self._for is not None:
            # The index of holds kept for someone else changes only with such a hold: a bind
            # of a gang's slot (every gang pod's bind) keeps it.
            r = deleted or self._ledger.get(gang)
            if r is None or handover.held_for(r) is not None:
                self._for = None
        self._held_changed(nodes)
        if (deleted is not None or nodes) and self.informer.has_channels:
            r = deleted or self._ledger.get(gang)
            if r is not None:
                self.informer.mark_domains_of(*self.ref_of(r).key)
        self._queue.changed(gang, deleted)
        if deleted is not None:
            self._refs.pop(gang, None)


def _held_nodes(r: Reservation) -> tuple[str, ...]:
    """The nodes a reservation holds something on: its slots' GPUs, its NVLink channels."""
    return (*r.slice.nodes, *r.slice.mnnvl_nodes)


def _put_or_drop(table: dict[str, Any], key: str, value: Any) -> None:
    if value:
        table[key] = value
    else:
        table.pop(key, None)


def free_slots(r: Reservation, pod: PodInfo) -> list[PodSlot]:
    """Free slots for ``pod``: of its GPU count, and only its pod set's when the reservation
    has such a pod set; of any pod set when the pod names none or one the slice does not know
    (a Kueue or Volcano role name that the reservation did not use)."""
    free = [s for s in r.free_slots() if len(s.gpus) == pod.gpus]
    if pod.pod_set is None or all(s.pod_set != pod.pod_set for s in r.slice.slots):
        return free
    return [s for s in free if s.pod_set == pod.pod_set]


def outside_slice(label: str, r: Reservation, pod: PodInfo) -> bool:
    """Whether a member of the gang is no pod of its slice: one without GPUs (a CPU-only
    leader or router) when no slot is without GPUs. Raises :class:`Refused` for a member
    whose GPU count no slot has."""
    if r.slot_of(pod.name) is not None or any(len(s.gpus) == pod.gpus for s in r.slice.slots):
        return False
    if pod.gpus <= 0:
        return True
    sizes = "/".join(str(n) for n in sorted({len(s.gpus) for s in r.slice.slots}))
    why = f"{label}: pod {pod.name} asks for {pod.gpus} GPUs; the reservation's slots have {sizes}"
    if pod.pod_set and all(s.pod_set != pod.pod_set for s in r.slice.slots):
        why += f" (a plain gang of several pod sets gives each pod {names.POD_SET_SIZE})"
    raise Refused(why)
