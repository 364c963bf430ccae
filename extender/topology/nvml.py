"""GPU topology discovery through NVML, behind a small index-addressed interface.

:func:`discover` turns what an :class:`NvmlBackend` reports into a :class:`GpuGraph`.
:class:`PynvmlBackend` is the real backend (nvidia-ml-py); ``extender.topology.fake_nvml``
holds a fake built from plain data. Backends speak only ints, strings and bytes, so NVML
handles never leave :class:`PynvmlBackend`.

Errors: a backend raises :class:`NvmlNotSupported` / :class:`NvmlInvalidArgument` /
:class:`NvmlError` for a failed call and :class:`NvmlUnavailable` when NVML itself cannot be
used. Discovery tolerates "not supported" wherever the datum is optional and turns any
other call failure into a :class:`TopologyError` naming the call and the GPU.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar
from uuid import UUID

from extender.topology.bandwidth import NVLINK4_PER_LINK_GBPS, NVLINK5_PER_LINK_GBPS
from extender.topology.model import (
    FabricClique,
    Gpu,
    GpuGraph,
    GpuHealth,
    Link,
    Nic,
    PcieLevel,
    TopologyError,
)

log = logging.getLogger(__name__)

#: Where sysfs lives on a real node; pass it as ``discover(..., sysfs_root=SYSFS)``.
SYSFS = Path("/sys")

NVML_SUCCESS = 0


class RemoteDevice(enum.IntEnum):
    """``nvmlDeviceGetNvLinkRemoteDeviceType``: what the far end of one NVLink is."""

    GPU = 0
    IBMNPU = 1
    SWITCH = 2
    UNKNOWN = 0xFF


class FabricState(enum.IntEnum):
    """``nvmlGpuFabricState_t``."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class NvlinkErrorCounter(enum.IntEnum):
    """The ``nvmlNvLinkErrorCounter_t`` values we sample (ECC lanes are left out)."""

    DL_REPLAY = 0
    DL_RECOVERY = 1
    DL_CRC_FLIT = 2
    DL_CRC_DATA = 3


class NvmlError(RuntimeError):
    """One NVML call failed."""


class NvmlNotSupported(NvmlError):
    """NVML_ERROR_NOT_SUPPORTED (also: function absent from this driver or binding)."""


class NvmlInvalidArgument(NvmlError):
    """NVML_ERROR_INVALID_ARGUMENT; for NVLink calls it means "no such link"."""


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used at all: no library, no driver, or a driver/library mismatch."""


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """``nvmlGpuFabricInfo_v2_t`` in plain types; ``cluster_uuid`` is the 16 raw bytes."""

    cluster_uuid: bytes
    clique_id: int
    state: int
    status: int
    health_mask: int = 0


class NvmlBackend(Protocol):
    """The NVML calls discovery needs, addressed by NVML device index."""

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str: ...

    def pci_bus_id(self, index: int) -> str:
        """NVML form, e.g. ``00000000:18:00.0``."""
        ...

    def name(self, index: int) -> str: ...

    def topology_common_ancestor(self, a: int, b: int) -> int:
        """An ``nvmlGpuTopologyLevel_t`` value (0, 10, ..., 50)."""
        ...

    def nvlink_state(self, index: int, link: int) -> bool:
        """Raises NvmlInvalidArgument/NvmlNotSupported past the last link."""
        ...

    def nvlink_remote_device_type(self, index: int, link: int) -> int: ...

    def nvlink_remote_pci_bus_id(self, index: int, link: int) -> str: ...

    def cpu_affinity(self, index: int) -> list[int]:
        """64-bit words; bit i of word w is CPU 64*w + i."""
        ...

    def memory_affinity(self, index: int) -> list[int]:
        """64-bit words of host NUMA nodes (node scope)."""
        ...

    def fabric_info(self, index: int) -> FabricInfo: ...

    def nvlink_error_counter(self, index: int, link: int, counter: int) -> int: ...

    def pcie_replay_counter(self, index: int) -> int: ...


# --- bus ids ---------------------------------------------------------------------------

_BUS_ID = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")


def normalize_bus_id(text: str) -> str:
    """NVML's ``00000000:18:00.0`` (or legacy/short forms) to sysfs's ``0000:18:00.0``."""
    m = _BUS_ID.match(text.strip().strip("\x00").lower())
    if m is None:
        raise TopologyError(f"unrecognised PCI bus id {text!r} (expected DDDDDDDD:BB:DD.F)")
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def _remote_bus_id(text: str) -> str:
    """A link's far end, or "" when NVML gives nothing usable (an all-zero id included)."""
    try:
        bdf = normalize_bus_id(text)
    except TopologyError:
        return ""
    return "" if bdf == "0000:00:00.0" else bdf


