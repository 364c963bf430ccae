"""NVIDIA KAI Scheduler's allocate action with its topology and nodeplacement plugins.

Read from kai-scheduler/KAI-Scheduler (the scheduler's default configuration,
pkg/scheduler/conf_util/scheduler_conf_util.go ``defaultSchedulerConf``: ``nodeplacement``
with ``gpu: binpack``, ``topology``, ``subgrouporder``, ``nodeavailability``,
``resourcetype``), re-implemented here from what the code does, not copied.

**The gang as a PodGroup.** Each pod set is a leaf SubGroup (KAI's ``PodSet``) whose
``minMember`` is its count (all or nothing) and whose ``topologyConstraint`` is its own
``requiredLevel`` -> ``requiredTopologyLevel`` (the upper bound, ``topology-required-placement``)
and ``preferredLevel`` -> ``preferredTopologyLevel`` (the finer target,
``topology-preferred-placement``); ``node`` is the ``kubernetes.io/hostname`` level, in-node
levels (``nvlink``, ``pcie``, ``numa``) have no KAI equivalent and are dropped, and a
preferred level no finer than the required one is dropped (an equal one adds nothing, a
coarser one KAI refuses as a configuration error, calculateRelevantDomainLevels). Pod
sets joined by ``colocateWith`` share a parent SubGroupSet whose constraint prefers the
finest colocation level (a wish, as gangslice treats it, hence preferred rather than
required); when the colocations join every pod set that parent is the PodGroup itself (its
``spec.topologyConstraint``). KAI allocates
the members of a SubGroupSet in name order: subgrouporder's ``SubGroupOrderFn`` ranks
unsatisfied subgroups equal, and the session's fallback compares names
(pkg/scheduler/framework/session_plugins.go ``SubGroupOrderFn``).

**Topologies.** A ``Topology`` CRD lists label keys, coarse to fine; a node lacking any of
them is outside the topology and never offered to a constrained subgroup
(plugins/topology/common.go ``isNodePartOfTopology``). The Topology a constraint names is
taken to be the one an administrator writes from the labels nodes carry: the hierarchy's
levels, coarsest first, down to the constraint's finest level, keeping those that every node
labelled with that finest level carries (``kubernetes.io/hostname`` last, for ``node``). So a
``leaf`` constraint uses the H100 and L40S nodes as well as the GB200 trays, a ``clique``
constraint only the trays; KAI allows several Topologies, each subgroup naming its own
(actions/allocate/allocate_multi_topology_test.go).

**Allocation** (actions/common/allocate.go ``AllocateJob`` -> ``allocateSubGroupSet`` ->
``allocateMembersOnNodes`` -> ``allocatePodSet`` -> ``allocateTasksOnNodeSet``): each
SubGroupSet and each PodSet asks the topology plugin for node sets
(plugins/topology/job_filtering.go ``subSetNodesFn``) and tries them in order on a
checkpoint, rolling back and trying the next when any member or pod fails; a SubGroupSet
fails when every node set fails. Per subgroup, on what the gang took so far:

- the lowest common domain of the offered nodes, not below the preferred level
  (``lowestCommonDomainID``); only its subtree is counted, and it must hold the subgroup;
- a domain holds it when ``AllocatablePods`` >= its pod count, ``AllocatablePods`` summing
  per node how many copies of the largest pod of the subgroup fit (``calcNodeAccommodation``:
  GPUs, cpu, memory, the pod count; node selectors are not applied), or, where some pods
  use GPUs and others not (``useRepresentorPodsAccounting``), when the summed requests fit
  the domain's free resources (``getJobRatioToFreeResources`` <= 1);
- candidate levels (``calculateRelevantDomainLevels``): from the preferred level up to the
  required one, the required level alone, or the preferred level up to the whole cluster;
- order (``sortTree`` then ``sortDomainInfos``): finest level first; within a level, the
  tree's order, each domain's children sorted by the subgroup's requests over the child's
  free resources, highest first (bin-packing: least available relative to the request),
  ties by domain id (label values joined with dots) -- a walk of the sorted tree, so a
  fuller parent's children come before an emptier parent's;
- with a preferred level, nodes are ranked by their preferred-level domain's place in that
  walk: ``floor((k + 1) / n * 10) * 100000`` for the k-th of n, emptiest last and highest
  (node_scoring.go ``calculateNodeScores``), so pods gather in the preferred domain with the
  most room; a subgroup without a preferred level uses its nearest ancestor's ranks.

Per pod (``allocateTask``: ``OrderedNodesByTask``, first node that passes ``FittingNode``):
score = topology rank + nodeplacement binpack, ``9 * (1 - (free - min) / (max - min))`` over
the node set's non-allocated GPUs (plugins/nodeplacement/pack.go ``getScoreOfCurrentNode``,
fewest free GPUs first), for pods without GPUs the same over cpu plus resourcetype's 10 on
GPU-less nodes; nodeavailability's 1000 is the same on every node with room. Equal scores go
to the node whose name sorts first (framework/session.go ``sortNodesByScore``), so ties are
KAI's own, by name. kube-scheduler's filters (:func:`~extender.peers.common.admitted`) and
room (:meth:`~extender.peers.common.Work.fits`) stand for KAI's predicates plugin; GPUs are
what the node hands out (:meth:`~extender.peers.common.Work.take`).

**Not modelled**: queues, fair share and reclaim/preempt/consolidate (one gang on a given
snapshot, as for every peer); releasing pods and pipelining (nothing releases here); elastic
``minMember`` below the count and ``minSubGroup``; segments (``segment-size``); the opt-in
``numa`` plugin; GPU sharing (fractions); pods of the same job already running (no gang is
partly placed here); PodAffinity scores.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from extender.peers.common import Fail, Work, admitted, run_policy
from extender.placement import feasibility
from extender.placement.request import GangRequest, PodRequests, PodSet
from extender.placement.scoring import LevelError, node_scope, resolve_level, resolve_need
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot

#: A domain's ratio for a resource it has none of (job_filtering.go ``requiredResourceNotInDomainRatio``).
NOT_IN_DOMAIN_RATIO = 1000.0
#: Weight of the topology plugin's node score (plugins/scores ``Topology``).
TOPOLOGY_SCORE = 100000.0
_ROOT = -1  # topology position of the root domain, above the Topology's first level


@dataclass(frozen=True, slots=True)
class _Constraint:
    """A ``topologyConstraint``: hierarchy scopes, ``node_scope`` for ``kubernetes.io/hostname``."""

    required: int | None = None
    preferred: int | None = None

    @property
    def finest(self) -> int:
        return max(s for s in (self.required, self.preferred) if s is not None)


@dataclass(frozen=True, slots=True)
class _PodSet:
    """A leaf SubGroup."""

    name: str
    pod_set: PodSet
    constraint: _Constraint | None


@dataclass(frozen=True, slots=True)
class _SubGroupSet:
    name: str
    constraint: _Constraint | None
    members: tuple[_PodSet | _SubGroupSet, ...]

    @property
    def pod_sets(self) -> list[PodSet]:
        out: list[PodSet] = []
        for m in self.members:
            out.extend([m.pod_set] if isinstance(m, _PodSet) else m.pod_sets)
        return out


@dataclass(frozen=True, slots=True)
class _Topology:
    """A Topology CRD: hierarchy scopes coarse to fine, and the nodes that carry them all."""

    scopes: tuple[int, ...]
    nodes: tuple[int, ...]


@dataclass(slots=True)
class _Domain:
    pos: int  # index into the topology's scopes; _ROOT for the whole cluster
    id: str  # the label values from the top down, joined with dots (calcDomainId)
    value: str  # its own label value
    nodes: list[int]
    children: list[_Domain] = field(default_factory=list)
    pods: int = 0  # AllocatablePods


@dataclass(frozen=True, slots=True)
class _Tasks:
    """What a subgroup asks for, as subSetNodesFn sums it."""

    count: int
    gpus: int
    cpu: int
    memory: int
    ephemeral: int
    #: useRepresentorPodsAccounting: every pod uses GPUs, or none does.
    representor: bool
    #: The largest pod, per resource (the representor pod).
    pod_gpus: int
    pod_requests: PodRequests

    @classmethod
    def of(cls, pod_sets: Sequence[PodSet]) -> _Tasks:
        with_gpus = sum(ps.count for ps in pod_sets if ps.gpus_per_pod > 0)
        count = sum(ps.count for ps in pod_sets)
        return cls(
            count=count,
            gpus=sum(ps.gpus for ps in pod_sets),
            cpu=sum(ps.requests.cpu_millis * ps.count for ps in pod_sets),
            memory=sum(ps.requests.memory_bytes * ps.count for ps in pod_sets),
            ephemeral=sum(ps.requests.ephemeral_bytes * ps.count for ps in pod_sets),
            representor=with_gpus in (0, count),
            pod_gpus=max(ps.gpus_per_pod for ps in pod_sets),
            pod_requests=PodRequests(
                cpu_millis=max(ps.requests.cpu_millis for ps in pod_sets),
                memory_bytes=max(ps.requests.memory_bytes for ps in pod_sets),
                ephemeral_bytes=max(ps.requests.ephemeral_bytes for ps in pod_sets),
            ),
        )

    @property
    def only_pods(self) -> bool:
        r = self.pod_requests
        return not (self.pod_gpus or r.cpu_millis or r.memory_bytes or r.ephemeral_bytes)


# -- the PodGroup ---------------------------------------------------------------------------


def _constraint(snap: ClusterSnapshot, ps: PodSet) -> _Constraint | None:
    need = resolve_need(ps, snap.hierarchy)
    required = need.scope if need.scope >= 0 else None
    if required is None and need.preferred_scope is None:
        return None
    return _Constraint(required, need.preferred_scope)


def _colocation_scope(snap: ClusterSnapshot, level: str) -> int | None:
    try:
        scope, _ = resolve_level(level, snap.hierarchy)
    except LevelError:
        return None
    # An in-node level: the pods share a node at least.
    return scope if scope is not None else node_scope(snap.hierarchy)


def _podgroup(snap: ClusterSnapshot, gang: GangRequest) -> _SubGroupSet:
    """The PodGroup: a leaf SubGroup per pod set, colocated ones under a parent that prefers
    their finest colocation level (the PodGroup itself when they are all of them)."""
    edges = [
        (ps.name, ps.colocate_with.pod_set, scope)
        for ps in gang.pod_sets
        if ps.colocate_with is not None
        and (scope := _colocation_scope(snap, ps.colocate_with.level)) is not None
    ]
    group = {ps.name: ps.name for ps in gang.pod_sets}

    def find(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    for a, b, _ in edges:
        group[find(b)] = find(a)
    finest: dict[str, int] = {}
    for a, _, scope in edges:
        key = find(a)
        finest[key] = max(finest.get(key, scope), scope)
    groups: dict[str, list[_PodSet]] = {}
    for ps in gang.pod_sets:
        groups.setdefault(find(ps.name), []).append(_PodSet(ps.name, ps, _constraint(snap, ps)))
    if len(groups) == 1 and len(gang.pod_sets) > 1:
        ((key, members),) = groups.items()
        return _SubGroupSet("", _Constraint(None, finest[key]), tuple(members))
    top: list[_PodSet | _SubGroupSet] = []
    for key, members in groups.items():
        if len(members) == 1:
            top.append(members[0])
        else:
            name = "-".join(sorted(m.name for m in members))
            top.append(_SubGroupSet(name, _Constraint(None, finest[key]), tuple(members)))
    return _SubGroupSet("", None, tuple(top))


def _in_order(members: Sequence[_PodSet | _SubGroupSet]) -> list[_PodSet | _SubGroupSet]:
    return sorted(members, key=lambda m: m.name)


# -- the topology plugin ----------------------------------------------------------------------


class _Kai:
    """One gang's allocation: its Topologies (built once) and the subgroups' node sets."""

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap
        self.node = node_scope(snap.hierarchy)
        self.topologies: dict[_Constraint, _Topology] = {}
        self.failures: list[Fail] = []

    def value(self, i: int, scope: int) -> str | None:
        return self.snap.nodes[i].name if scope == self.node else self.snap.path(i)[scope]

    def level_name(self, scope: int) -> str:
        h = self.snap.hierarchy
        return "node" if scope == self.node else h.levels[scope].name

    def topology(self, constraint: _Constraint) -> _Topology:
        """The Topology the constraint names: the levels every node labelled with its finest
        level carries, coarsest first, down to that level (and the levels it names)."""
        got = self.topologies.get(constraint)
        if got is None:
            everyone = range(len(self.snap.nodes))
            finest = constraint.finest
            named = {constraint.required, constraint.preferred}
            carriers = [i for i in everyone if self.value(i, finest) is not None]
            scopes = [
                s
                for s in range(finest + 1)
                if s in named or (s < self.node and all(self.value(i, s) is not None for i in carriers))
            ]
            nodes = tuple(i for i in everyone if all(self.value(i, s) is not None for s in scopes))
            got = self.topologies[constraint] = _Topology(tuple(scopes), nodes)
        return got

    # -- accounting --------------------------------------------------------------------------

    def accommodation(self, work: Work, i: int, tasks: _Tasks) -> int:
        """Copies of the subgroup's largest pod the node takes (calcNodeAccommodation)."""
        if tasks.only_pods:
            return tasks.count
        fit = feasibility.UNLIMITED
        if tasks.pod_gpus:
            fit = work.free(i).bit_count() // tasks.pod_gpus
        if work.limits:
            fit = min(fit, self.snap.room(i, tasks.pod_requests, work.used.get(i)))
        return fit

    def ratio(self, work: Work, nodes: Sequence[int], tasks: _Tasks) -> float:
        """The subgroup's requests over the domain's free resources, the largest of them
        (getJobRatioToFreeResources): above 1 the domain cannot hold it."""
        worst = 0.0
        if tasks.gpus:
            free = sum(work.free(i).bit_count() for i in nodes)
            worst = max(worst, tasks.gpus / free if free > 0 else NOT_IN_DOMAIN_RATIO)
        for want, field_name in (
            (tasks.cpu, "cpu_millis"),
            (tasks.memory, "memory_bytes"),
            (tasks.ephemeral, "ephemeral_bytes"),
        ):
            if want <= 0:
                continue
            idle = [x for i in nodes if (x := self.idle(work, i, field_name)) is not None]
            if idle:
                free = sum(idle)
                worst = max(worst, want / free if free > 0 else NOT_IN_DOMAIN_RATIO)
        return worst

    def idle(self, work: Work, i: int, field_name: str) -> int | None:
        facts = self.snap.nodes[i].facts
        have = getattr(facts.allocatable, field_name)
        if have is None:
            return None
        used = work.used.get(i, feasibility.NOTHING)
        taken: int = (getattr(facts.requested, field_name) or 0) + (getattr(used, field_name) or 0)
        return max(0, int(have) - taken)

    def fits(self, work: Work, d: _Domain, tasks: _Tasks) -> bool:
        """checkJobDomainFit: pods that fit, or the summed requests where pods differ in kind."""
        if tasks.representor:
            return d.pods >= tasks.count
        return self.ratio(work, d.nodes, tasks) <= 1.0

    # -- subSetNodesFn -----------------------------------------------------------------------

    def subset(
        self, work: Work, constraint: _Constraint | None, pod_sets: Sequence[PodSet], offered: Sequence[int]
    ) -> tuple[list[list[int]], dict[int, float] | None] | Fail:
        """The node sets to try for a subgroup, in order, and its node ranks (with a
        preferred level), or why there are none."""
        if constraint is None:
            return [list(offered)], None
        topo = self.topology(constraint)
        inside = set(topo.nodes)
        valid = [i for i in offered if i in inside]
        # lowestCommonDomainID: shared label values from the top, not below the preferred level.
        values: list[str] = []
        for scope in topo.scopes:
            seen = {self.value(i, scope) for i in valid}
            if len(seen) != 1:
                break
            (value,) = seen
            if not value:
                break
            values.append(value)
            if scope == constraint.preferred:
                break
        depth = topo.scopes.index(
            constraint.preferred if constraint.preferred is not None else constraint.finest
        )
        tasks = _Tasks.of(pod_sets)
        members = [
            i for i in topo.nodes if all(self.value(i, topo.scopes[p]) == v for p, v in enumerate(values))
        ]
        pods = {i: self.accommodation(work, i, tasks) for i in members} if tasks.representor else {}
        lcd = self.build(topo, len(values) - 1, values, members, depth, pods, work, tasks)
        who = _who(pod_sets)
        if not self.fits(work, lcd, tasks):
            where = (
                "the cluster" if lcd.pos == _ROOT else f"{self.level_name(topo.scopes[lcd.pos])} {lcd.value}"
            )
            return Fail(
                pod_sets[0].name,
                f"{who}: not enough free resources in {where} for {tasks.count} pods"
                + (f" (it can allocate only {lcd.pods})" if tasks.representor else ""),
                tasks.count - min(lcd.pods, tasks.count) if tasks.representor else tasks.count,
            )
        scores = (
            self.node_scores(topo, lcd, constraint.preferred) if constraint.preferred is not None else None
        )
        relevant = self.relevant(topo, constraint)
        candidates: list[_Domain] = []
        closest: _Domain | None = None
        for level in _levels_bottom_up(lcd):
            for d in level:
                if d.pos not in relevant:
                    continue
                if self.fits(work, d, tasks):
                    candidates.append(d)
                elif closest is None or d.pods > closest.pods:
                    closest = d
        if not candidates:
            # Only a required level coarser than the common domain can leave none.
            assert constraint.required is not None and closest is not None
            name = self.level_name(constraint.required)
            only = f" ({name} {closest.value} can allocate only {closest.pods})" if tasks.representor else ""
            return Fail(
                pod_sets[0].name,
                f"{who}: no {name} can allocate all {tasks.count} pods{only}",
                tasks.count - closest.pods if tasks.representor else tasks.count,
                closest.value,
            )
        valid_set = set(valid)
        return [[i for i in d.nodes if i in valid_set] for d in candidates], scores

    def build(
        self,
        topo: _Topology,
        pos: int,
        values: list[str],
        nodes: list[int],
        depth: int,
        pods: dict[int, int],
        work: Work,
        tasks: _Tasks,
    ) -> _Domain:
        """The subtree of a domain down to ``depth``, children sorted by sortTree: the
        subgroup's requests over each child's free resources, highest first, then id."""
        d = _Domain(pos, ".".join(values) or "root", values[-1] if values else "root", nodes)
        d.pods = sum(pods.get(i, 0) for i in nodes)
        if pos >= depth:
            return d
        scope = topo.scopes[pos + 1]
        groups: dict[str, list[int]] = {}
        for i in nodes:
            groups.setdefault(str(self.value(i, scope)), []).append(i)
        children = [
            self.build(topo, pos + 1, [*values, v], g, depth, pods, work, tasks) for v, g in groups.items()
        ]
        ratios = [self.ratio(work, c.nodes, tasks) for c in children]
        order = sorted(range(len(children)), key=lambda k: (-ratios[k], children[k].id))
        d.children = [children[k] for k in order]
        return d

    def relevant(self, topo: _Topology, constraint: _Constraint) -> set[int]:
        """calculateRelevantDomainLevels: positions from the preferred level up to the
        required one, or the required one alone, or the preferred one up to the root."""
        top = topo.scopes.index(constraint.required) if constraint.required is not None else _ROOT
        low = topo.scopes.index(constraint.preferred) if constraint.preferred is not None else top
        return set(range(top, low + 1))

    def node_scores(self, topo: _Topology, lcd: _Domain, preferred: int) -> dict[int, float]:
        """calculateNodeScores: the preferred-level domains in the sorted tree's order, the
        k-th of n ranked floor((k + 1) / n * 10) (the last, the emptiest, highest)."""
        at = topo.scopes.index(preferred)
        ordered: list[_Domain] = []

        def walk(d: _Domain) -> None:
            if d.pos == at:
                ordered.append(d)
            for c in d.children:
                walk(c)

        walk(lcd)
        scores: dict[int, float] = {}
        for k, d in enumerate(ordered):
            score = math.floor((k + 1) / len(ordered) * 10) * TOPOLOGY_SCORE
            for i in d.nodes:
                scores[i] = score
        return scores

    # -- allocate ----------------------------------------------------------------------------

    def allocate_set(
        self, work: Work, sgs: _SubGroupSet, offered: Sequence[int], ranks: dict[int, float] | None
    ) -> bool:
        """allocateSubGroupSet: every member in one node set, the first that holds them all."""
        got = self.subset(work, sgs.constraint, sgs.pod_sets, offered)
        if isinstance(got, Fail):
            self.failures.append(got)
            return False
        node_sets, scores = got
        ranks = scores if scores is not None else ranks
        for nodes in node_sets:
            trial = work.copy()
            if all(self.allocate_member(trial, m, nodes, ranks) for m in _in_order(sgs.members)):
                work.adopt(trial)
                return True
        return False

    def allocate_member(
        self, work: Work, m: _PodSet | _SubGroupSet, offered: Sequence[int], ranks: dict[int, float] | None
    ) -> bool:
        if isinstance(m, _SubGroupSet):
            return self.allocate_set(work, m, offered, ranks)
        got = self.subset(work, m.constraint, [m.pod_set], offered)
        if isinstance(got, Fail):
            self.failures.append(got)
            return False
        node_sets, scores = got
        ranks = scores if scores is not None else ranks
        for nodes in node_sets:
            trial = work.copy()
            fail = self.place(trial, m.pod_set, nodes, ranks or {})
            if fail is None:
                work.adopt(trial)
                return True
            self.failures.append(fail)
        return False

    def place(self, work: Work, ps: PodSet, nodes: Sequence[int], ranks: dict[int, float]) -> Fail | None:
        """allocateTasksOnNodeSet: each pod on the best-scored node with room (the topology
        rank, then nodeplacement's binpack: fewest free GPUs, or for pods without GPUs
        resourcetype's GPU-less nodes and the least free cpu; then name)."""
        snap = self.snap
        names = {i: snap.nodes[i].name for i in nodes}
        cpu_only = ps.gpus_per_pod == 0

        def key(i: int) -> tuple[float, int, float, str]:
            if cpu_only:
                free_cpu = self.idle(work, i, "cpu_millis")
                gpu_node = 0 if snap.nodes[i].shape.size == 0 else 1
                return (-ranks.get(i, 0.0), gpu_node, math.inf if free_cpu is None else free_cpu, names[i])
            return (-ranks.get(i, 0.0), 0, work.free(i).bit_count(), names[i])

        heap = [(key(i), i) for i in admitted(snap, ps, nodes) if work.fits(i, ps)]
        heapq.heapify(heap)
        for k in range(ps.count):
            if not heap:
                return Fail(
                    ps.name,
                    f"pod set {ps.name}: pod {k} of {ps.count} found no node with {ps.gpus_per_pod} "
                    f"free GPUs in its node set ({len(nodes)} nodes)",
                    ps.count - k,
                )
            i = heap[0][1]
            work.take(ps, i)
            # Only this node's score changed (it only rose): refresh it in place, or drop it.
            if work.fits(i, ps):
                heapq.heapreplace(heap, (key(i), i))
            else:
                heapq.heappop(heap)
        return None


