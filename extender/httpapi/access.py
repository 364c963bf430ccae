"""Who may call what, per listener.

The scheduler listener (``--port``) serves the kube-scheduler verbs; with a client CA
(``--tls-client-ca``) every path under the verb prefix needs a client certificate that
chained to it (the TLS layer checked the chain) and, with ``--tls-client-names``, names one
of the allowed names in its subject CN or DNS SANs; without one the reply is 403 saying so.
``/healthz`` and ``/readyz`` answer without a certificate: one port keeps the Service, the
probes (a kubelet presents no client certificate) and the serving certificate as they are;
what keeps the probes answered when others flood the port is the connection guard
(:mod:`extender.httpapi.limits`), not a listener of their own. ``/metrics`` answers there
only without ``--metrics-port``; with it, only on that port, behind TokenReview.

Volcano's extender client presents no certificate, so with ``--volcano-port`` its verbs
move to a listener of their own (reached only by the Volcano scheduler, per the shipped
NetworkPolicy); that listener serves the Volcano verbs and health only, and the scheduler
listener no longer serves them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from extender.httpapi.limits import GUARD, LARGE_BODIES, body_refusal

SCHEDULER = "scheduler"
VOLCANO = "volcano"
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: The admission webhook's path (extender.httpapi.admission): outside the verbs' prefix, as
#: kube-apiserver presents a client certificate only where it is configured to.
ADMISSION_PATH = "/admission/pods"


@dataclass(frozen=True, slots=True)
class Access:
    prefix: str = "/gangslice"
    client_certs: bool = False
    client_names: frozenset[str] = field(default_factory=frozenset)
    #: The Volcano listener's port when the Volcano verbs have one.
    volcano_port: int | None = None
    #: The metrics port, when /metrics is served there (behind TokenReview) and not here.
    metrics_port: int | None = None
    #: When set, the admission webhook's caller must present a client certificate naming one.
    admission_names: frozenset[str] = field(default_factory=frozenset)

    @property
    def volcano_base(self) -> str:
        return f"{self.prefix}/volcano"


ACCESS = web.AppKey("access", Access)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def cert_names(peercert: dict[str, Any]) -> set[str]:
    """Subject common names and DNS subject alternative names of a verified peer certificate
    (URI, e-mail and IP SANs name no one here: a CA that issues them for workloads, a SPIFFE
    one say, must not make its certificates pass for the scheduler's)."""
    names = {v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"}
    names |= {v for k, v in peercert.get("subjectAltName", ()) if k == "DNS"}
    return names


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def refusal(request: web.Request) -> web.HTTPException | None:
    """Why this caller may not reach this path on this listener; None: it may."""
    access = request.app.get(ACCESS)
    guard = request.app.get(GUARD)
    listener = guard.listener_of(request.protocol) if guard is not None else None
    if access is not None and access.metrics_port and request.path == "/metrics":
        return web.HTTPNotFound(text=f"/metrics is served on port {access.metrics_port}, to a bearer token\n")
    if access is None or listener is None or request.path in OPEN_PATHS:
        return None
    volcano_path = _under(request.path, access.volcano_base)
    if listener == VOLCANO:
        if not volcano_path:
            return web.HTTPNotFound(text="this port serves only the Volcano verbs and health\n")
        return None
    if volcano_path and access.volcano_port is not None:
        return web.HTTPNotFound(text=f"the Volcano verbs are served on port {access.volcano_port}\n")
    if access.client_certs and (not access.prefix or _under(request.path, access.prefix)):
        return _certified(request, access.client_names)
    if access.admission_names and request.path == ADMISSION_PATH:
        return _certified(request, access.admission_names)
    return None


def _certified(request: web.Request, allowed: frozenset[str]) -> web.HTTPException | None:
    """403 unless the caller presented a verified client certificate naming one of ``allowed``
    (any name when ``allowed`` is empty)."""
    peercert = request.transport.get_extra_info("peercert") if request.transport else None
    if not peercert:
        return web.HTTPForbidden(
            text="a client certificate signed by the extender's client CA is required (--tls-client-ca)\n"
        )
    names = cert_names(peercert)
    if allowed and not names & allowed:
        shown = ", ".join(sorted(names)) or "no name"
        return web.HTTPForbidden(
            text=f"client certificate names {shown}, not one of {', '.join(sorted(allowed))}\n"
        )
    return None


@web.middleware
async def checked(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = refusal(request)
    if refused is not None:
        # The body is not read: the connection cannot be reused for another request.
        refused.force_close()
        raise refused
    return await handler(request)


async def expect_continue(request: web.Request) -> None:
    """``Expect: 100-continue``: the caller and the declared body are checked before the
    client is told to send it (aiohttp's default answers 100 first)."""
    if request.version != (1, 1):
        return
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"unknown Expect: {expect}\n")
    refused = refusal(request) or body_refusal(request)
    if refused is not None:
        refused.force_close()
        raise refused
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0


def add_verb(app: web.Application, path: str, handler: Handler, *, large_body: bool = False) -> None:
    """Serve ``POST path``; ``large_body``: its body may carry a node list (up to
    ``--max-body-bytes``; others are held to the small limit)."""
    app.router.add_post(path, handler, expect_handler=expect_continue)
    if large_body:
        app.setdefault(LARGE_BODIES, set()).add(path)
