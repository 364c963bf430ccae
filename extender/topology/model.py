"""The GPU graph of one node: GPUs, the link between every pair, NICs, clique, health.

Plain data, no I/O. Parsers (``nvidia-smi topo -m``), NVML discovery and presets all
produce a :class:`GpuGraph`; the placement engine reads the derived :class:`NodeShape`.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from extender.topology.bandwidth import HOST_BRIDGE_FACTOR, SYS_GBPS


class PcieLevel(enum.IntEnum):
    """Closest common PCIe ancestor of two devices, as ``nvidia-smi topo -m`` prints it.

    The numeric values follow NVML's ``nvmlGpuTopologyLevel_t`` divided by ten, so
    ``PcieLevel(nvml_value // 10)`` converts (NVML's INTERNAL, two GPUs on one board,
    counts as PIX).
    """

    PIX = 1  # at most one PCIe switch/bridge
    PXB = 2  # several switches, no host bridge
    PHB = 3  # through one host bridge (the CPU root complex)
    NODE = 4  # between host bridges within one NUMA node
    SYS = 5  # across the inter-socket SMP link (UPI / xGMI); legacy drivers print SOC

    @classmethod
    def parse(cls, text: str) -> PcieLevel:
        token = text.strip().upper()
        if token == "SOC":
            return cls.SYS
        return cls[token]

    @classmethod
    def from_nvml(cls, value: int) -> PcieLevel:
        return cls(max(1, min(5, value // 10)))


class Tier(enum.IntEnum):
    """How tightly a set of GPUs inside one node is connected; lower is tighter.

    A set's tier is the worst pairwise tier among its members. These are the in-node
    domains the placement rules speak of: one NVLink island, one PCIe switch, one switch
    tree, one host bridge, one NUMA node, the whole node.
    """

    NVLINK = 0
    PIX = 1
    PXB = 2
    PHB = 3
    NUMA = 4
    NODE = 5

    @property
    def words(self) -> str:
        return _TIER_WORDS[self]


_TIER_WORDS = {
    Tier.NVLINK: "NVLink-connected",
    Tier.PIX: "PCIe-switch-local",
    Tier.PXB: "PCIe-tree-local",
    Tier.PHB: "host-bridge-local",
    Tier.NUMA: "NUMA-local",
    Tier.NODE: "",
}

#: Names users write for in-node levels (``requiredLevel: nvlink``), and what they mean.
IN_NODE_LEVELS: dict[str, Tier] = {
    "nvlink": Tier.NVLINK,
    "pcie": Tier.PXB,
    "pcie-switch": Tier.PIX,
    "numa": Tier.NUMA,
    "node": Tier.NODE,
}


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between two devices: bonded NVLinks and/or a PCIe path."""

    nvlinks: int = 0
    pcie: PcieLevel | None = None

    @property
    def cell(self) -> str:
        """The ``nvidia-smi topo -m`` cell text for this link."""
        if self.nvlinks:
            return f"NV{self.nvlinks}"
        return self.pcie.name if self.pcie is not None else "SYS"

    @classmethod
    def parse(cls, text: str) -> Link:
        token = text.strip().upper()
        if token.startswith("NV") and token[2:].isdigit():
            return cls(nvlinks=int(token[2:]))
        return cls(pcie=PcieLevel.parse(token))


