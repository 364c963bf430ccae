"""The event-driven simulation of one policy on one trace: a fleet that lives.

Time is simulated: the clock jumps from one event to the next. Events come from the trace
(deployments that start and end, scale events, rollouts, node failures) and from the fleet
itself (a replica becomes ready, a node comes back from repair). At each instant they go in
this order: nodes back from repair, replicas that became ready (a rollout then retires old
ones), deployments that end (their GPUs come free), node failures, new deployments, scale
events, rollouts; then one scheduling pass runs.

**Queue**, the same for every policy: FIFO with backfill of gangs no larger than the blocked
head. A pass walks the waiting gangs in arrival order and asks the policy to place each; the
first gang the policy cannot place becomes the blocked head, and after it only gangs asking
for no more GPUs than the head are tried. With ``no_wait`` a gang the policy cannot place
when it arrives is rejected. A gang the policy cannot place even on the cluster with no
simulated gang never enters the queue: it waits, unplaceable, until it is withdrawn.

**A replica's life.** Placed, its pods wait :data:`IMEX_STARTUP_S` more when its slice uses
multi-node NVLink (the IMEX daemons of its ComputeDomain), then load the model (the
template's load time, :mod:`extender.sim.life`); it serves from then until it goes. Its GPUs
are held from placement on. A run ends when the replica departs (scale-down, the
deployment's end, retired by a rollout), when a node under it fails (the replica goes back
to the queue, in arrival order, and loads again once re-placed), or when the policy moves it.

**Rollouts** follow the owner's strategy (maxSurge, maxUnavailable; :mod:`extender.sim.life`)
the way the deployment controller reconciles a RollingUpdate: replicas of the new revision are
created while the total stays within desired + maxSurge; old ones are retired while the ready
replicas stay at least desired - maxUnavailable (old replicas not ready go first). A
LeaderWorkerSet's defaults (maxSurge 0, maxUnavailable 1) replace one group at a time.
Scale-downs remove replicas of the old revision first, waiting ones first, newest first.

**Moves.** A policy that plans moves (:class:`MovingPolicy`) may answer a gang with a
:class:`~extender.sim.records.Plan`: its placement and running replicas to move to new slots.
The engine applies the moves (each mover's run ends; it restarts on its new slots and loads
its model again: the restart's GPU-hours are not served) and then places the gang; a plan
whose moves or placement break the capacity rules is refused whole. Plain policies (every
peer) move nothing.

Each policy call's snapshot says whether a gang that needs a multi-node NVLink clique waits
(:func:`~extender.placement.waiting.with_demand`): one of the other gangs in the queue. That
is what the extender knows (``keep_cliques`` ALWAYS: never known). It also says what a GPU of
each model is worth to the other gangs in the queue and those that left it (placed or
withdrawn) within :data:`~extender.placement.waiting.DEMAND_MEMORY_S`: the gangs the
extender was asked for in that time. Only gangslice reads them.

Shortcut: once a policy refuses a gang, the same request is not asked again until some GPUs
come free, since fewer free GPUs cannot make room. Every policy gets the same shortcut.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol, runtime_checkable

from extender.placement.hardware import Worth, WorthBook, gang_worth
from extender.placement.migration import one_pod
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import gang_micros, mnnvl_nodes
from extender.placement.slice import Placement, PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.step import slice_step
from extender.placement.waiting import DEMAND_MEMORY_S, KeepCliques, needs_clique, with_demand
from extender.sim.judge import coherent_level, incoherence, unusable
from extender.sim.life import DEPLOYMENT, Life
from extender.sim.records import (
    DEPARTED,
    MOVED,
    NODE_LOST,
    PLACED,
    REJECTED,
    WITHDRAWN,
    GangRecord,
    Plan,
    Point,
    PolicyRun,
    Run,
    Running,
    node_type,
    speed,
)
from extender.sim.reference import Reference
from extender.sim.trace import Deployment, NodeDown, Rollout, Scale, Trace

Policy = Callable[[ClusterSnapshot, GangRequest], Placement]
Progress = Callable[[float, int, int], None]

#: At most this many policy errors are kept with their messages (all are counted).
MAX_ERRORS_KEPT = 20
#: Seconds from placement until the pods of a gang on multi-node NVLink can start: the first
#: pod on each node waits for the IMEX daemon of its ComputeDomain (daemon pod scheduled, image
#: pulled, nvidia-imex started, the domain's quorum). "~30-60 s for the first Pod on each node"
#: (kubernetes-sigs/dra-driver-nvidia-gpu#1152); the middle of it. ``simulate --imex-startup-s``.
IMEX_STARTUP_S = 45.0


@runtime_checkable
class MovingPolicy(Protocol):
    """A policy that may move running replicas to place a gang."""

    def __call__(self, snap: ClusterSnapshot, gang: GangRequest) -> Placement: ...

    def plan(
        self, snap: ClusterSnapshot, gang: GangRequest, running: Sequence[Running], waited_s: float
    ) -> Placement | Plan: ...


def shape_key(gang: GangRequest) -> tuple[PodSet, ...]:
    """What a policy's answer depends on besides the cluster: the pod sets, not the name."""
    return gang.pod_sets


