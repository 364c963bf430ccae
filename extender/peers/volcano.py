"""Volcano's allocate action with the gang, predicates, binpack and network-topology-aware plugins,
as Volcano v1.14.1 runs it (the release the e2e tier builds). Differences at the newest code
(master after v1.16.0-alpha.1) are named where they change a placement.

Read, not copied, from volcano-sh/volcano v1.14.1:

- pkg/scheduler/actions/allocate/allocate.go: ``allocateResources`` sends a job through the
  HyperNode search (``allocateForJob``) only when ``ContainsHardTopology`` (a hard
  ``networkTopology`` with a tier, on the job or on a ``subGroupPolicy`` entry) or
  ``ContainsSubJobPolicy``; every other job is placed task by task on all nodes
  (``allocateResourcesForTasks`` with ``<cluster-top-hypernode>``). ``allocateForJob``: per
  gradient of HyperNodes (``HyperNodeGradientForJobFn``), per HyperNode a dry run that pops the
  job's sub-jobs in ``SubJobOrderFn`` order and runs ``allocateForSubJob`` for each, until
  ``JobReady``; the first gradient with a ready job wins, and in it the HyperNode whose sub-jobs
  scored most in sum (``selectBestHyperNodeForJob``). ``allocateForSubJob``: the same search for
  the sub-job inside the job's HyperNode (``HyperNodeGradientForSubJobFn``), each candidate a dry
  run of ``allocateResourcesForTasks``, the best by ``HyperNodeOrderFn``
  (``selectBestHyperNodeForSubJob``); the sub-job's ``AllocatedHyperNode`` becomes the lowest
  common ancestor of what it had and the HyperNode chosen. ``allocateResourcesForTasks``: per
  task in ``TaskOrderFn`` order, the nodes that pass the predicates, scored
  (``prioritizeNodes``: one node is taken unscored), the best taken, until the sub-job is ready;
  a task no node takes ends the attempt (``NeedContinueAllocating`` is false when every pod is
  needed, as in a gang).
- pkg/scheduler/plugins/network-topology-aware/network_topology_aware.go:
  ``hyperNodeGradientFn`` (a walk of the search root's subtree keeping the HyperNodes of tier up
  to ``highestTierAllowed`` whose idle resources at session open cover the job's or sub-job's
  minimum, grouped by tier, tightest first; ``getSearchRoot`` narrows to the highest allowed
  ancestor of the sub-job's ``AllocatedHyperNode``); ``HyperNodeOrderFn`` (bin-pack of the
  sub-job's whole request, ``(used + request) / allocatable``, 0 on overflow; ties at the top
  broken by the share of the sub-job's tasks already there); ``batchNodeOrderFn``: for a pod of
  a sub-job without ``networkTopology`` (``batchNodeOrderFnForNormalPods``), the weighted mean
  over tiers of the pod's bin-pack on the node's HyperNode of that tier, weight
  ``fading^(tier - 1)`` (``hypernode.binpack.normal-pod.fading`` 0.8), a full score at a tier
  where the node has no HyperNode; for a pod of a sub-job with one
  (``batchNodeOrderFnForNetworkAwarePods``), ``(maxTier - tier(LCA)) / (maxTier - minTier)`` of
  the node's lowest-tier HyperNode and the HyperNode the sub-job's pods span so far (1 inside
  it, 0 for the first pod or a node without a lowest-tier HyperNode), ties broken by the share of
  the sub-job's tasks there. Every score is scaled by ``MaxNodeScore`` (100) times the weight (1).
- pkg/scheduler/plugins/binpack/binpack.go ``BinPackingScore``: ``(used + request) / allocatable``
  per resource, times 100.
- pkg/scheduler/plugins/gang/gang.go: ``SubJobOrderFn`` (sub-jobs not yet ready first), then
  pkg/scheduler/framework/session_plugins.go ``SubJobOrderFn`` (``MatchIndex``, then UID: the
  default sub-job, whose UID is the job's, before the policies' ``<job>/<policy>-<values>``);
  ``JobReady`` (every needed pod allocated).
- pkg/scheduler/api/job_info.go, sub_job_info.go: a pod joins the sub-job of the first
  ``subGroupPolicy`` whose ``labelSelector`` it matches and whose ``matchLabelKeys`` it carries
  (one sub-job per distinct value), else the job's default sub-job, which carries the job's
  ``networkTopology`` and needs every pod when the job has no policy, one pod otherwise;
  a policy's sub-job needs ``subGroupSize`` pods; ``GetMinResources`` of a sub-job is its pending
  tasks' requests. Soft mode is not rewritten at v1.14.1: a soft job or sub-job is not
  ``IsHardTopologyMode`` and only gets the network-aware node score.
- pkg/controllers/job/helpers/helpers.go ``CompareTask``: tasks by pod index (the name's last
  ``-`` field), across roles.

The profile modelled: a GPU cluster's bin-packing profile, the ``binpack`` plugin and the
network-topology-aware plugin weighing ``nvidia.com/gpu`` (``binpack.resources`` and
``hypernode.binpack.resources``), GPUs being the only resource the simulator knows on every
node; ``nodeorder``'s least-requested scoring is off (on cpu and memory it would pull against the
bin-pack; neither is modelled). Ties Volcano breaks at random (``SelectBestNodeAndScore``,
``SelectBestHyperNodeAndScore``, map order in ``selectBestHyperNodeForJob``) are broken by
snapshot order here, HyperNodes by tier and label path.

Newest code, where it differs: soft mode is rewritten to hard at the session's top tier
(framework/session.go ``adjustNetworkTopologySpec``), so soft jobs take the HyperNode search too;
``HyperNodeGradientForSubJobFn`` searches inside the job's HyperNode also for a job without
policies; a nomination fast path (``allocateFromNomination``) serves preempted jobs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from extender.peers.common import Fail, Work, no_room, run_policy
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import node_scope, resolve_level, resolve_need
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.hierarchy import DomainKey, Hierarchy

#: ``k8s.io/kube-scheduler/framework.MaxNodeScore``: every plugin score is scaled by it (weight 1).
MAX_SCORE = 100.0
#: ``hypernode.binpack.normal-pod.fading`` default.
FADING = 0.8
#: ``framework.ClusterTopHyperNode``: the virtual root over every HyperNode and node.
ROOT_NAME = "<cluster-top-hypernode>"
_ROOT: DomainKey = (-1, ())


# -- the Volcano job a gang is ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topology:
    """A ``networkTopology``: ``mode`` and ``highestTierAllowed`` (None: not set, or a
    ``highestTierName`` no HyperNode carries, which Volcano skips)."""

    hard: bool
    tier: int | None

    @property
    def hard_tier(self) -> int | None:
        """``IsHardTopologyMode``: the tier when the mode is hard and a tier is set."""
        return self.tier if self.hard else None


@dataclass(frozen=True, slots=True)
class SubGroupPolicy:
    """A ``subGroupPolicy`` entry whose ``matchLabelKeys`` is ``[volcano.sh/task-spec]``: the
    pods of each role in ``roles`` form one sub-group of ``size`` pods (``subGroupSize``)."""

    name: str
    roles: tuple[str, ...]
    size: int = 1
    topology: Topology | None = None


@dataclass(frozen=True, slots=True)
class VolcanoJob:
    """A Volcano Job (``batch.volcano.sh``): one task per pod set, ``minAvailable`` every pod.
    ``same_node``: pod sets whose pods carry a required pod affinity to each other on
    ``kubernetes.io/hostname`` (Volcano has no tier for a single node)."""

    topology: Topology | None = None
    policies: tuple[SubGroupPolicy, ...] = ()
    same_node: frozenset[str] = frozenset()


def volcano_job(snap: ClusterSnapshot, gang: GangRequest) -> VolcanoJob:
    """The Volcano Job a gang is: gangslice's PodGroup reader
    (:func:`extender.controllers.podgroups.groups.gang_request`) in reverse, tiers numbered as
    ``gangslice hypernodes`` numbers them (tier 1 the finest level some node carries).

    - A gang of one pod set: its ``requiredLevel`` is the job's ``networkTopology``, hard (the
      reader makes a hard job topology every pod set's required level); else its
      ``preferredLevel``, soft (the reader makes soft a preferred level).
    - A gang of several pod sets: each pod set with a ``requiredLevel`` is a ``subGroupPolicy``
      of its own (selected by its ``volcano.sh/task-spec``, ``subGroupSize`` its pod count) with
      a hard topology at that tier; one with only a ``preferredLevel``, a soft one. A
      ``colocateWith`` at a hierarchy level is the job's ``networkTopology`` at the coarsest such
      tier, hard: that is how a Volcano user keeps prefill and decode together (v1.14.1's soft
      mode only steers pods among HyperNodes of tier 1, which on a mixed fleet exist only where
      the finest level is, the NVL72 cliques; the llm-d guides likewise write the P/D locality
      as a required topology, Kueue's ``podset-required-topology``).
    - ``requiredLevel: node`` is a required pod affinity on the hostname among the pod set's
      pods; in-node levels (``nvlink``, ``numa`` ...) have no Volcano equivalent and are dropped.
    """
    return _job_of(snap, gang, _tree(snap).level_tier)


def _job_of(snap: ClusterSnapshot, gang: GangRequest, tiers: dict[int, int]) -> VolcanoJob:
    h = snap.hierarchy

    def tier_of(scope: int) -> int | None:
        return tiers.get(scope)

    def own(ps: PodSet) -> Topology | None:
        need = resolve_need(ps, h)
        if 0 <= need.scope < node_scope(h):
            return Topology(True, tier_of(need.scope))
        if need.preferred_scope is not None and need.preferred_scope < node_scope(h):
            return Topology(False, tier_of(need.preferred_scope))
        return None

    same_node = frozenset(
        ps.name for ps in gang.pod_sets if ps.count > 1 and resolve_need(ps, h).scope == node_scope(h)
    )
    if len(gang.pod_sets) == 1:
        return VolcanoJob(own(gang.pod_sets[0]), (), same_node)
    policies = tuple(
        SubGroupPolicy(ps.name, (ps.name,), ps.count, t) for ps in gang.pod_sets if (t := own(ps)) is not None
    )
    scopes = [
        s
        for ps in gang.pod_sets
        if ps.colocate_with is not None
        and (s := resolve_level(ps.colocate_with.level, h)[0]) is not None
        and s < node_scope(h)
    ]
    job = Topology(True, tier_of(min(scopes))) if scopes else None
    return VolcanoJob(job, policies, same_node)


# -- the HyperNode tree -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HyperNode:
    key: DomainKey
    tier: int
    nodes: tuple[int, ...]
    #: Itself, then its ancestors up to the root (``GetAncestors``).
    ancestors: tuple[DomainKey, ...]
    #: Itself and every HyperNode below it.
    subtree: tuple[DomainKey, ...]


@dataclass(frozen=True)
class _Tree:
    """The session's HyperNodes as ``gangslice hypernodes`` renders them for this cluster (one per
    label value of each level some node carries, tier 1 the finest such level) plus the virtual
    root one tier above them all (framework/session.go ``addClusterTopHyperNode``)."""

    hns: dict[DomainKey, _HyperNode]
    #: Hierarchy level index -> tier.
    level_tier: dict[int, int]
    #: ``HyperNodesTiers``: every tier with a HyperNode, ascending, the root's last.
    tiers: list[int]
    #: Per node: its HyperNode at each tier.
    at: list[dict[int, DomainKey]]
    #: Per node: every HyperNode it is in.
    member_of: list[tuple[DomainKey, ...]]

    @property
    def root(self) -> _HyperNode:
        return self.hns[_ROOT]

    def lowest(self, i: int) -> DomainKey | None:
        """``FindHyperNodeForNode``: the node's HyperNode at the lowest tier, if it has one."""
        return self.at[i].get(self.tiers[0])

    def lca(self, a: DomainKey | None, b: DomainKey | None) -> DomainKey | None:
        """``GetLCAHyperNode`` (None stands for the empty name)."""
        if a is None:
            return b
        if b is None:
            return a
        mine = set(self.hns[a].ancestors)
        return next((k for k in self.hns[b].ancestors if k in mine), None)


