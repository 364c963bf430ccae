"""One pod set's candidates: every placement the generators find, judged and ranked.

For a pod set, given what the pod sets placed before it on this branch took, the phase asks
the one-node and the across-nodes generators for placements: on every node that holds one of
its pods, and when the pod set keeps a preferred tier, first with that tier; and, when a
colocateWith wish binds it to a pod set already placed (its own, or one of a pod set that
colocates with it: a wish binds both sides, whichever the search places first), first on the
nodes that keep the wish. Each placement is then judged for the soft wishes it misses
(preferred level and tier, colocation), the room it leaves for the pod sets that colocate
with it, and the whole nodes it breaks into; the list is ranked by
:class:`~extender.placement.search.rank.OptionRank`, and the wishes an option misses are said
in its notes with what keeping them would cost. No placement: a
:class:`~extender.placement.search.option.Shortfall`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from extender.cost import Comm
from extender.placement.node_fit import fit_for
from extender.placement.request import PodSet
from extender.placement.scoring import Need, node_scope, pod_set_micros
from extender.placement.search import across_nodes, one_node
from extender.placement.search.capacity import (
    CapacityTable,
    colocation_nodes,
    kv_short,
    restricted,
    room_for,
    table,
)
from extender.placement.search.context import Decision, Taken
from extender.placement.search.option import Links, Option, Shortfall
from extender.placement.search.rank import COLOCATE, NO_FIT, PREFERRED
from extender.placement.slice import PodSlot

#: The options placed so far on a branch, by pod set name.
Placed = Mapping[str, Option]


def options(ctx: Decision, ps: PodSet, taken: Taken, placed: Placed) -> list[Option] | Shortfall:
    """Every candidate placement of ``ps`` found, best first; or why there is none."""
    if ps.gpus_per_pod == 0:
        got = _gpuless(ctx, ps, taken, placed)
        return [got] if isinstance(got, Option) else got
    need = ctx.needs[ps.name]
    gang = ctx.gang
    colo = ps.colocate_with
    partner: tuple[PodSlot, ...] = placed[colo.pod_set].slots if colo and colo.pod_set in placed else ()
    within, wish = _colocation_scope(ctx, ps, placed)
    links = Links(
        partner if ps.comm == Comm.KV_TRANSFER else (),
        tuple(
            (d, placed[d.name].slots)
            for d in gang.pod_sets
            if d.comm == Comm.KV_TRANSFER
            and d.colocate_with
            and d.colocate_with.pod_set == ps.name
            and d.name in placed
        ),
    )
    dependents = [
        d
        for d in gang.pod_sets
        if d.colocate_with and d.colocate_with.pod_set == ps.name and d.name not in placed
    ]
    found: dict[tuple[tuple[int, int], ...], Option] = {}
    shortfall: Shortfall | None = None
    within_found = False
    for preferred in (True, False) if need.preferred_tier is not None else (False,):
        every = table(ctx, ps, need, taken, preferred)
        for restrict in (within, None) if within is not None else (None,):
            caps = every if restrict is None else restricted(ctx, ps, every, restrict)
            opts = _generate(ctx, ps, need, caps, taken, links, dependents)
            if not opts and not preferred and restrict is None:
                shortfall = Shortfall(ps, need, caps)
            within_found = within_found or (restrict is not None and bool(opts))
            for o in opts:
                found.setdefault(tuple(sorted(o.masks.items())), o)
    if not found:
        assert shortfall is not None
        return shortfall
    opts = [_judge(ctx, ps, need, o, within, dependents, taken) for o in found.values()]
    opts.sort(key=Option.rank)
    return [dataclasses.replace(o, notes=_wish_notes(ps, o, opts, within_found, wish)) for o in opts]


def _generate(
    ctx: Decision,
    ps: PodSet,
    need: Need,
    caps: CapacityTable,
    taken: Taken,
    links: Links,
    dependents: Sequence[PodSet],
) -> list[Option]:
    """The one-node candidates, then (for several pods that may span nodes) those across
    nodes; the nodes looked at are spent from the decision's work budget."""
    ctx.budget.spend(len(caps))
    opts = one_node.options(ctx, ps, caps, links, dependents, taken)
    if ps.count > 1 and need.scope < node_scope(ctx.h) and caps:
        best = min((o.price for o in opts), default=(0, float("inf"), float("inf")))
        # A set that hands KV caches to sets not placed yet: spreading it over several nodes
        # at no cost of its own lets each of their pods sit next to one of its pods, so
        # placements that only tie the best so far are kept too.
        ties = any(d.comm == Comm.KV_TRANSFER for d in dependents)
        opts.extend(across_nodes.options(ctx, ps, need, caps, links, best, ties))
    return opts


