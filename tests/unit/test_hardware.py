"""Hardware chosen by what it does to goodput: a replica's speed on each GPU model against what
that GPU is worth to the gangs the fleet asks for (extender.placement.hardware)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.compute import compute_us, work_gpus
from extender.httpapi.decide import Decider
from extender.kube.pods import PodInfo
from extender.placement import hardware, scoring
from extender.placement.ledger import Reservation
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest
from extender.placement.slice import Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.placement.step import slice_step
from extender.placement.waiting import DEMAND_MEMORY_S, WaitingGangs
from extender.reservations import ClusterCache
from extender.reservations.reserve import Claim, reserve
from extender.sim.records import speed
from extender.sim.reference import Reference
from extender.sim.templates import builtin_templates
from extender.testing.builders import make_cluster, make_node
from extender.testing.extender import pod_obj
from extender.topology.gpus import PRODUCT_LABEL

H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"


def fleet(*nodes: tuple[str, str, str, int]) -> ClusterSnapshot:
    """Nodes of (name, product, leaf, busy GPUs): HGX H100 boxes and 8-GPU L40S PCIe boxes."""
    built = []
    for name, product, leaf, busy in nodes:
        node = make_node(name).leaf(leaf).spine("s").label(PRODUCT_LABEL, product)
        node = node.hgx_h100() if product == H100 else node.pcie_8gpu_2socket()
        built.append(node.busy(busy))
    return make_cluster(*built).obj()


def template(name: str, gang: str | None = None) -> GangRequest:
    got = builtin_templates()[name]
    return GangRequest(gang or name, got.pod_sets)


def nodes_of(snap: ClusterSnapshot, gang: GangRequest) -> tuple[str, ...]:
    got = place(snap, gang)
    assert isinstance(got, Slice), got
    assert scoring.violations(snap, gang, got.slots) == []
    return got.nodes


def test_speeds_follow_the_datasheets_over_the_models_a_pod_set_may_use() -> None:
    snap = fleet(("h", H100, "a", 0), ("l", L40S, "b", 0))
    small = template("llama-8b-tp1").pod_sets[0]
    got = hardware.speeds(snap, small)
    assert got is not None
    assert got["H100 SXM"] == 1.0  # the fastest model it may use here
    assert got["L40S"] == pytest.approx(362 / 989, rel=1e-3)  # a prefill is arithmetic-bound
    # A pod set pinned to H100 has no other model; one that may land on a model the table does
    # not know has no speeds at all (no hardware term).
    wide = template("deepseek-v3-wideep-4").pod_sets[0]
    assert hardware.speeds(snap, wide) == {"H100 SXM": 1.0}
    box = make_node("x").leaf("b").spine("s").pcie_8gpu_2socket().obj()
    mystery = replace(box, graph=replace(box.graph, model="mystery"))
    assert hardware.speeds(ClusterSnapshot([*snap.nodes, mystery], snap.hierarchy), small) is None


def test_a_tp8_replica_s_speed_counts_its_all_reduces_over_the_node_type_s_links() -> None:
    """An L40S box's TP=8 all-reduces cross PCIe: its speed there is the step time's ratio,
    the judge's, well under what compute alone says; a TP=1 replica has no such term."""
    snap = fleet(("h", H100, "a", 0), ("l", L40S, "b", 0))
    tp8 = template("llama-70b-tp8")
    ps = tp8.pod_sets[0]
    got = hardware.speeds(snap, ps)
    assert got is not None and got["H100 SXM"] == 1.0
    split = work_gpus(ps.comm, ps.count, ps.gpus_per_pod)
    h100, l40s = hardware.node_models(snap)
    assert h100 is not None and l40s is not None
    by_compute = compute_us(ps.model, split, h100) / compute_us(ps.model, split, l40s)
    assert got["L40S"] < 0.6 * by_compute
    # The same ratio the judge gives a run on the L40S box, whose best slice is the H100 box.
    on_l40s = place(snap.only(["l"]), tp8)
    assert isinstance(on_l40s, Slice)
    judged = speed(Reference(snap).best(tp8), slice_step(snap, tp8, on_l40s.slots))
    assert got["L40S"] == pytest.approx(judged, rel=0.02)
    small = template("llama-8b-tp1").pod_sets[0]
    assert hardware.pod_comm_us(small, fit_for(snap.nodes[1].shape)) == 0.0


def test_an_8b_replica_takes_the_h100_while_nothing_waits_and_the_l40s_while_an_h100_only_gang_waits() -> (
    None
):
    snap = fleet(("h", H100, "a", 0), ("l", L40S, "b", 0))
    small = template("llama-8b-tp1")
    assert nodes_of(snap, small) == ("h",)
    wide = template("deepseek-v3-wideep-4")  # wide expert parallelism pinned to HGX H100
    waiting = snap.with_waiting(None, hardware.worth(snap, [wide]))
    assert str(waiting.worth) == "H100 SXM (8-GPU pods) 1.00"
    assert nodes_of(waiting, small) == ("l",)
    # A TP=8 replica that runs on either model waits: the L40S is worth its speed there to it
    # (0.37), still less than the H100 (1) it would lose, so the 8B replica takes the L40S.
    tp8 = template("llama-70b-tp8")
    assert nodes_of(snap.with_waiting(None, hardware.worth(snap, [tp8])), small) == ("l",)


