"""The objective: predicted per-layer communication time of a slice, and the rules a slice obeys.

Shared by the solver, the baselines, the simulator and the tests, so every policy is judged
by one yardstick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extender import cost
from extender.cost import Comm
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.hierarchy import Hierarchy
from extender.topology.model import IN_NODE_LEVELS, Tier


class LevelError(ValueError):
    pass


#: Scope index meaning "anywhere in the cluster"; ``node_scope(h)`` means "one node".
ANYWHERE = -1


def node_scope(h: Hierarchy) -> int:
    return len(h.levels)


@dataclass(frozen=True, slots=True)
class Need:
    """A pod set's rules resolved against the hierarchy.

    ``scope``: all pods share one domain at this level index (``ANYWHERE``, a level, or
    ``node_scope``). ``tier``: each pod's GPUs at this in-node tier or tighter; None means the
    node type's tightest tier for that many GPUs (the default rule).
    """

    scope: int
    tier: Tier | None
    preferred_scope: int | None
    preferred_tier: Tier | None

    def tier_on(self, shape_tightest: Tier | None) -> Tier | None:
        return self.tier if self.tier is not None else shape_tightest


def resolve_level(name: str, h: Hierarchy) -> tuple[int | None, Tier | None]:
    """A level name as users write it: a hierarchy level (name or label key), ``node``, or an
    in-node level. Returns (scope, tier); exactly one is set, except ``node`` which sets both."""
    if name == "node" or name == "kubernetes.io/hostname":
        return node_scope(h), Tier.NODE
    if name in IN_NODE_LEVELS:
        return None, IN_NODE_LEVELS[name]
    idx = h.index_of(name)
    if idx is None:
        known = [lv.name for lv in h.levels] + ["node", *IN_NODE_LEVELS]
        raise LevelError(f"unknown level {name!r}; known levels: {', '.join(dict.fromkeys(known))}")
    return idx, None


def resolve_need(ps: PodSet, h: Hierarchy) -> Need:
    scope, tier = ANYWHERE, None
    if ps.required_level:
        s, t = resolve_level(ps.required_level, h)
        scope = s if s is not None else ANYWHERE
        tier = t
    pscope = ptier = None
    if ps.preferred_level:
        pscope, ptier = resolve_level(ps.preferred_level, h)
        if pscope is not None and pscope <= scope:
            pscope = None
        if ptier is not None and tier is not None and ptier >= tier:
            ptier = None
    return Need(scope, tier, pscope, ptier)


def pod_tier(
    snap: ClusterSnapshot, node_index: int, ps: PodSet, need: Need, preferred: bool = False
) -> Tier | None:
    fit = fit_for(snap.nodes[node_index].shape)
    if preferred and need.preferred_tier is not None:
        return need.preferred_tier
    return need.tier_on(fit.tightest(ps.gpus_per_pod))


def _span_gbps(snap: ClusterSnapshot, slots: Sequence[PodSlot]) -> tuple[float, bool, bool]:
    """Bandwidth available to traffic among these slots: (GB/s, crosses nodes, over NVLink)."""
    nodes = sorted({s.node for s in slots})
    if len(nodes) == 1:
        node = snap.node(nodes[0])
        mask = node.shape.mask_of(g for s in slots for g in s.gpus)
        gbps = fit_for(node.shape).gbps(mask)
        return gbps, False, gbps >= 300
    h = snap.hierarchy
    level = h.common_level([snap.path_of(n) for n in nodes])
    if level >= 0 and h.levels[level].fabric:
        per_gpu = min(
            max((lk.nvlinks for lk in snap.node(n).graph.links.values()), default=0)
            * snap.node(n).graph.nvlink_gbps
            for n in nodes
        )
        if per_gpu > 0:
            return per_gpu, True, True
    return h.switch_gbps(level), True, False


def _alpha(crosses: bool, nvlink: bool) -> float:
    if nvlink:
        return cost.ALPHA_NVLINK_US
    return cost.ALPHA_NETWORK_US if crosses else cost.ALPHA_PCIE_US


def pod_set_micros(
    snap: ClusterSnapshot, ps: PodSet, slots: Sequence[PodSlot], partner: Sequence[PodSlot] = ()
) -> float:
    """Predicted per-layer communication time of one pod set placed on ``slots``.

    Each pod's own GPUs run tensor parallel (the seed formula). Across pods: ``allreduce``
    makes one ring of every GPU of the set, ``alltoall`` one expert-parallel group,
    ``pipeline`` adds stage-boundary sends, ``kv-transfer`` adds moving the KV cache from the
    ``partner`` pod set (its colocateWith set).
    """
    dims = ps.model
    intra: list[float] = []
    for s in slots:
        node = snap.node(s.node)
        intra.append(fit_for(node.shape).gbps(node.shape.mask_of(s.gpus)))
    worst_intra = min(intra, default=float("inf"))
    intra_cost = max(
        (cost.tp_layer_us(ps.gpus_per_pod, dims, b, _alpha(False, b >= 300)) for b in intra), default=0.0
    )
    total = intra_cost
    if ps.comm == Comm.KV_TRANSFER and partner:
        gbps, crosses, nvl = _span_gbps(snap, [*slots, *partner])
        total += cost.kv_layer_us(dims, gbps, _alpha(crosses, nvl))
    if len(slots) <= 1 or ps.comm in (Comm.NONE, Comm.KV_TRANSFER):
        return total
    gbps, crosses, nvl = _span_gbps(snap, slots)
    ranks = ps.gpus_per_pod * len(slots)
    bottleneck = min(gbps, worst_intra)
    if ps.comm == Comm.ALLREDUCE:
        return cost.tp_layer_us(ranks, dims, bottleneck, _alpha(crosses, nvl))
    if ps.comm == Comm.ALLTOALL:
        return cost.ep_layer_us(ranks, dims, bottleneck, _alpha(crosses, nvl))
    return intra_cost + cost.pipeline_layer_us(len(slots), dims, gbps, _alpha(crosses, nvl))


def gang_micros(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> dict[str, float]:
    by_set: dict[str, list[PodSlot]] = {ps.name: [] for ps in gang.pod_sets}
    for s in slots:
        by_set[s.pod_set].append(s)
    out = {}
    for ps in gang.pod_sets:
        partner = by_set[ps.colocate_with.pod_set] if ps.colocate_with else []
        out[ps.name] = pod_set_micros(snap, ps, by_set[ps.name], partner)
    return out


def violations(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> list[str]:
    """Every hard rule a slice breaks (empty when it is valid). Used to check any policy's
    answer and by the exhaustive solver in the tests."""
    problems: list[str] = []
    h = snap.hierarchy
    used: dict[str, set[int]] = {}
    by_set: dict[str, list[PodSlot]] = {ps.name: [] for ps in gang.pod_sets}
    for s in slots:
        if s.pod_set not in by_set:
            problems.append(f"slot {s.key}: unknown pod set")
            continue
        by_set[s.pod_set].append(s)
        if not snap.has_node(s.node):
            problems.append(f"slot {s.key}: unknown node {s.node}")
            continue
        free = snap.free_gpus(s.node)
        if not set(s.gpus) <= free:
            problems.append(f"slot {s.key}: GPUs {sorted(set(s.gpus) - free)} on {s.node} are not free")
        taken = used.setdefault(s.node, set())
        if taken & set(s.gpus):
            problems.append(f"slot {s.key}: GPUs {sorted(taken & set(s.gpus))} on {s.node} given twice")
        taken.update(s.gpus)
    for ps in gang.pod_sets:
        got = by_set[ps.name]
        need = resolve_need(ps, h)
        if len(got) != ps.count:
            problems.append(f"pod set {ps.name}: {len(got)} slots for {ps.count} pods")
        for s in got:
            if len(s.gpus) != ps.gpus_per_pod or not snap.has_node(s.node):
                problems.append(f"slot {s.key}: {len(s.gpus)} GPUs for a pod of {ps.gpus_per_pod}")
                continue
            i = snap.index(s.node)
            tier = pod_tier(snap, i, ps, need)
            actual = snap.nodes[i].shape.tier_of(snap.nodes[i].shape.mask_of(s.gpus))
            if tier is None or actual > tier:
                problems.append(
                    f"slot {s.key}: GPUs {list(s.gpus)} on {s.node} are {actual.name}, need {tier}"
                )
        nodes = sorted({s.node for s in got if snap.has_node(s.node)})
        if len(nodes) > 1:
            if need.scope == node_scope(h):
                problems.append(f"pod set {ps.name}: spans {len(nodes)} nodes, required one node")
            elif need.scope != ANYWHERE and h.common_level([snap.path_of(n) for n in nodes]) < need.scope:
                problems.append(f"pod set {ps.name}: spans more than one {h.levels[need.scope].name}")
            problems.extend(_mnnvl_violations(snap, gang.name, ps.name, nodes))
    return problems


def fabric_domain(snap: ClusterSnapshot, node_index: int) -> tuple[str | None, ...] | None:
    """The multi-node NVLink clique a node belongs to (its path down to the fabric level)."""
    h = snap.hierarchy
    path = snap.path(node_index)
    for level, lv in enumerate(h.levels):
        if lv.fabric and path[level] is not None:
            return tuple(path[: level + 1])
    return None


def _mnnvl_violations(snap: ClusterSnapshot, gang: str, pod_set: str, nodes: Sequence[str]) -> list[str]:
    cliques = {fabric_domain(snap, snap.index(n)) for n in nodes}
    if cliques == {None}:
        return []
    problems = []
    if len(cliques) > 1:
        problems.append(
            f"pod set {pod_set}: spans several NVLink cliques or mixes clique and non-clique nodes"
        )
    for n in nodes:
        owner = snap.mnnvl_owner(snap.index(n))
        if owner is not None and owner != gang:
            problems.append(f"pod set {pod_set}: node {n}'s NVLink channel is held by gang {owner}")
    return problems
