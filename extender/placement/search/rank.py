"""How placements rank: every key the search compares placements by, defined here.

Each key is a NamedTuple compared as a tuple, field by field in the order written (lower
is better), like Kueue's ordered comparators; a field's comment gives its unit. (How the
generators fill a chosen domain, roomiest node first, and pick GPU sets inside a node are
orders of their own, next to that work in ``across_nodes`` and ``option``.)

:class:`SliceRank` ranks finished slices of the whole gang, the objective first
(:func:`~extender.placement.scoring.objective`):

1. ``fabric_waste``: GPUs of multi-node NVLink cliques taken by pod sets that do not use
   multi-node NVLink (:func:`~extender.placement.scoring.fabric_waste`), GPUs;
2. ``colocation_misses``: colocateWith wishes the slice misses, a count;
3. ``hardware``: the hardware loss (:func:`~extender.placement.hardware.loss`): over the
   slice's GPUs, what each is worth to the gangs in demand less the pod set's own speed on
   it, GPUs at full speed, to 0.01;
4. ``cost_us``: the predicted communication time per transformer layer, summed over the pod
   sets (:func:`~extender.placement.scoring.pod_set_micros`: ring all-reduce
   ``2 (K-1)/K * bytes / B + alpha`` and its siblings), microseconds, rounded to 1e-6 so
   float noise between equal placements ties;
5. ``notes``: wishes missed and said in the slice's notes, a count.

:class:`OptionRank` ranks one pod set's candidate placements: ``fabric_waste`` and
``colocation_missed`` (a colocateWith the user asked for is kept before cost) come first,
then ``hardware`` (the hardware loss of its own GPUs), then ``cost_us`` (its own
communication and its KV hand-offs to placed partners), soft wishes missed
(``wishes_missed``: preferred level, colocation), ``no_room`` (a pod set that colocates
with it finds no room next to it), ``kv_short`` (pods of kv-transfer sets colocating with
it that its nodes cannot hold: their KV cache crosses the network), nodes with every GPU
free it breaks into (``nodes_opened``), ``coarseness`` (minus the level index
of the smallest domain holding it: finer first), and last ``fit``, how tightly it fits:

- on one node, a :class:`NodeTie`: the preferred node affinity score (higher first), a node
  in use before a whole one, the node type worth least to others (its all-GPU ring
  bandwidth, GB/s, so NVLink islands stay for the gangs that pay for them), then for a pod
  set with a required level the fullest enclosing domains from the coarsest level down (as
  Kueue's BestFit: free GPUs per enclosing domain) before the tightest fit (free GPUs left on
  the node, then the largest coherent block left, larger first); for a pod set without one,
  the tightest fit first (Kueue sorts every node at once for such pod sets, fullest first),
  then the fullest domains; then the node's place in the snapshot's one tie-break order
  (topology path, then name);
- across nodes, a :class:`DomainFit`: free GPUs the domain keeps after the pod set (fewer
  first: the tightest domain) and the nodes its fastest nodes span.

:class:`NodeRank` orders the nodes that could hold a whole pod set alone (clique GPUs off
the fabric, hardware loss, cost, then the node's tie); :class:`DomainRank` orders the
domains of one level by the speed class their fastest nodes reach (nodes off the fabric
first for a pod set whose pods do not talk; the pod bandwidth, GB/s, capped where a faster
node no longer helps, higher first), then their fit; the sort itself runs on
:data:`DomainParts`, the same parts as a plain tuple, since a NamedTuple per domain would
cost more than the sort.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from extender.placement import feasibility, hardware
from extender.placement.node_fit import fit_for
from extender.placement.request import PodSet
from extender.placement.scoring import ANYWHERE, pod_set_micros
from extender.placement.search.context import Decision, NodePick
from extender.placement.slice import PodSlot
from extender.topology.gpus import GpuSpec

#: The soft wishes an option can miss (its ``misses``), in words.
PREFERRED = "preferred level"
COLOCATE = "colocation"


def quantize(micros: float) -> float:
    """Costs this close are ties (float noise between equal placements)."""
    return round(micros, 6)


class Price(NamedTuple):
    """What a placement adds to the gang's objective."""

    fabric_waste: int  # clique GPUs taken off the fabric, GPUs
    hardware: float  # hardware loss, GPUs at full speed
    cost_us: float  # communication per layer, us, quantized


def price(waste: int, hardware: float, cost: float) -> Price:
    return Price(waste, hardware, quantize(cost))


class SliceRank(NamedTuple):
    """How a finished slice ranks (lower is better)."""

    fabric_waste: int  # clique GPUs of the gang off the fabric, GPUs
    colocation_misses: int  # colocateWith wishes missed, count
    hardware: float  # hardware loss summed over the pod sets, GPUs at full speed
    cost_us: float  # communication per layer summed over the pod sets, us, quantized
    notes: int  # wishes missed and said, count


def slice_rank(
    fabric_waste: int, colocation_misses: int, hardware: float, cost_us: float, notes: int
) -> SliceRank:
    return SliceRank(fabric_waste, colocation_misses, hardware, quantize(cost_us), notes)


