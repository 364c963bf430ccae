"""Volcano's extender plugin on the wire: requests as ``json.Marshal`` writes Volcano's
scheduler objects (TaskInfo, NodeInfo, JobInfo: no json tags, so capitalised keys, nil
pointers as ``null``, scalar resources in milli-units), replies decoded as the plugin does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from gowire import EVENT_HANDLER_RESPONSE, JOB_ENQUEUEABLE_RESPONSE, PREDICATE_RESPONSE, PRIORITIZE_RESPONSE

from extender.httpapi.app import build_app
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Slice
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, pod_obj, write_cluster
from extender.testing.reserve import reserve_gang

Client = TestClient[Any, Any]


def resource(milli_cpu: float, memory: float, gpus: int | None) -> dict[str, Any]:
    scalars = {"nvidia.com/gpu": gpus * 1000.0, "pods": 110000.0} if gpus is not None else None
    return {"MilliCPU": milli_cpu, "Memory": memory, "ScalarResources": scalars, "MaxTaskNum": 0}


def task_info(name: str, job: str = "llm/pg-1", gpus: int = 8, node: str = "") -> dict[str, Any]:
    pod = pod_obj(
        name, gpus=gpus, annotations={"scheduling.k8s.io/group-name": job.split("/")[1]}, scheduler="volcano"
    )
    return {
        "UID": pod["metadata"]["uid"],
        "Job": job,
        "Name": name,
        "Namespace": "llm",
        "TaskRole": "worker",
        "Resreq": resource(16000, 2.7e11, gpus),
        "InitResreq": resource(16000, 2.7e11, gpus),
        "NodeName": node,
        "EvictionOccurred": False,
        "JobAllocatedHyperNode": "",
        "Status": 1,
        "LastTransaction": None,
        "Priority": 0,
        "VolumeReady": False,
        "Preemptable": False,
        "BestEffort": False,
        "HasRestartableInitContainer": False,
        "SchGated": False,
        "RevocableZone": "",
        "NumaInfo": None,
        "PodVolumes": None,
        "Pod": pod,
        "CustomBindErrHandler": None,
        "CustomBindErrHandlerSucceeded": False,
    }


def node_info(name: str) -> dict[str, Any]:
    return {
        "Name": name,
        "Node": {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {},
        },
        "State": {"Phase": 1, "Reason": ""},
        "Releasing": resource(0, 0, None),
        "Pipelined": resource(0, 0, None),
        "Idle": resource(96000, 1e12, 8),
        "Used": resource(0, 0, None),
        "Allocatable": resource(96000, 1e12, 8),
        "Capacity": resource(96000, 1e12, 8),
        "ResourceUsage": None,
        "Tasks": {},
        "NumaInfo": None,
        "NumaChgFlag": 0,
        "NumaSchedulerInfo": None,
        "RevocableZone": "",
        "Others": None,
        "ImageStates": None,
        "GPUDevices": None,
    }


def job_info(name: str = "pg-1", gpus: int = 16) -> dict[str, Any]:
    return {
        "UID": f"llm/{name}",
        "PgUID": "2c1f",
        "Name": name,
        "Namespace": "llm",
        "Queue": "default",
        "Priority": 0,
        "MinAvailable": 2,
        "WaitingTime": None,
        "JobFitErrors": "",
        "NodesFitErrors": {},
        "TaskStatusIndex": {},
        "Tasks": {},
        "TaskMinAvailable": {"worker": 2},
        "TaskMinAvailableTotal": 2,
        "Allocated": resource(0, 0, None),
        "TotalRequest": resource(32000, 5.4e11, gpus),
        "CreationTimestamp": "2025-06-01T10:00:00Z",
        "PodGroup": {
            "metadata": {"name": name, "namespace": "llm"},
            "spec": {"minMember": 2, "queue": "default", "minResources": {"nvidia.com/gpu": str(gpus)}},
            "status": {"phase": "Pending"},
            "Version": "v1beta1",
        },
        "ScheduleStartTimestamp": "0001-01-01T00:00:00Z",
        "Preemptable": False,
        "RevocableZone": "",
        "Budget": {"MinAvailable": "2", "MaxUnavilable": ""},
        "NetworkTopology": None,
        "AllocatedHyperNode": "",
    }


def run(tmp_path: Path, body: Callable[[Client, ClusterCache], Awaitable[None]]) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        async with client_for(build_app(cache)) as client:
            await body(client, cache)

    asyncio.run(go())


async def call(client: Client, verb: str, body: dict[str, Any]) -> Any:
    resp = await client.post(f"/gangslice/volcano/{verb}", data=json.dumps(body))
    assert resp.status == 200, await resp.text()
    return json.loads(await resp.read())


async def reserve(cache: ClusterCache) -> Slice:
    placed = await reserve_gang(cache, "llm/pg-1", GangRequest("llm/pg-1", (PodSet("worker", 2, 8),)))
    assert isinstance(placed, Slice)
    return placed


def test_enqueue_predicate_prioritize_allocate_as_volcano_sends_them(tmp_path: Path) -> None:
    async def go(client: Client, cache: ClusterCache) -> None:
        reply = await call(client, "jobEnqueueable", {"job": job_info()})
        assert set(reply) == {"status"} and JOB_ENQUEUEABLE_RESPONSE(reply)["status"] == -1
        placed = await reserve(cache)
        assert (
            JOB_ENQUEUEABLE_RESPONSE(await call(client, "jobEnqueueable", {"job": job_info()}))["status"] == 1
        )

        slots = {s.node for s in placed.slots}
        for name in SMALL_CLUSTER_NODES:
            reply = await call(client, "predicate", {"task": task_info("w-0"), "node": node_info(name)})
            assert set(reply) == {"status", "code"}
            decoded = PREDICATE_RESPONSE(reply)
            # the plugin passes a node exactly when status is empty
            assert (decoded["status"] == "") == (name in slots)
            assert decoded["code"] == (0 if name in slots else 2)

        reply = await call(
            client,
            "prioritize",
            {"task": task_info("w-0"), "nodes": [node_info(n) for n in SMALL_CLUSTER_NODES]},
        )
        decoded = PRIORITIZE_RESPONSE(reply)
        assert decoded["errorMessage"] == "" and decoded["nodeScore"] is not None
        assert {n for n, s in decoded["nodeScore"].items() if s > 0} == slots

        node = placed.slots[0].node
        reply = await call(client, "allocate", {"task": task_info("w-0", node=node)})
        assert EVENT_HANDLER_RESPONSE(reply) == {"errorMessage": ""}
        reply = await call(client, "deallocate", {"task": task_info("w-0", node=node)})
        assert EVENT_HANDLER_RESPONSE(reply) == {"errorMessage": ""}

    run(tmp_path, go)


@pytest.mark.parametrize("case", ["lower", "upper"])
def test_keys_in_any_case(tmp_path: Path, case: str) -> None:
    def recase(d: Any) -> Any:
        if not isinstance(d, dict):
            return d
        return {(k.lower() if case == "lower" else k.upper()): v for k, v in d.items()}

    async def go(client: Client, cache: ClusterCache) -> None:
        await reserve(cache)
        slot = cache.reservation("llm/pg-1").slice.slots[0].node  # type: ignore[union-attr]
        body = {"TASK": recase(task_info("w-0")), "Node": recase(node_info(slot))}
        assert PREDICATE_RESPONSE(await call(client, "predicate", body))["code"] == 0

    run(tmp_path, go)


def test_prioritize_with_no_nodes_still_sends_a_map(tmp_path: Path) -> None:
    async def go(client: Client, cache: ClusterCache) -> None:
        empty: list[Any] = []
        for nodes in (None, empty):
            reply = await call(client, "prioritize", {"task": task_info("w-0"), "nodes": nodes})
            assert reply["nodeScore"] == {}  # null here would be an error to the plugin

    run(tmp_path, go)


def test_errors_use_the_fields_volcano_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.httpapi.decide import Decider

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("kaput")

    monkeypatch.setattr(Decider, "filter", boom)
    monkeypatch.setattr(Decider, "prioritize", boom)

    async def go(client: Client, cache: ClusterCache) -> None:
        reply = PREDICATE_RESPONSE(
            await call(client, "predicate", {"task": task_info("w-0"), "node": node_info("h-0")})
        )
        assert "kaput" in reply["status"] and reply["code"] == 1
        reply = PRIORITIZE_RESPONSE(await call(client, "prioritize", {"task": task_info("w-0"), "nodes": []}))
        assert "kaput" in reply["errorMessage"]

    run(tmp_path, go)
