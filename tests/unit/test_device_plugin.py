"""The device plugin's best-effort choice, on plain data (the conformance tier checks it
against go-gpuallocator itself)."""

from __future__ import annotations

import pytest

from extender.topology.device_plugin import pair_score, plugin_view, preferred_allocation
from extender.topology.model import Gpu, GpuGraph, Link, PcieLevel
from extender.topology.presets import preset_graph


def _graph(cells: dict[tuple[int, int], str], numa: dict[int, int] | None = None) -> GpuGraph:
    gpus = sorted({i for pair in cells for i in pair})
    numa = numa or {}
    return GpuGraph(
        gpus=tuple(Gpu(index=i, numa_node=numa.get(i)) for i in gpus),
        links={pair: Link.parse(cell) for pair, cell in cells.items()},
    )


def _pairs(gpus: int, cell: str, **special: str) -> dict[tuple[int, int], str]:
    out = {(a, b): cell for a in range(gpus) for b in range(a + 1, gpus)}
    for key, value in special.items():
        a, b = (int(x) for x in key[1:].split("_"))
        out[(a, b)] = value
    return out


def test_pair_points_follow_the_pcie_level_and_count_each_nvlink() -> None:
    assert [pair_score(level, 0) for level in PcieLevel] == [50, 40, 30, 20, 10]
    assert pair_score(PcieLevel.PIX, 2) == 250
    assert pair_score(PcieLevel.SYS, 18) == 1810


def test_nvswitch_boards_show_the_plugin_no_nvlink() -> None:
    view = plugin_view(preset_graph("hgx-h100"))
    assert view.switched and not view.nvlinks
    # NV18 cells carry no PCIe level: NODE within a NUMA node, SYS across.
    assert view.pair(0, 3) == (PcieLevel.NODE, 0)
    assert view.pair(3, 4) == (PcieLevel.SYS, 0)


def test_direct_nvlinks_count_when_they_fit_one_gpu() -> None:
    graph = _graph(_pairs(4, "SYS", p0_1="NV4", p2_3="NV4"))
    view = plugin_view(graph)
    assert not view.switched and view.pair(0, 1) == (PcieLevel.SYS, 4)
    assert preferred_allocation(view, range(4), 2).gpus == (0, 1)
    # with GPU 0 taken, the pair that keeps its NVLinks is the only good one
    assert set(preferred_allocation(view, [1, 2, 3], 2).gpus) == {2, 3}


def test_the_partition_not_the_single_best_set_decides() -> None:
    """Greedy would take (1, 2), the best pair, and strand 0 and 3 on SYS; the policy keeps
    both pairs good: (0, 1) and (2, 3) together outscore (1, 2) and (0, 3)."""
    cells = _pairs(4, "SYS", p0_1="NV2", p2_3="NV2", p1_2="NV3")
    answer = preferred_allocation(plugin_view(_graph(cells)), range(4), 2)
    assert set(answer.gpus) in ({0, 1}, {2, 3})
    assert answer.possible == {frozenset({0, 1}), frozenset({2, 3})}
    assert not answer.certain


def test_ties_depend_on_the_order_the_kubelet_lists_the_gpus() -> None:
    view = plugin_view(preset_graph("hgx-h100"))
    first = preferred_allocation(view, range(8), 4)
    reversed_order = preferred_allocation(view, range(8), 4, order=list(range(7, -1, -1)))
    assert set(first.gpus) == {0, 1, 2, 3} and set(reversed_order.gpus) == {4, 5, 6, 7}
    assert first.possible == reversed_order.possible == {frozenset(range(4)), frozenset(range(4, 8))}


def test_must_include_gpus_are_in_the_answer() -> None:
    view = plugin_view(preset_graph("pcie-8gpu-2socket"))
    answer = preferred_allocation(view, range(8), 2, required=[5])
    assert answer.gpus and 5 in answer.gpus and answer.certain
    assert set(answer.gpus) == {4, 5}  # its PIX partner


def test_count_one_takes_the_first_listed_gpu() -> None:
    view = plugin_view(preset_graph("l40s-4gpu"))
    assert preferred_allocation(view, [3, 1, 2], 1, order=[3, 1, 2]).gpus == (3,)
    assert len(preferred_allocation(view, [3, 1, 2], 1).possible) == 3


@pytest.mark.parametrize(("available", "size", "required"), [([0, 1], 3, []), ([0, 1], 0, []), ([0], 1, [2])])
def test_impossible_requests_get_an_empty_answer(
    available: list[int], size: int, required: list[int]
) -> None:
    answer = preferred_allocation(plugin_view(preset_graph("l40s-4gpu")), available, size, required)
    assert answer.gpus == () and not answer.padded


def test_the_padded_group_can_be_the_answer() -> None:
    """6 free GPUs, 4 asked: padded to 8, the best partition is (2, 3, 4, 5) with the NV2
    pair (0, 1) in the padded group, and that group scores highest, so the policy answers
    two GPUs and two empty slots."""
    cells = _pairs(6, "NODE", p0_1="NV2", p0_2="SYS", p0_3="SYS", p0_4="SYS", p0_5="SYS")
    cells.update({(1, b): "SYS" for b in range(2, 6)})
    answer = preferred_allocation(plugin_view(_graph(cells)), range(6), 4)
    assert answer.padded and answer.gpus == (0, 1) and not answer.certain


def test_order_must_list_the_available_gpus() -> None:
    with pytest.raises(ValueError, match="not an ordering"):
        preferred_allocation(plugin_view(preset_graph("l40s-4gpu")), [0, 1], 1, order=[0, 2])
