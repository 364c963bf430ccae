"""The PodResources v1 proto: the kubelet's wire names and numbers, and reproducible generated code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from extender.agent import podresources_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("podresources_pb2.py", "podresources_pb2_grpc.py", "podresources_pb2.pyi")

I64, U64, STR, MSG = (
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_STRING,
    "msg",
)

# The field table of k8s.io/kubelet pkg/apis/podresources/v1/api.proto:
# message -> [(field, number, type or message name, repeated)].
KUBELET_FIELDS: dict[str, list[tuple[str, int, object, bool]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, "PodResources", True)],
    "PodResources": [
        ("name", 1, STR, False),
        ("namespace", 2, STR, False),
        ("containers", 3, "ContainerResources", True),
        ("cpu_ids", 4, I64, True),
        ("memory", 5, "ContainerMemory", True),
    ],
    "ContainerResources": [
        ("name", 1, STR, False),
        ("devices", 2, "ContainerDevices", True),
        ("cpu_ids", 3, I64, True),
        ("memory", 4, "ContainerMemory", True),
        ("dynamic_resources", 5, "DynamicResource", True),
    ],
    "ContainerDevices": [
        ("resource_name", 1, STR, False),
        ("device_ids", 2, STR, True),
        ("topology", 3, "TopologyInfo", False),
    ],
    "ContainerMemory": [
        ("memory_type", 1, STR, False),
        ("size", 2, U64, False),
        ("topology", 3, "TopologyInfo", False),
    ],
    "TopologyInfo": [("nodes", 1, "NUMANode", True)],
    "NUMANode": [("ID", 1, I64, False)],
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [
        ("devices", 1, "ContainerDevices", True),
        ("cpu_ids", 2, I64, True),
        ("memory", 3, "ContainerMemory", True),
    ],
    "DynamicResource": [
        ("claim_name", 2, STR, False),
        ("claim_namespace", 3, STR, False),
        ("claim_resources", 4, "ClaimResource", True),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, "CDIDevice", True),
        ("driver_name", 2, STR, False),
        ("pool_name", 3, STR, False),
        ("device_name", 4, STR, False),
        ("share_id", 5, STR, False),
    ],
    "CDIDevice": [("name", 1, STR, False)],
    "GetPodResourcesRequest": [("pod_name", 1, STR, False), ("pod_namespace", 2, STR, False)],
    "GetPodResourcesResponse": [("pod_resources", 1, "PodResources", False)],
}


def _shape(field: FieldDescriptor) -> tuple[str, int, object, bool]:
    kind: object = field.message_type.name if field.type == FieldDescriptor.TYPE_MESSAGE else field.type
    return (field.name, field.number, kind, field.is_repeated)


@pytest.mark.parametrize("message", sorted(KUBELET_FIELDS))
def test_message_fields_match_the_kubelet(message: str) -> None:
    descriptor = pb.DESCRIPTOR.message_types_by_name[message]
    assert [_shape(f) for f in descriptor.fields] == KUBELET_FIELDS[message]


def test_only_the_kubelet_messages_exist_in_package_v1() -> None:
    assert pb.DESCRIPTOR.package == "v1"
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(KUBELET_FIELDS)


def test_share_id_has_presence_and_class_name_number_is_not_reused() -> None:
    claim = pb.DESCRIPTOR.message_types_by_name["ClaimResource"]
    assert claim.fields_by_name["share_id"].has_presence
    dynamic = pb.DESCRIPTOR.message_types_by_name["DynamicResource"]
    assert 1 not in dynamic.fields_by_number


def test_service_methods_are_the_kubelets() -> None:
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }
    assert service.full_name == "v1.PodResourcesLister"  # the gRPC path is /v1.PodResourcesLister/List


def test_a_kubelet_reply_encoded_by_hand_decodes() -> None:
    # ListPodResourcesResponse{pod_resources: [{name: "p", namespace: "ns", containers: [{name: "c",
    # devices: [{resource_name: "r", device_ids: ["d"]}]}]}]}, written field by field as wire bytes.
    device = b"\x0a\x01r" + b"\x12\x01d"
    container = b"\x0a\x01c" + b"\x12" + bytes([len(device)]) + device
    pod = b"\x0a\x01p" + b"\x12\x02ns" + b"\x1a" + bytes([len(container)]) + container
    reply = pb.ListPodResourcesResponse.FromString(b"\x0a" + bytes([len(pod)]) + pod)
    (got,) = reply.pod_resources
    assert (got.name, got.namespace) == ("p", "ns")
    assert got.containers[0].devices[0].resource_name == "r"
    assert list(got.containers[0].devices[0].device_ids) == ["d"]


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "gen-proto.sh"), str(tmp_path)],
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    real_node = [
        f"extender/testing/{api}{suffix}"
        for api in ("deviceplugin", "dra", "pluginregistration")
        for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
    ]
    for path in [f"extender/agent/{name}" for name in GENERATED] + real_node:
        fresh = (tmp_path / path).read_bytes()
        committed = (ROOT / path).read_bytes()
        assert fresh == committed, f"{path} is stale: run hack/gen-proto.sh"
