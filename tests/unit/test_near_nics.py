"""Which NICs a pod's GPUs talk through (``GpuGraph.near_nics``, written at bind as
``gangslice.io/nics`` and NCCL's and UCX's spellings of it)."""

from __future__ import annotations

from extender.topology.model import Gpu, GpuGraph, Link, Nic, PcieLevel
from extender.topology.presets import preset_graph

PIX, NODE, SYS = PcieLevel.PIX, PcieLevel.NODE, PcieLevel.SYS


def _graph() -> GpuGraph:
    gpus = tuple(Gpu(index=i, numa_node=0 if i < 3 else 1) for i in range(4))
    links = {
        (a, b): Link(nvlinks=0, pcie=NODE if (a < 3) == (b < 3) else SYS)
        for a in range(4)
        for b in range(a + 1, 4)
    }
    nics = (
        Nic("a", numa_node=0, gpu_links={0: PIX, 1: SYS, 2: PIX, 3: SYS}),
        Nic("b", numa_node=1, gpu_links={0: SYS, 1: SYS, 2: SYS, 3: NODE}),
    )
    return GpuGraph(gpus=gpus, links=links, nics=nics)


def test_each_gpus_nearest_nic_on_its_numa_node_once_in_gpu_order() -> None:
    g = _graph()
    assert g.near_nics([2, 0]) == ("a",)  # both behind NIC a: named once
    assert g.near_nics([3, 0]) == ("b", "a")  # the GPUs' order
    assert g.near_nics([1]) == ()  # its nearest NIC is across the socket link: none


def test_an_hgx_board_gives_every_gpu_the_nic_on_its_switch() -> None:
    g = preset_graph("hgx-h100")
    assert g.near_nics(range(8)) == tuple(f"mlx5_{i + 1}" for i in range(8))


def test_a_pcie_box_gives_the_nic_of_the_gpus_socket() -> None:
    g = preset_graph("pcie-8gpu-2socket")
    assert g.near_nics([0, 1]) == ("NIC0",) and g.near_nics([4, 5]) == ("NIC1",)
