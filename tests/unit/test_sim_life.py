"""A fleet that lives: rollouts, node failures, moves with their restart, and what goodput,
waits and starvation make of them, on hand-made traces with a predictable policy."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_sim_engine import NODE, by_name, deploy, first_fit, four_gpu_nodes, run, tp

from extender.placement.files import cluster_from_data, load_cluster
from extender.placement.migration import Move
from extender.placement.request import GangRequest
from extender.placement.slice import Placement, PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.engine import Simulation
from extender.sim.generate import demand_gpu_hours, generate_trace
from extender.sim.inputs import default_cluster, fitted_day, schedulable_gpus
from extender.sim.life import Life
from extender.sim.metrics import policy_results, starvation
from extender.sim.records import MOVED, NODE_LOST, Plan, Running
from extender.sim.reference import Reference
from extender.sim.trace import trace_from_data
from extender.testing.builders import make_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


# -- rollouts ----------------------------------------------------------------------------------


def test_a_deployment_rolls_one_surge_replica_at_a_time() -> None:
    # Two 4-GPU nodes, one replica of 2 GPUs: the default RollingUpdate (maxSurge 25 % of 1,
    # rounded up: 1; maxUnavailable 0) adds the new replica first and retires the old one once
    # the new one serves (60 s of model load).
    r = run(
        four_gpu_nodes(),
        [deploy(0, "web", {**tp(2), "loadSeconds": 60}, 1000), {"at": 100, "rollout": "web"}],
        policy=first_fit,
    )
    g = by_name(r)
    old, new = g["web-0"], g["web-1"]
    assert (old.revision, new.revision) == (0, 1)
    assert new.arrived == 100 and new.placed_at == 100
    assert old.ended_at == 160  # when the new one became ready
    assert new.ended_at == 1000
    # The old one served 60..160, the new one 160..1000: no gap.
    res = policy_results(r)
    assert res["goodput"]["servedGpuHours"] == pytest.approx(2 * (100 + 840) / 3600)
    assert res["goodput"]["loadGpuHours"] == pytest.approx(2 * 120 / 3600)


def test_a_surge_replica_that_finds_no_room_waits_and_the_old_one_keeps_serving() -> None:
    snap = make_cluster(NODE.named("n0").l40s_4gpu()).obj()
    r = run(snap, [deploy(0, "web", tp(4), 1000), {"at": 100, "rollout": "web"}], policy=first_fit)
    g = by_name(r)
    assert g["web-1"].placed_at is None and g["web-1"].ended_at == 1000  # never found room
    assert g["web-0"].ended_at == 1000  # maxUnavailable 0: never retired
    assert g["web-0"].run is None and g["web-0"].runs[0].served_s(r.end) == 1000


def test_a_leader_worker_set_replaces_one_group_at_a_time() -> None:
    # maxSurge 0, maxUnavailable 1: retire one group, place its successor, wait until it
    # serves, then the next.
    gang = {**{**tp(4), "loadSeconds": 50}, "owner": "LeaderWorkerSet"}
    r = run(
        four_gpu_nodes(),
        [deploy(0, "lws", gang, 1000, replicas=2), {"at": 100, "rollout": "lws"}],
        policy=first_fit,
    )
    g = by_name(r)
    assert [g[f"lws-{k}"].revision for k in range(4)] == [0, 0, 1, 1]
    first_old = min((g["lws-0"], g["lws-1"]), key=lambda x: x.ended_at or 0)
    second_old = max((g["lws-0"], g["lws-1"]), key=lambda x: x.ended_at or 0)
    assert first_old.ended_at == 100 and g["lws-2"].placed_at == 100
    assert second_old.ended_at == 150 and g["lws-3"].placed_at == 150
    assert g["lws-2"].held == first_old.held  # the group's successor takes its GPUs


def test_fenceposts_follow_the_owners_defaults() -> None:
    assert Life().fenceposts(1) == (1, 0)
    assert Life().fenceposts(4) == (1, 1)
    assert Life().fenceposts(10) == (3, 2)  # 25 %: surge rounds up, unavailable down
    assert Life("LeaderWorkerSet").fenceposts(4) == (0, 1)
    assert Life(max_surge=0, max_unavailable=0).fenceposts(3) == (0, 1)  # both 0: one unavailable


# -- node failures -----------------------------------------------------------------------------


def test_a_failed_node_loses_its_replicas_which_restart_elsewhere_and_it_comes_back() -> None:
    events = [
        deploy(0, "a", {**tp(4), "loadSeconds": 30}, 1000),
        deploy(0, "b", {**tp(4), "loadSeconds": 30}, 1000),
        deploy(0, "c", {**tp(4), "loadSeconds": 30}, 1000),
        {"at": 200, "nodeDown": "n0", "repairAfter": 300},
    ]
    snap = make_cluster(*(NODE.named(f"n{i}").l40s_4gpu() for i in range(4))).obj()
    r = run(snap, events, policy=first_fit)
    g = by_name(r)
    a = g["a-0"]  # on n0, then on the free n3
    assert [(x.placed_at, x.ended_at, x.cause) for x in a.runs] == [
        (0, 200, NODE_LOST),
        (200, 1000, "departed"),
    ]
    assert a.runs[1].restart and a.runs[1].held == {3: 0b1111} and a.runs[1].ready_at == 230
    assert a.waited == 0  # the first wait; the restart is charged as GPU-hours, below
    res = policy_results(r)
    assert res["goodput"]["restarts"] == {"nodeLost": 1, "moved": 0}
    assert res["goodput"]["restartGpuHours"] == pytest.approx(4 * 30 / 3600)
    assert max(p.nodes_down for p in r.timeline) == 1 and r.timeline[-1].nodes_down == 0


# -- moves -------------------------------------------------------------------------------------


class Mover:
    """first_fit that, when a gang does not fit, moves the first running replica of deployment
    ``small`` to the last node with room and retries."""

    def __init__(self, bad: bool = False) -> None:
        self.bad = bad

    def __call__(self, snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        return first_fit(snap, gang)

    def plan(
        self, snap: ClusterSnapshot, gang: GangRequest, running: Sequence[Running], waited_s: float = 0.0
    ) -> Placement | Plan:
        got = first_fit(snap, gang)
        if isinstance(got, Slice) or gang.name.startswith("small"):
            return got
        small = next(r for r in running if r.name.startswith("small"))
        target = snap.nodes[-1]
        gpus = (0,) if self.bad else (target.shape.gpus_of(snap.free_mask(len(snap.nodes) - 1))[0],)
        move = Move(small.name, (PodSlot("server", 0, target.name, gpus),))
        slots = (PodSlot("server", 0, snap.nodes[0].name, (0, 1, 2, 3)),)
        return Plan(Slice(gang.name, slots, {}), (move,))


def move_cluster() -> ClusterSnapshot:
    """Two 4-GPU nodes, three GPUs of n1 taken by something else."""
    nodes = [
        {"name": "n0", "gpuTopology": "l40s-4gpu"},
        {"name": "n1", "gpuTopology": "l40s-4gpu", "allocatedGpus": [0, 1, 2]},
    ]
    return cluster_from_data({"nodes": nodes}, Path("."))


def move_trace() -> list[dict[str, Any]]:
    return [
        deploy(0, "small", {**tp(1), "loadSeconds": 100}, 1000),  # n0 GPU 0
        deploy(10, "big", tp(4), 1000),  # needs a whole node: n0 once small moves to n1's GPU 3
    ]


def test_a_move_restarts_the_replica_and_charges_its_load() -> None:
    r = run(move_cluster(), move_trace(), policy=Mover())
    g = by_name(r)
    small, big = g["small-0"], g["big-0"]
    assert big.placed_at == 10 and big.held == {0: 0b1111}
    runs = [(x.placed_at, x.ended_at, x.cause) for x in small.runs]
    assert runs == [(0, 10, MOVED), (10, 1000, "departed")]
    assert small.runs[1].held == {1: 0b1000} and small.runs[1].ready_at == 110
    assert r.moves == 1
    res = policy_results(r)
    assert res["moves"] == 1
    assert res["goodput"]["restarts"] == {"nodeLost": 0, "moved": 1}
    # Its first load was 0..10 (cut short by the move), the restart's 10..110.
    assert res["goodput"]["loadGpuHours"] == pytest.approx(10 / 3600)
    assert res["goodput"]["restartGpuHours"] == pytest.approx(100 / 3600)
    assert res["goodput"]["servedGpuHours"] == pytest.approx((890 + 4 * 1000) / 3600, rel=1e-5)


def test_a_plan_with_a_move_that_breaks_the_capacity_rules_is_refused_whole() -> None:
    r = run(move_cluster(), move_trace(), policy=Mover(bad=True))  # moves onto a taken GPU
    g = by_name(r)
    assert g["big-0"].placed_at == 1000  # only once small left of itself
    assert len(g["small-0"].runs) == 1 and g["small-0"].runs[0].ended_at == 1000  # never moved
    assert r.moves == 0 and r.error_count >= 1 and "move of small-0" in str(r.errors[0]["error"])


# -- goodput, censored waits, starvation -------------------------------------------------------


def test_goodput_waits_and_starvation_on_three_gangs() -> None:
    # One 4-GPU node. "a" (4 GPUs) runs 0..100; "b" (4 GPUs) arrives at 10, waits until 100,
    # runs to 300; "c" (4 GPUs) arrives at 20 and is withdrawn at 200 without ever running.
    snap = make_cluster(NODE.named("n0").l40s_4gpu()).obj()
    events = [deploy(0, "a", tp(4), 100), deploy(10, "b", tp(4), 290), deploy(20, "c", tp(4), 180)]
    r = run(snap, events, policy=first_fit)
    res = policy_results(r)
    assert res["goodput"]["demandGpuHours"] == pytest.approx(4 * (100 + 290 + 180) / 3600)
    assert res["goodput"]["servedGpuHours"] == pytest.approx(4 * (100 + 200) / 3600)
    assert res["goodput"]["neverPlacedGangs"] == 1 and res["goodput"]["neverPlacedGpus"] == 4
    # Every gang counts in the waits: 0, 90 and c's 180 until withdrawn.
    assert res["waitSeconds"]["max"] == 180 and res["waitSeconds"]["median"] == 90
    assert res["waitSecondsPlaced"]["max"] == 90
    # On its only node each served at its best speed.
    assert res["goodput"]["gpuHours"] == pytest.approx(res["goodput"]["servedGpuHours"])
    # Starvation: a policy that serves c's template and another that serves none of it.
    mine = {
        "goodput": {"demandGpuHours": 10.0},
        "byTemplate": {"c": {"demandGpuHours": 5.0, "servedShare": 0.2}},
    }
    best = {
        "goodput": {"demandGpuHours": 10.0},
        "byTemplate": {"c": {"demandGpuHours": 5.0, "servedShare": 0.7}},
    }
    tiny = {
        "goodput": {"demandGpuHours": 1000.0},
        "byTemplate": {"c": {"demandGpuHours": 5.0, "servedShare": 0.0}},
    }
    gaps = starvation({"mine": mine, "best": best, "tiny": tiny})
    assert gaps["mine"]["gapPoints"] == pytest.approx(50.0) and gaps["mine"]["template"] == "c"
    assert gaps["best"]["gapPoints"] == pytest.approx(-50.0)
    assert gaps["tiny"]["gapPoints"] is None  # c is under 1 % of its day's demand: not judged


def test_a_slower_slice_delivers_less_goodput() -> None:
    # One H100 node and one L40S box; a 1-GPU 8B replica is fastest on the H100.
    snap = make_cluster(NODE.named("h").hgx_h100(), NODE.named("p").pcie_8gpu_2socket()).obj()
    llama = {
        "podSets": [{"name": "s", "count": 1, "gpusPerPod": 1, "model": {"parameters": "8B", "tokens": 2048}}]
    }

    def last_node(s: ClusterSnapshot, gang: GangRequest) -> Placement:
        return Slice(gang.name, (PodSlot("s", 0, s.nodes[-1].name, (0,)),), {})

    trace = trace_from_data({"events": [deploy(0, "x", llama, 3600)]}, "t")
    r = Simulation(snap, trace, "p", last_node, Reference(snap)).run()
    res = policy_results(r)
    assert res["step"]["vsBest"]["median"] == pytest.approx(989 / 362, rel=1e-3)
    assert res["goodput"]["gpuHours"] == pytest.approx(362 / 989, rel=1e-3)


# -- the generated day -------------------------------------------------------------------------


def test_the_generated_day_lives() -> None:
    fleet = default_cluster()
    trace = generate_trace(2, fleet=fleet)
    assert trace.rollouts and trace.scales and trace.node_downs is not None
    assert generate_trace(2, fleet=fleet) == trace  # same seed, same day
    assert all(f.node in {n.name for n in fleet.nodes} and f.repair_s >= 1800 for f in trace.node_downs)
    names = {d.name for d in trace.deployments}
    assert all(r.deployment in names for r in trace.rollouts)


@pytest.mark.parametrize(
    "path",
    [None, *sorted(glob.glob(str(EXAMPLES / "clusters" / "*.yaml")))],
    ids=lambda p: Path(p or "default").stem,
)
def test_the_day_is_sized_to_every_shipped_fleet(path: str | None) -> None:
    fleet = default_cluster() if path is None else load_cluster(path)
    trace, _ = fitted_day(1, fleet)
    load = demand_gpu_hours(trace) / (schedulable_gpus(fleet) * 24)
    assert 1.1 <= load <= 1.3, load
