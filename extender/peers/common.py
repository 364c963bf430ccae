"""The machinery every peer baseline shares: a gang's working copy of the free GPUs, the
node's own choice of GPUs, kube-scheduler's filters and NodeResourcesFit scoring, and the
way a core's answer becomes a :class:`~extender.placement.slice.Slice` or an
:class:`~extender.placement.slice.Unplaceable` (see :mod:`extender.peers`)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from extender.placement import choice, feasibility, numa_fit
from extender.placement.feasibility import Resources
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import gang_micros
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot

Policy = Callable[[ClusterSnapshot, GangRequest], Placement]


# -- shared machinery -------------------------------------------------------------------


@dataclass
class Fail:
    pod_set: str
    reason: str
    short_by: int
    closest: str | None = None


@dataclass
class Work:
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

    def copy(self) -> Work:
        """A trial copy for a dry run: cheap, since only this gang's changes are copied."""
        return Work(
            self.snap,
            self.base,
            dict(self.taken),
            {k: list(v) for k, v in self.slots.items()},
            dict(self.used),
            {k: list(v) for k, v in self.booked.items()},
            list(self.refused),
        )

    def adopt(self, other: Work) -> None:
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


def empty_free(snap: ClusterSnapshot) -> list[int]:
    out = []
    for node in snap.nodes:
        shape = node.shape
        out.append(shape.full_mask & ~shape.mask_of(g for g in node.unhealthy if g in shape.indices))
    return out


Core = Callable[[ClusterSnapshot, GangRequest, Work], Fail | None]


def run_policy(snap: ClusterSnapshot, gang: GangRequest, core: Core, policy: str) -> Placement:
    work = Work(snap, snap.free_masks())
    fail = core(snap, gang, work) or _refused(work)
    if fail is None:
        return _finish(snap, gang, work, policy)
    # Nothing in use: neither GPUs nor, where kubelets align pods, the CPUs they count.
    bare = snap.emptied() if snap.aligning() else snap
    trial = Work(bare, empty_free(bare))
    empty = core(bare, gang, trial) or _refused(trial)
    return Unplaceable(
        gang=gang.name,
        reason=f"{policy}: {fail.reason}",
        pod_set=fail.pod_set,
        closest=fail.closest,
        short_by=fail.short_by,
        feasible_when_empty=empty is None,
    )


def _refused(work: Work) -> Fail | None:
    """The first pod a kubelet would refuse at admission: the gang would not run."""
    if not work.refused:
        return None
    pod_set, why = work.refused[0]
    count = sum(1 for name, _ in work.refused if name == pod_set)
    return Fail(
        pod_set,
        f"pod set {pod_set}: the kubelet would refuse {count} of its pods at admission "
        f"(TopologyAffinityError): {why}",
        count,
    )


def _finish(snap: ClusterSnapshot, gang: GangRequest, work: Work, policy: str) -> Slice:
    slots = [s for ps in gang.pod_sets for s in work.slots.get(ps.name, [])]
    micros = gang_micros(snap, gang, slots)
    return Slice(
        gang=gang.name,
        slots=tuple(slots),
        pod_set_micros=micros,
        score=round(sum(micros.values()), 3),
        domains={ps.name: where_placed(snap, work.slots.get(ps.name, [])) for ps in gang.pod_sets},
        notes=(f"placed by the {policy} baseline",),
    )


def where_placed(snap: ClusterSnapshot, slots: Sequence[PodSlot]) -> str:
    nodes = sorted({s.node for s in slots})
    if len(nodes) <= 1:
        return f"node {nodes[0]}" if nodes else "nowhere"
    h = snap.hierarchy
    paths = [snap.path_of(n) for n in nodes]
    level = h.common_level(paths)
    if level < 0:
        return "cluster"
    return h.describe((level, tuple(paths[0][: level + 1])))


def no_room(ps: PodSet, placed: int, what: str) -> Fail:
    return Fail(
        ps.name,
        f"pod set {ps.name}: pod {placed} of {ps.count} found no {what} with {ps.gpus_per_pod} free GPUs",
        ps.count - placed,
    )


# -- shared scoring ----------------------------------------------------------------------


def fit_score(work: Work, i: int, gpus: int, most: bool) -> int:
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


def place_by_score(work: Work, ps: PodSet, candidates: Iterable[int], most: bool) -> Fail | None:
    """Per pod: filter the candidates with room, score each, take the best (lowest index on a
    tie). A heap with lazy re-scoring gives exactly the full scan's answer: only nodes this
    pod set took from change score, and their entries are refreshed when they surface."""
    g = ps.gpus_per_pod
    heap = [(-fit_score(work, i, g, most), i) for i in candidates if work.fits(i, ps) and work.alloc(i)]
    heapq.heapify(heap)
    for k in range(ps.count):
        while heap:
            neg, i = heap[0]
            if not work.fits(i, ps):
                heapq.heappop(heap)  # free GPUs and room only shrink while a gang is placed
                continue
            now = -fit_score(work, i, g, most)
            if now != neg:
                heapq.heapreplace(heap, (now, i))
                continue
            break
        if not heap:
            return no_room(ps, k, "node")
        work.take(ps, heap[0][1])
    return None


def admitted(snap: ClusterSnapshot, ps: PodSet, nodes: Iterable[int]) -> Iterable[int]:
    """The nodes among ``nodes`` that pass kube-scheduler's NodeUnschedulable,
    TaintToleration and NodeAffinity filters for the pod (nodeSelector, required node
    affinity, tolerations), which Kueue TAS applies when it counts a node's capacity for a
    pod set and Volcano's predicates plugin applies per task."""
    admitted = snap.admitted(ps.node_needs)
    return nodes if admitted is None else [i for i in nodes if i in admitted]
