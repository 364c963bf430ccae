"""Explain a refusal: the words of a :class:`~extender.placement.search.option.Shortfall`.

Built only for the failure finally reported, from the capacity table the pod set was refused
on: what the pod set needs (its pods' GPUs and tier), the domain at its required level that
comes closest and how many pods it is short (under the clique rules: one node, one clique,
or the nodes outside cliques together), then why nodes are out besides their GPUs:
kube-scheduler's filters (taints, cordon, node affinity, NodeResourcesFit), room kept for the
IMEX daemon pod on clique nodes, cliques held by another gang's ComputeDomain, the device
plugin's answer where it breaks the pod set's tier, and the kubelet's Topology Manager where
it refuses a pod the GPUs alone would take.

The answer is (reason, closest domain or None, pods short), as ``Unplaceable`` carries it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from extender.placement import choice, feasibility
from extender.placement.node_fit import fit_for
from extender.placement.numa_fit import NumaRule, refusal
from extender.placement.request import PodSet
from extender.placement.scoring import ANYWHERE, Need, node_scope, pod_tier, pods_talk, room_taken
from extender.placement.search.context import Decision
from extender.placement.search.memory import Entry
from extender.placement.search.option import Shortfall

#: (reason, the closest domain or None, pods short).
Why = tuple[str, str | None, int]


def explain(ctx: Decision, shortfall: Shortfall) -> Why:
    """Why ``shortfall``'s pod set has no placement."""
    ps, need = shortfall.pod_set, shortfall.need
    if shortfall.caps is None:
        have = shortfall.have
        return (
            f"pod set {ps.name}: the cluster has room for {have} of {ps.count} pods without GPUs"
            + _refused_words(ctx, ps),
            None,
            ps.count - have,
        )
    reason, closest, short_by = _reason(ctx, ps, need, shortfall.caps.table())
    return _numa_reason(ctx, ps, need, (reason + _plugin_note(ctx, ps, need), closest, short_by))


def _reason(ctx: Decision, ps: PodSet, need: Need, caps: Mapping[int, Entry]) -> Why:
    """Why ``ps`` has no placement on ``caps``: the reason, the closest domain, pods short."""
    snap, h = ctx.snap, ctx.h
    words = _tier_words(ctx, ps, need)
    what = f"{ps.count} pods of {ps.gpus_per_pod} free {words}GPU{'s' if ps.gpus_per_pod != 1 else ''}"
    largest = max((n.shape.size for n in snap.nodes), default=0)
    if ps.gpus_per_pod > largest:
        return (
            f"pod set {ps.name}: no node has {ps.gpus_per_pod} GPUs (the largest has {largest})",
            None,
            ps.count,
        )
    if need.scope >= node_scope(h):
        single = max(((c[0], i) for i, c in caps.items()), default=None)
        roomiest = (single[0], f"node {snap.nodes[single[1]].name}") if single else None
        return _shortfall_reason(ctx, ps, "node", what, roomiest)
    if need.scope == ANYWHERE:
        have, where = _room_in(ctx, ps, sorted(caps), caps)
        if not pods_talk(ps) or not any(ctx.fabric_of(i) for i in caps):
            return _shortfall_reason(ctx, ps, None, what, (have, "cluster"))
        return _shortfall_reason(ctx, ps, "clique, nor the nodes outside cliques,", what, (have, where))
    best: tuple[int, str] | None = None
    for key, members in snap.domains().items():
        if key[0] == need.scope:
            have, _ = _room_in(ctx, ps, [i for i in members if i in caps], caps)
            if have and (best is None or have > best[0]):
                best = (have, h.describe(key))
    return _shortfall_reason(ctx, ps, h.levels[need.scope].name, what, best)


def _room_in(ctx: Decision, ps: PodSet, nodes: Sequence[int], caps: Mapping[int, Entry]) -> tuple[int, str]:
    """How many pods of a pod set these nodes hold at most, under the clique rules: one node,
    one clique, or the nodes outside cliques together; and which of those it is. A pod set
    whose pods do not talk is under no clique rule: all of them together."""
    if not pods_talk(ps):
        return (sum(caps[i][0] for i in nodes), "cluster")
    best = (0, "cluster")
    groups: dict[tuple[str | None, ...] | None, int] = {}
    for i in nodes:
        cap = caps[i][0]
        if cap > best[0]:
            best = (cap, f"node {ctx.snap.nodes[i].name}")
        fd = ctx.fabric_of(i)
        if fd is None or ctx.owns_mnnvl(i):
            groups[fd] = groups.get(fd, 0) + cap
    for fd, cap in groups.items():
        if cap > best[0]:
            best = (cap, "the nodes outside cliques" if fd is None else ctx.h.describe((len(fd) - 1, fd)))
    return best


def _shortfall_reason(
    ctx: Decision, ps: PodSet, level: str | None, what: str, best: tuple[int, str] | None
) -> Why:
    have, where = best if best is not None else (0, None)
    need_more = ps.count - have
    if level is None:
        reason = f"pod set {ps.name}: the cluster has room for {have} of {what} (needs {need_more} more)"
    elif where is None:
        reason = f"pod set {ps.name}: no {level} has room for {what}"
    else:
        reason = (
            f"pod set {ps.name}: no {level} has room for {what}; best is {where} "
            f"with {have} (needs {need_more} more)"
        )
    return reason + _refused_words(ctx, ps), where, need_more


