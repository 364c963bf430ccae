"""Candidates across several nodes: at each level of the hierarchy, the best-fitting domains.

For a pod set of several pods, from the finest level (clique, leaf, ...) up to the one it
requires, the search ranks every domain of the level by the speed class its fastest nodes
reach while together holding every pod (:class:`~extender.placement.search.rank.DomainRank`),
looks at the best :data:`CANDIDATES` node by node, and fills each from its fastest nodes
(:func:`_fill`: the best-fitting child domain that holds them all, else the roomiest
children first). It climbs to a coarser level only while a placement there could still cost
less than the best so far: :func:`_bound` is the least any placement spanning a domain of that
level can cost, every pod at the fastest bandwidth its tier allows and the network at the
level's switch bandwidth.

A domain's counts are read in two lookups: nodes alike for the search (speed class and the
coarsest level they may span) are grouped, each group is a list over the snapshot's node
order (where every domain is a range, ``domain_spans``) of its nodes' packed counts, and a
domain's sum is the difference of two prefix sums. The counts (pods that fit, free GPUs,
nodes) are packed in one int (:func:`pack`), so one addition sums all three.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from extender.cost import Comm
from extender.placement import hardware
from extender.placement.node_fit import fit_for
from extender.placement.request import PodSet
from extender.placement.scoring import ANYWHERE, Need, Span, node_scope, pod_set_cost, pods_talk
from extender.placement.search.capacity import CapacityTable
from extender.placement.search.context import Decision
from extender.placement.search.memory import Entry
from extender.placement.search.option import Links, Option, placement_price, slots_of
from extender.placement.search.rank import (
    DomainFit,
    DomainParts,
    Price,
    Speed,
    domain_rank,
    node_preference,
    quantize,
)
from extender.placement.search.rank import speeds as rank_speeds
from extender.topology.hierarchy import DomainKey

#: How many candidate domains per level are evaluated in full.
CANDIDATES = 4
#: Bits per field of packed counts (:func:`pack`): room for any cluster's GPUs.
FIELD_BITS = 32
_MASK = (1 << FIELD_BITS) - 1


def pack(pods: int, free: int, nodes: int) -> int:
    """Pods, free GPUs and nodes in one int, :data:`FIELD_BITS` bits each (pods lowest), so
    one addition adds all three; no field of a sum over a cluster overflows into the next."""
    return pods | free << FIELD_BITS | nodes << 2 * FIELD_BITS


def unpack(packed: int) -> tuple[int, int, int]:
    """(pods, free GPUs, nodes) of :func:`pack`."""
    return packed & _MASK, packed >> FIELD_BITS & _MASK, packed >> 2 * FIELD_BITS


def options(
    ctx: Decision,
    ps: PodSet,
    need: Need,
    caps: CapacityTable,
    links: Links,
    best: Price | tuple[int, float, float],
    ties: bool = False,
) -> list[Option]:
    """Placements across several nodes: at each level from the finest up to the required
    one, the best-fitting domains that hold every pod, while a coarser level could still beat
    (with ``ties``: match) ``best``, the best candidate so far."""
    snap, h = ctx.snap, ctx.h
    # Pods sharing one node are priced by that node's own links (single-node options); these
    # options span two nodes at least, so no node takes every pod.
    limit = ps.count - 1
    kinds = snap.kinds()
    rules = ctx.rules(ps) if ctx.aligning else None
    # Per class of nodes: the best ring bandwidth one pod gets, and the packed counts.
    per_class = ctx.memory.classes.speeds
    shape = (ps.gpus_per_pod, ps.count)
    # A pod set whose pods do not talk takes clique nodes last (they are off the fabric).
    quiet = ctx.has_fabric and not pods_talk(ps)
    # Nodes alike for the search below (same speed class and the same coarsest level they may
    # span): per group, pack(pods, free GPUs, 1) of each of its nodes at the node's rank in
    # the snapshot's order, where every domain is a range (domain_spans).
    groups: dict[tuple[int, float, int], list[int]] = {}
    size = len(snap.nodes)
    order = snap.order()
    for (kind, rule, entry), members in caps.groups.items():
        known = per_class.get((shape, kind, rule, entry))
        if known is None:
            packed = pack(min(entry[0], limit), entry[1].bit_count(), 1)
            pod_gbps = _pod_gbps(ctx, ps, members[0], entry)
            known = per_class[(shape, kind, rule, entry)] = (pod_gbps, packed)
        got, packed = known
        if not ctx.has_fabric:
            table = groups.get((0, got, ANYWHERE))
            if table is None:
                table = groups[(0, got, ANYWHERE)] = [0] * size
            for i in members:
                table[order[i]] = packed
            continue
        for i in members:
            floor = _multi_floor(ctx, ps, i)
            if floor is None:
                continue
            group = (1 if quiet and ctx.fabric_of(i) is not None else 0, got, floor)
            table = groups.get(group)
            if table is None:
                table = groups[group] = [0] * size
            table[order[i]] = packed
    # Prefix sums: a domain's sum per group is two lookups.
    prefix = [list(itertools.accumulate(t, initial=0)) for t in groups.values()]
    spans = snap.domain_spans()

    top_gbps = _top_gbps(ctx, ps, caps)
    least_loss = hardware.floor(snap, ps, rank_speeds(ctx, ps))
    by_level = ctx.domains_by_level
    opts: list[Option] = []
    for level in range(len(h.levels) - 1, max(need.scope, ANYWHERE) - 1, -1):
        fabric = level >= 0 and h.levels[level].fabric
        bound = (0, least_loss, quantize(_bound(ctx, ps, level, top_gbps, links)))
        if not fabric and (bound > best if ties else bound >= best):
            break
        domains: Sequence[tuple[DomainKey | None, list[int] | None]] = (
            [(None, None)] if level == ANYWHERE else by_level.get(level, [])
        )
        cap_gbps = _span_cap(ctx, ps, level)
        # The fastest nodes that together hold every pod; a faster node than the network
        # between them buys nothing, so those count as equal. Each domain is ranked from its
        # groups' sums; only the best few are then looked at node by node.
        speeds: dict[Speed, list[list[int]]] = {}
        for (off, g, floor), p in zip(groups, prefix, strict=True):
            if floor <= level:
                speeds.setdefault((off, -(g if g < cap_gbps else cap_gbps)), []).append(p)
        ranks = sorted(speeds.items(), key=lambda r: r[0])
        pods, gpus = ps.count, ps.count * ps.gpus_per_pod
        found: list[tuple[DomainParts, list[int] | None]] = []
        for key, listed in domains:
            lo, hi = (0, size) if key is None else spans[key]
            # Packed sums add field by field (no field overflows into the next). The fastest
            # groups first, until they hold every pod; a domain whose groups never do cannot
            # hold the pod set.
            total = 0
            for speed, tables in ranks:
                for p in tables:
                    total += p[hi] - p[lo]
                if total & _MASK >= pods:
                    _, free, count = unpack(total)
                    found.append(((speed, free - gpus, count), listed))
                    break
        found.sort(key=lambda f: f[0])
        for n, (parts, listed) in enumerate(found[:CANDIDATES]):
            domain = domain_rank(parts)
            if n and not fabric and not ties and bound >= best:
                break  # one candidate already costs the least any domain here can
            threshold = domain.speed
            members = list(caps) if listed is None else listed
            rank: dict[int, Speed] = {}
            gbps: dict[int, float] = {}
            capped: dict[int, Entry] = {}
            for i in members:
                here = caps.get(i)
                if here is None:
                    continue
                if ctx.has_fabric and not _multi_usable(ctx, ps, i, level):
                    continue
                off = 1 if quiet and ctx.fabric_of(i) is not None else 0
                rule = rules[i] if rules is not None else None
                gbps[i] = g = per_class[(shape, kinds[i], rule, here)][0]
                rank[i] = r = (off, -(g if g < cap_gbps else cap_gbps))
                if r <= threshold:
                    capped[i] = (here[0] if here[0] < limit else limit, here[1], here[2])
            fast = sorted(capped, key=rank.__getitem__)
            # Off-fabric nodes first: every non-clique node is used before any clique node.
            first = [i for i in fast if rank[i][0] < threshold[0]]
            assignment = {i: capped[i][0] for i in first}
            rest = [i for i in fast if i not in assignment]
            need_rest = ps.count - sum(assignment.values())
            if need_rest > 0:
                assignment.update(_fill(ctx, ps, rest, level + 1, need_rest, capped, gbps))
            opt = _realise(ctx, ps, assignment, capped, links, level, domain.fit)
            opts.append(opt)
            best = min(best, opt.price)
    return opts


def _fill(
    ctx: Decision,
    ps: PodSet,
    nodes: list[int],
    level: int,
    need: int,
    caps: Mapping[int, Entry],
    gbps: Mapping[int, float],
) -> dict[int, int]:
    """Spread ``need`` pods over ``nodes`` (all in one domain above ``level``): the
    best-fitting child domain that holds them all, else the roomiest children first."""
    if level >= len(ctx.h.levels):
        return _fill_nodes(ctx, ps, nodes, need, caps, gbps)
    groups: dict[object, list[int]] = {}
    for i in nodes:
        label = ctx.snap.path(i)[level]
        groups.setdefault(label if label is not None else ("unlabelled", i), []).append(i)
    if len(groups) == 1:
        return _fill(ctx, ps, nodes, level + 1, need, caps, gbps)
    cap_of = {k: sum(caps[i][0] for i in v) for k, v in groups.items()}
    out: dict[int, int] = {}
    pool = sorted(groups, key=lambda k: (-cap_of[k], str(k)))
    remaining = need
    # Roomiest first: once one child holds the rest, those that do are the ones up to the
    # first that does not.
    for n, k in enumerate(pool):
        if remaining <= 0:
            break
        if cap_of[k] >= remaining:
            fitting = [c for c in pool[n:] if cap_of[c] >= remaining]
            best = min(fitting, key=lambda c: (cap_of[c], str(c)))
            out.update(_fill(ctx, ps, groups[best], level + 1, remaining, caps, gbps))
            return out
        out.update(_fill(ctx, ps, groups[k], level + 1, cap_of[k], caps, gbps))
        remaining -= cap_of[k]
    assert remaining <= 0, "the domains hold fewer pods than counted"
    return out


def _fill_nodes(
    ctx: Decision,
    ps: PodSet,
    nodes: list[int],
    need: int,
    caps: Mapping[int, Entry],
    gbps: Mapping[int, float],
) -> dict[int, int]:
    """Spread ``need`` pods over ``nodes``: the roomiest, fastest, most preferred first; once
    one node holds the rest, the tightest of those that do."""
    out: dict[int, int] = {}
    order = ctx.snap.order()
    pref = {i: node_preference(ps, i, ctx) for i in nodes}
    pool = sorted(nodes, key=lambda i: (-caps[i][0], -gbps[i], -pref[i], order[i]))
    remaining = need
    for n, i in enumerate(pool):  # roomiest first, as in _fill
        if remaining <= 0:
            break
        if caps[i][0] >= remaining:
            fitting = [j for j in pool[n:] if caps[j][0] >= remaining]
            best = min(fitting, key=lambda j: (caps[j][0], -gbps[j], -pref[j], order[j]))
            out[best] = remaining
            return out
        out[i] = caps[i][0]
        remaining -= caps[i][0]
    assert remaining <= 0, "the nodes hold fewer pods than counted"
    return out


def _realise(
    ctx: Decision,
    ps: PodSet,
    assignment: dict[int, int],
    caps: Mapping[int, Entry],
    links: Links,
    level: int,
    fit: DomainFit,
) -> Option:
    """The option that puts ``assignment[i]`` pods on each node ``i``."""
    snap, h = ctx.snap, ctx.h
    placed: list[tuple[int, int]] = []
    masks: dict[int, int] = {}
    for i in sorted(assignment, key=lambda j: snap.nodes[j].name):
        _, free, tier = caps[i]
        picked = ctx.fit(i, ps).pick(free, ps.gpus_per_pod, tier, assignment[i])
        if picked is None:  # capacity said it fits; pick must agree
            raise AssertionError(f"node {snap.nodes[i].name}: cannot pick {assignment[i]} pods")
        for m in picked:
            placed.append((i, m))
            masks[i] = masks.get(i, 0) | m
    slots = slots_of(ctx, ps, placed)
    waste, loss, cost = placement_price(ctx, ps, slots, links)
    if len(masks) == 1:
        (i,) = masks
        where, level = f"node {snap.nodes[i].name}", node_scope(h)
    else:
        common = h.common_level([snap.path(i) for i in masks])
        level = max(level, common)
        where = "cluster" if level == ANYWHERE else h.describe(ctx.domain_key(next(iter(masks)), level))
    kinds = frozenset(snap.nodes[i].shape.key for i in masks)
    return Option(slots, masks, level, where, waste, cost, fit, kinds=kinds, hardware=loss)


def _multi_floor(ctx: Decision, ps: PodSet, i: int) -> int | None:
    """The coarsest level at which node ``i`` may be one of several nodes of ``ps``
    (ANYWHERE: any; None: none), as :func:`_multi_usable` rules."""
    fd = ctx.fabric_of(i)
    if fd is None or not pods_talk(ps):
        return ANYWHERE
    return len(fd) - 1 if ctx.owns_mnnvl(i) else None


def _multi_usable(ctx: Decision, ps: PodSet, i: int, level: int) -> bool:
    """May node ``i`` be one of several nodes of ``ps`` spanning a domain at ``level``? For a
    pod set whose pods talk, a clique node only inside its own clique (all-or-nothing), and
    only while no other gang holds its NVLink (IMEX) channel; a pod set whose pods do not talk
    uses no NVLink across nodes and may take any node."""
    fd = ctx.fabric_of(i)
    if fd is None or not pods_talk(ps):
        return True
    return level >= len(fd) - 1 and ctx.owns_mnnvl(i)


def _pod_gbps(ctx: Decision, ps: PodSet, i: int, entry: Entry) -> float:
    """The best ring bandwidth one pod of ``ps`` gets on node ``i`` now, GB/s."""
    _, free, tier = entry
    key = (ps.gpus_per_pod, ctx.snap.kinds()[i], free, tier, ctx.rule(i, ps))
    table = ctx.memory.classes.gbps
    got = table.get(key)
    if got is None:
        fit = ctx.fit(i, ps)
        picked = fit.pick(free, ps.gpus_per_pod, tier, 1)
        got = table[key] = fit.gbps(picked[0]) if picked else 0.0
    return got


def _top_gbps(ctx: Decision, ps: PodSet, caps: CapacityTable) -> float:
    """At least the best ring bandwidth a pod of ``ps`` gets on any of these nodes (GB/s): the
    fastest GPU set its tier allows on each node type."""
    kinds = {(kind, entry[2]): members[0] for (kind, _, entry), members in caps.groups.items()}
    best = 0.0
    tops = ctx.memory.classes.tops
    for (kind, tier), i in kinds.items():
        top = tops.get((kind, ps.gpus_per_pod, tier))
        if top is None:
            fit = fit_for(ctx.snap.nodes[i].shape)
            top = tops[(kind, ps.gpus_per_pod, tier)] = max(
                (fit.gbps(m) for m in fit.subsets(ps.gpus_per_pod, tier)), default=0.0
            )
        best = max(best, top)
    return best


def _span_cap(ctx: Decision, ps: PodSet, level: int) -> float:
    """Above this pod bandwidth (GB/s), a faster node no longer helps a pod set spanning
    ``level``: an all-reduce or all-to-all ring is as slow as the network between the nodes."""
    if ps.comm in (Comm.ALLREDUCE, Comm.ALLTOALL) and not (level >= 0 and ctx.h.levels[level].fabric):
        return ctx.h.switch_gbps(level)
    return float("inf")


def _bound(ctx: Decision, ps: PodSet, level: int, pod_gbps: float, links: Links) -> float:
    """The least any placement of ``ps`` across nodes of a domain at ``level`` can cost, us."""
    span = Span(ctx.h.switch_gbps(level), True, False)
    kv = Span(float("inf"), False, True) if links.partner else None
    return pod_set_cost(ps, [pod_gbps] * ps.count, span, kv)
