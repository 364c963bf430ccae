"""What NVIDIA's DRA driver publishes, read into gangslice's terms.

A node is a ``dra`` node (:class:`~extender.topology.allocation.Allocation`) when a
ResourceSlice of driver ``gpu.nvidia.com`` names it. The driver publishes one pool per node
(pool name = node name) with a device ``gpu-<minor>`` per GPU whose attributes include
``uuid`` and the standard ``resource.kubernetes.io/pciBusID`` / ``pcieRoot``; it publishes no
NVLink or NUMA facts. So identity comes from the slice and the graph from the node agent's
NodeTopology: :func:`match_devices` pairs each device with a GPU of the graph by UUID, else
by PCI bus ID, and names the first mismatch when the two disagree. A mismatched node is kept
out of in-node choices (gangslice cannot name its devices) and says why on its NodeTopology.

Only the parts gangslice reads are parsed; the rest of a slice is left to kube-scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.kube.api import as_map
from extender.topology.model import GpuGraph

#: NVIDIA's DRA driver for GPUs (and its DeviceClass of the same name).
GPU_DRIVER = "gpu.nvidia.com"
#: The DeviceClass NVIDIA's Helm chart installs for whole GPUs.
GPU_DEVICE_CLASS = "gpu.nvidia.com"
#: The driver of ComputeDomain channels and IMEX daemons.
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
#: Standard device attributes (k8s.io/dynamic-resource-allocation ``deviceattribute``).
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
#: The driver's own attribute with the GPU UUID (``device.attributes["gpu.nvidia.com"].uuid``).
UUID = "uuid"
#: Before v25.12 the driver published the bus ID under its own name.
LEGACY_PCI_BUS_ID = "pcieBusID"


@dataclass(frozen=True, slots=True)
class Device:
    """One published device: its name in the pool and the attributes gangslice keys on."""

    name: str
    type: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None


@dataclass(frozen=True, slots=True)
class SliceInfo:
    """One ResourceSlice: ``(driver, pool)`` and the node it is local to (None: not node-local)."""

    name: str
    driver: str
    pool: str
    node: str | None
    generation: int
    devices: tuple[Device, ...]


def attribute(attrs: Mapping[str, Any], key: str) -> str | int | bool | None:
    """The value of one device attribute (``{"string": ...}``, ``{"int": ...}``, ``{"version": ...}``,
    ``{"bool": ...}``), under its plain name or the driver-qualified one."""
    got = attrs.get(key)
    if not isinstance(got, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        value = got.get(kind)
        if isinstance(value, str | int | bool):
            return value
    return None


def _text(attrs: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        got = attribute(attrs, key)
        if isinstance(got, str) and got:
            return got
    return None


def parse_slice(obj: Mapping[str, Any]) -> SliceInfo | None:
    """A ResourceSlice object (``resource.k8s.io/v1``), or None when it has no name or driver."""
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    name, driver = meta.get("name"), spec.get("driver")
    if not isinstance(name, str) or not isinstance(driver, str) or not driver:
        return None
    pool = as_map(spec.get("pool"))
    node = spec.get("nodeName")
    devices = []
    for d in spec.get("devices") or ():
        if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
            continue
        attrs = as_map(d.get("attributes"))
        devices.append(
            Device(
                name=d["name"],
                type=_text(attrs, "type", f"{driver}/type"),
                uuid=_text(attrs, UUID, f"{driver}/{UUID}"),
                pci_bus_id=_text(attrs, PCI_BUS_ID, LEGACY_PCI_BUS_ID, f"{driver}/{LEGACY_PCI_BUS_ID}"),
                pcie_root=_text(attrs, PCIE_ROOT),
            )
        )
    generation = pool.get("generation")
    return SliceInfo(
        name=name,
        driver=driver,
        pool=str(pool.get("name") or ""),
        node=node if isinstance(node, str) and node else None,
        generation=generation if isinstance(generation, int) else 0,
        devices=tuple(devices),
    )


def gpu_devices(slices: Iterable[SliceInfo]) -> list[Device]:
    """The GPUs ``gpu.nvidia.com`` publishes in a node's slices (the newest pool generation
    only: older slices of a pool being rewritten are stale), in device-name order."""
    ours = [s for s in slices if s.driver == GPU_DRIVER]
    if not ours:
        return []
    newest = max(s.generation for s in ours)
    devices = [d for s in ours if s.generation == newest for d in s.devices if d.type in (None, "gpu")]
    return sorted(devices, key=lambda d: _natural(d.name))


def devices_at_root(slices: Iterable[SliceInfo], drivers: frozenset[str], root: str) -> int:
    """How many devices of ``drivers`` (not ``gpu.nvidia.com``: a network driver's NICs beside
    the GPUs) a node's slices publish on PCIe root ``root``, newest pool generations only."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return sum(
        1
        for s in slices
        if s.driver in drivers and s.driver != GPU_DRIVER and s.generation == newest[(s.driver, s.pool)]
        for d in s.devices
        if d.pcie_root == root
    )


