"""The objective of a slice and the rules a slice obeys.

The objective (:func:`objective`) is lexicographic, lower is better:

1. **clique GPUs taken off the fabric** (:func:`fabric_waste`): GPUs on nodes of a
   multi-node NVLink clique given to pod sets that do not use multi-node NVLink. Cliques
   (GB200 NVL72 racks) are a scarce resource kept for the pod sets that span nodes over
   them; a pod set that does not prefers nodes outside cliques and falls back to clique
   nodes only when nothing else fits. A clique such pods already use
   (:meth:`ClusterSnapshot.spilled_cliques`) is no longer whole for the gangs that need
   the full rack: further pods off the fabric go there at no such price, rather than break
   whole nodes outside cliques that 8-GPU gangs need, and the other cliques stay whole.
   Cliques are kept only while a gang that needs one waits, or while that is not known
   (:attr:`ClusterSnapshot.clique_demand`, from :mod:`extender.placement.waiting`): with
   no such gang waiting, a whole rack is free capacity like any other, and while one waits
   only the whole rack with the most free GPUs is kept for it
   (:meth:`ClusterSnapshot.kept_cliques`): one rack drains at a time.
2. **hardware loss** (:func:`~extender.placement.hardware.gang_loss`): over the slice's GPUs,
   what a GPU of that model is worth to the gangs in demand (:attr:`ClusterSnapshot.worth`)
   less the pod set's own speed on it (its compute time on the fastest model it may use over
   its compute time there), GPUs at full speed. With nothing in demand a replica takes the
   fastest hardware it may use; while a gang that runs only on H100 is in demand, a small
   replica leaves the whole H100 nodes to it and takes a half-used one or an L40S.
3. **predicted per-layer communication time** (:func:`gang_micros`), microseconds.

Shared by the solver, the baselines, the simulator and the tests, so every policy is judged
by one yardstick.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from extender import cost
from extender.cost import Comm
from extender.placement import feasibility, hardware, numa_fit
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.hierarchy import HOSTNAME_LABEL, Hierarchy
from extender.topology.model import IN_NODE_LEVELS, GpuGraph, Tier


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
    if name in ("node", HOSTNAME_LABEL):
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
    """The in-node tier each pod of ``ps`` must reach on this node (None: a pod cannot fit it).
    With ``preferred``, the preferred tier where it is tighter than the requirement; a preferred
    tier looser than the requirement never loosens it."""
    fit = fit_for(snap.nodes[node_index].shape)
    base = need.tier_on(fit.tightest(ps.gpus_per_pod))
    if preferred and need.preferred_tier is not None and base is not None:
        return min(base, need.preferred_tier)
    return base


@dataclass(frozen=True, slots=True)
class Span:
    """What traffic among a group of pods runs over: its bottleneck bandwidth (GB/s), whether
    it leaves a node, and whether it stays on NVLink (one node's NVLink or a multi-node clique)."""

    gbps: float
    crosses_nodes: bool
    nvlink: bool

    @property
    def alpha_us(self) -> float:
        if self.nvlink:
            return cost.ALPHA_NVLINK_US
        return cost.ALPHA_NETWORK_US if self.crosses_nodes else cost.ALPHA_PCIE_US


def in_node_span(gbps: float) -> Span:
    return Span(gbps, False, gbps >= cost.NVLINK_RING_MIN_GBPS)


def span_of(snap: ClusterSnapshot, slots: Sequence[PodSlot]) -> Span:
    """The span of traffic among these slots: the GPUs' ring on one node, a multi-node NVLink
    clique, or the network under the finest switch level the nodes share."""
    nodes = sorted({s.node for s in slots})
    if len(nodes) == 1:
        node = snap.node(nodes[0])
        mask = node.shape.mask_of(g for s in slots for g in s.gpus)
        return in_node_span(fit_for(node.shape).gbps(mask))
    h = snap.hierarchy
    level = h.common_level([snap.path_of(n) for n in nodes])
    if level >= 0 and h.levels[level].fabric:
        per_gpu = min(clique_gbps(snap.node(n).graph) for n in nodes)
        if per_gpu > 0:
            return Span(per_gpu, True, True)
    return Span(h.switch_gbps(level), True, False)


def clique_gbps(graph: GpuGraph) -> float:
    """A GPU's bandwidth into a multi-node NVLink fabric: its widest NVLink bond."""
    return max((lk.nvlinks for lk in graph.links.values()), default=0) * graph.nvlink_gbps


def pod_set_cost(ps: PodSet, pod_gbps: Sequence[float], span: Span | None, kv: Span | None = None) -> float:
    """Predicted per-layer communication time of a pod set from what its placement offers:
    each pod's ring bandwidth (``pod_gbps``, one per pod), the ``span`` of traffic among its
    pods (needed when it has more than one) and the ``kv`` span to its colocateWith set.

    Each pod's own GPUs run tensor parallel (the seed formula). Across pods: ``allreduce``
    makes one ring of every GPU of the set, ``alltoall`` one expert-parallel group,
    ``pipeline`` adds stage-boundary sends, ``kv-transfer`` adds moving the KV cache from the
    partner pod set.
    """
    dims = ps.model
    worst_intra = min(pod_gbps, default=float("inf"))
    intra_cost = max(
        (cost.tp_layer_us(ps.gpus_per_pod, dims, b, in_node_span(b).alpha_us) for b in set(pod_gbps)),
        default=0.0,
    )
    total = intra_cost
    if ps.comm == Comm.KV_TRANSFER and kv is not None:
        total += cost.kv_layer_us(dims, kv.gbps, kv.alpha_us)
    if len(pod_gbps) <= 1 or ps.comm in (Comm.NONE, Comm.KV_TRANSFER):
        return total
    assert span is not None, "a pod set of several pods needs the span among them"
    ranks = ps.gpus_per_pod * len(pod_gbps)
    bottleneck = min(span.gbps, worst_intra)
    if ps.comm == Comm.ALLREDUCE:
        return cost.tp_layer_us(ranks, dims, bottleneck, span.alpha_us)
    if ps.comm == Comm.ALLTOALL:
        return cost.ep_layer_us(ranks, dims, bottleneck, span.alpha_us)
    return intra_cost + cost.pipeline_layer_us(len(pod_gbps), dims, span.gbps, span.alpha_us)


def pod_set_micros(
    snap: ClusterSnapshot, ps: PodSet, slots: Sequence[PodSlot], partner: Sequence[PodSlot] = ()
) -> float:
    """Predicted per-layer communication time of one pod set placed on ``slots``, with its
    KV cache coming from ``partner`` (its colocateWith set) when it is a kv-transfer set."""
    pod_gbps = []
    for s in slots:
        fit = fit_for(snap.node(s.node).shape)
        pod_gbps.append(fit.gbps(fit.mask_of(s.gpus)))
    span = span_of(snap, slots) if len(slots) > 1 and ps.comm not in (Comm.NONE, Comm.KV_TRANSFER) else None
    kv = kv_span(snap, ps, slots, partner) if ps.comm == Comm.KV_TRANSFER and partner else None
    return pod_set_cost(ps, pod_gbps, span, kv)


def kv_span(snap: ClusterSnapshot, ps: PodSet, slots: Sequence[PodSlot], partner: Sequence[PodSlot]) -> Span:
    """The span the KV hand-off runs at: each pod takes its KV cache from the partner pod
    nearest to it (the transfers run side by side), so the slowest of those pairs sets the
    pace; a decode pod on its prefill pod's node gets NVLink even when the pod sets span
    several nodes."""
    dims = ps.model

    def pace(span: Span) -> float:
        return cost.kv_layer_us(dims, span.gbps, span.alpha_us)

    nearest = [min((span_of(snap, [s, p]) for p in partner), key=pace) for s in slots]
    return max(nearest, key=pace)


def gang_micros(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> dict[str, float]:
    by_set = _by_set(gang, slots)
    out = {}
    for ps in gang.pod_sets:
        partner = by_set[ps.colocate_with.pod_set] if ps.colocate_with else []
        out[ps.name] = pod_set_micros(snap, ps, by_set[ps.name], partner)
    return out


def _by_set(gang: GangRequest, slots: Sequence[PodSlot]) -> dict[str, list[PodSlot]]:
    by_set: dict[str, list[PodSlot]] = {ps.name: [] for ps in gang.pod_sets}
    for s in slots:
        by_set[s.pod_set].append(s)
    return by_set


# -- multi-node NVLink cliques -----------------------------------------------------------------


def pods_talk(ps: PodSet) -> bool:
    """Whether the pods of a pod set exchange data among themselves or with their colocateWith
    set (a kv-transfer set); only such a pod set uses a multi-node NVLink clique it spans, and
    its IMEX channels."""
    if ps.comm == Comm.KV_TRANSFER:
        return ps.colocate_with is not None
    return ps.comm != Comm.NONE


def uses_mnnvl(
    snap: ClusterSnapshot, ps: PodSet, slots: Sequence[PodSlot], partner: Sequence[PodSlot] = ()
) -> bool:
    """Whether the pod set's traffic runs over multi-node NVLink: its pods talk, and they (with
    ``partner``, the colocateWith set, for a kv-transfer set) sit on several nodes of one clique."""
    if not pods_talk(ps) or not snap.has_cliques:
        return False
    group = [*slots, *partner] if ps.comm == Comm.KV_TRANSFER else slots
    nodes = {s.node for s in group}
    if len(nodes) < 2:
        return False
    cliques = {snap.clique(snap.index(n)) for n in nodes}
    return len(cliques) == 1 and None not in cliques


def on_whole_clique(snap: ClusterSnapshot, i: int) -> bool:
    """Whether node ``i`` is in a multi-node NVLink clique kept whole for the gangs that ask
    for one (:meth:`ClusterSnapshot.kept_cliques`): GPUs taken there by a pod set that does
    not use the fabric are fabric waste."""
    clique = snap.clique(i)
    return clique is not None and clique in snap.kept_cliques()


def pod_set_fabric_waste(
    snap: ClusterSnapshot, ps: PodSet, slots: Sequence[PodSlot], partner: Sequence[PodSlot] = ()
) -> int:
    """GPUs the pod set takes on clique nodes without using multi-node NVLink, on cliques
    no pods off the fabric use yet."""
    if not snap.has_cliques:
        return 0
    on_cliques = sum(len(s.gpus) for s in slots if on_whole_clique(snap, snap.index(s.node)))
    if on_cliques and uses_mnnvl(snap, ps, slots, partner):
        return 0
    return on_cliques


def fabric_waste(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> int:
    """GPUs of multi-node NVLink cliques the slice gives to pod sets that do not use multi-node
    NVLink: the first term of the objective."""
    if not snap.has_cliques:
        return 0
    by_set = _by_set(gang, slots)
    return sum(
        pod_set_fabric_waste(
            snap, ps, by_set[ps.name], by_set[ps.colocate_with.pod_set] if ps.colocate_with else ()
        )
        for ps in gang.pod_sets
    )


def objective(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> tuple[int, float, float]:
    """THE objective, lexicographic, lower is better: (:func:`fabric_waste`, the hardware loss
    (:func:`~extender.placement.hardware.gang_loss`), the predicted per-layer communication
    time of the gang in microseconds)."""
    return (
        fabric_waste(snap, gang, slots),
        hardware.gang_loss(snap, gang, slots),
        sum(gang_micros(snap, gang, slots).values()),
    )


def room_taken(
    snap: ClusterSnapshot, gang: str, ps: PodSet, i: int, taken: feasibility.Resources | None
) -> feasibility.Resources | None:
    """What NodeResourcesFit must count as taken on node ``i`` before one more pod of ``ps``:
    what the gang's pods there take (``taken``), and the IMEX daemon pod where the pod may join
    the gang's ComputeDomain (:func:`~extender.placement.feasibility.with_imex_daemon`): the
    node is in a multi-node NVLink clique, the pod set's pods talk and hold GPUs, and no daemon
    of the gang's domain runs there yet (the driver's label names no domain of the gang).

    Whether the pod set spans several nodes of the clique (and so needs the domain) is known
    only once it is placed; the room is kept on every clique node it may take, which costs at
    most the daemon's room on a node that a pod set on one node would have filled."""
    if not ps.gpus_per_pod or not pods_talk(ps) or snap.clique(i) is None:
        return taken
    node = snap.nodes[i]
    if node.mnnvl_gang == gang:
        return taken
    return feasibility.with_imex_daemon(taken, node.facts)


def mnnvl_nodes(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> tuple[str, ...]:
    """Nodes whose multi-node NVLink (IMEX) channel the slice claims: the clique nodes of every
    pod set that spans several nodes and whose pods talk (a ``comm: none`` pod set claims none)."""
    if not snap.has_cliques:
        return ()
    out: set[str] = set()
    for ps in gang.pod_sets:
        if not pods_talk(ps):
            continue
        nodes = {s.node for s in slots if s.pod_set == ps.name}
        if len(nodes) > 1:
            out.update(n for n in nodes if snap.clique(snap.index(n)) is not None)
    return tuple(sorted(out))


# -- colocation --------------------------------------------------------------------------------


def colocation_misses(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> dict[str, str]:
    """Pod sets whose colocateWith wish the slots do not meet, each with what is wrong in words
    (``not sharing a leaf with prefill``). A wish is met when every pod of the pod set and of
    its colocateWith set share one domain at the named level; in-node levels are not judged."""
    h = snap.hierarchy
    by_set = _by_set(gang, slots)
    out: dict[str, str] = {}
    for ps in gang.pod_sets:
        c = ps.colocate_with
        if c is None or not by_set[ps.name]:
            continue
        scope, _ = resolve_level(c.level, h)
        if scope is None:
            continue
        partner = {s.node for s in by_set[c.pod_set]}
        if shares_domain(snap, {s.node for s in by_set[ps.name]} | partner, scope):
            continue
        why = f"not sharing a {c.level} with {c.pod_set}"
        if len(partner) > 1 and not shares_domain(snap, partner, scope):
            why += f" ({c.pod_set} itself spans more than one {c.level})"
        out[ps.name] = why
    return out


def shares_domain(snap: ClusterSnapshot, nodes: Iterable[str], scope: int) -> bool:
    """Do these nodes share one domain at ``scope`` (a level index or the node scope)?"""
    distinct = sorted(set(nodes))
    if len(distinct) <= 1:
        return True
    h = snap.hierarchy
    if scope >= node_scope(h):
        return False
    return h.common_level([snap.path_of(n) for n in distinct]) >= scope


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
    pods_on: dict[int, feasibility.Resources] = {}  # what the gang's pods take per node so far
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
            node = snap.nodes[i]
            refused = feasibility.refusal(ps.node_needs, node.name, node.labels, node.facts)
            daemon = ""
            if refused is None:
                here = pods_on.get(i, feasibility.NOTHING)
                refused = feasibility.room_refusal(ps.requests, node.facts, here)
                with_daemon = room_taken(snap, gang.name, ps, i, here) or here
                if refused is None and with_daemon != here:
                    refused = feasibility.room_refusal(ps.requests, node.facts, with_daemon)
                    daemon = " with the IMEX daemon pod of the gang's ComputeDomain"
                pods_on[i] = here.plus(feasibility.usage(ps.requests))
            if refused is not None:
                problems.append(f"slot {s.key}: {s.node} refused by {refused}{daemon}")
            if ps.gpus_per_pod == 0:
                continue  # a pod without GPUs has no in-node tier to keep
            tier = pod_tier(snap, i, ps, need)
            actual = snap.nodes[i].shape.tier_of(snap.nodes[i].shape.mask_of(s.gpus))
            if tier is None:
                problems.append(f"slot {s.key}: {s.node} has no set of {ps.gpus_per_pod} GPUs for a pod")
            elif actual > tier:
                problems.append(
                    f"slot {s.key}: GPUs {list(s.gpus)} on {s.node} are {actual.name}, need {tier.name}"
                )
        nodes = sorted({s.node for s in got if snap.has_node(s.node)})
        if len(nodes) > 1:
            if need.scope == node_scope(h):
                problems.append(f"pod set {ps.name}: spans {len(nodes)} nodes, required one node")
            elif need.scope != ANYWHERE and h.common_level([snap.path_of(n) for n in nodes]) < need.scope:
                problems.append(f"pod set {ps.name}: spans more than one {h.levels[need.scope].name}")
            if pods_talk(ps):
                problems.extend(_mnnvl_violations(snap, gang.name, ps.name, nodes))
    problems.extend(_numa_violations(snap, gang, slots))
    return problems


def _numa_violations(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> list[str]:
    """What the kubelets' Topology Managers refuse of the slice (:mod:`.numa_fit`)."""
    per_node: dict[str, list[tuple[str, PodSet, int]]] = {}
    names = {ps.name: ps for ps in gang.pod_sets}
    for s in slots:
        ps = names.get(s.pod_set)
        if ps is None or not ps.gpus_per_pod or not snap.has_node(s.node):
            continue
        node = snap.node(s.node)
        if node.kubelet is None or not set(s.gpus) <= set(node.shape.indices):
            continue
        per_node.setdefault(s.node, []).append((s.key, ps, node.shape.mask_of(s.gpus)))
    out: list[str] = []
    for name, pods in per_node.items():
        out.extend(numa_fit.violations(snap.node(name), pods, snap.free_mask(snap.index(name))))
    return out


def _mnnvl_violations(snap: ClusterSnapshot, gang: str, pod_set: str, nodes: Sequence[str]) -> list[str]:
    """A pod set whose pods talk and that spans several nodes stays inside one clique or off
    cliques altogether, and uses no node whose IMEX channel another gang holds."""
    cliques = {snap.clique(snap.index(n)) for n in nodes}
    if cliques == {None}:
        return []
    problems = []
    if len(cliques) > 1:
        problems.append(
            f"pod set {pod_set}: spans several NVLink cliques or mixes clique and non-clique nodes"
        )
    for n in nodes:
        i = snap.index(n)
        if not snap.channel_free(gang, i):
            holder = snap.channel_holder(i)
            problems.append(f"pod set {pod_set}: node {n}'s NVLink channel is held by {holder}")
    return problems
