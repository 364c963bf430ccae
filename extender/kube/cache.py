"""The informer: one in-memory snapshot of the cluster, kept by watch events.

It observes and decides nothing. Watch events (or a cluster file) change it; decisions read
:meth:`ClusterInformer.snapshot` (what pods and the cluster file take, reservations not
applied). What it sees that matters to a reservation it tells its listeners
(:class:`Listener`): a pod gone, a pod bound, a SliceReservation deleted, the nodes whose
kubelet report changed, a kind listed for the first time, the owners (ReplicaSets,
StatefulSets, :mod:`extender.kube.owners`) of a plain gang's pods or its upstream PodGroup
changed. The book of reservations (:mod:`extender.reservations.book`) is the listener that
decides what follows. Everything runs on one asyncio loop; mutations are synchronous, so no
decision sees a half-applied event.

GPUs taken on a node: the cluster file's ``allocatedGpus``, plus, for every bound, unfinished
pod, the GPUs the node agent reports the kubelet gave it (NodeTopology ``devicesInUse``: the
truth), or else its ``gangslice.io/gpus`` annotation; a bound pod with neither takes as many
of the lowest free GPU indices as it requests (pods in name order). A pod reported on other
GPUs than its annotation promised is a device mismatch (:mod:`extender.kube.devices`), which
the listeners are told of.

What kube-scheduler's filters read of a node (taints, ``spec.unschedulable``,
``status.allocatable``) comes from its Node object, and what its non-terminal pods request
from those pods (:class:`~extender.placement.feasibility.NodeFacts`); a cordoned node stays
in the snapshot, for the pods that tolerate it. A NotReady node is left out.

A node whose NodeTopology fails validation is kept out of the snapshot (never given a
guessed graph) and listed by :meth:`ClusterInformer.refused_topologies` with the field and
the problem; :mod:`extender.kube.topology_status` says so on the object and its Node.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, Self

from extender.kube import compute_domains as cds
from extender.kube import dra
from extender.kube.api import ALL_KINDS, Kind, name_of, namespace_of
from extender.kube.crd_models import CrdError, NodeTopology, parse_node_topology, reservation_from_object
from extender.kube.names import GPUS as GPUS_ANNOTATION
from extender.kube.node_graphs import NodeRecord, fallback_graph
from extender.kube.owners import OwnerTable
from extender.kube.pods import PodInfo
from extender.kube.topology_status import SCHEDULER_CONDITIONS, condition_of
from extender.placement.feasibility import IMEX_DAEMON, NO_FACTS, NodeFacts, Resources, usage
from extender.placement.files import load_cluster
from extender.placement.ledger import Reservation
from extender.placement.search.memory import SolverMemory
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import Hierarchy
from extender.topology.kubelet import KubeletAlignment
from extender.topology.model import GpuGraph, GpuHealth

log = logging.getLogger(__name__)

#: How many pods seen in requests are remembered for a later bind (file mode has no pod watch).
RECENT_PODS = 10_000
#: How many node changes are remembered for decision memos to catch up on (beyond: start over).
CHANGE_LOG = 50_000
#: The kinds whose objects size plain gangs (:mod:`extender.kube.owners`): the owners of their
#: pods, and the upstream PodGroups they join.
OWNER_KINDS = frozenset({Kind.REPLICA_SETS, Kind.STATEFUL_SETS, Kind.WORKLOAD_POD_GROUPS})


@dataclasses.dataclass(frozen=True, slots=True)
class _StaticNode:
    labels: Mapping[str, str]
    graph: GpuGraph
    allocated: frozenset[int]
    unhealthy: frozenset[int]
    allocation: Allocation = Allocation.DEVICE_PLUGIN
    facts: NodeFacts = NO_FACTS
    kubelet: KubeletAlignment | None = None


class Listener(Protocol):
    """What the informer tells of what it saw (pods only once pods are watched and listed)."""

    def pod_gone(self, pod: PodInfo) -> None:
        """A pod finished, is being deleted or is gone."""

    def pod_bound(self, pod: PodInfo) -> None:
        """A pod holds GPUs on its node (seen bound, or recorded bound before the API said so)."""

    def reservation_deleted(self, r: Reservation) -> None:
        """A SliceReservation object was deleted (by anyone)."""

    def devices_reported(self, nodes: Iterable[str]) -> None:
        """These nodes' pods or the kubelet's report of their devices changed."""

    def listed(self, kind: Kind) -> None:
        """The first full list of ``kind`` is in."""

    def nodes_rebuilt(self, changed: Mapping[str, NodeState] | None) -> None:
        """The snapshot took these nodes' new states (None: it was built anew)."""

    def owners_changed(self, gangs: Iterable[str]) -> None:
        """The owners of these plain gangs' pods changed (a scale, a new revision)."""


