"""Cliques are kept whole only while a gang that asks for one waits (then one, the freest)
or while that is not known."""

from __future__ import annotations

from test_solver_cliques import mixed, one, two_cliques

from extender.cost import Comm
from extender.placement import scoring
from extender.placement.ledger import Reservation
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.placement.waiting import (
    WAITING_TTL_S,
    KeepCliques,
    WaitingGangs,
    clique_demand,
    needs_clique,
    with_demand,
)
from extender.reservations import ClusterCache
from extender.reservations.reserve import Claim, reserve
from extender.sim.inputs import default_cluster
from extender.sim.templates import builtin_templates
from extender.testing.builders import make_cluster, make_node

WIDE = one("wide", 4, 4, Comm.ALLTOALL, required_level="clique")


def test_a_small_gang_takes_a_tray_only_when_no_gang_asking_for_a_clique_waits() -> None:
    # TP=4 is faster on a GB200 tray than on one socket of the PCIe box (the HGX node is full).
    snap = mixed(hgx=range(8))
    tp4 = one("tp4", 1, 4)
    for demand in (None, True):
        got = place(snap.with_clique_demand(demand), tp4)
        assert isinstance(got, Slice) and got.nodes == ("pcie",), demand
    free = snap.with_clique_demand(False)
    got = place(free, tp4)
    assert isinstance(got, Slice) and got.nodes[0].startswith("tray")
    assert scoring.fabric_waste(free, tp4, got.slots) == 0
    assert scoring.fabric_waste(snap, tp4, got.slots) == 4


def test_while_a_gang_waits_only_the_whole_clique_with_the_most_free_gpus_is_kept() -> None:
    # Clique 0's tray t00 runs a gang over the fabric (it holds the IMEX channel: the rack is
    # not spilled), so clique 1 has more free GPUs. A TP=2 replica takes the HGX node while
    # every whole clique is kept, and a tray of clique 0 while only clique 1 is.
    base = two_cliques()
    snap = ClusterSnapshot(base.nodes, base.hierarchy, {"t00": frozenset(range(4))}, {"t00": "wide"})
    c0, c1 = snap.clique(snap.index("t00")), snap.clique(snap.index("t10"))
    assert snap.spilled_cliques() == frozenset()
    tp2 = one("tp2", 1, 2)
    unknown = snap.with_clique_demand(None)
    assert unknown.kept_cliques() == {c0, c1}
    got = place(unknown, tp2)
    assert isinstance(got, Slice) and got.nodes == ("hgx",)
    waiting = snap.with_clique_demand(True)
    assert waiting.kept_cliques() == {c1}
    got = place(waiting, tp2)
    assert isinstance(got, Slice) and got.nodes == ("t01",)
    assert scoring.fabric_waste(waiting, tp2, got.slots) == 0
    assert scoring.fabric_waste(unknown, tp2, got.slots) == 2
    assert snap.with_clique_demand(False).kept_cliques() == frozenset()
    # Equally free whole cliques: the first by topology path is kept.
    assert base.with_clique_demand(True).kept_cliques() == {c0}
    # A spilled clique is never kept; the other one is, whatever its free GPUs.
    spilled = two_cliques(t11=(0,))
    assert spilled.with_clique_demand(True).kept_cliques() == {c0}


def test_with_demand_reads_the_waiting_gangs() -> None:
    snap = mixed()
    assert with_demand(snap, None).clique_demand is None
    assert with_demand(snap, clique_demand(snap, [])).clique_demand is False
    assert with_demand(snap, clique_demand(snap, [one("tp2", 1, 2), WIDE])).clique_demand is True
    assert with_demand(snap, clique_demand(snap, [one("tp2", 1, 2)])).clique_demand is False
    # A fleet without a clique level has nothing to keep.
    flat = make_cluster(make_node("a").hgx_h100().leaf("leaf-1")).levels("leaf").obj()
    assert with_demand(flat, clique_demand(flat, [WIDE])).clique_demand is None


def test_what_asks_for_a_clique() -> None:
    snap = mixed()
    colocated = GangRequest(
        "pd",
        (
            PodSet("prefill", 1, 4, Comm.ALLTOALL),
            PodSet("decode", 1, 4, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "clique")),
        ),
    )
    assert needs_clique(snap, colocated)
    assert needs_clique(
        snap, GangRequest("pref", (PodSet("p", 2, 4, Comm.ALLTOALL, preferred_level="clique"),))
    )
    # Spanning nodes that a clique could join is no request for one: it runs elsewhere too.
    assert not needs_clique(snap, one("span", 4, 4, Comm.ALLTOALL))
    templates = builtin_templates()
    fleet = default_cluster()
    asking = {name for name, g in templates.items() if needs_clique(fleet, g)}
    assert asking == {"deepseek-v3-wideep-nvl72-8", "deepseek-v3-wideep-nvl72-16", "deepseek-v3-pd-nvl72"}


