"""One writer per object: every SliceReservation write of a controller's run goes through the
cache's store (the fake API records which module made each call), and so does a plain
gang's; Bindings come from the binder alone. tests/conftest.py checks the same after every
test; this file shows the check sees writes and fails on a foreign one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.podgroups.controller import PodGroupController
from extender.controllers.runner import take_lead
from extender.controllers.topology_status.reporter import KubeTopologyStatusApi, node_event
from extender.kube.api import SLICE_RESERVATIONS
from extender.placement.files import load_cluster
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube, foreign_writes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KUEUE, VOLCANO = FIXTURES / "kueue", FIXTURES / "volcano"
STORE = "extender.reservations.store"


def test_a_workload_reserved_bound_and_released_is_written_only_by_the_store() -> None:
    async def go() -> FakeKube:
        api, clock = FakeKube(), FakeClock(1_756_116_005.0)
        for plural, name in (("admissionchecks", "admissioncheck"), ("resourceflavors", "resourceflavor")):
            api.put(plural, load_fixture(f"kueue/{name}.yaml"))
        wl = api.put("workloads", load_fixture("kueue/workload-lws.yaml"))
        cache = ClusterCache.from_snapshot(
            load_cluster(KUEUE / "cluster.yaml"), clock=clock, store=KubeReservationStore(api, clock)
        )
        ctl = AdmissionController(api, cache, CheckConfig(), clock=clock)
        await take_lead(ctl.cache, ctl)
        for ac in api.objects("admissionchecks"):
            await ctl.on_admission_check(None, ac)
        await ctl.on_workload(None, wl)
        (r,) = cache.ledger.reservations()
        cache.bind_slot(r.gang, r.slice.slots[0].key, "vllm-0")
        await cache.flush()
        await ctl.on_workload("DELETED", wl)
        return api

    api = asyncio.run(go())
    writes = api.writes(SLICE_RESERVATIONS)
    labels = [w.label for w in writes]
    assert "apply slicereservations" in labels and "apply slicereservations/status" in labels
    assert labels[-1] == "delete slicereservations"
    assert {w.caller for w in writes} == {STORE}
    assert api.objects(SLICE_RESERVATIONS) == []


def test_a_podgroup_reservation_is_written_only_by_the_store() -> None:
    async def go() -> FakeKube:
        api, clock = FakeKube(), FakeClock(1_000.0)
        cache = ClusterCache.from_snapshot(
            load_cluster(VOLCANO / "cluster.yaml"), clock=clock, store=KubeReservationStore(api, clock)
        )
        ctl = PodGroupController(api, cache, clock=clock)
        ctl.leader = True
        await ctl.on_podgroup("ADDED", api.put("podgroups", load_fixture("volcano/podgroup-llama.yaml")))
        for p in load_fixture("volcano/pods-llama.yaml"):
            await ctl.on_pod("ADDED", p)
        assert cache.reservation("llm/llama-70b") is not None
        return api

    api = asyncio.run(go())
    assert api.writes(SLICE_RESERVATIONS) and {w.caller for w in api.writes(SLICE_RESERVATIONS)} == {STORE}


def test_a_write_from_elsewhere_is_caught(one_writer_per_object: list[FakeKube]) -> None:
    api = FakeKube()
    body = {"apiVersion": "gangslice.io/v1alpha1", "kind": "SliceReservation"}
    asyncio.run(api.apply(SLICE_RESERVATIONS, {**body, "metadata": {"name": "x", "namespace": "llm"}}))
    (bad,) = foreign_writes(api)
    assert bad == f"apply slicereservations llm/x by {__name__}"
    one_writer_per_object.remove(api)  # caught here; the autouse check must not fail the test
    with pytest.raises(ValueError):
        one_writer_per_object.remove(api)


def test_an_object_an_older_writer_left_for_another_owner_is_replaced_not_merged() -> None:
    """After an upgrade, a SliceReservation created by an older gangslice (not this field
    manager) for an earlier owner of the same name: an apply cannot drop that owner
    reference, so the store deletes the object and applies it afresh."""

    async def go() -> FakeKube:
        api, clock = FakeKube(), FakeClock(1_000.0)
        cache = ClusterCache.from_snapshot(
            load_cluster(VOLCANO / "cluster.yaml"), clock=clock, store=KubeReservationStore(api, clock)
        )
        ctl = PodGroupController(api, cache, clock=clock)
        ctl.leader = True
        pg = load_fixture("volcano/podgroup-llama.yaml")
        stale = {"apiVersion": pg["apiVersion"], "kind": "PodGroup", "name": "llama-70b", "uid": "u-earlier"}
        api.put(
            SLICE_RESERVATIONS,
            {"metadata": {"name": "llama-70b", "namespace": "llm", "ownerReferences": [stale]}, "spec": {}},
        )
        await ctl.on_podgroup("ADDED", api.put("podgroups", pg))
        for p in load_fixture("volcano/pods-llama.yaml"):
            await ctl.on_pod("ADDED", p)
        assert cache.reservation("llm/llama-70b") is not None
        return api

    api = asyncio.run(go())
    obj = api.peek(SLICE_RESERVATIONS, "llama-70b", "llm")
    assert obj is not None
    (owner,) = obj["metadata"]["ownerReferences"]
    assert owner["uid"] != "u-earlier" and owner["kind"] == "PodGroup"
    labels = [w.label for w in api.writes(SLICE_RESERVATIONS)]
    assert labels[:3] == ["apply slicereservations", "delete slicereservations", "apply slicereservations"]


def test_the_accepted_condition_is_the_controllers_one_write_to_a_node_topology() -> None:
    """The topology status reconciler writes only the NodeTopology's status, through the one client;
    the agent's writer stays the only writer of the rest."""
    api = FakeKube()
    api.put("nodetopologies", {"metadata": {"name": "n1"}, "spec": {"source": "nvml"}})
    status = KubeTopologyStatusApi(api)
    condition = {"type": "Accepted", "status": "False", "reason": "InvalidSpec", "message": "spec.x: bad"}
    asyncio.run(status.apply_condition("n1", condition))
    asyncio.run(status.create_event(node_event("n1", "spec.x: bad", 0.0)))
    got = api.peek("nodetopologies", "n1", "")
    assert got is not None and got["status"]["conditions"][0]["reason"] == "InvalidSpec"
    assert [e["reason"] for e in api.events] == ["InvalidNodeTopology"]
    assert foreign_writes(api) == []