def _tree(snap: ClusterSnapshot) -> _Tree:
    return _tree_of(snap.hierarchy, tuple(snap.path(i) for i in range(len(snap.nodes))))


@functools.lru_cache(maxsize=8)
def _tree_of(h: Hierarchy, paths: tuple[tuple[str | None, ...], ...]) -> _Tree:
    # The levels some node carries a value for (extender.controllers.podgroups.groups.present_levels).
    present = [lv for lv in range(len(h.levels)) if any(p[lv] for p in paths)]
    level_tier = {lv: t for t, lv in enumerate(reversed(present), start=1)}
    root_tier = len(present) + 1
    n = len(paths)
    parent: dict[DomainKey, DomainKey] = {}
    members: dict[DomainKey, list[int]] = {_ROOT: list(range(n))}
    at: list[dict[int, DomainKey]] = []
    for path in paths:
        chain = [k for lv in present if (k := h.domain(path, lv)) is not None]
        for k, below in zip([_ROOT, *chain], chain, strict=False):
            parent.setdefault(below, k)
        for k in chain:
            members.setdefault(k, []).append(len(at))
        at.append({level_tier[k[0]]: k for k in chain} | {root_tier: _ROOT})
    children: dict[DomainKey, list[DomainKey]] = {}
    for k, p in parent.items():
        children.setdefault(p, []).append(k)

    def ancestors(k: DomainKey) -> tuple[DomainKey, ...]:
        out = [k]
        while out[-1] in parent:
            out.append(parent[out[-1]])
        return tuple(out)

    def subtree(k: DomainKey) -> tuple[DomainKey, ...]:
        out, todo = [], [k]
        while todo:
            cur = todo.pop()
            out.append(cur)
            todo.extend(children.get(cur, ()))
        return tuple(out)

    hns = {
        k: _HyperNode(k, root_tier if k == _ROOT else level_tier[k[0]], tuple(v), ancestors(k), subtree(k))
        for k, v in members.items()
    }
    member_of = [tuple(a.values()) for a in at]
    return _Tree(hns, level_tier, sorted({hn.tier for hn in hns.values()}), at, member_of)


