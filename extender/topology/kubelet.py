"""What the kubelet on a node aligns to NUMA nodes: its Topology Manager, CPU manager and
memory manager settings, and each NUMA node's CPUs and memory.

Plain data; the agent reads it (kubelet configuration file, PodResources, sysfs) and the
placement rule (:mod:`extender.placement.numa_fit`) judges a pod with it. Names and values
are the kubelet's own (``KubeletConfiguration`` ``kubelet.config.k8s.io/v1beta1``:
``topologyManagerPolicy``, ``topologyManagerScope``, ``cpuManagerPolicy``,
``memoryManagerPolicy``), defaults as the kubelet's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["CpuPolicy", "KubeletAlignment", "MemoryPolicy", "NumaNode", "TopologyPolicy", "TopologyScope"]


class TopologyPolicy(enum.StrEnum):
    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"

    @property
    def refuses(self) -> bool:
        """Whether the kubelet rejects a pod it cannot align (``TopologyAffinityError``)."""
        return self in (TopologyPolicy.RESTRICTED, TopologyPolicy.SINGLE_NUMA_NODE)


class TopologyScope(enum.StrEnum):
    CONTAINER = "container"
    POD = "pod"


class CpuPolicy(enum.StrEnum):
    NONE = "none"
    STATIC = "static"


class MemoryPolicy(enum.StrEnum):
    # The kubelet spells these capitalised (``memoryManagerPolicy: Static``).
    NONE = "None"
    STATIC = "Static"


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One NUMA node: CPUs the kubelet may hand out exclusively (PodResources
    ``GetAllocatableResources``) and how many of them containers hold; memory likewise, known
    only where the memory manager is on (None otherwise)."""

    id: int
    cpus: int = 0
    cpus_in_use: int = 0
    memory_bytes: int | None = None
    memory_in_use: int = 0

    def __post_init__(self) -> None:
        if self.id < 0 or self.cpus < 0 or self.cpus_in_use < 0 or self.memory_in_use < 0:
            raise ValueError(f"NUMA node {self.id}: ids, counts and sizes must be >= 0")
        if self.memory_bytes is not None and self.memory_bytes < 0:
            raise ValueError(f"NUMA node {self.id}: memory must be >= 0")

    @property
    def cpus_free(self) -> int:
        return max(0, self.cpus - self.cpus_in_use)

    @property
    def memory_free(self) -> int:
        return max(0, (self.memory_bytes or 0) - self.memory_in_use)


@dataclass(frozen=True, slots=True)
class KubeletAlignment:
    """The kubelet's alignment settings on one node and its NUMA nodes (by id)."""

    topology_policy: TopologyPolicy = TopologyPolicy.NONE
    topology_scope: TopologyScope = TopologyScope.CONTAINER
    cpu_policy: CpuPolicy = CpuPolicy.NONE
    memory_policy: MemoryPolicy = MemoryPolicy.NONE
    numa_nodes: tuple[NumaNode, ...] = ()

    def __post_init__(self) -> None:
        ids = [n.id for n in self.numa_nodes]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate NUMA node ids {ids}")
        if list(ids) != sorted(ids):
            object.__setattr__(self, "numa_nodes", tuple(sorted(self.numa_nodes, key=lambda n: n.id)))

    def numa(self, id: int) -> NumaNode | None:
        for n in self.numa_nodes:
            if n.id == id:
                return n
        return None

    def emptied(self) -> KubeletAlignment:
        """The same settings with nothing in use (for "would it fit an empty cluster")."""
        return KubeletAlignment(
            self.topology_policy,
            self.topology_scope,
            self.cpu_policy,
            self.memory_policy,
            tuple(NumaNode(n.id, n.cpus, 0, n.memory_bytes, 0) for n in self.numa_nodes),
        )
