"""The ledger is rebuilt from the SliceReservations exactly once when a replica becomes
leader, for every component that reads it (the extender, the Kueue check, the PodGroup
controller), and not by the watches: a standby's ledger stays empty until it leads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from extender.controllers.objects import reservation_to_object
from extender.kube.api import SLICE_RESERVATIONS, Kind
from extender.placement.files import load_cluster
from extender.placement.ledger import Reservation
from extender.placement.request import GangRequest, PodSet
from extender.reservations import ClusterCache
from extender.reservations.reserve import Claim, reserve
from extender.reservations.store import KubeReservationStore
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube
from extender.testing.leading import lead

VOLCANO = Path(__file__).resolve().parents[1] / "fixtures" / "volcano"


def persisted(api: FakeKube, cache: ClusterCache, gang: str, gpus: int, owner: Any = None) -> Reservation:
    """A reservation an earlier leader left as an object (placed on ``cache``, a scratch copy)."""
    got = reserve(cache, GangRequest(gang, (PodSet("w", 1, gpus),)), Claim(gang))
    assert isinstance(got, Reservation)
    ns, name = gang.split("/")
    api.put(SLICE_RESERVATIONS, reservation_to_object(got, ns, name, owner))
    return got


def test_a_new_leader_rebuilds_the_ledger_once_for_every_component() -> None:
    async def body() -> tuple[FakeKube, ClusterCache, list[bool], Reservation]:
        api = FakeKube()
        snap = load_cluster(VOLCANO / "cluster.yaml")
        scratch = ClusterCache.from_snapshot(snap)
        kept = persisted(api, scratch, "llm/kept", 8)
        pg = api.put("podgroups", load_fixture("volcano/podgroup-llama.yaml"))
        owner = {"apiVersion": pg["apiVersion"], "kind": "PodGroup", "name": "gone", "uid": "u-gone"}
        persisted(api, scratch, "llm/gone", 8, owner)
        orphan_meta = {"ownerKind": "PodGroup", "ownerName": "gone", "ownerUid": "u-gone"}
        obj = api.peek(SLICE_RESERVATIONS, "gone", "llm")
        assert obj is not None
        obj["spec"]["meta"] |= orphan_meta
        api.put(SLICE_RESERVATIONS, obj)  # a PodGroup's hold whose PodGroup no longer exists

        cache = ClusterCache.from_snapshot(snap, store=KubeReservationStore(api))
        # The cache's watch of SliceReservations does not fill the ledger: only leading does.
        cache.replace(Kind.SLICE_RESERVATIONS, api.objects(SLICE_RESERVATIONS))
        assert len(cache.ledger) == 0 and cache.rebuilds == 0

        leading: list[bool] = []
        task, stop = await lead(cache, api, leading)
        for _ in range(5):  # a few more lease renewals: no further rebuild
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 10)
        return api, cache, leading, kept

    api, cache, leading, kept = asyncio.run(body())
    assert leading == [True, False]
    assert cache.rebuilds == 1
    assert api.labels().count("list slicereservations") == 1
    # Both controllers (Kueue and Volcano are served by the fake) acted on the rebuilt ledger:
    # the kept hold is back, the PodGroup controller released the orphan and its object.
    back = cache.reservation("llm/kept")
    assert back is not None and back.slice.to_dict() == kept.slice.to_dict()
    assert cache.reservation("llm/gone") is None
    assert [o["metadata"]["name"] for o in api.objects(SLICE_RESERVATIONS)] == ["kept"]


def test_serve_without_an_election_rebuilds_before_it_listens_and_waits_for_the_api() -> None:
    from extender.httpapi.server import rebuild_before_serving
    from extender.kube.api import Unavailable

    api = FakeKube()
    snap = load_cluster(VOLCANO / "cluster.yaml")
    kept = persisted(api, ClusterCache.from_snapshot(snap), "llm/kept", 8)
    cache = ClusterCache.from_snapshot(snap, store=KubeReservationStore(api))
    api.fail_next("list slicereservations", Unavailable(0, "connection refused"))
    asyncio.run(rebuild_before_serving(cache, retry_s=0.01))
    assert api.labels().count("list slicereservations") == 2  # failed, then done
    assert cache.rebuilds == 1
    back = cache.reservation("llm/kept")
    assert back is not None and back.slice.to_dict() == kept.slice.to_dict()
