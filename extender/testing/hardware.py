"""Named hardware for tests: one function per machine type of the topology presets
(:mod:`extender.topology.presets`), as go-gpuallocator's tests name theirs
(``NewDGX1PascalNode()``), and the node-label keys of the default network hierarchy.

A test says ``hgx_h100()`` rather than ``preset_graph("hgx-h100")``; the graph is the
preset's, parsed once and shared (read-only, as :func:`preset_graph` says).
"""

from __future__ import annotations

from extender.topology.hierarchy import DEFAULT_LEVELS, Level
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph

__all__ = [
    "CLIQUE",
    "CORE",
    "LEAF",
    "NVL_DOMAIN",
    "SPINE",
    "dgx_a100",
    "gb200_tray",
    "h100_nv18",
    "hgx_h100",
    "l40s_4gpu",
    "level",
    "pcie_8gpu_2socket",
]

#: The label keys of the default hierarchy (NVIDIA topograph and GPU Feature Discovery).
CORE = "fabric.topograph.run/tier-2"
SPINE = "fabric.topograph.run/tier-1"
LEAF = "fabric.topograph.run/tier-0"
NVL_DOMAIN = "accelerator.topograph.run/domain"
CLIQUE = "nvidia.com/gpu.clique"


def level(name: str) -> Level:
    """The default hierarchy's level called ``name`` (``spine``, ``leaf``, ``clique``...),
    with its label and kind."""
    for lv in DEFAULT_LEVELS:
        if lv.name == name:
            return lv
    known = ", ".join(lv.name for lv in DEFAULT_LEVELS)
    raise ValueError(f"no default level {name!r}; known: {known}")


def hgx_h100() -> GpuGraph:
    """8x H100 SXM on the HGX board: NV18 all pairs through NVSwitch, two NUMA nodes."""
    return preset_graph("hgx-h100")


def dgx_a100() -> GpuGraph:
    """8x A100 SXM4: NV12 all pairs through NVSwitch, two NUMA nodes, no NICs."""
    return preset_graph("dgx-a100")


def h100_nv18() -> GpuGraph:
    """8x H100 80GB HBM3: NV18 all pairs, two NUMA nodes, no NIC columns."""
    return preset_graph("h100-nv18")


def pcie_8gpu_2socket() -> GpuGraph:
    """A dual-socket 8-GPU PCIe server (L40S): PCIe-switch pairs (0,1) (2,3) (4,5) (6,7),
    SYS across the sockets, no NVLink."""
    return preset_graph("pcie-8gpu-2socket")


def l40s_4gpu() -> GpuGraph:
    """4x L40S PCIe on two sockets: GPUs 0-1 and 2-3 NODE, SYS across the sockets."""
    return preset_graph("l40s-4gpu")


def gb200_tray() -> GpuGraph:
    """One GB200 compute tray: 4 GPUs NV18 all pairs, two Grace NUMA nodes; its NVL72
    clique comes from the node's labels (:data:`CLIQUE`), never from the preset."""
    return preset_graph("gb200-tray")
