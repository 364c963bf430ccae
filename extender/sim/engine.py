"""The event-driven simulation of one policy on one trace.

Time is simulated: the clock jumps from one trace event to the next. At each instant the
deployments that end and the scale-downs go first (their GPUs come free), then scale-ups and
new deployments add gangs to the queue, then one scheduling pass runs.

Queue semantics, the same for every policy: **FIFO with backfill of gangs no larger than
the blocked head**. A pass walks the waiting gangs in arrival order and asks the policy to
place each; the first gang the policy cannot place becomes the blocked head, and after it
only gangs asking for no more GPUs than the head are tried (so a stream of small replicas
cannot pass a large gang for ever by being *larger*, and small gangs are not held up behind
a large one). With ``no_wait`` a gang the policy cannot place when it arrives is rejected.

A gang whose slice uses multi-node NVLink (its pod sets span nodes of a clique: the solver's
rule, :func:`~extender.placement.scoring.mnnvl_nodes`, applied to every policy's answer) waits
:data:`IMEX_STARTUP_S` more before it runs: its pods start only once the IMEX daemons of its
ComputeDomain are ready. Its GPUs are held from placement on.

A gang the policy cannot place even on the cluster without any simulated gang is rejected on
arrival (waiting would never end). A gang still waiting when its deployment ends or scales
down is withdrawn. Scale-downs remove waiting replicas first, newest first, then running
ones, newest first (what a ReplicaSet does).

Each policy call's snapshot says whether a gang that needs a multi-node NVLink clique waits
(:func:`~extender.placement.waiting.with_demand`): one of the other gangs in the queue. That
is what the extender knows: a scheduler asks for a gang on first sight, and the extender
notes every gang it refuses until it places it (``keep_cliques`` ALWAYS: never known, as
``serve --keep-cliques always``). Only gangslice reads it.

Shortcut: once a policy refuses a gang, the same request (same pod sets) is not asked again
until some GPUs come free, since fewer free GPUs cannot make room. Every policy gets the
same shortcut.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import gang_micros, mnnvl_nodes
from extender.placement.slice import Placement, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.waiting import KeepCliques, clique_demand, with_demand
from extender.sim.judge import coherent_level, incoherence, unusable
from extender.sim.trace import Deployment, Scale, Trace

Policy = Callable[[ClusterSnapshot, GangRequest], Placement]
Progress = Callable[[float, int, int], None]

PLACED = "placed"
REJECTED = "rejected"
WITHDRAWN = "withdrawn"
WAITING = "waiting"

#: At most this many policy errors are kept with their messages (all are counted).
MAX_ERRORS_KEPT = 20
#: Seconds from placement until the pods of a gang on multi-node NVLink can start: the first
#: pod on each node waits for the IMEX daemon of its ComputeDomain (daemon pod scheduled, image
#: pulled, nvidia-imex started, the domain's quorum). "~30-60 s for the first Pod on each node"
#: (kubernetes-sigs/dra-driver-nvidia-gpu#1152); the middle of it. ``simulate --imex-startup-s``.
IMEX_STARTUP_S = 45.0


def shape_key(gang: GangRequest) -> tuple[PodSet, ...]:
    """What a policy's answer depends on besides the cluster: the pod sets, not the name."""
    return gang.pod_sets


def comm_millis(gang: GangRequest, micros: Mapping[str, float]) -> float:
    """Communication time of one prefill step through every layer, milliseconds."""
    return sum(micros.get(ps.name, 0.0) * ps.model.layers for ps in gang.pod_sets) / 1000.0


@dataclass(frozen=True)
class Ideal:
    """The reference for a request: the gangslice solver's slice on the cluster with no
    simulated gang (None where even that has no slice)."""

    micros: float
    comm_ms: float