def _hn_words(snap: ClusterSnapshot, key: DomainKey) -> str:
    if key == _ROOT:
        return ROOT_NAME
    return f"{snap.hierarchy.levels[key[0]].name} {key[1][-1]}"


def _tier_words(snap: ClusterSnapshot, tree: _Tree, tier: int | None) -> str:
    if tier is None:
        return "no tier"
    names = [snap.hierarchy.levels[lv].name for lv, t in tree.level_tier.items() if t == tier]
    if names:
        return f"tier {tier} ({names[0]})"
    return f"tier {tier} (the cluster)" if tier >= tree.tiers[-1] else f"tier {tier}"


# -- the allocate action ------------------------------------------------------------------

_Task = tuple[PodSet, int]


@dataclass(frozen=True, slots=True)
class _SubJob:
    uid: str
    tasks: tuple[_Task, ...]
    min_available: int
    topology: Topology | None

    @property
    def gpus(self) -> int:
        return sum(ps.gpus_per_pod for ps, _ in self.tasks)


@dataclass
class _State:
    """One dry run's statement: the gang's working copy of the GPUs, what each HyperNode has in
    use (the plugin's ``hyperNodeResourceCache``, kept by its allocate event handler), and per
    sub-job its pending tasks, the nodes its pods took and its ``AllocatedHyperNode``."""

    work: Work
    used: dict[DomainKey, int]
    pending: dict[str, list[_Task]]
    placed: dict[str, list[int]] = field(default_factory=dict)
    allocated: dict[str, DomainKey | None] = field(default_factory=dict)
    #: Per pod set with a required same-node affinity: the node its first pod took.
    pinned: dict[str, int] = field(default_factory=dict)
    fail: Fail | None = None

    def copy(self) -> _State:
        return _State(
            self.work.copy(),
            dict(self.used),
            {k: list(v) for k, v in self.pending.items()},
            {k: list(v) for k, v in self.placed.items()},
            dict(self.allocated),
            dict(self.pinned),
            self.fail,
        )

    def adopt(self, other: _State) -> None:
        self.work.adopt(other.work)
        self.used, self.pending, self.placed = other.used, other.pending, other.placed
        self.allocated, self.pinned, self.fail = other.allocated, other.pinned, other.fail


