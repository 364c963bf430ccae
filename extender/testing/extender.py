"""Helpers for testing the extender service: object shorthands (over the builders of
:mod:`extender.testing.objects`), a small cluster, and ways to run the app (an aiohttp test
client in the current loop, or a server in a thread for synchronous clients such as
property-based tests)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from extender.kube import names as keys
from extender.testing.objects import make_node_object, make_pod

#: Two leaves: leaf-1 holds four HGX H100 nodes (h-0..h-3, NVSwitch, 8 GPUs), leaf-2 two
#: dual-socket PCIe servers (p-0, p-1, 8 GPUs in PCIe-switch pairs) and one 4-GPU L40S
#: node (l-0). h-3 has GPUs 0-3 taken.
SMALL_CLUSTER = """\
levels: [fabric.topograph.run/tier-1, fabric.topograph.run/tier-0]
nodes:
  - name: h
    count: 3
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-1}
    gpuTopology: hgx-h100
  - name: h-3
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-1}
    gpuTopology: hgx-h100
    allocatedGpus: [0, 1, 2, 3]
  - name: p
    count: 2
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-2}
    gpuTopology: pcie-8gpu-2socket
  - name: l-0
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-2}
    gpuTopology: l40s-4gpu
"""

SMALL_CLUSTER_NODES = ("h-0", "h-1", "h-2", "h-3", "l-0", "p-0", "p-1")


def write_cluster(folder: Path, text: str = SMALL_CLUSTER) -> Path:
    path = folder / "cluster.yaml"
    path.write_text(text)
    return path


def pod_obj(
    name: str,
    *,
    namespace: str = "llm",
    gpus: int = 0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node: str | None = None,
    uid: str | None = None,
    phase: str = "Pending",
    scheduler: str = "gangslice-scheduler",
) -> dict[str, Any]:
    """A core/v1 Pod as the API (and kube-scheduler) writes it: :func:`make_pod` in one call."""
    pod = make_pod(name, namespace).gpus(gpus).labels(labels or {}).annotations(annotations or {})
    return pod.on_node(node).uid(uid).phase(phase).scheduler(scheduler).obj()


def gang_pod(
    name: str, gang: str, size: int, gpus: int, *, extra: Mapping[str, str] | None = None, **kw: Any
) -> dict[str, Any]:
    """A pod of a plain gang: label ``gangslice.io/gang`` and annotation ``gang-size``."""
    annotations = {keys.GANG_SIZE: str(size), **(extra or {})}
    return pod_obj(name, gpus=gpus, labels={keys.GANG: gang}, annotations=annotations, **kw)


def node_obj(
    name: str,
    *,
    gpus: int = 8,
    labels: Mapping[str, str] | None = None,
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    ready: bool = True,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A core/v1 Node with ``nvidia.com/gpu`` capacity and GFD's product label:
    :func:`make_node_object` in one call."""
    node = make_node_object(name).gpus(gpus).labels(labels or {}).product(product)
    if not ready:
        node = node.not_ready()
    if unschedulable:
        node = node.unschedulable()
    return node.obj()


@contextlib.asynccontextmanager
async def client_for(app: web.Application) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """An aiohttp test client on a loopback server, inside the running loop."""
    async with TestClient(TestServer(app)) as client:
        yield client


class ServerThread:
    """The app served on 127.0.0.1 from a background thread with its own event loop."""

    def __init__(self, app: web.Application, ssl_context: ssl.SSLContext | None = None) -> None:
        self.app = app
        self.ssl_context = ssl_context
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, name="extender-test-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._started.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        runner = self._runner
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