class Reference:
    """Ideal placements, memoised per request; shared by every policy of a run.

    ``best``: on the whole cluster with no simulated gang. ``same_hardware``: on that cluster
    cut down to the node types a slice actually got (GPU graphs, and who hands out their
    GPUs: :attr:`NodeState.kind`), which separates a worse topology (a split NVLink island, a
    socket crossed, a leaf crossed) from slower hardware; on device-plugin nodes both are the
    best the plugin's answers allow.
    """

    def __init__(self, empty: ClusterSnapshot) -> None:
        self.empty = empty
        self._memo: dict[tuple[frozenset[str] | None, tuple[PodSet, ...]], Ideal | None] = {}
        self._clusters: dict[frozenset[str], ClusterSnapshot] = {}
        #: Solver calls that raised (the first few), as ``{gang, error}``.
        self.errors: list[dict[str, str]] = []

    def best(self, gang: GangRequest) -> Ideal | None:
        return self._solve(None, gang)

    def same_hardware(self, gang: GangRequest, node_types: frozenset[str]) -> Ideal | None:
        return self._solve(node_types, gang)

    def _solve(self, node_types: frozenset[str] | None, gang: GangRequest) -> Ideal | None:
        key = (node_types, shape_key(gang))
        if key not in self._memo:
            from extender.placement.solver import place

            cluster = self.empty if node_types is None else self._cut(node_types)
            try:
                got: Placement | None = place(cluster, gang)
            except Exception as exc:  # a solver bug: reported with the run, not fatal to it
                got = None
                if len(self.errors) < MAX_ERRORS_KEPT:
                    self.errors.append({"gang": gang.name, "error": f"{type(exc).__name__}: {exc}"})
            self._memo[key] = (
                Ideal(got.per_layer_micros, comm_millis(gang, got.pod_set_micros))
                if isinstance(got, Slice)
                else None
            )
        return self._memo[key]

    def _cut(self, node_types: frozenset[str]) -> ClusterSnapshot:
        got = self._clusters.get(node_types)
        if got is None:
            nodes = [n for n in self.empty.nodes if n.kind in node_types]
            got = self._clusters[node_types] = ClusterSnapshot(nodes, self.empty.hierarchy)
        return got


#: How a node type's name marks a node of a multi-node NVLink clique.
_IN_CLIQUE = " (NVLink clique)"


def node_type(cluster: ClusterSnapshot, k: int) -> str:
    """How results.json names node ``k``'s type: its GPU model and count, and whether it sits
    in a multi-node NVLink clique."""
    n = cluster.nodes[k]
    return f"{n.graph.model or 'unnamed'} x{n.shape.size}" + (
        _IN_CLIQUE if cluster.clique(k) is not None else ""
    )


def gpu_model(type_name: str) -> str:
    """The GPU model a :func:`node_type` name names (``GB200 x4 (NVLink clique)`` -> ``GB200``)."""
    return type_name.removesuffix(_IN_CLIQUE).rsplit(" x", 1)[0]


@dataclass
class GangRecord:
    """One replica of one deployment: one gang, from arrival to departure."""

    name: str
    deployment: str
    template: str | None
    gang: GangRequest
    arrived: float
    seq: int
    outcome: str = WAITING
    placed_at: float | None = None
    ended_at: float | None = None
    micros: float | None = None
    comm_ms: float | None = None
    ideal: Ideal | None = None
    ideal_same_hardware: Ideal | None = None
    incoherent: tuple[str, ...] = ()
    nodes: int = 0
    #: Node index -> GPU mask this gang holds while it runs.
    held: dict[int, int] = field(default_factory=dict)
    mnnvl: tuple[str, ...] = ()
    #: Seconds its pods waited after placement for the IMEX daemons (multi-node NVLink only).
    imex_s: float = 0.0

    @property
    def waited(self) -> float | None:
        """Seconds from arrival until its pods run: in the queue, then for IMEX start-up."""
        return None if self.placed_at is None else self.placed_at - self.arrived + self.imex_s

    @property
    def coherent(self) -> bool | None:
        return None if self.placed_at is None else not self.incoherent


