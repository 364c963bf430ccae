"""Pure model of GPUs, nodes, links and the network hierarchy; parsers and discovery."""

from extender.topology.model import (
    IN_NODE_LEVELS,
    FabricClique,
    Gpu,
    GpuGraph,
    GpuHealth,
    Link,
    Nic,
    NodeShape,
    PcieLevel,
    Tier,
    TopologyError,
)

__all__ = [
    "IN_NODE_LEVELS",
    "FabricClique",
    "Gpu",
    "GpuGraph",
    "GpuHealth",
    "Link",
    "Nic",
    "NodeShape",
    "PcieLevel",
    "Tier",
    "TopologyError",
]
