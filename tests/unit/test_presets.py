"""Built-in machine presets: each builds, and has the structure its source documents."""

from __future__ import annotations

from importlib import resources

import pytest

from extender.topology.model import Link, PcieLevel, Tier, TopologyError
from extender.topology.nvidia_smi import parse_topo, render_topo
from extender.topology.presets import PRESETS, Preset, preset_graph

REQUIRED = {"hgx-h100", "dgx-a100", "pcie-8gpu-2socket", "gb200-tray", "l40s-4gpu"}


def test_required_presets_exist() -> None:
    assert set(PRESETS) >= REQUIRED
    assert all(name == preset.name for name, preset in PRESETS.items())


def test_every_data_file_has_a_preset_and_back() -> None:
    folder = resources.files("extender.topology").joinpath("presets")
    files = {entry.name for entry in folder.iterdir() if entry.name.endswith(".txt")}
    assert files == {preset.resource for preset in PRESETS.values()}


@pytest.mark.parametrize("preset", PRESETS.values(), ids=list(PRESETS))
def test_preset_builds_with_its_metadata(preset: Preset) -> None:
    graph = preset_graph(preset.name)

    assert graph.gpus
    assert graph.model == preset.model
    assert (graph.nvlink_gbps, graph.pcie_gbps) == (preset.nvlink_gbps, preset.pcie_gbps)
    assert graph.clique is None
    assert preset.description and preset.source
    assert preset.graph() is graph


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_file_names_its_source_and_round_trips(name: str) -> None:
    text = resources.files("extender.topology").joinpath("presets", f"{name}.txt").read_text("utf-8")
    assert text.startswith(f"# {name}: ")
    graph = preset_graph(name)
    back = parse_topo(render_topo(graph))
    assert (back.gpus, dict(back.links), back.nics) == (graph.gpus, dict(graph.links), graph.nics)


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(TopologyError, match=r"unknown topology preset 'dgx-z9'; known presets: .*hgx-h100"):
        preset_graph("dgx-z9")


def numa_by_gpu(name: str) -> list[int | None]:
    return [g.numa_node for g in preset_graph(name).gpus]


def test_hgx_h100() -> None:
    graph = preset_graph("hgx-h100")
    assert graph.shape.nvlink_islands == (frozenset(range(8)),)
    assert all(graph.link(a, b) == Link(nvlinks=18) for a, b in graph.links)
    assert numa_by_gpu("hgx-h100") == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(graph.nics) == 8
    pix = [[g for g, level in nic.gpu_links.items() if level == PcieLevel.PIX] for nic in graph.nics]
    assert pix == [[g] for g in range(8)]
    assert [nic.numa_node for nic in graph.nics] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert dict(graph.shape.best_nic) == {g: f"mlx5_{g + 1}" for g in range(8)}
    assert graph.shape.tightest_tier(8) == Tier.NVLINK


def test_dgx_a100() -> None:
    graph = preset_graph("dgx-a100")
    assert graph.shape.nvlink_islands == (frozenset(range(8)),)
    assert all(link == Link(nvlinks=12) for link in graph.links.values())
    assert numa_by_gpu("dgx-a100") == [0, 0, 0, 0, 1, 1, 1, 1]
    assert graph.pcie_gbps == 64
    assert graph.nics == ()


def test_pcie_8gpu_2socket() -> None:
    shape = preset_graph("pcie-8gpu-2socket").shape
    assert shape.nvlink_islands == ()
    assert set(shape.pcie_switch_groups) == {frozenset(p) for p in [(0, 1), (2, 3), (4, 5), (6, 7)]}
    assert dict(shape.numa_groups) == {0: frozenset(range(4)), 1: frozenset(range(4, 8))}
    assert shape.tightest_tier(2) == Tier.PIX
    assert shape.tightest_tier(4) == Tier.NUMA
    assert shape.tightest_tier(8) == Tier.NODE
    graph = preset_graph("pcie-8gpu-2socket")
    assert [nic.numa_node for nic in graph.nics] == [0, 1]
    assert graph.pcie_gbps == 64


def test_gb200_tray() -> None:
    graph = preset_graph("gb200-tray")
    assert graph.shape.nvlink_islands == (frozenset(range(4)),)
    assert numa_by_gpu("gb200-tray") == [0, 0, 1, 1]
    assert (graph.nvlink_gbps, graph.pcie_gbps) == (100, 128)
    assert len(graph.nics) == 4
    assert all(set(nic.gpu_links.values()) == {PcieLevel.SYS} for nic in graph.nics)
    assert graph.pair_gbps(0, 3) == 18 * 100


def test_l40s_4gpu() -> None:
    graph = preset_graph("l40s-4gpu")
    shape = graph.shape
    assert shape.nvlink_islands == ()
    assert not any(link.nvlinks for link in graph.links.values())
    assert numa_by_gpu("l40s-4gpu") == [0, 0, 1, 1]
    assert shape.tightest_tier(2) == Tier.NUMA
    assert shape.tightest_tier(4) == Tier.NODE
    assert [nic.name for nic in graph.nics] == ["mlx5_0", "mlx5_1"]
    assert graph.pcie_gbps == 64
