"""A bounded hostile load on ``gangslice serve`` over loopback, with the figures it leaves:
the server's RSS after the run and at its peak, the slowest ``/healthz`` answered during it,
the replies by status, and whether the server survived.

The server runs as its own process (``gangslice serve --cluster``) so its memory is its
own; the load is a few hundred requests of the kinds an attacker inside the cluster would
send: node lists of invented names far longer than the cluster, invented names within the
bound, a GPU count per request never asked before, bodies declared or sent beyond the size
limit, compressed and broken compressed bodies (session verbs too), bodies that are not
JSON or nested too deeply, connections that trickle their headers or body or sit idle, and
more connections than the cap. Meanwhile ``/healthz`` is asked every 50 ms. Then:

- the lockout: 256 keep-alive clients from eight other loopback addresses hold connections
  idle while the scheduler's address makes calls (they must be answered), and 64 clients of
  one address stop mid-request (beyond its cap they get 429);
- the body flood, on a second server with the default limits: 64 bodies of 30 MiB at once to
  a node-list verb, a path that is no route and the admission webhook (peak RSS, /healthz);
- forged calls on a third, with the default install's TLS and mutual TLS
  (:mod:`extender.bench.forged`), then connections from eight other addresses that never start
  TLS, twice what each may hold, while the scheduler makes calls on new TLS connections.

``gangslice bench extender --hostile`` prints the figures; tests/unit/test_hostile_load.py
checks them. The metrics port and the OpenShift install's verbs ask the API server, so their
loads run on a real kube-apiserver (:mod:`extender.bench.hostile_api`, with ``--bin-dir``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.bench.forged import ForgedFigures, _status, forged_calls, make_pki
from extender.httpapi.limits import RECLAIM_AFTER_S, STALLED_AFTER_S
from extender.kube import names as keys

CLUSTER = """\
levels: [fabric.topograph.run/tier-0]
nodes:
  - name: h
    count: 32
    labels: {fabric.topograph.run/tier-0: leaf-1}
    gpuTopology: hgx-h100
  - name: g
    count: 32
    labels: {fabric.topograph.run/tier-0: leaf-2}
    gpuTopology: hgx-h100
