"""Volcano's allocate action with the network-topology-aware and binpack plugins."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from extender.peers.common import Fail, Work, admitted, place_by_score, run_policy
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import ANYWHERE, resolve_need
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot

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


def _hn_binpack(work: Work, hn: _HyperNode, gpus: int) -> float:
    """``HyperNodeOrderFn`` bin-pack over GPUs: (used + request) / allocatable of the
    HyperNode, 0 when the request overflows it."""
    alloc = sum(work.alloc(i) for i in hn.nodes)
    used = alloc - sum(work.free(i).bit_count() for i in hn.nodes)
    if alloc <= 0 or used + gpus > alloc:
        return 0.0
    return 100.0 * (used + gpus) / alloc


def _gradient_search(
    work: Work,
    tiers: Iterable[int],
    within: Sequence[int],
    need_gpus: int,
    dry_run: Callable[[Work, _HyperNode], bool],
) -> tuple[Work, _HyperNode] | None:
    """``HyperNodeGradientForJobFn`` + allocate: tiers ascending; in each, every HyperNode whose
    free GPUs cover the request is tried on a copy; the first tier with any success wins, and
    in it the HyperNode with the best bin-pack score (first by name on a tie)."""
    for tier in tiers:
        best: tuple[float, Work, _HyperNode] | None = None
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


def _volcano_core(snap: ClusterSnapshot, gang: GangRequest, work: Work) -> Fail | None:
    h = snap.hierarchy
    ps_tier = {ps.name: _tier_of_scope(snap, resolve_need(ps, h).scope) for ps in gang.pod_sets}
    job_tier = max(ps_tier.values())
    first_tier = 0 if job_tier == 0 else 1
    failed: list[Fail] = []

    def sub_job(ps: PodSet) -> Callable[[Work, _HyperNode], bool]:
        def dry_run(trial: Work, hn: _HyperNode) -> bool:
            got = place_by_score(trial, ps, admitted(snap, ps, hn.nodes), most=True)
            if got is not None:
                failed.append(got)
            return got is None

        return dry_run

    def place_job(trial: Work, hn: _HyperNode) -> bool:
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
            return Fail(
                last.pod_set, f"no HyperNode up to {where} holds the whole job; {last.reason}", last.short_by
            )
        first = gang.pod_sets[0].name
        return Fail(first, f"no HyperNode up to {where} has {gang.gpus} free GPUs", gang.pods)
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
    return run_policy(snapshot, gang, _volcano_core, "volcano")
