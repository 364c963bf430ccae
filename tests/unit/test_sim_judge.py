"""How the simulator judges any policy's slice: usable at all, and coherent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extender.placement.files import cluster_from_data, gang_from_data
from extender.placement.request import GangRequest
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.judge import coherent_level, incoherence, unusable
from extender.topology.hierarchy import Hierarchy, Level

LEAF = "fabric.topograph.run/tier-0"
CLIQUE = "nvidia.com/gpu.clique"


def snap() -> ClusterSnapshot:
    def node(name: str, topo: str, **labels: str) -> dict[str, Any]:
        return {"name": name, "gpuTopology": topo, "labels": labels}

    data = {
        "nodes": [
            {**node("a0", "hgx-h100", **{LEAF: "A"}), "allocatedGpus": [7]},
            node("a1", "hgx-h100", **{LEAF: "A"}),
            node("b0", "hgx-h100", **{LEAF: "B"}),
            node("r1-0", "gb200-tray", **{LEAF: "R1", CLIQUE: "u.1"}),
            node("r1-1", "gb200-tray", **{LEAF: "R1", CLIQUE: "u.1"}),
            node("r2-0", "gb200-tray", **{LEAF: "R2", CLIQUE: "u.2"}),
        ]
    }
    return cluster_from_data(data, Path("."))


def gang(*pod_sets: dict[str, Any]) -> GangRequest:
    return gang_from_data({"name": "g", "podSets": list(pod_sets)})


def ps(name: str, count: int, gpus: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "count": count, "gpusPerPod": gpus, **extra}


def slot(pod_set: str, index: int, node: str, *gpus: int) -> PodSlot:
    return PodSlot(pod_set, index, node, tuple(gpus))


EIGHT = tuple(range(8))


def test_coherent_gang_has_no_reasons() -> None:
    g = gang(ps("s", 2, 4, comm="allreduce"))
    assert incoherence(snap(), g, [slot("s", 0, "a1", 0, 1, 2, 3), slot("s", 1, "a1", 4, 5, 6, 7)]) == ()


def test_talking_pod_set_across_leaves_is_spread_quiet_one_is_not() -> None:
    talking = gang(ps("s", 2, 8, comm="alltoall"))
    slots = [slot("s", 0, "a1", *EIGHT), slot("s", 1, "b0", *EIGHT)]
    assert incoherence(snap(), talking, slots) == ("spread",)
    quiet = gang(ps("s", 2, 8))
    assert incoherence(snap(), quiet, slots) == ()


def test_required_leaf_broken_is_a_rule_too() -> None:
    g = gang(ps("s", 2, 8, comm="pipeline", requiredLevel="leaf"))
    slots = [slot("s", 0, "a1", *EIGHT), slot("s", 1, "b0", *EIGHT)]
    assert incoherence(snap(), g, slots) == ("spread", "rules")


def test_split_nvlink_island_or_socket_is_tier() -> None:
    # gb200-tray: GPUs 0-1 on NUMA 0, 2-3 on NUMA 1, NV18 between all: any pair is NVLink.
    g = gang(ps("s", 1, 2, comm="allreduce"))
    assert incoherence(snap(), g, [slot("s", 0, "r1-0", 1, 2)]) == ()
    pcie = cluster_from_data({"nodes": [{"name": "p", "gpuTopology": "pcie-8gpu-2socket"}]}, Path("."))
    assert incoherence(pcie, g, [slot("s", 0, "p", 0, 1)]) == ()  # one PCIe switch
    assert incoherence(pcie, g, [slot("s", 0, "p", 1, 2)]) == ("tier", "rules")  # two switches


def test_colocation_not_met() -> None:
    g = gang(
        ps("prefill", 1, 8),
        ps("decode", 1, 8, comm="kv-transfer", colocateWith={"podSet": "prefill", "level": "leaf"}),
    )
    same_leaf = [slot("prefill", 0, "a1", *EIGHT), slot("decode", 0, "a0", *range(7))]
    apart = [slot("prefill", 0, "a1", *EIGHT), slot("decode", 0, "b0", *EIGHT)]
    g7 = gang(
        ps("prefill", 1, 8),
        ps("decode", 1, 7, comm="kv-transfer", colocateWith={"podSet": "prefill", "level": "leaf"}),
    )
    assert incoherence(snap(), g7, same_leaf) == ()
    assert incoherence(snap(), g, apart) == ("colocation",)


def test_clique_pod_set_inside_one_rack_is_coherent_across_racks_is_not() -> None:
    g = gang(ps("s", 2, 4, comm="alltoall", requiredLevel="clique"))
    one_rack = [slot("s", 0, "r1-0", 0, 1, 2, 3), slot("s", 1, "r1-1", 0, 1, 2, 3)]
    two_racks = [slot("s", 0, "r1-0", 0, 1, 2, 3), slot("s", 1, "r2-0", 0, 1, 2, 3)]
    assert incoherence(snap(), g, one_rack) == ()
    assert incoherence(snap(), g, two_racks) == ("spread", "rules")


@pytest.mark.parametrize(
    ("slots", "words"),
    [
        ([slot("s", 0, "a0", 4, 5, 6, 7)], "GPUs [7] on a0 are not free"),
        ([slot("s", 0, "zz", 0, 1, 2, 3)], "unknown node zz"),
        ([slot("s", 0, "a1", 0, 1, 2)], "3 GPUs for a pod of 4"),
        ([slot("s", 0, "a1", 0, 0, 1, 2)], "names a GPU twice"),
        ([slot("s", 0, "a1", 0, 1, 2, 3), slot("s", 1, "a1", 3, 4, 5, 6)], "GPUs [3] on a1 given twice"),
        ([slot("x", 0, "a1", 0, 1, 2, 3)], "no pod set 'x'"),
        ([], "0 slots for 1 pods"),
    ],
)
def test_unusable_slices(slots: list[PodSlot], words: str) -> None:
    g = gang(ps("s", 1 if len(slots) != 2 else 2, 4))
    problem = unusable(snap(), g, slots)
    assert problem is not None and words in problem


def test_usable_slice() -> None:
    assert unusable(snap(), gang(ps("s", 1, 4)), [slot("s", 0, "a0", 0, 1, 2, 3)]) is None


def test_coherent_level_is_the_finest_switch_level() -> None:
    assert coherent_level(Hierarchy()) == 2  # leaf: under it lie nvl-domain and clique
    custom = Hierarchy((Level("zone", "z"), Level("rack", "r", kind="group")))
    assert coherent_level(custom) == 0
    assert (
        coherent_level(Hierarchy((Level("rack", "r", kind="group"), Level("host-group", "h", kind="group"))))
        == 1
    )
