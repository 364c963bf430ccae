"""The reservation ledger: idempotent holds, TTLs refreshed by binds, views, persistence."""

from __future__ import annotations

import json

import pytest

from extender.cost import Comm
from extender.placement.ledger import Ledger, LedgerError, Phase, Reservation
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import place
from extender.topology.hierarchy import Hierarchy, Level
from extender.topology.presets import preset_graph

CLIQUE = "nvidia.com/gpu.clique"


def snapshot() -> ClusterSnapshot:
    hgx = preset_graph("hgx-h100")
    tray = preset_graph("gb200-tray")
    nodes = [NodeState(f"h{i}", {}, hgx) for i in range(2)]
    nodes += [NodeState(f"t{i}", {CLIQUE: "nvl72.0"}, tray) for i in range(2)]
    return ClusterSnapshot(nodes, Hierarchy((Level("clique", CLIQUE, kind="fabric"),)))


def sl(gang: str, *slots: tuple[str, tuple[int, ...]], mnnvl: tuple[str, ...] = ()) -> Slice:
    pods = tuple(PodSlot("p", k, node, gpus) for k, (node, gpus) in enumerate(slots))
    return Slice(gang, pods, {"p": 1.0}, 1.0, {"p": "node x"}, (), mnnvl)


def test_reserve_is_idempotent() -> None:
    ledger = Ledger(ttl_s=60)
    first = ledger.reserve(sl("a", ("h0", (0, 1))), now=0.0)
    again = ledger.reserve(sl("a", ("h1", (4, 5))), now=10.0)
    assert again == first
    assert again.slice.slots[0].node == "h0"  # the held slice, not the new one
    assert again.expires_at == 60.0
    assert len(ledger) == 1 and "a" in ledger
    assert ledger.held() == {"h0": frozenset({0, 1})}


def test_overlapping_reserve_is_refused() -> None:
    ledger = Ledger()
    ledger.reserve(sl("a", ("h0", (0, 1, 2, 3))), now=0.0)
    with pytest.raises(LedgerError, match=r"GPUs \[3\] on h0 are already reserved"):
        ledger.reserve(sl("b", ("h0", (3, 4))), now=0.0)
    assert "b" not in ledger
    ledger.reserve(sl("c", ("h0", (4, 5))), now=0.0)  # disjoint GPUs of the same node are fine
    assert ledger.held() == {"h0": frozenset({0, 1, 2, 3, 4, 5})}


def test_bind_refreshes_the_ttl_and_completion_binds_for_good() -> None:
    ledger = Ledger(ttl_s=100)
    ledger.reserve(sl("a", ("h0", (0,)), ("h0", (1,))), now=0.0)
    r = ledger.bind("a", "p/0", "pod-0", now=80.0)
    assert r.expires_at == 180.0 and r.phase == Phase.RESERVED
    assert ledger.expire(150.0) == []  # would have expired at 100 without the bind
    assert ledger.bind("a", "p/0", "pod-0", now=170.0) == r  # the same pod again: no change
    with pytest.raises(LedgerError, match="already bound to pod-0"):
        ledger.bind("a", "p/0", "pod-x", now=170.0)
    with pytest.raises(KeyError):
        ledger.bind("a", "p/9", "pod-9", now=170.0)
    r = ledger.bind("a", "p/1", "pod-1", now=170.0)
    assert r.phase == Phase.BOUND and r.complete
    assert r.slot_of("pod-1") == r.slice.slot("p/1")
    assert ledger.expire(1e9) == []  # fully bound: never expires
    assert "a" in ledger
    r = ledger.unbind("a", "p/1")  # a pod went away: the hold is open (and expiring) again
    assert r.phase == Phase.RESERVED and [s.key for s in r.free_slots()] == ["p/1"]


def test_expire_drops_only_the_stale_holds() -> None:
    ledger = Ledger(ttl_s=100)
    ledger.reserve(sl("old", ("h0", (0,))), now=0.0)
    ledger.reserve(sl("new", ("h0", (1,))), now=50.0)
    ledger.reserve(sl("bound", ("h0", (2,))), now=0.0)
    ledger.bind("bound", "p/0", "pod", now=0.0)
    gone = ledger.expire(120.0)
    assert [(r.gang, r.phase) for r in gone] == [("old", Phase.EXPIRED)]
    assert sorted(r.gang for r in ledger.reservations()) == ["bound", "new"]
    assert ledger.held() == {"h0": frozenset({1, 2})}


