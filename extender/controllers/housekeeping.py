"""The periodic pass over the cluster cache, on the leader only.

Every ``every_s`` seconds: drop holds whose TTL ran out, free the slots of owned gangs their
owners no longer want (missed by an event, or handed out at an admission that lapsed), tell
(or evict) the pods the kubelet gave other GPUs than promised, write the reservations not
saved yet, say on each refused NodeTopology why, make the DRA claims pods were given at
admission (missed by an event, or a write that failed), re-plan DRA slots whose pinned
devices someone else took, report what replicas would move for the gangs that waited, and
keep the DRA webhook's caBundle set. A standby skips the pass:
its copies of the reservations are read-only (the leader may have refreshed them a moment ago).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from extender.controllers.claims.make import PodClaims
from extender.controllers.claims.sync import SlotClaimSync
from extender.controllers.migration.reporter import MigrationReporter
from extender.controllers.mismatch.reporter import MismatchReporter
from extender.controllers.topology_status.reporter import TopologyStatusReporter
from extender.controllers.webhook_ca.sync import WebhookCa
from extender.logs import fields
from extender.reservations import ClusterCache

log = logging.getLogger(__name__)

#: How often reservations past their TTL are dropped and unsaved changes retried.
HOUSEKEEPING_S = 5.0


@dataclass
class Housekeeping:
    """The reconcilers of one pass; each one left out (None) is skipped, as in file mode."""

    cache: ClusterCache
    topology_status: TopologyStatusReporter | None = None
    mismatches: MismatchReporter | None = None
    claims: SlotClaimSync | None = None
    pod_claims: PodClaims | None = None
    webhook_ca: WebhookCa | None = None
    migration: MigrationReporter | None = None
    every_s: float = HOUSEKEEPING_S

    async def once(self) -> None:
        cache = self.cache
        try:
            gone = await cache.book.deciding(cache.book.expire)
            for r in gone:
                log.info("reservation of gang %s expired", r.gang, extra=fields(gang=r.gang))
            await cache.book.deciding(cache.book.trim_all)
            if self.mismatches is not None:
                await self.mismatches.sync(cache, cache.clock())
            await cache.flush()
            if self.topology_status is not None:
                await self.topology_status.sync(cache, cache.clock())
            if self.pod_claims is not None:
                await self.pod_claims.sync(cache)
            if self.claims is not None:
                await self.claims.sync(cache)
            if self.migration is not None:
                await self.migration.sync(cache, cache.clock())
        except Exception:
            log.exception("housekeeping failed; continuing")
        if self.webhook_ca is not None:
            try:  # its own step: a failure above must not leave the webhook untrusted
                await self.webhook_ca.sync()
            except Exception:
                log.exception("setting the webhook's caBundle failed; the next housekeeping retries")

    async def run(self, stop: asyncio.Event, leads: Callable[[], bool]) -> None:
        """A pass every ``every_s`` seconds while ``leads()``, until ``stop`` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
            if not stop.is_set() and leads():
                await self.once()
