"""Fake DRA nodes for tests: GPU graphs with identities, and ResourceSlices shaped exactly like
NVIDIA's DRA driver publishes them (``gpu.nvidia.com``, one pool per node named after it,
one device ``gpu-<minor>`` per GPU with ``type``, ``uuid``, ``productName``, ``brand``,
``architecture``, ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` and the
standard ``resource.kubernetes.io/pciBusID`` / ``pcieRoot``, capacity ``memory``), plus the
``compute-domain.nvidia.com`` slice of a GB200 tray (``channel-0`` and ``daemon-0``).

NVIDIA's DeviceClasses ship as Helm templates (tests/fixtures/upstream/nvidia-dra);
:func:`device_classes` renders them for ``resource.k8s.io/v1`` as the chart does.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from extender.kube import dra
from extender.topology.model import GpuGraph

#: The driver release the fake slices imitate (attributes as of v25.12: standard pciBusID).
DRIVER_VERSION = "580.95.5"  # semver: the driver drops the leading zero of 580.95.05
CUDA_DRIVER_VERSION = "13.0.0"


def gpu_uuid(node: str, index: int) -> str:
    """A stable, unique GPU UUID in NVML's spelling for a fake GPU."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.gangslice.test"))


def bus_id(index: int) -> str:
    """The PCI bus ID of fake GPU ``index`` in NVML's spelling (8-digit domain)."""
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def with_identities(node: str, graph: GpuGraph) -> GpuGraph:
    """``graph`` with a UUID and PCI bus ID on every GPU, as the node agent reads them from NVML."""
    gpus = tuple(
        dataclasses.replace(g, uuid=gpu_uuid(node, g.index), pci_bus_id=bus_id(g.index)) for g in graph.gpus
    )
    return dataclasses.replace(graph, gpus=gpus)


def _product(graph: GpuGraph) -> tuple[str, str, str]:
    model = (graph.model or "").lower()
    if "gb200" in model or "b200" in model:
        return "NVIDIA GB200", "Blackwell", "10.0.0"
    if "a100" in model:
        return "NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0"
    return "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0"


def gpu_slice(
    node: str,
    graph: GpuGraph,
    *,
    generation: int = 1,
    drop: Mapping[int, Sequence[str]] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's driver publishes for ``node`` (whose GPUs carry UUIDs and bus
    IDs). ``drop``: GPU index -> attribute names to leave out (a device without identity)."""
    product, arch, cc = _product(graph)
    devices = []
    for g in graph.gpus:
        assert g.uuid and g.pci_bus_id, "give the graph identities first (with_identities)"
        pci = dra.bus_id(g.pci_bus_id)
        attrs: dict[str, Any] = {
            "type": {"string": "gpu"},
            "uuid": {"string": g.uuid},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": arch},
            "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            dra.PCI_BUS_ID: {"string": pci},
            dra.PCIE_ROOT: {"string": pcie_root(g.numa_node)},
        }
        for name in (drop or {}).get(g.index, ()):
            attrs.pop(name, None)
        devices.append(
            {"name": f"gpu-{g.index}", "attributes": attrs, "capacity": {"memory": {"value": "80Gi"}}}
        )
    meta: dict[str, Any] = {"name": f"{node}-gpu.nvidia.com-{generation:05d}"}
    if uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": dra.GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def pcie_root(numa_node: int | None) -> str:
    """One root complex per socket (the device's NUMA node), as on a dual-socket box."""
    return f"pci0000:{0x80 * (numa_node or 0):02x}"


#: The driver name of the DRA network driver ``dranet`` (its attributes are qualified by it).
NIC_DRIVER = "dra.net"


def nic_slice(node: str, graph: GpuGraph, *, generation: int = 1) -> dict[str, Any]:
    """The ResourceSlice a DRA network driver (dranet) publishes for ``node``'s RDMA NICs: each
    NIC under the root complex of its NUMA node, beside that socket's GPUs."""
    devices = [
        {
            "name": nic.name.lower().replace("_", "-"),
            "attributes": {
                f"{NIC_DRIVER}/ifName": {"string": nic.name},
                f"{NIC_DRIVER}/rdma": {"bool": True},
                f"{NIC_DRIVER}/numaNode": {"int": nic.numa_node or 0},
                dra.PCIE_ROOT: {"string": pcie_root(nic.numa_node)},
            },
        }
        for nic in graph.nics
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{NIC_DRIVER}-{generation:05d}"},
        "spec": {
            "driver": NIC_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def nic_class(name: str = "rdma-nic") -> dict[str, Any]:
    """A DeviceClass of the network driver's RDMA NICs."""
    rdma = f'device.driver == "{NIC_DRIVER}" && device.attributes["{NIC_DRIVER}"].rdma'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": rdma}}]},
    }


def compute_domain_slice(node: str, *, generation: int = 1) -> dict[str, Any]:
    """The ``compute-domain.nvidia.com`` slice of a GB200 tray: one channel and one daemon device."""
    devices = [
        {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
        {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}},
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-compute-domain.nvidia.com-{generation:05d}"},
        "spec": {
            "driver": dra.COMPUTE_DOMAIN_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


_CONTROL = re.compile(r"^\s*\{\{-?\s*(if|end|\$)[^}]*\}\}\s*$")
_API_VERSION = re.compile(r"\{\{[^}]*resourceApiVersion[^}]*\}\}")


def device_classes(folder: Path, api_version: str = "resource.k8s.io/v1") -> list[dict[str, Any]]:
    """NVIDIA's DeviceClass templates in ``folder`` (``deviceclass-*.yaml``) rendered as the
    Helm chart does with every resource enabled: control lines dropped, the API version put in."""
    out: list[dict[str, Any]] = []
    for path in sorted(folder.glob("deviceclass-*.yaml")):
        lines = []
        for line in path.read_text().splitlines():
            if _CONTROL.match(line):
                if "eq $resourceApiVersion" in line and api_version != "resource.k8s.io/v1":
                    break
                continue
            lines.append(_API_VERSION.sub(api_version, line))
        out.extend(doc for doc in yaml.safe_load_all("\n".join(lines)) if doc)
    return out
