"""kube-scheduler extender v1 on the wire: requests shaped as kube-scheduler marshals them
(``json.Marshal`` of ExtenderArgs & co: capitalised keys, ``null`` for the unused pointer,
full core/v1 objects inside), replies decoded as kube-scheduler decodes them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from gowire import (
    BINDING_RESULT,
    FILTER_RESULT,
    HOST_PRIORITY_LIST,
    PREEMPTION_RESULT,
    GoDecodeError,
    scheduler_filter,
    scheduler_scores,
)

from extender.httpapi.app import build_app
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, write_cluster

Client = TestClient[Any, Any]
NAMES = list(SMALL_CLUSTER_NODES)


def go_pod(
    name: str, gpus: int, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Pod as kube-scheduler's informer holds it and encoding/json writes it (managedFields
    stripped; zero times are ``null``; empty maps omitted by omitempty)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "llm",
        "uid": f"0f3c{len(name):04d}-5b1e-4c55-9a57-{abs(hash(name)) % 10**12:012d}",
        "resourceVersion": "4242",
        "creationTimestamp": "2025-06-01T10:00:00Z",
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": "llama",
                "uid": "7e1",
                "controller": True,
            }
        ],
    }
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [], "defaultMode": 420}}],
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.9.0",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus), "memory": "256Gi"},
                        "requests": {"cpu": "16", "memory": "256Gi", "nvidia.com/gpu": str(gpus)},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "gangslice-scheduler",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerThanOrEqual",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def go_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "99",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"]},
        "status": {
            "capacity": {"cpu": "96", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "95", "nvidia.com/gpu": "8"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2025-06-01T10:00:00Z",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.33.1", "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


def args_cache_capable(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def args_full_nodes(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps(
        {"Pod": pod, "Nodes": {"metadata": {}, "items": [go_node(n) for n in names]}, "NodeNames": None}
    ).encode()


def lowercase_keys(body: bytes) -> bytes:
    return json.dumps({k.lower(): v for k, v in json.loads(body).items()}).encode()


def run(tmp_path: Path, body: Callable[[Client], Awaitable[None]]) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        async with client_for(build_app(cache)) as client:
            await body(client)

    asyncio.run(go())


async def call(client: Client, verb: str, body: bytes) -> Any:
    resp = await client.post(f"/gangslice/{verb}", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("application/json")
    return json.loads(await resp.read())


@pytest.mark.parametrize("mode", ["NodeNames", "Nodes", "NodeNames-lowercase", "Nodes-lowercase"])
def test_filter_in_both_node_modes_and_any_key_case(tmp_path: Path, mode: str) -> None:
    cache_capable = mode.startswith("NodeNames")
    body = (args_cache_capable if cache_capable else args_full_nodes)(go_pod("tp8", 8), NAMES)
    if mode.endswith("lowercase"):
        body = lowercase_keys(body)

    async def go(client: Client) -> None:
        reply = await call(client, "filter", body)
        assert set(reply) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        feasible = scheduler_filter(reply, NAMES, cache_capable)
        assert feasible == ["h-0", "h-1", "h-2", "p-0", "p-1"]
        decoded = FILTER_RESULT(reply)
        assert set(decoded["FailedNodes"]) == {"h-3"}
        assert set(decoded["FailedAndUnresolvableNodes"]) == {"l-0"}
        if cache_capable:
            assert reply["Nodes"] is None and isinstance(reply["NodeNames"], list)
        else:
            assert reply["NodeNames"] is None
            assert reply["Nodes"]["items"][0] == go_node("h-0")  # the objects come back unchanged

    run(tmp_path, go)


def test_filter_always_answers_with_an_explicit_list(tmp_path: Path) -> None:
    async def go(client: Client) -> None:
        for body in (
            args_cache_capable(go_pod("tp8", 8), ["h-3"]),  # nothing fits
            args_cache_capable(go_pod("tp8", 8), []),
            json.dumps({"Pod": go_pod("tp8", 8), "Nodes": None, "NodeNames": None}).encode(),
        ):
            reply = await call(client, "filter", body)
            assert reply["NodeNames"] == [] or reply["Nodes"] == {"metadata": {}, "items": []}
            assert reply["Error"] == ""

    run(tmp_path, go)


@pytest.mark.parametrize("cache_capable", [True, False])
def test_prioritize_is_a_bare_array_of_host_scores(tmp_path: Path, cache_capable: bool) -> None:
    body = (args_cache_capable if cache_capable else args_full_nodes)(go_pod("tp4", 4), NAMES)

    async def go(client: Client) -> None:
        reply = await call(client, "prioritize", body)
        assert isinstance(reply, list)
        assert all(set(h) == {"Host", "Score"} for h in reply)
        decoded = HOST_PRIORITY_LIST(reply)
        assert [h["Host"] for h in decoded] == NAMES
        assert all(0 <= h["Score"] <= 10 for h in decoded)
        added = scheduler_scores(reply, NAMES, weight=5)
        assert max(added, key=lambda n: added[n]) == "h-3"
        assert added["h-3"] == 10 * 5 * 10

    run(tmp_path, go)


def test_bind_round_trip(tmp_path: Path) -> None:
    pod = go_pod("tp4", 4)

    async def go(client: Client) -> None:
        await call(client, "filter", args_cache_capable(pod, NAMES))
        bind = {"PodName": "tp4", "PodNamespace": "llm", "PodUID": pod["metadata"]["uid"], "Node": "h-3"}
        reply = await call(client, "bind", json.dumps(bind).encode())
        assert reply == {"Error": ""}
        assert BINDING_RESULT(reply) == {"Error": ""}
        again = await call(client, "bind", json.dumps({k.lower(): v for k, v in bind.items()}).encode())
        assert BINDING_RESULT(again)["Error"] == ""  # same pod, same node: idempotent

    run(tmp_path, go)


@pytest.mark.parametrize("cache_capable", [True, False])
def test_preempt_replies_in_the_meta_form(tmp_path: Path, cache_capable: bool) -> None:
    async def go(client: Client) -> None:
        victims = [go_pod(f"v{i}", 4) for i in range(2)]
        for v in victims:
            await call(client, "filter", args_cache_capable(v, ["h-0"]))
            bind = {
                "PodName": v["metadata"]["name"],
                "PodNamespace": "llm",
                "PodUID": v["metadata"]["uid"],
                "Node": "h-0",
            }
            assert (await call(client, "bind", json.dumps(bind).encode())) == {"Error": ""}
        if cache_capable:
            body = {
                "Pod": go_pod("big", 8),
                "NodeNameToVictims": None,
                "NodeNameToMetaVictims": {
                    "h-0": {"Pods": [{"UID": v["metadata"]["uid"]} for v in victims], "NumPDBViolations": 0}
                },
            }
        else:
            body = {
                "Pod": go_pod("big", 8),
                "NodeNameToVictims": {"h-0": {"Pods": victims, "NumPDBViolations": 0}},
                "NodeNameToMetaVictims": None,
            }
        reply = await call(client, "preempt", json.dumps(body).encode())
        assert set(reply) == {"NodeNameToMetaVictims"}
        decoded = PREEMPTION_RESULT(reply)["NodeNameToMetaVictims"]
        assert [p["UID"] for p in decoded["h-0"]["Pods"]] == [v["metadata"]["uid"] for v in victims]

    run(tmp_path, go)


def test_malformed_bodies_get_400_with_one_line(tmp_path: Path) -> None:
    async def go(client: Client) -> None:
        for body in (b"{", b"[]", b'{"Pod": "x"}', b'{"NodeNames": ["a"]}', b'{"Pod": {}, "NodeNames": [1]}'):
            resp = await client.post("/gangslice/filter", data=body)
            text = await resp.text()
            assert resp.status == 400 and text.endswith("\n") and text.count("\n") == 1, text

    run(tmp_path, go)


def test_the_go_decoder_itself_refuses_what_go_refuses() -> None:
    with pytest.raises(GoDecodeError):
        HOST_PRIORITY_LIST([{"Host": "a", "Score": 1.5}])
    with pytest.raises(GoDecodeError):
        FILTER_RESULT({"NodeNames": "a"})
    assert FILTER_RESULT({"nodenames": ["a"], "ERROR": ""})["NodeNames"] == ["a"]
    assert scheduler_filter({"NodeNames": None, "Nodes": None}, ["a"], True) == []