def test_release_returns_the_capacity() -> None:
    ledger = Ledger()
    ledger.reserve(sl("a", ("h0", (0,))), now=0.0)
    released = ledger.release("a")
    assert released is not None and released.phase == Phase.RELEASED
    assert ledger.release("a") is None
    assert ledger.held() == {}


def test_view_hides_held_capacity_from_the_solver() -> None:
    snap = snapshot()
    ledger = Ledger()
    gang = GangRequest("a", (PodSet("p", 2, 8, Comm.ALLREDUCE),))
    first = place(snap, gang)
    assert isinstance(first, Slice)
    ledger.reserve(first, now=0.0)
    view = ledger.view(snap)
    assert view.free_gpus("h0") == frozenset() and view.free_gpus("h1") == frozenset()
    assert snap.free_gpus("h0") == frozenset(range(8))  # the snapshot itself is untouched
    other = GangRequest("b", (PodSet("p", 1, 8, Comm.ALLREDUCE),))
    assert isinstance(place(view, other), Unplaceable)
    # The gang's own hold is not in its way (re-placing it after a restart, say).
    again = place(ledger.view(snap, exclude=["a"]), gang)
    assert isinstance(again, Slice) and set(again.nodes) == {"h0", "h1"}


def test_view_carries_the_held_nvlink_channels() -> None:
    ledger = Ledger()
    ledger.reserve(sl("a", ("t0", (0, 1)), ("t1", (0, 1)), mnnvl=("t0", "t1")), now=0.0)
    view = ledger.view(snapshot())
    assert [view.mnnvl_owner(view.index(n)) for n in ("t0", "t1", "h0")] == ["a", "a", None]
    assert ledger.view(snapshot(), exclude=["a"]).mnnvl_owner(view.index("t0")) is None


def test_round_trip_rebuilds_an_identical_ledger() -> None:
    snap = snapshot()
    ledger = Ledger(ttl_s=42)
    for name, gpus in (("a", 8), ("b", 4)):
        got = place(ledger.view(snap), GangRequest(name, (PodSet("p", 2, gpus, Comm.ALLREDUCE),)))
        assert isinstance(got, Slice)
        ledger.reserve(got, now=1.5, meta={"namespace": "ml", "owner": name})
    ledger.bind("a", "p/0", "a-0", now=2.0)
    data = json.loads(json.dumps(ledger.to_dict()))  # plain data, as an adapter stores it
    rebuilt = Ledger.from_dict(data)
    assert rebuilt.to_dict() == ledger.to_dict()
    assert rebuilt.ttl_s == 42
    assert rebuilt.held() == ledger.held() and rebuilt.mnnvl() == ledger.mnnvl()
    for r in ledger.reservations():
        back = rebuilt.get(r.gang)
        assert back is not None
        assert (back.slice.slots, back.bound, back.phase, back.meta, back.expires_at) == (
            r.slice.slots,
            r.bound,
            r.phase,
            r.meta,
            r.expires_at,
        )
    assert Ledger.from_dict(rebuilt.to_dict()).to_dict() == data


def test_restore_never_double_books() -> None:
    ledger = Ledger()
    a = Reservation("a", sl("a", ("h0", (0, 1))), expires_at=10.0)
    ledger.restore(a)
    ledger.restore(Reservation("a", sl("a", ("h1", (0, 1))), expires_at=99.0))  # duplicate: first kept
    assert ledger.get("a") == a
    with pytest.raises(LedgerError, match=r"conflicts with another: GPUs \[1\] on h0 are already reserved"):
        ledger.restore(Reservation("b", sl("b", ("h0", (1, 2))), expires_at=10.0))
    assert "b" not in ledger
    # Reservations that ended before the restart are not brought back.
    ledger.restore(Reservation("c", sl("c", ("h1", (0,))), 10.0, phase=Phase.RELEASED))
    ledger.restore(Reservation("d", sl("d", ("h1", (1,))), 10.0, phase=Phase.EXPIRED))
    assert [r.gang for r in ledger.reservations()] == ["a"]
    assert ledger.held() == {"h0": frozenset({0, 1})}


