"""A fake-GPU device plugin for a real kubelet: the e2e tier's real node.

It speaks the kubelet's Device Plugin API v1beta1 (``proto/deviceplugin/v1beta1``) over unix
sockets as NVIDIA's device plugin does: it registers ``nvidia.com/gpu`` with the kubelet,
advertises a fake node's GPUs by UUID with each GPU's NUMA node as its topology hint (so the
kubelet's Topology Manager has what it has on a real node), answers ``GetPreferredAllocation``
with NVIDIA's go-gpuallocator (:mod:`extender.testing.gpuallocator`, fed the fake node's NVML
answers, as the real plugin feeds it real ones), and ``Allocate`` with the environment the
NVIDIA container runtime reads (``NVIDIA_VISIBLE_DEVICES``: the UUIDs the kubelet chose). The
kubelet's own device manager, Topology Manager and CPU manager decide; this plugin only says
what the hardware would.

``force`` replaces go-gpuallocator's answer with chosen GPUs (when they are offered), so a test
can make the kubelet hand out other GPUs than gangslice predicted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from extender.kube.names import GPU_RESOURCE
from extender.testing import deviceplugin_pb2 as pb
from extender.testing import deviceplugin_pb2_grpc as pb_grpc
from extender.testing import gpuallocator, unix_grpc
from extender.topology.fake_nvml import FakeNvml

API_VERSION = "v1beta1"
#: The kubelet's registration socket, in the folder it watches for plugins.
KUBELET_SOCKET = "kubelet.sock"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_NODE = "node"  # the oracle document's one topology


@dataclass
class FakeGpuPlugin(pb_grpc.DevicePluginServicer):
    """The plugin's answers for one fake node; every request the kubelet made is kept."""

    fake: FakeNvml
    oracle: Path
    force: tuple[int, ...] | None = None
    preferred: list[tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]] = field(
        default_factory=list
    )
    allocated: list[tuple[int, ...]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        self.uuids = tuple(self.fake.uuid(i) for i in range(self.fake.device_count()))
        self._index = {uuid: i for i, uuid in enumerate(self.uuids)}
        self._facts = gpuallocator.nvml_facts(self.fake)

    def devices(self) -> list[pb.Device]:
        out = []
        for i, uuid in enumerate(self.uuids):
            numa = self.fake.gpus[i].numa_node
            topology = (
                pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None and numa >= 0 else None
            )
            out.append(pb.Device(ID=uuid, health="Healthy", topology=topology))
        return out

    def indices(self, uuids: Sequence[str]) -> tuple[int, ...]:
        return tuple(self._index[u] for u in uuids)

    # --- the DevicePlugin service ---------------------------------------------------------------

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=self.devices())
        while not self._stop.wait(0.5) and context.is_active():
            pass

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        asks = [
            (self.indices(r.available_deviceIDs), self.indices(r.must_include_deviceIDs), r.allocation_size)
            for r in request.container_requests
        ]
        document = {
            "topologies": {},
            "nvml": {_NODE: self._facts},
            "requests": [
                {"topology": _NODE, "available": list(a), "required": list(m), "size": n} for a, m, n in asks
            ],
        }
        answers = gpuallocator.ask(self.oracle, document)[1:]  # the first line: the links it found
        responses = []
        for (available, must, size), answer in zip(asks, answers, strict=True):
            chosen = tuple(answer["gpus"])
            if self.force is not None and len(self.force) == size and set(self.force) <= set(available):
                chosen = self.force
            self.preferred.append((available, must, size, chosen))
            responses.append(
                pb.ContainerPreferredAllocationResponse(deviceIDs=[self.uuids[i] for i in chosen])
            )
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        responses = []
        for r in request.container_requests:
            self.allocated.append(self.indices(r.devices_ids))
            responses.append(pb.ContainerAllocateResponse(envs={VISIBLE_DEVICES: ",".join(r.devices_ids)}))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def register(plugin_dir: Path, endpoint: str, resource: str = GPU_RESOURCE, timeout: float = 30.0) -> None:
    """Register ``endpoint`` (a socket in ``plugin_dir``) for ``resource`` with the kubelet whose
    registration socket is in ``plugin_dir``, waiting up to ``timeout`` for the kubelet to serve it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with grpc.insecure_channel(f"unix://{plugin_dir / KUBELET_SOCKET}") as channel:
                stub: Any = pb_grpc.RegistrationStub  # generated code is untyped
                stub(channel).Register(
                    pb.RegisterRequest(
                        version=API_VERSION,
                        endpoint=endpoint,
                        resource_name=resource,
                        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                    ),
                    timeout=5,
                )
            return
        except grpc.RpcError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the kubelet at {plugin_dir / KUBELET_SOCKET} refused the plugin: {exc}"
                ) from exc
            time.sleep(0.5)


@contextmanager
def serve(
    plugin: FakeGpuPlugin, plugin_dir: Path, endpoint: str = "gangslice-fake-gpu.sock"
) -> Iterator[Path]:
    """Serve ``plugin`` on ``plugin_dir/endpoint`` and register it with the kubelet there."""
    socket = plugin_dir / endpoint
    server = unix_grpc.start(pb_grpc.add_DevicePluginServicer_to_server, plugin, socket)
    try:
        register(plugin_dir, endpoint)
        yield socket
    finally:
        plugin._stop.set()
        server.stop(grace=1).wait()
        socket.unlink(missing_ok=True)
