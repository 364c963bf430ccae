"""The kubelet's side of PodResources v1, served from plain data on a unix socket.

For tests and demos of the agent without a node: a real gRPC server built from the same
generated code as the client, so a wrong field number or method name fails here as it
would against a kubelet.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from extender.agent import podresources_pb2 as pb
from extender.agent import podresources_pb2_grpc as pb_grpc
from extender.kube.names import GPU_RESOURCE
from extender.testing import unix_grpc


@dataclass
class _Container:
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> device ids
    cpu_ids: list[int] = field(default_factory=list)
    memory: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (bytes, NUMA nodes)


class FakeKubelet(pb_grpc.PodResourcesListerServicer):
    """Pods, their containers' devices and the allocatable devices, changeable while serving.

    ``fail`` maps a method name to the status code it answers with; ``calls`` counts calls.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pods: dict[tuple[str, str], dict[str, _Container]] = {}
        self.allocatable: dict[str, list[str]] = {}
        #: CPU ids the kubelet may hand out exclusively, and memory (bytes) per NUMA node.
        self.allocatable_cpus: list[int] = []
        self.allocatable_memory: dict[int, int] = {}
        self.fail: dict[str, grpc.StatusCode] = {}
        self.calls: Counter[str] = Counter()

    def assign(
        self,
        namespace: str,
        pod: str,
        container: str,
        device_ids: Sequence[str],
        resource: str = GPU_RESOURCE,
    ) -> None:
        with self._lock:
            c = self.pods.setdefault((namespace, pod), {}).setdefault(container, _Container())
            c.devices.setdefault(resource, []).extend(device_ids)

    def pin(
        self,
        namespace: str,
        pod: str,
        container: str,
        cpu_ids: Sequence[int],
        memory: Sequence[tuple[int, tuple[int, ...]]] = (),
    ) -> None:
        """Give a container exclusive CPUs (and memory blocks: bytes on NUMA nodes)."""
        with self._lock:
            c = self.pods.setdefault((namespace, pod), {}).setdefault(container, _Container())
            c.cpu_ids.extend(cpu_ids)
            c.memory.extend(memory)

    def remove(self, namespace: str, pod: str) -> None:
        with self._lock:
            self.pods.pop((namespace, pod), None)

    def _pod(self, key: tuple[str, str]) -> pb.PodResources:
        containers = [
            pb.ContainerResources(
                name=name,
                devices=[
                    pb.ContainerDevices(resource_name=r, device_ids=ids)
                    for r, ids in sorted(c.devices.items())
                ],
                cpu_ids=c.cpu_ids,
                memory=[_memory(size, nodes) for size, nodes in c.memory],
            )
            for name, c in sorted(self.pods[key].items())
        ]
        return pb.PodResources(namespace=key[0], name=key[1], containers=containers)

    def _answer(self, method: str, context: Any) -> None:
        self.calls[method] += 1
        code = self.fail.get(method)
        if code is not None:
            context.abort(code, f"fake kubelet: {method} fails with {code.name}")

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self._answer("List", context)
        with self._lock:
            return pb.ListPodResourcesResponse(pod_resources=[self._pod(k) for k in sorted(self.pods)])

    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        self._answer("GetAllocatableResources", context)
        with self._lock:
            devices = [
                pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in self.allocatable.items()
            ]
            cpus = list(self.allocatable_cpus)
            memory = [_memory(size, (n,)) for n, size in sorted(self.allocatable_memory.items())]
        return pb.AllocatableResourcesResponse(devices=devices, cpu_ids=cpus, memory=memory)

    def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        self._answer("Get", context)
        key = (request.pod_namespace, request.pod_name)
        with self._lock:
            if key not in self.pods:
                context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key[0]}/{key[1]} not found")
            return pb.GetPodResourcesResponse(pod_resources=self._pod(key))


def _memory(size: int, nodes: Sequence[int]) -> pb.ContainerMemory:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes])
    return pb.ContainerMemory(memory_type="memory", size=size, topology=topology)


@contextmanager
def serve(kubelet: FakeKubelet, socket: Path) -> Iterator[Path]:
    """Serve ``kubelet`` on the unix socket ``socket`` until the block ends."""
    server = unix_grpc.start(pb_grpc.add_PodResourcesListerServicer_to_server, kubelet, socket, workers=2)
    try:
        yield socket
    finally:
        server.stop(grace=None).wait()
