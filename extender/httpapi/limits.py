"""Bounds on what a client can make the extender hold: body size and encoding, the time a
request may take to arrive, idle connections, and how many connections are open at once.

- A body is read whole before any handler runs, within ``body_timeout_s`` and up to
  ``max_body_bytes`` (a declared ``Content-Length`` beyond it is refused before reading);
  this covers every POST route, the Volcano session verbs included.
- Any ``Content-Encoding`` but ``identity`` is refused with 415: the schedulers send plain
  JSON, and an inflated body would escape the size limit (aiohttp's own inflation is off).
- A connection that has not sent a whole request head within ``header_timeout_s`` of its
  first byte, or sits idle longer than ``idle_timeout_s``, is closed; beyond
  ``max_connections`` open connections a new one is answered 429 and closed.

Every refusal is a 4xx with a one-line reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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

    def problems(self) -> list[str]:
        out = []
        if self.max_body_bytes < 1024:
            out.append(f"max body bytes {self.max_body_bytes}: must be at least 1024")
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                out.append(f"{name.removesuffix('_s').replace('_', ' ')} {value:g}: must be positive")
        if self.max_connections < 1:
            out.append(f"max connections {self.max_connections}: must be at least 1")
        return out


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


TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class ConnectionGuard:
    """Open connections of every listener, their state, and the sweep that closes the
    ones past a timeout."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections: dict[object, _Connection] = {}
        self.refused = 0
        self.timed_out = 0

    def protocol_factory(
        self, server: Callable[[], asyncio.Protocol], listener: str
    ) -> Callable[[], asyncio.Protocol]:
        return lambda: _GuardedProtocol(self, server(), listener)

    def admit(self, proto: _GuardedProtocol, transport: asyncio.BaseTransport) -> bool:
        if len(self.connections) >= self.limits.max_connections:
            self.refused += 1
            reason = f"too many open connections (at most {self.limits.max_connections}); retry\n".encode()
            if isinstance(transport, asyncio.WriteTransport):
                transport.write(TOO_MANY % (len(reason), reason))
            transport.close()
            return False
        now = time.monotonic()
        self.connections[proto.inner] = _Connection(proto.listener, now, now, transport=transport)
        return True

    def listener_of(self, handler: object) -> str | None:
        conn = self.connections.get(handler)
        return conn.listener if conn is not None else None

    @contextlib.contextmanager
    def handling(self, handler: object) -> Iterator[None]:
        conn = self.connections.get(handler)
        if conn is not None:
            conn.busy, conn.first_byte = True, None
        try:
            yield
        finally:
            if conn is not None:
                conn.busy, conn.since = False, time.monotonic()

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
            elif now - conn.since > self.limits.idle_timeout_s:
                late.append(conn)
        for conn in late:
            if conn.transport is not None:
                conn.transport.close()
        self.timed_out += len(late)
        return len(late)

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
        self._server = await loop.create_server(
            self._guard.protocol_factory(server, self._listener),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


LIMITS = web.AppKey("limits", Limits)
GUARD = web.AppKey("guard", ConnectionGuard)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def one_line(text: str) -> str:
    return " ".join(text.split()) + "\n"


@web.middleware
async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse encoded and oversized bodies, read the body within its time limit, and tell
    the guard a request is in flight (the idle and header timeouts do not apply meanwhile)."""
    limits = request.app.get(LIMITS) or Limits()
    guard = request.app.get(GUARD)
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if encoding not in ("", "identity"):
        raise web.HTTPUnsupportedMediaType(
            text=one_line(f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed")
        )
    with guard.handling(request.protocol) if guard is not None else contextlib.nullcontext():
        if request.body_exists:
            declared = request.content_length
            if declared is not None and declared > limits.max_body_bytes:
                raise _too_large(limits.max_body_bytes, declared)
            try:
                async with asyncio.timeout(limits.body_timeout_s):
                    await request.read()
            except TimeoutError:
                response = web.Response(
                    status=408, text=one_line(f"request body not received within {limits.body_timeout_s:g} s")
                )
                response.force_close()
                return response
            except web.HTTPRequestEntityTooLarge:
                raise _too_large(limits.max_body_bytes, None) from None
        return await handler(request)


def _too_large(limit: int, declared: int | None) -> web.HTTPRequestEntityTooLarge:
    size = f" ({declared} bytes declared)" if declared is not None else ""
    error = web.HTTPRequestEntityTooLarge(
        max_size=limit,
        actual_size=declared or limit + 1,
        text=one_line(f"request body larger than {limit} bytes{size}"),
    )
    error.force_close()
    return error