def _refused_words(ctx: Decision, ps: PodSet) -> str:
    """``; kube-scheduler's filters refuse 3 of 8 nodes: 2 by TaintToleration (...)``, or
    nothing when they refuse none."""
    snap = ctx.snap
    refused = snap.refusals(ps.node_needs)
    admitted = snap.admitted(ps.node_needs)
    daemon: list[str] = []
    if snap.limits_resources:
        for i, n in enumerate(snap.nodes):
            if admitted is None or i in admitted:
                r = feasibility.room_refusal(ps.requests, n.facts)
                if r is not None:
                    refused.append(r)
                elif feasibility.room_refusal(
                    ps.requests, n.facts, room_taken(snap, ctx.gang.name, ps, i, None) or feasibility.NOTHING
                ):
                    daemon.append(n.name)
    words = ""
    if refused:
        words = (
            f"; kube-scheduler's filters refuse {len(refused)} of {len(snap.nodes)} nodes for its pods: "
            + feasibility.summarize(refused)
        )
    if daemon:
        words += (
            f"; {len(daemon)} clique nodes have no room for a pod next to the IMEX daemon pod of "
            f"the gang's ComputeDomain ({', '.join(daemon[:3])}{', ...' if len(daemon) > 3 else ''})"
        )
    return words + _domain_words(ctx, ps)


def _domain_words(ctx: Decision, ps: PodSet) -> str:
    """``; 2 clique nodes belong to a ComputeDomain of someone else: t0 (ComputeDomain ...)``
    for a pod set whose pods talk, or nothing."""
    if not ctx.has_fabric or not pods_talk(ps):
        return ""
    foreign = [(n.name, n.foreign_domain) for n in ctx.snap.nodes if n.foreign_domain is not None]
    if not foreign:
        return ""
    shown = ", ".join(f"{name} ({why})" for name, why in foreign[:3])
    return (
        f"; {len(foreign)} clique nodes belong to a ComputeDomain of someone else, which NVIDIA's "
        f"driver lets no second domain join: {shown}{', ...' if len(foreign) > 3 else ''}"
    )


def _tier_words(ctx: Decision, ps: PodSet, need: Need) -> str:
    if need.tier is not None:
        words = need.tier.words
    else:
        tiers = {fit_for(n.shape).tightest(ps.gpus_per_pod) for n in ctx.snap.nodes}
        found = [t for t in tiers if t is not None]
        words = min(found).words if found else ""
    return f"{words} " if words else ""


def _numa_reason(ctx: Decision, ps: PodSet, need: Need, why: Why) -> Why:
    """``why`` with the nodes whose kubelet Topology Manager leaves no room for a pod of
    ``ps`` that its GPUs alone would (the first one's reason in full)."""
    if not ctx.aligning:
        return why
    snap = ctx.snap
    first: str | None = None
    refused = 0
    admitted = snap.admitted(ps.node_needs)
    kinds, frees = snap.kinds(), snap.free_masks()
    seen: dict[tuple[str, int, NumaRule], bool] = {}
    for i, node in enumerate(snap.nodes):
        rule = ctx.rule(i, ps)
        if rule is None or (admitted is not None and i not in admitted):
            continue
        key = (kinds[i], frees[i], rule)
        if key not in seen:
            tier = pod_tier(snap, i, ps, need)
            fits = tier is not None and choice.capacity(node, frees[i], ps.gpus_per_pod, tier) > 0
            seen[key] = fits and refusal(node, ps, frees[i], tier) is not None
        if seen[key]:
            refused += 1
            if first is None:
                first = refusal(node, ps, frees[i], pod_tier(snap, i, ps, need))
    if first is None:
        return why
    others = refused - 1
    more = f" (and {others} more node{'s' if others > 1 else ''})" if others else ""
    return (f"{why[0]}; the kubelet would refuse it: {first}{more}", why[1], why[2])


def _plugin_note(ctx: Decision, ps: PodSet, need: Need) -> str:
    """When the device plugin is why a node is out: the first device-plugin node (in the
    tie-break order) that gangslice's own choice would give more of these pods, and the answer
    of the plugin that breaks the pod set's tier there."""
    snap = ctx.snap
    gpus = ps.gpus_per_pod
    admitted = snap.admitted(ps.node_needs)
    order, kinds, nodes = snap.order(), snap.kinds(), snap.nodes
    seen: set[tuple[str, int]] = set()  # one look per node type and free GPUs
    for i in sorted((i for i, n in enumerate(nodes) if n.plugin), key=order.__getitem__):
        node, free = nodes[i], snap.free_mask(i)
        if free.bit_count() < gpus or (admitted is not None and i not in admitted):
            continue
        if (kinds[i], free) in seen:
            continue
        seen.add((kinds[i], free))
        tier = pod_tier(snap, i, ps, need)
        if tier is None:
            continue
        served = choice.capacity(node, free, gpus, tier)
        own = min(ps.count, fit_for(node.shape).capacity(free, gpus, tier))
        if served < own:
            why = choice.reason(node, free, gpus, tier, served + 1)
            if why:
                return f"; node {node.name}'s free GPUs hold {own} such pods, but {why}"
    return ""
