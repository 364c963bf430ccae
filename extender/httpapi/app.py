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

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from extender.httpapi import admission, kube_routes, volcano_routes
from extender.httpapi.access import ACCESS, Access, checked, expect_continue
from extender.httpapi.checks import SCHEDULERS, Schedulers
from extender.httpapi.decide import Decider
from extender.httpapi.handling import API, BINDER, CACHE, DECIDER, METRICS
from extender.httpapi.limits import LIMITS, Limits, bounded, no_route
from extender.httpapi.metrics import Metrics
from extender.kube.api import KubeClient
from extender.kube.binder import ApiBinder, Binder, LocalBinder
from extender.reservations import ClusterCache

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/gangslice"


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    if cache.ready:
        # Both replicas are ready once listed (either can take over at once); only the
        # leader carries the label the Service selects, so only it gets the scheduler's calls.
        fence = cache.book.fence
        role = "" if not fence.elected else (" (leader)" if fence.decides() else " (standby)")
        return web.Response(text=f"ready{role}\n")
    waiting = ", ".join(sorted(k.value for k in cache.awaiting))
    return web.Response(status=503, text=f"waiting for the first list of: {waiting}\n")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(
    cache: ClusterCache,
    *,
    api: KubeClient | None = None,
    binder: Binder | None = None,
    prefix: str = DEFAULT_PREFIX,
    limits: Limits | None = None,
    schedulers: Schedulers | None = None,
    access: Access | None = None,
) -> web.Application:
    """The service over ``cache``. With ``api`` pods are bound through the API server;
    without it binds are only recorded (file mode). The periodic housekeeping is the
    controllers' (:mod:`extender.controllers.housekeeping`)."""
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    limits = limits or Limits()
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[checked, bounded])
    app[ACCESS] = access or Access(prefix)
    app[LIMITS] = limits
    app[SCHEDULERS] = schedulers or Schedulers()
    app[CACHE] = cache
    app[DECIDER] = Decider(cache)
    app[API] = api
    app[BINDER] = binder or (ApiBinder(api, cache.book.fence) if api is not None else LocalBinder())
    app[METRICS] = Metrics(cache)
    kube_routes.add_routes(app, prefix)
    volcano_routes.add_routes(app, prefix)
    admission.add_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_route("*", "/{path:.*}", no_route, expect_handler=expect_continue)
    return app
