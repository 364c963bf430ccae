"""What gangslice moves for the gangs that wait: the migration plan, reported or carried out.

Every housekeeping pass (leader only), for each gang the solver refused that is due for moves
(:func:`~extender.placement.migration.due`: 8 GPUs or more, waited
:attr:`MigrationReporter.after_s` since its first refusal), the planner
(:func:`~extender.placement.migration.plan_drain`) looks for the domain cheapest to drain by
moving the replicas operators marked movable: running pods labelled ``gangslice.io/movable:
"true"`` outside any gang, owned by a controller that replaces them (a ReplicaSet), of at most
4 GPUs, each restarting in ``gangslice.io/restart-seconds`` (its model load; default
:data:`DEFAULT_RESTART_S`), to hardware at least as fast.

``serve --migration report`` (the default) tells a plan found once per gang and plan: a
``MigrationPlanned`` Event on the object the waiting gang waits as (its Kueue Workload, which
waits without pods, or its PodGroup; else a pod of it: :func:`waits_as`) naming each move and
the restart GPU-seconds it would cost, the same line in the log, and the
``gangslice_migration_*`` counters. Nothing is reserved or evicted.

``serve --migration on`` carries it out, in this order:

1. every mover's eviction is tried with ``dryRun`` (``pods/eviction``): a PodDisruptionBudget
   that allows no disruption now refuses the plan, nothing is held or evicted, the gang waits
   (Event ``MigrationRefused``) and the plan is looked for again after :data:`RETRY_S`;
2. under the book's lock the plan is made again on the view as it is now; unless it is the
   same, nothing happens this pass. The gang's slice and each mover's new slot are held
   (:mod:`~extender.reservations.handover`) and written (unless every one is written, they
   are released and nothing is evicted);
3. each mover is evicted (PodDisruptionBudgets honoured). Its ReplicaSet's replacement pod
   binds to the slot held for it, and the gang's reserve path takes the drained slice. An
   eviction refused midway stops the rest: the gang's hold and the holds of the movers not
   evicted are released (those evicted keep theirs for their replacements);
4. Event ``MigrationStarted`` on the same object, and ``gangslice_migration_evictions_total``.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from enum import StrEnum

from extender.kube import evictions, names
from extender.kube.api import KubeClient
from extender.kube.events import ObjectRef, Teller
from extender.kube.evictions import Result
from extender.kube.pods import PodInfo
from extender.placement.migration import AFTER_S, Drain, Mover, due, plan_drain
from extender.placement.request import GangRequest
from extender.placement.slice import PodSlot
from extender.reservations import ClusterCache
from extender.reservations.handover import drain_holds, for_gang
from extender.reservations.store import ReservationRef

log = logging.getLogger(__name__)

#: A moved replica's restart when its pod does not say (``gangslice.io/restart-seconds``).
DEFAULT_RESTART_S = 120.0
#: Plans told, remembered at most (the oldest go first).
TOLD_KEPT = 4096
#: Seconds before a gang whose plan a PodDisruptionBudget (or a failed eviction) refused gets
#: another: the dry runs are API calls, not to be made every pass.
RETRY_S = 60.0
REASON = "MigrationPlanned"
STARTED = "MigrationStarted"
REFUSED = "MigrationRefused"


class Migration(StrEnum):
    """What ``serve --migration`` does with the plans."""

    OFF = "off"
    REPORT = "report"
    ON = "on"


def restart_s(pod: PodInfo) -> float:
    raw = pod.annotations.get(names.RESTART_SECONDS)
    try:
        got = float(raw) if raw is not None else DEFAULT_RESTART_S
    except ValueError:
        return DEFAULT_RESTART_S
    return got if math.isfinite(got) and got >= 0 else DEFAULT_RESTART_S


Movers = dict[str, tuple[Mover, PodInfo]]


def movers(cache: ClusterCache) -> Movers:
    """The running pods operators marked movable, outside any gang and owned by a controller
    that replaces them, with the GPUs they hold, by pod key (the mover's gang name)."""
    out: Movers = {}
    for pod in cache.pods():
        if pod.labels.get(names.MOVABLE) != "true" or pod.node is None or pod.phase != "Running":
            continue
        if pod.gpus <= 0 or pod.gang_key is not None or pod.deleting or pod.controller is None:
            continue
        gpus = tuple(sorted(cache.gpus_of(pod.key)))
        if len(gpus) != pod.gpus:
            continue
        gang = GangRequest(pod.key, (pod.alone(),))
        out[pod.key] = (Mover(gang, (PodSlot("pod", 0, pod.node, gpus),), restart_s(pod)), pod)
    return out


def describe(plan: Drain, pods: Movers) -> str:
    moves = "; ".join(
        f"{m.gang} from {pods[m.gang][0].slots[0].node} to {s.node} (GPUs {','.join(map(str, s.gpus))})"
        for m in plan.moves
        for s in m.slots
    )
    return (
        f"{len(plan.moves)} replica(s) off {plan.domain} for this gang, restarting "
        f"{plan.restart_gpu_s:g} GPU-seconds: {moves}"
    )


class MigrationReporter:
    """Looks for a plan for each gang that waited; tells the ones found, or carries them out."""

    def __init__(self, api: KubeClient, mode: Migration = Migration.REPORT, after_s: float = AFTER_S) -> None:
        self.mode = mode
        self.after_s = after_s
        self._tellers: dict[str, Teller] = {}
        self._api = api
        #: (gang, plan text) told, oldest first.
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: Gang -> when a refused one may get a plan again.
        self._retry_at: dict[str, float] = {}

    def due(self, cache: ClusterCache, now: float) -> list[GangRequest]:
        return [
            request
            for request, since in cache.waiting.waiting_since()
            if due(request, now - since, self.after_s)
            and not cache.held_for(for_gang(request.name))  # a migration for it is under way
            and self._retry_at.get(request.name, 0.0) <= now
        ]

    async def sync(self, cache: ClusterCache, now: float) -> list[Drain]:
        """Plan for each gang due; tell each new plan, or carry it out. Returns the plans
        found (report) or started (on)."""
        if self.mode is Migration.OFF:
            return []
        due = self.due(cache, now)
        if not due:
            return []
        self._retry_at = {g: t for g, t in self._retry_at.items() if t > now}
        found = []
        pods, view = movers(cache), cache.view()
        for request in due:
            plan = plan_drain(view, request, [m for m, _ in pods.values()])
            if plan is None:
                log.debug("gang %s waits; no migration plan over %d movable pod(s)", request.name, len(pods))
                continue
            if self.mode is Migration.REPORT:
                found.append(plan)
                text = f"would move {describe(plan, pods)} (serve --migration report: nothing evicted)"
                if self._new(request, text):
                    cache.book.note_migration_plan(len(plan.moves), plan.restart_gpu_s)
                    await self._tell(cache, request, REASON, text)
            else:
                if await self._carry_out(cache, request, plan, pods, now):
                    found.append(plan)
                # Holds and evictions change what the next gang's plan may use.
                pods, view = movers(cache), cache.view()
        return found

    # -- on ------------------------------------------------------------------------------
    async def _carry_out(
        self, cache: ClusterCache, request: GangRequest, plan: Drain, pods: Movers, now: float
    ) -> bool:
        moved = [pods[m.gang][1] for m in plan.moves]
        for pod in moved:
            refused = await self._evict(pod, dry_run=True)
            if refused is not None:
                self._refused(cache, request, now, refused[0])
                await self._tell(cache, request, REFUSED, f"{refused[1]}: nothing evicted, the gang waits")
                return False
        async with cache.lock:
            # The dry runs awaited: the plan holds only if the view still gives it.
            fresh = movers(cache)
            again = plan_drain(cache.view(), request, [m for m, _ in fresh.values()])
            expires = now + cache.ledger.ttl_s
            holds = (
                drain_holds(plan, request, {k: p for k, (_, p) in fresh.items()}, expires)
                if again == plan
                else None
            )
            if holds is None or not cache.hold_all(holds):
                log.info("gang %s: the migration plan changed meanwhile; looked for next pass", request.name)
                return False
        # Written before anything is evicted: a restart after an eviction keeps the holds.
        if not all([await cache.persist(h.gang) for h in holds]):
            async with cache.lock:
                for h in holds:
                    cache.drop(h.gang)
            await cache.flush()
            self._refused(cache, request, now)
            log.warning("gang %s: the migration's holds could not be written; nothing evicted", request.name)
            return False
        cache.book.note_migration_plan(len(plan.moves), plan.restart_gpu_s)
        for i, pod in enumerate(moved):
            refused = await self._evict(pod)
            if refused is None:
                cache.book.note_migration_eviction("evicted")
                to = plan.moves[i].slots[0].node
                log.info("pod %s evicted, to move to %s for gang %s", pod.key, to, request.name)
                continue
            # Stop: the gang's slice will not come free. Replacements of the pods evicted
            # keep their slots.
            async with cache.lock:
                for h in [holds[0], *holds[1 + i :]]:
                    cache.drop(h.gang)
            await cache.flush()
            self._refused(cache, request, now, refused[0])
            done = f"{i} of {len(moved)} replica(s) evicted, the rest stay; the gang waits"
            await self._tell(cache, request, REFUSED, f"{refused[1]}: {done}")
            return False
        await self._tell(cache, request, STARTED, f"moving {describe(plan, pods)}")
        return True

    async def _evict(self, pod: PodInfo, *, dry_run: bool = False) -> tuple[str, str] | None:
        """Evict ``pod`` (or ask whether it may be: ``dry_run``); None when it may be, is, or
        was gone already, else the result (``blocked`` by its PodDisruptionBudget, ``failed``)
        and why, in words."""
        got = await evictions.evict(self._api, pod.namespace, pod.name, pod.uid, dry_run=dry_run)
        if got.done:
            return None
        if got.result is Result.BLOCKED:
            return (
                got.result,
                f"the PodDisruptionBudget of pod {pod.key} allows no disruption now ({got.detail})",
            )
        return got.result, f"evicting pod {pod.key} failed ({got.detail})"

    def _refused(
        self, cache: ClusterCache, request: GangRequest, now: float, result: str | None = None
    ) -> None:
        """The plan was not carried out (``result``: of the eviction that refused it)."""
        self._retry_at[request.name] = now + RETRY_S
        if result is not None:
            cache.book.note_migration_eviction(result)

    # -- telling -------------------------------------------------------------------------
    def _new(self, request: GangRequest, text: str) -> bool:
        """Whether this plan was not told for this gang yet (and remember it)."""
        if (request.name, text) in self._told:
            return False
        self._told[(request.name, text)] = None
        if len(self._told) > TOLD_KEPT:
            self._told.popitem(last=False)
        return True

    async def _tell(self, cache: ClusterCache, request: GangRequest, reason: str, text: str) -> None:
        teller = self._tellers.get(reason)
        if teller is None:
            teller = self._tellers[reason] = Teller(self._api, cache.clock, reason)
        about = waits_as(cache, request.name)
        if about is None:
            log.info("gang %s: %s", request.name, text)
            return
        await teller.tell_about(about, text)


def waits_as(cache: ClusterCache, gang: str) -> ObjectRef | None:
    """What a waiting gang is told on: the object it waits as (a Kueue Workload waits without
    pods; a PodGroup), else its first pod; None when it has neither."""
    ref = ReservationRef.parse(gang, cache.waiting.meta(gang))
    if ref.names_owner:
        return ObjectRef(ref.owner_api_version, ref.owner_kind, ref.owner_name, ref.namespace, ref.owner_uid)
    pods = cache.pods_of_gang(gang)
    return ObjectRef.pod(min(pods, key=lambda p: p.name)) if pods else None
