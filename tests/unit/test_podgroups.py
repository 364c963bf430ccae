"""Volcano PodGroups as gangs: recorded PodGroup and Pod objects (validated against the shipped
Volcano CRD), the request they imply, networkTopology mapped onto our levels by tier, the
controller's reservation and annotations (409 retried), the Volcano extender letting the job
in and pinning each task, and the release on completion or deletion."""

from __future__ import annotations

import asyncio
import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from extender.controllers.openapi import load_crd, validate, version_schema
from extender.controllers.podgroups.controller import PodGroupConfig, PodGroupController
from extender.controllers.podgroups.groups import (
    PodGroup,
    PodGroupError,
    Topology,
    gang_request,
    level_tiers,
    member_of,
    pod_infos,
    topology_level,
)
from extender.controllers.runner import take_lead
from extender.httpapi.decide import Decider
from extender.kube.api import Conflict
from extender.kube.names import RESERVATION, STATUS
from extender.kube.pods import PodInfo
from extender.placement.files import load_cluster
from extender.placement.snapshot import ClusterSnapshot
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "volcano"
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "volcano"
KEY = "llm/llama-70b"


@cache
def podgroup_schema() -> dict[str, Any]:
    return version_schema(load_crd(UPSTREAM / "scheduling.volcano.sh_podgroups.yaml"), "v1beta1")


def snapshot(name: str = "cluster.yaml") -> ClusterSnapshot:
    return load_cluster(FIXTURES / name)


class World:
    def __init__(self, cluster: str = "cluster.yaml", config: PodGroupConfig | None = None) -> None:
        self.clock = FakeClock(1_000.0)
        self.api = FakeKube()
        self.cache = ClusterCache.from_snapshot(
            snapshot(cluster), clock=self.clock, store=KubeReservationStore(self.api, self.clock)
        )
        self.ctl = PodGroupController(self.api, self.cache, config, clock=self.clock)
        self.ctl.leader = True

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    def add_group(self, obj: dict[str, Any]) -> dict[str, Any]:
        stored = self.api.put("podgroups", obj)
        self.run(self.ctl.on_podgroup("ADDED", stored))
        return stored

    def add_pods(self, pods: list[dict[str, Any]]) -> None:
        for p in pods:
            self.run(self.ctl.on_pod("ADDED", p))

    def group(self, ns: str = "llm", name: str = "llama-70b") -> dict[str, Any]:
        got = self.api.peek("podgroups", name, ns)
        assert got is not None
        return got


# -- recorded objects ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["podgroup-llama.yaml", "podgroup-prefill.yaml", "podgroup-decode.yaml"])
def test_recorded_podgroups_are_valid_against_the_volcano_crd(name: str) -> None:
    validate(podgroup_schema(), load_fixture(f"volcano/{name}"), name)


def test_a_podgroup_the_crd_refuses_is_caught_by_the_schema_check() -> None:
    bad = copy.deepcopy(load_fixture("volcano/podgroup-llama.yaml"))
    bad["spec"]["networkTopology"]["mode"] = "strict"
    with pytest.raises(ValueError):
        validate(podgroup_schema(), bad, "bad")


def test_pods_of_a_volcano_job_are_members_of_its_podgroup() -> None:
    pods = load_fixture("volcano/pods-llama.yaml")
    assert {member_of(p) for p in pods} == {KEY}
    other = copy.deepcopy(pods[0])
    other["spec"]["schedulerName"] = "default-scheduler"
    assert member_of(other) is None


# -- the request ---------------------------------------------------------------------------------


def test_roles_become_pod_sets_with_the_podgroup_comm_and_hard_tier_1_as_required_leaf() -> None:
    pg = PodGroup.from_obj(load_fixture("volcano/podgroup-llama.yaml"))
    req = gang_request(pg, pod_infos(load_fixture("volcano/pods-llama.yaml")), snapshot())
    sets = {ps.name: ps for ps in req.pod_sets}
    assert req.name == KEY
    assert (sets["leader"].count, sets["worker"].count) == (1, 3)
    assert sets["worker"].gpus_per_pod == 8
    assert sets["worker"].comm.value == "allreduce"
    # Levels present: spine (tier 2) and leaf (tier 1, the finest).
    assert sets["leader"].required_level == sets["worker"].required_level == "leaf"


