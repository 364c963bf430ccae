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
from extender.httpapi.handling import LEADING
from extender.httpapi.tls import ReloadingTls
from extender.kube.api import PODS, KubeClient, KubeError
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
            await cache.rebuild_ledger()
            return
        except KubeError as exc:
            log.warning("rebuilding the ledger failed (%s); retrying in %gs", exc, retry_s)
            await asyncio.sleep(retry_s)


#: Runs the admission controller beside the server: ``controller(stop, on_leadership)``.
Controller = Callable[[asyncio.Event, Callable[[bool], None]], Coroutine[Any, Any, None]]


async def serve(
    cache: ClusterCache,
    options: ServeOptions,
    api: KubeClient | None = None,
    controller: Controller | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or cancellation). With ``controller`` the admission
    controller runs on the same loop over the same cache; the replica holding the leader
    lease labels its pod ``gangslice.io/leader=true`` and says so on ``/readyz``."""
    if api is not None and controller is None:
        # No election: this replica decides from its first request, so the ledger is rebuilt
        # before it listens (with a controller, the replica that becomes leader rebuilds it).
        await rebuild_before_serving(cache)
    app = build_app(cache, api=api, prefix=options.prefix)
    leading = {"now": False}
    if controller is not None:
        app[LEADING] = leading
    tls = ReloadingTls(options.tls_cert, options.tls_key) if options.tls_cert and options.tls_key else None
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port, ssl_context=tls.context if tls else None)
    await site.start()
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
        await runner.cleanup()
