"""What peer schedulers would decide for the same gang on the same snapshot, side by side.

Each policy is re-implemented from the peers' documented behaviour (shared/reference:
peers.md, kueue-admission-checks.md section 7, kube-scheduler-extender-and-volcano.md
section 2c), not from their code. All of them:

- are all-or-nothing, like the gangslice solver: pods are placed one by one on a working
  copy of the free GPUs, and if any pod finds no room the gang is :class:`Unplaceable`;
- choose nodes only. The exact GPUs are what the node hands out once the node is fixed: on a
  device-plugin node, the stock NVIDIA device plugin's ``GetPreferredAllocation``
  (go-gpuallocator's best-effort policy, predicted by :mod:`extender.placement.choice`),
  which no scheduler can steer; where the plugin has no usable answer, and on DRA nodes
  (the peers write no claim that names devices), the kubelet's or driver's *first free*
  (the lowest free GPU indices);
- never book a GPU that is taken, unhealthy or reserved, nor one GPU twice (the capacity
  rules). They may break gangslice's topology rules (a TP group across a socket, a pod set
  across leaves): :func:`extender.placement.scoring.violations` reports that, and
  :func:`~extender.placement.scoring.gang_micros` prices it with the same yardstick;
- know nothing of multi-node NVLink (IMEX) channels, nor of the kubelet's Topology Manager:
  they choose a node its kubelet then refuses at admission (``TopologyAffinityError``, see
  :mod:`extender.placement.numa_fit`), and such a gang does not run. The GPUs a pod gets
  there are the first free ones of the NUMA nodes the kubelet aligns it to;
- keep kube-scheduler's NodeUnschedulable, TaintToleration, NodeAffinity and NodeResourcesFit
  filters for every pod (:mod:`extender.placement.feasibility`), as kube-scheduler itself,
  Kueue TAS (``fillLeafCounts`` counts the pods whose requests fit each node that passes the
  pod's node selector, affinity and tolerations) and Volcano's predicates plugin do.

Ties that the real schedulers break at random are broken here by snapshot order, so a
comparison is repeatable.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from extender.placement import choice, feasibility, numa_fit, solver
from extender.placement.feasibility import Resources
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import ANYWHERE, gang_micros, node_scope, resolve_need
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot

Policy = Callable[[ClusterSnapshot, GangRequest], Placement]


# -- shared machinery -------------------------------------------------------------------


@dataclass
class _Fail:
    pod_set: str
    reason: str
    short_by: int
    closest: str | None = None


@dataclass
class _Work:
    """The gang's working copy: free GPU masks per node index (``base``, shared, never
    written) less what this gang's pods took so far (``taken``), and the slots made."""

    snap: ClusterSnapshot
    base: Sequence[int]
    taken: dict[int, int] = field(default_factory=dict)
    slots: dict[str, list[PodSlot]] = field(default_factory=dict)
    #: What this gang's pods take of each node's cpu, memory and pod slots so far.
    used: dict[int, Resources] = field(default_factory=dict)
    #: Per node index, the pods booked there in order (pod set, GPU mask), for the kubelet.
    booked: dict[int, list[tuple[PodSet, int]]] = field(default_factory=dict)
    #: Pods the node's kubelet would refuse at admission: (pod set, why).
    refused: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        #: Whether any node limits resources at all (else room is never the limit).
        self.limits = self.snap.limits_resources

    def free(self, i: int) -> int:
        return self.base[i] & ~self.taken.get(i, 0)

    def room(self, i: int, ps: PodSet) -> int:
        """Pods of ``ps`` NodeResourcesFit still lets onto node ``i`` (cpu, memory, pods)."""
        if not self.limits:
            return feasibility.UNLIMITED
        return self.snap.room(i, ps.requests, self.used.get(i))

    def fits(self, i: int, ps: PodSet) -> bool:
        """Whether node ``i`` has the GPUs and the room for one more pod of ``ps``."""
        return self.free(i).bit_count() >= ps.gpus_per_pod and (not self.limits or self.room(i, ps) > 0)

    def alloc(self, i: int) -> int:
        """Allocatable GPUs of node ``i`` as a device plugin reports them (healthy ones)."""
        node = self.snap.nodes[i]
        return node.shape.size - len(node.unhealthy)

    def copy(self) -> _Work:
        """A trial copy for a dry run: cheap, since only this gang's changes are copied."""
        return _Work(
            self.snap,
            self.base,
            dict(self.taken),
            {k: list(v) for k, v in self.slots.items()},
            dict(self.used),
            {k: list(v) for k, v in self.booked.items()},
            list(self.refused),
        )

    def adopt(self, other: _Work) -> None:
        self.taken, self.slots, self.used = other.taken, other.slots, other.used
        self.booked, self.refused = other.booked, other.refused

    def take(self, ps: PodSet, i: int) -> None:
        """Give the next pod of ``ps`` the GPUs node ``i`` hands out (the caller checked room):
        the kubelet offers the GPUs of the NUMA set it aligns the pod to (all free ones when it
        aligns nothing), then the device plugin picks among them (else the lowest free ids)."""
        free = self.free(i)
        node = self.snap.nodes[i]
        offered: int | None = free
        if node.kubelet is not None and ps.gpus_per_pod:
            offered = numa_fit.offer(node, self.booked.get(i, ()), ps, free)
            if offered is None:
                rule = numa_fit.rule_for(node, ps)
                assert rule is not None
                why = f"topologyManagerPolicy {rule.policy} on {node.name}: {rule.no_room()}"
                self.refused.append((ps.name, why))
        pool = free if offered is None else offered
        mask = choice.handed(node, pool, ps.gpus_per_pod)
        if mask is None:
            mask = first_free(pool, ps.gpus_per_pod)
        assert mask is not None, f"node {i}: no room for {ps.gpus_per_pod} GPUs"
        self.taken[i] = self.taken.get(i, 0) | mask
        if self.limits:
            self.used[i] = self.used.get(i, feasibility.NOTHING).plus(feasibility.usage(ps.requests))
        self.booked.setdefault(i, []).append((ps, mask))
        gpus, numa, nic = fit_for(node.shape).slot_of(mask)
        placed = self.slots.setdefault(ps.name, [])
        placed.append(PodSlot(ps.name, len(placed), node.name, gpus, numa, nic))


