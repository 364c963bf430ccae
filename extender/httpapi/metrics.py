"""Prometheus metrics of the extender service, on a registry of its own (one per app).

- ``gangslice_extender_request_duration_seconds{verb}``: histogram of handling time.
- ``gangslice_extender_requests_total{verb,code}``: requests by HTTP status.
- ``gangslice_decision_duration_seconds{verb}``: histogram of the decision alone (the
  decider's call, without decoding the request or encoding the reply).
- ``gangslice_decisions_total{outcome}``: decisions by outcome (``fit``, ``no-fit``,
  ``reserved``, ``unsaved`` (a reservation the store could not write: not promised),
  ``unplaceable``, ``waiting``, ``invalid``, ``bound``, ``bind-failed``,
  ``scored``, ``preempt``, ``permit``, ``reject``, ``abstain``, ``allocated``, ``error``,
  ``standby``: refused because another replica leads).
- ``gangslice_reservations{phase}``: reservations held now, by phase (Reserved, Bound).
- ``gangslice_gpus{state}``: GPUs by state (see :data:`GPU_STATES`).
- ``gangslice_free_coherent_gpus{level}``: per hierarchy level (and ``node``), the largest
  coherent free block one domain offers (see :func:`free_coherent`).
- ``gangslice_level_gpus{level,state}``: per hierarchy level (and ``node``), GPUs held by
  reservations (``reserved``) and by bound slots (``bound``) on the nodes inside some domain
  of that level (see :func:`level_gpus`).
- ``gangslice_devices_mismatch_total{node}``: bound pods found holding other GPUs than their
  ``gangslice.io/gpus`` promise, as the kubelet reports them (one per new difference).
- ``gangslice_devices_mismatched_pods``: pods with such a difference now.
- ``gangslice_mismatch_evictions_total{result}``: evictions of such pods under
  ``--on-mismatch=evict`` (``evicted``; ``blocked``: a PodDisruptionBudget answered 429;
  ``failed``).
- ``gangslice_connections_closed_total{port,why}``, ``gangslice_connections_open{port,peer}``:
  what the connection guards (:mod:`extender.httpapi.limits`) closed and hold.
- ``gangslice_leader_fence_refusals_total``: decisions and writes refused by the leader fence
  (:mod:`extender.kube.fence`).
- ``gangslice_cache_ready``: 1 once the first full list of every watched kind is in.
- ``gangslice_cache_nodes``: GPU nodes in the snapshot.
- ``gangslice_refused_gangs``: gangs refused for want of room and not placed since
  (:mod:`extender.placement.waiting`).
- ``gangslice_cliques_kept``: the whole multi-node NVLink cliques placement keeps for the
  gangs that ask for one: the one with the most free GPUs while such a gang waits, every one
  while that is not known yet, none otherwise
  (:meth:`~extender.placement.snapshot.ClusterSnapshot.kept_cliques`).
- ``gangslice_migration_plans_total``, ``gangslice_migration_moves_total``,
  ``gangslice_migration_restart_gpu_seconds_total``: the migration plans for gangs that
  waited (told, or carried out with ``--migration on``), the replicas they move and the
  restart they cost; ``gangslice_migration_evictions_total{result}``: the evictions of those
  carried out (:mod:`extender.controllers.migration`).
- ``gangslice_gpu_worth{model,pod_gpus}``: what a GPU of each model is worth to the gangs asked
  for within the last hour, per size of pod (the best speed one of their pod sets gets there;
  :mod:`extender.placement.hardware`): placement leaves GPUs worth more to others than to the
  gang it places.

The GPU gauges are computed from the cache at each scrape: O(nodes), with the per-node-type
memo of :mod:`extender.placement.node_fit` doing the in-node work once per free mask; the
per-level counts walk the reservations' slots only (O(slots x levels)).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.httpapi.health_metrics import HealthCollector
from extender.httpapi.limits import ConnectionGuard
from extender.placement.ledger import Phase, Reservation
from extender.placement.node_fit import fit_for
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.waiting import DEMAND_MEMORY_S, WAITING_TTL_S
from extender.reservations import ClusterCache

#: Buckets for a service whose target is well under 5 ms.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: The ``level`` of ``gangslice_free_coherent_gpus`` for single nodes (below every level).
NODE_LEVEL = "node"

#: The ``state`` values of ``gangslice_level_gpus`` (a subset of :data:`GPU_STATES`).
LEVEL_STATES = ("reserved", "bound")

GPU_STATES = {
    "total": "every GPU of every node",
    "allocated": "taken by bound pods (or the cluster file's allocatedGpus)",
    "unhealthy": "reported unhealthy",
    "reserved": "held by reservations for pods not yet bound",
    "bound": "held by reservation slots a pod is bound to (also counted in allocated once the pod shows up)",
    "free": "neither allocated, unhealthy nor held by any reservation",
}


@dataclass(frozen=True, slots=True)
class GpuCounts:
    total: int
    allocated: int
    unhealthy: int
    reserved: int
    bound: int
    free: int

    def by_state(self) -> dict[str, int]:
        return {state: getattr(self, state) for state in GPU_STATES}


def gpu_counts(snap: ClusterSnapshot, view: ClusterSnapshot, reservations: list[Reservation]) -> GpuCounts:
    """GPU totals of a snapshot (pods only) and its view (reservations taken out)."""
    reserved = bound = 0
    for r in reservations:
        for slot in r.slice.slots:
            if slot.key in r.bound:
                bound += len(slot.gpus)
            else:
                reserved += len(slot.gpus)
    return GpuCounts(
        total=snap.total_gpus,
        allocated=sum(len(n.allocated) for n in snap.nodes),
        unhealthy=sum(len(n.unhealthy) for n in snap.nodes),
        reserved=reserved,
        bound=bound,
        free=sum(mask.bit_count() for mask in view.free_masks()),
    )


def free_coherent(view: ClusterSnapshot) -> dict[str, int]:
    """Per level name (and ``node``): the most GPUs one domain there offers as coherent
    blocks, i.e. the sum over its nodes of each node's largest free block that is as tight
    as the node type can hold that many GPUs. 0 for a level no node is labelled with."""
    blocks = [fit_for(n.shape).coherent_block(view.free_mask(i)) for i, n in enumerate(view.nodes)]
    out = {lv.name: 0 for lv in view.hierarchy.levels}
    names = [lv.name for lv in view.hierarchy.levels]
    for (level, _), members in view.domains().items():
        out[names[level]] = max(out[names[level]], sum(blocks[i] for i in members))
    out[NODE_LEVEL] = max(blocks, default=0)
    return out


def level_gpus(snap: ClusterSnapshot, reservations: list[Reservation]) -> dict[str, dict[str, int]]:
    """Per level name (and ``node``): GPUs of unbound (``reserved``) and bound (``bound``)
    reservation slots, summed over the domains of that level, i.e. over the slots whose node
    carries that level's label. A slot on a node the snapshot no longer has counts nowhere."""
    names = [lv.name for lv in snap.hierarchy.levels]
    out = {name: dict.fromkeys(LEVEL_STATES, 0) for name in [*names, NODE_LEVEL]}
    for r in reservations:
        for slot in r.slice.slots:
            if not snap.has_node(slot.node):
                continue
            counts = [out[NODE_LEVEL]]
            counts += [out[name] for name, label in zip(names, snap.path_of(slot.node), strict=True) if label]
            state = "bound" if slot.key in r.bound else "reserved"
            for count in counts:
                count[state] += len(slot.gpus)
    return out


