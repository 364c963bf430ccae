"""``gangslice bench extender``: the extender's filter and prioritize under load, over loopback.

The server runs in this process on 127.0.0.1 against a synthetic cluster (the placement
benchmark's: identical HGX H100 nodes under leaf/spine/core switches, half the GPUs taken
at random); a bounded load generator posts the same pod over and over:

- ``names``: ``nodeCacheCapable: true`` bodies with ``nodes`` node names;
- ``full``: ``nodeCacheCapable: false`` bodies with ``full_nodes`` full Node objects.

Two kinds of load. A *closed loop* keeps ``concurrency`` requests in flight, each sent as
soon as one returns: it finds the most requests per second the server gives, and its
latency is then queueing by construction (mean latency = in flight / throughput). An *open
loop* sends requests on a fixed schedule at ``rate`` per second over at most
``concurrency`` connections, and times each from when it is sent (a request that waits for
a free connection is charged the wait): the latency a client sees at that throughput.

The load generator is a minimal HTTP/1.1 keep-alive client on asyncio streams (the request
bytes are built once; a reply is read by its Content-Length), in a child process of its own
(over loopback only, joined at the end), so that the figures are the server's rather than
the client's; with ``same_process`` it shares the server's loop instead, and the figures
then include its cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

from aiohttp import web

from extender.httpapi.app import build_app
from extender.httpapi.handling import METRICS
from extender.kube import names as keys
from extender.placement.synthetic import percentile, synthetic_cluster
from extender.reservations import ClusterCache
from extender.topology.presets import preset_graph

#: Targets for the ``names`` case at the default 5,000 names and concurrency 16.
TARGET_P99_MS = 5.0
TARGET_RPS = 1000.0
WARMUP = 50
#: The longest one timed case may take before the benchmark gives up.
CASE_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class BenchOptions:
    nodes: int = 5000
    full_nodes: int = 500
    concurrency: int = 16
    requests: int = 2000
    gpus: int = 4
    #: Requests per second of the open-loop case (at most ``concurrency`` in flight).
    rate: float = TARGET_RPS
    #: Run the load generator on the server's event loop instead of in a child process.
    same_process: bool = False


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: str
    verb: str
    concurrency: int
    #: The open loop's schedule in requests per second; None for a closed loop.
    offered_rps: float | None
    nodes: int
    body_kib: float
    requests: int
    errors: int
    median_ms: float
    p99_ms: float
    rps: float
    passed_nodes: int
    #: Mean time inside the service's handler (decode, decide, encode), from its own histogram:
    #: what the service costs without the HTTP layers and the load generator.
    handler_ms: float


def bench_pod(gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "bench-pod", "namespace": "bench", "uid": "bench-uid", "labels": {"app": "llm"}},
        "spec": {
            "schedulerName": "gangslice-scheduler",
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:latest",
                    "resources": {
                        "requests": {keys.GPU_RESOURCE: str(gpus), "cpu": "16", "memory": "128Gi"},
                        "limits": {keys.GPU_RESOURCE: str(gpus)},
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def full_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Node object the size of a real GPU node's (labels, conditions, images, addresses)."""
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "12345",
            "labels": {
                **labels,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                keys.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
                keys.GPU_COUNT_LABEL: "8",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.0.0.0/24", "providerID": f"aws:///us-east-1a/{name}"},
        "status": {
            "capacity": {"cpu": "192", "memory": "2113674152Ki", keys.GPU_RESOURCE: "8", "pods": "110"},
            "allocatable": {
                "cpu": "191450m",
                "memory": "2100000000Ki",
                keys.GPU_RESOURCE: "8",
                "pods": "110",
            },
            "conditions": [
                {
                    "type": t,
                    "status": "True" if t == "Ready" else "False",
                    "lastHeartbeatTime": "2025-01-01T00:00:00Z",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                    "reason": f"Kubelet{t}",
                    "message": f"kubelet reports {t}",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.33.0",
                "containerRuntimeVersion": "containerd://2.0.0",
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": [
                {
                    "names": [f"registry.example.com/team/image-{k}@sha256:{k:064x}"],
                    "sizeBytes": 1_000_000 * k,
                }
                for k in range(20)
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Job:
    """One timed run of the load generator against ``POST path`` on 127.0.0.1:``port``."""

    port: int
    path: str
    body: bytes
    total: int
    concurrency: int
    #: Open loop at this many requests per second; None for a closed loop.
    rate: float | None = None


#: Latencies (s), errors, elapsed seconds, and the last good reply body.
Driven = tuple[list[float], int, float, bytes | None]
Drive = Callable[[Job], Awaitable[Driven]]


class _Connection:
    """One keep-alive HTTP/1.1 connection that posts the same prepared request again and again."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
        self._reader, self._writer, self._request = reader, writer, request

    @classmethod
    async def open(cls, job: Job) -> _Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", job.port)
        head = (
            f"POST {job.path} HTTP/1.1\r\nHost: 127.0.0.1:{job.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(job.body)}\r\n\r\n"
        )
        return cls(reader, writer, head.encode() + job.body)

    async def post(self) -> tuple[int, bytes]:
        """Send the request; the reply's status and body."""
        self._writer.write(self._request)
        await self._writer.drain()
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = dict(line.partition(":")[::2] for line in lines[1:] if line)
        length = next((int(v) for k, v in fields.items() if k.lower() == "content-length"), None)
        if length is None:
            raise ValueError("the server replied without a Content-Length")
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


async def _drive(job: Job) -> Driven:
    latencies: list[float] = []
    errors = 0
    last: bytes | None = None
    connections = [await _Connection.open(job) for _ in range(job.concurrency)]
    idle: asyncio.Queue[_Connection] = asyncio.Queue()
    for c in connections:
        idle.put_nowait(c)

    async def one(began: float) -> None:
        nonlocal errors, last
        conn = await idle.get()
        try:
            status, body = await conn.post()
        finally:
            idle.put_nowait(conn)
        latencies.append(time.perf_counter() - began)
        if status != 200:
            errors += 1
        else:
            last = body

    async def closed_loop() -> None:
        remaining = job.total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one(time.perf_counter())

        await asyncio.gather(*(worker() for _ in range(job.concurrency)))

    async def open_loop(rate: float) -> None:
        begin = time.perf_counter()
        sent: list[asyncio.Task[None]] = []
        for i in range(job.total):
            scheduled = begin + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # Timed from now, not from ``scheduled``: the client's own timer wakes up to a
            # millisecond late, which is not the server's doing; waiting for a connection
            # (the server being slow) is still charged.
            sent.append(asyncio.create_task(one(time.perf_counter())))
        await asyncio.gather(*sent)

    start = time.perf_counter()
    try:
        run = closed_loop() if job.rate is None else open_loop(job.rate)
        await asyncio.wait_for(run, timeout=CASE_TIMEOUT_S)
    finally:
        for c in connections:
            await c.close()
    return latencies, errors, time.perf_counter() - start, last


def _load_process(conn: Connection) -> None:
    """The child process: drive each job it is sent and send back what :func:`_drive`
    measured, until it is sent None."""
    try:
        while (job := conn.recv()) is not None:
            conn.send(asyncio.run(_drive(job)))
    finally:
        conn.close()


class _LoadProcess:
    """The load generator in a child process, driven over a pipe from the server's loop."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_load_process, args=(child,), daemon=True)
        self._process.start()
        child.close()

    def _exchange(self, job: Job) -> Driven:
        self._conn.send(job)
        if not self._conn.poll(CASE_TIMEOUT_S):
            raise TimeoutError("the load generator process did not answer")
        got: Driven = self._conn.recv()
        return got

    async def drive(self, job: Job) -> Driven:
        return await asyncio.to_thread(self._exchange, job)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the child is gone already
            self._conn.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
        self._conn.close()


def _handler_seconds(app: web.Application, verb: str) -> tuple[float, float]:
    registry = app[METRICS].registry
    labels = {"verb": verb}
    total = registry.get_sample_value("gangslice_extender_request_duration_seconds_sum", labels) or 0.0
    count = registry.get_sample_value("gangslice_extender_request_duration_seconds_count", labels) or 0.0
    return total, count


def _passed(verb: str, reply: Any) -> int:
    if reply is None:
        return 0
    if verb == "filter":
        names = reply.get("NodeNames")
        return len(names) if names is not None else len((reply.get("Nodes") or {}).get("items") or [])
    return sum(1 for h in reply if h.get("Score", 0) > 0)


async def run_extender_bench(options: BenchOptions) -> list[CaseResult]:
    snap, _ = synthetic_cluster(max(options.nodes, options.full_nodes), preset_graph("hgx-h100"))
    cache = ClusterCache.from_snapshot(snap)
    app = build_app(cache)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and hasattr(server, "sockets")
    port = server.sockets[0].getsockname()[1]
    pod = bench_pod(options.gpus)
    names = [n.name for n in snap.nodes[: options.nodes]]
    full = [full_node(n.name, dict(n.labels)) for n in snap.nodes[: options.full_nodes]]
    by_names = {"Pod": pod, "Nodes": None, "NodeNames": names}
    by_objects = {"Pod": pod, "Nodes": {"metadata": {}, "items": full}, "NodeNames": None}
    # (case, body, nodes, in flight, open-loop rate)
    cases: list[tuple[str, dict[str, Any], int, int, float | None]] = [
        ("names", by_names, len(names), options.concurrency, None),
        ("names", by_names, len(names), options.concurrency, options.rate),
        # kube-scheduler calls filter from its one scheduling loop, one pod at a time.
        ("names", by_names, len(names), 1, None),
        ("full", by_objects, len(full), 1, None),
        ("full", by_objects, len(full), 16, None),
    ]
    results = []
    load: _LoadProcess | None = None
    drive: Drive = _drive
    try:
        if not options.same_process:
            load = _LoadProcess()
            drive = load.drive
        for case, payload, count, concurrency, rate in cases:
            body = json.dumps(payload, separators=(",", ":")).encode()
            requests = options.requests if case == "names" else max(1, options.requests // 5)
            for verb in ("filter", "prioritize"):
                path = f"/gangslice/{verb}"
                await drive(Job(port, path, body, min(WARMUP, requests), concurrency))
                before = _handler_seconds(app, verb)
                lat, errors, elapsed, last = await drive(Job(port, path, body, requests, concurrency, rate))
                spent, handled = (a - b for a, b in zip(_handler_seconds(app, verb), before, strict=True))
                results.append(
                    CaseResult(
                        case=case,
                        verb=verb,
                        concurrency=concurrency,
                        offered_rps=rate,
                        nodes=count,
                        body_kib=len(body) / 1024,
                        requests=len(lat),
                        errors=errors,
                        median_ms=statistics.median(lat) * 1e3,
                        p99_ms=percentile(lat, 99) * 1e3,
                        rps=len(lat) / elapsed,
                        passed_nodes=_passed(verb, json.loads(last) if last is not None else None),
                        handler_ms=spent / max(handled, 1) * 1e3,
                    )
                )
    finally:
        if load is not None:
            await asyncio.to_thread(load.close)
        await runner.cleanup()
    return results


def _meets(r: CaseResult, options: BenchOptions) -> str:
    """The targets, read on the rows that measure them: requests per second on the closed
    loop (the most the server gives), p99 on the open loop at the target rate (what a
    client sees at that throughput)."""
    if r.case != "names" or r.concurrency != options.concurrency:
        return ""
    if r.offered_rps is None:
        ok = r.rps >= TARGET_RPS
        return f"{'meets' if ok else 'misses'} >= {TARGET_RPS:g} req/s"
    if r.offered_rps < TARGET_RPS:
        return ""
    ok = r.p99_ms < TARGET_P99_MS and r.rps >= 0.95 * r.offered_rps
    return f"{'meets' if ok else 'misses'} p99 < {TARGET_P99_MS:g} ms at {r.offered_rps:g} req/s"


def render(options: BenchOptions, results: list[CaseResult]) -> str:
    lines = [
        f"gangslice bench extender: {options.requests} requests per names case ({options.requests // 5 or 1} "
        f"per full-Nodes case), pod asking {options.gpus} GPUs, HGX H100 nodes with half their GPUs taken",
        f"{'case':<22} {'load':<13} {'in flight':>9} {'verb':<11} {'body KiB':>9} {'median ms':>10} "
        f"{'p99 ms':>8} {'req/s':>7} {'handler ms':>10} {'fit':>5} {'errors':>6}",
    ]
    for r in results:
        label = f"{r.nodes} node names" if r.case == "names" else f"{r.nodes} full Nodes"
        load = "closed loop" if r.offered_rps is None else f"{r.offered_rps:g}/s open"
        in_flight = str(r.concurrency) if r.offered_rps is None else f"<= {r.concurrency}"
        lines.append(
            f"{label:<22} {load:<13} {in_flight:>9} {r.verb:<11} {r.body_kib:>9.0f} {r.median_ms:>10.2f} "
            f"{r.p99_ms:>8.2f} {r.rps:>7.0f} {r.handler_ms:>10.2f} {r.passed_nodes:>5} {r.errors:>6}  "
            f"{_meets(r, options)}".rstrip()
        )
    where = (
        "on the server's event loop (one process): latency and req/s include its cost"
        if options.same_process
        else "a separate process over loopback: the server's event loop does only its work"
    )
    lines += [
        f"load generator: {where}.",
        "'handler ms' is the time inside the service's handler (with requests in flight it includes",
        "waiting for the loop). kube-scheduler calls filter one pod at a time (in flight 1).",
        f"closed loop: {options.concurrency} requests always in flight, so its mean latency is "
        f"{options.concurrency} / (req/s) by construction;",
        f"open loop: requests sent on a schedule of {options.rate:g}/s over at most {options.concurrency} "
        "connections, a wait for a free one counted.",
    ]
    return "\n".join(lines)


def to_json(options: BenchOptions, results: list[CaseResult]) -> dict[str, Any]:
    return {
        "options": asdict(options),
        "targets": {"p99Ms": TARGET_P99_MS, "requestsPerSecond": TARGET_RPS},
        "loadGenerator": "same process" if options.same_process else "separate process",
        "verdicts": [_meets(r, options) for r in results],
        "results": [asdict(r) for r in results],
    }
