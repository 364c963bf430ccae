"""The PodResources client against a real gRPC server on a unix socket (the kubelet's side)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from extender.agent.podresources import DeviceUse, PodResourcesClient, PodResourcesUnavailable, device_id
from extender.testing.clock import FakeClock
from extender.testing.kubelet import FakeKubelet, serve

GPU0 = "GPU-00000000-0000-0100-0000-000000000001"
GPU1 = "GPU-00000000-0000-0100-0000-000000000002"
GPU2 = "GPU-00000000-0000-0100-0000-000000000003"


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A short path: unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="pr"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[tuple[FakeKubelet, Path]]:
    k = FakeKubelet()
    k.allocatable = {"nvidia.com/gpu": [GPU0, GPU1, GPU2], "example.com/fpga": ["fpga0"]}
    with serve(k, socket_dir / "kubelet.sock") as sock:
        yield k, sock


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (GPU0, GPU0),
        (f"{GPU0}::3", GPU0),
        ("MIG-11111111-2222-3333-4444-555555555555", "MIG-11111111-2222-3333-4444-555555555555"),
        ("weird::name", "weird::name"),
        ("::4", "::4"),
    ],
)
def test_device_id_strips_only_a_replica_suffix(raw: str, want: str) -> None:
    assert device_id(raw) == want


def test_devices_in_use_for_gpus_only_replicas_folded(kubelet: tuple[FakeKubelet, Path]) -> None:
    k, sock = kubelet
    k.assign("ml", "llama-0", "server", [GPU1, GPU0])
    k.assign("ml", "llama-0", "sidecar", ["fpga0"], resource="example.com/fpga")
    k.assign("dev", "notebook", "main", [f"{GPU2}::0", f"{GPU2}::1"])
    with PodResourcesClient(sock) as client:
        assert client.devices_in_use() == [
            DeviceUse("dev", "notebook", "main", GPU2),
            DeviceUse("ml", "llama-0", "server", GPU0),
            DeviceUse("ml", "llama-0", "server", GPU1),
        ]
        assert client.allocatable() == [GPU0, GPU1, GPU2]


def test_each_method_reaches_the_kubelet_at_most_once_per_interval(kubelet: tuple[FakeKubelet, Path]) -> None:
    k, sock = kubelet
    clock = FakeClock(1000.0)
    with PodResourcesClient(sock, clock=clock, min_interval_s=1.0) as client:
        for _ in range(50):
            client.devices_in_use()
            client.allocatable()
        assert k.calls == {"List": 1, "GetAllocatableResources": 1}
        k.assign("ml", "p", "c", [GPU0])
        assert client.devices_in_use() == []  # the cached answer, still within the second
        clock.now += 1.0
        assert client.devices_in_use() == [DeviceUse("ml", "p", "c", GPU0)]
        assert k.calls["List"] == 2
        assert client.calls == {"List": 2, "GetAllocatableResources": 1}


def test_missing_socket_is_a_clear_error(socket_dir: Path) -> None:
    with (
        PodResourcesClient(socket_dir / "kubelet.sock") as client,
        pytest.raises(PodResourcesUnavailable) as err,
    ):
        client.devices_in_use()
    assert err.value.reason == "SocketMissing"
    assert "kubelet.sock does not exist" in str(err.value)
    assert "mount the host directory" in str(err.value)


def test_a_file_that_is_not_a_socket_is_refused(socket_dir: Path) -> None:
    (socket_dir / "kubelet.sock").write_text("")
    with (
        PodResourcesClient(socket_dir / "kubelet.sock") as client,
        pytest.raises(PodResourcesUnavailable) as err,
    ):
        client.allocatable()
    assert "not a unix socket" in str(err.value)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "RateLimited"),
        (grpc.StatusCode.UNIMPLEMENTED, "Unimplemented"),
        (grpc.StatusCode.INTERNAL, "RpcFailed"),
    ],
)
def test_rpc_errors_become_reasons(
    kubelet: tuple[FakeKubelet, Path], code: grpc.StatusCode, reason: str
) -> None:
    k, sock = kubelet
    k.fail["GetAllocatableResources"] = code
    with PodResourcesClient(sock) as client, pytest.raises(PodResourcesUnavailable) as err:
        client.allocatable()
    assert err.value.reason == reason
    assert code.name in str(err.value)


def test_a_failure_is_not_retried_within_the_interval(kubelet: tuple[FakeKubelet, Path]) -> None:
    k, sock = kubelet
    k.fail["List"] = grpc.StatusCode.RESOURCE_EXHAUSTED
    clock = FakeClock(1000.0)
    with PodResourcesClient(sock, clock=clock) as client:
        for _ in range(5):
            with pytest.raises(PodResourcesUnavailable):
                client.devices_in_use()
        assert k.calls["List"] == 1
        del k.fail["List"]
        clock.now += 1.5
        assert client.devices_in_use() == []
        assert k.calls["List"] == 2


def test_the_server_restarting_on_the_same_path_is_reached_again(socket_dir: Path) -> None:
    sock = socket_dir / "kubelet.sock"
    clock = FakeClock(1000.0)
    first, second = FakeKubelet(), FakeKubelet()
    second.assign("ml", "p", "c", [GPU0])
    with PodResourcesClient(sock, clock=clock) as client:
        with serve(first, sock):
            assert client.devices_in_use() == []
        sock.unlink(missing_ok=True)
        clock.now += 2
        with pytest.raises(PodResourcesUnavailable):
            client.devices_in_use()
        clock.now += 2
        with serve(second, sock):
            assert client.devices_in_use() == [DeviceUse("ml", "p", "c", GPU0)]


def test_get_is_served_by_the_fake_kubelet(kubelet: tuple[FakeKubelet, Path]) -> None:
    from extender.agent import podresources_pb2 as pb
    from extender.agent import podresources_pb2_grpc as pb_grpc

    k, sock = kubelet
    k.assign("ml", "p", "c", [GPU0])
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub: Any = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.Get(pb.GetPodResourcesRequest(pod_name="p", pod_namespace="ml"), timeout=5)
        assert list(reply.pod_resources.containers[0].devices[0].device_ids) == [GPU0]
        with pytest.raises(grpc.RpcError) as err:
            stub.Get(pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="ml"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