def _no_gang(namespace: str, name: str) -> str | None:
    return None


class ClusterInformer:
    """Nodes, their GPU graphs and pods; see the module docstring."""

    def __init__(
        self,
        *,
        hierarchy: Hierarchy | None = None,
        clock: Callable[[], float] = time.time,
        awaiting: Iterable[Kind] = ALL_KINDS,
        imex_daemon: Resources = IMEX_DAEMON,
    ) -> None:
        self.hierarchy = hierarchy or Hierarchy()
        #: What the IMEX daemon pod of a ComputeDomain takes on each node (``serve
        #: --imex-daemon-requests``).
        self.imex_daemon = imex_daemon
        self.clock = clock
        self._listeners: list[Listener] = []
        #: The gang holding the SliceReservation ``namespace/name``, if any (whose ComputeDomain
        #: a node's label names); set by whoever holds reservations.
        self.reservation_gang: Callable[[str, str], str | None] = _no_gang
        self._awaiting = set(awaiting)
        #: Pods are watched: a pod missing from the cache is gone (not so in file mode).
        self._pods_watched = Kind.PODS in self._awaiting
        self._static: dict[str, _StaticNode] = {}
        self._records: dict[str, NodeRecord] = {}
        self._topologies: dict[str, NodeTopology] = {}
        #: Nodes whose NodeTopology fails validation -> "<field>: <problem>"; kept out of
        #: placement (see :mod:`extender.kube.topology_status`).
        self._refused: dict[str, str] = {}
        #: Condition type -> nodes whose NodeTopology carries it -> (status, message), for the
        #: conditions the scheduler side writes (``Accepted``, ``DevicesMatched``,
        #: ``InterconnectHealthy``).
        self._shown: dict[str, dict[str, tuple[str, str]]] = {t: {} for t in SCHEDULER_CONDITIONS}
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
        #: The ReplicaSets and StatefulSets whose templates name a plain gang, and the upstream
        #: PodGroups: its pod sets' sizes.
        self.owners = OwnerTable(self.pods_of_gang, self.hierarchy)
        self._pods: dict[str, PodInfo] = {}
        self._by_uid: dict[str, str] = {}
        self._by_node: dict[str, set[str]] = {}
        self._pod_gpus: dict[str, frozenset[int]] = {}
        self._states: dict[str, NodeState] = {}
        self._dirty_nodes: set[str] = set()
        self._snap: ClusterSnapshot | None = None
        #: What the solver keeps across decisions (:mod:`extender.placement.search.memory`):
        #: owned here for the life of the process and carried by every snapshot built here,
        #: so it outlives a rebuild of the snapshot when nodes come or go.
        self.solver_memory = SolverMemory()
        self._version = 0
        self._node_generation = 0
        self._changes: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)
        self._recent: OrderedDict[str, PodInfo] = OrderedDict()
        #: Plain gang key -> pod key -> the pod as :meth:`pod` gives it (watched, else seen in
        #: a request): a gang's members without a walk over every pod.
        self._gang_pods: dict[str, dict[str, PodInfo]] = {}
        #: Nodes whose pods or NodeTopology changed since the listeners were last told.
        self._devices_dirty: set[str] = set()

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_snapshot(cls, snap: ClusterSnapshot, *, awaiting: Iterable[Kind] = (), **kwargs: Any) -> Self:
        """A cache over a fixed set of nodes (no API server); ready at once, or once each
        kind of ``awaiting`` is listed (``(Kind.PODS,)``: pods come from a watch). ``kwargs``
        go to the constructor."""
        cache = cls(hierarchy=snap.hierarchy, awaiting=awaiting, **kwargs)
        for n in snap.nodes:
            cache._static[n.name] = _StaticNode(
                dict(n.labels), n.graph, n.allocated, n.unhealthy, n.allocation, n.facts, n.kubelet
            )
            cache._dirty_nodes.add(n.name)
        return cache

    @classmethod
    def from_cluster_file(cls, path: str | Path, **kwargs: Any) -> Self:
        """A cache over a cluster file (``gangslice serve --cluster FILE``); raises FileError."""
        return cls.from_snapshot(load_cluster(path), **kwargs)

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` from now on what is seen."""
        self._listeners.append(listener)

    # -- state ---------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True once the first full list of every watched kind is in."""
        return not self._awaiting

    @property
    def awaiting(self) -> frozenset[Kind]:
        return frozenset(self._awaiting)

    @property
    def pods_listed(self) -> bool:
        """Pods are watched and their first list is in: a pod missing here is gone."""
        return self._pods_watched and not self._awaiting

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
                for listener in self._listeners:
                    listener.nodes_rebuilt(None)
            elif changed:
                self._snap = self._snap.updated(changed)
                for listener in self._listeners:
                    listener.nodes_rebuilt(changed)
        return self._snap

    @property
    def built(self) -> ClusterSnapshot | None:
        """The snapshot as last built (without taking in what changed since), if any."""
        return self._snap

    def note_changed(self, nodes: Iterable[str]) -> None:
        """What these nodes offer changed outside the snapshot (what is reserved there):
        decision memos keyed by :attr:`version` must look again."""
        for node in nodes:
            self._log_change(node)

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

    def conditions_shown(self, type_: str) -> dict[str, tuple[str, str]]:
        """The condition ``type_`` (one of the scheduler side's) each NodeTopology carries:
        node -> (status, message)."""
        return dict(self._shown[type_])

    def retrying_links(self) -> dict[str, str]:
        """Nodes with healthy GPUs whose links retry (error rates under the agent's thresholds),
        naming each GPU and the share of its bandwidth placement counts on
        (:attr:`~extender.topology.model.GpuHealth.nvlink_share`)."""

        def priced(graph: GpuGraph, i: int, h: GpuHealth) -> str | None:
            if not h.healthy or (h.nvlink_errors_per_s <= 0 and h.pcie_replays_per_s <= 0):
                return None
            return (
                f"GPU{i}: NVLink at {h.nvlink_share:.0%} ({h.nvlink_errors_per_s:g} errors/s), "
                f"PCIe at {h.pcie_share:.0%} ({h.pcie_replays_per_s:g} replays/s)"
            )

        return self._gpu_lines(priced)

    def interconnect_problems(self) -> dict[str, str]:
        """Nodes whose agent reports a GPU unhealthy (an NVLink or PCIe error rate over its
        threshold, or counters it cannot read), naming each GPU and why. Those GPUs are kept
        out of placement (:class:`~extender.placement.snapshot.NodeState`)."""

        def sick(graph: GpuGraph, i: int, h: GpuHealth) -> str | None:
            if h.healthy:
                return None
            uuid = graph.gpu(i).uuid if i in graph.indices else None
            return f"GPU{i}{f' ({uuid})' if uuid else ''}: {h.reason or 'unhealthy'}"

        return self._gpu_lines(sick)

    def _gpu_lines(self, line: Callable[[GpuGraph, int, GpuHealth], str | None]) -> dict[str, str]:
        """Node -> ``line`` of each of its GPUs' health that has one, joined; nodes with none left out."""
        out = {}
        for name, topo in self._topologies.items():
            if topo.graph is None:
                continue
            graph = topo.graph
            lines = [got for i, h in sorted(graph.health.items()) if (got := line(graph, i, h)) is not None]
            if lines:
                out[name] = "; ".join(lines)
        return out

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

    def device_map(self, node: str) -> dra.DeviceMap | None:
        """A DRA node's GPU index -> published device; None for a device-plugin node."""
        self.snapshot()
        return self._device_maps.get(node)

    def at_root(self, node: str, device_class: str, root: str) -> int:
        """How many devices of the drivers DeviceClass ``device_class`` selects sit on PCIe root
        ``root`` of ``node`` (NICs beside the GPUs there; the class's other selectors unread)."""
        drivers = self._device_classes.get(device_class) or frozenset()
        return dra.devices_at_root(self._slices_by_node.get(node, {}).values(), drivers, root)

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

    # -- what the listeners are told -------------------------------------------------------
    def _report_devices(self) -> None:
        """Tell the listeners which nodes' pods or NodeTopology changed, once pods are watched
        and listed (until then the nodes wait)."""
        if not self._devices_dirty or not self.pods_listed:
            return
        nodes, self._devices_dirty = self._devices_dirty, set()
        for listener in self._listeners:
            listener.devices_reported(nodes)

    def recheck_devices(self, nodes: Iterable[str]) -> None:
        """Tell the listeners again of these nodes' devices (with those not told yet)."""
        self._devices_dirty.update(nodes)
        self._report_devices()

    def topology(self, node: str) -> NodeTopology | None:
        """The node's NodeTopology, as accepted."""
        return self._topologies.get(node)

    def pods_on(self, node: str) -> list[PodInfo]:
        """The watched pods bound to ``node``, in key order."""
        return [self._pods[k] for k in sorted(self._by_node.get(node, ())) if k in self._pods]

    def pod_alive(self, namespace: str, name: str) -> bool:
        """Whether the pod is watched and neither finished nor being deleted."""
        p = self._pods.get(f"{namespace}/{name}")
        return p is not None and not p.terminal and not p.deleting

    def is_dra(self, node: str) -> bool:
        """Whether a DRA driver publishes the node's devices (as :meth:`_build_state` reads it)."""
        return self._is_dra(node)

    @property
    def has_channels(self) -> bool:
        """Whether any of gangslice's ComputeDomain channel claims is known."""
        return bool(self._channels)

    def mark_domains_of(self, namespace: str, name: str) -> None:
        """What is reserved under SliceReservation ``namespace/name`` changed: rebuild the
        nodes of the ComputeDomains its channel claims name."""
        if self._channels:
            self._mark_domain({u for u, n, res in self._channels.values() if (n, res) == (namespace, name)})

    def _is_dra(self, node: str) -> bool:
        """Whether ``gpu.nvidia.com`` publishes the node's GPUs (as :meth:`_build_state` reads it).
        A node whose only slices are other drivers' (the ComputeDomain driver's channels on a
        GB200 tray whose GPUs the device plugin hands out: NVIDIA's supported setup) is not."""
        slices = self._slices_by_node.get(node, {})
        return node not in self._static and any(s.driver == dra.GPU_DRIVER for s in slices.values())

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
            self._topologies, self._refused = {}, {}
            self._shown = {t: {} for t in SCHEDULER_CONDITIONS}
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
        elif kind in OWNER_KINDS:
            self._owners_changed(self.owners.replace(kind.resource.kind, items))
        # SliceReservations: the list only says the watch is on. The ledger is rebuilt from
        # the store once, when this replica starts deciding (rebuild_ledger); its own writes
        # come back as events and change nothing, a deletion by someone else releases.
        was_awaiting = kind in self._awaiting
        self._awaiting.discard(kind)
        if was_awaiting:
            for listener in self._listeners:
                listener.listed(kind)
        self._report_devices()

    def apply(self, kind: Kind, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED or DELETED)."""
        self._apply_event(kind, event_type, obj)
        self._report_devices()

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
                for shown in self._shown.values():
                    shown.pop(name, None)
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
                # it): keep the node and what the bind wrote, or its GPUs look free.
                pod = dataclasses.replace(
                    pod, node=known.node, annotations={**pod.annotations, **known.annotations}
                )
            self._put_pod(pod)
        elif kind in OWNER_KINDS:
            table = self.owners
            self._owners_changed(
                table.drop(kind.resource.kind, obj) if deleted else table.put(kind.resource.kind, obj)
            )
        else:
            self._apply_reservation(event_type, obj)

    def _owners_changed(self, gangs: set[str]) -> None:
        if gangs:
            for listener in self._listeners:
                listener.owners_changed(sorted(gangs))

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
                gang = self.reservation_gang(namespace, reservation)
                if gang is not None:
                    return gang, None
        return None, cds.label_holder(uid)

    def _read_topology(self, obj: Mapping[str, Any]) -> None:
        """Take in one NodeTopology object (it has a name): its graph, or why it is refused."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            return
        for type_, shown in self._shown.items():
            carried = condition_of(obj, type_)
            if carried is None:
                shown.pop(name, None)
            else:
                shown[name] = carried
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

    def _log_change(self, node: str) -> None:
        self._version += 1
        self._changes.append((self._version, node))

    def _apply_reservation(self, event_type: str, obj: Mapping[str, Any]) -> None:
        try:
            r = reservation_from_object(obj)
        except CrdError as exc:
            log.warning("ignoring %s", exc)
            return
        if event_type == "DELETED":
            for listener in self._listeners:
                listener.reservation_deleted(r)

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
        if self.pods_listed:
            for listener in self._listeners:
                if pod.terminal or pod.deleting:
                    listener.pod_gone(pod)
                elif pod.holds_gpus:
                    listener.pod_bound(pod)

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
        if self.pods_listed:
            for listener in self._listeners:
                listener.pod_gone(pod)

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
        # Exact first (what the kubelet reports, then our annotation), guesses last. A pod
        # holds what the kubelet says it holds, or else what it requests from the device
        # plugin: an annotation says which GPUs only when it names as many (anyone who can
        # create a pod can write one; a CPU-only pod holds none whatever it says).
        for p in holding:
            exact: Collection[int] | None = in_use.get(p.key)
            if not exact and p.plugin_gpus and len(set(p.assigned_gpus or ())) == p.plugin_gpus:
                exact = p.assigned_gpus
            if not exact:
                if p.plugin_gpus:
                    guessed.append(p)
                continue
            mine = frozenset(g for g in exact if g in known)
            self._pod_gpus[p.key] = mine
            taken |= mine
        order = sorted(known, key=lambda g: (g in sick, g))
        for p in guessed:
            free = [g for g in order if g not in taken][: p.plugin_gpus]
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


def _claim_key(obj: Mapping[str, Any]) -> str:
    return f"{namespace_of(obj)}/{name_of(obj)}"


def _offer(state: NodeState | None) -> tuple[object, ...] | None:
    """What of a node counts on an empty cluster (see :attr:`ClusterInformer.node_generation`)."""
    if state is None:
        return None
    kubelet = state.kubelet.emptied() if state.kubelet is not None else None
    return (state.labels, state.graph, state.unhealthy, state.allocation, state.facts.static(), kubelet)


def _gpu_facts(pod: PodInfo) -> tuple[object, ...]:
    """What of a pod decides the GPUs it takes (a status-only update changes none of it)."""
    return pod.node, pod.holds_gpus, pod.gpus, pod.annotations.get(GPUS_ANNOTATION), pod.needs.requests
