"""The cluster cache: one in-memory snapshot of the cluster plus the reservation ledger.

It is the only mutable object of the service. Watch events (or a cluster file) change it;
decisions read :meth:`ClusterCache.view` (the snapshot with every reservation's GPUs taken
out) and change the ledger through the methods here, which keep the snapshot, the ledger
and the persisted reservations in step. Everything runs on one asyncio loop; mutations are
synchronous, so no decision sees a half-applied event. Decisions that span an ``await``
take :attr:`ClusterCache.lock`.

GPUs taken on a node: the cluster file's ``allocatedGpus``, plus, for every bound, unfinished
pod, the GPUs the node agent reports the kubelet gave it (NodeTopology ``devicesInUse``: the
truth), or else its ``gangslice.io/gpus`` annotation; a bound pod with neither takes as many
of the lowest free GPU indices as it requests (pods in name order). A pod reported on other
GPUs than its annotation promised is a device mismatch (:mod:`extender.kube.devices`): its
reservation slot is moved onto the reported GPUs and its SliceReservation says so.

What kube-scheduler's filters read of a node (taints, ``spec.unschedulable``,
``status.allocatable``) comes from its Node object, and what its non-terminal pods request
from those pods (:class:`~extender.placement.feasibility.NodeFacts`); a cordoned node stays
in the snapshot, for the pods that tolerate it. A NotReady node is left out.

A node whose NodeTopology fails validation is kept out of the snapshot (never given a
guessed graph) and listed by :meth:`ClusterCache.refused_topologies` with the field and the
problem; :mod:`extender.kube.topology_status` says so on the object and its Node.

Persisting: ledger changes are queued; ``await cache.flush()`` writes them to the
:class:`~extender.kube.store.ReservationStore` (the housekeeping loop also flushes, and
retries what failed). A bind or a freed slot is such a change, so the object's status
(phase, bound pods) follows the ledger for every reservation, owned ones included.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from extender.kube import compute_domains as cds
from extender.kube import dra, names
from extender.kube.api import ALL_KINDS, Kind, name_of, namespace_of
from extender.kube.crd_models import (
    CrdError,
    NodeTopology,
    gang_namespace,
    object_name,
    parse_node_topology,
    reservation_from_object,
)
from extender.kube.devices import DeviceMismatch, node_mismatches
from extender.kube.names import GPUS as GPUS_ANNOTATION
from extender.kube.node_graphs import NodeRecord, fallback_graph
from extender.kube.pods import PodInfo
from extender.kube.store import InMemoryReservationStore, ReservationStore, StatusNotSaved
from extender.kube.topology_status import DEVICES_MATCHED, accepted_condition, condition_of
from extender.logs import fields
from extender.placement.feasibility import IMEX_DAEMON, NO_FACTS, NOTHING, NodeFacts, Resources, usage
from extender.placement.files import load_cluster
from extender.placement.ledger import DEFAULT_TTL_S, Ledger, LedgerError, Phase, Reservation, hold_requests
from extender.placement.search.memory import SolverMemory
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.waiting import KeepCliques, WaitingGangs
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import Hierarchy
from extender.topology.kubelet import KubeletAlignment
from extender.topology.model import GpuGraph

log = logging.getLogger(__name__)

#: How many pods seen in requests are remembered for a later bind (file mode has no pod watch).
RECENT_PODS = 10_000
#: Seconds a background write of queued ledger changes waits to begin (see
#: :meth:`ClusterCache.flush_soon`): the binds of a gang that come together are written in one.
WRITE_BEHIND_S = 0.5
#: How many node changes are remembered for decision memos to catch up on (beyond: start over).
CHANGE_LOG = 50_000


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


@dataclasses.dataclass(frozen=True, slots=True)
class _StaticNode:
    labels: Mapping[str, str]
    graph: GpuGraph
    allocated: frozenset[int]
    unhealthy: frozenset[int]
    allocation: Allocation = Allocation.DEVICE_PLUGIN
    facts: NodeFacts = NO_FACTS
    kubelet: KubeletAlignment | None = None


class ClusterCache:
    """Nodes, their GPU graphs, pods and reservations; see the module docstring."""

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
        self.hierarchy = hierarchy or Hierarchy()
        #: What the IMEX daemon pod of a ComputeDomain takes on each node (``serve
        #: --imex-daemon-requests``).
        self.imex_daemon = imex_daemon
        self.store: ReservationStore = store if store is not None else InMemoryReservationStore(clock)
        self.clock = clock
        self._ledger = Ledger(ttl_s)
        #: The gangs the reserve path refused and has not placed since
        #: (:mod:`extender.placement.waiting`).
        self.waiting = WaitingGangs(started_at=clock(), keep=keep_cliques)
        self._awaiting = set(awaiting)
        #: Pods are watched: a pod missing from the cache is gone (not so in file mode).
        self._pods_watched = Kind.PODS in self._awaiting
        self._static: dict[str, _StaticNode] = {}
        self._records: dict[str, NodeRecord] = {}
        self._topologies: dict[str, NodeTopology] = {}
        #: Nodes whose NodeTopology fails validation -> "<field>: <problem>"; kept out of
        #: placement (see :mod:`extender.kube.topology_status`).
        self._refused: dict[str, str] = {}
        #: Nodes whose NodeTopology carries the ``Accepted`` condition -> (status, message).
        self._accepted: dict[str, tuple[str, str]] = {}
        #: Nodes whose NodeTopology carries the ``DevicesMatched`` condition -> (status, message).
        self._devices_matched: dict[str, tuple[str, str]] = {}
        #: DRA: ResourceSlices by name, the node-local ones by node, DeviceClasses -> the
        #: drivers they select, claims (``ns/name``) -> the devices their allocation holds.
        self._slices: dict[str, dra.SliceInfo] = {}
        self._slices_by_node: dict[str, dict[str, dra.SliceInfo]] = {}
        self._device_classes: dict[str, frozenset[str]] = {}
        self._claim_devices: dict[str, tuple[tuple[str, str, str], ...]] = {}
        self._allocated_by_pool: dict[str, set[str]] = {}
        #: gangslice's ComputeDomain channel claims (``ns/name``) -> (domain UID, namespace,
        #: SliceReservation name): whose domain a node's ``resource.nvidia.com/computeDomain`` is.
        self._channels: dict[str, tuple[str, str, str]] = {}
        #: DRA nodes whose devices pair with their NodeTopology's GPUs, and why the others do not.
        self._device_maps: dict[str, dra.DeviceMap] = {}
        self._device_problems: dict[str, str] = {}
        self._pods: dict[str, PodInfo] = {}
        self._by_uid: dict[str, str] = {}
        self._by_node: dict[str, set[str]] = {}
        self._pod_gpus: dict[str, frozenset[int]] = {}
        self._states: dict[str, NodeState] = {}
        self._dirty_nodes: set[str] = set()
        self._snap: ClusterSnapshot | None = None
        self._view: ClusterSnapshot | None = None
        #: What the solver keeps across decisions (:mod:`extender.placement.search.memory`):
        #: owned here for the life of the process and carried by every snapshot built here,
        #: so it outlives a rebuild of the snapshot when nodes come or go.
        self.solver_memory = SolverMemory()
        #: Nodes whose reserved GPUs changed since the view was last brought up to date.
        self._held_dirty: set[str] = set()
        #: Nodes where reserved pods not bound yet request something (their states in
        #: ``_view`` count it where the node reports what it can hold).
        self._folded: set[str] = set()
        self._version = 0
        self._node_generation = 0
        self._changes: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)
        self._named: dict[tuple[str, str], str] | None = None
        self._pending: dict[str, Reservation | None] = {}
        #: How many times the ledger was rebuilt from the store (:meth:`rebuild`).
        self.rebuilds = 0
        #: Gangs whose change the store is writing now: an echo of an older write must not
        #: undo it (see :meth:`_apply_reservation`).
        self._writing: set[str] = set()
        #: Gangs whose reservation object the store could not write, with the error.
        self._unsaved: dict[str, str] = {}
        self._recent: OrderedDict[str, PodInfo] = OrderedDict()
        #: Plain gang key -> pod key -> the pod as :meth:`pod` gives it (watched, else seen in
        #: a request): a gang's members without a walk over every pod.
        self._gang_pods: dict[str, dict[str, PodInfo]] = {}
        self._lock: asyncio.Lock | None = None
        self._flush_lock: asyncio.Lock | None = None
        #: One lock per gang whose reservation is being written: its writes keep their order,
        #: and a new reservation's write (:meth:`persist`) never waits on another gang's.
        self._gang_locks = _KeyedLocks()
        #: Seconds a background write (:meth:`flush_soon`) waits to begin, to gather changes.
        self.write_behind_s = write_behind_s
        #: The background write :meth:`flush_soon` started and that has not begun yet.
        self._flush_queued: asyncio.Task[None] | None = None
        #: Bound pods whose GPUs, as the kubelet reports them, differ from their annotation
        #: (pod key -> mismatch), and the nodes to compare again (see :meth:`_check_devices`).
        self._mismatches: dict[str, DeviceMismatch] = {}
        self._devices_dirty: set[str] = set()
        #: Mismatches found, per node, and evictions of mismatched pods, per result (counters).
        self.mismatches_found: dict[str, int] = {}
        self.mismatch_evictions: dict[str, int] = {}

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_snapshot(
        cls,
        snap: ClusterSnapshot,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        store: ReservationStore | None = None,
        clock: Callable[[], float] = time.time,
        awaiting: Iterable[Kind] = (),
        keep_cliques: KeepCliques = KeepCliques.WHILE_WAITING,
    ) -> ClusterCache:
        """A cache over a fixed set of nodes (no API server); ready at once, or once each
        kind of ``awaiting`` is listed (``(Kind.PODS,)``: pods come from a watch)."""
        cache = cls(
            hierarchy=snap.hierarchy,
            ttl_s=ttl_s,
            store=store,
            clock=clock,
            awaiting=awaiting,
            keep_cliques=keep_cliques,
        )
        for n in snap.nodes:
            cache._static[n.name] = _StaticNode(
                dict(n.labels), n.graph, n.allocated, n.unhealthy, n.allocation, n.facts, n.kubelet
            )
            cache._dirty_nodes.add(n.name)
        return cache

    @classmethod
    def from_cluster_file(
        cls,
        path: str | Path,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        store: ReservationStore | None = None,
        clock: Callable[[], float] = time.time,
        keep_cliques: KeepCliques = KeepCliques.WHILE_WAITING,
    ) -> ClusterCache:
        """A cache over a cluster file (``gangslice serve --cluster FILE``); raises FileError."""
        return cls.from_snapshot(
            load_cluster(path), ttl_s=ttl_s, store=store, clock=clock, keep_cliques=keep_cliques
        )

    # -- state ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True once the first full list of every watched kind is in."""
        return not self._awaiting

    @property
    def awaiting(self) -> frozenset[Kind]:
        return frozenset(self._awaiting)

    @property
    def lock(self) -> asyncio.Lock:
        """The one lock around decisions (created on first use, inside the running loop)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @property
    def ledger(self) -> Ledger:
        """The ledger, for reading; change it only through this cache."""
        return self._ledger

    @property
    def version(self) -> int:
        """Grows with every change to what a node offers (its GPUs, pods or reservations)."""
        return self._version

    @property
    def node_generation(self) -> int:
        """Grows when a node joins or leaves or what it offers on an empty cluster changes
        (labels, GPU graph, unhealthy GPUs); not with pods or reservations. What can fit
        the empty cluster is a function of it."""
        self.snapshot()
        return self._node_generation

    def changes_since(self, version: int) -> set[str] | None:
        """Nodes changed after ``version``, or None when that is too far back to tell."""
        if version == self._version:
            return set()
        if not self._changes or self._changes[0][0] > version + 1:
            return None
        # Newest first, stopping at ``version`` (versions grow along the log): the log holds
        # up to CHANGE_LOG entries and a decision after one event needs only the last few.
        newer = itertools.takewhile(lambda change: change[0] > version, reversed(self._changes))
        return {node for _, node in newer}

    def snapshot(self) -> ClusterSnapshot:
        """Nodes and what pods (and the cluster file) take; reservations not applied.
        Updated in place of rebuilt when only some nodes' states changed."""
        if self._snap is None or self._dirty_nodes:
            changed: dict[str, NodeState] = {}
            membership = False
            for name in self._dirty_nodes:
                state = self._build_state(name)
                if _offer(self._states.get(name)) != _offer(state):
                    self._node_generation += 1
                if state is None:
                    membership |= self._states.pop(name, None) is not None
                else:
                    membership |= name not in self._states
                    self._states[name] = state
                    changed[name] = state
            self._dirty_nodes.clear()
            if self._snap is None or membership:
                self._snap = ClusterSnapshot(
                    [self._states[n] for n in sorted(self._states)], self.hierarchy, memory=self.solver_memory
                )
                self._view = None
            elif changed:
                self._snap = self._snap.updated(changed)
                if self._view is not None:
                    self._view = self._view.updated(changed)
                    # Their fresh states lack the held requests: view() counts them again
                    # (and on a node a reservation holds, what it holds may now differ: the
                    # IMEX daemon's room follows the node's ComputeDomain label).
                    self._held_dirty.update(
                        n for n in changed if n in self._folded or self._ledger.gangs_on((n,))
                    )
        return self._snap

    def view(self, exclude: Iterable[str] = ()) -> ClusterSnapshot:
        """The snapshot decisions read: every reservation's GPUs (but ``exclude``'s) taken out."""
        # A gang the ledger does not hold takes nothing out: the view as it is (the reserve
        # path asks for a gang not placed yet; a fresh view costs a walk over every node).
        ex = [g for g in exclude if g in self._ledger]
        snap = self.snapshot()
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

    def node_names(self) -> list[str]:
        return [n.name for n in self.snapshot().nodes]

    def node_count(self) -> int:
        """Nodes of the cluster, with or without GPUs (the cluster file's in file mode)."""
        return len(self._records) + len(self._static)

    def has_node_object(self, name: str) -> bool:
        """Whether ``name`` is a Node of the cluster (or of the cluster file)."""
        return name in self._records or name in self._static

    @property
    def pods_watched(self) -> bool:
        """Whether pods come from a watch (else only from requests: file mode)."""
        return self._pods_watched

    def refused_topologies(self) -> dict[str, str]:
        """Nodes kept out of placement because their NodeTopology fails validation, with
        the field and the problem (``spec.nvlinkGbps: Input should be greater than 0``)."""
        return dict(self._refused)

    def accepted_conditions(self) -> dict[str, tuple[str, str]]:
        """The ``Accepted`` condition each NodeTopology carries: node -> (status, message)."""
        return dict(self._accepted)

    def node_problem(self, node: str) -> str | None:
        """Why a node is kept out of placement, when gangslice refused its NodeTopology or
        cannot pair its DRA devices with it."""
        problem = self._refused.get(node)
        if problem is not None:
            return f"NodeTopology {node} is refused: {problem}"
        self.snapshot()
        mismatch = self._device_problems.get(node)
        return f"DRA devices of node {node} do not match its NodeTopology: {mismatch}" if mismatch else None

    # -- DRA -----------------------------------------------------------------------------
    def device_problems(self) -> dict[str, str]:
        """DRA nodes kept out of in-node choices: their published GPUs and their NodeTopology
        do not pair one to one (the problem names the device or GPU)."""
        self.snapshot()
        return dict(self._device_problems)

    def devices_matched_conditions(self) -> dict[str, tuple[str, str]]:
        """The ``DevicesMatched`` condition each NodeTopology carries: node -> (status, message)."""
        return dict(self._devices_matched)

    def device_map(self, node: str) -> dra.DeviceMap | None:
        """A DRA node's GPU index -> published device; None for a device-plugin node."""
        self.snapshot()
        return self._device_maps.get(node)

    def device_class_drivers(self, name: str) -> frozenset[str] | None:
        """The drivers DeviceClass ``name`` selects; None when there is no such class."""
        return self._device_classes.get(name)

    def claim_devices(self, namespace: str, name: str) -> tuple[tuple[str, str, str], ...]:
        """``(driver, pool, device)`` of the ``gpu.nvidia.com`` devices claim ``namespace/name`` holds."""
        return self._claim_devices.get(f"{namespace}/{name}", ())

    def claims_holding(self, node: str, devices: Iterable[str]) -> list[str]:
        """The claims (``ns/name``) whose allocations hold any of ``devices`` of pool ``node``."""
        wanted = set(devices)
        return sorted(
            key
            for key, held in self._claim_devices.items()
            if any(p == node and d in wanted for _, p, d in held)
        )

    def allocated_devices(self, node: str) -> frozenset[str]:
        """Devices of ``gpu.nvidia.com`` in pool ``node`` that allocated claims hold."""
        return frozenset(self._allocated_by_pool.get(node, ()))

    # -- pods ----------------------------------------------------------------------------
    def pod(self, namespace: str, name: str) -> PodInfo | None:
        key = f"{namespace}/{name}"
        return self._pods.get(key) or self._recent.get(key)

    def watched_pod(self, namespace: str, name: str) -> PodInfo | None:
        """The pod as the watch (or a bind recorded here) has it; never one only seen in a request."""
        return self._pods.get(f"{namespace}/{name}")

    def pod_by_uid(self, uid: str) -> PodInfo | None:
        key = self._by_uid.get(uid)
        return self._pods.get(key) if key else None

    def pods(self) -> list[PodInfo]:
        return list(self._pods.values())

    def pods_of_gang(self, gang: str) -> list[PodInfo]:
        """The pods seen of gang ``gang`` (:attr:`PodInfo.gang_key`: a plain gang, a Kueue
        Workload's reservation, a Volcano PodGroup): watched, or so far only in a request."""
        return list(self._gang_pods.get(gang, {}).values())

    def _regang(self, key: str, before: PodInfo | None) -> None:
        """Keep :attr:`_gang_pods` on the pod known under ``key`` now; ``before`` is the one
        known before the change."""
        now = self._pods.get(key) or self._recent.get(key)
        was = before.gang_key if before is not None else None
        if was and (now is None or now.gang_key != was):
            members = self._gang_pods.get(was, {})
            members.pop(key, None)
            if not members:
                self._gang_pods.pop(was, None)
        if now is not None and now.gang_key:
            self._gang_pods.setdefault(now.gang_key, {})[key] = now

    def gpus_of(self, pod_key: str) -> frozenset[int]:
        """The GPUs a bound pod holds (as the kubelet reports, annotated, or the lowest free)."""
        pod = self._pods.get(pod_key)
        if pod is None or not pod.holds_gpus or pod.node is None:
            return frozenset()
        self.snapshot()
        return self._pod_gpus.get(pod_key, frozenset())

    def remember(self, pod: PodInfo) -> None:
        """Keep a pod seen in a request, so a later bind knows it without an API call."""
        before = self.pod(pod.namespace, pod.name)
        self._recent[pod.key] = pod
        self._recent.move_to_end(pod.key)
        self._regang(pod.key, before)
        while len(self._recent) > RECENT_PODS:
            key, gone = self._recent.popitem(last=False)
            self._regang(key, gone)

    def forget_gang(self, key: str) -> None:
        """Forget the pods of gang ``key`` known only from requests (members the admission
        webhook refused): the gang is gone, and a new one of that name must not count them."""
        for pod_key in [k for k, p in self._recent.items() if p.gang_key == key and k not in self._pods]:
            gone = self._recent.pop(pod_key)
            self._regang(pod_key, gone)

    def note_bound(self, pod: PodInfo) -> PodInfo | None:
        """Record a pod as bound (``pod.node`` and its GPU annotation set) before the API
        confirms it; returns what was there, for :meth:`restore_pod` if the bind fails."""
        before = self._pods.get(pod.key)
        self._put_pod(pod)
        return before

    def restore_pod(self, key: str, before: PodInfo | None) -> None:
        if before is None:
            self._drop_pod(key)
        else:
            self._put_pod(before)

    # -- reservations ----------------------------------------------------------------------
    def reservation(self, gang: str) -> Reservation | None:
        return self._ledger.get(gang)

    def reservation_named(self, namespace: str, name: str) -> Reservation | None:
        """The reservation whose SliceReservation is ``namespace/name`` (the Kueue path's
        ``gangslice.io/reservation`` annotation), or whose gang key is ``namespace/name``."""
        if self._named is None:
            self._named = {}
            for r in self._ledger.reservations():
                ns = r.meta.get("namespace") or gang_namespace(r.gang)
                self._named[(ns, r.meta.get("name") or object_name(r.gang))] = r.gang
        gang = self._named.get((namespace, name))
        if gang is None:
            return self._ledger.get(f"{namespace}/{name}")
        return self._ledger.get(gang)

    def running_members(self, gang: str) -> int | None:
        """How many pods of plain gang ``gang`` run and hold GPUs (None: pods are not watched
        or not listed yet, so the cache cannot tell)."""
        if not self._pods_watched or self._awaiting:
            return None
        return sum(1 for p in self.pods_of_gang(gang) if p.holds_gpus and not p.deleting)

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
        snap = self._snap
        limits = snap is not None and snap.has_node(node) and snap.node(node).facts.allocatable.reported
        return [node] if limits else []

    def expire(self) -> list[Reservation]:
        """Drop holds past their TTL that are not fully bound; holds owned by a Workload or a
        PodGroup stay until their controller releases them, and so does a hold whose slots are
        ResourceClaims while a pod of its gang lives (the pods point at those claims)."""

        def keep(r: Reservation) -> bool:
            if r.meta.get(names.META_OWNER_KIND) in names.OWNER_MANAGED_KINDS:
                return True
            if r.meta.get(names.META_SLOT_CLAIMS) != "true":
                return False
            return any(not p.terminal and not p.deleting for p in self._gang_pods.get(r.gang, {}).values())

        gone = self._ledger.expire(self.clock(), keep=keep)
        for r in gone:
            self._ledger_changed(r.gang, _held_nodes(r), deleted=r)
        return gone

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
        self._named = None
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
        self._pending.clear()
        self._unsaved.clear()
        self._named = None
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
        self._devices_dirty.update(m.node for m in self._mismatches.values())
        self._check_devices()
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
        async with self._gang_locks.hold(gang):
            if gang not in self._pending:
                return True  # nothing queued: already written
            return await self._write(gang, status=status)

    async def _write(self, gang: str, status: bool = True) -> bool:
        """Write gang's queued change: its object, and its status unless ``status`` is False
        (the gang then stays queued for it)."""
        deleted = self._pending.pop(gang)
        current = self._ledger.get(gang)
        self._writing.add(gang)
        try:
            if current is not None and not status:
                await self.store.save_object(current)
                self._pending.setdefault(gang, deleted)
            elif current is not None:
                await self.store.save(current, self.device_mismatches(gang))
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
            where = (
                f"{r.meta.get('namespace') or gang_namespace(gang)}/{r.meta.get('name') or object_name(gang)}"
                if r
                else ""
            )
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
        """Delete a persisted reservation this cache does not hold (one that overlaps another
        found at a rebuild); a failure is logged."""
        try:
            await self.store.delete(r)
        except Exception as exc:
            log.warning(
                "deleting the reservation of gang %s failed: %s", r.gang, exc, extra=fields(gang=r.gang)
            )

    def flush_soon(self) -> None:
        """Write queued ledger changes in the background, on the running loop, without
        waiting for them: write-behind. The write begins :attr:`write_behind_s` after the
        first change queued since the last one began, so the changes of that window (the
        binds of a gang, say) are written together, one write per reservation instead of
        one per change. Nothing queued here is a promise: a new reservation is
        :meth:`persist`-ed before it is promised, and a bind's truth is its Binding and the
        pod's GPU annotation, which the pod watch brings back after a restart
        (:meth:`_pod_bound`). Without a pod watch (a cluster file) the reservation is that
        record, so the write begins at once. What fails stays queued for the next flush
        (housekeeping retries)."""
        if not self._pending or self._flush_queued is not None:
            return
        delay = self.write_behind_s if self._pods_watched else 0.0

        async def write() -> None:
            if delay > 0:
                await asyncio.sleep(delay)
            self._flush_queued = None  # changes queued from here on start a write of their own
            await self.flush()

        self._flush_queued = asyncio.get_running_loop().create_task(write())

    def save_error(self, gang: str) -> str | None:
        """Why the reservation object of ``gang`` is not saved (its last write failed), or
        None once it is (a status not yet written does not count: the spec is the record)."""
        return self._unsaved.get(gang) if gang in self._ledger else None

    @property
    def unflushed(self) -> int:
        return len(self._pending)

    # -- the kubelet's report ----------------------------------------------------------------
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

    def _status_changed(self, gang: str | None) -> None:
        """A reservation's status must be written again (its spec did not change)."""
        if gang is not None and gang in self._ledger:
            self._pending.setdefault(gang, None)

    def _check_devices(self) -> None:
        """On the nodes whose pods or NodeTopology changed: compare what the kubelet reports
        each bound pod holds with its ``gangslice.io/gpus``, record the differences, and move
        each such pod's reservation slot onto the GPUs it really holds (see
        :mod:`extender.kube.devices`). Only once pods are watched and listed."""
        if not self._devices_dirty or not self._pods_watched or self._awaiting:
            return
        nodes, self._devices_dirty = self._devices_dirty, set()
        for node in sorted(nodes):
            topo = self._topologies.get(node)
            graph = topo.graph if topo is not None else None
            pods = [self._pods[k] for k in sorted(self._by_node.get(node, ())) if k in self._pods]
            found = node_mismatches(node, pods, topo, self.hierarchy, self._claim_promises(node, pods))
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

    def _is_dra(self, node: str) -> bool:
        """Whether a DRA driver publishes the node's devices (as :meth:`_build_state` reads it)."""
        return node not in self._static and node in self._slices_by_node

    def _slot_held(self, pod: PodInfo) -> tuple[Reservation, PodSlot] | None:
        """The reservation slot bound to the pod, with its reservation."""
        r = self.reservation_of(pod)
        slot = r.slot_of(pod.name) if r is not None else None
        if r is not None and slot is not None:
            return r, slot
        for r in self._ledger.reservations():
            if (r.meta.get("namespace") or gang_namespace(r.gang)) == pod.namespace:
                slot = r.slot_of(pod.name)
                if slot is not None:
                    return r, slot
        return None

    def _claim_promises(self, node: str, pods: Iterable[PodInfo]) -> dict[str, tuple[int, ...]]:
        """On a DRA node, what each pod with a slot there was promised: its slot's GPUs, which
        its claim pins. The pod's ``gangslice.io/gpus`` is what its admission planned; a
        re-plan (:mod:`extender.kube.claim_sync`) replaces the claim and the slot, not the
        pod's annotation."""
        topo = self._topologies.get(node)
        if not self._is_dra(node) or topo is None:
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
        held = self._slot_held(self._pods[m.pod])
        if held is None:
            return m
        r, slot = held
        m = dataclasses.replace(m, gang=r.gang, slot=slot.key)
        if slot.node != m.node:
            return dataclasses.replace(m, not_corrected=f"its slot is on node {slot.node}")
        if self._is_dra(m.node):
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

    # -- watch events ----------------------------------------------------------------------
    def replace(self, kind: Kind, objs: Iterable[Mapping[str, Any]]) -> None:
        """A full list of one kind: the new truth for it (a relist after 410 Gone lands here,
        and nothing is dropped before it arrives)."""
        items = list(objs)
        if kind is Kind.NODES:
            fresh = {}
            for obj in items:
                rec = NodeRecord.from_obj(obj)
                if rec.name:
                    fresh[rec.name] = rec
            for name in set(self._records) | set(fresh):
                if self._records.get(name) != fresh.get(name):
                    self._mark(name)
            self._records = fresh
        elif kind is Kind.NODE_TOPOLOGIES:
            before = (self._topologies, self._refused)
            self._topologies, self._refused, self._accepted, self._devices_matched = {}, {}, {}, {}
            for obj in items:
                self._read_topology(obj)
            for name in set(before[0]) | set(before[1]) | set(self._topologies) | set(self._refused):
                if (before[0].get(name), before[1].get(name)) != (
                    self._topologies.get(name),
                    self._refused.get(name),
                ):
                    self._mark(name)
        elif kind is Kind.RESOURCE_SLICES:
            for name in list(self._slices):
                self._drop_slice(name)
            for obj in items:
                self._put_slice(obj)
        elif kind is Kind.DEVICE_CLASSES:
            self._device_classes = {}
            for obj in items:
                self._put_device_class("ADDED", obj)
        elif kind is Kind.RESOURCE_CLAIMS:
            for key in list(self._claim_devices):
                self._put_claim(key, ())
            listed = {_claim_key(obj): obj for obj in items}
            for key in [k for k in self._channels if k not in listed]:
                self._put_channel(key, None)
            for key, obj in listed.items():
                self._put_claim(key, dra.allocated_devices(obj))
                self._put_channel(key, obj)
        elif kind is Kind.PODS:
            fresh_pods = {p.key: p for p in (PodInfo.from_obj(o) for o in items) if p.name}
            for key in [k for k in self._pods if k not in fresh_pods]:
                self._drop_pod(key)
            for pod in fresh_pods.values():
                self._put_pod(pod)
        # SliceReservations: the list only says the watch is on. The ledger is rebuilt from
        # the store once, when this replica starts deciding (rebuild_ledger); its own writes
        # come back as events and change nothing, a deletion by someone else releases.
        was_awaiting = kind in self._awaiting
        self._awaiting.discard(kind)
        if was_awaiting and kind in (Kind.PODS, Kind.SLICE_RESERVATIONS):
            self._reconcile_bindings()
        self._check_devices()
        if was_awaiting and not self._awaiting:
            # Build the snapshot and the view now, before /readyz says ready: the first build
            # walks every node (seconds at 5,000 nodes) and would otherwise stall the first
            # filter kube-scheduler sends.
            self.view()

    def apply(self, kind: Kind, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED or DELETED)."""
        self._apply_event(kind, event_type, obj)
        self._check_devices()

    def _apply_event(self, kind: Kind, event_type: str, obj: Mapping[str, Any]) -> None:
        deleted = event_type == "DELETED"
        if kind is Kind.NODES:
            rec = NodeRecord.from_obj(obj)
            if not rec.name:
                return
            if deleted:
                self._records.pop(rec.name, None)
            elif self._records.get(rec.name) == rec:
                return
            else:
                self._records[rec.name] = rec
            self._mark(rec.name)
        elif kind is Kind.NODE_TOPOLOGIES:
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if not isinstance(name, str) or not name:
                return
            before = (self._topologies.get(name), self._refused.get(name))
            if deleted:
                self._topologies.pop(name, None)
                self._refused.pop(name, None)
                self._accepted.pop(name, None)
                self._devices_matched.pop(name, None)
            else:
                self._read_topology(obj)
            if before != (self._topologies.get(name), self._refused.get(name)):
                self._mark(name)
        elif kind is Kind.RESOURCE_SLICES:
            name = name_of(obj)
            if deleted:
                self._drop_slice(name)
            else:
                self._put_slice(obj)
        elif kind is Kind.DEVICE_CLASSES:
            self._put_device_class(event_type, obj)
        elif kind is Kind.RESOURCE_CLAIMS:
            self._put_claim(_claim_key(obj), () if deleted else dra.allocated_devices(obj))
            self._put_channel(_claim_key(obj), None if deleted else obj)
        elif kind is Kind.PODS:
            pod = PodInfo.from_obj(obj)
            if not pod.name:
                return
            if deleted:
                self._drop_pod(pod.key)
                return
            known = self._pods.get(pod.key)
            if pod.node is None and known is not None and known.node is not None and known.uid == pod.uid:
                # A pod's nodeName is never unset. An event without it for a pod we know is
                # bound is older than that bind (we record the bind before the API confirms
                # it): keep the node, or its GPUs look free.
                pod = dataclasses.replace(pod, node=known.node)
            self._put_pod(pod)
        else:
            self._apply_reservation(event_type, obj)

    # -- internals -----------------------------------------------------------------------
    def _put_slice(self, obj: Mapping[str, Any]) -> None:
        info = dra.parse_slice(obj)
        if info is None:
            return
        self._drop_slice(info.name)
        self._slices[info.name] = info
        if info.node is not None:
            self._slices_by_node.setdefault(info.node, {})[info.name] = info
            self._mark(info.node)

    def _drop_slice(self, name: str) -> None:
        info = self._slices.pop(name, None)
        if info is None or info.node is None:
            return
        on_node = self._slices_by_node.get(info.node, {})
        on_node.pop(name, None)
        if not on_node:
            self._slices_by_node.pop(info.node, None)
        self._mark(info.node)

    def _put_device_class(self, event_type: str, obj: Mapping[str, Any]) -> None:
        name = name_of(obj)
        if not name:
            return
        if event_type == "DELETED":
            self._device_classes.pop(name, None)
        else:
            self._device_classes[name] = dra.class_drivers(obj)

    def _put_claim(self, key: str, devices: Iterable[tuple[str, str, str]]) -> None:
        now = tuple(d for d in devices if d[0] == dra.GPU_DRIVER)
        before = self._claim_devices.get(key, ())
        if now == before:
            return
        if now:
            self._claim_devices[key] = now
        else:
            self._claim_devices.pop(key, None)
        for _, pool, _ in set(before) | set(now):
            self._allocated_by_pool[pool] = {
                dev for held in self._claim_devices.values() for _, p, dev in held if p == pool
            }
            if not self._allocated_by_pool[pool]:
                del self._allocated_by_pool[pool]
            self._mark(pool)

    def _put_channel(self, key: str, obj: Mapping[str, Any] | None) -> None:
        got = cds.channel_domain(obj) if obj is not None else None
        now = (got[0], key.split("/", 1)[0], got[1]) if got is not None else None
        before = self._channels.get(key)
        if now == before:
            return
        if now is None:
            del self._channels[key]
        else:
            self._channels[key] = now
        self._mark_domain({d[0] for d in (before, now) if d is not None})

    def _mark_domain(self, uids: set[str]) -> None:
        """Rebuild the nodes NVIDIA's driver labels with one of these ComputeDomains."""
        if uids:
            for name, rec in self._records.items():
                if rec.labels.get(cds.NODE_LABEL) in uids:
                    self._mark(name)

    def _domain_holder(self, labels: Mapping[str, str]) -> tuple[str | None, str | None]:
        """(the gang, else the words for someone else) holding the ComputeDomain the node's
        ``resource.nvidia.com/computeDomain`` label names; (None, None) without the label.
        A domain is a gang's when one of gangslice's channel claims of its reservation names
        it (the domain it created, or the one it adopted)."""
        uid = labels.get(cds.NODE_LABEL)
        if not uid:
            return None, None
        for domain, namespace, reservation in self._channels.values():
            if domain == uid:
                r = self.reservation_named(namespace, reservation)
                if r is not None:
                    return r.gang, None
        return None, cds.label_holder(uid)

    def _read_topology(self, obj: Mapping[str, Any]) -> None:
        """Take in one NodeTopology object (it has a name): its graph, or why it is refused."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            return
        shown = accepted_condition(obj)
        if shown is None:
            self._accepted.pop(name, None)
        else:
            self._accepted[name] = shown
        matched = condition_of(obj, DEVICES_MATCHED)
        if matched is None:
            self._devices_matched.pop(name, None)
        else:
            self._devices_matched[name] = matched
        try:
            self._topologies[name] = parse_node_topology(obj)
        except CrdError as exc:
            self._topologies.pop(name, None)
            problem = f"{exc.field}: {exc.problem}" if exc.field else str(exc)
            if self._refused.get(name) != problem:
                log.warning("node %s kept out of placement: %s", name, exc)
            self._refused[name] = problem
        else:
            self._refused.pop(name, None)

    def _mark(self, node: str) -> None:
        """A node's state must be rebuilt (its labels, graph or pods changed)."""
        self._dirty_nodes.add(node)
        self._devices_dirty.add(node)
        self._log_change(node)

    def _held_changed(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._held_dirty.add(node)
            self._log_change(node)

    def _log_change(self, node: str) -> None:
        self._version += 1
        self._changes.append((self._version, node))

    def _ledger_changed(
        self, gang: str, nodes: Iterable[str] = (), deleted: Reservation | None = None
    ) -> None:
        """``nodes``: where the reserved GPUs changed (none for a bind or unbind)."""
        self._named = None
        self._held_changed(nodes)
        if self._channels and (deleted is not None or nodes):
            r = deleted or self._ledger.get(gang)
            if r is not None:
                ns = r.meta.get("namespace") or gang_namespace(gang)
                name = r.meta.get("name") or object_name(gang)
                self._mark_domain({u for u, n, res in self._channels.values() if (n, res) == (ns, name)})
        if deleted is not None:
            self._pending[gang] = deleted
        else:
            self._pending.setdefault(gang, None)
            if self._pending[gang] is not None and gang in self._ledger:
                self._pending[gang] = None

    def _apply_reservation(self, event_type: str, obj: Mapping[str, Any]) -> None:
        try:
            r = reservation_from_object(obj)
        except CrdError as exc:
            log.warning("ignoring %s", exc)
            return
        if event_type != "DELETED":
            return
        mine = self._ledger.get(r.gang)
        # Someone else deleted the object: release, unless it is an older hold than ours.
        ours = r.gang in self._pending or r.gang in self._writing
        if mine is not None and mine.slice.to_dict() == r.slice.to_dict() and not ours:
            self._ledger.release(r.gang)
            self._named = None
            self._held_changed(_held_nodes(mine))

    def _put_pod(self, pod: PodInfo) -> None:
        old = self._pods.get(pod.key)
        before = old or self._recent.get(pod.key)
        self._pods[pod.key] = pod
        if pod.uid:
            self._by_uid[pod.uid] = pod.key
        self._recent.pop(pod.key, None)
        self._regang(pod.key, before)
        for p in (old, pod):
            if p is not None and p.node is not None:
                if old is None or _gpu_facts(old) != _gpu_facts(pod):
                    self._mark(p.node)
                self._by_node.setdefault(p.node, set())
        if old is not None and old.node is not None and old.node != pod.node:
            self._by_node[old.node].discard(pod.key)
        if pod.node is not None:
            self._by_node[pod.node].add(pod.key)
        if self._pods_watched and not self._awaiting:
            if pod.terminal or pod.deleting:
                self._pod_gone(pod)
            elif pod.holds_gpus:
                self._pod_bound(pod)

    def _drop_pod(self, key: str) -> None:
        pod = self._pods.pop(key, None)
        if pod is None:
            return
        self._regang(key, pod)
        if pod.uid and self._by_uid.get(pod.uid) == key:
            del self._by_uid[pod.uid]
        if pod.node is not None:
            self._by_node.get(pod.node, set()).discard(key)
            self._mark(pod.node)
        self._pod_gpus.pop(key, None)
        if self._pods_watched and not self._awaiting:
            self._pod_gone(pod)

    def _alive(self, namespace: str, name: str) -> bool:
        p = self._pods.get(f"{namespace}/{name}")
        return p is not None and not p.terminal and not p.deleting

    def _pod_gone(self, pod: PodInfo) -> None:
        """A pod that held a slot finished or was deleted: free its slot for a replacement
        (with a fresh TTL), or release the reservation when no pod of the gang is left."""
        for r in self._ledger.reservations():
            ns = r.meta.get("namespace") or gang_namespace(r.gang)
            if ns != pod.namespace:
                continue
            slot = r.slot_of(pod.name)
            if slot is None:
                continue
            others = [name for key, name in r.bound.items() if key != slot.key and self._alive(ns, name)]
            if not others:
                # Nothing of the gang runs any more: done, or being recreated (a plain gang
                # is then placed afresh on first sight; a controller re-reserves its own).
                self.drop(r.gang)
            else:
                self.unbind_slot(r.gang, slot.key)

    def _pod_bound(self, pod: PodInfo) -> None:
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

    def reservation_of(self, pod: PodInfo) -> Reservation | None:
        """The reservation of the gang ``pod`` belongs to (:attr:`PodInfo.gang_key`), if held."""
        if pod.reservation_name:
            return self.reservation_named(pod.namespace, pod.reservation_name)
        key = pod.gang_key
        return self._ledger.get(key) if key is not None and key in self._ledger else None

    def _reconcile_bindings(self) -> None:
        if not self._pods_watched or self._awaiting:
            return
        for r in self._ledger.reservations():
            ns = r.meta.get("namespace") or gang_namespace(r.gang)
            for name in list(r.bound.values()):
                if not self._alive(ns, name):
                    info = self._pods.get(f"{ns}/{name}") or PodInfo(namespace=ns, name=name)
                    self._pod_gone(info)
        for pod in self._pods.values():
            if pod.holds_gpus and not pod.deleting:
                self._pod_bound(pod)

    def _source(self, name: str) -> _StaticNode | None:
        static = self._static.get(name)
        if static is not None:
            return static
        rec = self._records.get(name)
        if rec is None or not rec.ready or name in self._refused:
            return None
        topo = self._topologies.get(name)
        graph = topo.graph if topo is not None else None
        if graph is None:
            if rec.gpu_count <= 0:
                return None
            graph = fallback_graph(rec.gpu_count, rec.product)
        allocation = topo.allocation if topo is not None else Allocation.DEVICE_PLUGIN
        kubelet = topo.kubelet if topo is not None else None
        return _StaticNode(rec.labels, graph, frozenset(), frozenset(), allocation, rec.facts, kubelet)

    def _dra_source(self, name: str) -> tuple[_StaticNode, dra.DeviceMap] | None:
        """A node whose GPUs ``gpu.nvidia.com`` publishes: its graph paired with the devices
        (or the mismatch recorded and the node kept out of placement)."""
        devices = dra.gpu_devices(self._slices_by_node.get(name, {}).values())
        rec = self._records.get(name)
        if rec is None or not rec.ready or name in self._refused:
            return None
        topo = self._topologies.get(name)
        got = dra.match_devices(name, topo.graph if topo is not None else None, devices)
        if isinstance(got, str):
            if self._device_problems.get(name) != got:
                log.warning("node %s kept out of in-node choices: %s", name, got)
            self._device_problems[name] = got
            return None
        assert topo is not None and topo.graph is not None
        node = _StaticNode(
            rec.labels, topo.graph, frozenset(), frozenset(), Allocation.DRA, rec.facts, topo.kubelet
        )
        return node, got

    def _build_state(self, name: str) -> NodeState | None:
        self._device_maps.pop(name, None)
        self._device_problems.pop(name, None)
        dra_taken: set[int] = set()
        if self._is_dra(name):
            got = self._dra_source(name)
            if got is None:
                return None
            src, device_map = got
            self._device_maps[name] = device_map
            held = self._allocated_by_pool.get(name, set())
            dra_taken = {i for i, d in device_map.by_index.items() if d.name in held}
        else:
            found = self._source(name)
            if found is None:
                return None
            src = found
        known = set(src.graph.indices)
        sick = {g for g in src.graph.indices if not src.graph.healthy(g)} | set(src.unhealthy)
        taken = set(src.allocated) | dra_taken
        topo = self._topologies.get(name)
        in_use = topo.in_use if topo is not None else {}
        keys = sorted(k for k in self._by_node.get(name, ()) if k in self._pods)
        # On a DRA node the allocated claims are the truth of what is taken (a pod's
        # annotation is what was planned at its admission); no device plugin hands out GPUs.
        dra_node = src.allocation is Allocation.DRA and name in self._device_maps
        holding = [] if dra_node else [self._pods[k] for k in keys if self._pods[k].holds_gpus]
        guessed = []
        # Exact first (what the kubelet reports, then our annotation), guesses last.
        for p in holding:
            exact = in_use.get(p.key) or p.assigned_gpus
            if not exact:
                guessed.append(p)
                continue
            mine = frozenset(g for g in exact if g in known)
            self._pod_gpus[p.key] = mine
            taken |= mine
        order = sorted(known, key=lambda g: (g in sick, g))
        for p in guessed:
            free = [g for g in order if g not in taken][: p.gpus]
            self._pod_gpus[p.key] = frozenset(free)
            taken.update(free)
        holder, foreign = self._domain_holder(src.labels)
        return NodeState(
            name,
            src.labels,
            src.graph,
            frozenset(taken),
            frozenset(sick & known),
            mnnvl_gang=holder,
            foreign_domain=foreign,
            allocation=src.allocation,
            facts=self._facts(name, src),
            kubelet=src.kubelet,
        )

    def _facts(self, name: str, src: _StaticNode) -> NodeFacts:
        """The node's filter facts with what its non-terminal pods request (kube-scheduler's
        NodeInfo.Requested counts every pod bound to the node until it is gone or finished)."""
        requested = src.facts.requested
        for key in sorted(self._by_node.get(name, ())):
            p = self._pods.get(key)
            if p is not None and not p.terminal:
                requested = requested.plus(usage(p.needs.requests))
        return dataclasses.replace(src.facts, requested=requested, imex_daemon=self.imex_daemon)


def _held_nodes(r: Reservation) -> tuple[str, ...]:
    """The nodes a reservation holds something on: its slots' GPUs, its NVLink channels."""
    return (*r.slice.nodes, *r.slice.mnnvl_nodes)


def _put_or_drop(table: dict[str, Any], key: str, value: Any) -> None:
    if value:
        table[key] = value
    else:
        table.pop(key, None)


def _claim_key(obj: Mapping[str, Any]) -> str:
    return f"{namespace_of(obj)}/{name_of(obj)}"


def _offer(state: NodeState | None) -> tuple[object, ...] | None:
    """What of a node counts on an empty cluster (see :attr:`ClusterCache.node_generation`)."""
    if state is None:
        return None
    kubelet = state.kubelet.emptied() if state.kubelet is not None else None
    return (state.labels, state.graph, state.unhealthy, state.allocation, state.facts.static(), kubelet)


def _gpu_facts(pod: PodInfo) -> tuple[object, ...]:
    """What of a pod decides the GPUs it takes (a status-only update changes none of it)."""
    return pod.node, pod.holds_gpus, pod.gpus, pod.annotations.get(GPUS_ANNOTATION), pod.needs.requests
