"""Leader election on a ``coordination.k8s.io/v1`` Lease, as a task on the controller's loop.

Why not ``kubernetes.leaderelection``: it is a blocking loop on its own thread that calls
``onstarted_leading`` in yet another thread, so every decision it gates would hop threads to
reach the asyncio loop that owns the snapshot and the ledger. Here the election is one more
coroutine on that loop: becoming leader awaits ``on_started`` (which rebuilds the ledger
from the SliceReservation objects) before the controller is told it may decide anything,
and losing the lease calls ``on_stopped`` before the next decision can run.

The protocol is client-go's: a holder renews ``renewTime`` every ``retry_period_s``; anyone
may take the lease once ``renewTime + leaseDurationSeconds`` has passed; every write is a
replace guarded by ``resourceVersion``, so two candidates never both win. A leader that has
not renewed within ``renew_deadline_s`` steps down on its own, before the lease lapses for
others; between rounds the :class:`~extender.kube.fence.Fence` enforces the same deadline at
every decision and write, by this process's own clock, so a leader whose loop stalled past
it refuses instead of acting once it wakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from extender.controllers.objects import parse_rfc3339
from extender.kube.api import LEASES, KubeClient, KubeError, NotFound, as_map
from extender.kube.fence import Fence

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    namespace: str = "gangslice-system"
    name: str = "gangslice-controller"
    duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str | None
    duration_s: float
    acquired: float | None
    renewed: float | None
    transitions: int = 0
    resource_version: str | None = None

    def expired(self, now: float) -> bool:
        return self.renewed is None or self.renewed + self.duration_s <= now


def default_identity() -> str:
    """``<pod or host name>_<random>``: unique per process, readable in the Lease."""
    host = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:8]}"


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_from_object(obj: Mapping[str, Any]) -> LeaseRecord:
    spec = as_map(obj.get("spec"))
    meta = as_map(obj.get("metadata"))
    holder = spec.get("holderIdentity")
    rv = meta.get("resourceVersion")
    return LeaseRecord(
        holder=str(holder) if holder else None,
        duration_s=float(spec.get("leaseDurationSeconds") or 0),
        acquired=parse_rfc3339(spec.get("acquireTime")),
        renewed=parse_rfc3339(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str(rv) if rv else None,
    )


def lease_body(cfg: LeaseConfig, rec: LeaseRecord) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": cfg.name, "namespace": cfg.namespace}
    if rec.resource_version:
        meta["resourceVersion"] = rec.resource_version
    spec: dict[str, Any] = {
        "holderIdentity": rec.holder,
        "leaseDurationSeconds": max(1, round(rec.duration_s)),
        "leaseTransitions": rec.transitions,
    }
    if rec.acquired is not None:
        spec["acquireTime"] = _micro_time(rec.acquired)
    if rec.renewed is not None:
        spec["renewTime"] = _micro_time(rec.renewed)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


def claim(current: LeaseRecord | None, identity: str, now: float, duration_s: float) -> LeaseRecord | None:
    """The record to write to hold the lease, or None while someone else holds it."""
    if current is None:
        return LeaseRecord(identity, duration_s, now, now, 0)
    if current.holder == identity:
        return replace(current, duration_s=duration_s, renewed=now)
    if current.holder and not current.expired(now):
        return None
    return replace(
        current,
        holder=identity,
        duration_s=duration_s,
        acquired=now,
        renewed=now,
        transitions=current.transitions + 1,
    )


class LeaderElector:
    def __init__(
        self,
        api: KubeClient,
        cfg: LeaseConfig,
        identity: str,
        on_started: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None] | None],
        clock: Callable[[], float] = time.time,
        fence: Fence | None = None,
    ) -> None:
        self.api = api
        self.fence = fence or Fence()
        self.fence.elect()
        self.cfg = cfg
        self.identity = identity
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.leading = False
        self._last_renew: float | None = None

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this process holds the lease after it."""
        now = self.clock()
        try:
            obj: dict[str, Any] | None = await self.api.get(LEASES, self.cfg.name, self.cfg.namespace)
        except NotFound:
            obj = None
        except KubeError as exc:
            log.warning("reading lease %s/%s failed: %s", self.cfg.namespace, self.cfg.name, exc)
            return False
        current = lease_from_object(obj) if obj is not None else None
        wanted = claim(current, self.identity, now, self.cfg.duration_s)
        if wanted is None:
            return False
        try:
            if obj is None:
                await self.api.create(LEASES, lease_body(self.cfg, wanted))
            else:
                await self.api.replace(LEASES, lease_body(self.cfg, wanted))
        except KubeError as exc:  # 409: someone else wrote first
            log.debug("lease write lost: %s", exc)
            return False
        self._last_renew = now
        return True

    async def step(self) -> None:
        """One election round plus the transitions it causes."""
        began = self.fence.clock()
        held = await self.try_acquire_or_renew()
        if held and self.leading:
            self.fence.hold_until(began + self.cfg.renew_deadline_s)
        elif held and not self.leading:
            log.info("became leader (%s)", self.identity)
            # The rebuild writes (stale reservations deleted); deciding waits for its end.
            self.fence.hold_until(began + self.cfg.renew_deadline_s)
            try:
                await self.on_started()
            except Exception:
                # Not leading until the rebuild succeeds; the next round tries again.
                log.exception("preparing to lead failed")
                self.fence.close()
                return
            self.fence.leading = self.leading = True
        elif not held and self.leading:
            last = self._last_renew if self._last_renew is not None else float("-inf")
            if self.clock() - last >= self.cfg.renew_deadline_s:
                await self._stop_leading()

    async def _stop_leading(self, why: str = "could not renew the lease") -> None:
        log.log(
            logging.INFO if why == "shutting down" else logging.WARNING,
            "stopped leading (%s): %s",
            self.identity,
            why,
        )
        self.leading = False
        self.fence.close()
        got = self.on_stopped()
        if got is not None:
            await got

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.cfg.retry_period_s)
        finally:
            if self.leading:
                await self._stop_leading("shutting down")
                await self.release()

    async def release(self) -> None:
        """Give the lease up (on shutdown) so a standby takes over without waiting it out."""
        try:
            obj = await self.api.get(LEASES, self.cfg.name, self.cfg.namespace)
            rec = lease_from_object(obj)
            if rec.holder != self.identity:
                return
            await self.api.replace(LEASES, lease_body(self.cfg, replace(rec, holder=None, renewed=None)))
        except KubeError as exc:
            log.debug("releasing the lease failed: %s", exc)