def _gpuless(ctx: Decision, ps: PodSet, taken: Taken, placed: Placed) -> Option | Shortfall:
    """Pods without GPUs go next to their colocateWith set when it is placed, else to a node
    the gang already uses, else to the first node; each to the first of those its filters
    admit and that has room (NodeResourcesFit), then any other such node."""
    snap = ctx.snap
    c = ps.colocate_with
    first: list[int] = []
    if c is not None and c.pod_set in placed:
        first = [snap.index(s.node) for s in placed[c.pod_set].slots]
    first += sorted(taken.gpus)
    admitted = snap.admitted(ps.node_needs)
    rest = range(len(snap.nodes))
    slots: list[PodSlot] = []
    names: list[str] = []
    for i in dict.fromkeys([*first, *rest]):
        if admitted is not None and i not in admitted:
            continue
        room = min(snap.room(i, ps.requests, taken.used.get(i)), ps.count - len(slots))
        name = snap.nodes[i].name
        slots += [PodSlot(ps.name, len(slots) + k, name, ()) for k in range(room)]
        if room:
            names.append(name)
        if len(slots) == ps.count:
            break
    if len(slots) < ps.count:
        return Shortfall(ps, ctx.needs[ps.name], None, len(slots))
    cost = pod_set_micros(snap, ps, slots)
    where = f"node {names[0]}" if len(names) == 1 else "cluster"
    return Option(tuple(slots), {}, node_scope(ctx.h), where, 0, cost, NO_FIT)


def _judge(
    ctx: Decision,
    ps: PodSet,
    need: Need,
    o: Option,
    within: set[int] | None,
    dependents: Sequence[PodSet],
    taken: Taken,
) -> Option:
    """The soft wishes an option misses, and whether it leaves room for colocated sets."""
    snap = ctx.snap
    misses: list[str] = []
    nodes = sorted(o.masks) or [snap.index(s.node) for s in o.slots]
    if need.preferred_tier is not None:
        shapes = [snap.node(s.node).shape for s in o.slots]
        if any(
            sh.tier_of(fit_for(sh).mask_of(s.gpus)) > need.preferred_tier
            for sh, s in zip(shapes, o.slots, strict=True)
        ):
            misses.append(PREFERRED)
    if need.preferred_scope is not None and len(nodes) > 1:
        level = ctx.h.common_level([snap.path(i) for i in nodes])
        if need.preferred_scope >= node_scope(ctx.h) or level < need.preferred_scope:
            misses.append(PREFERRED)
    if within is not None and not set(nodes) <= within:
        misses.append(COLOCATE)
    no_room = bool(dependents) and not room_for(ctx, dependents, o.masks, taken, nodes)
    short = kv_short(ctx, dependents, o.masks, taken)
    opened = sum(1 for i in o.masks if _whole(ctx, i, taken))
    return dataclasses.replace(
        o, misses=tuple(dict.fromkeys(misses)), no_room=no_room, kv_short=short, opened=opened
    )


def _whole(ctx: Decision, i: int, taken: Taken) -> bool:
    """Whether node ``i`` has every GPU free (none taken, by others or by this gang)."""
    node = ctx.snap.nodes[i]
    return not taken.gpus.get(i, 0) and ctx.snap.free_mask(i).bit_count() == node.shape.size


def _wish_notes(
    ps: PodSet,
    chosen: Option,
    opts: Sequence[Option],
    within_found: bool,
    wish: tuple[str, str] | None,
) -> tuple[str, ...]:
    """Say where a pod set went when it missed a wish, and what keeping the wish would cost."""
    out = []
    where = chosen.where
    for miss in chosen.misses:
        kept = next((o for o in opts if miss not in o.misses), None)
        cost = ""
        if kept is not None and kept.waste > chosen.waste:
            cost = f" would take {kept.waste} GPUs of a multi-node NVLink clique without using its NVLink"
        elif kept is not None:
            cost = f" would cost {kept.cost:.1f} us/layer, not {chosen.cost:.1f}"
        if miss == PREFERRED:
            text = f"pod set {ps.name}: preferred level {ps.preferred_level} not met; placed within {where}"
            if kept:
                text += f" (keeping it{cost})"
        else:
            assert wish is not None
            partner, level = wish
            if within_found and kept:
                text = f"pod set {ps.name}: placed apart from {partner}, within {where}: sharing a {level}"
                text += cost
            else:
                text = f"pod set {ps.name}: could not share a {level} with {partner}; placed within {where}"
        out.append(text)
    return tuple(out)


def _colocation_scope(
    ctx: Decision, ps: PodSet, placed: Placed
) -> tuple[set[int] | None, tuple[str, str] | None]:
    """The nodes ``ps`` must stay within to keep the colocateWith wishes that join it to pod
    sets already placed: its own (next to its colocateWith set) and those of the pod sets
    that colocate with it and were placed first (a wish binds both sides, whichever the
    search places first), with the first such wish as (other pod set, level). None: no such
    wish is judged yet."""
    scope: set[int] | None = None
    wish: tuple[str, str] | None = None
    pairs = [(ps.colocate_with.pod_set, ps.colocate_with.level)] if ps.colocate_with else []
    pairs += [
        (d.name, d.colocate_with.level)
        for d in ctx.gang.pod_sets
        if d.colocate_with and d.colocate_with.pod_set == ps.name
    ]
    for other, level in pairs:
        if other not in placed or not placed[other].slots:
            continue
        nodes = colocation_nodes(ctx, ctx.slot_nodes(placed[other].slots), level)
        if nodes is not None:
            scope = nodes if scope is None else scope & nodes
            wish = wish or (other, level)
    return scope, wish
