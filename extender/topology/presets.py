"""Built-in GPU graphs of common machines, for simulation, examples and cluster files.

Every layout is a real ``nvidia-smi topo -m`` output (stored under ``presets/`` in this
package, with its source in the file's leading comment and in :attr:`Preset.source`); the
GPU model and bandwidths, which the matrix does not print, are applied on top. A fabric
clique (GB200 NVL72) is per node and comes from the cluster file or node labels, never
from a preset.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from importlib import resources

from extender.topology.bandwidth import (
    NVLINK4_PER_LINK_GBPS,
    NVLINK5_PER_LINK_GBPS,
    PCIE_GEN4_X16_GBPS,
    PCIE_GEN5_X16_GBPS,
)
from extender.topology.model import GpuGraph, TopologyError
from extender.topology.nvidia_smi import parse_topo

__all__ = ["PRESETS", "Preset", "preset_graph"]


@dataclass(frozen=True, slots=True)
class Preset:
    """One machine type: where its layout comes from and what the matrix does not say."""

    name: str
    description: str
    source: str
    model: str
    nvlink_gbps: float
    pcie_gbps: float

    @property
    def resource(self) -> str:
        return f"{self.name}.txt"

    def graph(self) -> GpuGraph:
        return preset_graph(self.name)


_SGLANG = "https://github.com/sgl-project/sglang/issues"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="hgx-h100",
            description="8x H100 SXM on the HGX board: NV18 all pairs via NVSwitch, NUMA 0 for GPUs 0-3 "
            "and 1 for 4-7, one NIC PIX to each GPU",
            source=f"nvidia-smi topo -m of an 8-GPU HGX Hopper server (8x H20 on the HGX board H100 SXM "
            f"uses; same NVSwitch fabric and NV18) in {_SGLANG}/9696, same matrix in {_SGLANG}/24966",
            model="H100-SXM",
            nvlink_gbps=NVLINK4_PER_LINK_GBPS,
            pcie_gbps=PCIE_GEN5_X16_GBPS,
        ),
        Preset(
            name="dgx-a100",
            description="8x A100 SXM4: NV12 all pairs via NVSwitch, NUMA 0 for GPUs 0-3 and 1 for 4-7, "
            "no NIC columns",
            source="the 8x A100 node in stas00/ml-engineering network/README.md lines 370-378 (commit "
            "744d01e18b79512572f64a6bbd8b5f4a725203a7), the a100-8gpu-nv12-2numa-compact fixture",
            model="A100-SXM4",
            nvlink_gbps=NVLINK4_PER_LINK_GBPS,
            pcie_gbps=PCIE_GEN4_X16_GBPS,
        ),
        Preset(
            name="pcie-8gpu-2socket",
            description="dual-socket 8-GPU PCIe server, two PCIe switches per socket: pairs (0,1) (2,3) "
            "(4,5) (6,7) PIX, NODE across switches of a socket, SYS across sockets; one NIC per socket",
            source="GPU matrix and affinity of a dual Xeon Gold 6430 server (dual-root, Supermicro "
            "SYS-4029GP-TRT class) in gqcn/johns-blog docs/docs/1000-AI技术/800-基础架构/700-算力调度/"
            "3000-CPU亲和性与NUMA亲和性调度.md; the source shows no NICs, the two here sit one per "
            "socket on a root port of their own (NODE to that socket's GPUs), and the GPU model "
            "(L40S, for the simulator's PCIe fleet) is ours too",
            model="L40S",
            nvlink_gbps=NVLINK4_PER_LINK_GBPS,
            pcie_gbps=PCIE_GEN4_X16_GBPS,
        ),
        Preset(
            name="gb200-tray",
            description="one GB200 compute tray: 4 GPUs NV18 all pairs, Grace NUMA 0 for GPUs 0-1 and 1 "
            "for 2-3, 4 NICs SYS to every GPU",
            source=f"nvidia-smi topo -m of a GB200 tray in {_SGLANG}/11208 (driver 570.172.08), four of "
            "its NICs kept",
            model="GB200",
            nvlink_gbps=NVLINK5_PER_LINK_GBPS,
            pcie_gbps=PCIE_GEN5_X16_GBPS,
        ),
        Preset(
            name="l40s-4gpu",
            description="4x L40S PCIe, no NVLink, two sockets: GPUs 0-1 and 2-3 NODE, SYS across "
            "sockets, a dual-port NIC on socket 1",
            source="nvidia-smi topo -m in https://github.com/warpem/miss-alignment/issues/106 "
            "(comment of 2026-06-04)",
            model="L40S",
            nvlink_gbps=NVLINK4_PER_LINK_GBPS,
            pcie_gbps=PCIE_GEN4_X16_GBPS,
        ),
        Preset(
            name="h100-nv18",
            description="8x H100 80GB HBM3: NV18 all pairs, NUMA 0 for GPUs 0-3 and 1 for 4-7, no NIC "
            "columns",
            source="https://github.com/HazyResearch/ThunderKittens/issues/167, the "
            "h100-8gpu-nv18-gpu-numa-id fixture",
            model="H100-SXM",
            nvlink_gbps=NVLINK4_PER_LINK_GBPS,
            pcie_gbps=PCIE_GEN5_X16_GBPS,
        ),
    )
}


@functools.cache
def preset_graph(name: str) -> GpuGraph:
    """The GPU graph of a built-in machine type; parsed once, then shared (treat it as read-only)."""
    preset = PRESETS.get(name)
    if preset is None:
        raise TopologyError(f"unknown topology preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    text = resources.files("extender.topology").joinpath("presets", preset.resource).read_text("utf-8")
    graph = parse_topo(text, source=f"preset {name}")
    return dataclasses.replace(
        graph, model=preset.model, nvlink_gbps=preset.nvlink_gbps, pcie_gbps=preset.pcie_gbps
    )