class LevelledTie(NamedTuple):
    """One node, for a pod set with a required level: the fullest domains first."""

    preference: int  # minus the preferred node affinity score
    whole: bool  # the node had every GPU free
    worth_gbps: float  # the node type's all-GPU ring bandwidth, GB/s
    fullness: tuple[int, ...]  # free GPUs of the enclosing domains, coarsest level first
    leftover: int  # free GPUs the pods leave on the node (the tightest fit first)
    incoherent: int  # minus the largest coherent block of GPUs they leave
    order: int  # the node's place in the snapshot's tie-break order


class SpreadTie(NamedTuple):
    """One node, for a pod set without a required level: the tightest fit first."""

    preference: int
    whole: bool
    worth_gbps: float
    leftover: int
    incoherent: int
    fullness: tuple[int, ...]
    order: int


#: How one-node placements of equal price rank.
NodeTie = LevelledTie | SpreadTie


class DomainFit(NamedTuple):
    """How tightly a pod set fits the domain it spans."""

    spare_gpus: int  # free GPUs of its fastest nodes beyond what the pod set takes
    nodes: int  # how many of those nodes


#: No fit to compare (a pod set without GPUs: one option only).
NO_FIT = DomainFit(0, 0)


class OptionRank(NamedTuple):
    """How one pod set's candidate placements rank (lower is better)."""

    fabric_waste: int  # clique GPUs taken off the fabric, GPUs
    colocation_missed: bool  # misses the colocateWith wish the user asked for
    hardware: float  # hardware loss of its own GPUs, GPUs at full speed
    cost_us: float  # communication per layer (its own and its KV hand-offs), us, quantized
    wishes_missed: int  # soft wishes missed (preferred level, colocation), count
    no_room: bool  # a pod set colocating with it has no room next to it
    kv_short: int  # pods of kv-transfer sets colocating with it its nodes cannot hold
    nodes_opened: int  # nodes with every GPU free it breaks into
    coarseness: int  # minus the level index of its smallest enclosing domain
    fit: NodeTie | DomainFit


class NodeRank(NamedTuple):
    """How the nodes that hold every pod of a pod set alone rank (lower is better)."""

    fabric_waste: int  # clique GPUs taken off the fabric, GPUs
    hardware: float  # hardware loss of the pods on the node's GPU model, GPUs at full speed
    cost_us: float  # the pods' communication on the node, us, quantized
    tie: NodeTie


#: A node's speed class for a pod set spanning nodes: (1 for a clique node a pod set whose
#: pods do not talk takes last, else 0; minus the pod bandwidth it gets, GB/s, capped).
Speed = tuple[int, float]


class DomainRank(NamedTuple):
    """How the domains of one level rank for a pod set spanning nodes (lower is better)."""

    off_fabric: int  # its fastest nodes include clique nodes taken last
    minus_gbps: float  # minus the pod bandwidth its fastest nodes reach, GB/s, capped
    spare_gpus: int  # free GPUs of those nodes beyond what the pod set takes
    nodes: int  # how many nodes those are

    @property
    def speed(self) -> Speed:
        return (self.off_fabric, self.minus_gbps)

    @property
    def fit(self) -> DomainFit:
        return DomainFit(self.spare_gpus, self.nodes)


def option_rank(
    *,
    fabric_waste: int,
    misses: tuple[str, ...],
    hardware: float,
    cost_us: float,
    no_room: bool,
    kv_short: int,
    nodes_opened: int,
    level: int,
    fit: NodeTie | DomainFit,
) -> OptionRank:
    return OptionRank(
        fabric_waste,
        COLOCATE in misses,
        hardware,
        quantize(cost_us),
        len(misses),
        no_room,
        kv_short,
        nodes_opened,
        -level,
        fit,
    )


def node_tie(ctx: Decision, ps: PodSet, i: int, pick: NodePick) -> NodeTie:
    """How node ``i`` ranks among one-node placements of ``ps`` of equal price."""
    snap = ctx.snap
    return _tie(
        ctx.needs[ps.name].scope == ANYWHERE,
        -node_preference(ps, i, ctx) if ps.preferred else 0,
        snap.free_mask(i).bit_count() == snap.nodes[i].shape.size,
        worth(ctx, i),
        pick,
        snap.fullness(i),
        snap.order()[i],
    )


def _tie(
    spread: bool, preference: int, whole: bool, gbps: float, pick: NodePick, full: tuple[int, ...], order: int
) -> NodeTie:
    if spread:
        return SpreadTie(preference, whole, gbps, pick.leftover, -pick.coherent, full, order)
    return LevelledTie(preference, whole, gbps, full, pick.leftover, -pick.coherent, order)