_GPUS_HELP = "GPUs by state: " + "; ".join(f"{state}: {what}" for state, what in GPU_STATES.items()) + "."
_COHERENT_HELP = (
    "Per hierarchy level (and node), the largest coherent free block one domain there offers: "
    "the sum over its nodes of the largest free GPU set each node holds at the tightest tier "
    "its type offers for that many GPUs (reservations taken out)."
)

_LEVEL_HELP = (
    "Per hierarchy level (and node), GPUs held by reservation slots no pod is bound to yet "
    "(state reserved) and by slots a pod is bound to (state bound), summed over the domains of "
    "that level: the slots on nodes that carry the level's label. A level every node carries "
    "repeats gangslice_gpus; a level only some nodes carry (an NVLink clique) counts just "
    "theirs. Compare with gangslice_free_coherent_gpus of the same level."
)


class _CacheCollector(Collector):
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        reservations = self.cache.book.ledger.reservations()
        by_phase = {Phase.RESERVED.value: 0, Phase.BOUND.value: 0}
        for r in reservations:
            by_phase[r.phase.value] = by_phase.get(r.phase.value, 0) + 1
        g = GaugeMetricFamily("gangslice_reservations", "Reservations held, by phase.", labels=["phase"])
        for phase, n in sorted(by_phase.items()):
            g.add_metric([phase], n)
        yield g
        snap, view = self.cache.snapshot(), self.cache.book.view()
        gpus = GaugeMetricFamily("gangslice_gpus", _GPUS_HELP, labels=["state"])
        for state, n in gpu_counts(snap, view, reservations).by_state().items():
            gpus.add_metric([state], n)
        yield gpus
        coherent = GaugeMetricFamily("gangslice_free_coherent_gpus", _COHERENT_HELP, labels=["level"])
        for level, n in free_coherent(view).items():
            coherent.add_metric([level], n)
        yield coherent
        by_level = GaugeMetricFamily("gangslice_level_gpus", _LEVEL_HELP, labels=["level", "state"])
        for level, counts in level_gpus(snap, reservations).items():
            for state, n in counts.items():
                by_level.add_metric([level, state], n)
        yield by_level
        found = CounterMetricFamily(
            "gangslice_devices_mismatch",
            "Bound pods found holding other GPUs than promised (gangslice.io/gpus), as the node "
            "agent reports the kubelet's allocation, by node.",
            labels=["node"],
        )
        for node, n in sorted(self.cache.book.mismatches_found.items()):
            found.add_metric([node], n)
        yield found
        yield GaugeMetricFamily(
            "gangslice_devices_mismatched_pods",
            "Pods holding other GPUs than promised now.",
            value=len(self.cache.book.device_mismatches()),
        )
        evictions = CounterMetricFamily(
            "gangslice_mismatch_evictions",
            "Evictions of pods holding other GPUs than promised (--on-mismatch=evict), by result "
            "(evicted; blocked: a PodDisruptionBudget answered 429; failed).",
            labels=["result"],
        )
        for result, n in sorted(self.cache.book.mismatch_evictions.items()):
            evictions.add_metric([result], n)
        yield evictions
        book = self.cache.book
        yield CounterMetricFamily(
            "gangslice_migration_plans",
            "Migration plans for gangs that waited: told (serve --migration report, a "
            "MigrationPlanned Event each), or held and started (on).",
            value=book.migration_plans,
        )
        yield CounterMetricFamily(
            "gangslice_migration_moves",
            "Replicas those migration plans move.",
            value=book.migration_moves,
        )
        yield CounterMetricFamily(
            "gangslice_migration_restart_gpu_seconds",
            "GPU-seconds of restart (GPUs x model load) those migration plans cost.",
            value=book.migration_restart_gpu_s,
        )
        moved = CounterMetricFamily(
            "gangslice_migration_evictions",
            "Evictions of movable replicas (serve --migration on), by result (evicted; blocked: "
            "a PodDisruptionBudget refused the plan; failed).",
            labels=["result"],
        )
        for result, n in sorted(book.migration_evictions.items()):
            moved.add_metric([result], n)
        yield moved
        yield GaugeMetricFamily(
            "gangslice_cache_ready", "1 once every watched kind is listed.", value=int(self.cache.ready)
        )
        yield GaugeMetricFamily("gangslice_cache_nodes", "GPU nodes in the snapshot.", value=len(snap.nodes))
        kept = self.cache.book.waiting.view(view, self.cache.clock()).kept_cliques()
        yield GaugeMetricFamily(
            "gangslice_refused_gangs",
            "Gangs refused for want of room and not placed since (forgotten after "
            f"{WAITING_TTL_S:g} s without a refusal).",
            value=len(self.cache.book.waiting),
        )
        yield GaugeMetricFamily(
            "gangslice_cliques_kept",
            "Whole multi-node NVLink cliques kept for gangs that ask for one: the one with the most "
            "free GPUs while such a gang waits, every one while the process started less than "
            f"{WAITING_TTL_S:g} s ago, none while pods off the fabric may use them like other GPUs.",
            value=len(kept),
        )
        worths = GaugeMetricFamily(
            "gangslice_gpu_worth",
            "What a GPU of each model is worth to the gangs asked for within the last "
            f"{DEMAND_MEMORY_S:g} s, per size of pod: the best speed (1: their fastest model) one "
            "of their pod sets with pods of that many GPUs gets on it.",
            labels=["model", "pod_gpus"],
        )
        for (model, pod_gpus), value in self.cache.book.waiting.worth(self.cache.clock()).by_pod:
            worths.add_metric([model, str(pod_gpus)], value)
        yield worths