def first_free(free: int, gpus: int) -> int | None:
    """The ``gpus`` lowest set positions of ``free`` as a mask (None if too few)."""
    if free.bit_count() < gpus:
        return None
    mask = 0
    for _ in range(gpus):
        low = free & -free
        mask |= low
        free &= ~low
    return mask


def _empty_free(snap: ClusterSnapshot) -> list[int]:
    out = []
    for node in snap.nodes:
        shape = node.shape
        out.append(shape.full_mask & ~shape.mask_of(g for g in node.unhealthy if g in shape.indices))
    return out


_Core = Callable[[ClusterSnapshot, GangRequest, _Work], _Fail | None]


def _run(snap: ClusterSnapshot, gang: GangRequest, core: _Core, policy: str) -> Placement:
    work = _Work(snap, snap.free_masks())
    fail = core(snap, gang, work) or _refused(work)
    if fail is None:
        return _finish(snap, gang, work, policy)
    # Nothing in use: neither GPUs nor, where kubelets align pods, the CPUs they count.
    bare = snap.emptied() if snap.aligning() else snap
    trial = _Work(bare, _empty_free(bare))
    empty = core(bare, gang, trial) or _refused(trial)
    return Unplaceable(
        gang=gang.name,
        reason=f"{policy}: {fail.reason}",
        pod_set=fail.pod_set,
        closest=fail.closest,
        short_by=fail.short_by,
        feasible_when_empty=empty is None,
    )


