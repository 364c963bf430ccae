"""The network hierarchy across nodes, read from node labels.

An ordered list of levels, coarse to fine (the idea of Kueue's ``Topology.spec.levels``):
each level is a node-label key, and two nodes share a domain at a level when they carry the
same values for that level's label *and every coarser one*. A node missing a level's label
has no domain at that level and is still usable. The node itself is the finest domain and
is implicit (``kubernetes.io/hostname`` in a level list is accepted and ignored).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.topology.bandwidth import IB_NDR_GBPS

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the hierarchy.

    ``kind`` says what nodes sharing a domain there have in common: ``switch``, a network
    switch (leaf, spine, core); ``group``, a grouping with no switch of its own (a rack or
    NVLink domain under one leaf); ``fabric``, a multi-node NVLink clique, where nodes talk
    over NVLink rather than the network.
    """

    name: str
    label: str
    kind: str = "switch"

    @property
    def fabric(self) -> bool:
        return self.kind == "fabric"


#: Defaults follow NVIDIA topograph v1.0 (``fabric.topograph.run/tier-N``, tier-0 closest to
#: the nodes; ``accelerator.topograph.run/domain`` for the NVLink domain and the optional
#: ``.../sub-domain`` inside it, e.g. a rack of a multi-rack domain) and GPU Feature
#: Discovery (``nvidia.com/gpu.clique`` = ``<ClusterUUID>.<CliqueID>``). topograph's tier
#: depth varies by fabric; a fabric deeper than three tiers names its levels in the cluster
#: configuration (any ``tier-N`` label key is accepted there).
DEFAULT_LEVELS: tuple[Level, ...] = (
    Level("core", "fabric.topograph.run/tier-2"),
    Level("spine", "fabric.topograph.run/tier-1"),
    Level("leaf", "fabric.topograph.run/tier-0"),
    Level("nvl-domain", "accelerator.topograph.run/domain", kind="group"),
    Level("nvl-subdomain", "accelerator.topograph.run/sub-domain", kind="group"),
    Level("clique", "nvidia.com/gpu.clique", kind="fabric"),
)

_KNOWN_BY_LABEL = {lv.label: lv for lv in DEFAULT_LEVELS}


LEVEL_KINDS = ("switch", "group", "fabric")


class HierarchyError(ValueError):
    pass


def _short_name(label: str) -> str:
    tail = label.rsplit("/", 1)[-1]
    return tail.rsplit(".", 1)[-1] or label


def parse_levels(entries: Iterable[str | Mapping[str, object]] | None) -> tuple[Level, ...]:
    """Levels from configuration: label keys (``"example.com/rack"``) or mappings with
    ``nodeLabel`` and optional ``name`` / ``kind``. None gives the defaults."""
    if entries is None:
        return DEFAULT_LEVELS
    levels: list[Level] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            if entry == HOSTNAME_LABEL:
                continue
            levels.append(_KNOWN_BY_LABEL.get(entry, Level(_short_name(entry), entry)))
        elif isinstance(entry, Mapping):
            label = entry.get("nodeLabel") or entry.get("label")
            if not isinstance(label, str) or not label:
                raise HierarchyError(f"levels[{i}]: expected a label key or a mapping with nodeLabel")
            if label == HOSTNAME_LABEL:
                continue
            known = _KNOWN_BY_LABEL.get(label)
            name = entry.get("name") or (known.name if known else _short_name(label))
            kind = str(entry.get("kind", known.kind if known else "switch"))
            if kind not in LEVEL_KINDS:
                raise HierarchyError(f"levels[{i}].kind: expected one of {LEVEL_KINDS}, got {kind!r}")
            levels.append(Level(str(name), label, kind))
        else:
            raise HierarchyError(f"levels[{i}]: expected a label key or a mapping, got {entry!r}")
    names = [lv.name for lv in levels]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise HierarchyError(f"levels: duplicate level names {sorted(dupes)}; give each a distinct name")
    return tuple(levels)


#: A domain: the level index and the label values from the coarsest level down to it.
DomainKey = tuple[int, tuple[str | None, ...]]


@dataclass(frozen=True, slots=True)
class NetworkModel:
    """Bandwidth across nodes by the finest level two nodes share.

    ``nic_gbps`` is each GPU's network bandwidth inside one leaf (bidirectional, InfiniBand
    NDR by default); each coarser switch level divides it by ``oversubscription``.
    """

    nic_gbps: float = IB_NDR_GBPS
    oversubscription: float = 2.0


@dataclass(frozen=True)
class Hierarchy:
    levels: tuple[Level, ...] = DEFAULT_LEVELS
    network: NetworkModel = NetworkModel()

    def index_of(self, name_or_label: str) -> int | None:
        for i, lv in enumerate(self.levels):
            if name_or_label in (lv.name, lv.label):
                return i
        return None

    def finer(self, a: str | None, b: str | None) -> str | None:
        """The finer of two level names (either may be None: no bound). In-node levels and
        ``node`` are finer than any level of the hierarchy."""
        if a is None or b is None:
            return a or b
        return a if self._rank(a) >= self._rank(b) else b

    def _rank(self, level: str) -> int:
        idx = self.index_of(level)
        return idx if idx is not None else len(self.levels)

    def path(self, labels: Mapping[str, str]) -> tuple[str | None, ...]:
        return tuple(labels.get(lv.label) for lv in self.levels)

    def domain(self, path: Sequence[str | None], level: int) -> DomainKey | None:
        """The domain of a node at ``level``, or None when the node lacks that label."""
        if path[level] is None:
            return None
        return (level, tuple(path[: level + 1]))

    def common_level(self, paths: Sequence[Sequence[str | None]]) -> int:
        """The finest level index all paths share a domain at; -1 when they share none."""
        first = paths[0]
        for level in range(len(self.levels) - 1, -1, -1):
            if first[level] is None:
                continue
            prefix = tuple(first[: level + 1])
            if all(tuple(p[: level + 1]) == prefix for p in paths[1:]):
                return level
        return -1

    def switch_gbps(self, level: int) -> float:
        """Network bandwidth between nodes whose finest shared level is ``level`` (-1: none).

        Full NIC rate under one leaf (the finest switch level); each switch level the path
        climbs above the leaf divides it by the oversubscription.
        """
        switches = [i for i, lv in enumerate(self.levels) if lv.kind == "switch"]
        leaf = switches[-1] if switches else -1
        hops = sum(1 for i in switches if level < i <= leaf)
        return self.network.nic_gbps / (self.network.oversubscription**hops)

    def describe(self, key: DomainKey) -> str:
        level, values = key
        return f"{self.levels[level].name} {values[-1]}"
