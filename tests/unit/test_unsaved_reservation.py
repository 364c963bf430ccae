"""A filter promises a reservation only once it is saved: when the SliceReservation of the
slice a plain gang's first filter placed cannot be written, the hold is released and every
node is unschedulable with the reason (it used to be logged and queued while the filter
still let the pod on); the next filter places the gang afresh."""

from __future__ import annotations

import asyncio
from typing import Any

from extender.httpapi.app import build_app
from extender.kube.api import Kind, Unavailable
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.extender import client_for, gang_pod, node_obj
from extender.testing.kube import FakeKube

NODES = ["n-0", "n-1"]


def test_a_reservation_that_cannot_be_saved_is_not_promised() -> None:
    pods = [gang_pod("m-0", "g", 2, 8), gang_pod("m-1", "g", 2, 8)]

    async def go() -> None:
        api = FakeKube()
        cache = ClusterCache(store=KubeReservationStore(api))
        for kind in Kind:
            objs: dict[Kind, list[Any]] = {Kind.NODES: [node_obj(n) for n in NODES], Kind.PODS: pods}
            cache.replace(kind, objs.get(kind, []))
        api.fail_next("apply slicereservations", Unavailable(503, "etcd is away"))
        async with client_for(build_app(cache, api=api)) as client:
            r = await client.post("/gangslice/filter", json={"Pod": pods[0], "NodeNames": NODES})
            reply = await r.json()
            assert reply["NodeNames"] == []
            assert set(reply["FailedNodes"]) == set(NODES)
            assert reply["FailedNodes"]["n-0"] == (
                "gang llm/g: the reservation could not be saved (503: etcd is away); "
                "nothing is held, will retry"
            )
            assert cache.reservation("llm/g") is None and cache.unflushed == 0
            assert api.objects("slicereservations") == []
            text = await (await client.get("/metrics")).text()
            assert 'gangslice_decisions_total{outcome="unsaved"} 1.0' in text

            # The API is back: the next filter reserves, saves, and lets the pod on.
            r = await client.post("/gangslice/filter", json={"Pod": pods[0], "NodeNames": NODES})
            assert (await r.json())["NodeNames"]
            assert cache.reservation("llm/g") is not None
            assert [o["spec"]["gang"] for o in api.objects("slicereservations")] == ["llm/g"]

    asyncio.run(go())