def test_tiers_count_from_the_finest_level_any_node_is_labelled_with() -> None:
    snap = snapshot("gb200.yaml")
    h = snap.hierarchy
    assert {t: h.levels[i].name for t, i in level_tiers(h, snap).items()} == {1: "clique", 2: "leaf"}
    assert topology_level(Topology(tier=1), h, snap) == "clique"
    assert topology_level(Topology(tier=2), h, snap) == "leaf"
    assert topology_level(Topology(tier=3), h, snap) is None  # Volcano's cluster root: no bound
    assert topology_level(Topology(tier=0), h, snap) == "node"
    assert topology_level(Topology(tier_name="leaf"), h, snap) == "leaf"
    with pytest.raises(PodGroupError, match="rack"):
        topology_level(Topology(tier_name="rack"), h, snap)


def test_soft_mode_is_a_preferred_level_and_a_finer_pod_level_wins() -> None:
    obj = copy.deepcopy(load_fixture("volcano/podgroup-llama.yaml"))
    obj["spec"]["networkTopology"] = {"mode": "soft", "highestTierName": "spine"}
    pods = load_fixture("volcano/pods-llama.yaml")
    pods[0]["metadata"]["annotations"]["gangslice.io/required-level"] = "node"
    req = gang_request(PodGroup.from_obj(obj), pod_infos(pods), snapshot())
    sets = {ps.name: ps for ps in req.pod_sets}
    assert sets["worker"].preferred_level == "spine"
    assert sets["worker"].required_level is None
    assert sets["leader"].required_level == "node"


def test_both_tier_fields_at_once_are_refused() -> None:
    obj = copy.deepcopy(load_fixture("volcano/podgroup-llama.yaml"))
    obj["spec"]["networkTopology"] = {"mode": "hard", "highestTierAllowed": 1, "highestTierName": "leaf"}
    with pytest.raises(PodGroupError, match="both"):
        PodGroup.from_obj(obj)


# -- the controller ------------------------------------------------------------------------------


def test_the_controller_waits_for_min_member_pods_then_reserves_one_leaf_and_annotates() -> None:
    w = World()
    w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
    pods = load_fixture("volcano/pods-llama.yaml")
    w.add_pods(pods[:3])
    assert w.cache.reservation(KEY) is None
    assert w.group()["metadata"]["annotations"][STATUS].startswith("Waiting: waiting for 1 more")
    w.add_pods(pods[3:])
    r = w.cache.reservation(KEY)
    assert r is not None
    assert len({n[0] for n in r.slice.nodes}) == 1  # all four nodes under one leaf
    ann = w.group()["metadata"]["annotations"]
    assert ann[RESERVATION] == "llama-70b"
    assert ann[STATUS].startswith("Reserved: slice llama-70b: 4 pods, 32 GPUs")
    # The SliceReservation is owned by the PodGroup (deleting the group deletes it).
    obj = w.api.peek("slicereservations", "llama-70b", "llm")
    assert obj is not None
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "PodGroup",
        "llama-70b",
        w.group()["metadata"]["uid"],
    )
    assert [e["reason"] for e in w.api.events] == ["SliceReserved"]
    # The annotations we did not write are kept.
    assert ann["gangslice.io/comm"] == "allreduce"


def test_the_volcano_extender_pins_each_task_to_its_slot_once_reserved() -> None:
    w = World()
    w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
    pods = pod_infos(load_fixture("volcano/pods-llama.yaml"))
    decider = Decider(w.cache)
    names = w.cache.node_names()
    before = decider.filter(pods[0], names, KEY)
    assert not before.passed and before.outcome == "waiting"
    w.add_pods(load_fixture("volcano/pods-llama.yaml"))
    r = w.cache.reservation(KEY)
    assert r is not None
    leader = decider.filter(pods[0], names, KEY)
    assert set(leader.passed) == {s.node for s in r.slice.slots if s.pod_set == "leader"}
    worker = decider.filter(pods[1], names, KEY)
    assert set(worker.passed) == {s.node for s in r.slice.slots if s.pod_set == "worker"}


def test_an_annotation_write_that_meets_409_reads_again_and_retries() -> None:
    w = World()
    w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
    w.api.fail_next("replace podgroups", Conflict(409, "the object has been modified"))
    w.api.fail_next("replace podgroups", Conflict(409, "the object has been modified"))
    w.add_pods(load_fixture("volcano/pods-llama.yaml"))
    ann = w.group()["metadata"]["annotations"]
    assert ann[RESERVATION] == "llama-70b"
    assert w.api.labels().count("get podgroups") >= 2