"""
NODES = [f"h-{i}" for i in range(32)] + [f"g-{i}" for i in range(32)]
#: Tight limits for the run, so the slow-connection cases end within seconds.
SERVE_FLAGS = (
    "--header-timeout=1",
    "--body-timeout=1",
    "--idle-timeout=2",
    "--max-connections=64",
    "--max-body-bytes=4194304",
)


@dataclass
class Figures:
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0
    rss_peak_mib: float = 0.0
    healthz_checks: int = 0
    healthz_slowest_ms: float = 0.0
    healthz_median_ms: float = 0.0
    #: Replies by status ("closed" for a connection the server closed without a reply).
    statuses: Counter[str] = field(default_factory=Counter)
    #: Replies that were neither 2xx nor a 4xx with a one-line reason (should stay empty).
    bad_replies: list[str] = field(default_factory=list)
    #: Slow or idle connections still open past their timeout (should be 0).
    slow_connections_left_open: int = 0
    crashed: bool = False
    requests: int = 0
    seconds: float = 0.0
    #: Idle keep-alive connections held open by other addresses during the lockout phase.
    lockout_clients: int = 0
    #: Of those, the ones whose first request was answered (the rest were refused a place).
    lockout_answered: int = 0
    #: Calls (filters, /healthz) made meanwhile from the scheduler's address, and how many
    #: were answered 200.
    lockout_calls: int = 0
    lockout_ok: int = 0
    #: Concurrent bodies of ``flood_body_mib`` sent to the verbs, 404 paths and the admission
    #: webhook of a server with the default limits; its peak RSS and slowest /healthz then.
    flood_bodies: int = 0
    flood_body_mib: int = 0
    flood_statuses: Counter[str] = field(default_factory=Counter)
    flood_rss_peak_mib: float = 0.0
    flood_healthz_slowest_ms: float = 0.0
    #: Forged identities' calls on the default install's listeners (:mod:`extender.bench.forged`).
    forged: ForgedFigures = field(default_factory=ForgedFigures)
    #: Connections from other addresses that never start TLS on the default install's port,
    #: how many of them it still held after the scheduler's calls, and those calls (each on a
    #: new TLS connection) and how many were answered 200.
    stall_clients: int = 0
    stalls_held: int = 0
    stall_calls: int = 0
    stall_ok: int = 0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["statuses"] = dict(sorted(self.statuses.items()))
        out["flood_statuses"] = dict(sorted(self.flood_statuses.items()))
        out["forged"] = {
            "sent": {f"{k[0]}: {k[1]}": v for k, v in sorted(self.forged.sent.items())},
            "reached": {f"{k[0]}: {k[1]}": v for k, v in sorted(self.forged.reached.items())},
            "control_sent": self.forged.control_sent,
            "control_reached": self.forged.control_reached,
        }
        return out

    def render(self) -> str:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))
        return "\n".join(
            [
                f"hostile load: {self.requests} requests in {self.seconds:.1f} s over loopback",
                f"  server RSS: {self.rss_before_mib:.0f} MiB before, {self.rss_after_mib:.0f} MiB after, "
                f"{self.rss_peak_mib:.0f} MiB peak",
                f"  /healthz during it: {self.healthz_checks} checks, "
                f"median {self.healthz_median_ms:.1f} ms, slowest {self.healthz_slowest_ms:.1f} ms",
                f"  replies by status: {counts}",
                f"  replies neither 2xx nor a one-line 4xx: {len(self.bad_replies)}",
                f"  slow or idle connections left open past their timeout: {self.slow_connections_left_open}",
                f"  server crashed: {'yes' if self.crashed else 'no'}",
                f"lockout: {self.lockout_clients} keep-alive clients from other addresses "
                f"({self.lockout_answered} answered, then idle); "
                f"{self.lockout_ok} of {self.lockout_calls} filters and probes answered 200 meanwhile",
                f"body flood (default limits): {self.flood_bodies} concurrent bodies of "
                f"{self.flood_body_mib} MiB; peak RSS {self.flood_rss_peak_mib:.0f} MiB, "
                f"slowest /healthz {self.flood_healthz_slowest_ms:.0f} ms; replies "
                + ", ".join(f"{k}: {v}" for k, v in sorted(self.flood_statuses.items())),
                *self.forged.render(),
                f"handshake stalls (default install): {self.stall_clients} connections from "
                f"{len(HOG_SOURCES)} other addresses that never start TLS, {self.stalls_held} still held "
                f"after; {self.stall_ok} of {self.stall_calls} scheduler calls on new TLS connections "
                "answered 200 meanwhile",
            ]
        )


def _rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def served(
    folder: Path, *extra: str, flags: tuple[str, ...] = SERVE_FLAGS, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    """``gangslice serve --cluster`` on a free loopback port, until the block ends."""
    cluster = folder / "cluster.yaml"
    cluster.write_text(CLUSTER)
    port = _free_port()
    cmd = [sys.executable, "-m", "extender.cli", "serve", "--cluster", str(cluster)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "error", *flags, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"gangslice serve exited: {proc.stderr.read().decode() if proc.stderr else ''}"
                )
            with contextlib.suppress(OSError):
                status, _ = await request(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", tls=tls)
                if status == "200":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("gangslice serve did not answer /healthz within 30 s")
            await asyncio.sleep(0.1)
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def request(
    port: int,
    head_and_body: bytes,
    timeout_s: float = 10.0,
    source: str = "127.0.0.1",
    tls: ssl.SSLContext | None = None,
) -> tuple[str, bytes]:
    """Send raw bytes as one request (``Connection: close`` is added) and read the reply:
    (status, body), status "closed" when the server closed without one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), ssl=tls)
    try:
        head, _, body = head_and_body.partition(b"\r\n\r\n")
        writer.write(head + b"\r\nConnection: close\r\n\r\n" + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        try:
            async with asyncio.timeout(timeout_s):
                raw = await reader.read()
        except ConnectionError:
            raw = b""
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not raw:
        return "closed", b""
    status_line, _, rest = raw.partition(b"\r\n")
    parts = status_line.split()
    return (parts[1].decode() if len(parts) > 1 else "?"), rest.partition(b"\r\n\r\n")[2]


def post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n{extra}"
    return head.encode() + b"\r\n" + body


def pod(gpus: int, name: str = "p", gang: str | None = None) -> dict[str, Any]:
    labels = {keys.GANG: gang} if gang else {}
    annotations = {keys.GANG_SIZE: "4"} if gang else {}
    res = {"limits": {keys.GPU_RESOURCE: str(gpus)}}
    return {
        "metadata": {
            "name": name,
            "namespace": "t",
            "uid": f"u-{name}",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "c", "resources": res}]},
    }