def _refused(work: _Work) -> _Fail | None:
    """The first pod a kubelet would refuse at admission: the gang would not run."""
    if not work.refused:
        return None
    pod_set, why = work.refused[0]
    count = sum(1 for name, _ in work.refused if name == pod_set)
    return _Fail(
        pod_set,
        f"pod set {pod_set}: the kubelet would refuse {count} of its pods at admission "
        f"(TopologyAffinityError): {why}",
        count,
    )


def _finish(snap: ClusterSnapshot, gang: GangRequest, work: _Work, policy: str) -> Slice:
    slots = [s for ps in gang.pod_sets for s in work.slots.get(ps.name, [])]
    micros = gang_micros(snap, gang, slots)
    return Slice(
        gang=gang.name,
        slots=tuple(slots),
        pod_set_micros=micros,
        score=round(sum(micros.values()), 3),
        domains={ps.name: _where(snap, work.slots.get(ps.name, [])) for ps in gang.pod_sets},
        notes=(f"placed by the {policy} baseline",),
    )


def _where(snap: ClusterSnapshot, slots: Sequence[PodSlot]) -> str:
    nodes = sorted({s.node for s in slots})
    if len(nodes) <= 1:
        return f"node {nodes[0]}" if nodes else "nowhere"
    h = snap.hierarchy
    paths = [snap.path_of(n) for n in nodes]
    level = h.common_level(paths)
    if level < 0:
        return "cluster"
    return h.describe((level, tuple(paths[0][: level + 1])))


def _no_room(ps: PodSet, placed: int, what: str) -> _Fail:
    return _Fail(
        ps.name,
        f"pod set {ps.name}: pod {placed} of {ps.count} found no {what} with {ps.gpus_per_pod} free GPUs",
        ps.count - placed,
    )


# -- NodeResourcesFit: spread and binpack -----------------------------------------------


def _fit_score(work: _Work, i: int, gpus: int, most: bool) -> int:
    """NodeResourcesFit over the one resource we know, GPUs, with the pod's request added:
    LeastAllocated ``(alloc - used - req) * 100 // alloc``, MostAllocated ``(used + req) * 100 //
    alloc`` (integer scores, as the scheduler computes them)."""
    alloc = work.alloc(i)
    if alloc <= 0:
        return 0
    used = alloc - work.free(i).bit_count()
    if most:
        return (used + gpus) * 100 // alloc
    return (alloc - used - gpus) * 100 // alloc


def _place_by_score(work: _Work, ps: PodSet, candidates: Iterable[int], most: bool) -> _Fail | None:
    """Per pod: filter the candidates with room, score each, take the best (lowest index on a
    tie). A heap with lazy re-scoring gives exactly the full scan's answer: only nodes this
    pod set took from change score, and their entries are refreshed when they surface."""
    g = ps.gpus_per_pod
    heap = [(-_fit_score(work, i, g, most), i) for i in candidates if work.fits(i, ps) and work.alloc(i)]
    heapq.heapify(heap)
    for k in range(ps.count):
        while heap:
            neg, i = heap[0]
            if not work.fits(i, ps):
                heapq.heappop(heap)  # free GPUs and room only shrink while a gang is placed
                continue
            now = -_fit_score(work, i, g, most)
            if now != neg:
                heapq.heapreplace(heap, (now, i))
                continue
            break
        if not heap:
            return _no_room(ps, k, "node")
        work.take(ps, heap[0][1])
    return None


def _admitted(snap: ClusterSnapshot, ps: PodSet, nodes: Iterable[int]) -> Iterable[int]:
    """The nodes among ``nodes`` that pass kube-scheduler's NodeUnschedulable,
    TaintToleration and NodeAffinity filters for the pod (nodeSelector, required node
    affinity, tolerations), which Kueue TAS applies when it counts a node's capacity for a
    pod set and Volcano's predicates plugin applies per task."""
    admitted = snap.admitted(ps.node_needs)
    return nodes if admitted is None else [i for i in nodes if i in admitted]