def node_ranks(
    ctx: Decision,
    ps: PodSet,
    members: Sequence[int],
    pick: NodePick,
    fabric_waste: Callable[[int], int],
    best: int | None = None,
) -> list[tuple[NodeRank, int]]:
    """:class:`NodeRank` of each node of ``members``, which share a node type and a free
    mask (so one ``pick``), with its index; the same ranks :func:`node_tie` gives one at a
    time, with what the nodes share worked out once (a cluster's thousands of nodes fall
    into a few such classes). With ``best``, only the nodes that can be among the ``best``
    first of ``members``: of nodes whose ranks differ in their place in the tie-break order
    alone (one path, so one fullness), the first ``best`` in that order."""
    snap = ctx.snap
    first = members[0]
    cost = quantize(pick.cost)
    size = snap.nodes[first].shape.size
    gbps = worth(ctx, first)
    frees, order = snap.free_masks(), snap.order()
    spread = ctx.needs[ps.name].scope == ANYWHERE
    models = hardware.node_models(snap)

    def preference(i: int) -> int:
        return -node_preference(ps, i, ctx) if ps.preferred else 0

    if best is not None:
        # Nodes alike in all but their place in the order: one path (so one fullness), one
        # free mask (so one ``whole``), one GPU model, the same preference and fabric waste.
        keys: list[tuple[object, ...]]
        if ps.preferred or ctx.has_fabric:
            keys = [(snap.path(i), frees[i], models[i], preference(i), fabric_waste(i)) for i in members]
        else:
            keys = list(
                zip(
                    map(snap.path, members),
                    map(frees.__getitem__, members),
                    map(models.__getitem__, members),
                    strict=True,
                )
            )
        alike: dict[tuple[object, ...], list[int]] = {}
        for key, i in zip(keys, members, strict=True):
            alike.setdefault(key, []).append(i)
        members = [i for nodes in alike.values() for i in heapq.nsmallest(best, nodes, key=order.__getitem__)]
    out = []
    # The members share a free mask, so a node's hardware loss is its GPU model's.
    losses: dict[GpuSpec | None, float] = {}
    for i in members:
        whole = frees[i].bit_count() == size
        tie = _tie(spread, preference(i), whole, gbps, pick, snap.fullness(i), order[i])
        loss = losses.get(models[i])
        if loss is None:
            loss = losses[models[i]] = node_loss(ctx, ps, i, models)
        out.append((NodeRank(fabric_waste(i), loss, cost, tie), i))
    return out


#: A :class:`DomainRank`'s parts as a plain tuple, in its field order ((off_fabric,
#: minus_gbps), spare_gpus, nodes): the across-nodes search sorts every domain of a level by
#: it (a NamedTuple per domain would cost more than the sort) and names the few it then looks
#: at with :func:`domain_rank`.
DomainParts = tuple[Speed, int, int]


def domain_rank(parts: DomainParts) -> DomainRank:
    (off_fabric, minus_gbps), spare_gpus, nodes = parts
    return DomainRank(off_fabric, minus_gbps, spare_gpus, nodes)


def speeds(ctx: Decision, ps: PodSet) -> Mapping[str, float] | None:
    """The pod set's speed per GPU model (:func:`~extender.placement.hardware.speeds`),
    memoised for the decision."""
    if ps.name not in ctx.tables.speeds:
        ctx.tables.speeds[ps.name] = hardware.speeds(ctx.snap, ps)
    return ctx.tables.speeds[ps.name]


def node_loss(ctx: Decision, ps: PodSet, i: int, models: Sequence[GpuSpec | None]) -> float:
    """The hardware loss of every pod of ``ps`` on node ``i``
    (:func:`~extender.placement.hardware.node_loss`)."""
    own = speeds(ctx, ps)
    if not own:
        return 0.0
    return round(hardware.node_loss(ctx.snap, i, ps.gpus, own, models[i]), hardware.LOSS_DIGITS)


def node_preference(ps: PodSet, i: int, ctx: Decision) -> int:
    """The preferred node affinity score of node ``i`` for ``ps`` (0 without preferences)."""
    if not ps.preferred:
        return 0
    node = ctx.snap.nodes[i]
    return feasibility.preference(ps.preferred, node.name, node.labels)


def worth(ctx: Decision, i: int) -> float:
    """What node ``i``'s type is worth to others: its all-GPU ring bandwidth, GB/s (memoised
    per node type for the decision)."""
    kind = ctx.snap.kinds()[i]
    got = ctx.tables.worths.get(kind)
    if got is None:
        shape = ctx.snap.nodes[i].shape
        got = ctx.tables.worths[kind] = round(fit_for(shape).gbps(shape.full_mask), 3)
    return got


def micros(ctx: Decision, ps: PodSet, slots: tuple[PodSlot, ...], partner: tuple[PodSlot, ...]) -> float:
    """:func:`~extender.placement.scoring.pod_set_micros` (us per layer), once per placement:
    the price of an option and the finished slice read the same slots."""
    key = (ps.name, id(slots), id(partner))
    got = ctx.tables.micros.get(key)
    if got is None:
        got = ctx.tables.micros[key] = (pod_set_micros(ctx.snap, ps, slots, partner), slots, partner)
    return got[0]