# --- calling a backend -----------------------------------------------------------------

_T = TypeVar("_T")
_D = TypeVar("_D")


def _failed(what: str, exc: BaseException) -> TopologyError:
    return TopologyError(f"NVML {what} failed: {str(exc) or type(exc).__name__}")


def _must(what: str, call: Callable[[], _T]) -> _T:
    try:
        return call()
    except NvmlError as exc:
        raise _failed(what, exc) from exc


def _may(what: str, call: Callable[[], _T], default: _D) -> _T | _D:
    try:
        return call()
    except NvmlNotSupported:
        return default
    except NvmlError as exc:
        raise _failed(what, exc) from exc


#: Far more links than any GPU has (18 on Hopper/Blackwell; newer headers allow 36), so
#: reaching it means the backend never reports the end of its links.
_LINK_LIMIT = 1024


def _enabled_links(backend: NvmlBackend, index: int) -> Iterator[int]:
    for link in range(_LINK_LIMIT):
        try:
            up = backend.nvlink_state(index, link)
        except (NvmlNotSupported, NvmlInvalidArgument):
            return
        except NvmlError as exc:
            raise _failed(f"nvlink_state(GPU{index}, link {link})", exc) from exc
        if up:
            yield link
    raise TopologyError(f"NVML nvlink_state(GPU{index}) never reported the last of {_LINK_LIMIT}+ links")


# --- NVLink ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _NvlinkScan:
    gpu_peers: Counter[str]  # remote GPU bus id -> links to it
    switch_links: int
    switches: frozenset[str]  # bus ids of the switches reached, where NVML knows them


def _scan_nvlinks(backend: NvmlBackend, index: int) -> _NvlinkScan:
    peers: Counter[str] = Counter()
    switches: set[str] = set()
    switch_links = 0
    for link in _enabled_links(backend, index):
        at = f"GPU{index}, link {link}"
        kind = _may(
            f"nvlink_remote_device_type({at})",
            partial(backend.nvlink_remote_device_type, index, link),
            RemoteDevice.UNKNOWN,
        )
        remote = _remote_bus_id(
            _may(
                f"nvlink_remote_pci_bus_id({at})", partial(backend.nvlink_remote_pci_bus_id, index, link), ""
            )
        )
        if kind == RemoteDevice.SWITCH:
            switch_links += 1
            if remote:
                switches.add(remote)
        elif kind in (RemoteDevice.GPU, RemoteDevice.UNKNOWN) and remote:
            peers[remote] += 1
    return _NvlinkScan(peers, switch_links, frozenset(switches))


def _same_fabric(a: frozenset[str], b: frozenset[str]) -> bool:
    # Off-board switches (NVL72 switch trays) may have no PCI address the host sees; a GPU
    # whose switch ids are unknown is taken to share the fabric of every switched GPU.
    return not a or not b or bool(a & b)


def _nvlinks(a: _NvlinkScan, b: _NvlinkScan, bus_a: str, bus_b: str) -> int:
    """Bonded links between two GPUs, counted the way ``nvidia-smi topo -m`` prints NV#.

    Direct GPU-GPU links match by remote bus id. A link into an NVSwitch reaches every GPU
    on that switch fabric, so two switched GPUs get ``min(links_a, links_b)``; matching
    switched links by bus id (go-gpuallocator) would find no NVLink at all on HGX boards.
    """
    direct = max(a.gpu_peers[bus_b], b.gpu_peers[bus_a])
    switched = 0
    if a.switch_links and b.switch_links and _same_fabric(a.switches, b.switches):
        switched = min(a.switch_links, b.switch_links)
    return direct + switched


# --- GPUs, NUMA, affinity --------------------------------------------------------------


