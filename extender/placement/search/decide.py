"""The decision: a gang's slice, or why it has none, run as the search's named phases.

1. **Context.** One :class:`~extender.placement.search.context.Decision` for the gang: the
   snapshot, each pod set's resolved rules, the work budget, this decision's tables and the
   memory the caller owns.
2. **Order.** The pod set orders to try (:func:`~extender.placement.search.beam.orders`):
   every one for gangs of up to :data:`ALL_ORDERS_UP_TO` pod sets (each with a beam of
   :data:`~extender.placement.search.context.BEAM`), the first alone for larger gangs
   unless it fails; widening stops once the work budget is spent.
3. **Search.** Per order, :func:`~extender.placement.search.beam.search` places the pod sets
   one after another from their ranked candidates
   (:mod:`~extender.placement.search.pod_set`) and
4. **finishes** each complete branch into a ranked slice
   (:mod:`~extender.placement.search.finish`); the best slice over all orders wins.
5. **Fallback.** A small gang no order places, each of whose pod sets fits alone, goes to the
   exact search (:mod:`extender.placement.exact`), so the solver does not call a gang
   unplaceable while a slice exists.
6. **Explain.** Otherwise the first failure met is put into words
   (:mod:`~extender.placement.search.explain`), and the memory says whether the gang would
   fit the cluster emptied (solved once per topology and pod sets).
"""

from __future__ import annotations

from extender.placement.exact import exact_slice
from extender.placement.request import GangRequest
from extender.placement.search import beam, pod_set
from extender.placement.search.context import BEAM, Decision, Taken
from extender.placement.search.explain import explain
from extender.placement.search.finish import Finished
from extender.placement.search.memory import SolverMemory
from extender.placement.search.option import Shortfall
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot

#: Gangs of more pod sets are placed in one order first, trying others only on failure.
ALL_ORDERS_UP_TO = 3


def decide(
    snapshot: ClusterSnapshot,
    gang: GangRequest,
    *,
    exact_fallback: bool = True,
    memory: SolverMemory | None = None,
) -> Placement:
    """Place ``gang`` on ``snapshot`` (reserved capacity already excluded from it).

    ``memory`` is what earlier decisions learnt (by default the one the snapshot carries);
    ``exact_fallback`` turns the exact search for small gangs on (the default) or off (to
    measure the candidate search on its own). Raises LevelError for a level the hierarchy
    does not know."""
    ctx = Decision.of(snapshot, gang, memory, exact_fallback)
    best: Finished | None = None
    first_failure: Shortfall | None = None
    try_all = len(gang.pod_sets) <= ALL_ORDERS_UP_TO
    for order in beam.orders(gang):
        result = beam.search(ctx, order, BEAM if try_all else 1)
        if isinstance(result, Finished):
            if best is None or result.rank < best.rank:
                best = result
            if not try_all or ctx.budget.exhausted:
                break
        elif first_failure is None:
            first_failure = result
    if best is not None:
        return best.slice
    assert first_failure is not None
    if exact_fallback and _each_fits_alone(ctx):
        exact = exact_slice(snapshot, gang, ctx.needs)
        if exact is not None:
            return exact
    reason, closest, short_by = explain(ctx, first_failure)
    return Unplaceable(
        gang=gang.name,
        reason=reason,
        pod_set=first_failure.pod_set.name,
        closest=closest,
        short_by=short_by,
        feasible_when_empty=ctx.memory.empty_fits.fits(
            snapshot,
            gang,
            exact_fallback,
            lambda empty: isinstance(
                decide(empty, gang, exact_fallback=exact_fallback, memory=ctx.memory), Slice
            ),
        ),
    )


def _each_fits_alone(ctx: Decision) -> bool:
    """Whether every pod set has a placement on its own. The candidate search is complete for
    one pod set alone (node capacities are exact, and every domain at every level from the
    node up to the required one is looked at until one fits), so when a pod set does not fit
    alone the gang does not fit, and the exact search is spared."""
    return all(isinstance(pod_set.options(ctx, ps, Taken(), {}), list) for ps in ctx.gang.pod_sets)
