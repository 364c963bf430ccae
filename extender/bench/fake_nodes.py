"""Fake GPU nodes for a control plane without kubelets (``gangslice bench scheduler``,
``gangslice playground``).

A fake node is three writes: the Node with its labels, its status (capacity and allocatable,
a ``Ready`` condition; nothing ever updates it, so no node-lifecycle controller may run), and
its NodeTopology: a preset's GPU graph, as the node agent publishes it from NVML. The labels
are those GPU Feature Discovery writes (``nvidia.com/gpu.product``, ``.count``, ``.memory``,
``.family``, ``.present``; ``nvidia.com/gpu.clique`` on a multi-node NVLink tray) and those
NVIDIA topograph writes (``fabric.topograph.run/tier-N``, ``accelerator.topograph.run/domain``).
"""

from __future__ import annotations

import functools
import time
import urllib.error
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from extender.bench.controlplane import ControlPlane, ControlPlaneError
from extender.kube import names as keys
from extender.topology.model import FabricClique
from extender.topology.presets import preset_graph
from extender.topology.serialize import graph_to_dict

__all__ = ["FakeGpuNode", "GpuModel", "create_nodes", "node_objects", "playground_fleet"]

SPINE_LABEL = "fabric.topograph.run/tier-1"
LEAF_LABEL = "fabric.topograph.run/tier-0"
NVL_DOMAIN_LABEL = "accelerator.topograph.run/domain"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
#: What the NVIDIA network operator's RDMA shared device plugin advertises; the prefill/decode
#: example asks for one.
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
#: Requests in flight while creating nodes.
CREATORS = 8


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model as GPU Feature Discovery labels it (NVML's name with dashes, memory in MiB)."""

    product: str
    memory_mib: int
    family: str

    def labels(self, count: int, clique: FabricClique | None = None) -> dict[str, str]:
        out = {
            "nvidia.com/gpu.present": "true",
            keys.GPU_PRODUCT_LABEL: self.product,
            keys.GPU_COUNT_LABEL: str(count),
            "nvidia.com/gpu.memory": str(self.memory_mib),
            "nvidia.com/gpu.family": self.family,
        }
        if clique is not None:
            out[CLIQUE_LABEL] = clique.label
        return out


H100_SXM = GpuModel("NVIDIA-H100-80GB-HBM3", 81559, "hopper")
L40S = GpuModel("NVIDIA-L40S", 46068, "ada-lovelace")
GB200 = GpuModel("NVIDIA-GB200", 189471, "blackwell")


@dataclass(frozen=True, slots=True)
class FakeGpuNode:
    """One node: its GPU graph (a preset), labels and capacity (besides ``nvidia.com/gpu``, which
    the preset's GPU count gives), and its multi-node NVLink clique, if any."""

    name: str
    preset: str
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=lambda: {"cpu": "128", "memory": "1Ti"})
    clique: FabricClique | None = None

    @property
    def gpus(self) -> int:
        return len(preset_graph(self.preset).gpus)


def node_objects(node: FakeGpuNode) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The Node, the merge patch of its status (capacity, Ready), and its NodeTopology."""
    labels = {"kubernetes.io/hostname": node.name, **node.labels}
    resources = {"pods": "110", **node.capacity, keys.GPU_RESOURCE: str(node.gpus)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "fake node: no kubelet runs here",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    spec = {**_preset_spec(node.preset), "source": "nvml"}  # top-level keys only: the rest is shared
    if node.clique is not None:
        spec["clique"] = {"clusterUuid": node.clique.cluster_uuid, "cliqueId": node.clique.clique_id}
    return (
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels}},
        {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        {
            "apiVersion": f"{keys.GROUP}/{keys.VERSION}",
            "kind": "NodeTopology",
            "metadata": {"name": node.name},
            "spec": spec,
        },
    )


def create_nodes(cp: ControlPlane, nodes: Sequence[FakeGpuNode]) -> None:
    """Create every node's three objects (a few requests in flight at once); the NodeTopology CRD
    must be installed."""

    def one(node: FakeGpuNode) -> None:
        obj, status, topology = node_objects(node)
        post(cp, "/api/v1/nodes", obj)
        cp.request(
            "PATCH",
            f"/api/v1/nodes/{node.name}/status",
            status,
            content_type="application/merge-patch+json",
        )
        post(cp, f"/apis/{keys.GROUP}/{keys.VERSION}/{keys.NODE_TOPOLOGIES}", topology)

    parallel(one, nodes)


def playground_fleet() -> list[FakeGpuNode]:
    """The nodes of ``gangslice playground``, under one spine switch: four HGX H100 nodes under
    two leaf switches, two 8x L40S PCIe boxes under a third, and the 18 compute trays of one
    GB200 NVL72 rack (one NVLink clique, one NVLink domain) under a fourth."""
    spine = {SPINE_LABEL: "spine-1"}
    rdma = {RDMA_RESOURCE: "1k"}
    hgx = [
        FakeGpuNode(
            f"hgx-h100-{i}",
            "hgx-h100",
            {**spine, LEAF_LABEL: f"leaf-hgx-{(i + 1) // 2}", **H100_SXM.labels(8)},
            {"cpu": "192", "memory": "2Ti", **rdma},
        )
        for i in range(1, 5)
    ]
    pcie = [
        FakeGpuNode(
            f"l40s-{i}",
            "pcie-8gpu-2socket",
            {**spine, LEAF_LABEL: "leaf-pcie", **L40S.labels(8)},
            {"cpu": "128", "memory": "1Ti"},
        )
        for i in range(1, 3)
    ]
    # GPU Feature Discovery's clique label is <ClusterUUID>.<CliqueID>; any fixed UUID will do.
    clique = FabricClique(str(uuid.uuid5(uuid.NAMESPACE_DNS, "nvl72-rack-1.playground.gangslice.io")), 1)
    rack = {**spine, LEAF_LABEL: "leaf-nvl72", NVL_DOMAIN_LABEL: "nvl72-rack-1"}
    trays = [
        FakeGpuNode(
            f"gb200-rack1-tray{i:02d}",
            "gb200-tray",
            {**rack, **GB200.labels(4, clique)},
            {"cpu": "144", "memory": "960Gi", **rdma},
            clique,
        )
        for i in range(1, 19)
    ]
    return hgx + pcie + trays


@functools.cache
def _preset_spec(preset: str) -> dict[str, Any]:
    return graph_to_dict(preset_graph(preset))


def post(cp: ControlPlane, path: str, obj: Any) -> None:
    """Create ``obj`` at ``path``; an API error names the path and the server's answer."""
    try:
        cp.request("POST", path, obj)
    except urllib.error.HTTPError as e:
        raise ControlPlaneError(f"POST {path}: HTTP {e.code} {e.read()[:400]!r}") from None


def parallel(fn: Callable[[Any], None], work: Sequence[Any]) -> None:
    """``fn`` on every item of ``work``, a few at a time (creating objects one by one is slow)."""
    with ThreadPoolExecutor(CREATORS) as pool:
        for _ in pool.map(fn, work):
            pass
