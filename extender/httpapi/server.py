"""Running the extender service: the HTTP(S) site, the watches, TLS reloads, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from extender.httpapi.app import build_app
from extender.httpapi.handling import LEADING, METRICS
from extender.httpapi.health_metrics import certificate_files
from extender.httpapi.secure_metrics import Reviewer, start_metrics_site
from extender.httpapi.tls import ReloadingTls
from extender.kube.api import KubeApi
from extender.kube.cache import ClusterCache
from extender.kube.names import LEADER_LABEL
from extender.kube.watch import Watcher

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "0.0.0.0"
    port: int = 8888
    prefix: str = "/gangslice"
    tls_cert: str | None = None
    tls_key: str | None = None
    #: A second port with /metrics behind TokenReview + SubjectAccessReview (0: none).
    metrics_port: int = 0


async def label_own_pod(api: KubeApi, leader: bool) -> None:
    """Mark this replica's pod as the leader (or not) for the Service's selector; outside a
    pod (no ``POD_NAME``/``POD_NAMESPACE``) there is nothing to mark."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        return
    try:
        await asyncio.to_thread(
            api.patch_pod_labels, namespace, name, {LEADER_LABEL: "true" if leader else "false"}
        )
    except Exception as exc:
        log.warning("could not label pod %s/%s leader=%s: %s", namespace, name, leader, exc)


#: Runs the admission controller beside the server: ``controller(stop, on_leadership)``.
Controller = Callable[[asyncio.Event, Callable[[bool], None]], Coroutine[Any, Any, None]]


async def serve(
    cache: ClusterCache,
    options: ServeOptions,
    api: KubeApi | None = None,
    controller: Controller | None = None,
    reviewer: Reviewer | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation). With ``controller`` the admission
    controller runs on the same loop over the same cache; the replica holding the leader
    lease labels its pod ``gangslice.io/leader=true`` and says so on ``/readyz``."""
    app = build_app(cache, api=api, prefix=options.prefix)
    leading = {"now": False}
    if controller is not None:
        app[LEADING] = leading
    tls = ReloadingTls(options.tls_cert, options.tls_key) if options.tls_cert and options.tls_key else None
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port, ssl_context=tls.context if tls else None)
    await site.start()
    metrics = app[METRICS]
    if tls is not None:
        metrics.health.certificates.update(certificate_files(tls.cert_file))
    metrics_runner = None
    if options.metrics_port and reviewer is not None:
        metrics_runner = await start_metrics_site(
            metrics.render, reviewer, options.host, options.metrics_port, tls.context if tls else None
        )
    scheme = "https" if tls else "http"
    log.info("serving on %s://%s:%d%s", scheme, options.host, options.port, options.prefix)
    print(
        f"gangslice serve: listening on {scheme}://{options.host}:{options.port}{options.prefix}", flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    background = []
    watcher = Watcher(api, cache) if api is not None else None
    if watcher is not None:
        background.append(asyncio.create_task(watcher.run()))
    if tls is not None:
        background.append(asyncio.create_task(tls.watch()))
    if controller is not None:

        def on_leadership(yes: bool) -> None:
            leading["now"] = yes
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
        await cache.flush()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await runner.cleanup()