def test_from_dict_with_duplicated_and_overlapping_entries() -> None:
    a = Reservation("a", sl("a", ("h0", (0, 1))), expires_at=10.0).to_dict()
    a_again = Reservation("a", sl("a", ("h1", (0, 1))), expires_at=20.0).to_dict()
    rebuilt = Ledger.from_dict({"ttlSeconds": 5, "reservations": [a, a_again]})
    assert rebuilt.held() == {"h0": frozenset({0, 1})}
    assert [(s.gang, s.reason) for s in rebuilt.skipped] == [
        ("a", "entry 1 repeats gang a; the first one is kept")
    ]


def test_from_dict_skips_a_conflicting_entry_and_keeps_the_rest() -> None:
    """One bad entry costs that entry only: the reservations after it still come back, the
    conflicting one is reported with why, and nothing is booked twice."""
    a = Reservation("a", sl("a", ("h0", (0, 1))), expires_at=10.0).to_dict()
    clash = Reservation("b", sl("b", ("h0", (1,))), expires_at=10.0).to_dict()
    imex = Reservation("c", sl("c", ("t0", (0,)), ("t1", (0,)), mnnvl=("t0", "t1")), 10.0).to_dict()
    imex_clash = Reservation("d", sl("d", ("t1", (1,)), ("t0", (1,)), mnnvl=("t0", "t1")), 10.0).to_dict()
    after = Reservation("e", sl("e", ("h1", (0,))), expires_at=10.0).to_dict()
    unreadable = {"gang": "f", "slice": {"gang": "f"}}  # no expiresAt
    rebuilt = Ledger.from_dict({"reservations": [a, clash, imex, imex_clash, unreadable, after]})
    assert sorted(r.gang for r in rebuilt.reservations()) == ["a", "c", "e"]
    assert rebuilt.held() == {
        "h0": frozenset({0, 1}),
        "h1": frozenset({0}),
        "t0": frozenset({0}),
        "t1": frozenset({0}),
    }
    assert rebuilt.mnnvl() == {"t0": "c", "t1": "c"}
    assert [s.gang for s in rebuilt.skipped] == ["b", "d", "f"]
    reasons = [s.reason for s in rebuilt.skipped]
    assert reasons[0] == (
        "entry 1: gang b: persisted reservation conflicts with another: GPUs [1] on h0 are already reserved"
    )
    assert reasons[1].endswith("the NVLink (IMEX) channel of t0 is already reserved by gang c"), reasons[1]
    assert reasons[2].startswith("entry 4 cannot be read: KeyError"), reasons[2]
    # A clean rebuild reports nothing.
    assert Ledger.from_dict(rebuilt.to_dict()).skipped == ()


def test_reserve_refuses_a_second_multi_node_nvlink_gang_on_a_node() -> None:
    """One IMEX channel per node: two reservations whose slices use multi-node NVLink on a
    shared node are never both held, even on disjoint GPUs."""
    ledger = Ledger()
    ledger.reserve(sl("a", ("t0", (0, 1)), ("t1", (0, 1)), mnnvl=("t0", "t1")), now=0.0)
    second = sl("b", ("t1", (2, 3)), ("t0", (2, 3)), mnnvl=("t0", "t1"))
    with pytest.raises(LedgerError, match="NVLink \\(IMEX\\) channel of t0 is already reserved by gang a"):
        ledger.reserve(second, now=0.0)
    assert "b" not in ledger and ledger.mnnvl() == {"t0": "a", "t1": "a"}
    with pytest.raises(LedgerError, match="channel of t0"):
        ledger.restore(Reservation("b", second, expires_at=10.0))
    assert "b" not in ledger
    # The same GPUs without a multi-node NVLink claim (one pod per node, say) are fine.
    ledger.reserve(sl("c", ("t1", (2, 3))), now=0.0)
    # Once the first is released the second fits.
    ledger.release("a")
    ledger.release("c")
    assert ledger.reserve(second, now=1.0).gang == "b"


def test_expire_spares_holds_whose_owner_manages_them() -> None:
    ledger = Ledger(ttl_s=10)
    ledger.reserve(sl("ns/kueue", ("n0", (0, 1))), now=0, meta={"ownerKind": "Workload"})
    ledger.reserve(sl("ns/plain", ("n0", (2, 3))), now=0)
    gone = ledger.expire(100, keep=lambda r: r.meta.get("ownerKind") == "Workload")
    assert [r.gang for r in gone] == ["ns/plain"]
    assert "ns/kueue" in ledger
