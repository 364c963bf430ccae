"""The extender service as an aiohttp application.

Routes (``prefix`` defaults to ``/gangslice``)::

    POST {prefix}/filter | /prioritize | /bind | /preempt     kube-scheduler extender v1
    POST {prefix}/volcano/predicate | /prioritize | /jobEnqueueable | /allocate | /deallocate
         | /onSessionOpen | /onSessionClose                   Volcano extender plugin
    POST /admission/pods   mutating admission webhook: a DRA gang pod's GPU claim -> its slot's
    GET  /healthz   the process answers
    GET  /readyz    503 until the cache has listed every kind it watches
    GET  /metrics   Prometheus text format
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from extender.httpapi import admission, kube_routes, volcano_routes
from extender.httpapi.access import ACCESS, Access, checked
from extender.httpapi.checks import SCHEDULERS, Schedulers
from extender.httpapi.decide import Decider
from extender.httpapi.handling import (
    API,
    BINDER,
    CACHE,
    DECIDER,
    LEADING,
    METRICS,
    MISMATCHES,
    TOPOLOGY_STATUS,
    leads,
)
from extender.httpapi.limits import LIMITS, Limits, bounded
from extender.httpapi.metrics import Metrics
from extender.kube.api import KubeClient
from extender.kube.binder import ApiBinder, Binder, LocalBinder
from extender.kube.cache import ClusterCache
from extender.kube.claim_sync import SlotClaimSync
from extender.kube.mismatch import MismatchReporter
from extender.kube.topology_status import TopologyStatusReporter
from extender.kube.webhook_ca import WebhookCa
from extender.logs import fields

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/gangslice"
#: Re-plans gangs whose pinned devices someone else took (DRA nodes; None without an API server).
CLAIM_SYNC: web.AppKey[SlotClaimSync | None] = web.AppKey("claim_sync")
#: Keeps the DRA webhook's caBundle equal to the serving certificate's CA (``--webhook-ca-bundle``).
WEBHOOK_CA: web.AppKey[WebhookCa | None] = web.AppKey("webhook_ca")
#: How often reservations past their TTL are dropped and unsaved changes retried.
HOUSEKEEPING_S = 5.0


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    if cache.ready:
        # Both replicas are ready once listed (either can take over at once); only the
        # leader carries the label the Service selects, so only it gets the scheduler's calls.
        leading = request.app.get(LEADING)
        role = "" if leading is None else (" (leader)" if leading["now"] else " (standby)")
        return web.Response(text=f"ready{role}\n")
    waiting = ", ".join(sorted(k.value for k in cache.awaiting))
    return web.Response(status=503, text=f"waiting for the first list of: {waiting}\n")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def housekeeping(app: web.Application, every_s: float = HOUSEKEEPING_S) -> None:
    """Expire holds whose TTL ran out, say on each refused NodeTopology why, and tell (or
    evict) the pods the kubelet gave other GPUs than promised, on the leader only: a
    standby's copies of the reservations are read-only (the leader may have refreshed them a
    moment ago)."""
    cache = app[CACHE]
    while True:
        await asyncio.sleep(every_s)
        if not leads(app):
            continue
        try:
            async with cache.lock:
                gone = cache.expire()
            for r in gone:
                log.info("reservation of gang %s expired", r.gang, extra=fields(gang=r.gang))
            mismatches = app.get(MISMATCHES)
            if mismatches is not None:
                await mismatches.sync(cache, cache.clock())
            await cache.flush()
            reporter = app.get(TOPOLOGY_STATUS)
            if reporter is not None:
                await reporter.sync(cache, cache.clock())
            claims = app.get(CLAIM_SYNC)
            if claims is not None:
                await claims.sync(cache)
        except Exception:
            log.exception("housekeeping failed; continuing")
        webhook_ca = app.get(WEBHOOK_CA)
        if webhook_ca is not None:
            try:  # its own step: a failure above must not leave the webhook untrusted
                await webhook_ca.sync()
            except Exception:
                log.exception("setting the webhook's caBundle failed; the next housekeeping retries")


#: Seconds a stopping service waits for the ledger changes still queued to be written.
SHUTDOWN_WRITE_S = 10.0


async def write_queued(app: web.Application) -> None:
    """On a graceful stop, write what the background writer still holds (the binds' updates
    wait a moment to be written together); the leader only, as housekeeping."""
    cache = app[CACHE]
    if not leads(app) or not cache.unflushed:
        return
    try:
        await asyncio.wait_for(cache.flush(), SHUTDOWN_WRITE_S)
    except Exception as exc:
        log.warning("writing %d queued reservation change(s) at shutdown failed: %s", cache.unflushed, exc)


def build_app(
    cache: ClusterCache,
    *,
    api: KubeClient | None = None,
    binder: Binder | None = None,
    prefix: str = DEFAULT_PREFIX,
    housekeeping_s: float | None = HOUSEKEEPING_S,
    limits: Limits | None = None,
    schedulers: Schedulers | None = None,
    access: Access | None = None,
    topology_status: TopologyStatusReporter | None = None,
    mismatches: MismatchReporter | None = None,
    webhook_ca: WebhookCa | None = None,
) -> web.Application:
    """The service over ``cache``. With ``api`` pods are bound through the API server;
    without it binds are only recorded (file mode). With ``topology_status`` housekeeping
    writes the ``Accepted`` condition of NodeTopologies the cache refused; with
    ``mismatches`` it tells (or evicts) pods the kubelet gave other GPUs than promised; with
    ``webhook_ca`` it keeps the DRA webhook's caBundle set."""
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    limits = limits or Limits()
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[checked, bounded])
    app[ACCESS] = access or Access(prefix)
    app[LIMITS] = limits
    app[SCHEDULERS] = schedulers or Schedulers()
    app[CACHE] = cache
    app[DECIDER] = Decider(cache)
    app[API] = api
    app[BINDER] = binder or (ApiBinder(api) if api is not None else LocalBinder())
    app[METRICS] = Metrics(cache)
    app[TOPOLOGY_STATUS] = topology_status
    app[CLAIM_SYNC] = SlotClaimSync(api, cache.clock) if api is not None else None
    app[MISMATCHES] = mismatches
    app[WEBHOOK_CA] = webhook_ca
    kube_routes.add_routes(app, prefix)
    volcano_routes.add_routes(app, prefix)
    admission.add_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.on_shutdown.append(write_queued)
    if housekeeping_s:
        period = housekeeping_s

        async def background(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(housekeeping(app, period))
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(background)
    return app