@dataclass(frozen=True)
class Point:
    """The cluster after the scheduling pass at time ``t`` (a step: it holds until the next)."""

    t: float
    allocated_gpus: int
    waiting_gangs: int
    whole_free_nodes: int
    largest_free_leaf_gpus: int


@dataclass
class PolicyRun:
    policy: str
    gangs: list[GangRecord]
    timeline: list[Point]
    end: float
    total_gpus: int
    #: Wall seconds of every policy call of the simulation (not the arrival checks).
    decision_seconds: list[float]
    failed_calls: int
    errors: list[dict[str, object]]
    error_count: int
    wall_seconds: float
    #: Each node's type (:func:`node_type`), by node index (the keys of ``GangRecord.held``).
    node_types: list[str] = field(default_factory=list)


class _Cluster:
    """What the simulated gangs hold, on top of the cluster file's own state."""

    def __init__(self, base: ClusterSnapshot) -> None:
        self.base = base
        n = len(base.nodes)
        self.usable = [base.free_mask(i) for i in range(n)]
        self.held = [0] * n
        self.mnnvl: dict[str, str] = {}
        self.allocated = 0
        self._snapshot: ClusterSnapshot | None = base
        scope = coherent_level(base.hierarchy)
        self.leaf_of: list[object] = []
        for i in range(n):
            key = base.hierarchy.domain(base.path(i), scope) if scope >= 0 else None
            self.leaf_of.append(key if key is not None else ("node", i))
        self.whole = [self._is_whole(i) for i in range(n)]
        self.leaf_free: dict[object, int] = {}
        for i in range(n):
            self.leaf_free.setdefault(self.leaf_of[i], 0)
            if self.whole[i]:
                self.leaf_free[self.leaf_of[i]] += base.nodes[i].shape.size

    def _is_whole(self, i: int) -> bool:
        return self.usable[i] & ~self.held[i] == self.base.nodes[i].shape.full_mask

    def _touch(self, i: int) -> None:
        now = self._is_whole(i)
        if now != self.whole[i]:
            size = self.base.nodes[i].shape.size
            self.leaf_free[self.leaf_of[i]] += size if now else -size
            self.whole[i] = now

    def snapshot(self) -> ClusterSnapshot:
        if self._snapshot is None:
            held = {
                node.name: frozenset(node.shape.gpus_of(mask))
                for node, mask in zip(self.base.nodes, self.held, strict=True)
                if mask
            }
            self._snapshot = self.base.with_held(held, dict(self.mnnvl))
        return self._snapshot

    def take(self, rec: GangRecord) -> None:
        for i, mask in rec.held.items():
            self.held[i] |= mask
            self.allocated += mask.bit_count()
            self._touch(i)
        for name in rec.mnnvl:
            self.mnnvl.setdefault(name, rec.name)
        self._snapshot = None

    def give_back(self, rec: GangRecord) -> None:
        for i, mask in rec.held.items():
            self.held[i] &= ~mask
            self.allocated -= mask.bit_count()
            self._touch(i)
        for name in rec.mnnvl:
            if self.mnnvl.get(name) == rec.name:
                del self.mnnvl[name]
        self._snapshot = None

    def point(self, t: float, waiting: int) -> Point:
        return Point(t, self.allocated, waiting, sum(self.whole), max(self.leaf_free.values(), default=0))


# Order of actions at one instant: deployments that end go first (their GPUs come free), then
# new deployments, then scale events (a deployment may scale at the instant it starts).
_END, _START, _SCALE = 0, 1, 2


