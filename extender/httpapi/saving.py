"""A filter's reply promises a reservation only once it is saved.

The filter that places a plain gang (the first member's) holds the slice in the ledger;
the reply lets kube-scheduler bind the member on it. The promise must outlive this process,
so the SliceReservation is written before the reply (its object: what a restart rebuilds the
ledger from; its status, for people, follows in the background), and when the store cannot
write it the hold goes and the filter answers unschedulable with the reason (issue: a failed
save was logged, stayed queued, and the filter still said the pod fits).
"""

from __future__ import annotations

import logging

from extender.httpapi.decide import FilterOutcome
from extender.kube.cache import ClusterCache
from extender.logs import fields

log = logging.getLogger(__name__)


async def saved(cache: ClusterCache, out: FilterOutcome) -> FilterOutcome:
    """Write what the filter changed; a filter that reserved a slice answers only once its
    SliceReservation is saved. When the store could not write it, the hold is released (a
    restart would not know of it, and a pod bound on its strength would hold GPUs nobody
    reserved) and every node is unschedulable with the reason; the next member's filter
    places the gang afresh."""
    gang = out.reserved
    if gang is None:
        # Nothing promised here: other queued changes (binds' updates) are written in the
        # background, since kube-scheduler's one scheduling loop waits on this reply.
        cache.flush_soon()
        return out
    # Only the new reservation's object gates the reply: it is the promise a restart
    # rebuilds. Its status follows write-behind, with the binds of the gang.
    await cache.persist(gang, status=False)
    cache.flush_soon()
    why = cache.save_error(gang)
    if why is None:
        return out
    async with cache.lock:
        cache.drop(gang)
    await cache.flush()  # the object may exist after all (a write that timed out): delete it
    log.warning(
        "gang %s: its reservation could not be saved (%s); released the hold",
        gang,
        why,
        extra=fields(gang=gang),
    )
    reason = f"gang {gang}: the reservation could not be saved ({why}); nothing is held, will retry"
    names = [*out.passed, *out.failed, *out.unresolvable]
    return FilterOutcome([], dict.fromkeys(names, reason), {}, "unsaved")
