"""The Volcano extender verbs: predicate, prioritize, jobEnqueueable, allocate/deallocate."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from extender.httpapi.app import build_app
from extender.kube import names as keys
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Slice
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, pod_obj, write_cluster
from extender.testing.reserve import reserve_gang

Client = TestClient[Any, Any]


def run(tmp_path: Path, body: Callable[[Client, ClusterCache], Awaitable[None]]) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        async with client_for(build_app(cache)) as client:
            await body(client, cache)

    asyncio.run(go())


async def post(client: Client, verb: str, body: dict[str, Any]) -> Any:
    resp = await client.post(f"/gangslice/volcano/{verb}", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


def task(name: str, job: str = "llm/pg-1", gpus: int = 8, node: str = "", role: str = "") -> dict[str, Any]:
    annotations = {keys.VOLCANO_GROUP: job.split("/")[1]} if job else {}
    pod = pod_obj(name, gpus=gpus, annotations=annotations, scheduler="volcano")
    return {
        "UID": pod["metadata"]["uid"],
        "Job": job,
        "Name": name,
        "Namespace": "llm",
        "TaskRole": role,
        "Resreq": {"MilliCPU": 1000, "Memory": 0, "ScalarResources": {keys.GPU_RESOURCE: gpus * 1000}},
        "NodeName": node,
        "Status": 1,
        "Pod": pod,
    }


def node_info(name: str) -> dict[str, Any]:
    return {"Name": name, "Node": {"metadata": {"name": name}}, "State": {"Phase": 1, "Reason": ""}}


async def reserve(cache: ClusterCache, pods: int = 2) -> Slice:
    placed = await reserve_gang(cache, "llm/pg-1", GangRequest("llm/pg-1", (PodSet("worker", pods, 8),)))
    assert isinstance(placed, Slice)
    return placed


def test_job_enqueueable_rejects_until_the_podgroup_is_reserved(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        job = {
            "UID": "llm/pg-1",
            "Name": "pg-1",
            "Namespace": "llm",
            "MinAvailable": 2,
            "TotalRequest": {"ScalarResources": {keys.GPU_RESOURCE: 16000}},
        }
        assert await post(client, "jobEnqueueable", {"job": job}) == {"status": -1}
        await reserve(cache)
        assert await post(client, "jobEnqueueable", {"job": job}) == {"status": 1}
        cpu_job = {"UID": "llm/web", "Name": "web", "Namespace": "llm", "MinAvailable": 1}
        assert await post(client, "jobEnqueueable", {"job": cpu_job}) == {"status": 0}
        pg_job = {
            "Name": "pg-2",
            "Namespace": "llm",
            "PodGroup": {"spec": {"minMember": 2, "minResources": {keys.GPU_RESOURCE: "16"}}},
        }
        assert await post(client, "jobEnqueueable", {"job": pg_job}) == {"status": -1}

    run(tmp_path, body)


def test_predicate_passes_only_on_the_jobs_slots(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        placed = await reserve(cache)
        slot_nodes = {s.node for s in placed.slots}
        for name in SMALL_CLUSTER_NODES:
            got = await post(client, "predicate", {"task": task("w-0"), "node": node_info(name)})
            if name in slot_nodes:
                assert got == {"status": "", "code": 0}
            else:
                assert got["code"] == 2 and "reservation llm/pg-1" in got["status"]

    run(tmp_path, body)


def test_predicate_for_tasks_outside_gangslice_gangs_applies_the_in_node_rule(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        lone = task("solo", job="", gpus=8)
        assert (await post(client, "predicate", {"task": lone, "node": node_info("h-0")}))["code"] == 0
        assert (await post(client, "predicate", {"task": lone, "node": node_info("h-3")}))["code"] == 2
        assert (await post(client, "predicate", {"task": lone, "node": node_info("l-0")}))["code"] == 3
        # a GPU task of a job gangslice has not reserved waits
        got = await post(
            client, "predicate", {"task": task("w-0", job="llm/other"), "node": node_info("h-0")}
        )
        assert got["code"] == 2 and "no reservation" in got["status"]

    run(tmp_path, body)


def test_prioritize_scores_slot_nodes_and_is_never_null(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        empty = await post(client, "prioritize", {"task": task("w-0"), "nodes": None})
        assert empty == {"nodeScore": {}, "errorMessage": ""}
        placed = await reserve(cache)
        slot_nodes = {s.node for s in placed.slots}
        nodes = [node_info(n) for n in SMALL_CLUSTER_NODES]
        got = await post(client, "prioritize", {"task": task("w-0"), "nodes": nodes})
        assert got["errorMessage"] == ""
        assert got["nodeScore"] == {n: (100.0 if n in slot_nodes else 0.0) for n in SMALL_CLUSTER_NODES}

    run(tmp_path, body)


def test_allocate_takes_a_slot_and_deallocate_gives_it_back(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        placed = await reserve(cache, pods=1)
        node = placed.slots[0].node
        assert await post(client, "allocate", {"task": task("w-0", node=node)}) == {"errorMessage": ""}
        r = cache.reservation("llm/pg-1")
        assert r is not None and r.bound == {"worker/0": "w-0"}
        # the only slot is taken: another task cannot pass or be allocated there
        got = await post(client, "predicate", {"task": task("w-1"), "node": node_info(node)})
        assert got["code"] == 2
        refused = await post(client, "allocate", {"task": task("w-1", node=node)})
        assert "no free slot" in refused["errorMessage"]
        assert await post(client, "deallocate", {"task": task("w-0", node=node)}) == {"errorMessage": ""}
        r = cache.reservation("llm/pg-1")
        assert r is not None and r.bound == {}

    run(tmp_path, body)


def test_task_role_picks_the_pod_set_when_the_slice_has_it(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        request = GangRequest("llm/pg-1", (PodSet("leader", 1, 4), PodSet("worker", 1, 8)))
        placed = await reserve_gang(cache, "llm/pg-1", request)
        assert isinstance(placed, Slice)
        leader_node = placed.slot("leader/0").node
        worker_node = placed.slot("worker/0").node
        got = await post(
            client, "predicate", {"task": task("l-0", gpus=4, role="leader"), "node": node_info(leader_node)}
        )
        assert got["code"] == 0
        if leader_node != worker_node:
            other = await post(
                client,
                "predicate",
                {"task": task("l-0", gpus=4, role="leader"), "node": node_info(worker_node)},
            )
            assert other["code"] == 2

    run(tmp_path, body)


def test_session_open_and_close_accept_any_body(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        big = b'{"Jobs": {' + b",".join(b'"j%d": {"UID": "x"}' % i for i in range(20000)) + b"}}"
        for verb, data in (("onSessionOpen", big), ("onSessionClose", b"{}")):
            resp = await client.post(f"/gangslice/volcano/{verb}", data=data)
            assert resp.status == 200 and await resp.json() == {}

    run(tmp_path, body)