class Simulation:
    def __init__(
        self,
        base: ClusterSnapshot,
        trace: Trace,
        policy_name: str,
        policy: Policy,
        reference: Reference,
        no_wait: bool = False,
        progress: Progress | None = None,
        imex_startup_s: float = IMEX_STARTUP_S,
        keep_cliques: KeepCliques = KeepCliques.WHILE_WAITING,
    ) -> None:
        self.imex_startup_s = imex_startup_s
        self.keep_cliques = keep_cliques
        self.trace = trace
        self.policy_name = policy_name
        self.policy = policy
        self.reference = reference
        self.no_wait = no_wait
        self.progress = progress
        self.cluster = _Cluster(base)
        self.queue: list[GangRecord] = []
        self.records: list[GangRecord] = []
        self.deployments = {d.name: d for d in trace.deployments}
        #: Replicas of each running deployment, waiting or placed, oldest first.
        self.live: dict[str, list[GangRecord]] = {}
        self.placed = 0
        self.replica_counter: dict[str, int] = {}
        self.timeline: list[Point] = []
        self.epoch = 0
        self.refused: dict[tuple[PodSet, ...], int] = {}
        self.never_fits: dict[tuple[PodSet, ...], bool] = {}
        self.decision_seconds: list[float] = []
        self.failed_calls = 0
        self.errors: list[dict[str, object]] = []
        self.error_count = 0

    # -- the clock -------------------------------------------------------------------------
    def run(self) -> PolicyRun:
        started = time.perf_counter()
        actions: list[tuple[float, int, int, object]] = []
        for k, d in enumerate(self.trace.deployments):
            actions.append((d.at, _START, k, d))
            actions.append((d.end, _END, k, d))
        for k, s in enumerate(self.trace.scales):
            actions.append((s.at, _SCALE, k, s))
        actions.sort(key=lambda a: (a[0], a[1], a[2]))
        end = self.trace.end
        self.timeline.append(self.cluster.point(0.0, 0))
        i = 0
        while i < len(actions):
            t = actions[i][0]
            while i < len(actions) and actions[i][0] == t:
                _, kind, _, what = actions[i]
                if isinstance(what, Scale):
                    self._scale(what.deployment, what.replicas, t)
                else:
                    assert isinstance(what, Deployment)
                    if kind == _END:
                        self._scale(what.name, 0, t)
                        del self.live[what.name]
                    else:
                        self.live[what.name] = []
                        self._add(what, what.replicas, t)
                i += 1
            self._pass(t)
            self._record(t)
            if self.progress is not None:
                self.progress(t / end if end else 1.0, self.placed, len(self.queue))
        return PolicyRun(
            policy=self.policy_name,
            gangs=self.records,
            timeline=self.timeline,
            end=end,
            total_gpus=sum(m.bit_count() for m in self.cluster.usable),
            decision_seconds=self.decision_seconds,
            failed_calls=self.failed_calls,
            errors=self.errors,
            error_count=self.error_count,
            wall_seconds=time.perf_counter() - started,
            node_types=[node_type(self.cluster.base, i) for i in range(len(self.cluster.base.nodes))],
        )

    def _record(self, t: float) -> None:
        p = self.cluster.point(t, len(self.queue))
        last = self.timeline[-1]
        same = (p.allocated_gpus, p.waiting_gangs, p.whole_free_nodes, p.largest_free_leaf_gpus) == (
            last.allocated_gpus,
            last.waiting_gangs,
            last.whole_free_nodes,
            last.largest_free_leaf_gpus,
        )
        if last.t == t:
            self.timeline[-1] = p
        elif not same:
            self.timeline.append(p)

    # -- deployments -----------------------------------------------------------------------
    def _add(self, d: Deployment, n: int, t: float) -> None:
        for _ in range(n):
            k = self.replica_counter.get(d.name, 0)
            self.replica_counter[d.name] = k + 1
            name = f"{d.name}-{k}"
            rec = GangRecord(
                name=name,
                deployment=d.name,
                template=d.template,
                gang=replace(d.gang, name=name),
                arrived=t,
                seq=len(self.records),
            )
            self.records.append(rec)
            self.live[d.name].append(rec)
            if self._never_fits(rec):
                rec.outcome = REJECTED
                rec.ended_at = t
                self.live[d.name].remove(rec)
            else:
                self.queue.append(rec)

    def _scale(self, deployment: str, replicas: int, t: float) -> None:
        live = self.live[deployment]
        if replicas > len(live):
            self._add(self.deployments[deployment], replicas - len(live), t)
            return
        while len(live) > replicas:
            waiting = [r for r in live if r.placed_at is None]
            rec = max(waiting or live, key=lambda r: r.seq)
            live.remove(rec)
            rec.ended_at = t
            if rec.placed_at is None:
                rec.outcome = WITHDRAWN
                self.queue.remove(rec)
            else:
                self.cluster.give_back(rec)
                self.epoch += 1

    def _never_fits(self, rec: GangRecord) -> bool:
        key = shape_key(rec.gang)
        if key not in self.never_fits:
            fits = False
            try:
                got = self.policy(self.cluster.base, rec.gang)
            except Exception as exc:  # a policy bug must not end the run; it is reported
                self._error(rec, rec.arrived, exc)
            else:
                if isinstance(got, Slice):
                    problem = unusable(self.cluster.base, rec.gang, got.slots)
                    if problem is not None:
                        self._error(rec, rec.arrived, f"unusable slice on the empty cluster: {problem}")
                    fits = problem is None
            self.never_fits[key] = not fits
        return self.never_fits[key]

    # -- scheduling ------------------------------------------------------------------------
    def _pass(self, t: float) -> None:
        head_gpus: int | None = None
        for rec in list(self.queue):
            if head_gpus is not None and rec.gang.gpus > head_gpus:
                continue
            if self._try(rec, t):
                continue
            if self.no_wait:
                self.queue.remove(rec)
                self.live[rec.deployment].remove(rec)
                rec.outcome = REJECTED
                rec.ended_at = t
            elif head_gpus is None:
                head_gpus = rec.gang.gpus

    def _try(self, rec: GangRecord, t: float) -> bool:
        key = shape_key(rec.gang)
        if self.refused.get(key) == self.epoch:
            return False
        snap = self.cluster.snapshot()
        waiting = clique_demand(snap, (r.gang for r in self.queue if r is not rec))
        snap = with_demand(snap, waiting, self.keep_cliques)
        began = time.perf_counter()
        try:
            got: Placement | None = self.policy(snap, rec.gang)
        except Exception as exc:  # reported, and the gang treated as refused
            got = None
            self._error(rec, t, exc)
        self.decision_seconds.append(time.perf_counter() - began)
        if isinstance(got, Slice):
            problem = unusable(snap, rec.gang, got.slots)
            if problem is None:
                self._start(rec, snap, got, t)
                return True
            self._error(rec, t, f"unusable slice: {problem}")
        self.failed_calls += 1
        self.refused[key] = self.epoch
        return False

    def _start(self, rec: GangRecord, snap: ClusterSnapshot, got: Slice, t: float) -> None:
        micros = gang_micros(snap, rec.gang, got.slots)
        rec.outcome = PLACED
        rec.placed_at = t
        self.placed += 1
        rec.micros = sum(micros.values())
        rec.comm_ms = comm_millis(rec.gang, micros)
        rec.ideal = self.reference.best(rec.gang)
        kinds = frozenset(snap.node(s.node).kind for s in got.slots)
        rec.ideal_same_hardware = self.reference.same_hardware(rec.gang, kinds)
        rec.incoherent = incoherence(snap, rec.gang, got.slots)
        rec.nodes = len({s.node for s in got.slots})
        for s in got.slots:
            i = snap.index(s.node)
            rec.held[i] = rec.held.get(i, 0) | snap.nodes[i].shape.mask_of(s.gpus)
        # The solver's rule, applied to every policy's answer.
        rec.mnnvl = mnnvl_nodes(snap, rec.gang, got.slots)
        rec.imex_s = self.imex_startup_s if rec.mnnvl else 0.0
        self.cluster.take(rec)
        self.queue.remove(rec)

    def _error(self, rec: GangRecord, t: float, exc: BaseException | str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
            self.errors.append({"at": t, "gang": rec.name, "error": what})
