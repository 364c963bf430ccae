"""One way to place one pod set, and what the candidate generators share to build one.

An :class:`Option` is what the candidate phase hands the search: the pod set's slots, the
GPUs it takes per node, where it sits, its price (clique GPUs off the fabric, cost) and the
parts of its :class:`~extender.placement.search.rank.OptionRank`. A :class:`Shortfall` is
the candidate phase's other answer: the pod set has no placement; it is kept as data and put
into words only if it is the failure finally reported (:mod:`~extender.placement.search.explain`).

Shared by the one-node and the across-nodes generators: the GPU sets of a pod set on one node
(:func:`node_pick`, memoised per node class for the decision), slots from picked masks, and
the price of slots with the KV hand-offs they decide (:class:`Links`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.cost import Comm
from extender.placement import hardware
from extender.placement.node_fit import fit_for
from extender.placement.numa_fit import GpuFit
from extender.placement.request import PodSet
from extender.placement.scoring import Need, in_node_span, pod_set_cost, pod_set_fabric_waste
from extender.placement.search.capacity import CapacityTable
from extender.placement.search.context import Decision, NodePick
from extender.placement.search.rank import (
    NO_FIT,
    DomainFit,
    NodeTie,
    OptionRank,
    Price,
    option_rank,
    price,
    quantize,
)
from extender.placement.search.rank import micros as rank_micros
from extender.placement.search.rank import speeds as rank_speeds
from extender.placement.slice import PodSlot
from extender.topology.model import Tier


@dataclass(frozen=True)
class Option:
    """One way to place one pod set."""

    slots: tuple[PodSlot, ...]
    masks: Mapping[int, int]  # node index -> GPUs taken there
    level: int  # node_scope for one node, else the level index of the domain (ANYWHERE: cluster)
    where: str
    waste: int  # clique GPUs taken off the fabric (scoring.pod_set_fabric_waste)
    cost: float  # communication per layer, us
    fit: NodeTie | DomainFit = NO_FIT  # how tightly it fits (rank.py)
    misses: tuple[str, ...] = ()  # soft wishes not met: rank.PREFERRED, rank.COLOCATE
    notes: tuple[str, ...] = ()  # the misses said plainly
    no_room: bool = False  # a pod set that colocates with this one has no room next to it
    #: Pods of kv-transfer sets colocating with this one that its own nodes cannot hold: each
    #: of those hands its KV cache over the network rather than inside a node.
    kv_short: int = 0
    #: Nodes with every GPU free that this placement breaks into.
    opened: int = 0
    kinds: frozenset[str] = frozenset()  # the node types it uses
    #: The hardware loss of its GPUs (:func:`~extender.placement.hardware.loss`).
    hardware: float = 0.0

    @property
    def price(self) -> Price:
        return price(self.waste, self.hardware, self.cost)

    def rank(self) -> OptionRank:
        return option_rank(
            fabric_waste=self.waste,
            misses=self.misses,
            hardware=self.hardware,
            cost_us=self.cost,
            no_room=self.no_room,
            kv_short=self.kv_short,
            nodes_opened=self.opened,
            level=self.level,
            fit=self.fit,
        )


@dataclass(frozen=True)
class Shortfall:
    """Why a pod set has no placement, as data: ``caps``, the nodes that hold one of its pods
    (none hold enough together), or for a pod set without GPUs (``caps`` None) ``have``, the
    pods the cluster has room for."""

    pod_set: PodSet
    need: Need
    caps: CapacityTable | None
    have: int = 0


@dataclass(frozen=True)
class Links:
    """The KV hand-offs a pod set's placement decides: from its partner, when it is a
    kv-transfer set whose colocateWith set is placed, and to the kv-transfer sets already
    placed that colocate with it."""

    partner: tuple[PodSlot, ...] = ()
    dependents: tuple[tuple[PodSet, tuple[PodSlot, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.partner or self.dependents)

    def groups(self) -> list[tuple[PodSlot, ...]]:
        return [g for g in (self.partner, *(slots for _, slots in self.dependents)) if g]


def placement_price(
    ctx: Decision, ps: PodSet, slots: tuple[PodSlot, ...], links: Links, own: float | None = None
) -> tuple[int, float, float]:
    """What placing ``ps`` on ``slots`` adds to the gang's objective: clique GPUs taken off
    the fabric, the hardware loss of its GPUs, and cost (us per layer): its own communication
    (``own`` when already known) and the KV hand-offs to its placed dependents."""
    if own is None or links.partner:
        own = rank_micros(ctx, ps, slots, links.partner)
    cost = own + sum(rank_micros(ctx, d, d_slots, slots) for d, d_slots in links.dependents)
    waste = 0
    if ctx.has_fabric:
        waste = pod_set_fabric_waste(ctx.snap, ps, slots, links.partner) + sum(
            pod_set_fabric_waste(ctx.snap, d, d_slots, slots) for d, d_slots in links.dependents
        )
    return waste, hardware.loss_with(ctx.snap, slots, rank_speeds(ctx, ps)), cost


def slots_of(ctx: Decision, ps: PodSet, placed: Sequence[tuple[int, int]]) -> tuple[PodSlot, ...]:
    """A slot per (node index, GPU mask), numbered in order."""
    out = []
    last, name, fit = -1, "", None
    for index, (i, mask) in enumerate(placed):
        if i != last:  # a node's pods come one after another: look the node up once
            node = ctx.snap.nodes[i]
            last, name, fit = i, node.name, fit_for(node.shape)
        assert fit is not None
        gpus, numa, nic = fit.slot_of(mask)
        out.append(PodSlot(ps.name, index, name, gpus, numa, nic))
    return tuple(out)


def node_pick(ctx: Decision, ps: PodSet, i: int, free: int, tier: Tier) -> NodePick:
    """The GPU sets of all of ``ps``'s pods on node ``i`` (memoised per node type and free
    mask); on a device-plugin node, the sets the plugin hands out."""
    node = ctx.snap.nodes[i]
    rule = ctx.rule(i, ps)
    key = (ps.name, ctx.snap.kinds()[i], free, tier, rule)
    got = ctx.tables.picks.get(key)
    if got is None:
        fit = ctx.fit(i, ps)
        masks = fit.pick(free, ps.gpus_per_pod, tier, ps.count)
        assert masks is not None, "capacity said the pods fit; pick must agree"
        got = _pick_of(ps, fit, free, masks)
        # Where the device plugin picks, or the kubelet aligns the GPUs and picks each pod's
        # NUMA node itself from all free GPUs, other unions are not deliverable.
        chosen = node.plugin or (rule is not None and rule.gpus_aligned)
        if not chosen and ps.count > 1 and ps.comm in (Comm.ALLREDUCE, Comm.ALLTOALL, Comm.PIPELINE):
            # The pods talk over the links among all their GPUs: try every set of GPUs they
            # could share and keep the cheapest, then the most coherent remainder.
            for union in fit.subsets(ps.count * ps.gpus_per_pod, Tier.NODE):
                if union & free != union:
                    continue
                inside = fit.pick(union, ps.gpus_per_pod, tier, ps.count)
                if inside is None:
                    continue
                other = _pick_of(ps, fit, free, inside)
                if (quantize(other.cost), -other.coherent) < (quantize(got.cost), -got.coherent):
                    got = other
        ctx.tables.picks[key] = got
    return got


def _pick_of(ps: PodSet, fit: GpuFit, free: int, masks: tuple[int, ...]) -> NodePick:
    union = 0
    for m in masks:
        union |= m
    span = in_node_span(fit.gbps(union)) if ps.count > 1 else None
    cost = pod_set_cost(ps, [fit.gbps(m) for m in masks], span)
    rest = free & ~union
    return NodePick(masks, union, cost, rest.bit_count(), fit.coherent_block(rest))
