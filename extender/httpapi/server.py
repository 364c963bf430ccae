"""Running the extender service: the HTTP(S) site, the watches, TLS reloads, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from extender.httpapi.access import SCHEDULER, VOLCANO, Access
from extender.httpapi.app import build_app
from extender.httpapi.checks import Schedulers
from extender.httpapi.handling import METRICS
from extender.httpapi.health_metrics import certificate_files
from extender.httpapi.limits import GUARD, ConnectionGuard, GuardedSite, Limits, runner_options
from extender.httpapi.secure_metrics import Reviewer, start_metrics_site
from extender.httpapi.tls import ReloadingTls
from extender.kube.api import PODS, KubeClient, KubeError
from extender.kube.names import LEADER_LABEL
from extender.kube.watch import Watcher
from extender.reservations import ClusterCache

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "0.0.0.0"
    port: int = 8888
    prefix: str = "/gangslice"
    tls_cert: str | None = None
    tls_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    schedulers: Schedulers = field(default_factory=Schedulers)
    #: Mutual TLS: the CA client certificates must chain to, and the names allowed in them.
    tls_client_ca: str | None = None
    tls_client_names: frozenset[str] = frozenset()
    #: Names one of which the admission webhook's caller (kube-apiserver) must present.
    admission_client_names: frozenset[str] = frozenset()
    #: The Volcano verbs' own listener (Volcano presents no client certificate).
    volcano_port: int | None = None
    #: A second port with /metrics behind TokenReview + SubjectAccessReview (0: none).
    metrics_port: int = 0


async def label_own_pod(api: KubeClient, leader: bool) -> None:
    """Mark this replica's pod as the leader (or not) for the Service's selector; outside a
    pod (no ``POD_NAME``/``POD_NAMESPACE``) there is nothing to mark."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        return
    try:
        labels = {LEADER_LABEL: "true" if leader else "false"}
        await api.patch(PODS, name, {"metadata": {"labels": labels}}, namespace=namespace)
    except Exception as exc:
        log.warning("could not label pod %s/%s leader=%s: %s", namespace, name, leader, exc)


async def rebuild_before_serving(cache: ClusterCache, retry_s: float = 2.0) -> None:
    """Rebuild the ledger, retrying while the API server cannot be reached: serving without
    it could hand out GPUs that a persisted reservation holds."""
    while True:
        try:
            await cache.book.rebuild_ledger()
            return
        except KubeError as exc:
            log.warning("rebuilding the ledger failed (%s); retrying in %gs", exc, retry_s)
            await asyncio.sleep(retry_s)


#: Seconds a stopping service waits for the reservation changes still queued to be written.
SHUTDOWN_WRITE_S = 10.0

#: Runs the controllers beside the server: ``controller(stop, on_leadership)``.
Controller = Callable[[asyncio.Event, Callable[[bool], None]], Coroutine[Any, Any, None]]


async def serve(
    cache: ClusterCache,
    options: ServeOptions,
    api: KubeClient | None = None,
    controller: Controller | None = None,
    reviewer: Reviewer | None = None,
    *,
    elects: bool = True,
    watcher: Watcher | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation). With ``controller`` the controllers (the
    housekeeping among them) run on the same loop over the same cache. With ``elects`` they
    elect a leader: the replica holding the lease labels its pod ``gangslice.io/leader=true``
    and says so on ``/readyz``; without, this replica decides alone. ``watcher`` feeds the
    cache (default: one over ``api``)."""
    if api is not None and (controller is None or not elects):
        # No election: this replica decides from its first request, so the ledger is rebuilt
        # before it listens (with a controller, the replica that becomes leader rebuilds it).
        await rebuild_before_serving(cache)
    access = Access(
        options.prefix,
        bool(options.tls_client_ca),
        options.tls_client_names,
        options.volcano_port,
        metrics_port=options.metrics_port if reviewer is not None else None,
        admission_names=options.admission_client_names,
    )
    app = build_app(
        cache,
        api=api,
        prefix=options.prefix,
        limits=options.limits,
        schedulers=options.schedulers,
        access=access,
    )
    if controller is not None and elects:
        # Closed until the election's first renewal: nothing is decided before it.
        cache.book.fence.elect()
    tls = volcano_tls = None
    if options.tls_cert and options.tls_key:
        tls = ReloadingTls(options.tls_cert, options.tls_key, options.tls_client_ca)
        # Volcano's client has no certificate to present: its listener asks for none.
        volcano_tls = ReloadingTls(options.tls_cert, options.tls_key) if options.volcano_port else None
    guard = app[GUARD] = ConnectionGuard(options.limits)
    app[METRICS].listeners.guards.append(("verbs", guard))
    runner = web.AppRunner(app, **runner_options(options.limits))
    await runner.setup()
    listeners = [(SCHEDULER, options.port, tls)]
    if options.volcano_port:
        listeners.append((VOLCANO, options.volcano_port, volcano_tls))
    for listener, port, ctx in listeners:
        site = GuardedSite(
            runner, guard, listener, host=options.host, port=port, ssl_context=ctx.context if ctx else None
        )
        await site.start()
        scheme = "https" if ctx else "http"
        path = options.prefix + ("/volcano" if listener == VOLCANO else "")
        mtls = " (client certificates required)" if ctx is tls and options.tls_client_ca else ""
        log.info("serving %s verbs on %s://%s:%d%s%s", listener, scheme, options.host, port, path, mtls)
        print(f"gangslice serve: listening on {scheme}://{options.host}:{port}{path}{mtls}", flush=True)
    metrics = app[METRICS]
    if tls is not None:
        metrics.health.certificates.update(certificate_files(tls.cert_file))
        if options.tls_client_ca:
            metrics.health.certificates["client-ca"] = options.tls_client_ca
    # Prometheus presents a token, not a client certificate: the metrics port asks for none.
    metrics_tls = ReloadingTls(tls.cert_file, tls.key_file) if tls and options.metrics_port else None
    metrics_runner = None
    if options.metrics_port and reviewer is not None:
        metrics_runner = await start_metrics_site(
            metrics.render,
            reviewer,
            options.host,
            options.metrics_port,
            metrics_tls.context if metrics_tls else None,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    background = [asyncio.create_task(guard.watch())]
    if metrics_runner is not None:
        metrics.listeners.guards.append(("metrics", metrics_runner.app[GUARD]))
        background.append(asyncio.create_task(metrics_runner.app[GUARD].watch()))
    if watcher is None and api is not None:
        watcher = Watcher(api, cache)
    if watcher is not None:
        background.append(asyncio.create_task(watcher.run()))
    for reloading in (tls, volcano_tls, metrics_tls):
        if reloading is not None:
            background.append(asyncio.create_task(reloading.watch()))
    if controller is not None:

        def on_leadership(yes: bool) -> None:
            if api is not None:
                background.append(asyncio.create_task(label_own_pod(api, yes)))

        ctl = asyncio.create_task(controller(stop, on_leadership), name="gangslice-controller")
        ctl.add_done_callback(lambda _: stop.set())
        background.append(ctl)
    try:
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.stop()
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # The binds' updates wait a moment to be written together (write-behind): write
        # what is still queued, bounded so a dead API server cannot hold the stop.
        try:
            await asyncio.wait_for(cache.book.flush(), SHUTDOWN_WRITE_S)
        except Exception as exc:
            log.warning("writing %d queued reservation change(s) at stop failed: %s", cache.unflushed, exc)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await runner.cleanup()
