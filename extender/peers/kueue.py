"""Kueue Topology-Aware Scheduling at admission."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extender.peers.common import Fail, Work, admitted, run_policy
from extender.placement import feasibility
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import ANYWHERE, node_scope, resolve_need
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot

# -- Kueue TAS --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Domain:
    """A domain in Kueue's tree with its capacity in pods (``podCount``)."""

    count: int
    values: tuple[str, ...]
    nodes: tuple[int, ...]


def _pods_fit(work: Work, i: int, ps: PodSet) -> int:
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
    work: Work,
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


def _kueue_pod_set(snap: ClusterSnapshot, work: Work, ps: PodSet) -> Fail | None:
    h = snap.hierarchy
    need = resolve_need(ps, h)
    counts = {i: c for i in admitted(snap, ps, range(len(snap.nodes))) if (c := _pods_fit(work, i, ps)) > 0}
    total = sum(counts.values())
    cluster_short = Fail(
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
    return Fail(
        ps.name,
        f"pod set {ps.name}: no {level_name} has room for {ps.count} pods of {ps.gpus_per_pod} GPUs "
        f"(counting GPUs only)",
        ps.count - have,
        best.values[-1] if best is not None else None,
    )


def _kueue_core(snap: ClusterSnapshot, gang: GangRequest, work: Work) -> Fail | None:
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
    return run_policy(snapshot, gang, _kueue_core, "kueue-tas")
