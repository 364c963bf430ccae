"""The simulation on clusters and traces small enough to check every figure by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_solver_cliques import mixed

from extender import cost
from extender.cost import ModelDims
from extender.placement.files import cluster_from_data
from extender.placement.request import GangRequest
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.placement.waiting import KeepCliques
from extender.sim.engine import IMEX_STARTUP_S, Simulation
from extender.sim.metrics import policy_results, quantile, step_mean
from extender.sim.records import PLACED, REJECTED, WITHDRAWN, Point, PolicyRun
from extender.sim.reference import Reference
from extender.sim.trace import Trace, trace_from_data
from extender.testing.builders import make_cluster, make_node
from extender.testing.hardware import CLIQUE, LEAF

#: A node as a cluster file gives it (hostname label) under leaf-1; a case names its hardware.
NODE = make_node().leaf("leaf-1").hostname()


def two_hgx() -> ClusterSnapshot:
    return make_cluster(NODE.named("a").hgx_h100(), NODE.named("b").hgx_h100()).obj()


def tp(gpus: int, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {"podSets": [{"name": "server", "count": count, "gpusPerPod": gpus, **extra}]}


def deploy(at: float, name: str, gang: dict[str, Any], lifetime: float, replicas: int = 1) -> dict[str, Any]:
    """A deployment whose replicas serve as soon as they are placed (no model load) unless the
    gang says ``loadSeconds``."""
    gang = {"loadSeconds": 0, **gang}
    return {"at": at, "deployment": name, "gang": gang, "lifetime": lifetime, "replicas": replicas}


def run(snap: ClusterSnapshot, events: list[dict[str, Any]], policy: Any = place, **kw: Any) -> PolicyRun:
    trace = trace_from_data({"events": events}, "test")
    return Simulation(snap, trace, "p", policy, Reference(snap), **kw).run()


def points(r: PolicyRun) -> list[tuple[float, int, int, int, int]]:
    return [
        (p.t, p.allocated_gpus, p.waiting_gangs, p.whole_free_nodes, p.largest_free_leaf_gpus)
        for p in r.timeline
    ]


def by_name(r: PolicyRun) -> dict[str, Any]:
    return {g.name: g for g in r.gangs}


# -- a policy simple enough to predict: first node with room, lowest free GPUs ------------


def first_fit(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
    taken: dict[int, int] = {}
    slots = []
    for ps in gang.pod_sets:
        for k in range(ps.count):
            for i, node in enumerate(snap.nodes):
                free = snap.free_mask(i) & ~taken.get(i, 0)
                if free.bit_count() >= ps.gpus_per_pod:
                    mask = 0
                    for _ in range(ps.gpus_per_pod):
                        low = free & -free
                        mask |= low
                        free &= ~low
                    taken[i] = taken.get(i, 0) | mask
                    slots.append(PodSlot(ps.name, k, node.name, node.shape.gpus_of(mask)))
                    break
            else:
                return Unplaceable(gang.name, "no room")
    return Slice(gang.name, tuple(slots), {})


def stubborn(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
    """first_fit, except that gangs of deployment ``stuck`` are refused unless the cluster is empty."""
    busy = any(snap.free_mask(i) != n.shape.full_mask for i, n in enumerate(snap.nodes))
    if gang.name.startswith("stuck") and busy:
        return Unplaceable(gang.name, "refused")
    return first_fit(snap, gang)


# -- 2 nodes, 3 gangs, the gangslice solver -------------------------------------------------


def test_two_nodes_three_gangs_every_metric() -> None:
    snap = two_hgx()
    r = run(
        snap,
        [
            deploy(0, "a", tp(8, comm="allreduce"), 100),
            deploy(10, "b", tp(8, comm="allreduce"), 100),
            deploy(20, "c", tp(8, comm="allreduce"), 200),
        ],
    )
    g = by_name(r)
    assert [g[n].outcome for n in ("a-0", "b-0", "c-0")] == [PLACED] * 3
    assert [g[n].waited for n in ("a-0", "b-0", "c-0")] == [0, 0, 80]
    assert g["c-0"].placed_at == 100 and g["c-0"].ended_at == 220
    # C gets the node A left.
    assert g["c-0"].held == g["a-0"].held
    assert points(r) == [
        (0, 8, 0, 1, 8),
        (10, 16, 0, 0, 0),
        (20, 16, 1, 0, 0),
        (100, 16, 0, 0, 0),
        (110, 8, 0, 1, 8),
        (220, 0, 0, 2, 16),
    ]
    res = policy_results(r)
    assert res["gangs"] | {"incoherentBy": None} == {
        "arrived": 3,
        "placed": 3,
        "rejected": 0,
        "withdrawn": 0,
        "neverPlaced": 0,
        "coherent": 3,
        "coherentShare": 1.0,
        "coherentShareOfArrived": 1.0,
        "incoherentBy": None,
    }
    assert res["waitSeconds"]["median"] == 0
    assert res["waitSeconds"]["p99"] == pytest.approx(78.4)  # 0.98 of the way from 0 to 80
    assert res["waitSeconds"]["max"] == 80
    # A TP=8 ring on NVSwitch: NV18 x 50 GB/s between every pair, the seed formula.
    one = cost.tp_layer_us(8, ModelDims(), 900.0, cost.ALPHA_NVLINK_US)
    assert res["perLayerMicros"]["count"] == 3
    assert res["perLayerMicros"]["median"] == pytest.approx(one, rel=1e-5)
    assert res["step"]["vsBest"]["max"] == pytest.approx(1.0)
    assert res["step"]["vsSameHardware"]["median"] == pytest.approx(1.0)
    # Every replica served at its best speed for its whole run: goodput is the GPU-hours held.
    assert res["goodput"]["gpuHours"] == pytest.approx(2560 / 3600, rel=1e-5)
    assert res["goodput"]["demandGpuHours"] == pytest.approx((800 + 800 + 1600) / 3600, rel=1e-5)
    assert res["allocation"]["meanGpus"] == pytest.approx(2560 / 220, rel=1e-5)
    assert res["allocation"]["peakGpus"] == 16
    assert res["allocation"]["gpuHours"] == pytest.approx(2560 / 3600, rel=1e-5)
    assert res["fragmentation"]["minWholeFreeNodes"] == 0
    assert res["fragmentation"]["meanWholeFreeNodes"] == pytest.approx((10 + 110) / 220, rel=1e-5)
    assert res["decisions"]["errors"] == 0


def test_gpu_hours_are_counted_per_node_type_from_placement_to_end() -> None:
    snap = make_cluster(NODE.named("a").hgx_h100(), NODE.named("b").pcie_8gpu_2socket()).obj()
    # Two TP=8 replicas for an hour: the H100 node first (cheapest), the L40S box for the
    # other; then a TP=4 replica arriving at 1,800 s waits until 3,600 s and runs for half an
    # hour on the L40S box: the H100 node stays whole for the TP=8 replicas asked for within
    # the hour, which keep less of their speed on the L40S (0.18) than it does (0.22).
    r = run(
        snap,
        [
            deploy(0, "big", tp(8, comm="allreduce"), 3600, replicas=2),
            deploy(1800, "half", tp(4, comm="allreduce"), 3600),
        ],
    )
    res = policy_results(r)["byTemplate"]
    assert res["big"]["gpuHoursByNodeType"] == {"H100-SXM x8": 8.0, "L40S x8": 8.0}
    g = by_name(r)["half-0"]
    assert (g.placed_at, g.ended_at) == (3600, 5400)
    assert res["half"]["gpuHoursByNodeType"] == {"L40S x8": pytest.approx(2.0)}


def test_no_wait_rejects_what_does_not_fit_on_arrival() -> None:
    r = run(
        two_hgx(),
        [deploy(0, "a", tp(8), 100), deploy(10, "b", tp(8), 100), deploy(20, "c", tp(8), 200)],
        no_wait=True,
    )
    g = by_name(r)
    assert g["c-0"].outcome == REJECTED and g["c-0"].ended_at == 20 and g["c-0"].placed_at is None
    res = policy_results(r)["gangs"]
    assert (res["placed"], res["rejected"], res["neverPlaced"]) == (2, 1, 1)
    assert [p[:3] for p in points(r)] == [(0, 8, 0), (10, 16, 0), (100, 8, 0), (110, 0, 0)]


def test_a_gang_that_can_never_fit_is_never_queued_and_waits_until_withdrawn() -> None:
    r = run(two_hgx(), [deploy(0, "huge", tp(16), 100), deploy(5, "ok", tp(1), 10)])
    g = by_name(r)
    assert g["huge-0"].outcome == REJECTED and g["huge-0"].ended_at == 100
    assert g["huge-0"].waited_until(r.end) == 100
    assert g["ok-0"].outcome == PLACED
    assert r.decision_seconds and len(r.decision_seconds) == 1  # only "ok" was asked in a pass


def test_waiting_gang_is_withdrawn_when_its_deployment_ends() -> None:
    r = run(two_hgx(), [deploy(0, "big", tp(8), 100, replicas=2), deploy(10, "late", tp(8), 30)])
    g = by_name(r)
    assert g["late-0"].outcome == WITHDRAWN and g["late-0"].ended_at == 40
    assert policy_results(r)["gangs"]["withdrawn"] == 1
    assert policy_results(r)["waitSecondsPlaced"]["count"] == 2
    # Every gang that arrived counts: the withdrawn one waited its 30 s.
    assert policy_results(r)["waitSeconds"]["count"] == 3
    assert policy_results(r)["waitSeconds"]["max"] == 30


# -- queue semantics with predictable policies -------------------------------------------


def four_gpu_nodes() -> ClusterSnapshot:
    return make_cluster(NODE.named("n0").l40s_4gpu(), NODE.named("n1").l40s_4gpu()).obj()


def test_backfill_lets_smaller_gangs_pass_a_blocked_head_but_not_larger_ones() -> None:
    r = run(
        four_gpu_nodes(),
        [
            deploy(0, "one", tp(1), 1000),  # n0 GPU 0
            # Refused while anything runs: the blocked head (its own request: the simulator
            # remembers refusals per request, and this policy judges by name).
            deploy(1, "stuck", tp(1, model={"layers": 1}), 99),
            deploy(2, "wide", tp(4), 1000),  # would fit n1, but asks for more than the head
            deploy(3, "small", tp(1), 1000),  # no larger than the head: backfilled
        ],
        policy=stubborn,
    )
    g = by_name(r)
    assert g["small-0"].placed_at == 3
    assert g["stuck-0"].outcome == WITHDRAWN and g["stuck-0"].ended_at == 100
    # Once the head is gone, "wide" is tried at the next pass and fits n1.
    assert g["wide-0"].placed_at == 100
    assert g["wide-0"].held == {1: 0b1111}


def test_scale_up_and_down_removes_waiting_replicas_first_newest_first() -> None:
    events = [
        deploy(0, "web", tp(4), 1000, replicas=1),
        {"at": 10, "scale": "web", "replicas": 4},  # two more fit, one waits
        {"at": 20, "scale": "web", "replicas": 1},  # the waiting ones go, then the newest running
    ]
    r = run(four_gpu_nodes(), events, policy=first_fit)
    g = by_name(r)
    assert [g[f"web-{k}"].outcome for k in range(4)] == [PLACED, PLACED, WITHDRAWN, WITHDRAWN]
    assert g["web-2"].placed_at is None and g["web-2"].ended_at == 20  # was waiting
    assert g["web-1"].placed_at == 10 and g["web-1"].ended_at == 20  # newest running
    assert g["web-0"].ended_at == 1000
    assert [p[:3] for p in points(r)] == [(0, 4, 0), (10, 8, 2), (20, 4, 0), (1000, 0, 0)]


def test_refused_request_is_not_asked_again_until_gpus_come_free() -> None:
    calls: list[str] = []

    def counting(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        calls.append(gang.name)
        return first_fit(snap, gang)

    r = run(
        four_gpu_nodes(),
        [
            deploy(0, "full", tp(4), 100, replicas=2),
            deploy(10, "x", tp(4), 200, replicas=3),  # same request three times
        ],
        policy=counting,
    )
    # One arrival check (full and x ask the same). Passes: full-0, full-1 at 0; x-0 at 10
    # (x-1, x-2 skipped: the same request was refused and nothing came free); at 100: x-0,
    # x-1 placed, x-2 asked and refused.
    assert calls == ["full-0", "full-0", "full-1", "x-0", "x-0", "x-1", "x-2"]
    assert len(r.decision_seconds) == 6
    assert policy_results(r)["decisions"]["refusals"] == 2


def test_unusable_slice_is_refused_and_reported() -> None:
    def liar(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        node = snap.nodes[0]
        return Slice(gang.name, (PodSlot("server", 0, node.name, (0,)),), {})

    r = run(four_gpu_nodes(), [deploy(0, "a", tp(2), 10)], policy=liar)
    assert r.gangs[0].outcome == REJECTED  # even the empty cluster got no usable answer
    assert r.error_count == 1
    assert "1 GPUs for a pod of 2" in str(r.errors[0]["error"])


def test_policy_exception_is_reported_not_raised() -> None:
    calls = [0]

    def flaky(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        calls[0] += 1
        if calls[0] > 1:
            raise RuntimeError("boom")
        return first_fit(snap, gang)

    r = run(four_gpu_nodes(), [deploy(0, "a", tp(1), 10)], policy=flaky)
    assert r.error_count == 1 and r.errors[0]["error"] == "RuntimeError: boom"
    assert policy_results(r)["decisions"]["errors"] == 1


def test_incoherent_slice_is_counted_with_its_reason() -> None:
    # pcie-8gpu-2socket: pairs (0,1) (2,3) share a PCIe switch; first fit puts a TP=2 pod
    # after a TP=1 pod on GPUs 1 and 2, across two switches.
    snap = make_cluster(NODE.named("n0").pcie_8gpu_2socket()).obj()
    r = run(snap, [deploy(0, "a", tp(1), 10), deploy(1, "b", tp(2), 10)], policy=first_fit)
    g = by_name(r)
    assert g["a-0"].coherent is True
    assert g["b-0"].coherent is False and "tier" in g["b-0"].incoherent
    res = policy_results(r)
    assert res["gangs"]["coherentShare"] == 0.5
    assert res["gangs"]["coherentShareOfArrived"] == 0.5
    assert res["gangs"]["incoherentBy"]["tier"] == 1
    # The best slice keeps the pair on one switch; crossing switches costs more.
    assert res["step"]["vsBest"]["max"] > 1.0
    assert res["step"]["vsSameHardware"]["max"] > 1.0


# -- statistics -------------------------------------------------------------------------


def test_quantile_interpolates_between_ranks() -> None:
    assert quantile([3, 1, 2], 0.99) == pytest.approx(2.98)
    assert quantile([5], 0.5) == 5
    assert quantile([1, 2, 3, 4], 0.5) == 2.5


def test_step_mean_weighs_states_by_duration() -> None:
    pts = [Point(0, 4, 0, 0, 0), Point(10, 8, 0, 0, 0), Point(30, 0, 0, 0, 0)]
    assert step_mean(pts, lambda p: p.allocated_gpus, 40) == pytest.approx((4 * 10 + 8 * 20) / 40)


def test_same_trace_twice_gives_the_same_run() -> None:
    snap = two_hgx()
    events = [deploy(0, "a", tp(4), 100, replicas=3), deploy(5, "b", tp(8), 50)]
    trace: Trace = trace_from_data({"events": events}, "t")
    first = policy_results(Simulation(snap, trace, "p", place, Reference(snap)).run())
    second = policy_results(Simulation(snap, trace, "p", place, Reference(snap)).run())
    first.pop("timing")
    second.pop("timing")
    assert first == second


def test_best_slice_search_crash_is_reported_and_the_run_goes_on() -> None:
    def broken(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        raise ValueError("search bug")

    snap = four_gpu_nodes()
    ref = Reference(snap, search=broken)
    trace = trace_from_data({"events": [deploy(0, "a", tp(2, comm="allreduce"), 10)]}, "t")
    r = Simulation(snap, trace, "p", first_fit, ref).run()
    assert r.gangs[0].outcome == PLACED and r.gangs[0].ideal is None
    assert ref.errors == [
        {"gang": "a-0", "error": "ValueError: search bug"},
        {"gang": "a-0", "error": "ValueError: search bug"},
    ]
    res = policy_results(r)
    assert res["step"]["vsBest"]["count"] == 0
    # Nothing to judge its speed by: it counts as served at full speed.
    assert res["goodput"]["gpuHours"] == pytest.approx(res["goodput"]["servedGpuHours"])


# -- allocation modes: on a device-plugin node every policy gets the plugin's choice ------


def _pcie_box(allocation: str) -> ClusterSnapshot:
    """A dual-socket PCIe box with GPUs 5-7 in use: 0-4 free."""
    node = {"name": "p", "gpuTopology": "pcie-8gpu-2socket", "labels": {LEAF: "leaf-1"}}
    return cluster_from_data(
        {"nodes": [{**node, "allocatedGpus": [5, 6, 7], "allocation": allocation}]}, Path(".")
    )


@pytest.mark.parametrize("allocation", ["devicePlugin", "dra"])
def test_every_policy_gets_what_the_node_hands_out(allocation: str) -> None:
    """A 3-GPU TP replica on GPUs 0-4 of the PCIe box. On a DRA node gangslice's claim gets
    0,1,2 (one socket) and spread gets the lowest free ones, the same set. On a device-plugin
    node the plugin answers 0,1,4 (across sockets) whoever chose the node: gangslice, judging
    the node by that answer, does not take it for a pod that must stay in one socket; spread
    takes it and gets the incoherent set."""
    from extender.peers import spread

    snap = _pcie_box(allocation)
    events = [deploy(0, "tp3", tp(3, comm="allreduce", requiredLevel="numa"), 100)]
    ours = by_name(run(snap, events))["tp3-0"]
    theirs = by_name(run(snap, events, spread))["tp3-0"]
    assert theirs.outcome == PLACED
    held = snap.nodes[0].shape.gpus_of(theirs.held[0])
    if allocation == "dra":
        assert ours.outcome == PLACED and ours.coherent
        assert snap.nodes[0].shape.gpus_of(ours.held[0]) == (0, 1, 2) == held
    else:
        assert ours.outcome != PLACED  # waits: no node keeps the socket under the plugin
        assert held == (0, 1, 4) and not theirs.coherent


def test_the_default_fleet_says_which_node_types_are_which() -> None:
    from extender.sim.inputs import default_cluster
    from extender.topology.allocation import Allocation

    modes: dict[str, set[Allocation]] = {}
    for n in default_cluster().nodes:
        modes.setdefault(n.graph.model or "", set()).add(n.allocation)
    assert modes["GB200"] == {Allocation.DRA}  # multi-node NVLink needs the DRA driver
    assert modes["L40S"] == {Allocation.DEVICE_PLUGIN}
    assert modes["H100-SXM"] == {Allocation.DRA, Allocation.DEVICE_PLUGIN}


# -- IMEX start-up on multi-node NVLink ----------------------------------------------------------


def one_clique(trays: int = 2) -> ClusterSnapshot:
    data = {
        "nodes": [
            {"name": f"t{i}", "gpuTopology": "gb200-tray", "labels": {LEAF: "rack", CLIQUE: "u.1"}}
            for i in range(trays)
        ]
    }
    return cluster_from_data(data, Path("."))


@pytest.mark.parametrize("policy", ["gangslice", "binpack", "kueue-tas"])
def test_a_gang_across_a_clique_waits_for_imex_start_up_whatever_placed_it(policy: str) -> None:
    """The pods of a gang whose pod set spans trays of a clique start only once its
    ComputeDomain's IMEX daemons are up; a gang on one tray joins no domain."""
    from extender.peers import POLICIES

    events = [
        deploy(0, "wide", tp(4, count=2, comm="alltoall", requiredLevel="clique"), 100),
        deploy(200, "solo", tp(4, comm="allreduce"), 100),
    ]
    r = run(one_clique(), events, POLICIES[policy])
    g = by_name(r)
    assert g["wide-0"].mnnvl and g["wide-0"].imex_s == IMEX_STARTUP_S
    assert g["wide-0"].placed_at == 0 and g["wide-0"].waited == IMEX_STARTUP_S
    assert g["solo-0"].mnnvl == () and g["solo-0"].waited == 0
    res = policy_results(r)
    assert res["imexStartup"] == {"gangs": 1, "seconds": IMEX_STARTUP_S}
    assert res["waitSeconds"]["max"] == IMEX_STARTUP_S
    # The figure is the run's to choose, and placement does not move with it.
    quick = run(one_clique(), events, POLICIES[policy], imex_startup_s=5.0)
    assert by_name(quick)["wide-0"].waited == 5.0
    assert [x.held for x in quick.gangs] == [x.held for x in r.gangs]


