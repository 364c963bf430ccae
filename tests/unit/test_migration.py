"""Draining a domain for a waiting gang: the cheapest domain, movers on hardware at least as
fast, all or nothing (extender.placement.migration)."""

from __future__ import annotations

from collections.abc import Sequence

from extender.cost import Comm, ModelDims
from extender.placement import scoring
from extender.placement.migration import Mover, plan_drain
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.migrating import Migrating
from extender.sim.records import Plan, Running
from extender.testing.builders import make_cluster, make_node
from extender.topology.gpus import PRODUCT_LABEL

H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
SMALL = ModelDims(hidden_size=4096, layers=32, tokens=2048, parameters=8.03e9)
WIDE = GangRequest("wide", (PodSet("experts", 2, 8, Comm.ALLTOALL, required_level="leaf"),))


def fleet(nodes: Sequence[tuple[str, str, str, Sequence[int]]]) -> ClusterSnapshot:
    """Nodes of (name, product, leaf, GPUs held by running replicas)."""
    built = []
    for name, product, leaf, _ in nodes:
        node = make_node(name).leaf(leaf).spine("s").label(PRODUCT_LABEL, product)
        node = node.hgx_h100() if product == H100 else node.pcie_8gpu_2socket()
        built.append(node)
    snap = make_cluster(*built).obj()
    return snap.with_held({n: frozenset(g) for n, _, _, g in nodes if g}, {})


def replica(name: str, node: str, gpus: Sequence[int], restart_s: float = 60.0) -> Mover:
    gang = GangRequest(name, (PodSet("server", 1, len(gpus), model=SMALL),))
    return Mover(gang, (PodSlot("server", 0, node, tuple(gpus)),), restart_s)


def test_the_domain_cheapest_to_drain_is_drained_and_the_movers_land_outside_the_slice() -> None:
    # Leaves a and b each hold the wide gang once one replica leaves; b's replica restarts for
    # longer. Leaf c has room for a replica (a half-used H100 node).
    snap = fleet(
        [
            ("a1", H100, "a", [0]),
            ("a2", H100, "a", []),
            ("b1", H100, "b", [0]),
            ("b2", H100, "b", []),
            ("c1", H100, "c", [0, 1, 2, 3, 4, 5, 6]),
        ]
    )
    movers = [replica("cheap", "a1", [0], 30.0), replica("dear", "b1", [0], 300.0)]
    got = plan_drain(snap, WIDE, movers)
    assert got is not None
    assert got.domain == "leaf a" and got.restart_gpu_s == 30.0
    assert set(got.slice.nodes) == {"a1", "a2"}
    [move] = got.moves
    assert move.gang == "cheap" and [s.node for s in move.slots] in (["b2"], ["b1"], ["c1"])
    # The gang's slice is free once the mover leaves, and the mover's slot is free now.
    after = snap.without({"a1": frozenset({0})})
    assert scoring.violations(after, WIDE, got.slice.slots) == []
    assert set(move.slots[0].gpus) <= snap.free_gpus(move.slots[0].node)
    taken = {(s.node, g) for s in got.slice.slots for g in s.gpus}
    assert not {(s.node, g) for s in move.slots for g in s.gpus} & taken


def test_movers_only_land_on_hardware_at_least_as_fast() -> None:
    # The only room outside leaf a is an L40S box: the H100 replica may not go there.
    snap = fleet([("a1", H100, "a", [0]), ("a2", H100, "a", []), ("l1", L40S, "b", [])])
    assert plan_drain(snap, WIDE, [replica("r", "a1", [0])]) is None
    # An L40S replica may move to an H100 (faster).
    snap = fleet([("a1", L40S, "a", [0]), ("a2", L40S, "a", []), ("h1", H100, "b", [0, 1, 2, 3])])
    wide = GangRequest("wide", (PodSet("experts", 2, 8, Comm.ALLTOALL, required_level="leaf"),))
    got = plan_drain(snap, wide, [replica("r", "a1", [0])])
    assert got is not None and [m.slots[0].node for m in got.moves] == ["h1"]


def test_a_plan_is_all_or_nothing() -> None:
    # Two replicas block leaf a; room outside it for one only.
    snap = fleet(
        [
            ("a1", H100, "a", [0]),
            ("a2", H100, "a", [0]),
            ("c1", H100, "c", [0, 1, 2, 3, 4, 5, 6]),
        ]
    )
    assert plan_drain(snap, WIDE, [replica("r1", "a1", [0]), replica("r2", "a2", [0])]) is None
    # With room for both, both move.
    snap = fleet([("a1", H100, "a", [0]), ("a2", H100, "a", [0]), ("c1", H100, "c", [0, 1, 2, 3, 4, 5])])
    got = plan_drain(snap, WIDE, [replica("r1", "a1", [0]), replica("r2", "a2", [0])])
    assert got is not None and sorted(m.gang for m in got.moves) == ["r1", "r2"]
    assert got.restart_gpu_s == 120.0


def test_replicas_not_in_the_way_stay_and_multi_pod_gangs_never_move() -> None:
    snap = fleet([("a1", H100, "a", [0]), ("a2", H100, "a", []), ("c1", H100, "c", [0, 1, 2, 3])])
    pair = GangRequest("pair", (PodSet("server", 2, 1, Comm.ALLREDUCE),))
    stuck = Mover(pair, (PodSlot("server", 0, "a1", (0,)), PodSlot("server", 1, "a1", (0,))), 60.0)
    assert plan_drain(snap, WIDE, [stuck]) is None
    # A one-node gang without a required level drains one node: the one whose replica is cheapest.
    tp8 = GangRequest("tp8", (PodSet("server", 1, 8, Comm.ALLREDUCE),))
    snap = fleet([("a1", H100, "a", [0]), ("a2", H100, "a", [0]), ("c1", H100, "c", [0, 1, 2, 3])])
    got = plan_drain(snap, tp8, [replica("r1", "a1", [0], 90.0), replica("r2", "a2", [0], 45.0)])
    assert got is not None and got.slice.nodes == ("a2",) and [m.gang for m in got.moves] == ["r2"]


def test_the_simulators_policy_moves_only_for_a_gang_that_waited() -> None:
    snap = fleet([("a1", H100, "a", [0]), ("a2", H100, "a", []), ("c1", H100, "c", [0, 1, 2, 3])])
    r = replica("r", "a1", [0])
    running = [Running("r", None, r.gang, r.slots, 60.0)]
    policy = Migrating(after_s=600.0)
    assert not isinstance(policy.plan(snap, WIDE, running, waited_s=10.0), Plan)
    got = policy.plan(snap, WIDE, running, waited_s=600.0)
    assert isinstance(got, Plan) and isinstance(got.placement, Slice)
    assert [m.gang for m in got.moves] == ["r"]
    # A replica its owner does not let move stays.
    pinned = [Running("r", None, r.gang, r.slots, 60.0, movable=False)]
    assert not isinstance(policy.plan(snap, WIDE, pinned, waited_s=600.0), Plan)
