"""The e2e tier's fake-GPU device plugin over its real gRPC wire, without a kubelet: what it
registers, the devices and NUMA hints it advertises, what Allocate hands the container; and a
fake board fitted to a machine's NUMA nodes (the real node's two-node tree)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from extender.agent.fakes import FAKES, fake_node
from extender.testing import device_plugin
from extender.testing import deviceplugin_pb2 as pb
from extender.testing import deviceplugin_pb2_grpc as pb_grpc
from extender.topology.nvml import discover


class _Kubelet(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service: keeps each request."""

    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []
        self.registered = threading.Event()

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        self.requests.append(request)
        self.registered.set()
        return pb.Empty()


@contextmanager
def _kubelet(folder: Path) -> Iterator[_Kubelet]:
    kubelet = _Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add: Any = pb_grpc.add_RegistrationServicer_to_server
    add(kubelet, server)
    assert server.add_insecure_port(f"unix://{folder / device_plugin.KUBELET_SOCKET}")
    server.start()
    try:
        yield kubelet
    finally:
        server.stop(grace=None).wait()


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dp") as d:  # unix socket paths: short
        yield Path(d)


def test_the_plugin_registers_advertises_numa_hints_and_hands_out_the_kubelets_choice(folder: Path) -> None:
    plugin = device_plugin.FakeGpuPlugin(FAKES["hgx-h100"](), oracle=Path("/nonexistent"))
    with _kubelet(folder) as kubelet, device_plugin.serve(plugin, folder, "gpu.sock") as socket:
        (asked,) = kubelet.requests
        assert (asked.version, asked.endpoint, asked.resource_name) == (
            "v1beta1",
            "gpu.sock",
            "nvidia.com/gpu",
        )
        assert asked.options.get_preferred_allocation_available
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub: Any = pb_grpc.DevicePluginStub(channel)
            first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
            numa = {d.ID: [n.ID for n in d.topology.nodes] for d in first.devices}
            assert list(numa) == list(plugin.uuids)
            # GPUs 0-3 on NUMA node 0, 4-7 on 1: node IDs, not NVML's affinity bitmask words.
            assert list(numa.values()) == [[0]] * 4 + [[1]] * 4
            assert all(d.health == "Healthy" for d in first.devices)
            given = [plugin.uuids[5], plugin.uuids[4]]
            reply = stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=given)]),
                timeout=5,
            )
    (response,) = reply.container_responses
    assert response.envs[device_plugin.VISIBLE_DEVICES] == ",".join(given)
    assert plugin.allocated == [(5, 4)]


def test_a_plugin_the_kubelet_never_answers_fails_naming_the_socket(folder: Path) -> None:
    with pytest.raises(RuntimeError, match=r"kubelet\.sock"):
        device_plugin.register(folder, "gpu.sock", timeout=0.5)


def test_a_fake_board_on_a_machine_takes_the_machines_cpus_of_each_numa_node(tmp_path: Path) -> None:
    nodes = tmp_path / "devices" / "system" / "node"
    for n, cpus in ((0, "0"), (1, "1")):
        (nodes / f"node{n}").mkdir(parents=True)
        (nodes / f"node{n}" / "cpulist").write_text(cpus + "\n")
    with fake_node("hgx-h100", machine=tmp_path) as (fake, sysfs):
        graph = discover(fake, sysfs_root=sysfs)
        assert [sorted(g.cpus) for g in fake.gpus] == [[0]] * 4 + [[1]] * 4
    assert [g.numa_node for g in graph.gpus] == [0] * 4 + [1] * 4
    with fake_node("hgx-h100") as (fake, _):  # without a machine: the board's own 52 CPUs per socket
        assert len(fake.gpus[0].cpus) == 52 and min(fake.gpus[4].cpus) == 52


# The field table of k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/api.proto for the messages the
# kubelet and a plugin exchange: message -> [(field, number, repeated)].
KUBELET_FIELDS = {
    "RegisterRequest": [
        ("version", 1, False),
        ("endpoint", 2, False),
        ("resource_name", 3, False),
        ("options", 4, False),
    ],
    "DevicePluginOptions": [
        ("pre_start_required", 1, False),
        ("get_preferred_allocation_available", 2, False),
    ],
    "Device": [("ID", 1, False), ("health", 2, False), ("topology", 3, False)],
    "NUMANode": [("ID", 1, False)],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, True),
        ("must_include_deviceIDs", 2, True),
        ("allocation_size", 3, False),
    ],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, True)],
    "ContainerAllocateRequest": [("devices_ids", 1, True)],
    "ContainerAllocateResponse": [
        ("envs", 1, True),
        ("mounts", 2, True),
        ("devices", 3, True),
        ("annotations", 4, True),
        ("cdi_devices", 5, True),
    ],
}


@pytest.mark.parametrize("message", sorted(KUBELET_FIELDS))
def test_message_fields_match_the_kubelet(message: str) -> None:
    fields = pb.DESCRIPTOR.message_types_by_name[message].fields
    got = [(f.name, f.number, f.is_repeated) for f in fields]
    assert got == KUBELET_FIELDS[message]


def test_services_are_the_kubelets() -> None:
    services = {name: [m.name for m in s.methods] for name, s in pb.DESCRIPTOR.services_by_name.items()}
    assert services == {
        "Registration": ["Register"],
        "DevicePlugin": [
            "GetDevicePluginOptions",
            "ListAndWatch",
            "GetPreferredAllocation",
            "Allocate",
            "PreStartContainer",
        ],
    }
    assert pb.DESCRIPTOR.package == "v1beta1"
