"""What every JSON endpoint shares: app state keys, decoding, error mapping, metrics.

A body that is not JSON or not the verb's shape gets HTTP 400 with a one-line reason; a
failure inside a decision gets HTTP 200 with the verb's error reply (the ``Error`` field,
Volcano's ``status``/``errorMessage``), because the scheduler reads errors from the body;
nothing a client sends can take the server down.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from extender.httpapi import nodelist
from extender.httpapi.collector import CollectorPause
from extender.httpapi.decide import Decider
from extender.httpapi.metrics import Metrics
from extender.kube.api import KubeClient
from extender.kube.binder import Binder
from extender.reservations import ClusterCache

log = logging.getLogger(__name__)

CACHE = web.AppKey("cache", ClusterCache)
DECIDER = web.AppKey("decider", Decider)
BINDER = web.AppKey("binder", Binder)
METRICS = web.AppKey("metrics", Metrics)
#: The API server, when there is one (to fetch a pod the cache has not seen at bind).
API: web.AppKey[KubeClient | None] = web.AppKey("api")

STANDBY = "this gangslice replica is a standby (another holds the leader lease); retry"


def leads(app: web.Application) -> bool:
    """Whether this replica may decide: it holds the lease by its own clock
    (:mod:`extender.kube.fence`), or it decides alone (file mode, a single extender). Only
    the leader reserves, binds or releases."""
    return app[CACHE].book.fence.decides()


#: One pause of the cycle collector shared by every request of the process.
PAUSE = CollectorPause()

M = TypeVar("M", bound=BaseModel)
Handle = Callable[[web.Request, M], Awaitable[Any]]


def one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        errors = exc.errors()
        e = errors[0]
        loc = ".".join(str(p) for p in e["loc"]) or "(body)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"invalid {exc.title}: {loc}: {e['msg']}{more}"
    if isinstance(exc, RecursionError):
        return "body is nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return "body is not UTF-8"
    if isinstance(exc, json.JSONDecodeError):
        return f"body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    return " ".join(str(exc).split()) or type(exc).__name__


class Encoded(bytes):
    """A reply already encoded as JSON (hot paths build their bytes directly)."""


def dumps(reply: Any) -> bytes:
    if isinstance(reply, Encoded):
        return reply
    return orjson.dumps(reply)


def json_endpoint(
    verb: str,
    model: type[M],
    handle: Handle[M],
    on_error: Callable[[str], Any],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler: decode ``model`` from the body, ``handle`` it, encode the reply."""

    async def answer(request: web.Request, raw: bytes) -> web.Response:
        try:
            body = orjson.loads(raw)
            nodelist.check_body(request.app[CACHE], body)
            args = model.model_validate(body)
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8 and validation errors
            return web.Response(status=400, text=one_line(exc) + "\n")
        except web.HTTPBadRequest as exc:
            return web.Response(status=exc.status, text=exc.text)
        try:
            reply = await handle(request, args)
        except web.HTTPException as exc:  # a refusal with its own status (a node list too long)
            # A fresh reply: the exception's traceback holds the decoded body (see PAUSE).
            return web.Response(status=exc.status, text=exc.text)
        except Exception as exc:
            log.exception("%s failed", verb)
            request.app[METRICS].decisions.labels("error").inc()
            reply = on_error(f"internal error in {verb}: {type(exc).__name__}: {one_line(exc)}")
        return web.Response(body=dumps(reply), content_type="application/json")

    async def handler(request: web.Request) -> web.StreamResponse:
        metrics = request.app[METRICS]
        start = time.perf_counter()
        status = 200
        try:
            raw = await request.read()
            if not leads(request.app):
                metrics.decisions.labels("standby").inc()
                return web.Response(body=dumps(on_error(STANDBY)), content_type="application/json")
            # ``answer`` returns before the pause ends: its frame, and with it the decoded
            # body, is gone by then (see extender.httpapi.collector).
            with PAUSE.held():
                response = await answer(request, raw)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            metrics.duration.labels(verb).observe(time.perf_counter() - start)
            metrics.requests.labels(verb, str(status)).inc()

    return handler
