"""Ties among one-node placements of equal cost: a pod set without a required level takes the
tightest node first, as Kueue sorts every node at once for such pod sets; one with a required
level takes the fullest domain first (tests/unit/test_solver.py)."""

from __future__ import annotations

from extender.cost import Comm
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.testing.builders import make_cluster, make_node


def two_leaves() -> ClusterSnapshot:
    """Leaf a, the fullest: two nodes with 3 free GPUs each (6). Leaf b: one node with 1 free
    GPU and one with 6 (7). Every node an HGX H100."""
    hgx = make_node().hgx_h100()
    nodes = [hgx.named("a0").leaf("a").busy(5), hgx.named("a1").leaf("a").busy(5)]
    nodes += [hgx.named("b0").leaf("b").busy(7), hgx.named("b1").leaf("b").busy(2)]
    return make_cluster(*nodes).levels("leaf").obj()


def only_node(got: object) -> str:
    assert isinstance(got, Slice), got
    (name,) = set(got.nodes)
    return name


def test_an_unconstrained_pod_set_takes_the_tightest_node_even_in_an_emptier_domain() -> None:
    got = place(two_leaves(), GangRequest("g", (PodSet("w", 1, 1, Comm.NONE),)))
    assert only_node(got) == "b0"  # its last free GPU; leaf a's nodes keep room for 2-3 GPU pods


def test_a_leaf_required_pod_set_takes_the_fullest_leaf_first() -> None:
    got = place(two_leaves(), GangRequest("g", (PodSet("w", 1, 1, Comm.NONE, required_level="leaf"),)))
    assert only_node(got) in {"a0", "a1"}
