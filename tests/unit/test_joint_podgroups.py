"""Gangs across objects: a prefill PodGroup and a decode PodGroup of one joint gang are held
until both exist, then placed as one request (decode colocated with prefill in one NVLink
clique) with one reservation per member made in one pass; a member that never arrives is
named and nothing is held. The KV-transfer cost of the joint placement, computed by
``scoring``, is lower than that of placing the two gangs one after the other."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from extender.controllers import joint
from extender.controllers.podgroups.controller import PodGroupConfig, PodGroupController
from extender.controllers.podgroups.groups import PodGroup, gang_request, pod_infos
from extender.kube.names import STATUS
from extender.placement.files import load_cluster
from extender.placement.ledger import Ledger
from extender.placement.scoring import gang_micros
from extender.placement.slice import PodSlot, Slice
from extender.placement.solver import place
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "volcano"
CLIQUE = "nvidia.com/gpu.clique"
PREFILL, DECODE = "serve/disagg-prefill", "serve/disagg-decode"


def world(wait_s: float = 300.0) -> tuple[PodGroupController, FakeKube, ClusterCache, FakeClock]:
    clock = FakeClock(5_000.0)
    api = FakeKube()
    cache = ClusterCache.from_snapshot(
        load_cluster(FIXTURES / "gb200.yaml"), clock=clock, store=KubeReservationStore(api, clock)
    )
    ctl = PodGroupController(api, cache, PodGroupConfig(member_wait_s=wait_s), clock=clock)
    ctl.leader = True
    return ctl, api, cache, clock


def add(ctl: PodGroupController, api: FakeKube, group: str, pod: dict[str, Any]) -> None:
    asyncio.run(ctl.on_podgroup("ADDED", api.put("podgroups", load_fixture(f"volcano/{group}"))))
    asyncio.run(ctl.on_pod("ADDED", pod))


def status(api: FakeKube, name: str) -> str:
    got = api.peek("podgroups", name, "serve")
    assert got is not None
    return str(got["metadata"]["annotations"].get(STATUS, ""))


def cliques(cache: ClusterCache, slots: list[PodSlot]) -> set[str]:
    snap = cache.snapshot()
    return {snap.node(s.node).labels[CLIQUE] for s in slots}


def test_prefill_and_decode_podgroups_are_placed_together_in_one_clique() -> None:
    ctl, api, cache, _ = world()
    prefill_pod, decode_pod = load_fixture("volcano/pods-disagg.yaml")
    add(ctl, api, "podgroup-prefill.yaml", prefill_pod)
    assert cache.reservation(PREFILL) is None
    assert "waiting for member(s) 1 unnamed member(s) (1 of 2)" in status(api, "disagg-prefill")
    add(ctl, api, "podgroup-decode.yaml", decode_pod)
    pr, dr = cache.reservation(PREFILL), cache.reservation(DECODE)
    assert pr is not None and dr is not None
    assert cliques(cache, [*pr.slice.slots, *dr.slice.slots]) == {"5e1a.2"}
    assert pr.meta["jointGang"] == dr.meta["jointGang"] == "serve/disagg"
    # Each member's slots carry its own pod set names, so the extender pins its tasks.
    assert {s.pod_set for s in pr.slice.slots} == {"p"} and {s.pod_set for s in dr.slice.slots} == {"d"}
    for name in ("disagg-prefill", "disagg-decode"):
        assert status(api, name).startswith("Reserved:")
        assert api.peek("slicereservations", name, "serve") is not None


def test_joint_placement_predicts_a_cheaper_kv_transfer_than_independent_placement() -> None:
    snap = load_cluster(FIXTURES / "gb200.yaml")
    prefill_pod, decode_pod = load_fixture("volcano/pods-disagg.yaml")
    requests = {
        "disagg-prefill": gang_request(
            PodGroup.from_obj(load_fixture("volcano/podgroup-prefill.yaml")), pod_infos([prefill_pod]), snap
        ),
        "disagg-decode": gang_request(
            PodGroup.from_obj(load_fixture("volcano/podgroup-decode.yaml")), pod_infos([decode_pod]), snap
        ),
    }
    colocate = {"disagg-decode": "disagg-prefill@clique"}
    together = joint.joint_request("serve/disagg", requests, colocate, snap.hierarchy)
    decode_set = "disagg-decode.d"

    # Jointly: one request.
    sl = place(snap, together)
    assert isinstance(sl, Slice)
    joint_kv = gang_micros(snap, together, sl.slots)[decode_set]

    # Independently: prefill first (best fit takes the lone free tray of clique 1), then decode.
    ledger = Ledger()
    alone: list[PodSlot] = []
    for member in ("disagg-prefill", "disagg-decode"):
        got = place(ledger.view(snap), requests[member])
        assert isinstance(got, Slice)
        ledger.reserve(got, 0.0)
        alone += [
            PodSlot(f"{member}.{s.pod_set}", s.index, s.node, s.gpus, s.numa_nodes, s.nic) for s in got.slots
        ]
    split_cliques = {snap.node(s.node).labels[CLIQUE] for s in alone}
    assert split_cliques == {"5e1a.1", "5e1a.2"}  # the construction: independent placement splits them
    independent_kv = gang_micros(snap, together, alone)[decode_set]

    assert {snap.node(s.node).labels[CLIQUE] for s in sl.slots} == {"5e1a.2"}
    assert 0 < joint_kv < independent_kv


def test_a_member_that_never_arrives_is_named_and_nothing_is_held() -> None:
    ctl, api, cache, clock = world(wait_s=60)
    _, decode_pod = load_fixture("volcano/pods-disagg.yaml")
    add(ctl, api, "podgroup-decode.yaml", decode_pod)
    assert "waiting for member(s) disagg-prefill" in status(api, "disagg-decode")
    assert api.events == []
    clock.now += 61
    asyncio.run(ctl.resync())
    said = status(api, "disagg-decode")
    assert said.startswith("MemberMissing:") and "disagg-prefill" in said
    assert cache.reservation(DECODE) is None
    assert [(e["reason"], "disagg-prefill" in e["message"]) for e in api.events] == [("MemberMissing", True)]


def test_when_a_member_arrives_late_both_are_placed_then() -> None:
    ctl, api, cache, clock = world(wait_s=60)
    prefill_pod, decode_pod = load_fixture("volcano/pods-disagg.yaml")
    add(ctl, api, "podgroup-decode.yaml", decode_pod)
    clock.now += 61
    asyncio.run(ctl.resync())
    add(ctl, api, "podgroup-prefill.yaml", prefill_pod)
    assert cache.reservation(PREFILL) is not None and cache.reservation(DECODE) is not None


def test_colocate_with_a_pod_set_name_and_unknown_targets() -> None:
    snap = load_cluster(FIXTURES / "gb200.yaml")
    prefill_pod, decode_pod = load_fixture("volcano/pods-disagg.yaml")
    requests = {
        "pre": gang_request(
            PodGroup.from_obj(load_fixture("volcano/podgroup-prefill.yaml")), pod_infos([prefill_pod]), snap
        ),
        "dec": gang_request(
            PodGroup.from_obj(load_fixture("volcano/podgroup-decode.yaml")), pod_infos([decode_pod]), snap
        ),
    }
    got = joint.joint_request("serve/disagg", requests, {"dec": "p"}, snap.hierarchy)
    colo = got.pod_set("dec.d").colocate_with
    assert colo is not None and (colo.pod_set, colo.level) == ("pre.p", "clique")
    try:
        joint.joint_request("serve/disagg", requests, {"dec": "nothing@leaf"}, snap.hierarchy)
    except joint.JointError as exc:
        assert "nothing" in str(exc)
    else:
        raise AssertionError("an unknown colocate-with target was accepted")
    try:
        joint.joint_request("serve/disagg", requests, {"dec": "pre@rack"}, snap.hierarchy)
    except joint.JointError as exc:
        assert "rack" in str(exc)
    else:
        raise AssertionError("an unknown colocate-with level was accepted")


def test_both_controllers_wait_for_members_by_the_same_rule() -> None:
    """The member wait both controllers keep (extender/controllers/joint.py): short until every
    member is there, timed out after the wait, forgotten once complete or given up."""
    one = {"pre": joint.Membership("disagg", 2, "dec")}
    wait = joint.MemberWait()
    assert wait.short("s/disagg", one, 2, now=0.0, wait_s=60) == joint.Short("dec", timed_out=False)
    assert wait.short("s/disagg", one, 2, now=59.0, wait_s=60) == joint.Short("dec", timed_out=False)
    assert wait.short("s/disagg", one, 2, now=60.0, wait_s=60) == joint.Short("dec", timed_out=True)
    wait.forget("s/disagg")
    assert wait.short("s/disagg", one, 2, now=61.0, wait_s=60) == joint.Short("dec", timed_out=False)
    both = {**one, "dec": joint.Membership("disagg", 2)}
    assert wait.short("s/disagg", both, 2, now=200.0, wait_s=60) is None and not wait.since
    objs = [({"gangslice.io/gang": "disagg"}, {"gangslice.io/gang-members": "2"}), ({}, {})]
    objs.append(({"gangslice.io/gang": "disagg"}, {"gangslice.io/gang-members": "one"}))  # unreadable
    found = joint.members(objs, "disagg", lambda o: joint.membership(*o))
    assert [m for _, m in found] == [joint.Membership("disagg", 2)]
