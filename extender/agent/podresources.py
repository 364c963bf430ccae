"""A small client of the kubelet PodResources v1 gRPC API: which GPUs pods hold.

The kubelet serves the API on a unix socket (``/var/lib/kubelet/pod-resources/kubelet.sock``)
and rejects more than 100 requests per second (burst 10) with ``RESOURCE_EXHAUSTED``. This
client asks at most once per ``min_interval_s`` (default 1 s) per method and answers calls
in between from the last reply, so however often the agent asks, the kubelet sees at most
two requests a second from it (one ``List``, one ``GetAllocatableResources``), and at the
agent's default 30 s interval two a minute.

Device ids are the device plugin's: GPU UUIDs (``GPU-…``), MIG UUIDs, or ``<uuid>::<n>`` for
a time-sliced replica, whose suffix is stripped so a replica counts as its GPU.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from extender.agent import podresources_pb2 as pb
from extender.agent import podresources_pb2_grpc as pb_grpc
from extender.kube.names import GPU_RESOURCE

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: Seconds between two calls of one method that actually reach the kubelet.
MIN_INTERVAL_S = 1.0
#: Seconds one call may take before it counts as failed.
CALL_TIMEOUT_S = 5.0

_T = TypeVar("_T")


class PodResourcesUnavailable(RuntimeError):
    """The kubelet's PodResources API cannot be asked. ``reason`` is a CamelCase word for a condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True, order=True)
class DeviceUse:
    """One device held by one container."""

    namespace: str
    pod: str
    container: str
    device_id: str


@dataclass(frozen=True, slots=True)
class CpuUse:
    """The CPUs one container holds exclusively (the static CPU manager's)."""

    namespace: str
    pod: str
    container: str
    cpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """Memory (``memory_type`` ``memory``, bytes) per NUMA node: what the kubelet may hand out
    and what containers hold (a container's block over several NUMA nodes split evenly)."""

    allocatable: dict[int, int]
    in_use: dict[int, int]


#: The PodResources ``memory_type`` of ordinary memory (hugepages are ``hugepages-<size>``).
MEMORY = "memory"


def device_id(raw: str) -> str:
    """``GPU-…::3`` (a shared replica) -> ``GPU-…``; anything else unchanged."""
    base, sep, replica = raw.rpartition("::")
    return base if sep and base and replica.isdigit() else raw


@dataclass
class _Cached:
    at: float
    value: Any


