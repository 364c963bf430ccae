"""The PodGroup controller and the Volcano extender endpoints on one cache: the recorded
Volcano job is held back by ``jobEnqueueable`` until the controller has reserved its slice,
then each recorded task passes ``predicate`` only on the node of a slot of its role, and
``allocate`` (the allocateFunc verb) takes that slot."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient

from extender.controllers.podgroups.controller import PodGroupController
from extender.httpapi.app import build_app
from extender.kube import names as keys
from extender.placement.files import load_cluster
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.extender import client_for
from extender.testing.kube import FakeKube

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "volcano"
KEY = "llm/llama-70b"


def task(pod: dict[str, Any], node: str = "") -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "UID": meta["uid"],
        "Job": KEY,
        "Name": meta["name"],
        "Namespace": meta["namespace"],
        "TaskRole": meta["labels"]["volcano.sh/task-spec"],
        "Resreq": {"MilliCPU": 32000, "Memory": 0, "ScalarResources": {keys.GPU_RESOURCE: 8000}},
        "NodeName": node,
        "Status": 1,
        "Pod": pod,
    }


async def post(client: TestClient[Any, Any], verb: str, body: dict[str, Any]) -> Any:
    resp = await client.post(f"/gangslice/volcano/{verb}", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


def test_the_job_is_held_until_reserved_then_each_task_is_pinned_to_its_role() -> None:
    api = FakeKube()
    cache = ClusterCache.from_snapshot(
        load_cluster(FIXTURES / "cluster.yaml"), store=KubeReservationStore(api)
    )
    ctl = PodGroupController(api, cache)
    ctl.leader = True
    group = api.put("podgroups", yaml.safe_load((FIXTURES / "podgroup-llama.yaml").read_text()))
    pods = list(yaml.safe_load_all((FIXTURES / "pods-llama.yaml").read_text()))
    job = {
        "UID": KEY,
        "Name": "llama-70b",
        "Namespace": "llm",
        "MinAvailable": 4,
        "TotalRequest": {"ScalarResources": {keys.GPU_RESOURCE: 32000}},
    }

    async def body() -> None:
        async with client_for(build_app(cache)) as client:
            await ctl.on_podgroup("ADDED", group)
            assert await post(client, "jobEnqueueable", {"job": job}) == {"status": -1}
            for p in pods:
                await ctl.on_pod("ADDED", p)
            assert await post(client, "jobEnqueueable", {"job": job}) == {"status": 1}
            r = cache.reservation(KEY)
            assert r is not None
            for p in pods:
                role = p["metadata"]["labels"]["volcano.sh/task-spec"]
                role_nodes = {s.node for s in r.free_slots() if s.pod_set == role}
                for node in cache.node_names():
                    got = await post(
                        client, "predicate", {"task": task(p), "node": {"Name": node, "State": {"Phase": 1}}}
                    )
                    assert (got["status"] == "") == (node in role_nodes), (p["metadata"]["name"], node)
                chosen = sorted(role_nodes)[0]
                got = await post(client, "allocate", {"task": task(p, chosen)})
                assert got == {"errorMessage": ""}
                r = cache.reservation(KEY)
                assert r is not None
                slot = r.slot_of(p["metadata"]["name"])
                assert slot is not None and (slot.node, slot.pod_set) == (chosen, role)

    asyncio.run(body())