def _bits(words: Sequence[int]) -> frozenset[int]:
    return frozenset(64 * w + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _numa_node(backend: NvmlBackend, index: int, bdf: str, sysfs_root: Path | None) -> int | None:
    """The host NUMA node of a GPU: sysfs first (-1 means none), else NVML memory affinity.

    ``nvmlDeviceGetNumaNodeId`` is deliberately not used: it names the GPU's own memory
    node on Grace systems and is unsupported on x86 PCIe GPUs.
    """
    if sysfs_root is not None:
        node = _read_int(sysfs_root / "bus" / "pci" / "devices" / bdf / "numa_node")
        if node is not None:
            return node if node >= 0 else None
    words = _may(f"memory_affinity(GPU{index})", partial(backend.memory_affinity, index), [])
    nodes = _bits(words)
    return min(nodes) if nodes else None


def _gpu(backend: NvmlBackend, index: int, sysfs_root: Path | None) -> Gpu:
    at = f"GPU{index}"
    raw_bus = _must(f"pci_bus_id({at})", partial(backend.pci_bus_id, index))
    try:
        bdf = normalize_bus_id(raw_bus)
    except TopologyError as exc:
        raise TopologyError(f"{at}: {exc}") from exc
    return Gpu(
        index=index,
        uuid=_must(f"uuid({at})", partial(backend.uuid, index)),
        pci_bus_id=bdf,
        numa_node=_numa_node(backend, index, bdf, sysfs_root),
        cpu_affinity=_bits(_may(f"cpu_affinity({at})", partial(backend.cpu_affinity, index), [])),
        name=_may(f"name({at})", partial(backend.name, index), None),
    )


def _link(backend: NvmlBackend, a: Gpu, b: Gpu, scans: Sequence[_NvlinkScan]) -> Link:
    level = _may(
        f"topology_common_ancestor(GPU{a.index}, GPU{b.index})",
        partial(backend.topology_common_ancestor, a.index, b.index),
        None,
    )
    nvlinks = _nvlinks(scans[a.index], scans[b.index], a.pci_bus_id or "", b.pci_bus_id or "")
    return Link(nvlinks=nvlinks, pcie=None if level is None else PcieLevel.from_nvml(level))


# --- fabric clique ---------------------------------------------------------------------


def _fabric_attached(info: FabricInfo | None) -> bool:
    return (
        info is not None
        and info.state == FabricState.COMPLETED
        and info.status == NVML_SUCCESS
        and any(info.cluster_uuid)
    )


def fabric_clique(infos: Sequence[FabricInfo | None]) -> FabricClique | None:
    """The node's multi-node NVLink clique, or None.

    Stricter than GPU Feature Discovery (which ignores unattached GPUs): every GPU must
    have finished its fabric probe successfully with a non-zero cluster UUID, and all must
    agree on UUID and clique id, so a clique is never claimed for a half-joined tray.
    """
    if not infos or not all(_fabric_attached(i) for i in infos):
        return None
    keys = {(i.cluster_uuid, i.clique_id) for i in infos if i is not None}
    if len(keys) != 1:
        log.warning("GPUs disagree on NVLink fabric membership %s; no clique", sorted(keys))
        return None
    raw, clique_id = keys.pop()
    return FabricClique(cluster_uuid=str(UUID(bytes=raw)), clique_id=clique_id)


def _fabric(backend: NvmlBackend, index: int) -> FabricInfo | None:
    info = _may(f"fabric_info(GPU{index})", partial(backend.fabric_info, index), None)
    if info is not None and len(info.cluster_uuid) != 16:
        raise TopologyError(
            f"NVML fabric_info(GPU{index}) gave a {len(info.cluster_uuid)}-byte cluster UUID, expected 16"
        )
    return info


# --- NICs from sysfs -------------------------------------------------------------------

_ROOT_COMPLEX = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_SYSFS_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _pci_path(device: Path) -> tuple[str, ...] | None:
    """``(root complex, bridge, ..., device)`` of a sysfs PCI device link, or None."""
    try:
        parts = device.resolve(strict=True).parts
    except OSError:
        return None
    for i, part in enumerate(parts):
        if _ROOT_COMPLEX.match(part):
            return (part, *(p for p in parts[i + 1 :] if _SYSFS_BDF.match(p)))
    return None


def pcie_level(a: tuple[str, ...], b: tuple[str, ...], numa_a: int | None, numa_b: int | None) -> PcieLevel:
    """How ``nvidia-smi topo -m`` relates two PCI paths (approximately; see below).

    Different root complexes: NODE within one NUMA node, else SYS. Same root complex but
    different root ports: PHB. Below a shared bridge: PIX when each side is at most one
    switch (downstream port + device) away, else PXB.
    """
    if a[0] != b[0]:
        return PcieLevel.NODE if numa_a == numa_b else PcieLevel.SYS
    shared = 0
    for x, y in zip(a[1:], b[1:], strict=False):
        if x != y:
            break
        shared += 1
    if shared == 0:
        return PcieLevel.PHB
    below = max(len(a), len(b)) - 1 - shared
    return PcieLevel.PIX if below <= 2 else PcieLevel.PXB


def _natural(name: str) -> list[int | str]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _nics(sysfs_root: Path, gpus: Sequence[Gpu]) -> tuple[Nic, ...]:
    try:
        entries = sorted((sysfs_root / "class" / "infiniband").iterdir(), key=lambda p: _natural(p.name))
    except OSError:
        return ()
    devices = sysfs_root / "bus" / "pci" / "devices"
    gpu_paths = {g.index: (p, g.numa_node) for g in gpus if (p := _pci_path(devices / (g.pci_bus_id or "")))}
    nics = []
    for entry in entries:
        path = _pci_path(entry / "device")
        if path is None:
            continue  # a software device (rxe, siw) has no PCI path
        node = _read_int(entry / "device" / "numa_node")
        numa = node if node is not None and node >= 0 else None
        links = {i: pcie_level(gp, path, gn, numa) for i, (gp, gn) in gpu_paths.items()}
        nics.append(Nic(name=entry.name, numa_node=numa, gpu_links=links))
    return tuple(nics)


# --- discovery -------------------------------------------------------------------------

_NVLINK5_MODELS = ("B200", "B300")  # also matches GB200 / GB300


def _nvlink_gbps(model: str | None) -> float:
    if model and any(tag in model.upper() for tag in _NVLINK5_MODELS):
        return NVLINK5_PER_LINK_GBPS
    return NVLINK4_PER_LINK_GBPS


def discover(backend: NvmlBackend, *, sysfs_root: Path | None = None) -> GpuGraph:
    """Build this node's GPU graph from NVML (and sysfs, when ``sysfs_root`` is given).

    Without ``sysfs_root`` NUMA nodes come from NVML memory affinity and no NICs are found.
    Health is not sampled here; see :func:`health_counters` and :func:`health_from_rates`.
    """
    count = _must("device_count()", backend.device_count)
    gpus = tuple(_gpu(backend, i, sysfs_root) for i in range(count))
    scans = [_scan_nvlinks(backend, i) for i in range(count)]
    links = {(a.index, b.index): _link(backend, a, b, scans) for a, b in itertools.combinations(gpus, 2)}
    clique = fabric_clique([_fabric(backend, i) for i in range(count)])
    names = {g.name for g in gpus}
    model = names.pop() if len(names) == 1 else None
    return GpuGraph(
        gpus=gpus,
        links=links,
        nics=_nics(sysfs_root, gpus) if sysfs_root is not None else (),
        clique=clique,
        nvlink_gbps=_nvlink_gbps(model),
        model=model,
    )


# --- health ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthCounters:
    """Cumulative error counters of one GPU, NVLink ones summed over its active links.

    ``error`` is set instead when the counters could not be read (e.g. the GPU is lost).
    """

    nvlink_crc_flit_errors: int = 0
    nvlink_crc_data_errors: int = 0
    nvlink_replay_errors: int = 0
    nvlink_recovery_errors: int = 0
    pcie_replays: int = 0
    error: str | None = None
    #: The links that counted any error: (link, CRC flit, CRC data, replay, recovery).
    links: tuple[tuple[int, int, int, int, int], ...] = ()

    @property
    def nvlink_crc_errors(self) -> int:
        """Flow-control and data CRC errors together: one link fault, two counters."""
        return self.nvlink_crc_flit_errors + self.nvlink_crc_data_errors


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Per-second rates above which a GPU is unhealthy.

    Link-level CRC errors and replays are retried in hardware, so an occasional one costs
    nothing; a sustained rate above one per second means a link that is retrying all the
    time (lost bandwidth, and usually a failing cable, connector or switch port). Each
    NVLink counter (CRC, replay, recovery) is held to ``nvlink_errors_per_s`` on its own.
    PCIe replays are more common under heavy DMA, so ten per second are tolerated.
    """

    nvlink_errors_per_s: float = 1.0
    pcie_replays_per_s: float = 10.0


_LINK_ORDER = (
    NvlinkErrorCounter.DL_CRC_FLIT,
    NvlinkErrorCounter.DL_CRC_DATA,
    NvlinkErrorCounter.DL_REPLAY,
    NvlinkErrorCounter.DL_RECOVERY,
)


def _sample(backend: NvmlBackend, index: int) -> HealthCounters:
    totals: Counter[int] = Counter()
    links: list[tuple[int, int, int, int, int]] = []
    try:
        for link in _enabled_links(backend, index):
            counts = {
                counter: _may(
                    f"nvlink_error_counter(GPU{index}, link {link}, {counter.name})",
                    partial(backend.nvlink_error_counter, index, link, int(counter)),
                    0,
                )
                for counter in NvlinkErrorCounter
            }
            totals.update(counts)
            if any(counts.values()):
                flit, data, replay, recovery = (counts[c] for c in _LINK_ORDER)
                links.append((link, flit, data, replay, recovery))
        replays = _may(f"pcie_replay_counter(GPU{index})", partial(backend.pcie_replay_counter, index), 0)
    except TopologyError as exc:
        return HealthCounters(error=str(exc))
    return HealthCounters(
        nvlink_crc_flit_errors=totals[NvlinkErrorCounter.DL_CRC_FLIT],
        nvlink_crc_data_errors=totals[NvlinkErrorCounter.DL_CRC_DATA],
        nvlink_replay_errors=totals[NvlinkErrorCounter.DL_REPLAY],
        nvlink_recovery_errors=totals[NvlinkErrorCounter.DL_RECOVERY],
        pcie_replays=replays,
        links=tuple(links),
    )


def health_counters(backend: NvmlBackend) -> dict[int, HealthCounters]:
    """One sample of every GPU's cumulative error counters."""
    count = _must("device_count()", backend.device_count)
    return {i: _sample(backend, i) for i in range(count)}


def _rate(before: int, after: int, seconds: float) -> float:
    delta = after - before
    if delta < 0:  # the counter was reset (driver reload, GPU reset): count from zero
        delta = after
    return delta / seconds


_NVLINK_COUNTERS = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors")


def _health(
    prev: HealthCounters | None, curr: HealthCounters, seconds: float, limits: HealthThresholds
) -> GpuHealth:
    if curr.error is not None:
        return GpuHealth(healthy=False, reason=curr.error)
    if prev is None or prev.error is not None:
        return GpuHealth()  # no baseline yet
    rates = {name: _rate(getattr(prev, name), getattr(curr, name), seconds) for name in _NVLINK_COUNTERS}
    pcie = _rate(prev.pcie_replays, curr.pcie_replays, seconds)
    over = [(n, r, limits.nvlink_errors_per_s) for n, r in rates.items() if r > limits.nvlink_errors_per_s]
    if pcie > limits.pcie_replays_per_s:
        over.append(("pcie_replays", pcie, limits.pcie_replays_per_s))
    reason = "; ".join(f"{n} at {r:.1f}/s (threshold {lim:g}/s)" for n, r, lim in over) or None
    worst = _worst_link(prev, curr)
    if reason is not None and worst is not None and any(n in _NVLINK_COUNTERS for n, _, _ in over):
        reason += f"; most on NVLink {worst}"
    return GpuHealth(
        nvlink_errors_per_s=sum(rates.values()),
        pcie_replays_per_s=pcie,
        healthy=not over,
        reason=reason,
    )


def _worst_link(prev: HealthCounters, curr: HealthCounters) -> int | None:
    """The NVLink whose error counters grew most between two samples (None: none grew)."""
    before = {link: sum(counts) for link, *counts in prev.links}
    grown = {link: sum(counts) - before.get(link, 0) for link, *counts in curr.links}
    best = max(grown, key=lambda link: (grown[link], -link), default=None)
    return best if best is not None and grown[best] > 0 else None


def health_from_rates(
    prev: Mapping[int, HealthCounters],
    curr: Mapping[int, HealthCounters],
    seconds: float,
    thresholds: HealthThresholds | None = None,
) -> dict[int, GpuHealth]:
    """Per-GPU health from two counter samples taken ``seconds`` apart.

    GPUs in ``curr`` only are healthy (no baseline yet) unless their sample failed.
    """
    if seconds <= 0:
        raise ValueError(f"samples must be taken apart in time, got {seconds} s")
    limits = thresholds or HealthThresholds()
    return {i: _health(prev.get(i), c, seconds, limits) for i, c in curr.items()}


# --- the real backend ------------------------------------------------------------------

#: Words of the affinity masks we ask for: 2048 CPUs, 256 NUMA nodes.
_CPU_WORDS = 32
_NODE_WORDS = 4

_UNAVAILABLE = (
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
)
_NOT_SUPPORTED = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",  # the driver predates the call
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",  # the driver predates the versioned struct
)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.split(b"\x00", 1)[0].decode("ascii", "replace")
    return str(value)