def link_gbps(link: Link, nvlink_gbps: float, pcie_gbps: float, tier: Tier) -> float:
    """Bandwidth of the direct path between two GPUs of one node."""
    if link.nvlinks:
        return link.nvlinks * nvlink_gbps
    if tier <= Tier.PXB:
        return pcie_gbps
    if tier <= Tier.NUMA and link.pcie != PcieLevel.SYS:
        return pcie_gbps * HOST_BRIDGE_FACTOR
    if tier <= Tier.NUMA:  # reported SYS but both GPUs on one NUMA node (flattened VM boards)
        return min(pcie_gbps * HOST_BRIDGE_FACTOR, SYS_GBPS)
    return SYS_GBPS


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: frozenset[int] = frozenset()
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Nic:
    """A network interface and its PCIe relation to each GPU (by GPU index)."""

    name: str
    numa_node: int | None = None
    gpu_links: Mapping[int, PcieLevel] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FabricClique:
    """Multi-node NVLink membership (GB200/GB300 NVL72): one clique shares one NVLink fabric."""

    cluster_uuid: str
    clique_id: int

    @property
    def label(self) -> str:
        """The ``nvidia.com/gpu.clique`` label value GPU Feature Discovery writes."""
        return f"{self.cluster_uuid}.{self.clique_id}"


#: The error rates at which a GPU's links are priced at half their bandwidth: the node agent's
#: default thresholds (``--nvlink-errors-per-s``, ``--pcie-replays-per-s``), above which it marks
#: the GPU unhealthy and nothing is placed on it at all.
NVLINK_ERRORS_AT_HALF = 1.0
PCIE_REPLAYS_AT_HALF = 10.0


@dataclass(frozen=True, slots=True)
class GpuHealth:
    nvlink_errors_per_s: float = 0.0
    pcie_replays_per_s: float = 0.0
    healthy: bool = True
    reason: str | None = None

    @property
    def nvlink_share(self) -> float:
        """The share of its NVLink bandwidth the placement counts on while its links retry:
        a link that keeps replaying loses bandwidth and is on its way to failing, so a gang
        takes such a GPU only where a clean one would not do better."""
        return 1.0 / (1.0 + self.nvlink_errors_per_s / NVLINK_ERRORS_AT_HALF)

    @property
    def pcie_share(self) -> float:
        """As :attr:`nvlink_share`, for PCIe replays."""
        return 1.0 / (1.0 + self.pcie_replays_per_s / PCIE_REPLAYS_AT_HALF)


class TopologyError(ValueError):
    """A topology that cannot be understood; the message names where and why."""


