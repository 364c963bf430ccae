"""Judging a node by the device plugin's choice (plain data: presets and fixtures)."""

from __future__ import annotations

from pathlib import Path

from extender.placement.node_fit import fit_for
from extender.placement.plugin_fit import plugin_capacity, plugin_pick, plugin_reason
from extender.topology.model import Tier
from extender.topology.nvidia_smi import parse_topo
from extender.topology.presets import preset_graph

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi-topo"


def test_the_plugin_trades_a_numa_local_set_for_the_partition() -> None:
    """Free 0-4 of the dual-socket PCIe box, 3 GPUs within one NUMA node: gangslice would take
    0,1,2; the plugin keeps the PIX pair 2,3 whole for a later request and answers 0,1,4,
    across the sockets, so the node is no fit for that pod."""
    graph = preset_graph("pcie-8gpu-2socket")
    shape = graph.shape
    free = shape.mask_of([0, 1, 2, 3, 4])
    ours = fit_for(shape).pick(free, 3, Tier.NUMA, 1)
    assert ours is not None and shape.gpus_of(ours[0]) == (0, 1, 2)
    assert plugin_pick(graph, free, 3, Tier.NUMA, 1) is None
    assert plugin_pick(graph, free, 3, Tier.NODE, 1) == (shape.mask_of([0, 1, 4]),)
    assert plugin_capacity(graph, free, 3, Tier.NUMA) == 0
    assert plugin_reason(graph, free, 3, Tier.NUMA, 1) == (
        "the device plugin may answer GPUs 0,1,4 for pod 1 of 1 (3 GPUs from free 0,1,2,3,4): "
        "spread over the node, looser than NUMA-local"
    )
    assert plugin_reason(graph, free, 3, Tier.NODE, 1) is None


def test_a_tie_that_may_cross_sockets_is_no_fit() -> None:
    """Every pair is SYS on this board, so the plugin ranks 0,1 (one socket) and 0,4 (two)
    alike and the kubelet's map order decides."""
    graph = parse_topo((FIXTURES / "rtx4090-8gpu-2socket-sys-2nic-tabs.txt").read_text(), source="rtx4090")
    free = graph.shape.mask_of([0, 1, 4])
    assert fit_for(graph.shape).pick(free, 2, Tier.NUMA, 1) is not None
    assert plugin_pick(graph, free, 2, Tier.NUMA, 1) is None


def test_pods_in_turn_get_the_plugin_sets() -> None:
    graph = preset_graph("pcie-8gpu-2socket")
    shape = graph.shape
    picked = plugin_pick(graph, shape.full_mask, 2, Tier.PIX, 4)
    assert picked is not None
    assert sorted(shape.gpus_of(m) for m in picked) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert plugin_capacity(graph, shape.full_mask, 2, Tier.PIX) == 4
    assert plugin_capacity(graph, shape.mask_of([0, 1, 2, 4]), 2, Tier.PIX) == 1
    assert plugin_reason(graph, shape.mask_of([0, 1, 2, 4]), 2, Tier.PIX, 2) == (
        "the device plugin may answer GPUs 2,4 for pod 2 of 2 (2 GPUs from free 2,4): "
        "spread over the node, looser than PCIe-switch-local"
    )


def test_nvswitch_boards_keep_nvlink_for_any_answer() -> None:
    """The plugin sees no NVLink on HGX, but every set there is NVLink-connected anyway."""
    graph = preset_graph("hgx-h100")
    picked = plugin_pick(graph, graph.shape.full_mask, 4, Tier.NVLINK, 2)
    assert picked is not None and len(picked) == 2
    assert all(graph.shape.tier_of(m) == Tier.NVLINK for m in picked)
