"""Candidates on one node: the best nodes that hold every pod of a pod set alone.

Nodes are ranked by :class:`~extender.placement.search.rank.NodeRank` (clique GPUs taken off
the fabric, the pods' cost on the node's GPU sets, then the node's tie). The pod set is
offered the best few; the best node per relation to the pod sets it hands a KV cache to or
from (its partner's own node, the same clique, leaf, ...: a hand-off's bandwidth depends on
that relation, not on the node's own rank); and the best node of each node type that leaves
room for the pod sets that colocate with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from extender.placement.request import PodSet
from extender.placement.scoring import ANYWHERE, clique_gbps, node_scope, on_whole_clique
from extender.placement.search.capacity import ROOM_CHECK_NODES, CapacityTable, room_for
from extender.placement.search.context import BEAM, Decision, Taken
from extender.placement.search.option import Links, Option, node_pick, placement_price, slots_of
from extender.placement.search.rank import NodeRank, node_ranks, node_tie


def options(
    ctx: Decision,
    ps: PodSet,
    caps: CapacityTable,
    links: Links,
    dependents: Sequence[PodSet],
    taken: Taken,
) -> list[Option]:
    """The best nodes that hold every pod alone: the cheapest and tightest fits, the best one
    per relation to the pod sets it hands a KV cache to or from, and the best one that leaves
    room for pod sets colocating with this one."""
    snap = ctx.snap

    def waste(i: int) -> int:
        # One node's pods do not talk over the fabric (a KV hand-off to a partner in the
        # same clique may: the relation classes below offer that node too); a clique pods
        # off the fabric already use costs nothing more.
        return ps.gpus if ctx.has_fabric and on_whole_clique(snap, i) else 0

    # Only the first few are offered, unless every node's relation or room is looked at.
    best = None if links or dependents else BEAM + 1
    ranked: list[tuple[NodeRank, int]] = []
    for (_, _, (cap, free, tier)), members in caps.groups.items():
        if cap < ps.count:
            continue
        # A group's nodes share node type, NUMA rule and free mask: one pick for all.
        ranked += node_ranks(ctx, ps, members, node_pick(ctx, ps, members[0], free, tier), waste, best)
    if not ranked:
        return []
    ranked.sort()
    chosen = dict.fromkeys(r[-1] for r in ranked[: BEAM + 1])
    if links:
        classes: dict[object, int] = {}
        relations = [_Relation(ctx, sorted(ctx.slot_nodes(g))) for g in links.groups()]
        for _, i in ranked:
            classes.setdefault(tuple(rel(i) for rel in relations), i)
        chosen.update(dict.fromkeys(classes.values()))
    if dependents:
        # Where the colocated sets will go matters as much as this set's own fit: the best
        # node of each node type that leaves room for them.
        kinds: dict[str, list[int]] = {}
        for _, i in ranked:
            kinds.setdefault(snap.nodes[i].shape.key, []).append(i)
        for nodes in kinds.values():
            for i in nodes[:ROOM_CHECK_NODES]:
                _, free, tier = caps[i]
                if room_for(ctx, dependents, {i: node_pick(ctx, ps, i, free, tier).union}, taken):
                    chosen[i] = None
                    break
    return [_on_node(ctx, ps, i, caps, links) for i in chosen]


def _on_node(ctx: Decision, ps: PodSet, i: int, caps: CapacityTable, links: Links) -> Option:
    """Every pod of ``ps`` on node ``i``."""
    _, free, tier = caps[i]
    pick = node_pick(ctx, ps, i, free, tier)
    slots = slots_of(ctx, ps, [(i, m) for m in pick.masks])
    waste, loss, cost = placement_price(ctx, ps, slots, links, pick.cost)
    node = ctx.snap.nodes[i]
    return Option(
        slots,
        {i: pick.union},
        node_scope(ctx.h),
        f"node {node.name}",
        waste,
        cost,
        node_tie(ctx, ps, i, pick),
        kinds=frozenset({node.shape.key}),
        hardware=loss,
    )


class _Relation:
    """How a node relates to the nodes of a pod set it exchanges a KV cache with, as far as
    the hand-off's bandwidth goes: one of that set's own nodes, or the finest level it shares
    with them (and, inside a clique, its NVLink bandwidth)."""

    def __init__(self, ctx: Decision, partner_nodes: Sequence[int]) -> None:
        self.ctx = ctx
        self.partner = set(partner_nodes)
        paths = [ctx.snap.path(i) for i in partner_nodes]
        self.first = paths[0]
        self.shared = ctx.h.common_level(paths) if len(paths) > 1 else len(self.first) - 1

    def __call__(self, i: int) -> object:
        if i in self.partner:
            return ("node", i)
        ctx = self.ctx
        path = ctx.snap.path(i)
        for level in range(self.shared, -1, -1):
            if self.first[level] is not None and tuple(path[: level + 1]) == tuple(self.first[: level + 1]):
                if ctx.h.levels[level].fabric:
                    return ("fabric", level, clique_gbps(ctx.snap.nodes[i].graph))
                return ("level", level)
        return ("level", ANYWHERE)