class PodResourcesClient:
    """Asks the kubelet which devices of ``resource`` are allocatable and which are in use.

    ``clock`` is injectable so tests can step time. Close the client (or use it as a context
    manager) to close its channel.
    """

    def __init__(
        self,
        socket: Path | str = DEFAULT_SOCKET,
        *,
        resource: str = GPU_RESOURCE,
        min_interval_s: float = MIN_INTERVAL_S,
        timeout_s: float = CALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = Path(socket)
        self.resource = resource
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None
        self._cache: dict[str, _Cached] = {}
        #: Calls that reached the kubelet, per method (for tests and debugging).
        self.calls: dict[str, int] = {"List": 0, "GetAllocatableResources": 0}

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    # -- the two questions --------------------------------------------------------------

    def devices_in_use(self) -> list[DeviceUse]:
        """Every (pod, container, device) of ``resource``, sorted, replicas folded into their GPU."""
        reply: pb.ListPodResourcesResponse = self._ask("List", self._list)
        uses = {
            DeviceUse(pod.namespace, pod.name, container.name, device_id(raw))
            for pod in reply.pod_resources
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name == self.resource
            for raw in devices.device_ids
        }
        return sorted(uses)

    def allocatable(self) -> list[str]:
        """The device ids of ``resource`` the kubelet can hand out (capacity, not free), sorted."""
        reply: pb.AllocatableResourcesResponse = self._ask("GetAllocatableResources", self._allocatable)
        return sorted(
            {
                device_id(raw)
                for devices in reply.devices
                if devices.resource_name == self.resource
                for raw in devices.device_ids
            }
        )

    def cpus(self) -> tuple[list[int], list[CpuUse]]:
        """(the CPU ids the kubelet may hand out exclusively, sorted; each container's
        exclusive CPUs), from the same cached replies as the device questions."""
        alloc: pb.AllocatableResourcesResponse = self._ask("GetAllocatableResources", self._allocatable)
        reply: pb.ListPodResourcesResponse = self._ask("List", self._list)
        uses = [
            CpuUse(pod.namespace, pod.name, container.name, tuple(sorted(container.cpu_ids)))
            for pod in reply.pod_resources
            for container in pod.containers
            if container.cpu_ids
        ]
        return sorted(set(alloc.cpu_ids)), uses

    def memory(self) -> MemoryUse:
        """Memory per NUMA node (reported where the memory manager is Static)."""
        alloc: pb.AllocatableResourcesResponse = self._ask("GetAllocatableResources", self._allocatable)
        reply: pb.ListPodResourcesResponse = self._ask("List", self._list)
        allocatable = _per_numa(alloc.memory)
        in_use: dict[int, int] = {}
        for pod in reply.pod_resources:
            for container in pod.containers:
                for n, size in _per_numa(container.memory).items():
                    in_use[n] = in_use.get(n, 0) + size
        return MemoryUse(allocatable, in_use)

    # -- plumbing -----------------------------------------------------------------------

    def _list(self, stub: pb_grpc.PodResourcesListerStub) -> pb.ListPodResourcesResponse:
        reply: pb.ListPodResourcesResponse = stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        return reply

    def _allocatable(self, stub: pb_grpc.PodResourcesListerStub) -> pb.AllocatableResourcesResponse:
        reply: pb.AllocatableResourcesResponse = stub.GetAllocatableResources(
            pb.AllocatableResourcesRequest(), timeout=self.timeout_s
        )
        return reply

    def _ask(self, method: str, call: Callable[[pb_grpc.PodResourcesListerStub], _T]) -> _T:
        now = self._clock()
        cached = self._cache.get(method)
        if cached is not None and now - cached.at < self.min_interval_s:
            if isinstance(cached.value, PodResourcesUnavailable):
                raise cached.value
            value: _T = cached.value
            return value
        try:
            stub = self._connect()
            self.calls[method] += 1
            try:
                value = call(stub)
            except grpc.RpcError as exc:
                raise _unavailable(method, self.socket, exc) from exc
        except PodResourcesUnavailable as exc:
            # A failure is remembered as long as an answer would be: a broken kubelet is not hammered.
            self._cache[method] = _Cached(now, exc)
            raise
        self._cache[method] = _Cached(now, value)
        return value

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        try:
            mode = os.stat(self.socket).st_mode
        except FileNotFoundError:
            self.close()
            raise PodResourcesUnavailable(
                "SocketMissing",
                f"kubelet PodResources socket {self.socket} does not exist; mount the host directory "
                f"{self.socket.parent} into the agent (the kubelet creates the socket at start)",
            ) from None
        except OSError as exc:
            raise PodResourcesUnavailable("SocketUnreadable", f"cannot stat {self.socket}: {exc}") from exc
        if not stat.S_ISSOCK(mode):
            raise PodResourcesUnavailable("SocketMissing", f"{self.socket} exists but is not a unix socket")
        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket.absolute()}")
            stub: Any = pb_grpc.PodResourcesListerStub  # generated code is untyped
            self._stub = stub(self._channel)
        return self._stub


def _per_numa(blocks: Any) -> dict[int, int]:
    """Bytes of ordinary memory per NUMA node in a list of ``ContainerMemory``."""
    out: dict[int, int] = {}
    for block in blocks:
        if block.memory_type != MEMORY:
            continue
        nodes = [int(n.ID) for n in block.topology.nodes]
        for n in nodes:
            out[n] = out.get(n, 0) + int(block.size) // len(nodes)
    return out


def _unavailable(method: str, socket: Path, exc: grpc.RpcError) -> PodResourcesUnavailable:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    name = code.name if code is not None else "UNKNOWN"
    reasons = {
        "RESOURCE_EXHAUSTED": "RateLimited",
        "UNIMPLEMENTED": "Unimplemented",
        "UNAVAILABLE": "KubeletUnavailable",
        "DEADLINE_EXCEEDED": "KubeletUnavailable",
    }
    return PodResourcesUnavailable(
        reasons.get(name, "RpcFailed"), f"PodResources {method} on {socket} failed: {name}: {details}"
    )
