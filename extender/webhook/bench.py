"""``gangslice bench extender``: the extender's filter and prioritize under load, over loopback.

The server runs in this process on 127.0.0.1 against a synthetic cluster (the placement
benchmark's: identical HGX H100 nodes under leaf/spine/core switches, half the GPUs taken
at random); a bounded load generator (aiohttp client, ``concurrency`` requests in flight,
``requests`` timed requests per case after a warm-up) posts the same pod over and over:

- ``names``: ``nodeCacheCapable: true`` bodies with ``nodes`` node names;
- ``full``: ``nodeCacheCapable: false`` bodies with ``full_nodes`` full Node objects.

The load generator runs in a child process of its own (over loopback only, joined at the
end), so the server's event loop does only the server's work; with ``same_process`` it
shares the server's loop instead, and the figures then include its cost.
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

import aiohttp
from aiohttp import web

from extender.kube import names as keys
from extender.kube.cache import ClusterCache
from extender.placement.bench import percentile, synthetic_cluster
from extender.topology.presets import preset_graph
from extender.webhook.app import build_app
from extender.webhook.handling import METRICS

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
    #: Run the load generator on the server's event loop instead of in a child process.
    same_process: bool = False


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: str
    verb: str
    concurrency: int
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


#: Latencies (s), errors, elapsed seconds, and the last good reply body.
Driven = tuple[list[float], int, float, bytes | None]
Drive = Callable[[str, bytes, int, int], Awaitable[Driven]]


async def _drive(
    session: aiohttp.ClientSession, url: str, body: bytes, total: int, concurrency: int
) -> Driven:
    latencies: list[float] = []
    errors = 0
    last: bytes | None = None
    remaining = total
    headers = {"Content-Type": "application/json"}

    async def worker() -> None:
        nonlocal remaining, errors, last
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                raw = await resp.read()
            latencies.append(time.perf_counter() - t0)
            if resp.status != 200:
                errors += 1
            else:
                last = raw

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(concurrency))), timeout=CASE_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    return latencies, errors, elapsed, last


def _load_process(conn: Connection, connections: int) -> None:
    """The child process: drive each (url, body, total, concurrency) job it is sent and
    send back what :func:`_drive` measured, until it is sent None."""

    async def serve_jobs() -> None:
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as session:
            while (job := conn.recv()) is not None:
                url, body, total, concurrency = job
                conn.send(await _drive(session, url, body, total, concurrency))

    try:
        asyncio.run(serve_jobs())
    finally:
        conn.close()


class _LoadProcess:
    """The load generator in a child process, driven over a pipe from the server's loop."""

    def __init__(self, connections: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_load_process, args=(child, connections), daemon=True)
        self._process.start()
        child.close()

    def _exchange(self, job: tuple[str, bytes, int, int]) -> Driven:
        self._conn.send(job)
        if not self._conn.poll(CASE_TIMEOUT_S):
            raise TimeoutError("the load generator process did not answer")
        got: Driven = self._conn.recv()
        return got

    async def drive(self, url: str, body: bytes, total: int, concurrency: int) -> Driven:
        return await asyncio.to_thread(self._exchange, (url, body, total, concurrency))

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
    app = build_app(cache, housekeeping_s=None)
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
    cases = [
        ("names", by_names, len(names), options.concurrency),
        # kube-scheduler calls filter from its one scheduling loop, one pod at a time.
        ("names", by_names, len(names), 1),
        ("full", {"Pod": pod, "Nodes": {"metadata": {}, "items": full}, "NodeNames": None}, len(full), 1),
        ("full", {"Pod": pod, "Nodes": {"metadata": {}, "items": full}, "NodeNames": None}, len(full), 16),
    ]
    results = []
    connections = max(options.concurrency, 16)
    load: _LoadProcess | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            if options.same_process:
                session = await stack.enter_async_context(
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections))
                )

                async def drive(url: str, body: bytes, total: int, concurrency: int) -> Driven:
                    return await _drive(session, url, body, total, concurrency)
            else:
                load = _LoadProcess(connections)
                drive = load.drive
            for case, payload, count, concurrency in cases:
                body = json.dumps(payload, separators=(",", ":")).encode()
                requests = options.requests if case == "names" else max(1, options.requests // 5)
                for verb in ("filter", "prioritize"):
                    url = f"http://127.0.0.1:{port}/gangslice/{verb}"
                    await drive(url, body, min(WARMUP, requests), concurrency)
                    before = _handler_seconds(app, verb)
                    lat, errors, elapsed, last = await drive(url, body, requests, concurrency)
                    spent, handled = (a - b for a, b in zip(_handler_seconds(app, verb), before, strict=True))
                    results.append(
                        CaseResult(
                            case=case,
                            verb=verb,
                            concurrency=concurrency,
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
    if r.case != "names" or r.concurrency != options.concurrency:
        return ""
    ok = r.p99_ms < TARGET_P99_MS and r.rps >= TARGET_RPS
    return "meets target" if ok else f"misses target (p99 < {TARGET_P99_MS:g} ms, >= {TARGET_RPS:g} req/s)"


def render(options: BenchOptions, results: list[CaseResult]) -> str:
    lines = [
        f"gangslice bench extender: {options.requests} requests per names case ({options.requests // 5 or 1} "
        f"per full-Nodes case), pod asking {options.gpus} GPUs, HGX H100 nodes with half their GPUs taken",
        f"{'case':<22} {'in flight':>9} {'verb':<11} {'body KiB':>9} {'median ms':>10} {'p99 ms':>8} "
        f"{'req/s':>7} {'handler ms':>10} {'fit':>5} {'errors':>6}",
    ]
    for r in results:
        label = f"{r.nodes} node names" if r.case == "names" else f"{r.nodes} full Nodes"
        lines.append(
            f"{label:<22} {r.concurrency:>9} {r.verb:<11} {r.body_kib:>9.0f} {r.median_ms:>10.2f} "
            f"{r.p99_ms:>8.2f} {r.rps:>7.0f} {r.handler_ms:>10.2f} {r.passed_nodes:>5} {r.errors:>6}  "
            f"{_meets(r, options)}".rstrip()
        )
    if options.same_process:
        lines.append(
            "load generator: on the server's event loop (one process): latency and req/s include its cost;"
        )
    else:
        lines.append(
            "load generator: a separate process over loopback: the server's event loop does only its work;"
        )
    lines += [
        "'handler ms' is the time inside the service's handler (with requests in flight it includes",
        "waiting for the loop). kube-scheduler calls filter one pod at a time (in flight 1).",
        f"the load is a closed loop: with {options.concurrency} in flight the mean latency is "
        f"{options.concurrency} / (req/s), so p99 < {TARGET_P99_MS:g} ms there needs more than "
        f"{options.concurrency / TARGET_P99_MS * 1e3:,.0f} req/s.",
    ]
    return "\n".join(lines)


def to_json(options: BenchOptions, results: list[CaseResult]) -> dict[str, Any]:
    return {
        "options": asdict(options),
        "targets": {"p99Ms": TARGET_P99_MS, "requestsPerSecond": TARGET_RPS},
        "loadGenerator": "same process" if options.same_process else "separate process",
        "results": [asdict(r) for r in results],
    }
