"""A fake :class:`~extender.topology.nvml.NvmlBackend` built from plain data.

Shipped with the package so agent and preflight tests can run without a GPU. Builders
model common boxes (:meth:`FakeNvml.hgx_h100`, :meth:`FakeNvml.dgx_a100`,
:meth:`FakeNvml.pcie_2socket`, :meth:`FakeNvml.gb200_tray`) or replay a parsed graph
(:meth:`FakeNvml.from_graph`). ``fail`` injects NVML errors per call (and optionally per
GPU); :meth:`FakeNvml.add_errors` moves the health counters between samples;
:meth:`FakeNvml.write_sysfs` lays out the matching sysfs tree (NUMA nodes, PCI paths, NICs).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

from extender.topology.model import GpuGraph, PcieLevel
from extender.topology.nvml import (
    NVML_SUCCESS,
    FabricInfo,
    FabricState,
    NvlinkErrorCounter,
    NvmlInvalidArgument,
    NvmlNotSupported,
    RemoteDevice,
    normalize_bus_id,
)

#: NVML topology levels (``nvmlGpuTopologyLevel_t``).
PIX, PXB, PHB, NODE, SYS = 10, 20, 30, 40, 50

#: The backend calls ``fail`` may name.
CALLS = frozenset(
    {
        "device_count",
        "uuid",
        "pci_bus_id",
        "name",
        "topology_common_ancestor",
        "nvlink_state",
        "nvlink_remote_device_type",
        "nvlink_remote_pci_bus_id",
        "cpu_affinity",
        "memory_affinity",
        "fabric_info",
        "nvlink_error_counter",
        "pcie_replay_counter",
    }
)

FailSpec = type[BaseException] | BaseException


@dataclass(frozen=True, slots=True)
class FakeLink:
    remote_type: int
    remote_bus_id: str  # NVML form
    enabled: bool = True


@dataclass
class FakeGpu:
    """One GPU. ``pci_path`` is its sysfs chain ``(pciDDDD:BB, bridge, ..., own bdf)``."""

    uuid: str
    bus_id: str  # NVML form, e.g. 00000000:18:00.0
    name: str
    links: list[FakeLink] = field(default_factory=list)
    numa_node: int | None = None
    cpus: frozenset[int] = frozenset()
    fabric: FabricInfo | None = None  # None: NVML says NOT_SUPPORTED
    pci_path: tuple[str, ...] = ()
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter) -> count
    pcie_replays: int = 0


@dataclass(frozen=True, slots=True)
class FakeNic:
    name: str
    pci_path: tuple[str, ...]
    numa_node: int | None = None


def _words(bits: frozenset[int]) -> list[int]:
    words = [0] * (max(bits, default=0) // 64 + 1)
    for bit in bits:
        words[bit // 64] |= 1 << (bit % 64)
    return words


class FakeNvml:
    """Answers NVML questions from :class:`FakeGpu` data.

    ``ancestors`` maps each ``(low, high)`` index pair to an NVML topology level. ``fail``
    maps a call name (see :data:`CALLS`), or ``(call name, GPU index)``, to the exception
    (class or instance) that call raises; it is a plain dict, so tests may change it later.
    """

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        ancestors: Mapping[tuple[int, int], int],
        *,
        nics: Sequence[FakeNic] = (),
        fail: Mapping[str | tuple[str, int], FailSpec] | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.ancestors = dict(ancestors)
        self.nics = list(nics)
        self.fail: dict[str | tuple[str, int], FailSpec] = dict(fail or {})
        for key in self.fail:
            call = key[0] if isinstance(key, tuple) else key
            if call not in CALLS:
                raise ValueError(f"fail names unknown NVML call {call!r}; known: {sorted(CALLS)}")
        for pair in itertools.combinations(range(len(self.gpus)), 2):
            if pair not in self.ancestors:
                raise ValueError(f"no topology level given for GPU pair {pair}")

    # -- fault injection and counters ---------------------------------------------------

    def _check(self, call: str, index: int | None = None) -> None:
        err = self.fail.get((call, index)) if index is not None else None
        if err is None:
            err = self.fail.get(call)
        if err is not None:
            raise err

    def _gpu(self, call: str, index: int) -> FakeGpu:
        self._check(call, index)
        if not 0 <= index < len(self.gpus):
            raise NvmlInvalidArgument(f"{call}: no GPU {index}")
        return self.gpus[index]

    def _link(self, call: str, index: int, link: int) -> FakeLink:
        gpu = self._gpu(call, index)
        if not gpu.links:
            raise NvmlNotSupported(f"{call}: GPU{index} has no NVLink")
        if not 0 <= link < len(gpu.links):
            raise NvmlInvalidArgument(f"{call}: GPU{index} has no link {link}")
        return gpu.links[link]

    def add_errors(
        self,
        index: int,
        *,
        crc: int = 0,
        replay: int = 0,
        recovery: int = 0,
        pcie_replays: int = 0,
        link: int = 0,
    ) -> None:
        """Advance one GPU's cumulative counters (NVLink ones on ``link``)."""
        gpu = self.gpus[index]
        for counter, n in (
            (NvlinkErrorCounter.DL_CRC_FLIT, crc),
            (NvlinkErrorCounter.DL_REPLAY, replay),
            (NvlinkErrorCounter.DL_RECOVERY, recovery),
        ):
            key = (link, int(counter))
            gpu.nvlink_errors[key] = gpu.nvlink_errors.get(key, 0) + n
        gpu.pcie_replays += pcie_replays

    # -- NvmlBackend -------------------------------------------------------------------

    def device_count(self) -> int:
        self._check("device_count")
        return len(self.gpus)

    def uuid(self, index: int) -> str:
        return self._gpu("uuid", index).uuid

    def pci_bus_id(self, index: int) -> str:
        return self._gpu("pci_bus_id", index).bus_id

    def name(self, index: int) -> str:
        return self._gpu("name", index).name

    def topology_common_ancestor(self, a: int, b: int) -> int:
        self._gpu("topology_common_ancestor", a)
        self._gpu("topology_common_ancestor", b)
        if a == b:
            raise NvmlInvalidArgument("topology_common_ancestor of a GPU with itself")
        return self.ancestors[(min(a, b), max(a, b))]

    def nvlink_state(self, index: int, link: int) -> bool:
        return self._link("nvlink_state", index, link).enabled

    def nvlink_remote_device_type(self, index: int, link: int) -> int:
        return self._link("nvlink_remote_device_type", index, link).remote_type

    def nvlink_remote_pci_bus_id(self, index: int, link: int) -> str:
        return self._link("nvlink_remote_pci_bus_id", index, link).remote_bus_id

    def cpu_affinity(self, index: int) -> list[int]:
        return _words(self._gpu("cpu_affinity", index).cpus)

    def memory_affinity(self, index: int) -> list[int]:
        node = self._gpu("memory_affinity", index).numa_node
        return _words(frozenset() if node is None else frozenset({node}))

    def fabric_info(self, index: int) -> FabricInfo:
        info = self._gpu("fabric_info", index).fabric
        if info is None:
            raise NvmlNotSupported(f"fabric_info: GPU{index} is not fabric-capable")
        return info

    def nvlink_error_counter(self, index: int, link: int, counter: int) -> int:
        self._link("nvlink_error_counter", index, link)
        return self.gpus[index].nvlink_errors.get((link, counter), 0)

    def pcie_replay_counter(self, index: int) -> int:
        return self._gpu("pcie_replay_counter", index).pcie_replays

    # -- sysfs -------------------------------------------------------------------------

    def write_sysfs(self, root: Path) -> Path:
        """Write ``devices/…``, ``bus/pci/devices/<bdf>``, ``class/infiniband/<nic>/device`` and
        ``devices/system/node/node<N>/cpulist`` (the GPUs' CPUs, per NUMA node)."""
        numa: dict[int, set[int]] = {}
        for gpu in self.gpus:
            if gpu.numa_node is not None and gpu.numa_node >= 0:
                numa.setdefault(gpu.numa_node, set()).update(gpu.cpus)
        for n, cpus in numa.items():
            node_dir = root / "devices" / "system" / "node" / f"node{n}"
            node_dir.mkdir(parents=True, exist_ok=True)
            (node_dir / "cpulist").write_text(_cpulist(cpus) + "\n")
        for gpu in self.gpus:
            bdf = normalize_bus_id(gpu.bus_id)
            dev = _write_device(root, gpu.pci_path or ("pci0000:00", bdf), gpu.numa_node)
            _symlink(root / "bus" / "pci" / "devices" / bdf, dev)
        for nic in self.nics:
            dev = _write_device(root, nic.pci_path, nic.numa_node)
            _symlink(root / "bus" / "pci" / "devices" / nic.pci_path[-1], dev)
            _symlink(root / "class" / "infiniband" / nic.name / "device", dev)
        return root

    # -- builders ----------------------------------------------------------------------

    @classmethod
    def hgx_h100(cls) -> FakeNvml:
        """8x H100 SXM on an HGX baseboard: 18 links each into 4 NVSwitches (5+4+4+5).

        Two sockets (GPUs 0-3 on NUMA 0 with CPUs 0-51, 4-7 on NUMA 1 with CPUs 52-103, as
        in the h100 fixture); each GPU sits behind its own PCIe switch with one NIC
        (GPU-NIC PIX), GPUs of a socket meet at NODE, across sockets at SYS.
        """
        switches = [_nvml_bus(0, bus) for bus in (0x05, 0x06, 0x07, 0x08)]
        links = _switched(switches, (5, 4, 4, 5))
        gpus, nics = [], []
        for i, bus in enumerate((0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)):
            socket = i // 4
            gpu_path, nic_path = _gpu_and_nic_behind_switch(bus)
            gpus.append(
                FakeGpu(
                    uuid=_uuid(0x100, i),
                    bus_id=_nvml_bus(0, bus),
                    name="NVIDIA H100 80GB HBM3",
                    links=list(links),
                    numa_node=socket,
                    cpus=_cpus(socket, 52),
                    pci_path=gpu_path,
                )
            )
            nics.append(FakeNic(f"mlx5_{i}", nic_path, socket))
        return cls(gpus, _levels(8, lambda a, b: NODE if a // 4 == b // 4 else SYS), nics=nics)

    @classmethod
    def dgx_a100(cls) -> FakeNvml:
        """8x A100 SXM: 12 links each, two into each of 6 NVSwitches.

        GPU pairs (0,1), (2,3), (4,5), (6,7) share a two-level PCIe switch tree (PXB) with a
        dual-port NIC; NUMA 0 (CPUs 0-23) for GPUs 0-3, NUMA 1 (CPUs 24-47) for 4-7, as in
        the a100 compact fixture.
        """
        # The switches' buses must not be a GPU's: go-gpuallocator matches NVLinks by the
        # remote bus id alone, and 0x0F (GPU 1) here once gave it one-way NVLinks.
        switches = [_nvml_bus(0, bus) for bus in range(0xE0, 0xE6)]
        links = _switched(switches, (2,) * 6)
        gpu_buses = ((0x07, 0x0F), (0x47, 0x4E), (0x87, 0x90), (0xB7, 0xBD))
        gpus, nics = [], []
        for pair, (base, buses) in enumerate(zip((0x01, 0x41, 0x81, 0xB1), gpu_buses, strict=True)):
            socket = pair // 2
            top = (f"pci0000:{base:02x}", _bdf(base, 1), _bdf(base + 1, 0))
            for slot, bus in enumerate(buses):
                i = 2 * pair + slot
                path = (*top, _bdf(base + 2, slot), _bdf(bus - 2, 0), _bdf(bus - 1, 0), _bdf(bus, 0))
                gpus.append(
                    FakeGpu(
                        uuid=_uuid(0xA100, i),
                        bus_id=_nvml_bus(0, bus),
                        name="NVIDIA A100-SXM4-80GB",
                        links=list(links),
                        numa_node=socket,
                        cpus=_cpus(socket, 24),
                        pci_path=path,
                    )
                )
            nic_bus = base + 0x10
            nic_top = (*top, _bdf(base + 2, 2), _bdf(nic_bus, 0), _bdf(nic_bus + 1, 0))
            for fn in (0, 1):
                nics.append(FakeNic(f"mlx5_{2 * pair + fn}", (*nic_top, _bdf(nic_bus + 2, 0, fn)), socket))

        def level(a: int, b: int) -> int:
            if a // 2 == b // 2:
                return PXB
            return NODE if a // 4 == b // 4 else SYS

        return cls(gpus, _levels(8, level), nics=nics)

    @classmethod
    def pcie_2socket(cls) -> FakeNvml:
        """8x L40S, no NVLink, two sockets: pairs (0,1)...(6,7) share a PCIe switch (PIX),
        NODE within a socket (CPUs 0-31 / 32-63), SYS across; one NIC per socket."""
        gpus = []
        for i in range(8):
            base = 0x15 + 0x20 * (i // 2)
            bus = base + 3 + i % 2
            socket = i // 4
            path = (
                f"pci0000:{base:02x}",
                _bdf(base, 1),
                _bdf(base + 1, 0),
                _bdf(base + 2, i % 2),
                _bdf(bus, 0),
            )
            gpus.append(
                FakeGpu(
                    uuid=_uuid(0x405, i),
                    bus_id=_nvml_bus(0, bus),
                    name="NVIDIA L40S",
                    numa_node=socket,
                    cpus=_cpus(socket, 32),
                    pci_path=path,
                )
            )
        nics = [
            FakeNic(f"mlx5_{s}", (f"pci0000:{rc:02x}", _bdf(rc, 1), _bdf(rc + 1, 0)), s)
            for s, rc in enumerate((0x0A, 0x8A))
        ]

        def level(a: int, b: int) -> int:
            if a // 2 == b // 2:
                return PIX
            return NODE if a // 4 == b // 4 else SYS

        return cls(gpus, _levels(8, level), nics=nics)

    @classmethod
    def gb200_tray(
        cls,
        cluster_uuid: bytes,
        clique_id: int,
        *,
        state: int = FabricState.COMPLETED,
        status: int = NVML_SUCCESS,
    ) -> FakeNvml:
        """One GB200 NVL72 compute tray: 4 GPUs, two per Grace, 18 links each into the
        rack's NVLink switch trays. Those switches are off-tray, so their PCI address is
        reported as all zeros here (an assumption; real NVML may report nothing better)."""
        if len(cluster_uuid) != 16:
            raise ValueError(f"a cluster UUID is 16 bytes, got {len(cluster_uuid)}")
        links = _switched([_nvml_bus(0, 0)], (18,))
        fabric = FabricInfo(cluster_uuid=cluster_uuid, clique_id=clique_id, state=state, status=status)
        gpus = []
        for i, domain in enumerate((0x8, 0x9, 0x18, 0x19)):
            socket = i // 2
            path = (f"pci{domain:04x}:00", f"{domain:04x}:00:00.0", f"{domain:04x}:01:00.0")
            gpus.append(
                FakeGpu(
                    uuid=_uuid(0xB200, i),
                    bus_id=_nvml_bus(domain, 1),
                    name="NVIDIA GB200",
                    links=list(links),
                    numa_node=socket,
                    cpus=_cpus(socket, 72),
                    fabric=fabric,
                    pci_path=path,
                )
            )
        return cls(gpus, _levels(4, lambda a, b: NODE if a // 2 == b // 2 else SYS))

    @classmethod
    def from_graph(cls, graph: GpuGraph) -> FakeNvml:
        """A fake that discovers as ``graph`` (GPUs renumbered 0..n-1 in order).

        NVLinks become direct GPU-GPU links so any count round-trips; a pair without a
        PCIe level reads back as SYS; NICs and health are not reproduced.
        """
        pos = {g.index: p for p, g in enumerate(graph.gpus)}
        buses = [g.pci_bus_id or f"0000:{0x80 + p:02x}:00.0" for p, g in enumerate(graph.gpus)]
        links: list[list[FakeLink]] = [[] for _ in graph.gpus]
        ancestors = {}
        for (a, b), link in graph.links.items():
            pa, pb = sorted((pos[a], pos[b]))
            ancestors[(pa, pb)] = int(link.pcie or PcieLevel.SYS) * 10
            for here, there in ((pa, pb), (pb, pa)):
                links[here] += [FakeLink(RemoteDevice.GPU, buses[there])] * link.nvlinks
        fabric = None
        if graph.clique is not None:
            raw = UUID(graph.clique.cluster_uuid).bytes
            fabric = FabricInfo(raw, graph.clique.clique_id, FabricState.COMPLETED, NVML_SUCCESS)
        gpus = [
            FakeGpu(
                uuid=g.uuid or _uuid(0xF00, p),
                bus_id=buses[p],
                name=g.name or graph.model or "NVIDIA GPU",
                links=links[p],
                numa_node=g.numa_node,
                cpus=g.cpu_affinity,
                fabric=fabric,
            )
            for p, g in enumerate(graph.gpus)
        ]
        return cls(gpus, ancestors)


# --- builder helpers -------------------------------------------------------------------


def _nvml_bus(domain: int, bus: int, device: int = 0, function: int = 0) -> str:
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function}"


def _bdf(bus: int, device: int, function: int = 0) -> str:
    return f"0000:{bus:02x}:{device:02x}.{function}"


def _uuid(seed: int, index: int) -> str:
    return f"GPU-{UUID(int=(seed << 64) | (index + 1))}"


def _cpus(socket: int, per_socket: int) -> frozenset[int]:
    return frozenset(range(socket * per_socket, (socket + 1) * per_socket))


def _switched(switch_bus_ids: Sequence[str], per_switch: Sequence[int]) -> list[FakeLink]:
    return [
        FakeLink(RemoteDevice.SWITCH, bus)
        for bus, n in zip(switch_bus_ids, per_switch, strict=True)
        for _ in range(n)
    ]


def _levels(n: int, level: Callable[[int, int], int]) -> dict[tuple[int, int], int]:
    return {(a, b): level(a, b) for a, b in itertools.combinations(range(n), 2)}


def _gpu_and_nic_behind_switch(gpu_bus: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Root port -> PCIe switch with two downstream ports: the GPU on one, a NIC on the other."""
    rc = gpu_bus - 3
    top = (f"pci0000:{rc:02x}", _bdf(rc, 1), _bdf(rc + 1, 0))
    return (*top, _bdf(rc + 2, 0), _bdf(gpu_bus, 0)), (*top, _bdf(rc + 2, 1), _bdf(gpu_bus + 1, 0))


def _write_device(root: Path, pci_path: tuple[str, ...], numa_node: int | None) -> Path:
    dev = root.joinpath("devices", *pci_path)
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "numa_node").write_text(f"{-1 if numa_node is None else numa_node}\n")
    return dev


def _symlink(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _cpulist(cpus: set[int]) -> str:
    """The kernel's cpulist form: ``0-51,104-155``."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)
