"""A port of its own for Prometheus: ``/metrics`` behind Kubernetes authentication.

The scraper sends a bearer token (its ServiceAccount's). The controller asks the API server
who the token belongs to (TokenReview) and whether that user may ``get`` the non-resource
URL ``/metrics`` (SubjectAccessReview), the check kube-rbac-proxy and the control-plane
components make, and keeps each answer for a short while so a scrape every 15 s costs the API
server nothing most of the time. Grant it with a ClusterRole rule
``nonResourceURLs: [/metrics], verbs: [get]`` bound to Prometheus's ServiceAccount
(manifests/monitoring). ``/healthz`` stays open for probes.

The port is guarded like the verbs' (:mod:`extender.httpapi.limits`): a connection cap with
idle connections giving way, timeouts, bodies of 1 KiB at most; and at most
:data:`MAX_REVIEWS` reviews of tokens not yet known are in flight at once (a flood of
invented tokens gets 503s, not a queue of API calls beside the scheduler's Bindings).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from extender.httpapi.limits import (
    GUARD,
    LIMITS,
    ConnectionGuard,
    GuardedSite,
    Limits,
    bounded,
    runner_options,
)
from extender.kube.api import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS, KubeClient

log = logging.getLogger(__name__)

#: The non-resource URL a scraper must be allowed to ``get``.
METRICS_PATH = "/metrics"
#: How long an answer is kept: a granted token for a minute, a refused one for ten seconds
#: (so a fix of the RBAC shows soon, and a flood of bad tokens still costs little).
ALLOWED_TTL_S = 60.0
DENIED_TTL_S = 10.0
#: Answers kept at most (one per distinct token); the oldest go first.
MAX_ENTRIES = 1024
#: Reviews of tokens not yet known in flight at once.
MAX_REVIEWS = 2
#: The metrics port's bounds: a scraper sends GETs without a body.
METRICS_LIMITS = Limits(
    max_body_bytes=1024, small_body_bytes=1024, bodies_in_flight_bytes=64 * 1024, max_connections=64
)


class ReviewsBusy(Exception):
    """As many token reviews as allowed are in flight already."""


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    #: Who the token is (when it authenticated), or why it was refused.
    reason: str
    authenticated: bool = True


class Reviewer(Protocol):
    """Answers whether a token may read the metrics."""

    async def review(self, token: str) -> Verdict: ...


class ApiReviewer:
    """TokenReview, then SubjectAccessReview of ``get /metrics``, through the one client."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def review(self, token: str) -> Verdict:
        token_review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        status = (await self._api.create(TOKEN_REVIEWS, token_review)).get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            return Verdict(
                False, f"token review: {status.get('error') or 'not authenticated'}", authenticated=False
            )
        spec = {
            "user": user["username"],
            "uid": user.get("uid", ""),
            "groups": list(user.get("groups") or ()),
            "extra": {k: list(v) for k, v in (user.get("extra") or {}).items()},
            "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
        }
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        answer = (await self._api.create(SUBJECT_ACCESS_REVIEWS, review)).get("status") or {}
        if answer.get("allowed"):
            return Verdict(True, str(user["username"]))
        why = answer.get("reason") or "no RBAC rule grants it"
        return Verdict(False, f"{user['username']} may not get {METRICS_PATH}: {why}")


class CachedReviewer:
    """A reviewer's answers kept per token (by its hash, never the token itself)."""

    def __init__(self, inner: Reviewer, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.clock = clock
        self._answers: dict[str, tuple[float, Verdict]] = {}
        self._in_flight = 0

    async def review(self, token: str) -> Verdict:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        kept = self._answers.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        if self._in_flight >= MAX_REVIEWS:
            raise ReviewsBusy(f"{self._in_flight} token reviews in flight")
        self._in_flight += 1
        try:
            verdict = await self.inner.review(token)
        finally:
            self._in_flight -= 1
        if len(self._answers) >= MAX_ENTRIES:
            self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
            while len(self._answers) >= MAX_ENTRIES:
                del self._answers[next(iter(self._answers))]
        self._answers[key] = (now + (ALLOWED_TTL_S if verdict.allowed else DENIED_TTL_S), verdict)
        return verdict


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def build_metrics_app(render: Callable[[], bytes], reviewer: Reviewer) -> web.Application:
    """``GET /metrics`` for a token allowed to read it (401 without one, 403 when refused,
    503 when the API server cannot be asked); ``GET /healthz`` for anyone."""

    async def metrics(request: web.Request) -> web.Response:
        token = bearer_token(request)
        if token is None:
            return web.Response(
                status=401, text="a bearer token is required\n", headers={"WWW-Authenticate": "Bearer"}
            )
        try:
            verdict = await reviewer.review(token)
        except ReviewsBusy:
            return web.Response(status=503, text="too many token reviews in flight: retry\n", headers=RETRY)
        except Exception as exc:
            log.warning("cannot review a metrics scraper's token: %s", exc)
            return web.Response(status=503, text="cannot review the token now\n")
        if not verdict.allowed:
            log.info("metrics scrape refused: %s", verdict.reason)
            status = 403 if verdict.authenticated else 401
            return web.Response(status=status, text=f"{verdict.reason}\n")
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=METRICS_LIMITS.max_body_bytes, middlewares=[bounded])
    app[LIMITS] = METRICS_LIMITS
    app.router.add_get(METRICS_PATH, metrics)
    app.router.add_get("/healthz", healthz)
    return app


RETRY = {"Retry-After": "1"}


async def start_metrics_site(
    render: Callable[[], bytes],
    reviewer: Reviewer,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
) -> web.AppRunner:
    """Listen on ``host:port``; the caller cleans the runner up and runs ``guard.watch()``."""
    app = build_metrics_app(render, CachedReviewer(reviewer))
    guard = app[GUARD] = ConnectionGuard(METRICS_LIMITS)
    runner = web.AppRunner(app, **runner_options(METRICS_LIMITS))
    await runner.setup()
    await GuardedSite(runner, guard, "metrics", host=host, port=port, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context else "http"
    log.info("metrics on %s://%s:%d%s (TokenReview + SubjectAccessReview)", scheme, host, port, METRICS_PATH)
    return runner
