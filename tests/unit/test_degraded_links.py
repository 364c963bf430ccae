"""A GPU whose links keep retrying (below the agent's threshold, so still healthy) is priced at a
share of its bandwidth: a tensor-parallel group takes it only where no clean set fits. On a DRA
node gangslice picks the GPUs and leaves it out; on device-plugin nodes the plugin picks, so the
gang goes to a node whose plugin answer is clean."""

from __future__ import annotations

import dataclasses

import pytest

from extender.cost import Comm
from extender.placement.slice import Slice
from extender.placement.solver import place
from extender.testing.builders import make_cluster, make_gang, make_node
from extender.topology.model import GpuHealth
from extender.topology.presets import preset_graph


def hgx(health: dict[int, GpuHealth]) -> object:
    return dataclasses.replace(preset_graph("hgx-h100"), health=health)


def test_a_retrying_gpu_is_priced_at_a_share_of_its_nvlink_bandwidth() -> None:
    clean = preset_graph("hgx-h100")
    graph = hgx({3: GpuHealth(nvlink_errors_per_s=1.0)})
    assert graph.pair_gbps(0, 3) == pytest.approx(clean.pair_gbps(0, 3) / 2)
    assert graph.pair_gbps(0, 1) == clean.pair_gbps(0, 1)
    assert GpuHealth(pcie_replays_per_s=10.0).pcie_share == pytest.approx(0.5)
    assert GpuHealth().nvlink_share == 1.0  # a clean GPU keeps its shape (the solver's memo key)
    assert hgx({i: GpuHealth() for i in range(8)}).shape.key == clean.shape.key


def test_a_tp_group_avoids_a_gpu_whose_links_retry_and_takes_it_when_nothing_else_fits() -> None:
    graph = hgx({3: GpuHealth(nvlink_errors_per_s=0.5)})
    snap = make_cluster(make_node("a").graph(graph).dra()).obj()
    tp4 = make_gang("tp4").pod_set("server", count=1, gpus=4, comm=Comm.ALLREDUCE).obj()
    got = place(snap, tp4)
    assert isinstance(got, Slice)
    (slot,) = got.slots
    assert 3 not in slot.gpus, slot.gpus
    whole = make_gang("tp8").pod_set("server", count=1, gpus=8, comm=Comm.ALLREDUCE).obj()
    got = place(snap, whole)
    assert isinstance(got, Slice) and 3 in got.slots[0].gpus  # still usable: healthy


def test_on_device_plugin_nodes_the_gang_goes_where_the_plugins_answer_is_clean() -> None:
    degraded = make_node("a").graph(hgx({3: GpuHealth(nvlink_errors_per_s=0.5)}))
    snap = make_cluster(degraded, make_node("b").hgx_h100()).obj()
    tp4 = make_gang("tp4").pod_set("server", count=1, gpus=4, comm=Comm.ALLREDUCE).obj()
    got = place(snap, tp4)
    assert isinstance(got, Slice) and got.slots[0].node == "b", got
    clean = make_cluster(make_node("a").hgx_h100(), make_node("b").hgx_h100()).obj()
    got = place(clean, tp4)
    assert isinstance(got, Slice) and got.slots[0].node == "a"  # the tie-break without health