class _ListenerCollector(Collector):
    """The connection guards' counts (:mod:`extender.httpapi.limits`) and the leader fence's."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        #: (port name, guard) of each listener group: "verbs" (kube-scheduler's and Volcano's
        #: ports), "metrics".
        self.guards: list[tuple[str, ConnectionGuard]] = []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        closed = CounterMetricFamily(
            "gangslice_connections_closed",
            "Connections the server closed without a reply asked for, by port and why (refused: "
            "no room, answered 429; timed_out: idle or a request head or body too slow; "
            "reclaimed: idle, closed to make room for a new one; stalled: a TLS handshake unfinished, "
            "closed to make room for a new one).",
            labels=["port", "why"],
        )
        open_now = GaugeMetricFamily(
            "gangslice_connections_open",
            "Open connections, by port and whether the peer presented a verified client certificate "
            "(handshaking: a TLS handshake in progress).",
            labels=["port", "peer"],
        )
        for port, guard in self.guards:
            for why, n in (
                ("refused", guard.refused),
                ("timed_out", guard.timed_out),
                ("reclaimed", guard.reclaimed),
                ("stalled", guard.stalled),
            ):
                closed.add_metric([port, why], n)
            certified = sum(c.authenticated for c in guard.connections.values())
            open_now.add_metric([port, "certified"], certified)
            open_now.add_metric([port, "other"], len(guard.connections) - certified)
            open_now.add_metric([port, "handshaking"], len(guard.handshakes))
        yield closed
        yield open_now
        yield CounterMetricFamily(
            "gangslice_leader_fence_refusals",
            "Decisions and writes refused because this replica's lease had lapsed by its own clock "
            "(a stalled leader, extender.kube.fence).",
            value=self.cache.book.fence.refused,
        )


class Metrics:
    def __init__(self, cache: ClusterCache) -> None:
        self.registry = CollectorRegistry()
        self.duration = Histogram(
            "gangslice_extender_request_duration_seconds",
            "Time to handle one extender request.",
            ["verb"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.decision_duration = Histogram(
            "gangslice_decision_duration_seconds",
            "Time of the decision alone (the decider's call, without decoding or encoding), by verb.",
            ["verb"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "gangslice_extender_requests",
            "Extender requests, by verb and HTTP status.",
            ["verb", "code"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "gangslice_decisions", "Decisions, by outcome.", ["outcome"], registry=self.registry
        )
        self.refusals = Counter(
            "gangslice_extender_refusals",
            "Requests refused for what they claim (a pod not watched, another UID, already bound, "
            "another scheduler, still gated, an unknown node, no slot there, a running pod's slot), "
            "by verb and reason.",
            ["verb", "reason"],
            registry=self.registry,
        )
        self.registry.register(_CacheCollector(cache))
        self.health = HealthCollector(cache)  # certificate expiry and gang waits, for alerts
        self.registry.register(self.health)
        self.listeners = _ListenerCollector(cache)
        self.registry.register(self.listeners)

    def render(self) -> bytes:
        return generate_latest(self.registry)