def test_a_stale_resource_version_is_refused_by_the_api_and_then_written_fresh() -> None:
    w = World()
    w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
    # Volcano updates the group's status after our copy was taken: our copy is stale.
    fresh = w.group()
    fresh["status"]["phase"] = "Inqueue"
    w.api.put("podgroups", fresh)
    w.add_pods(load_fixture("volcano/pods-llama.yaml"))
    got = w.group()
    assert got["status"]["phase"] == "Inqueue"  # Volcano's write survived ours
    assert got["metadata"]["annotations"][RESERVATION] == "llama-70b"


def test_completed_or_deleted_podgroups_release_their_slice() -> None:
    for how in ("Completed", "DELETED"):
        w = World()
        w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
        w.add_pods(load_fixture("volcano/pods-llama.yaml"))
        assert w.cache.reservation(KEY) is not None
        if how == "DELETED":
            w.run(w.ctl.on_podgroup("DELETED", w.group()))
        else:
            done = w.group()
            done["status"]["phase"] = "Completed"
            w.run(w.ctl.on_podgroup("MODIFIED", w.api.put("podgroups", done)))
        assert w.cache.reservation(KEY) is None, how
        assert w.api.peek("slicereservations", "llama-70b", "llm") is None, how


def test_a_gang_that_can_never_fit_says_so_with_a_warning_event() -> None:
    w = World()
    obj = copy.deepcopy(load_fixture("volcano/podgroup-llama.yaml"))
    obj["spec"]["minMember"] = 2
    w.add_group(obj)
    pods = load_fixture("volcano/pods-llama.yaml")[:2]
    for p in pods:
        p["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "16"}}
    w.add_pods(pods)
    assert w.cache.reservation(KEY) is None
    status = w.group()["metadata"]["annotations"][STATUS]
    assert status.startswith("NeverFits:")
    assert [(e["type"], e["reason"]) for e in w.api.events] == [("Warning", "NeverFits")]
    # A resync says nothing new.
    w.run(w.ctl.resync())
    assert len(w.api.events) == 1


def test_a_podgroup_hold_outlives_its_ttl_while_the_podgroup_lives() -> None:
    """The PodGroup controller, not the clock, ends a PodGroup's hold: past the TTL the cache
    keeps it and a resync leaves the same slice in place."""
    w = World(config=PodGroupConfig(hold_ttl_s=60))
    w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
    w.add_pods(load_fixture("volcano/pods-llama.yaml"))
    before = w.cache.reservation(KEY)
    assert before is not None
    w.clock.now += 61
    assert w.cache.expire() == []
    w.run(w.ctl.resync())
    after = w.cache.reservation(KEY)
    assert after is not None and after.slice == before.slice


def test_leadership_releases_reservations_whose_podgroup_is_gone() -> None:
    w = World()
    w.add_group(load_fixture("volcano/podgroup-llama.yaml"))
    w.add_pods(load_fixture("volcano/pods-llama.yaml"))
    w.api.remove("podgroups", "llama-70b", "llm")
    standby = PodGroupController(w.api, w.cache, clock=w.clock)
    w.run(take_lead(standby.cache, standby))
    assert w.cache.reservation(KEY) is None


def test_a_pod_info_reads_the_volcano_role_as_its_pod_set() -> None:
    pod = PodInfo.from_obj(load_fixture("volcano/pods-llama.yaml")[1])
    assert pod.pod_set == "worker"
    assert pod.volcano_group == KEY


def test_an_unknown_level_annotation_makes_the_group_invalid_with_a_warning() -> None:
    w = World()
    obj = copy.deepcopy(load_fixture("volcano/podgroup-llama.yaml"))
    obj["metadata"]["annotations"]["gangslice.io/preferred-level"] = "rack"
    w.add_group(obj)
    w.add_pods(load_fixture("volcano/pods-llama.yaml"))
    assert w.cache.reservation(KEY) is None
    status = w.group()["metadata"]["annotations"][STATUS]
    assert status.startswith("Invalid:") and "rack" in status
    assert [e["reason"] for e in w.api.events] == ["InvalidGang"]
