"""Bounds on what a client can make the extender hold: body size and encoding, the time a
request may take to arrive, idle connections, and how many connections are open at once.

- A body is read whole before any handler runs, within ``body_timeout_s``. Only the verbs
  that carry node lists (:data:`LARGE_BODIES`) take up to ``max_body_bytes``; every other
  path up to ``small_body_bytes``, and a path that is no route is answered 404 without
  reading its body. A declared ``Content-Length`` beyond the limit is refused before
  reading, and so is one that would take the bodies being read at once past
  ``bodies_in_flight_bytes`` (503: retry).
- Any ``Content-Encoding`` but ``identity`` is refused with 415: the schedulers send plain
  JSON, and an inflated body would escape the size limit (aiohttp's own inflation is off).
- A TLS handshake must end within ``handshake_timeout_s``. Handshakes in progress are counted
  apart from connections (the peer's identity is not known yet): at most
  ``max_connections_per_peer`` from one address and ``max_connections`` in all, and a full
  count makes room by closing its oldest handshake once that one has stalled.
- A connection that has not sent a whole request head within ``header_timeout_s`` of its first
  byte, or sits idle longer than ``idle_timeout_s``, is closed.
- Connections are of two kinds: those whose peer presented a client certificate that
  verified (the scheduler, on a listener that asks for one) and the rest (probes, anyone
  else who can reach the port). The rest may hold at most ``max_connections`` less
  ``reserved_connections``, at most ``max_connections_per_peer`` from one address, sit idle
  ``unauthenticated_idle_timeout_s`` at most and send ``unauthenticated_requests`` requests
  per connection. When a new connection finds its share full, the longest idle connection
  of that share is closed to make room (an idle keep-alive connection holds nothing a
  client is waiting for); only when none is idle is the new one answered 429 and closed.
  So clients that open connections and keep them idle cannot lock the scheduler, or a
  kubelet's probe, out.

Every refusal is a 4xx (or 503 for a retry) with a one-line reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web

log = logging.getLogger(__name__)

#: A full NodeList (nodeCacheCapable: false) of thousands of nodes is tens of MiB.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: From a connection's first byte (or the end of its last reply) to a whole request head.
    header_timeout_s: float = 10.0
    #: From the request head to the last byte of its body.
    body_timeout_s: float = 30.0
    #: A connection with no request in flight is closed after this long.
    idle_timeout_s: float = 60.0
    max_connections: int = 256
    #: How often open connections are checked against the timeouts.
    sweep_s: float = 0.5
    #: Largest body of a path that carries no node list (an AdmissionReview holds a pod,
    #: at most 1.5 MiB in etcd, twice on an update).
    small_body_bytes: int = 4 * 1024 * 1024
    #: Bodies being read at once, all connections together.
    bodies_in_flight_bytes: int = 96 * 1024 * 1024
    handshake_timeout_s: float = 5.0
    #: Connections kept for peers with a verified client certificate (None: a quarter).
    reserved_connections: int | None = None
    max_connections_per_peer: int = 32
    unauthenticated_idle_timeout_s: float = 5.0
    unauthenticated_requests: int = 100

    def problems(self) -> list[str]:
        out = []
        if self.max_body_bytes < 1024:
            out.append(f"max body bytes {self.max_body_bytes}: must be at least 1024")
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "idle_timeout_s",
            "handshake_timeout_s",
            "unauthenticated_idle_timeout_s",
        ):
            value = getattr(self, name)
            if not value > 0:
                out.append(f"{name.removesuffix('_s').replace('_', ' ')} {value:g}: must be positive")
        if self.max_connections < 1:
            out.append(f"max connections {self.max_connections}: must be at least 1")
        if not 0 <= self.reserved < self.max_connections:
            out.append(
                f"reserved connections {self.reserved}: must be at least 0 and fewer than "
                f"max connections ({self.max_connections})"
            )
        for name in ("max_connections_per_peer", "unauthenticated_requests"):
            if getattr(self, name) < 1:
                out.append(f"{name.replace('_', ' ')} {getattr(self, name)}: must be at least 1")
        if self.bodies_in_flight_bytes < self.max_body_bytes:
            out.append(
                f"bodies in flight {self.bodies_in_flight_bytes} bytes: must be at least the max body "
                f"bytes ({self.max_body_bytes})"
            )
        return out

    @property
    def reserved(self) -> int:
        if self.reserved_connections is not None:
            return self.reserved_connections
        return self.max_connections // 4

    def body_limit(self, large: bool) -> int:
        return self.max_body_bytes if large else min(self.small_body_bytes, self.max_body_bytes)


def runner_options(limits: Limits) -> dict[str, Any]:
    """Keyword arguments of ``web.AppRunner`` (passed on to each connection's handler)."""
    return {
        "access_log": None,
        "auto_decompress": False,
        "keepalive_timeout": limits.idle_timeout_s,
        # A request whose body was refused unread is not drained for long: the connection closes.
        "lingering_time": 1.0,
    }


@dataclass
class _Connection:
    listener: str
    opened: float
    #: End of the last reply (or the connection's start): idle since then.
    since: float
    #: When the first byte of a request not yet handled arrived.
    first_byte: float | None = None
    busy: bool = False
    transport: asyncio.BaseTransport | None = None
    #: The peer presented a client certificate that verified.
    authenticated: bool = False
    #: The peer's address.
    peer: str = ""
    requests: int = 0

    @property
    def idle(self) -> bool:
        return not self.busy and self.first_byte is None


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's connection handler behind a proxy that reports to the guard."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol, listener: str) -> None:
        self.guard, self.inner, self.listener = guard, inner, listener
        self.refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.guard.admit(self, transport):
            self.refused = True
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        conn = self.guard.connections.get(self.inner)
        if conn is not None and not conn.busy and conn.first_byte is None:
            conn.first_byte = time.monotonic()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.guard.connections.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()


class _Handshake(asyncio.Protocol):
    """A TLS connection until its handshake ends: counted by the guard
    (:meth:`ConnectionGuard.start_handshake`), its bytes read only by TLS; then aiohttp's
    handler, behind a :class:`_GuardedProtocol`, takes the TLS transport and is admitted as a
    connection with or without a certificate."""

    def __init__(
        self,
        guard: ConnectionGuard,
        server: Callable[[], asyncio.Protocol],
        listener: str,
        tls: ssl.SSLContext,
    ) -> None:
        self.guard, self.server, self.listener, self.tls = guard, server, listener, tls
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = _host(transport.get_extra_info("peername"))
        if not self.guard.start_handshake(self, peer, transport):
            transport.abort()  # no TLS yet to say why in: the refusal is counted
            return
        # Nothing may reach this protocol: TLS reads the ClientHello once it takes over.
        transport.pause_reading()
        self.task = asyncio.get_running_loop().create_task(self._upgrade(transport, peer))

    async def _upgrade(self, transport: asyncio.Transport, peer: str) -> None:
        guarded = _GuardedProtocol(self.guard, self.server(), self.listener)
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport,
                guarded,
                self.tls,
                server_side=True,
                ssl_handshake_timeout=self.guard.limits.handshake_timeout_s,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as exc:
            log.debug("TLS handshake from %s failed: %s", peer, exc)
            transport.abort()
            return
        finally:
            self.guard.end_handshake(self)
        if tls is None:  # the peer went away as the handshake ended
            transport.abort()
            return
        guarded.connection_made(tls)

    def data_received(self, data: bytes) -> None:  # reading is paused until TLS takes over
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass


TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


#: Seconds a connection must have been idle before it may be closed to make room.
RECLAIM_AFTER_S = 1.0
#: Seconds a TLS handshake must have taken before it may be closed to make room.
STALLED_AFTER_S = 0.5


@dataclass
class _Pending:
    """A TLS handshake in progress."""

    peer: str
    started: float
    transport: asyncio.Transport


def _host(peername: object) -> str:
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return str(peername or "")


class ConnectionGuard:
    """Open connections of every listener, their state, the room each kind of peer has, and
    the sweep that closes the ones past a timeout."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections: dict[object, _Connection] = {}
        self.refused = 0
        self.timed_out = 0
        #: Idle connections closed to make room for a new one.
        self.reclaimed = 0
        #: Bytes of the bodies being read or handled now (see :func:`bounded`).
        self.in_flight_bytes = 0
        #: TLS handshakes in progress (see :meth:`start_handshake`).
        self.handshakes: dict[object, _Pending] = {}
        #: Handshakes closed, still unfinished, to make room for a new one.
        self.stalled = 0

    def protocol_factory(
        self, server: Callable[[], asyncio.Protocol], listener: str, tls: ssl.SSLContext | None = None
    ) -> Callable[[], asyncio.Protocol]:
        if tls is not None:
            return lambda: _Handshake(self, server, listener, tls)
        return lambda: _GuardedProtocol(self, server(), listener)

    def start_handshake(self, key: object, peer: str, transport: asyncio.Transport) -> bool:
        """Count a TLS handshake from ``peer``: at most ``max_connections_per_peer`` from one
        address and ``max_connections`` in all. A full pool makes room by closing its oldest
        handshake, once that has taken :data:`STALLED_AFTER_S` (a real client's takes
        milliseconds), so a stalled one never keeps the scheduler from a new connection; else
        the new one is refused and counted."""
        limits, now = self.limits, time.monotonic()
        for among, cap in (
            ([h for h in self.handshakes.values() if h.peer == peer], limits.max_connections_per_peer),
            (list(self.handshakes.values()), limits.max_connections),
        ):
            if len(among) < cap:
                continue
            oldest = min(among, key=lambda h: h.started)
            if now - oldest.started < STALLED_AFTER_S:
                self.refused += 1
                return False
            oldest.transport.abort()
            self.handshakes = {k: h for k, h in self.handshakes.items() if h is not oldest}
            self.stalled += 1
        self.handshakes[key] = _Pending(peer, now, transport)
        return True

    def end_handshake(self, key: object) -> None:
        self.handshakes.pop(key, None)

    def admit(self, proto: _GuardedProtocol, transport: asyncio.BaseTransport) -> bool:
        authenticated = bool(transport.get_extra_info("peercert"))
        peer = _host(transport.get_extra_info("peername"))
        refusal = self._room(authenticated, peer)
        if refusal:
            self.refused += 1
            reason = (refusal + "; retry\n").encode()
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(TOO_MANY % (len(reason), reason))
            transport.close()
            return False
        now = time.monotonic()
        self.connections[proto.inner] = _Connection(
            proto.listener, now, now, transport=transport, authenticated=authenticated, peer=peer
        )
        return True

    def _room(self, authenticated: bool, peer: str) -> str:
        """Make room for a new connection (closing idle ones); the refusal if there is none."""
        limits = self.limits
        if not authenticated:
            mine = [c for c in self.connections.values() if not c.authenticated and c.peer == peer]
            if len(mine) >= limits.max_connections_per_peer and not self._reclaim(mine):
                return f"too many open connections from {peer} (at most {limits.max_connections_per_peer})"
            share = limits.max_connections - limits.reserved
            others = [c for c in self.connections.values() if not c.authenticated]
            if len(others) >= share and not self._reclaim(others):
                return f"too many open connections without a client certificate (at most {share})"
        if len(self.connections) >= limits.max_connections:
            conns = list(self.connections.values())
            if not self._reclaim([c for c in conns if not c.authenticated]) and not self._reclaim(conns):
                return f"too many open connections (at most {limits.max_connections})"
        return ""

    def _reclaim(self, among: list[_Connection]) -> bool:
        # A connection opened (or answered) a moment ago is about to send its request.
        now = time.monotonic()
        idle = [c for c in among if c.idle and c.transport is not None and now - c.since >= RECLAIM_AFTER_S]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.since)
        assert oldest.transport is not None
        oldest.transport.close()
        for key, conn in list(self.connections.items()):
            if conn is oldest:
                del self.connections[key]
        self.reclaimed += 1
        return True

    def listener_of(self, handler: object) -> str | None:
        conn = self.connections.get(handler)
        return conn.listener if conn is not None else None

    @contextlib.contextmanager
    def handling(self, handler: object) -> Iterator[_Connection | None]:
        conn = self.connections.get(handler)
        if conn is not None:
            conn.busy, conn.first_byte = True, None
            conn.requests += 1
        try:
            yield conn
        finally:
            if conn is not None:
                conn.busy, conn.since = False, time.monotonic()

    def last_request(self, conn: _Connection | None) -> bool:
        """Whether the connection must close after this reply (its peer's request count)."""
        return (
            conn is not None
            and not conn.authenticated
            and conn.requests >= self.limits.unauthenticated_requests
        )

    def sweep(self, now: float | None = None) -> int:
        """Close connections past a timeout; returns how many."""
        now = time.monotonic() if now is None else now
        late = []
        for conn in self.connections.values():
            if conn.busy:
                continue
            if conn.first_byte is not None:
                if now - conn.first_byte > self.limits.header_timeout_s:
                    late.append(conn)
            elif now - conn.since > self._idle_limit(conn):
                late.append(conn)
        for conn in late:
            if conn.transport is not None:
                conn.transport.close()
        self.timed_out += len(late)
        return len(late)

    def _idle_limit(self, conn: _Connection) -> float:
        if conn.authenticated:
            return self.limits.idle_timeout_s
        return min(self.limits.idle_timeout_s, self.limits.unauthenticated_idle_timeout_s)

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.limits.sweep_s)
            self.sweep()


class GuardedSite(web.TCPSite):
    """A TCP site whose connections go through a :class:`ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard, listener: str, **kw: Any) -> None:
        super().__init__(runner, **kw)
        self._guard, self._listener = guard, listener

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        # TLS is started by the guard's handshake protocol (:class:`_Handshake`), so handshakes
        # in progress are counted, not only the connections that finished theirs.
        self._server = await loop.create_server(
            self._guard.protocol_factory(server, self._listener, self._ssl_context),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


LIMITS = web.AppKey("limits", Limits)
GUARD = web.AppKey("guard", ConnectionGuard)
#: The paths whose bodies may be ``max_body_bytes`` long (the verbs that carry node lists).
LARGE_BODIES: web.AppKey[set[str]] = web.AppKey("large_bodies")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def one_line(text: str) -> str:
    return " ".join(text.split()) + "\n"


async def no_route(request: web.Request) -> web.StreamResponse:
    """The route of every path that is no other route's (so that its ``Expect`` is checked
    too): 404, its body never read (see :func:`body_refusal`)."""
    raise _not_found(request)


def _not_found(request: web.Request) -> web.HTTPNotFound:
    error = web.HTTPNotFound(text=one_line(f"no route for {request.method} {request.path}"))
    error.force_close()
    return error


def _body_limit(request: web.Request) -> int:
    limits = request.app.get(LIMITS) or Limits()
    return limits.body_limit(request.path in request.app.get(LARGE_BODIES, ()))


def body_refusal(request: web.Request) -> web.HTTPException | None:
    """Why the request's body must not be read (checked before a byte of it is): no route,
    an encoding, a declared size over the path's limit, or no room among the bodies in
    flight. None: read it."""
    if request.match_info.http_exception is not None or request.match_info.handler is no_route:
        return _not_found(request)
    limits = request.app.get(LIMITS) or Limits()
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if encoding not in ("", "identity"):
        return web.HTTPUnsupportedMediaType(
            text=one_line(f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed")
        )
    limit = _body_limit(request)
    declared = request.content_length
    if declared is not None and declared > limit:
        return _too_large(limit, declared)
    guard = request.app.get(GUARD)
    if guard is not None and request.body_exists:
        wanted = declared if declared is not None else limit
        if guard.in_flight_bytes + wanted > limits.bodies_in_flight_bytes:
            busy = web.HTTPServiceUnavailable(
                text=one_line(
                    f"{guard.in_flight_bytes} bytes of request bodies are being handled; "
                    f"{wanted} more would pass {limits.bodies_in_flight_bytes}: retry"
                ),
                headers={"Retry-After": "1"},
            )
            busy.force_close()
            return busy
    return None


@web.middleware
async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what :func:`body_refusal` refuses, read the body within its time limit while
    it counts against the bodies in flight, and tell the guard a request is in flight (the
    idle and header timeouts do not apply meanwhile)."""
    refusal = body_refusal(request)
    if refusal is not None:
        raise refusal
    limits = request.app.get(LIMITS) or Limits()
    guard = request.app.get(GUARD)
    # A declared length was checked above (the parser reads no more than it declares); a
    # chunked body is held to its path's limit while it is read.
    held = request.content_length or 0
    if request.body_exists and request.content_length is None:
        held = _body_limit(request)
        request = request.clone(client_max_size=held)
    with guard.handling(request.protocol) if guard is not None else contextlib.nullcontext() as conn:
        try:
            if request.body_exists:
                if guard is not None:
                    guard.in_flight_bytes += held
                try:
                    async with asyncio.timeout(limits.body_timeout_s):
                        await request.read()
                except TimeoutError:
                    response = web.Response(
                        status=408,
                        text=one_line(f"request body not received within {limits.body_timeout_s:g} s"),
                    )
                    response.force_close()
                    return response
                except web.HTTPRequestEntityTooLarge:
                    raise _too_large(held, None) from None
            reply = await handler(request)
            if guard is not None and guard.last_request(conn):
                reply.force_close()
            return reply
        finally:
            if guard is not None:
                guard.in_flight_bytes -= held


def _too_large(limit: int, declared: int | None) -> web.HTTPRequestEntityTooLarge:
    size = f" ({declared} bytes declared)" if declared is not None else ""
    error = web.HTTPRequestEntityTooLarge(
        max_size=limit,
        actual_size=declared or limit + 1,
        text=one_line(f"request body larger than {limit} bytes{size}"),
    )
    error.force_close()
    return error