def test_each_call_says_whether_another_queued_gang_asks_for_a_clique() -> None:
    """What the extender knows of the queue (every other gang in it) reaches the policy as
    the snapshot's clique demand; the gang being placed does not count for itself, and the
    check on arrival (on the empty cluster) reads no demand at all."""
    seen: dict[str, list[bool | None]] = {}

    def spy(snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        seen.setdefault(gang.name.split("-")[0], []).append(snap.clique_demand)
        # The wide gang waits until the 2-GPU replica is gone.
        return (
            Unplaceable(gang.name, "busy")
            if gang.name.startswith("wide") and snap.reserved
            else first_fit(snap, gang)
        )

    wide = tp(4, count=4, comm="alltoall", requiredLevel="clique")
    events = [
        deploy(0.0, "small", tp(2), 10.0),
        deploy(1.0, "wide", wide, 10.0),
        deploy(2.0, "late", tp(2), 5.0),
    ]
    r = run(mixed(), events, spy)
    assert seen["small"] == [None, False]  # on the empty cluster, then alone in the queue
    assert set(seen["wide"][1:]) == {False}  # its own request is no demand
    assert seen["late"] == [True]  # the wide gang waits (the arrival check of its shape was made)
    assert by_name(r)["wide-0"].placed_at == 10.0
    seen.clear()
    run(mixed(), events, spy, keep_cliques=KeepCliques.ALWAYS)
    assert {d for calls in seen.values() for d in calls} == {None}  # kept whatever waits