class Wants(NamedTuple):
    """What one shape of gang wants of the fleet while it is queued or just was."""

    clique: bool  # it asks for a multi-node NVLink clique (needs_clique)
    worth: Worth  # what a GPU of each model is worth to it (gang_worth)


def comm_millis(gang: GangRequest, micros: Mapping[str, float]) -> float:
    """Communication time of one step through every layer, milliseconds."""
    return sum(micros.get(ps.name, 0.0) * ps.model.layers for ps in gang.pod_sets) / 1000.0


class _Cluster:
    """What the simulated gangs hold, on top of the cluster file's own state."""

    def __init__(self, base: ClusterSnapshot) -> None:
        self.base = base
        n = len(base.nodes)
        self.usable = [base.free_mask(i) for i in range(n)]
        self.held = [0] * n
        self.down = [False] * n
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
        return not self.down[i] and self.usable[i] & ~self.held[i] == self.base.nodes[i].shape.full_mask

    def _touch(self, i: int) -> None:
        now = self._is_whole(i)
        if now != self.whole[i]:
            size = self.base.nodes[i].shape.size
            self.leaf_free[self.leaf_of[i]] += size if now else -size
            self.whole[i] = now

    def snapshot(self) -> ClusterSnapshot:
        if self._snapshot is None:
            held = {
                i: self.base.nodes[i].shape.full_mask if down else mask
                for i, (mask, down) in enumerate(zip(self.held, self.down, strict=True))
                if mask or down
            }
            self._snapshot = self.base.with_held_masks(held, self.mnnvl)
        return self._snapshot

    def take(self, name: str, run: Run) -> None:
        for i, mask in run.held.items():
            self.held[i] |= mask
            self.allocated += mask.bit_count()
            self._touch(i)
        for node in run.mnnvl:
            self.mnnvl.setdefault(node, name)
        self._snapshot = None

    def give_back(self, name: str, run: Run) -> None:
        for i, mask in run.held.items():
            self.held[i] &= ~mask
            self.allocated -= mask.bit_count()
            self._touch(i)
        for node in run.mnnvl:
            if self.mnnvl.get(node) == name:
                del self.mnnvl[node]
        self._snapshot = None

    def set_down(self, i: int, down: bool) -> None:
        self.down[i] = down
        self._touch(i)
        self._snapshot = None

    def point(self, t: float, waiting: int, serving: int, goodput: float) -> Point:
        return Point(
            t,
            self.allocated,
            waiting,
            sum(self.whole),
            max(self.leaf_free.values(), default=0),
            serving,
            goodput,
            sum(self.down),
        )