@dataclass(frozen=True)
class GpuGraph:
    """One node's GPUs and the link between every pair.

    ``links`` holds one entry per unordered pair, keyed ``(low, high)`` by GPU index.
    ``nvlink_gbps`` is the bidirectional bandwidth of one NVLink of this GPU generation
    (50 GB/s for NVLink 3/4, 100 GB/s for NVLink 5); ``pcie_gbps`` the bidirectional
    bandwidth of the GPUs' PCIe x16 slot.
    """

    gpus: tuple[Gpu, ...]
    links: Mapping[tuple[int, int], Link]
    nics: tuple[Nic, ...] = ()
    clique: FabricClique | None = None
    health: Mapping[int, GpuHealth] = field(default_factory=dict)
    nvlink_gbps: float = 50.0
    pcie_gbps: float = 64.0
    model: str | None = None

    def __post_init__(self) -> None:
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise TopologyError(f"duplicate GPU index in {indices}")
        known = set(indices)
        for a, b in itertools.combinations(sorted(known), 2):
            if (a, b) not in self.links:
                raise TopologyError(f"no link given between GPU{a} and GPU{b}")
        for a, b in self.links:
            if a not in known or b not in known or a >= b:
                raise TopologyError(f"link key ({a}, {b}) is not an ordered pair of known GPUs")

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def link(self, a: int, b: int) -> Link:
        return self.links[(a, b) if a < b else (b, a)]

    def pair_tier(self, a: int, b: int) -> Tier:
        """The in-node tier of one pair. Same-NUMA pairs reported SYS (flattened VMs) count as NUMA."""
        link = self.link(a, b)
        if link.nvlinks:
            return Tier.NVLINK
        level = link.pcie or PcieLevel.SYS
        tier = Tier(int(level))
        na, nb = self.gpu(a).numa_node, self.gpu(b).numa_node
        if tier > Tier.NUMA and na is not None and na == nb:
            return Tier.NUMA
        return tier

    def pair_gbps(self, a: int, b: int) -> float:
        """Bidirectional bandwidth of the direct path between two GPUs, less what a link that
        keeps retrying loses (:attr:`GpuHealth.nvlink_share`: the worse end counts)."""
        link = self.link(a, b)
        gbps = link_gbps(link, self.nvlink_gbps, self.pcie_gbps, self.pair_tier(a, b))
        ha, hb = self.health.get(a), self.health.get(b)
        if ha is None and hb is None:
            return gbps
        healths = [h for h in (ha, hb) if h is not None]
        share = min(h.nvlink_share if link.nvlinks else h.pcie_share for h in healths)
        return gbps * share

    def uuids(self, indices: Iterable[int]) -> tuple[str, ...] | None:
        """The UUIDs of these GPUs, in the order given; None when the graph lacks one of them
        (``nvidia-smi topo -m`` prints none; NVML discovery always has them)."""
        out = []
        for index in indices:
            uuid = self.gpu(index).uuid
            if not uuid:
                return None
            out.append(uuid)
        return tuple(out)

    def near_nics(self, indices: Iterable[int]) -> tuple[str, ...]:
        """The NICs these GPUs should talk through, in the order of the GPUs, each once: every
        GPU's nearest NIC (the closest PCIe level: its own switch or root before its NUMA node)
        when that NIC is on the GPU's NUMA node; a GPU whose nearest NIC is across the socket
        link adds none."""
        nics = {n.name: n for n in self.nics}
        out: list[str] = []
        for index in indices:
            name = self.shape.best_nic.get(index)
            if name is None or name in out:
                continue
            nic, gpu = nics[name], self.gpu(index)
            if nic.gpu_links.get(index, PcieLevel.SYS) >= PcieLevel.SYS:
                continue
            if nic.numa_node is not None and gpu.numa_node is not None and nic.numa_node != gpu.numa_node:
                continue
            out.append(name)
        return tuple(out)

    def healthy(self, index: int) -> bool:
        h = self.health.get(index)
        return h is None or h.healthy

    @cached_property
    def shape(self) -> NodeShape:
        return NodeShape.of(self)


def _maximal_cliques(vertices: Iterable[int], adjacent: Mapping[int, frozenset[int]]) -> list[frozenset[int]]:
    """Bron-Kerbosch with pivoting; the graphs are tiny (one node's GPUs)."""
    out: list[frozenset[int]] = []

    def expand(r: frozenset[int], p: set[int], x: set[int]) -> None:
        if not p and not x:
            out.append(r)
            return
        pivot = max(p | x, key=lambda v: len(adjacent[v] & p))
        for v in list(p - adjacent[pivot]):
            expand(r | {v}, p & adjacent[v], x & adjacent[v])
            p.discard(v)
            x.add(v)

    expand(frozenset(), set(vertices), set())
    return sorted(out, key=lambda c: (-len(c), sorted(c)))