def cases() -> list[tuple[str, bytes]]:
    """(label, raw request) of the hostile run, a few hundred in all."""
    out: list[tuple[str, bytes]] = []
    invented = [f"ghost-{i:06d}" for i in range(20_000)]
    for verb in ("filter", "prioritize"):
        body = json.dumps({"Pod": pod(4), "NodeNames": invented}).encode()
        out += [(f"{verb} of 20,000 invented names", post(f"/gangslice/{verb}", body))] * 8
    for i in range(40):
        names = NODES + [f"nobody-{i}-{j}" for j in range(900)]
        verb = "filter" if i % 2 else "prioritize"
        body = json.dumps({"Pod": pod(1 + i % 8), "NodeNames": names}).encode()
        out.append((f"{verb} of real and invented names", post(f"/gangslice/{verb}", body)))
    for gpus in range(1, 121):
        body = json.dumps({"Pod": pod(gpus, f"p{gpus}"), "NodeNames": NODES}).encode()
        out.append(("filter of a GPU count never asked", post("/gangslice/filter", body)))
    for i in range(20):
        body = json.dumps({"Pod": pod(8, f"m{i}", gang=f"invented-{i}"), "NodeNames": NODES}).encode()
        out.append(("filter of an invented gang", post("/gangslice/filter", body)))
    bomb = gzip.compress(b"[" * 4_000_000, compresslevel=9)
    for path in ("/gangslice/filter", "/gangslice/volcano/onSessionOpen", "/gangslice/volcano/predicate"):
        out += [("gzip body", post(path, bomb, "Content-Encoding: gzip\r\n"))] * 4
        out += [("broken gzip body", post(path, b"\x1f\x8b not gzip", "Content-Encoding: gzip\r\n"))] * 2
    big = b'{"Pod": {}, "NodeNames": ["' + b"x" * (6 * 1024 * 1024) + b'"]}'
    for path in ("/gangslice/filter", "/gangslice/volcano/onSessionOpen"):
        out += [("body over the limit", post(path, big))] * 3
        declared = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n".encode() + b"{"
        out += [("50 MB declared", declared)] * 3
    for raw in (b"{", b"[" * 100_000 + b"]" * 100_000, b'{"Pod": 7}', "\u00ff".encode("latin-1")):
        out += [("not JSON or not the shape", post("/gangslice/filter", raw))] * 3
    long_name = json.dumps({"Pod": pod(1), "NodeNames": ["n" * 300]}).encode()
    out += [("a name longer than a node name", post("/gangslice/prioritize", long_name))] * 3
    bind = json.dumps({"PodName": "nobody", "PodNamespace": "kube-system", "Node": "h-0"}).encode()
    out += [("bind of a pod nobody created", post("/gangslice/bind", bind))] * 5
    return out


async def slow_connections(
    port: int, n: int, kind: str, source: str = "127.0.0.1"
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    conns = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        if kind == "headers":
            writer.write(b"POST /gangslice/filter HTTP/1.1\r\nHost: x\r\n")
        elif kind == "body":
            writer.write(b"POST /gangslice/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        conns.append((reader, writer))
    return conns


async def trickle(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]], seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _, writer in conns:
            if not writer.is_closing():
                writer.write(b"X")
        await asyncio.sleep(0.2)


async def still_open(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> int:
    left = 0
    for reader, writer in conns:
        try:
            async with asyncio.timeout(0.5):
                await reader.read()
        except TimeoutError:
            left += 1
        except ConnectionError:
            pass
        with contextlib.suppress(Exception):
            writer.close()
    return left


POLLER = """
import select, socket, sys, time
port = int(sys.argv[1])
while not select.select([sys.stdin], [], [], 0.05)[0]:
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
        ok = reply.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    print((time.perf_counter() - start) * 1000 if ok else "inf", flush=True)
"""


def start_poller(port: int) -> subprocess.Popen[str]:
    """``/healthz`` every 50 ms from a process of its own (the load generator's work must
    not count as the server's latency), one figure in ms per line, until stdin closes."""
    return subprocess.Popen(
        [sys.executable, "-c", POLLER, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def stop_poller(poller: subprocess.Popen[str]) -> list[float]:
    out, _ = poller.communicate("stop\n", timeout=30)
    return [float(line) for line in out.split()]


def _judge(status: str, body: bytes) -> str | None:
    if status.startswith("2"):
        return None
    if status.startswith("4"):
        text = body.decode("utf-8", "replace")
        if text.strip() and "\n" not in text.strip() and len(text) < 500:
            return None
        return f"{status} without a one-line reason: {text[:120]!r}"
    if status == "closed":
        return None
    return f"{status}: {body[:120]!r}"


async def run_hostile(concurrency: int = 2) -> Figures:
    figures = Figures()
    with tempfile.TemporaryDirectory() as folder:
        async with served(Path(folder)) as (proc, port):
            figures.rss_before_mib = _rss_mib(proc.pid)
            poller = start_poller(port)
            started = time.monotonic()
            slow = await slow_connections(port, 8, "headers") + await slow_connections(port, 8, "body")
            idle = await slow_connections(port, 8, "idle")
            trickling = asyncio.create_task(trickle(slow, 4.0))
            work = cases()
            queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
            for item in work:
                queue.put_nowait(item)

            async def worker() -> None:
                while not queue.empty():
                    label, raw = queue.get_nowait()
                    try:
                        status, body = await request(port, raw)
                    except (ConnectionError, TimeoutError) as exc:
                        status, body = "closed", str(exc).encode()
                    figures.statuses[status] += 1
                    bad = _judge(status, body)
                    if bad:
                        figures.bad_replies.append(f"{label}: {bad}")
                    figures.rss_peak_mib = max(figures.rss_peak_mib, _rss_mib(proc.pid))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            await trickling
            await asyncio.sleep(1.0)
            figures.slow_connections_left_open = await still_open(slow + idle)
            times = stop_poller(poller)
            await lockout(port, figures)
            figures.seconds = time.monotonic() - started
            figures.requests = len(work) + len(times)
            figures.healthz_checks = len(times)
            ordered = sorted(times)
            figures.healthz_slowest_ms = ordered[-1] if ordered else float("inf")
            figures.healthz_median_ms = ordered[len(ordered) // 2] if ordered else float("inf")
            figures.crashed = proc.poll() is not None
            if not figures.crashed:
                figures.rss_after_mib = _rss_mib(proc.pid)
                figures.rss_peak_mib = max(figures.rss_peak_mib, _rss_mib(proc.pid, "VmHWM"))
        async with served(Path(folder), flags=()) as (proc, port):
            await body_flood(proc, port, figures)
        pki = make_pki(Path(folder))
        volcano_port = _free_port()
        extra = (*pki.serve_flags(), f"--volcano-port={volcano_port}")
        body = json.dumps({"Pod": pod(1), "NodeNames": NODES}).encode()
        async with served(Path(folder), *extra, flags=(), tls=pki.client("scheduler")) as (_, port):
            await forged_calls(pki, port, volcano_port, body, figures.forged)
            await handshake_stalls(port, pki.client("scheduler"), body, figures)
        extra = (*pki.serve_flags(), "--admission-client-names=kube-apiserver")
        async with served(Path(folder), *extra, flags=(), tls=pki.client("scheduler")) as (_, port):
            await forged_calls(pki, port, None, body, figures.forged)
    return figures


#: Addresses on loopback the lockout's idle clients come from (not the scheduler's), and
#: the one its clients in the middle of a request come from.
HOG_SOURCES = tuple(f"127.0.0.{i}" for i in range(2, 10))
BUSY_SOURCE = "127.0.0.30"


async def lockout(port: int, figures: Figures) -> None:
    """Idle keep-alive clients from other addresses, more than the connection cap, while the
    scheduler's address makes calls: the clients' idle connections give way. Then clients
    in the middle of a request (trickling headers) from one address beyond its cap: 429."""
    hogs = []

    async def keep_alive(source: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        hogs.append((reader, writer))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                if (await reader.readline()).startswith(b"HTTP/1.1 200"):
                    figures.lockout_answered += 1

    for source in HOG_SOURCES:
        for _ in range(32):
            await keep_alive(source)
    figures.lockout_clients = len(hogs)
    # Each sends a request now and then (every 30 s in the attack this answers); between
    # requests its connection is idle, as here.
    await asyncio.sleep(RECLAIM_AFTER_S + 0.3)
    filter_body = json.dumps({"Pod": pod(1), "NodeNames": NODES}).encode()
    for i in range(40):
        raw = post("/gangslice/filter", filter_body) if i % 2 else b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        status, _ = await request(port, raw)
        figures.lockout_calls += 1
        figures.lockout_ok += status == "200"

    # All at once (each lives only the header timeout, a second here); a connection refused
    # is answered 429 at once, read before anything is sent (sent bytes unread by a closing
    # server reset the connection, and the reply with it).
    async def half_request() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(BUSY_SOURCE, 0))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(0.3):
                line = await reader.readline()
                if line:
                    figures.statuses[line.split()[1].decode()] += 1
                    return reader, writer
        writer.write(b"POST /gangslice/filter HTTP/1.1\r\nHost: x\r\n")
        return reader, writer

    busy = list(await asyncio.gather(*(half_request() for _ in range(64))))
    for _, writer in hogs + busy:
        writer.close()


#: Connections that never start TLS, from each of :data:`HOG_SOURCES`: twice what one
#: address may hold by default.
STALLS_PER_SOURCE = 64


async def handshake_stalls(port: int, ctx: ssl.SSLContext, body: bytes, figures: Figures) -> None:
    """Connections from other addresses that open TCP and never send a ClientHello; once they
    have stalled, the scheduler makes calls, each on a new TLS connection."""
    stalls = []
    for source in HOG_SOURCES:
        for _ in range(STALLS_PER_SOURCE):
            with contextlib.suppress(OSError):
                stalls.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))
    figures.stall_clients = len(stalls)
    await asyncio.sleep(STALLED_AFTER_S + 0.2)
    for _ in range(20):
        figures.stall_calls += 1
        figures.stall_ok += await _status(port, ctx, "/gangslice/filter", body) == "200"

    async def held(reader: asyncio.StreamReader) -> bool:
        try:
            async with asyncio.timeout(0.5):
                await reader.read()
        except TimeoutError:
            return True
        except ConnectionError:
            pass
        return False

    figures.stalls_held = sum(await asyncio.gather(*(held(r) for r, _ in stalls)))
    for _, writer in stalls:
        writer.close()


#: The body flood's bodies: as many, as large, as the hardening's goal names.
FLOOD_BODIES, FLOOD_MIB = 64, 30
#: The flood's clients' addresses, 16 bodies from each (within the per-address cap: what bounds
#: the flood is the bytes in flight); the probes come from the scheduler's address, as a
#: kubelet's come from its node's and not from the attacking pods'.
FLOOD_SOURCES = tuple(f"127.0.0.{i}" for i in range(20, 24))


async def body_flood(proc: subprocess.Popen[bytes], port: int, figures: Figures) -> None:
    """64 bodies of 30 MiB at once, spread over a verb that takes node lists, a path that is
    no route and the admission webhook, against the default limits; /healthz meanwhile."""
    poller = start_poller(port)
    body = b'{"Pod": {}, "NodeNames": ["' + b"x" * (FLOOD_MIB * 1024 * 1024 - 40) + b'"]}'
    paths = ("/gangslice/filter", "/nothing/here", "/admission/pods")

    async def one(i: int) -> str:
        try:
            raw = post(paths[i % len(paths)], body)
            status, _ = await request(port, raw, timeout_s=60, source=FLOOD_SOURCES[i % len(FLOOD_SOURCES)])
        except (ConnectionError, TimeoutError):
            status = "closed"
        return status

    statuses = await asyncio.gather(*(one(i) for i in range(FLOOD_BODIES)))
    times = stop_poller(poller)
    figures.flood_bodies, figures.flood_body_mib = FLOOD_BODIES, FLOOD_MIB
    figures.flood_statuses.update(statuses)
    # The server process is the flood's alone: its high-water mark is the flood's peak.
    figures.flood_rss_peak_mib = _rss_mib(proc.pid, "VmHWM")
    figures.flood_healthz_slowest_ms = max(times) if times else float("inf")