class _Allocate:
    def __init__(
        self, snap: ClusterSnapshot, gang: GangRequest, job: VolcanoJob, work: Work, tree: _Tree
    ) -> None:
        self.snap, self.gang, self.job = snap, gang, job
        self.tree = tree
        # Allocatable GPUs per node (the device plugin's healthy count), and per HyperNode with
        # the GPUs idle when the session opened (the plugin's hyperNodeResourceCache).
        self.alloc = snap.per_node(("volcano", "allocatable GPUs"), lambda n: n.shape.size - len(n.unhealthy))
        idle = [b.bit_count() for b in work.base]
        self.hn_alloc = {k: sum(map(self.alloc.__getitem__, x.nodes)) for k, x in tree.hns.items()}
        self.hn_idle = {k: sum(map(idle.__getitem__, x.nodes)) for k, x in tree.hns.items()}
        self.admitted = {ps.name: snap.admitted(ps.node_needs) for ps in gang.pod_sets}
        position = {ps.name: k for k, ps in enumerate(gang.pod_sets)}
        # TaskOrderFn: pod index first (CompareTask), then, where Volcano compares creation
        # times and UIDs, the order of the job's tasks.
        tasks = sorted(
            ((ps, k) for ps in gang.pod_sets for k in range(ps.count)),
            key=lambda t: (t[1], position[t[0].name]),
        )
        grouped: dict[str, list[_Task]] = {}
        size: dict[str, int] = {}
        topo: dict[str, Topology | None] = {}
        for task in tasks:
            ps = task[0]
            policy = next((p for p in job.policies if ps.name in p.roles), None)
            uid = "" if policy is None else f"/{policy.name}-{ps.name}"
            grouped.setdefault(uid, []).append(task)
            if policy is not None:
                size[uid], topo[uid] = policy.size, policy.topology
        # The default sub-job (UID = the job's, so first among equals) carries the job's topology and
        # needs every pod when the job has no policy, one otherwise (getOrCreateDefaultSubJob).
        size[""] = gang.pods if not job.policies else 1
        topo[""] = job.topology
        self.sub_jobs = {
            uid: _SubJob(uid, tuple(group), size[uid], topo[uid]) for uid, group in sorted(grouped.items())
        }
        self.state = _State(work, {k: self.hn_alloc[k] - self.hn_idle[k] for k in tree.hns}, {})
        self.state.pending = {uid: list(sj.tasks) for uid, sj in self.sub_jobs.items()}

    # -- allocateResources --------------------------------------------------------------

    def run(self) -> Fail | None:
        job = self.job
        hard = (job.topology is not None and job.topology.hard_tier is not None) or any(
            p.topology is not None and p.topology.hard_tier is not None for p in job.policies
        )
        if hard or job.policies:
            return self._for_job()
        st = self.state
        (sj,) = self.sub_jobs.values()
        self._tasks(st, sj, self.tree.root)
        return None if self._job_ready(st) else self._failure(st, "node", None)

    def _job_ready(self, st: _State) -> bool:
        """``JobReady``: every pod allocated (a gang's ``minAvailable``)."""
        return sum(len(v) for v in st.placed.values()) == self.gang.pods

    def _ready(self, st: _State, sj: _SubJob) -> bool:
        return len(st.placed.get(sj.uid, ())) >= sj.min_available

    def _failure(self, st: _State, what: str, tier: int | None) -> Fail:
        if tier is not None:
            where = _tier_words(self.snap, self.tree, tier)
            if st.fail is not None:
                last = st.fail
                return Fail(
                    last.pod_set, f"no HyperNode up to {where} holds the job; {last.reason}", last.short_by
                )
            first = self.gang.pod_sets[0].name
            return Fail(first, f"no HyperNode up to {where} has {self.gang.gpus} free GPUs", self.gang.pods)
        return st.fail if st.fail is not None else no_room(self.gang.pod_sets[0], 0, what)

    # -- allocateForJob -----------------------------------------------------------------

    def _for_job(self) -> Fail | None:
        job, st0 = self.job, self.state
        tier = job.topology.hard_tier if job.topology is not None else None
        if tier is not None:
            gradients = self._gradients(self.tree.root, tier, None, self.gang.gpus)
        else:
            gradients = [[self.tree.root]]
        last: _State = st0
        for gradient in gradients:
            best: tuple[float, _State] | None = None
            for hn in gradient:
                st = st0.copy()
                queue = [uid for uid, tasks in st.pending.items() if tasks]
                score = 0.0
                while queue:
                    # SubJobOrderFn: not yet ready first, then UID.
                    uid = min(queue, key=lambda u: (self._ready(st, self.sub_jobs[u]), u))
                    queue.remove(uid)
                    got = self._for_sub_job(st, self.sub_jobs[uid], hn)
                    if got is None:
                        continue
                    score += got
                    if st.pending[uid]:
                        queue.append(uid)
                    if self._job_ready(st):
                        break
                last = st
                if self._job_ready(st) and (best is None or score > best[0]):
                    best = (score, st)
            if best is not None:
                st0.adopt(best[1])
                return None
        return self._failure(last, "node", tier if tier is not None else self.tree.tiers[-1])

    # -- allocateForSubJob --------------------------------------------------------------

    def _for_sub_job(self, st: _State, sj: _SubJob, hn_job: _HyperNode) -> float | None:
        tier = sj.topology.hard_tier if sj.topology is not None else None
        if not self.job.policies or tier is None:
            gradients = [[hn_job]]
        else:
            need = sum(ps.gpus_per_pod for ps, _ in st.pending[sj.uid])
            gradients = self._gradients(hn_job, tier, st.allocated.get(sj.uid), need)
        for gradient in gradients:
            done: list[tuple[_HyperNode, _State]] = []
            for hn in gradient:
                trial = st.copy()
                if self._tasks(trial, sj, hn):
                    done.append((hn, trial))
                else:
                    st.fail = trial.fail
            if not done:
                continue
            scores = self._hn_order(st, sj, [hn for hn, _ in done])
            k = max(range(len(done)), key=lambda j: (scores[j], -j))
            hn, trial = done[k]
            st.adopt(trial)
            st.allocated[sj.uid] = self.tree.lca(st.allocated.get(sj.uid), hn.key)
            return scores[k]
        return None

    def _gradients(
        self, hn: _HyperNode, tier: int, allocated: DomainKey | None, need: int
    ) -> list[list[_HyperNode]]:
        """``hyperNodeGradientFn``: the search root's subtree, tier at most ``tier``, idle GPUs at
        session open covering ``need`` (not checked once the sub-job has an allocated HyperNode),
        grouped by tier, tightest first."""
        tree = self.tree
        root = hn
        if allocated is not None:
            # getSearchRoot: the highest ancestor of the allocated HyperNode within the tier,
            # intersected with the HyperNode the caller allows.
            allowed = None
            for k in tree.hns[allocated].ancestors:
                if tree.hns[k].tier > tier:
                    break
                allowed = k
            if allowed is None:
                return []
            lca = tree.lca(hn.key, allowed)
            if lca == allowed:
                root = hn
            elif lca == hn.key:
                root = tree.hns[allowed]
            else:
                return []
        by_tier: dict[int, list[_HyperNode]] = {}
        for k in root.subtree:
            cand = tree.hns[k]
            if cand.tier <= tier and (allocated is not None or need <= self.hn_idle[k]):
                by_tier.setdefault(cand.tier, []).append(cand)
        return [sorted(by_tier[t], key=_order) for t in sorted(by_tier)]

    def _hn_order(self, st: _State, sj: _SubJob, hns: Sequence[_HyperNode]) -> list[float]:
        """``HyperNodeOrderFn``: bin-pack of the sub-job's whole request on each HyperNode, ties
        at the top broken by the share of the sub-job's tasks already there; times 100."""
        request = sj.gpus
        scores = [self._binpack(st.used[hn.key], self.hn_alloc[hn.key], request) for hn in hns]
        top = max(scores)
        tied = [j for j, s in enumerate(scores) if s == top]
        if len(tied) > 1:
            for j in tied:
                scores[j] += self._task_share(st, sj, hns[j].key)
        return [MAX_SCORE * s for s in scores]

    @staticmethod
    def _binpack(used: int, alloc: int, request: int) -> float:
        """``(used + request) / allocatable`` over GPUs; 0 without a GPU request or on overflow."""
        if request <= 0 or used + request > alloc:
            return 0.0
        return (used + request) / alloc

    def _task_share(self, st: _State, sj: _SubJob, key: DomainKey | None) -> float:
        """``scoreWithTaskNum``: the sub-job's tasks on the HyperNode's nodes, over all its tasks."""
        if key is None or not sj.tasks:
            return 0.0
        inside = set(self.tree.hns[key].nodes)
        return sum(1 for i in st.placed.get(sj.uid, ()) if i in inside) / len(sj.tasks)

    # -- allocateResourcesForTasks ------------------------------------------------------

    def _tasks(self, st: _State, sj: _SubJob, hn: _HyperNode) -> bool:
        allocated = st.allocated.get(sj.uid)
        pending = st.pending[sj.uid]
        nodes = hn.nodes
        took = 0
        while pending:
            ps, _ = pending.pop(0)
            admitted = self.admitted[ps.name]
            pin = st.pinned.get(ps.name)
            cands = [
                i
                for i in nodes
                if (admitted is None or i in admitted) and (pin is None or i == pin) and st.work.fits(i, ps)
            ]
            if not cands:
                placed = len(st.work.slots.get(ps.name, ()))
                if pin is not None:
                    st.fail = Fail(
                        ps.name,
                        f"pod set {ps.name}: pod {placed} of {ps.count} must join pod 0 on "
                        f"{self.snap.nodes[pin].name} (required pod affinity on the hostname), which has no "
                        f"room for it",
                        ps.count - placed,
                    )
                else:
                    where = "node" if hn.key == _ROOT else f"node in {_hn_words(self.snap, hn.key)}"
                    st.fail = no_room(ps, placed, where)
                break
            best = cands[0] if len(cands) == 1 else self._best_node(st, sj, ps, cands, allocated)
            self._take(st, sj, ps, best)
            took += 1
            if sj.topology is not None:
                # getNewAllocatedHyperNode
                allocated = self.tree.lca(self.tree.lowest(best), allocated)
            if self._ready(st, sj):
                break
        # A statement without operations is no solution (allocateForSubJob, allocateForJob).
        if not took or not self._ready(st, sj):
            return False
        if sj.topology is not None and not sj.topology.hard:
            st.allocated[sj.uid] = allocated
        return True

    def _take(self, st: _State, sj: _SubJob, ps: PodSet, i: int) -> None:
        st.work.take(ps, i)
        for k in self.tree.member_of[i]:
            st.used[k] += ps.gpus_per_pod
        st.placed.setdefault(sj.uid, []).append(i)
        if ps.name in self.job.same_node:
            st.pinned.setdefault(ps.name, i)

    def _best_node(
        self, st: _State, sj: _SubJob, ps: PodSet, cands: Sequence[int], allocated: DomainKey | None
    ) -> int:
        """``prioritizeNodes``: binpack plus network-topology-aware, the highest total, the
        lowest index on a tie (Volcano: at random)."""
        g = ps.gpus_per_pod
        work = st.work
        totals = [
            MAX_SCORE * self._binpack(self.alloc[i] - work.free(i).bit_count(), self.alloc[i], g)
            for i in cands
        ]
        if sj.topology is None:
            nta = self._normal_pod(st, g, cands)
        else:
            nta = self._network_aware(st, sj, cands, allocated)
        best = max(range(len(cands)), key=lambda j: (totals[j] + nta[j], -j))
        return cands[best]

    def _normal_pod(self, st: _State, g: int, cands: Iterable[int]) -> list[float]:
        """``batchNodeOrderFnForNormalPods``: per tier from the lowest to the root's, the pod's
        bin-pack on the node's HyperNode of that tier (a full score where it has none), weighted
        ``FADING^(tier - 1)``; the weighted mean, times 100."""
        tree = self.tree
        tiers = range(tree.tiers[0], tree.tiers[-1] + 1)
        weights = [FADING ** (t - 1) for t in tiers]
        total = sum(weights)
        out = []
        for i in cands:
            score = 0.0
            for t, w in zip(tiers, weights, strict=True):
                k = tree.at[i].get(t)
                score += w * (1.0 if k is None else self._binpack(st.used[k], self.hn_alloc[k], g))
            out.append(MAX_SCORE * score / total)
        return out

    def _network_aware(
        self, st: _State, sj: _SubJob, cands: Sequence[int], allocated: DomainKey | None
    ) -> list[float]:
        """``batchNodeOrderFnForNetworkAwarePods``: nothing for the first pod; else how low the
        common ancestor of the node's lowest-tier HyperNode and the sub-job's HyperNode is, ties at
        the top broken by the share of the sub-job's tasks in the node's HyperNode; times 100."""
        if allocated is None:
            return [0.0] * len(cands)
        tree = self.tree
        low, high = tree.tiers[0], tree.tiers[-1]
        scores = []
        for i in cands:
            mine = tree.lowest(i)
            if mine is None:
                scores.append(0.0)
            elif mine == allocated:
                scores.append(1.0)
            else:
                lca = tree.lca(mine, allocated)
                t = tree.hns[lca].tier if lca is not None else -1
                scores.append(1.0 if low == high else (high - t) / (high - low) if low <= t <= high else 0.0)
        top = max(scores)
        tied = [j for j, s in enumerate(scores) if s == top]
        if len(tied) > 1:
            for j in tied:
                scores[j] += self._task_share(st, sj, tree.lowest(cands[j]))
        return [MAX_SCORE * s for s in scores]