def test_waiting_gangs_are_unknown_at_first_then_refused_until_placed_or_stale() -> None:
    snap = mixed()
    w = WaitingGangs(started_at=0.0)
    w.refused(snap, WIDE, 10.0)
    assert w.demand(WAITING_TTL_S / 2) is None  # a refusal before a restart is not known yet
    assert w.demand(WAITING_TTL_S) is True and len(w) == 1
    assert w.demand(WAITING_TTL_S, exclude=["wide"]) is False
    w.refused(snap, WIDE, WAITING_TTL_S)  # refused again: the clock starts again
    assert w.demand(2 * WAITING_TTL_S) is True and len(w) == 1
    assert w.demand(2 * WAITING_TTL_S + 1) is False  # not refused for longer than the TTL: gone
    assert len(w) == 0
    w.refused(snap, WIDE, 0.0)
    w.placed("wide")
    assert w.demand(WAITING_TTL_S) is False and len(w) == 0


def test_keep_always_knows_no_demand() -> None:
    w = WaitingGangs(started_at=0.0, keep=KeepCliques.ALWAYS)
    w.refused(mixed(), one("tp2", 1, 2), WAITING_TTL_S)
    assert w.view(mixed(), 2 * WAITING_TTL_S).clique_demand is None
    assert with_demand(mixed(), False, KeepCliques.ALWAYS).clique_demand is None


def test_waiting_gangs_keep_the_newest_refusals_within_the_limit() -> None:
    w = WaitingGangs(started_at=0.0, limit=2)
    w.refused(mixed(), WIDE, 0.0)
    for k in range(2):
        w.refused(mixed(), one(f"g{k}", 1, 1), float(k + 1))
    # The oldest refusal (the wide gang's) went first: the two newest are left, neither asks.
    assert len(w) == 2 and w.demand(WAITING_TTL_S) is False
    assert w.demand(WAITING_TTL_S, exclude=["g0"]) is False


def test_the_reserve_path_notes_refusals_and_gives_the_solver_the_demand() -> None:
    now = [0.0]
    cache = ClusterCache.from_snapshot(mixed(), clock=lambda: now[0])
    seen: list[bool | None] = []
    room = {"wide": False}

    def solve(view: ClusterSnapshot, gang: GangRequest) -> Placement:
        seen.append(view.clique_demand)
        if not room.get(gang.name, True):
            return Unplaceable(gang.name, "no room")
        return place(view, gang)

    def hold(gang: str, request: GangRequest) -> Reservation | Unplaceable:
        return reserve(cache, request, Claim(gang), solve=solve)

    assert isinstance(hold("wide", WIDE), Unplaceable)
    assert seen == [None]  # the first TTL after start: refusals before it are not known
    now[0] = WAITING_TTL_S
    assert isinstance(hold("tp2", one("tp2", 1, 2)), Reservation)
    assert seen[-1] is True  # the wide gang waits
    assert isinstance(hold("wide", WIDE), Unplaceable)
    assert seen[-1] is False  # its own refusal is no demand for its own placement
    # A gang that can never fit is refused before the solver and not noted as waiting.
    assert isinstance(hold("huge", one("huge", 64, 8)), Unplaceable)
    assert len(cache.waiting) == 1 and cache.waiting.demand(now[0]) is True  # the wide gang alone
    room["wide"] = True
    assert isinstance(hold("wide", WIDE), Reservation)
    assert len(cache.waiting) == 0 and cache.waiting.demand(now[0]) is False


def test_one_view_gives_one_copy_per_demand_until_it_changes() -> None:
    snap = mixed()
    kept = snap.with_clique_demand(True)
    assert kept is snap.with_clique_demand(True) and kept.clique_demand is True
    assert snap.with_clique_demand(None) is snap and snap.clique_demand is None
    changed = snap.updated({}, {"tray0": frozenset({0})}, {}, ["tray0"])
    assert changed.with_clique_demand(True) is not kept
    assert changed.with_clique_demand(True).free_gpus("tray0") == frozenset({1, 2, 3})