def _per_pod(most: bool) -> _Core:
    def core(snap: ClusterSnapshot, gang: GangRequest, work: _Work) -> _Fail | None:
        for ps in gang.pod_sets:
            fail = _place_by_score(work, ps, _admitted(snap, ps, range(len(snap.nodes))), most)
            if fail is not None:
                return fail
        return None

    return core


def spread(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """The default kube-scheduler, pod by pod (pkg/scheduler: Filter ``NodeResourcesFit`` ->
    Score ``NodeResourcesFit`` with the ``LeastAllocated`` strategy + ``BalancedAllocation`` ->
    selectHost).

    Scored over GPUs as if ``nvidia.com/gpu`` were a scoring resource (the stock profile scores
    cpu and memory only; we know only GPUs, which stand in for requests that scale with them).
    With a single resource ``BalancedAllocation`` is the same for every node, so it drops out.
    All feasible nodes are scored (``percentageOfNodesToScore`` 100); the default soft
    PodTopologySpread is not modelled (it would only spread more). GPUs: as the node hands them out.
    """
    return _run(snapshot, gang, _per_pod(most=False), "spread")


def binpack(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """kube-scheduler with ``NodeResourcesFit`` scoring strategy ``MostAllocated`` (the usual
    bin-packing profile for GPU clusters); otherwise exactly :func:`spread`."""
    return _run(snapshot, gang, _per_pod(most=True), "binpack")


# -- Kueue TAS --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Domain:
    """A domain in Kueue's tree with its capacity in pods (``podCount``)."""

    count: int
    values: tuple[str, ...]
    nodes: tuple[int, ...]


def _pods_fit(work: _Work, i: int, ps: PodSet) -> int:
    """Kueue's leaf capacity (``fillLeafCounts``): copies of the pod's request that fit the
    node's free resources, counted. No device model, so no NVLink or PCIe coherence."""
    room = work.room(i, ps) if work.limits else feasibility.UNLIMITED
    if ps.gpus_per_pod == 0:
        return min(ps.count, room)
    fit = work.free(i).bit_count() // ps.gpus_per_pod
    return fit if fit < room else room


def _domains_at(snap: ClusterSnapshot, level: int, counts: dict[int, int]) -> list[_Domain]:
    """Every domain at ``level`` (a hierarchy level index, or ``node_scope`` for single nodes)."""
    if level >= node_scope(snap.hierarchy):
        # A hostname-level domain's values are its whole path, hostname last, so domains
        # sort by topology path, then name (Kueue's "level values asc").
        return [_Domain(c, _node_values(snap, i), (i,)) for i, c in counts.items()]
    out = []
    for (lv, values), members in snap.domains().items():
        if lv == level:
            total = sum(counts.get(i, 0) for i in members)
            out.append(_Domain(total, tuple(v or "" for v in values), tuple(members)))
    return out


def _node_values(snap: ClusterSnapshot, i: int) -> tuple[str, ...]:
    return (*(v or "" for v in snap.path(i)), snap.nodes[i].name)


def _children(
    snap: ClusterSnapshot, nodes: Sequence[int], level: int, counts: dict[int, int]
) -> list[_Domain]:
    """The child domains of a domain, one level down (nodes below the last hierarchy level).
    A node without the level's label is a child of its own."""
    if level >= node_scope(snap.hierarchy):
        return [_Domain(counts.get(i, 0), (snap.nodes[i].name,), (i,)) for i in nodes]
    groups: dict[str, list[int]] = {}
    for i in nodes:
        label = snap.path(i)[level]
        groups.setdefault(label if label is not None else f"\0{snap.nodes[i].name}", []).append(i)
    return [_Domain(sum(counts.get(i, 0) for i in v), (k,), tuple(v)) for k, v in groups.items()]


def _take_minimum(children: list[_Domain], need: int, least_free: bool) -> list[tuple[_Domain, int]]:
    """``updateCountsToMinimumGeneric``: children in sorted order until the pods fit (BestFit:
    most pods first, so the fewest children; LeastFreeCapacity: fewest pods first, so the
    fullest), the last one swapped for the tightest child that still holds the rest."""
    if least_free:
        order = sorted(children, key=lambda d: (d.count, d.values))
    else:
        order = sorted(children, key=lambda d: (-d.count, d.values))
    out: list[tuple[_Domain, int]] = []
    remaining = need
    for k, child in enumerate(order):
        if child.count <= 0:
            continue
        if child.count >= remaining:
            last = min((d for d in order[k:] if d.count >= remaining), key=lambda d: (d.count, d.values))
            out.append((last, remaining))
            return out
        out.append((child, child.count))
        remaining -= child.count
    raise AssertionError("children hold fewer pods than their parent counted")


def _descend(
    snap: ClusterSnapshot,
    work: _Work,
    ps: PodSet,
    nodes: Sequence[int],
    level: int,
    need: int,
    counts: dict[int, int],
    least_free: bool,
) -> None:
    """Walk down from a chosen domain to nodes, then give each node its pods (the GPUs it hands out)."""
    if level > node_scope(snap.hierarchy):
        for _ in range(need):
            work.take(ps, nodes[0])
        return
    for child, n in _take_minimum(_children(snap, nodes, level, counts), need, least_free):
        _descend(snap, work, ps, child.nodes, level + 1, n, counts, least_free)


def _kueue_pod_set(snap: ClusterSnapshot, work: _Work, ps: PodSet) -> _Fail | None:
    h = snap.hierarchy
    need = resolve_need(ps, h)
    counts = {i: c for i in _admitted(snap, ps, range(len(snap.nodes))) if (c := _pods_fit(work, i, ps)) > 0}
    total = sum(counts.values())
    cluster_short = _Fail(
        ps.name, f"pod set {ps.name}: the cluster has room for {total} of {ps.count} pods", ps.count - total
    )
    if need.preferred_scope is None and need.scope == ANYWHERE:
        # Unconstrained (implied TAS): ``levelKeyWithImpliedFallback`` searches the lowest
        # level (hostname), and ``findLevelWithFitDomains`` with LeastFreeCapacity sorts every
        # node at once (``sortedDomains``: podCount asc, then level values asc), takes the
        # first that holds every pod, else takes nodes in that order until all are placed
        # (no recursion upwards for unconstrained, no best-fit swap of the last one).
        if total < ps.count:
            return cluster_short
        order = sorted(_domains_at(snap, node_scope(h), counts), key=lambda d: (d.count, d.values))
        first = next((d for d in order if d.count >= ps.count), None)
        remaining = ps.count
        for d in [first] if first is not None else order:
            n = min(d.count, remaining)
            for _ in range(n):
                work.take(ps, d.nodes[0])
            remaining -= n
            if remaining == 0:
                break
        return None
    if need.preferred_scope is not None:
        # podset-preferred-topology: that level, then one level up at a time.
        levels = list(range(need.preferred_scope, max(need.scope, 0) - 1, -1))
    else:
        levels = [need.scope]  # podset-required-topology: that level only
    best: _Domain | None = None
    for level in levels:
        domains = _domains_at(snap, level, counts)
        fitting = [d for d in domains if d.count >= ps.count]
        if fitting:
            chosen = min(fitting, key=lambda d: (d.count, d.values))  # BestFit: least left over
            _descend(snap, work, ps, chosen.nodes, level + 1, ps.count, counts, least_free=False)
            return None
        best = max(domains, key=lambda d: d.count, default=None)
    if need.scope == ANYWHERE:
        # Preferred only, and no single top-level domain fits: admitted as distributed.
        if total < ps.count:
            return cluster_short
        _descend(snap, work, ps, list(counts), 0, ps.count, counts, least_free=False)
        return None
    level_name = h.levels[need.scope].name if need.scope < len(h.levels) else "node"
    have = best.count if best is not None else 0
    return _Fail(
        ps.name,
        f"pod set {ps.name}: no {level_name} has room for {ps.count} pods of {ps.gpus_per_pod} GPUs "
        f"(counting GPUs only)",
        ps.count - have,
        best.values[-1] if best is not None else None,
    )


def _kueue_core(snap: ClusterSnapshot, gang: GangRequest, work: _Work) -> _Fail | None:
    for ps in gang.pod_sets:
        fail = _kueue_pod_set(snap, work, ps)
        if fail is not None:
            return fail
    return None


def kueue_tas(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Kueue Topology-Aware Scheduling at admission (pkg/cache/scheduler/tas_flavor_snapshot.go,
    ``findTopologyAssignment``), profile ``TASProfileMixed`` (the default since v0.15).

    The hierarchy's levels are the Topology's ``levels[].nodeLabel`` with hostname last. Per
    pod set, in order, on what earlier pod sets left: node capacity is how many copies of the
    pod's GPU request fit (``fillLeafCounts``; GPUs are a count, no NVLink/PCIe model), summed
    up the tree. ``requiredLevel`` -> ``podset-required-topology``: the BestFit domain at that
    level (fewest pods that still fit) or not admitted. ``preferredLevel`` ->
    ``podset-preferred-topology``: that level, then one level up at a time (to the required
    level, if any); at the top, spread over several domains. Neither -> unconstrained (implied
    TAS): LeastFreeCapacity over the lowest level, every node sorted at once by pods that fit
    (fullest first), then topology path; the first that holds every pod, else nodes in that
    order. From the chosen domain down
    (``updateCountsToMinimumGeneric``): BestFit takes the fewest children, largest first, the
    last one the tightest that holds the rest. In-node levels (``nvlink``, ``numa``) have no Kueue
    equivalent and are ignored; so is ``colocateWith``. GPUs: as the node hands them out.
    """
    return _run(snapshot, gang, _kueue_core, "kueue-tas")


# -- Volcano network-topology-aware -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _HyperNode:
    tier: int
    name: str
    nodes: tuple[int, ...]


def _tier_of_scope(snap: ClusterSnapshot, scope: int) -> int:
    """HyperNode tier for a hierarchy scope: label discovery makes the finest level tier 1
    and counts up; the virtual root (``<cluster-top-hypernode>``) is one above the top. A
    required ``node`` has no tier in Volcano; we give it 0 (one node, as pod affinity would)."""
    n = len(snap.hierarchy.levels)
    if scope == ANYWHERE:
        return n + 1
    if scope >= n:
        return 0
    return n - scope


def _tier_words(snap: ClusterSnapshot, tier: int) -> str:
    levels = snap.hierarchy.levels
    if tier == 0:
        return "one node"
    if tier > len(levels):
        return f"tier {tier} (the cluster)"
    return f"tier {tier} ({levels[len(levels) - tier].name})"


def _hypernodes(snap: ClusterSnapshot, tier: int, within: Sequence[int]) -> list[_HyperNode]:
    """The HyperNodes of ``tier`` whose nodes lie in ``within`` (the search root)."""
    n = len(snap.hierarchy.levels)
    inside = set(within)
    if tier == 0:
        return [_HyperNode(0, snap.nodes[i].name, (i,)) for i in within]
    if tier > n:
        return [_HyperNode(tier, "<cluster-top-hypernode>", tuple(within))]
    level = n - tier
    out = []
    for (lv, values), members in snap.domains().items():
        if lv == level and members[0] in inside:
            out.append(_HyperNode(tier, values[-1] or "", tuple(i for i in members if i in inside)))
    out.sort(key=lambda hn: hn.name)
    return out


def _hn_binpack(work: _Work, hn: _HyperNode, gpus: int) -> float:
    """``HyperNodeOrderFn`` bin-pack over GPUs: (used + request) / allocatable of the
    HyperNode, 0 when the request overflows it."""
    alloc = sum(work.alloc(i) for i in hn.nodes)
    used = alloc - sum(work.free(i).bit_count() for i in hn.nodes)
    if alloc <= 0 or used + gpus > alloc:
        return 0.0
    return 100.0 * (used + gpus) / alloc


def _gradient_search(
    work: _Work,
    tiers: Iterable[int],
    within: Sequence[int],
    need_gpus: int,
    dry_run: Callable[[_Work, _HyperNode], bool],
) -> tuple[_Work, _HyperNode] | None:
    """``HyperNodeGradientForJobFn`` + allocate: tiers ascending; in each, every HyperNode whose
    free GPUs cover the request is tried on a copy; the first tier with any success wins, and
    in it the HyperNode with the best bin-pack score (first by name on a tie)."""
    for tier in tiers:
        best: tuple[float, _Work, _HyperNode] | None = None
        for hn in _hypernodes(work.snap, tier, within):
            if sum(work.free(i).bit_count() for i in hn.nodes) < need_gpus:
                continue
            score = _hn_binpack(work, hn, need_gpus)
            trial = work.copy()
            if dry_run(trial, hn) and (best is None or score > best[0]):
                best = (score, trial, hn)
        if best is not None:
            return best[1], best[2]
    return None


def _volcano_core(snap: ClusterSnapshot, gang: GangRequest, work: _Work) -> _Fail | None:
    h = snap.hierarchy
    ps_tier = {ps.name: _tier_of_scope(snap, resolve_need(ps, h).scope) for ps in gang.pod_sets}
    job_tier = max(ps_tier.values())
    first_tier = 0 if job_tier == 0 else 1
    failed: list[_Fail] = []

    def sub_job(ps: PodSet) -> Callable[[_Work, _HyperNode], bool]:
        def dry_run(trial: _Work, hn: _HyperNode) -> bool:
            got = _place_by_score(trial, ps, _admitted(snap, ps, hn.nodes), most=True)
            if got is not None:
                failed.append(got)
            return got is None

        return dry_run

    def place_job(trial: _Work, hn: _HyperNode) -> bool:
        for ps in gang.pod_sets:
            top = ps_tier[ps.name]
            tiers = range(0 if top == 0 else 1, min(top, hn.tier) + 1)
            found = _gradient_search(trial, tiers, hn.nodes, ps.gpus, sub_job(ps))
            if found is None:
                return False
            trial.adopt(found[0])
        return True

    found = _gradient_search(
        work, range(first_tier, job_tier + 1), range(len(snap.nodes)), gang.gpus, place_job
    )
    if found is None:
        where = _tier_words(snap, job_tier)
        if failed:
            last = failed[-1]
            return _Fail(
                last.pod_set, f"no HyperNode up to {where} holds the whole job; {last.reason}", last.short_by
            )
        first = gang.pod_sets[0].name
        return _Fail(first, f"no HyperNode up to {where} has {gang.gpus} free GPUs", gang.pods)
    work.adopt(found[0])
    return None


def volcano(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Volcano's allocate action with the ``network-topology-aware`` and ``binpack`` plugins
    (pkg/scheduler/actions/allocate/allocate.go ``allocateForJob``,
    pkg/scheduler/plugins/network-topology-aware/network_topology_aware.go).

    HyperNodes come from label discovery: one per label value per level, the finest level tier
    1, plus the virtual root above them all. ``requiredLevel`` -> ``highestTierAllowed`` (hard
    mode); none (or an in-node level) -> the root tier, which is what soft mode is rewritten to.
    The job (the whole gang) tries gradients of rising tier; in each, every HyperNode whose
    free GPUs cover the job is dry-run: each pod set, as a sub-job, searches the same way
    inside it up to its own tier and binpacks its pods on that HyperNode's nodes
    (MostAllocated per pod). The first tier with a solution wins, and in it the HyperNode with
    the best ``HyperNodeOrderFn`` bin-pack score (fullest). GPUs: as the node hands them out.
    """
    return _run(snapshot, gang, _volcano_core, "volcano")


#: Every policy ``gangslice place --policy`` and the benchmarks know, gangslice first.
POLICIES: dict[str, Policy] = {
    "gangslice": solver.place,
    "spread": spread,
    "binpack": binpack,
    "kueue-tas": kueue_tas,
    "volcano": volcano,
}