def _order(hn: _HyperNode) -> tuple[int, tuple[str, ...]]:
    return hn.key[0], tuple(v or "" for v in hn.key[1])


def allocate(snapshot: ClusterSnapshot, gang: GangRequest, job: VolcanoJob) -> Placement:
    """Volcano's allocate action for ``gang`` submitted as ``job`` (see the module docstring)."""

    def core(snap: ClusterSnapshot, g: GangRequest, work: Work) -> Fail | None:
        return _Allocate(snap, g, job, work, _tree(snap)).run()

    return run_policy(snapshot, gang, core, "volcano")


def volcano(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Volcano v1.14.1's allocate action for the gang as the Volcano Job :func:`volcano_job`
    makes of it, with the gang, predicates, binpack and network-topology-aware plugins (see the
    module docstring): a job with a hard ``networkTopology`` or a ``subGroupPolicy`` takes the
    HyperNode search, tightest tier first, the fullest HyperNode of the first tier that holds it;
    any other job is placed pod by pod on all nodes, each pod on the node with the best GPU
    bin-pack plus the network-topology-aware score. GPUs: as the node hands them out."""

    def core(snap: ClusterSnapshot, g: GangRequest, work: Work) -> Fail | None:
        tree = _tree(snap)
        return _Allocate(snap, g, _job_of(snap, g, tree.level_tier), work, tree).run()

    return run_policy(snapshot, gang, core, "volcano")


__all__ = ["ROOT_NAME", "SubGroupPolicy", "Topology", "VolcanoJob", "allocate", "volcano", "volcano_job"]
