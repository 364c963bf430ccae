"""What a peer without a client certificate can make a listener hold: its share of the
connections, its address's share, idle connections that give way to new ones, bodies read
only for routes that exist and within each path's limit, and ``Expect: 100-continue``
answered only after the caller and the declared size are checked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from extender.httpapi.access import cert_names
from extender.httpapi.limits import (
    RECLAIM_AFTER_S,
    STALLED_AFTER_S,
    ConnectionGuard,
    Limits,
    _GuardedProtocol,
)
from extender.httpapi.server import ServeOptions, serve
from extender.reservations import ClusterCache
from extender.testing.extender import write_cluster


class Transport(asyncio.Transport):
    def __init__(self, peer: str, cert: bool = False) -> None:
        super().__init__()
        self.peer, self.cert = peer, cert
        self.closed = False
        self.written = b""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (self.peer, 40000)
        if name == "peercert":
            return {"subject": ((("commonName", "gangslice-scheduler"),),)} if self.cert else None
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _connect(guard: ConnectionGuard, peer: str, cert: bool = False) -> tuple[Transport, bool]:
    transport = Transport(peer, cert)
    proto = _GuardedProtocol(guard, asyncio.Protocol(), "scheduler")
    return transport, guard.admit(proto, transport)


def _age(guard: ConnectionGuard, seconds: float) -> None:
    for conn in guard.connections.values():
        conn.since -= seconds


def test_peers_without_a_certificate_cannot_take_the_reserved_connections() -> None:
    guard = ConnectionGuard(Limits(max_connections=16, reserved_connections=4, max_connections_per_peer=8))
    hogs = [_connect(guard, f"10.0.0.{i % 3}")[1] for i in range(12)]
    assert all(hogs)
    # Fresh connections (about to send their request) do not give way: the share is full.
    transport, admitted = _connect(guard, "10.0.0.9")
    assert (
        not admitted
        and b"429" in transport.written
        and b"without a client certificate (at most 12)" in (transport.written)
    )
    # The scheduler, with its certificate, has its reserved four.
    assert all(_connect(guard, "10.1.0.1", cert=True)[1] for _ in range(4))


def test_idle_connections_give_way_to_new_ones() -> None:
    guard = ConnectionGuard(Limits(max_connections=16, reserved_connections=4, max_connections_per_peer=8))
    hogs = [_connect(guard, f"10.0.0.{i % 3}")[0] for i in range(12)]
    _age(guard, RECLAIM_AFTER_S + 0.1)
    probe, admitted = _connect(guard, "10.2.0.1")
    assert admitted and not probe.closed
    assert sum(h.closed for h in hogs) == 1 and guard.reclaimed == 1
    # A connection in the middle of a request does not give way.
    for conn in guard.connections.values():
        conn.busy = True
    assert not _connect(guard, "10.2.0.2")[1]


def test_one_address_gets_its_own_cap() -> None:
    guard = ConnectionGuard(Limits(max_connections=64, max_connections_per_peer=4))
    assert all(_connect(guard, "10.0.0.1")[1] for _ in range(4))
    transport, admitted = _connect(guard, "10.0.0.1")
    assert not admitted and b"from 10.0.0.1 (at most 4)" in transport.written
    assert _connect(guard, "10.0.0.2")[1]


def test_handshakes_in_progress_are_capped_in_all_and_the_oldest_stalled_one_gives_way() -> None:
    guard = ConnectionGuard(Limits(max_connections=3, max_connections_per_peer=3))
    stalls = [Transport(f"10.0.0.{i}") for i in range(3)]
    for i, t in enumerate(stalls):
        assert guard.start_handshake(i, t.peer, t)
    # Young handshakes are never closed for a newcomer: it is refused.
    late = Transport("10.0.1.1")
    assert not guard.start_handshake("late", late.peer, late) and guard.refused == 1
    for h in guard.handshakes.values():
        h.started -= STALLED_AFTER_S
    assert guard.start_handshake("late", late.peer, late)
    assert [t.closed for t in stalls] == [True, False, False] and guard.stalled == 1
    assert set(guard.handshakes) == {1, 2, "late"}
    guard.end_handshake("late")
    assert len(guard.handshakes) == 2


def test_idle_connections_without_a_certificate_close_sooner() -> None:
    guard = ConnectionGuard(Limits(idle_timeout_s=60, unauthenticated_idle_timeout_s=5))
    anyone, _ = _connect(guard, "10.0.0.1")
    scheduler, _ = _connect(guard, "10.1.0.1", cert=True)
    _age(guard, 6)
    assert guard.sweep() == 1 and anyone.closed and not scheduler.closed


def test_uri_sans_name_no_one() -> None:
    cert = {
        "subject": ((("commonName", "intruder"),),),
        "subjectAltName": (("URI", "spiffe://cluster.local/gangslice-scheduler"), ("DNS", "intruder.svc")),
    }
    assert cert_names(cert) == {"intruder", "intruder.svc"}


async def _raw(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head``; send ``body`` only if the server says 100 Continue; the reply's bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
    try:
        async with asyncio.timeout(5):
            first = await reader.readuntil(b"\r\n\r\n")
            if first.startswith(b"HTTP/1.1 100") and body:
                writer.write(body)
                return first + await reader.read()
            return first + await reader.read()
    finally:
        writer.close()


def _serving(tmp_path: Path, check: Any) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limits = Limits(
        small_body_bytes=64 * 1024, max_body_bytes=1024 * 1024, bodies_in_flight_bytes=1024 * 1024
    )

    async def go() -> None:
        cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
        task = asyncio.create_task(serve(cache, ServeOptions(host="127.0.0.1", port=port, limits=limits)))
        await asyncio.sleep(0.5)
        try:
            await check(port)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())


def test_bodies_are_read_only_for_routes_and_within_each_paths_limit(tmp_path: Path) -> None:
    async def check(port: int) -> None:
        def head(path: str, size: int, expect: bool = True) -> bytes:
            extra = "Expect: 100-continue\r\n" if expect else ""
            return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n{extra}\r\n".encode()

        # No route: 404 before a byte of the body is asked for.
        got = await _raw(port, head("/nothing/here", 900_000))
        assert got.startswith(b"HTTP/1.1 404") and b"100 Continue" not in got
        # The admission webhook takes small bodies only; a verb with node lists takes more.
        got = await _raw(port, head("/admission/pods", 200_000))
        assert got.startswith(b"HTTP/1.1 413") and b"larger than 65536 bytes (200000 bytes declared)" in got
        got = await _raw(port, head("/gangslice/filter", 200_000), b"{" * 200_000)
        assert got.startswith(b"HTTP/1.1 100 Continue") and b"HTTP/1.1 400" in got
        # Without Expect, a body over the path's limit is refused from its declared length.
        got = await _raw(port, head("/admission/pods", 200_000, expect=False) + b"{")
        assert got.startswith(b"HTTP/1.1 413")

    _serving(tmp_path, check)


def test_bodies_in_flight_are_bounded(tmp_path: Path) -> None:
    async def check(port: int) -> None:
        size = 700 * 1024
        head = f"POST /gangslice/filter HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()
        # One body being sent slowly holds 700 KiB of the 1 MiB in flight...
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"{")
        await asyncio.sleep(0.3)
        # ...so a second as large waits its turn: 503 with Retry-After, its body unread.
        got = await _raw(port, head)
        assert got.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in got
        writer.close()
        await asyncio.sleep(0.3)
        got = await _raw(port, head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"), b"[" * size)
        assert got.startswith(b"HTTP/1.1 100 Continue") and b"HTTP/1.1 400" in got

    _serving(tmp_path, check)


def test_what_the_guards_closed_is_counted(tmp_path: Path) -> None:
    from extender.httpapi.metrics import Metrics

    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    metrics = Metrics(cache)
    guard = ConnectionGuard(Limits(max_connections=64, max_connections_per_peer=1))
    metrics.listeners.guards.append(("verbs", guard))
    _connect(guard, "10.0.0.1")
    _connect(guard, "10.0.0.1")
    _connect(guard, "10.1.0.1", cert=True)
    text = metrics.render().decode()
    assert 'gangslice_connections_closed_total{port="verbs",why="refused"} 1.0' in text
    assert 'gangslice_connections_open{peer="certified",port="verbs"} 1.0' in text
    assert 'gangslice_connections_open{peer="other",port="verbs"} 1.0' in text
    assert 'gangslice_connections_open{peer="handshaking",port="verbs"} 0.0' in text
    assert 'gangslice_connections_closed_total{port="verbs",why="stalled"} 0.0' in text
    assert "gangslice_leader_fence_refusals_total 0.0" in text
