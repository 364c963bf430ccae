"""Search: the pod sets placed one after another, a few placements of each carried forward.

Pod sets are placed in one order on a shared view of what this gang took (:class:`Taken`);
the :data:`~extender.placement.search.context.BEAM` best placements of every pod set but the
last are each carried forward (:func:`carried`), and the best finished slice by
:class:`~extender.placement.search.rank.SliceRank` wins, so a gang's total cost and its
colocations are judged as a whole. :func:`orders` gives the orders to try: pod sets others
colocate with first, then the largest, then every other order (the driver tries them all for
gangs of few pod sets). Once the decision's work budget is spent no further branch is opened.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from extender.placement import feasibility
from extender.placement.request import GangRequest, PodSet
from extender.placement.search import pod_set
from extender.placement.search.context import Decision, Taken
from extender.placement.search.finish import Finished, finish
from extender.placement.search.option import Option, Shortfall
from extender.placement.search.rank import Price

#: At most this many orders after the first are looked at.
MAX_ORDERS = 24


def orders(gang: GangRequest) -> Iterable[Sequence[PodSet]]:
    """Pod sets others colocate with first, then the largest; then every other order."""
    anchors = {ps.colocate_with.pod_set for ps in gang.pod_sets if ps.colocate_with}
    default = sorted(gang.pod_sets, key=lambda ps: (ps.name not in anchors, -ps.gpus, ps.name))
    yield default
    for i, perm in enumerate(itertools.permutations(default)):
        if i >= MAX_ORDERS:
            break
        if list(perm) != default:
            yield perm


def search(ctx: Decision, order: Sequence[PodSet], width: int) -> Finished | Shortfall:
    """Place the pod sets in ``order``, carrying the ``width`` best placements of every pod
    set but the last forward; the best complete slice wins, else the first failure met."""
    best: list[Finished] = []
    failure: list[Shortfall] = []

    def go(k: int, taken: Taken, placed: dict[str, Option]) -> None:
        if k == len(order):
            done = finish(ctx, placed)
            if not best or done.rank < best[0].rank:
                best[:] = [done]
            return
        ps = order[k]
        got = pod_set.options(ctx, ps, taken, placed)
        if isinstance(got, Shortfall):
            if not failure:
                failure.append(got)
            return
        for n, opt in enumerate(carried(got, width if k < len(order) - 1 else 1)):
            if n and ctx.budget.exhausted:
                break
            trial = taken.copy()
            commit(ctx, opt, trial, ps)
            go(k + 1, trial, {**placed, ps.name: opt})

    go(0, Taken(), {})
    if best:
        return best[0]
    return failure[0]


def commit(ctx: Decision, opt: Option, taken: Taken, ps: PodSet) -> None:
    """Add what ``opt`` takes (its GPUs, and where nodes limit resources its pods' requests)
    to ``taken``."""
    for i, mask in opt.masks.items():
        taken.gpus[i] = taken.gpus.get(i, 0) | mask
    if ctx.snap.limits_resources:
        one = feasibility.usage(ps.requests)
        for slot in opt.slots:
            i = ctx.snap.index(slot.node)
            taken.used[i] = taken.used.get(i, feasibility.NOTHING).plus(one)


def carried(opts: Sequence[Option], width: int) -> list[Option]:
    """The ``width`` best options, skipping those that only repeat a better one (same price on
    the same node types), plus the best one that leaves room for colocated pod sets."""
    out: list[Option] = []
    # Options that differ in how many nodes they span are different shapes of answer (a
    # prefill set on one node or spread so that each decode pod can sit next to one of its
    # pods) even at the same price: each gets its own place in the beam.
    seen: set[tuple[Price, frozenset[str], int]] = set()
    for o in opts:
        shape = (o.price, o.kinds, len(o.masks))
        if len(out) < width and shape not in seen:
            out.append(o)
            seen.add(shape)
    out.extend([o for o in opts if o not in out][: width - len(out)])
    out.sort(key=Option.rank)
    if width > 1 and all(o.no_room for o in out):
        out.extend(o for o in opts if not o.no_room)
        out = out[: width + 1]
    return out