class PynvmlBackend:
    """:class:`NvmlBackend` over nvidia-ml-py (``import pynvml``).

    NVML is loaded and initialised when the backend is constructed (not at import), so a
    node without a driver gets one :class:`NvmlUnavailable` saying so. Use as a context
    manager, or call :meth:`close`, to shut NVML down again.
    """

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("nvidia-ml-py (module pynvml) is not installed") from exc
        self._nv: Any = pynvml
        self._handles: dict[int, Any] = {}
        self._unavailable = {getattr(pynvml, n) for n in _UNAVAILABLE if hasattr(pynvml, n)}
        self._unsupported = {getattr(pynvml, n) for n in _NOT_SUPPORTED if hasattr(pynvml, n)}
        self._call("nvmlInit")
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            self._handles.clear()
            self._call("nvmlShutdown")

    def __enter__(self) -> PynvmlBackend:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _translate(self, what: str, exc: Exception) -> Exception:
        code = getattr(exc, "value", None)
        text = f"NVML {what}: {exc}"
        if code in self._unavailable:
            return NvmlUnavailable(
                f"{text}; is the NVIDIA driver installed and the container run with the NVIDIA runtime?"
            )
        if code in self._unsupported:
            return NvmlNotSupported(text)
        if code == getattr(self._nv, "NVML_ERROR_INVALID_ARGUMENT", 2):
            return NvmlInvalidArgument(text)
        return NvmlError(text)

    def _call(self, function: str, *args: Any) -> Any:
        fn = getattr(self._nv, function, None)
        if fn is None:
            raise NvmlNotSupported(f"this nvidia-ml-py has no {function}")
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise self._translate(function, exc) from exc

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return self._handles[index]

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def uuid(self, index: int) -> str:
        return _text(self._call("nvmlDeviceGetUUID", self._handle(index)))

    def pci_bus_id(self, index: int) -> str:
        return _text(self._call("nvmlDeviceGetPciInfo", self._handle(index)).busId)

    def name(self, index: int) -> str:
        return _text(self._call("nvmlDeviceGetName", self._handle(index)))

    def topology_common_ancestor(self, a: int, b: int) -> int:
        return int(self._call("nvmlDeviceGetTopologyCommonAncestor", self._handle(a), self._handle(b)))

    def nvlink_state(self, index: int, link: int) -> bool:
        state = int(self._call("nvmlDeviceGetNvLinkState", self._handle(index), link))
        return state == int(getattr(self._nv, "NVML_FEATURE_ENABLED", 1))

    def nvlink_remote_device_type(self, index: int, link: int) -> int:
        return int(self._call("nvmlDeviceGetNvLinkRemoteDeviceType", self._handle(index), link))

    def nvlink_remote_pci_bus_id(self, index: int, link: int) -> str:
        return _text(self._call("nvmlDeviceGetNvLinkRemotePciInfo", self._handle(index), link).busId)

    def cpu_affinity(self, index: int) -> list[int]:
        return [int(w) for w in self._call("nvmlDeviceGetCpuAffinity", self._handle(index), _CPU_WORDS)]

    def memory_affinity(self, index: int) -> list[int]:
        scope = getattr(self._nv, "NVML_AFFINITY_SCOPE_NODE", 0)
        words = self._call("nvmlDeviceGetMemoryAffinity", self._handle(index), _NODE_WORDS, scope)
        return [int(w) for w in words]

    def fabric_info(self, index: int) -> FabricInfo:
        struct = getattr(self._nv, "c_nvmlGpuFabricInfoV_t", None)
        if struct is None:
            raise NvmlNotSupported("this nvidia-ml-py has no c_nvmlGpuFabricInfoV_t")
        info = struct()  # its constructor sets the struct version
        self._call("nvmlDeviceGetGpuFabricInfoV", self._handle(index), ctypes.byref(info))
        # Some wheels declare clusterUuid as c_char*16, which stops at the first NUL of a
        # binary UUID; read the 16 bytes straight from the struct's memory instead.
        raw = ctypes.string_at(ctypes.addressof(info) + struct.clusterUuid.offset, 16)
        return FabricInfo(
            cluster_uuid=raw,
            clique_id=int(info.cliqueId),
            state=int(info.state) & 0xFF,  # C declares unsigned char, pynvml c_uint
            status=int(info.status),
            health_mask=int(getattr(info, "healthMask", 0)),
        )

    def nvlink_error_counter(self, index: int, link: int, counter: int) -> int:
        return int(self._call("nvmlDeviceGetNvLinkErrorCounter", self._handle(index), link, counter))

    def pcie_replay_counter(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPcieReplayCounter", self._handle(index)))