@dataclass(frozen=True)
class NodeShape:
    """Structure derived once per GPU graph: what the placement engine needs to know.

    GPUs are addressed by *position* (0..n-1 in ``indices`` order) so a set of GPUs is an
    int bitmask; ``tier_of(mask)`` and ``gbps_of(mask)`` are the tier and ring bottleneck
    bandwidth of that set.
    """

    indices: tuple[int, ...]
    pair_tiers: tuple[tuple[int, ...], ...]
    pair_gbps: tuple[tuple[float, ...], ...]
    numa: tuple[int | None, ...]
    nvlink_islands: tuple[frozenset[int], ...]
    pcie_switch_groups: tuple[frozenset[int], ...]
    pcie_tree_groups: tuple[frozenset[int], ...]
    numa_groups: Mapping[int, frozenset[int]]
    best_nic: Mapping[int, str | None]
    key: str

    @classmethod
    def of(cls, graph: GpuGraph) -> NodeShape:
        idx = graph.indices
        n = len(idx)
        tiers = tuple(
            tuple(0 if i == j else int(graph.pair_tier(idx[i], idx[j])) for j in range(n)) for i in range(n)
        )
        gbps = tuple(
            tuple(float("inf") if i == j else graph.pair_gbps(idx[i], idx[j]) for j in range(n))
            for i in range(n)
        )

        def groups(max_tier: Tier) -> tuple[frozenset[int], ...]:
            adjacent = {
                idx[i]: frozenset(idx[j] for j in range(n) if j != i and tiers[i][j] <= max_tier)
                for i in range(n)
            }
            return tuple(c for c in _maximal_cliques(idx, adjacent) if len(c) > 1 or max_tier == Tier.NUMA)

        numa_groups: dict[int, set[int]] = {}
        for g in graph.gpus:
            if g.numa_node is not None:
                numa_groups.setdefault(g.numa_node, set()).add(g.index)
        key = repr((graph.model, idx, tiers, gbps, tuple(g.numa_node for g in graph.gpus)))
        return cls(
            indices=idx,
            pair_tiers=tiers,
            pair_gbps=gbps,
            numa=tuple(g.numa_node for g in graph.gpus),
            nvlink_islands=groups(Tier.NVLINK),
            pcie_switch_groups=groups(Tier.PIX),
            pcie_tree_groups=groups(Tier.PXB),
            numa_groups={k: frozenset(v) for k, v in sorted(numa_groups.items())},
            best_nic=_best_nics(graph),
            key=key,
        )

    @property
    def size(self) -> int:
        return len(self.indices)

    @property
    def full_mask(self) -> int:
        return (1 << self.size) - 1

    def positions(self, mask: int) -> list[int]:
        return [i for i in range(self.size) if mask >> i & 1]

    def mask_of(self, gpu_indices: Iterable[int]) -> int:
        pos = {g: i for i, g in enumerate(self.indices)}
        mask = 0
        for g in gpu_indices:
            mask |= 1 << pos[g]
        return mask

    def gpus_of(self, mask: int) -> tuple[int, ...]:
        return tuple(self.indices[i] for i in self.positions(mask))

    def tier_of(self, mask: int) -> Tier:
        members = self.positions(mask)
        worst = 0
        for a, b in itertools.combinations(members, 2):
            t = self.pair_tiers[a][b]
            if t > worst:
                worst = t
        return Tier(worst)

    def gbps_of(self, mask: int) -> float:
        """Ring bottleneck bandwidth of a GPU set: the slowest pair (a ring can always be made of it)."""
        members = self.positions(mask)
        if len(members) < 2:
            return float("inf")
        return min(self.pair_gbps[a][b] for a, b in itertools.combinations(members, 2))

    def numa_of(self, mask: int) -> tuple[int, ...]:
        return tuple(sorted({n for i in self.positions(mask) if (n := self.numa[i]) is not None}))

    def tightest_tier(self, gpus: int) -> Tier | None:
        """The tightest tier any set of ``gpus`` GPUs of this node type reaches (None if too many)."""
        if gpus > self.size or gpus <= 0:
            return None
        if gpus == 1:
            return Tier.NVLINK
        best = Tier.NODE
        for combo in itertools.combinations(range(self.size), gpus):
            mask = sum(1 << i for i in combo)
            t = self.tier_of(mask)
            if t < best:
                best = t
                if t == Tier.NVLINK:
                    break
        return best


def _best_nics(graph: GpuGraph) -> dict[int, str | None]:
    best: dict[int, str | None] = {}
    for g in graph.gpus:
        candidates = [(nic.gpu_links[g.index], nic.name) for nic in graph.nics if g.index in nic.gpu_links]
        best[g.index] = min(candidates)[1] if candidates else None
    return best