# Order of actions at one instant (see the module docstring).
_UP, _READY, _END, _DOWN, _START, _SCALE, _ROLLOUT = range(7)


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
        self.moving = isinstance(policy, MovingPolicy)
        self.reference = reference
        self.no_wait = no_wait
        self.progress = progress
        self.cluster = _Cluster(base)
        #: Waiting gangs in arrival order, the same as a set, and how many ask for a clique.
        self.queue: list[GangRecord] = []
        self.queued: set[str] = set()
        self.queued_clique = 0
        #: What a GPU of each model is worth to the gangs queued or asked for within
        #: DEMAND_MEMORY_S, counted; when the dequeued ones' worths expire.
        self.queued_worth = WorthBook()
        self.recent: collections.deque[tuple[float, Worth]] = collections.deque()
        #: What each shape of gang wants (:func:`shape_key`), worked out once.
        self.wants: dict[tuple[PodSet, ...], Wants] = {}
        self.records: list[GangRecord] = []
        self.by_name: dict[str, GangRecord] = {}
        self.deployments = {d.name: d for d in trace.deployments}
        #: Replicas of each running deployment, waiting or placed, oldest first.
        self.live: dict[str, list[GangRecord]] = {}
        #: Desired replicas and current revision of each running deployment.
        self.desired: dict[str, int] = {}
        self.revision: dict[str, int] = {}
        self.placed = 0
        self.moves = 0
        self.replica_counter: dict[str, int] = {}
        self.timeline: list[Point] = []
        self.epoch = 0
        self.refused: dict[tuple[PodSet, ...], int] = {}
        self.never_fits: dict[tuple[PodSet, ...], bool] = {}
        self.decision_seconds: list[float] = []
        self.failed_calls = 0
        self.errors: list[dict[str, object]] = []
        self.error_count = 0
        self.events: list[tuple[float, int, int, object]] = []
        self._event_seq = 0
        self.serving_gpus = 0
        self.goodput_gpus = 0.0
        self.node_index = {n.name: i for i, n in enumerate(base.nodes)}

    # -- the clock -------------------------------------------------------------------------
    def _at(self, t: float, kind: int, what: object) -> None:
        heapq.heappush(self.events, (t, kind, self._event_seq, what))
        self._event_seq += 1

    def run(self) -> PolicyRun:
        started = time.perf_counter()
        for d in self.trace.deployments:
            self._at(d.at, _START, d)
            self._at(d.end, _END, d)
        for s in self.trace.scales:
            self._at(s.at, _SCALE, s)
        for r in self.trace.rollouts:
            self._at(r.at, _ROLLOUT, r)
        for f in self.trace.node_downs:
            if f.node in self.node_index:
                self._at(f.at, _DOWN, f)
        end = self.trace.end
        self.timeline.append(self.cluster.point(0.0, 0, 0, 0.0))
        while self.events:
            t = self.events[0][0]
            if t > end:
                break
            while self.events and self.events[0][0] == t:
                _, kind, _, what = heapq.heappop(self.events)
                self._handle(kind, what, t)
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
            moves=self.moves,
        )

    def _handle(self, kind: int, what: object, t: float) -> None:
        if kind == _UP:
            assert isinstance(what, int)
            self.cluster.set_down(what, False)
            self.epoch += 1
        elif kind == _READY:
            assert isinstance(what, tuple)
            rec, run = what
            if rec.run is run:
                self._serving(rec, run, +1)
                if self._rolling(rec.deployment):
                    self._reconcile(rec.deployment, t)
        elif kind == _END:
            assert isinstance(what, Deployment)
            self._scale(what.name, 0, t)
            del self.live[what.name]
        elif kind == _DOWN:
            assert isinstance(what, NodeDown)
            self._node_down(what, t)
        elif kind == _START:
            assert isinstance(what, Deployment)
            self.live[what.name] = []
            self.desired[what.name] = what.replicas
            self.revision[what.name] = 0
            self._add(what, what.replicas, t)
        elif kind == _SCALE:
            assert isinstance(what, Scale)
            self.desired[what.deployment] = what.replicas
            if self._rolling(what.deployment):
                self._reconcile(what.deployment, t)
            else:
                self._scale(what.deployment, what.replicas, t)
        else:
            assert isinstance(what, Rollout)
            self.revision[what.deployment] += 1
            self._reconcile(what.deployment, t)

    def _serving(self, rec: GangRecord, run: Run, sign: int) -> None:
        gpus = rec.gang.gpus
        self.serving_gpus += sign * gpus
        self.goodput_gpus += sign * gpus * speed(rec.ideal, run.step)
        if self.serving_gpus == 0:
            # Nothing serves: the running sum of float rates would leave rounding (-5e-15),
            # which results.json's schema refuses.
            self.goodput_gpus = 0.0

    def _record(self, t: float) -> None:
        p = self.cluster.point(t, len(self.queue), self.serving_gpus, self.goodput_gpus)
        last = self.timeline[-1]
        if last.t == t:
            self.timeline[-1] = p
        elif replace(p, t=last.t) != last:
            self.timeline.append(p)

    # -- deployments -----------------------------------------------------------------------
    def _add(self, d: Deployment, n: int, t: float) -> None:
        life: Life = d.life
        for _ in range(n):
            k = self.replica_counter.get(d.name, 0)
            self.replica_counter[d.name] = k + 1
            name = f"{d.name}-{k}"
            gang = replace(d.gang, name=name)
            rec = GangRecord(
                name=name,
                deployment=d.name,
                template=d.template,
                gang=gang,
                arrived=t,
                seq=len(self.records),
                load_s=life.load_seconds(gang),
                revision=self.revision.get(d.name, 0),
                ideal=self.reference.best(gang),
            )
            self.records.append(rec)
            self.by_name[name] = rec
            self.live[d.name].append(rec)
            if self._never_fits(rec):
                rec.unplaceable = True
            else:
                self._enqueue(rec)

    def _scale(self, deployment: str, replicas: int, t: float) -> None:
        live = self.live[deployment]
        if replicas > len(live):
            self._add(self.deployments[deployment], replicas - len(live), t)
            return
        rev = self.revision.get(deployment, 0)
        while len(live) > replicas:
            # Old revision first, then waiting before placed, then newest first.
            rec = max(live, key=lambda r: (r.revision != rev, r.run is None, r.seq))
            self._retire(rec, t)

    def _retire(self, rec: GangRecord, t: float) -> None:
        """The replica goes for good (scale-down, the deployment's end, a rollout)."""
        self.live[rec.deployment].remove(rec)
        rec.ended_at = t
        run = rec.run
        if run is None:
            if rec.placed_at is None:
                rec.outcome = REJECTED if rec.unplaceable else WITHDRAWN
            if rec.name in self.queued:
                self._dequeue(rec, t)
            return
        self._end_run(rec, run, t, DEPARTED)

    def _end_run(self, rec: GangRecord, run: Run, t: float, cause: str) -> None:
        if run.ready_at <= t:
            self._serving(rec, run, -1)
        run.ended_at = t
        run.cause = cause
        self.cluster.give_back(rec.name, run)
        self.epoch += 1

    def _rolling(self, deployment: str) -> bool:
        rev = self.revision.get(deployment, 0)
        return any(r.revision != rev for r in self.live.get(deployment, ()))

    def _reconcile(self, deployment: str, t: float) -> None:
        """One reconcile of a rolling update (see the module docstring)."""
        d = self.deployments[deployment]
        rev = self.revision[deployment]
        want = self.desired[deployment]
        live = self.live[deployment]
        surge, unavailable = d.life.fenceposts(want)
        new = [r for r in live if r.revision == rev]
        for rec in sorted(new, key=lambda r: (r.run is None, r.seq), reverse=True)[: max(0, len(new) - want)]:
            self._retire(rec, t)  # scaled down mid-rollout: waiting ones first, newest first
        new = [r for r in live if r.revision == rev]
        if len(live) < want + surge and len(new) < want:
            self._add(d, min(want + surge - len(live), want - len(new)), t)
        live = self.live[deployment]
        old = [r for r in live if r.revision != rev]
        new = [r for r in live if r.revision == rev]
        new_unready = sum(1 for r in new if not r.ready(t))
        room = len(live) - (want - unavailable) - new_unready
        for rec in sorted(old, key=lambda r: (r.ready(t), -r.seq)):  # not ready first, then newest
            if room <= 0 and rec.ready(t):
                break
            if rec.ready(t):
                room -= 1
            self._retire(rec, t)
        live = self.live[deployment]
        new = [r for r in live if r.revision == rev]
        if len(live) < want + surge and len(new) < want:
            self._add(d, min(want + surge - len(live), want - len(new)), t)

    def _node_down(self, f: NodeDown, t: float) -> None:
        i = self.node_index[f.node]
        if self.cluster.down[i]:
            return
        for recs in self.live.values():
            for rec in recs:
                run = rec.run
                if run is not None and i in run.held:
                    self._end_run(rec, run, t, NODE_LOST)
                    self._enqueue(rec)
        self.cluster.set_down(i, True)
        self._at(f.back, _UP, i)

    def _enqueue(self, rec: GangRecord) -> None:
        """Into the queue at its place in arrival order (a replica that lost its node keeps it)."""
        if self.queue and (self.queue[-1].arrived, self.queue[-1].seq) > (rec.arrived, rec.seq):
            keys = [(r.arrived, r.seq) for r in self.queue]
            self.queue.insert(bisect.bisect(keys, (rec.arrived, rec.seq)), rec)
        else:
            self.queue.append(rec)
        self.queued.add(rec.name)
        wants = self._wants(rec)
        self.queued_clique += wants.clique
        self.queued_worth.add(wants.worth)

    def _dequeue(self, rec: GangRecord, t: float) -> None:
        self.queue.remove(rec)
        self.queued.discard(rec.name)
        wants = self._wants(rec)
        self.queued_clique -= wants.clique
        self.recent.append((t + DEMAND_MEMORY_S, wants.worth))

    def _wants(self, rec: GangRecord) -> Wants:
        key = shape_key(rec.gang)
        got = self.wants.get(key)
        if got is None:
            base = self.cluster.base
            got = self.wants[key] = Wants(needs_clique(base, rec.gang), gang_worth(base, rec.gang))
        return got

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
            if rec.name not in self.queued:
                continue  # retired by a rollout this pass set off
            if head_gpus is not None and rec.gang.gpus > head_gpus:
                continue
            if self._try(rec, t):
                continue
            if self.no_wait and not rec.runs:
                self._dequeue(rec, t)
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
        wants = self._wants(rec)
        waiting = self.queued_clique - wants.clique > 0  # another queued gang asks for one
        while self.recent and self.recent[0][0] < t:
            self.queued_worth.remove(self.recent.popleft()[1])
        worth = self.queued_worth.worth(exclude=(wants.worth,))
        snap = with_demand(snap, waiting, self.keep_cliques, worth)
        began = time.perf_counter()
        got: Placement | Plan | None
        try:
            if self.moving:
                got = self.policy.plan(snap, rec.gang, self._running(t), t - rec.arrived)  # type: ignore[attr-defined]
            else:
                got = self.policy(snap, rec.gang)
        except Exception as exc:  # reported, and the gang treated as refused
            got = None
            self._error(rec, t, exc)
        self.decision_seconds.append(time.perf_counter() - began)
        plan = got if isinstance(got, Plan) else Plan(got) if got is not None else None
        if plan is not None and isinstance(plan.placement, Slice) and self._apply(rec, snap, plan, t):
            return True
        self.failed_calls += 1
        self.refused[key] = self.epoch
        return False

    def _running(self, t: float) -> list[Running]:
        out = []
        for deployment, recs in self.live.items():
            steady = self.deployments[deployment].life.owner == DEPLOYMENT and not self._rolling(deployment)
            for rec in recs:
                run = rec.run
                if run is not None:
                    movable = steady and one_pod(rec.gang) and run.ready_at <= t
                    out.append(Running(rec.name, rec.template, rec.gang, run.slots, rec.load_s, movable))
        return out

    def _apply(self, rec: GangRecord, snap: ClusterSnapshot, plan: Plan, t: float) -> bool:
        """Apply a plan's moves, then place the gang; refuse the whole plan if any part breaks
        the capacity rules."""
        placement = plan.placement
        assert isinstance(placement, Slice)
        done: list[tuple[GangRecord, Run]] = []
        problem: str | None = None
        for move in plan.moves:
            mover = self.by_name.get(move.gang)
            run = mover.run if mover is not None else None
            if mover is None or run is None:
                problem = f"move of {move.gang}: not a running replica"
                break
            self.cluster.give_back(mover.name, run)
            here = self.cluster.snapshot()
            problem = unusable(here, mover.gang, move.slots)
            self.cluster.take(mover.name, run)
            if problem is not None:
                problem = f"move of {move.gang}: {problem}"
                break
            self._end_run(mover, run, t, MOVED)
            self._start(mover, self.cluster.snapshot(), move.slots, t, restart=True)
            done.append((mover, run))
        if problem is None:
            here = self.cluster.snapshot() if plan.moves else snap
            problem = unusable(here, rec.gang, placement.slots)
            if problem is None:
                self._start(rec, here, placement.slots, t)
                self._dequeue(rec, t)
                self.placed += 1
                self.moves += len(done)
                return True
        for mover, run in reversed(done):  # undo: back to where it ran, as if never moved
            new = mover.runs.pop()
            if new.ready_at <= t:
                self._serving(mover, new, -1)
            self.cluster.give_back(mover.name, new)
            run.ended_at, run.cause = None, None
            self.cluster.take(mover.name, run)
            if run.ready_at <= t:
                self._serving(mover, run, +1)
        self._error(rec, t, f"unusable plan: {problem}")
        return False

    def _start(
        self,
        rec: GangRecord,
        snap: ClusterSnapshot,
        slots: tuple[PodSlot, ...],
        t: float,
        restart: bool = False,
    ) -> None:
        micros = gang_micros(snap, rec.gang, slots)
        held: dict[int, int] = {}
        for s in slots:
            i = snap.index(s.node)
            held[i] = held.get(i, 0) | snap.nodes[i].shape.mask_of(s.gpus)
        mnnvl = mnnvl_nodes(snap, rec.gang, slots)
        imex = self.imex_startup_s if mnnvl else 0.0
        run = Run(
            placed_at=t,
            ready_at=t + imex + rec.load_s,
            imex_s=imex,
            slots=tuple(slots),
            held=held,
            mnnvl=mnnvl,
            step=slice_step(snap, rec.gang, slots),
            micros=sum(micros.values()),
            comm_ms=comm_millis(rec.gang, micros),
            incoherent=incoherence(snap, rec.gang, slots),
            nodes=len({s.node for s in slots}),
            restart=restart or bool(rec.runs),
        )
        if not rec.runs:
            kinds = frozenset(snap.node(s.node).kind for s in slots)
            rec.ideal_same_hardware = self.reference.same_hardware(rec.gang, kinds)
        rec.runs.append(run)
        rec.outcome = PLACED
        self.cluster.take(rec.name, run)
        if run.ready_at <= t:
            self._serving(rec, run, +1)
        else:
            self._at(run.ready_at, _READY, (rec, run))

    def _error(self, rec: GangRecord, t: float, exc: BaseException | str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
            self.errors.append({"at": t, "gang": rec.name, "error": what})
