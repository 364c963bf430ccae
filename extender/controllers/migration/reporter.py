"""What gangslice would move for the gangs that wait: the migration plan, reported.

Every housekeeping pass (leader only), for each gang the solver refused that is due for moves
(:func:`~extender.placement.migration.due`: 8 GPUs or more, waited
:attr:`MigrationReporter.after_s` since its first refusal), the planner
(:func:`~extender.placement.migration.plan_drain`) looks for the domain cheapest to drain by
moving the replicas operators marked movable: running pods labelled ``gangslice.io/movable:
"true"`` outside any gang, of at most 4 GPUs, each restarting in
``gangslice.io/restart-seconds`` (its model load; default :data:`DEFAULT_RESTART_S`), to
hardware at least as fast. A plan found is told once per gang and plan: a
``MigrationPlanned`` Event on a pod of the waiting gang naming each move and the restart
GPU-seconds it would cost, the same line in the log, and the
``gangslice_migration_plans_total`` and ``gangslice_migration_restart_gpu_seconds_total``
counters.

This is ``serve --migration report`` (the default): nothing is reserved or evicted. Carrying
a plan out (reserve the gang's slice and the movers' new slots, then evict through
``pods/eviction`` with PodDisruptionBudgets honoured) is not built yet.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from enum import StrEnum

from extender.kube import names
from extender.kube.api import KubeClient
from extender.kube.events import PodTeller
from extender.kube.pods import PodInfo
from extender.placement.migration import AFTER_S, Drain, Mover, due, plan_drain
from extender.placement.request import GangRequest
from extender.placement.slice import PodSlot
from extender.reservations import ClusterCache

log = logging.getLogger(__name__)

#: A moved replica's restart when its pod does not say (``gangslice.io/restart-seconds``).
DEFAULT_RESTART_S = 120.0
#: Plans told, remembered at most (the oldest go first).
TOLD_KEPT = 4096
REASON = "MigrationPlanned"


class Migration(StrEnum):
    """What ``serve --migration`` does with the plans."""

    OFF = "off"
    REPORT = "report"


def restart_s(pod: PodInfo) -> float:
    raw = pod.annotations.get(names.RESTART_SECONDS)
    try:
        got = float(raw) if raw is not None else DEFAULT_RESTART_S
    except ValueError:
        return DEFAULT_RESTART_S
    return got if math.isfinite(got) and got >= 0 else DEFAULT_RESTART_S


def movers(cache: ClusterCache) -> dict[str, tuple[Mover, PodInfo]]:
    """The running pods operators marked movable, outside any gang, with the GPUs they hold,
    by pod key (the mover's gang name)."""
    out: dict[str, tuple[Mover, PodInfo]] = {}
    for pod in cache.pods():
        if pod.labels.get(names.MOVABLE) != "true" or pod.node is None or pod.phase != "Running":
            continue
        if pod.gpus <= 0 or pod.gang_key is not None or pod.deleting:
            continue
        gpus = tuple(sorted(cache.gpus_of(pod.key)))
        if len(gpus) != pod.gpus:
            continue
        gang = GangRequest(pod.key, (pod.alone(),))
        out[pod.key] = (Mover(gang, (PodSlot("pod", 0, pod.node, gpus),), restart_s(pod)), pod)
    return out


def describe(plan: Drain, pods: dict[str, tuple[Mover, PodInfo]]) -> str:
    moves = "; ".join(
        f"{m.gang} from {pods[m.gang][0].slots[0].node} to {s.node} (GPUs {','.join(map(str, s.gpus))})"
        for m in plan.moves
        for s in m.slots
    )
    return (
        f"would move {len(plan.moves)} replica(s) off {plan.domain} for this gang, restarting "
        f"{plan.restart_gpu_s:g} GPU-seconds: {moves} (serve --migration report: nothing evicted)"
    )


class MigrationReporter:
    """Looks for a plan for each gang that waited, and tells the ones found."""

    def __init__(self, api: KubeClient, mode: Migration = Migration.REPORT, after_s: float = AFTER_S) -> None:
        self.mode = mode
        self.after_s = after_s
        self._teller: PodTeller | None = None
        self._api = api
        #: (gang, plan text) told, oldest first.
        self._told: OrderedDict[tuple[str, str], None] = OrderedDict()

    def due(self, cache: ClusterCache, now: float) -> list[GangRequest]:
        return [
            request
            for request, since in cache.waiting.waiting_since()
            if due(request, now - since, self.after_s)
        ]

    async def sync(self, cache: ClusterCache, now: float) -> list[Drain]:
        """Plan for each gang due; tell each new plan. Returns the plans found."""
        if self.mode is Migration.OFF:
            return []
        due = self.due(cache, now)
        if not due:
            return []
        pods = movers(cache)
        found = []
        view = cache.view()
        for request in due:
            plan = plan_drain(view, request, [m for m, _ in pods.values()])
            if plan is None:
                log.debug("gang %s waits; no migration plan over %d movable pod(s)", request.name, len(pods))
                continue
            found.append(plan)
            await self._tell(cache, request, plan, describe(plan, pods))
        return found

    async def _tell(self, cache: ClusterCache, request: GangRequest, plan: Drain, text: str) -> None:
        if (request.name, text) in self._told:
            return
        self._told[(request.name, text)] = None
        if len(self._told) > TOLD_KEPT:
            self._told.popitem(last=False)
        cache.book.note_migration_plan(len(plan.moves), plan.restart_gpu_s)
        if self._teller is None:
            self._teller = PodTeller(self._api, cache.clock, REASON)
        pod = _first(cache.pods_of_gang(request.name))
        if pod is None:
            log.info("gang %s: %s", request.name, text)
        await self._teller.tell(pod, text)


def _first(pods: Sequence[PodInfo]) -> PodInfo | None:
    return min(pods, key=lambda p: p.name) if pods else None