def _natural(name: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.*?)(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def bus_id(raw: str) -> str:
    """A PCI bus ID in one spelling: NVML's ``00000000:17:00.0`` and the standard attribute's
    ``0000:17:00.0`` both become ``0000:17:00.0`` (lower case, 4-digit domain)."""
    text = raw.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        return text
    return f"{int(domain, 16):04x}:{rest}" if re.fullmatch(r"[0-9a-f]+", domain) else text


@dataclass(frozen=True, slots=True)
class DeviceMap:
    """A DRA node's GPUs: graph index -> published device (same node, same pool)."""

    pool: str
    by_index: Mapping[int, Device]

    def device(self, index: int) -> Device:
        return self.by_index[index]

    def index_of(self, device_name: str) -> int | None:
        for i, d in self.by_index.items():
            if d.name == device_name:
                return i
        return None


def match_devices(node: str, graph: GpuGraph | None, devices: Iterable[Device]) -> DeviceMap | str:
    """Pair the node's published GPUs with the GPUs of its NodeTopology graph (UUID first,
    then PCI bus ID); the problem as text when they do not pair one to one."""
    devs = list(devices)
    for d in devs:
        if not d.uuid and not d.pci_bus_id:
            return f"ResourceSlice device {d.name} of {GPU_DRIVER} publishes neither uuid nor {PCI_BUS_ID}"
    if graph is None:
        return f"{GPU_DRIVER} publishes {len(devs)} GPUs on {node} but it has no NodeTopology"
    by_uuid = {d.uuid.lower(): d for d in devs if d.uuid}
    by_bus = {bus_id(d.pci_bus_id): d for d in devs if d.pci_bus_id}
    out: dict[int, Device] = {}
    for gpu in graph.gpus:
        found = by_uuid.get(gpu.uuid.lower()) if gpu.uuid else None
        if found is None and gpu.pci_bus_id:
            found = by_bus.get(bus_id(gpu.pci_bus_id))
        if found is None:
            ident = gpu.uuid or gpu.pci_bus_id
            if ident is None:
                return f"NodeTopology GPU {gpu.index} has neither uuid nor pciBusId to match a device by"
            return f"NodeTopology GPU {gpu.index} ({ident}) is not among the {GPU_DRIVER} devices of the node"
        if found.name in {d.name for d in out.values()}:
            return f"NodeTopology GPUs match ResourceSlice device {found.name} twice"
        out[gpu.index] = found
    extra = sorted({d.name for d in devs} - {d.name for d in out.values()}, key=_natural)
    if extra:
        return f"ResourceSlice devices {', '.join(extra)} of {GPU_DRIVER} match no GPU of the NodeTopology"
    return DeviceMap(pool=node, by_index=out)


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(driver, pool, device)`` of each device a ResourceClaim's allocation holds."""
    status = as_map(claim.get("status"))
    alloc = as_map(status.get("allocation"))
    devices = as_map(alloc.get("devices"))
    out = []
    for r in devices.get("results") or ():
        if isinstance(r, Mapping) and all(isinstance(r.get(k), str) for k in ("driver", "pool", "device")):
            if r.get("adminAccess") is True:
                continue  # admin access does not take the device
            out.append((r["driver"], r["pool"], r["device"]))
    return out


_DRIVER_RE = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")


def class_drivers(device_class: Mapping[str, Any]) -> frozenset[str]:
    """The drivers a DeviceClass's CEL selectors name (``device.driver == "gpu.nvidia.com"``)."""
    spec = as_map(device_class.get("spec"))
    found = set()
    for sel in spec.get("selectors") or ():
        expr = as_map(as_map(sel).get("cel")).get("expression")
        if isinstance(expr, str):
            found.update(_DRIVER_RE.findall(expr))
    return frozenset(found)
