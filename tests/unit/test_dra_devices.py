"""DRA devices in the cluster cache: a node whose GPUs NVIDIA's driver publishes is a ``dra``
node, its devices paired with the NodeTopology's GPUs by UUID or PCI bus ID; a mismatch keeps
it out of in-node choices with a condition naming it; allocated claims take devices."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from extender.controllers.topology_status.reporter import TopologyStatusReporter
from extender.kube import dra
from extender.kube.api import Kind
from extender.kube.topology_status import DEVICES_MATCHED, DRA_DEVICE_MISMATCH
from extender.reservations import ClusterCache
from extender.testing.dra import compute_domain_slice, device_classes, gpu_slice, gpu_uuid, with_identities
from extender.testing.extender import node_obj
from extender.testing.objects import make_node_topology
from extender.topology.allocation import Allocation
from extender.topology.presets import preset_graph

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "nvidia-dra"


def topology(node: str, graph: Any) -> dict[str, Any]:
    return make_node_topology(node).graph(graph).obj()


def dra_cache(*nodes: str, preset: str = "pcie-8gpu-2socket", **slice_kw: Any) -> ClusterCache:
    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    for n in nodes:
        graph = with_identities(n, preset_graph(preset))
        cache.apply(Kind.NODES, "ADDED", node_obj(n, gpus=0))
        cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", topology(n, graph))
        cache.apply(Kind.RESOURCE_SLICES, "ADDED", gpu_slice(n, graph, **slice_kw))
    return cache


def test_a_node_published_by_gpu_nvidia_com_is_a_dra_node_with_devices_paired_by_uuid() -> None:
    cache = dra_cache("p0")
    state = cache.snapshot().node("p0")
    assert state.allocation is Allocation.DRA
    device_map = cache.device_map("p0")
    assert device_map is not None
    assert {i: d.name for i, d in device_map.by_index.items()} == {i: f"gpu-{i}" for i in range(8)}
    assert device_map.device(5).uuid == gpu_uuid("p0", 5)
    assert cache.device_problems() == {}


def test_a_device_plugin_node_stays_one() -> None:
    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    cache.apply(Kind.NODES, "ADDED", node_obj("h0"))
    assert cache.snapshot().node("h0").allocation is Allocation.DEVICE_PLUGIN
    assert cache.device_map("h0") is None


def test_devices_pair_by_pci_bus_id_when_the_slice_has_no_uuid() -> None:
    cache = dra_cache("p0", drop={i: ["uuid"] for i in range(8)})
    device_map = cache.device_map("p0")
    assert device_map is not None and device_map.device(3).name == "gpu-3"


def test_a_device_without_uuid_or_bus_id_keeps_the_node_out_and_says_which() -> None:
    cache = dra_cache("p0", drop={2: ["uuid", dra.PCI_BUS_ID]})
    assert "p0" not in cache.node_names()
    assert cache.has_node_object("p0")  # out of in-node choices, not out of the cluster
    problem = cache.device_problems()["p0"]
    assert "gpu-2" in problem and "neither uuid nor" in problem
    assert "gpu-2" in (cache.node_problem("p0") or "")


def test_a_topology_of_another_machine_is_a_mismatch_naming_the_gpu() -> None:
    cache = dra_cache("p0")
    wrong = with_identities("elsewhere", preset_graph("pcie-8gpu-2socket"))
    # Same bus IDs would still pair: move them too, so nothing identifies the GPUs.
    wrong = type(wrong)(
        gpus=tuple(type(g)(g.index, g.uuid, f"0000:{0xA0 + g.index:02x}:00.0") for g in wrong.gpus),
        links=wrong.links,
    )
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology("p0", wrong))
    assert "p0" not in cache.node_names()
    assert "NodeTopology GPU 0" in cache.device_problems()["p0"]
    cache.apply(
        Kind.NODE_TOPOLOGIES,
        "MODIFIED",
        topology("p0", with_identities("p0", preset_graph("pcie-8gpu-2socket"))),
    )
    assert "p0" in cache.node_names() and cache.device_problems() == {}


def test_more_devices_than_gpus_is_a_mismatch() -> None:
    cache = dra_cache("p0")
    four = with_identities("p0", preset_graph("pcie-8gpu-2socket"))
    bigger = gpu_slice("p0", four)
    bigger["spec"]["devices"].append({**bigger["spec"]["devices"][0], "name": "gpu-8"})
    bigger["spec"]["devices"][-1]["attributes"] = {"type": {"string": "gpu"}, "uuid": {"string": "GPU-extra"}}
    cache.apply(Kind.RESOURCE_SLICES, "MODIFIED", bigger)
    assert "gpu-8" in cache.device_problems()["p0"]


def test_allocated_claims_take_their_devices_and_free_them_when_gone() -> None:
    cache = dra_cache("p0")
    claim = {
        "metadata": {"name": "foreign", "namespace": "other"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": dra.GPU_DRIVER, "pool": "p0", "device": "gpu-5"},
                        {"request": "gpu", "driver": dra.GPU_DRIVER, "pool": "p0", "device": "gpu-6"},
                    ]
                }
            }
        },
    }
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", claim)
    assert cache.snapshot().node("p0").allocated == frozenset({5, 6})
    cache.apply(Kind.RESOURCE_CLAIMS, "DELETED", claim)
    assert cache.snapshot().node("p0").allocated == frozenset()


def test_a_compute_domain_slice_alone_does_not_make_a_gpu_node() -> None:
    cache = dra_cache("t0", preset="gb200-tray")
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", compute_domain_slice("t0"))
    device_map = cache.device_map("t0")
    assert device_map is not None and len(device_map.by_index) == 4


def test_nvidia_device_classes_render_and_name_their_drivers() -> None:
    classes = {c["metadata"]["name"]: c for c in device_classes(FIXTURES)}
    assert set(classes) == {
        "gpu.nvidia.com",
        "compute-domain-default-channel.nvidia.com",
        "compute-domain-daemon.nvidia.com",
    }
    assert all(c["apiVersion"] == "resource.k8s.io/v1" for c in classes.values())
    assert dra.class_drivers(classes["gpu.nvidia.com"]) == {dra.GPU_DRIVER}
    cache = dra_cache("p0")
    cache.replace(Kind.DEVICE_CLASSES, list(classes.values()))
    assert cache.device_class_drivers("gpu.nvidia.com") == {dra.GPU_DRIVER}
    assert cache.device_class_drivers("nope") is None


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:18:00.0", "0000:18:00.0"),
        ("0000:AB:00.0", "0000:ab:00.0"),
    ],
)
def test_bus_ids_compare_in_one_spelling(raw: str, want: str) -> None:
    assert dra.bus_id(raw) == want


class _Api:
    def __init__(self) -> None:
        self.conditions: list[tuple[str, dict[str, str]]] = []
        self.events: list[dict[str, Any]] = []

    async def apply_condition(self, node: str, condition: Any) -> None:
        self.conditions.append((node, dict(condition)))

    async def create_event(self, event: Any) -> None:
        self.events.append(dict(event))


def test_the_mismatch_becomes_a_devices_matched_condition_and_a_node_event() -> None:
    cache = dra_cache("p0", drop={2: ["uuid", dra.PCI_BUS_ID]})
    api = _Api()
    written = asyncio.run(TopologyStatusReporter(api).sync(cache, 0.0))
    assert written == 1
    node, cond = api.conditions[0]
    assert node == "p0" and cond["type"] == DEVICES_MATCHED and cond["status"] == "False"
    assert "gpu-2" in cond["message"]
    assert api.events[0]["reason"] == DRA_DEVICE_MISMATCH