def test_a_small_replica_takes_the_h100_gpus_no_waiting_pod_fits_before_a_whole_node() -> None:
    # A half-used H100 node is worth nothing to a waiting gang of 8-GPU pods: the replica runs
    # there at full H100 speed, not on the whole H100 node the gang needs nor on the L40S.
    snap = fleet(("whole", H100, "a", 0), ("half", H100, "a", 4), ("l", L40S, "b", 0))
    wide = template("deepseek-v3-wideep-4")
    waiting = snap.with_waiting(None, hardware.worth(snap, [wide]))
    assert nodes_of(waiting, template("llama-8b-tp1")) == ("half",)
    small = template("llama-8b-tp1").pod_sets[0]
    # The loss, in GPUs at full speed: the half-used node's worth to the gang (0) less the
    # replica's speed there (1).
    assert hardware.loss(waiting, small, place(waiting, template("llama-8b-tp1")).slots) == -1.0  # type: ignore[union-attr]


def test_the_objective_puts_the_hardware_loss_after_the_clique_gpus_and_before_the_cost() -> None:
    snap = fleet(("h", H100, "a", 0), ("l", L40S, "b", 0))
    small = template("llama-8b-tp1")
    on_h100 = place(snap, small)
    assert isinstance(on_h100, Slice)
    waste, loss, micros = scoring.objective(snap, small, on_h100.slots)
    assert (waste, loss, micros) == (0, -1.0, 0.0)


def test_the_book_counts_worths_and_leaves_out_the_ones_being_placed() -> None:
    snap = fleet(("h", H100, "a", 0), ("l", L40S, "b", 0))
    wide = hardware.gang_worth(snap, template("deepseek-v3-wideep-4"))
    small = hardware.gang_worth(snap, template("llama-8b-tp1"))
    book = hardware.WorthBook()
    for w in (wide, small, small):
        book.add(w)
    assert book.worth().of("H100 SXM", 8) == 1.0 and book.worth().of("L40S", 8) == pytest.approx(
        0.366, abs=1e-3
    )
    assert book.worth(exclude=[wide]).of("H100 SXM", 8) == 1.0  # the 8B replicas' best model is the H100
    assert book.worth(exclude=[wide]).of("H100 SXM", 1) == 1.0
    assert book.worth(exclude=[wide, small, small]) == hardware.NOTHING_WAITS
    book.remove(wide)
    assert book.worth().of("H100 SXM", 8) == 1.0  # still the 8B replicas'
    book.remove(small)
    book.remove(small)
    assert not book.worth()


def test_a_gang_asked_for_counts_as_demand_for_an_hour() -> None:
    snap = fleet(("h", H100, "a", 0), ("l", L40S, "b", 0))
    table = WaitingGangs(started_at=0.0)
    table.asked(snap, template("deepseek-v3-wideep-4", "wide"), 100.0)
    assert table.worth(100.0 + DEMAND_MEMORY_S).of("H100 SXM", 8) == 1.0
    assert table.worth(100.0, exclude=["wide"]) == hardware.NOTHING_WAITS  # its own decision
    assert table.worth(101.0 + DEMAND_MEMORY_S) == hardware.NOTHING_WAITS  # forgotten
    # Asked again, it counts once, from the newest time.
    table.asked(snap, template("deepseek-v3-wideep-4", "wide"), 200.0)
    table.asked(snap, template("deepseek-v3-wideep-4", "wide"), 300.0)
    table.worth(250.0 + DEMAND_MEMORY_S)
    assert table.worth(300.0 + DEMAND_MEMORY_S).of("H100 SXM", 8) == 1.0
    assert table.worth(301.0 + DEMAND_MEMORY_S) == hardware.NOTHING_WAITS


def test_the_reserve_path_keeps_the_h100_for_the_gang_it_was_asked_for() -> None:
    # Leaf a's four H100 nodes would hold a wide-EP gang, but h4 is busy: the gang is asked
    # for and refused. The 8B replica reserved next takes the L40S, and the whole H100 nodes
    # stay free; on the same fleet with nothing asked for, it takes an H100.
    h100s = [(f"h{i}", H100, "a", 8 if i == 4 else 0) for i in range(1, 5)]
    snap = fleet(*h100s, ("l", L40S, "b", 0))
    alone = ClusterCache.from_snapshot(snap, clock=lambda: 0.0)
    first = reserve(alone, template("llama-8b-tp1", "before"), Claim("before"))
    assert isinstance(first, Reservation) and first.slice.nodes[0].startswith("h")
    cache = ClusterCache.from_snapshot(snap, clock=lambda: 0.0)
    # Refused for want of room now (it fits the empty fleet), so it is in demand.
    refused = reserve(cache, template("deepseek-v3-wideep-4", "wide"), Claim("wide"))
    assert isinstance(refused, Unplaceable) and refused.feasible_when_empty, refused
    got = reserve(cache, template("llama-8b-tp1", "after"), Claim("after"))
    assert isinstance(got, Reservation) and got.slice.nodes == ("l",)


def test_a_gpu_pod_outside_gangs_is_scored_by_the_same_hardware_loss() -> None:
    cache = ClusterCache.from_snapshot(fleet(("h", H100, "a", 0), ("l", L40S, "b", 0)), clock=lambda: 0.0)
    pod = PodInfo.from_obj(pod_obj("server", gpus=1))
    decider = Decider(cache)
    assert decider.prioritize(pod, ["h", "l"]).values == [10, 9]  # nothing asked for: the fastest
    cache.waiting.asked(cache.view(), template("deepseek-v3-wideep-4", "wide"), 0.0)
    assert decider.prioritize(pod, ["h", "l"]).values == [9, 10]  # the H100 node is in demand
