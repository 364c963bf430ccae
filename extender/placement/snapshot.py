"""A point-in-time view of the cluster the solver reads: nodes, their GPU graphs, what is taken."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from extender.topology.hierarchy import DomainKey, Hierarchy
from extender.topology.model import GpuGraph, NodeShape


@dataclass
class NodeState:
    """One node. GPU sets are GPU *indices*; masks are positions in the node's shape."""

    name: str
    labels: Mapping[str, str]
    graph: GpuGraph
    allocated: frozenset[int] = frozenset()
    unhealthy: frozenset[int] = frozenset()
    #: The gang that holds this node's multi-node NVLink (IMEX) channel, if any.
    mnnvl_gang: str | None = None

    def __post_init__(self) -> None:
        sick = {g.index for g in self.graph.gpus if not self.graph.healthy(g.index)}
        self.unhealthy = frozenset(self.unhealthy | sick)
        known = set(self.graph.indices)
        for what, gpus in (("allocatedGpus", self.allocated), ("unhealthyGpus", self.unhealthy)):
            unknown = set(gpus) - known
            if unknown:
                raise ValueError(f"node {self.name}: {what} names GPUs {sorted(unknown)} it does not have")

    @property
    def shape(self) -> NodeShape:
        return self.graph.shape


@dataclass
class ClusterSnapshot:
    """Nodes plus the hierarchy; ``reserved`` holds GPUs held by reservations, per node."""

    nodes: list[NodeState]
    hierarchy: Hierarchy = field(default_factory=Hierarchy)
    reserved: dict[str, frozenset[int]] = field(default_factory=dict)
    #: Nodes whose IMEX channel a reservation holds, by gang (from the ledger).
    reserved_mnnvl: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate node names: {dupes}")
        self._by_name = {n.name: n for n in self.nodes}
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        self._paths = [self.hierarchy.path(n.labels) for n in self.nodes]
        self._domains: dict[DomainKey, list[int]] | None = None
        self._free = [self._compute_free(n) for n in self.nodes]

    def _compute_free(self, node: NodeState) -> int:
        shape = node.shape
        taken = node.allocated | node.unhealthy | self.reserved.get(node.name, frozenset())
        return shape.full_mask & ~shape.mask_of(g for g in taken if g in shape.indices)

    def node(self, name: str) -> NodeState:
        return self._by_name[name]

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    def path(self, i: int) -> tuple[str | None, ...]:
        return self._paths[i]

    def path_of(self, name: str) -> tuple[str | None, ...]:
        return self.hierarchy.path(self._by_name[name].labels)

    def index(self, name: str) -> int:
        return self._index[name]

    def free_mask(self, i: int) -> int:
        """Free GPUs of node ``i`` as a mask: not allocated, not unhealthy, not reserved."""
        return self._free[i]

    def free_gpus(self, name: str) -> frozenset[int]:
        i = self._index[name]
        return frozenset(self.nodes[i].shape.gpus_of(self._free[i]))

    def mnnvl_owner(self, i: int) -> str | None:
        node = self.nodes[i]
        return node.mnnvl_gang or self.reserved_mnnvl.get(node.name)

    def domains(self) -> dict[DomainKey, list[int]]:
        """Every domain at every level, with the indices of its nodes (cached)."""
        if self._domains is None:
            out: dict[DomainKey, list[int]] = {}
            for i, path in enumerate(self._paths):
                for level in range(len(self.hierarchy.levels)):
                    key = self.hierarchy.domain(path, level)
                    if key is not None:
                        out.setdefault(key, []).append(i)
            self._domains = out
        return self._domains

    def with_held(self, held: Mapping[str, frozenset[int]], mnnvl: Mapping[str, str]) -> ClusterSnapshot:
        """The same cluster with reservations' capacity taken out."""
        snap = ClusterSnapshot(self.nodes, self.hierarchy, dict(held), dict(mnnvl))
        snap._domains = self._domains
        return snap

    @property
    def total_gpus(self) -> int:
        return sum(n.shape.size for n in self.nodes)