def _levels_bottom_up(root: _Domain) -> list[list[_Domain]]:
    """reverseLevelOrder: the tree's levels, deepest first, each left to right."""
    levels: list[list[_Domain]] = []
    level = [root]
    while level:
        levels.append(level)
        level = [c for d in level for c in d.children]
    return levels[::-1]


def _who(pod_sets: Sequence[PodSet]) -> str:
    if len(pod_sets) == 1:
        return f"pod set {pod_sets[0].name}"
    return "pod sets " + ", ".join(ps.name for ps in pod_sets)


def _kai_core(snap: ClusterSnapshot, gang: GangRequest, work: Work) -> Fail | None:
    kai = _Kai(snap)
    if kai.allocate_set(work, _podgroup(snap, gang), range(len(snap.nodes)), None):
        return None
    if kai.failures:
        return kai.failures[0]
    first = gang.pod_sets[0].name
    return Fail(first, "no node set holds the whole PodGroup", gang.pods)


def kai(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """NVIDIA KAI Scheduler's allocate action with its topology-aware allocation
    (pkg/scheduler/actions/common/allocate.go ``AllocateJob``,
    pkg/scheduler/plugins/topology/job_filtering.go ``subSetNodesFn``,
    pkg/scheduler/plugins/nodeplacement/pack.go); see :mod:`extender.peers.kai`.

    Pod sets are the PodGroup's SubGroups with their own required/preferred levels, colocated
    ones under a parent that prefers their colocation level. Per subgroup, the lowest level
    first, the domains that hold it in bin-packing order (least free relative to the request
    first), each tried in turn until every pod fits; inside the chosen domain the preferred
    level's emptiest domain first, then the node with the fewest free GPUs, then by name.
    GPUs: as the node hands them out.
    """
    return run_policy(snapshot, gang, _kai_core, "kai")
