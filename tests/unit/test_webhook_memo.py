"""Remembered filter and prioritize answers (``extender.httpapi.memo``): the same node list
with nothing changed gets the remembered answer; any change that can alter a verdict (a pod
binds, a reservation is made, a gang member takes a slot) gets a fresh one.

Small cluster of ``extender.testing.extender``: h-0..h-2 HGX H100 (8 free), h-3 (GPUs 4-7
free), p-0/p-1 dual-socket PCIe (8 free), l-0 four L40S."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from extender.httpapi.app import build_app
from extender.httpapi.decide import Decider
from extender.httpapi.handling import DECIDER
from extender.httpapi.memo import NamesKey, NamesMemo
from extender.kube import names as keys
from extender.kube.pods import PodInfo
from extender.placement.request import GangRequest, PodSet
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, gang_pod, pod_obj, write_cluster
from extender.testing.reserve import hold

ALL = list(SMALL_CLUSTER_NODES)
Client = TestClient[Any, Any]


def serve(tmp_path: Path, body: Any) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        app = build_app(cache)
        async with client_for(app) as client:
            await body(client, cache, app[DECIDER])

    asyncio.run(go())


async def post(client: Client, verb: str, body: dict[str, Any]) -> Any:
    resp = await client.post(f"/gangslice/{verb}", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def filter_(client: Client, pod: dict[str, Any], names: list[str] = ALL) -> Any:
    return await post(client, "filter", {"Pod": pod, "Nodes": None, "NodeNames": names})


async def scores(client: Client, pod: dict[str, Any]) -> dict[str, int]:
    reply = await post(client, "prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ALL})
    return {h["Host"]: h["Score"] for h in reply}


async def bind(client: Client, pod: dict[str, Any], node: str) -> None:
    meta = pod["metadata"]
    body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    assert (await post(client, "bind", body))["Error"] == ""


def test_the_same_list_gets_the_remembered_outcome_until_the_cache_changes(tmp_path: Path) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    decider = Decider(cache)
    pod = PodInfo.from_obj(pod_obj("solo", gpus=4))
    first = decider.filter(pod, list(ALL))
    assert decider.filter(pod, list(ALL)) is first
    assert decider.filter(pod, ALL[:3]) is not first
    assert decider.prioritize(pod, list(ALL)) is decider.prioritize(pod, list(ALL))
    hold(cache, "llm/g", GangRequest("g", (PodSet("w", 1, 8),)))
    after = decider.filter(pod, list(ALL))
    assert after is not first and len(after.passed) == len(first.passed) - 1
    assert after == Decider(cache).filter(pod, list(ALL))


def test_a_pod_binding_changes_the_filter_and_prioritize_replies(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache, decider: Decider) -> None:
        four = pod_obj("a", gpus=4)
        got = await filter_(client, four)
        assert await filter_(client, four) == got  # answered from the memo
        assert "h-3" in got["NodeNames"]
        before = await scores(client, four)
        await bind(client, four, "h-3")  # takes GPUs 4-7, the last free ones of h-3
        later = await filter_(client, pod_obj("b", gpus=4))
        assert "h-3" not in later["NodeNames"] and "h-3" in later["FailedNodes"]
        assert set(later["NodeNames"]) == set(got["NodeNames"]) - {"h-3"}
        after = await scores(client, pod_obj("b", gpus=4))
        assert after["h-3"] == 0 < before["h-3"]

    serve(tmp_path, body)


def test_a_reservation_changes_the_filter_reply(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache, decider: Decider) -> None:
        eight = pod_obj("solo", gpus=8)
        got = await filter_(client, eight)
        assert await filter_(client, eight) == got
        # a gang of two 8-GPU pods reserves two whole nodes
        await filter_(client, gang_pod("g-0", "g", 2, 8, extra={keys.COMM: "allreduce"}))
        r = cache.reservation("llm/g")
        assert r is not None
        reserved = {s.node for s in r.slice.slots}
        later = await filter_(client, eight)
        assert set(later["NodeNames"]) == set(got["NodeNames"]) - reserved
        assert reserved <= set(later["FailedNodes"])

    serve(tmp_path, body)


def test_a_gang_member_taking_a_slot_changes_the_next_members_reply(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache, decider: Decider) -> None:
        pods = [gang_pod(f"g-{i}", "g", 2, 8, extra={keys.COMM: "allreduce"}) for i in range(2)]
        await filter_(client, pods[0])  # reserves two slots on two nodes
        r = cache.reservation("llm/g")
        assert r is not None
        slot_nodes = sorted({s.node for s in r.slice.slots})
        assert (await filter_(client, pods[1]))["NodeNames"] == slot_nodes
        assert (await filter_(client, pods[1]))["NodeNames"] == slot_nodes
        assert await scores(client, pods[1]) == {n: 10 if n in slot_nodes else 0 for n in ALL}
        version = cache.version
        # Volcano's allocate takes a slot without changing what any node offers
        decider.allocate(PodInfo.from_obj(pods[0]), slot_nodes[0], None)
        assert cache.version == version
        assert (await filter_(client, pods[1]))["NodeNames"] == slot_nodes[1:]
        assert await scores(client, pods[1]) == {n: 10 if n == slot_nodes[1] else 0 for n in ALL}

    serve(tmp_path, body)


def test_the_memo_forgets_on_a_new_version_and_keeps_a_bounded_number() -> None:
    memo: NamesMemo[str] = NamesMemo(size=2)
    names = NamesKey(["a", "b"])
    memo.put(1, "rule", names, "x")
    assert memo.get(1, "rule", NamesKey(["a", "b"])) == "x"
    assert memo.get(1, "rule", NamesKey(["b", "a"])) is None
    assert memo.get(1, "other", names) is None
    assert memo.get(2, "rule", names) is None and len(memo) == 0
    for i in range(3):
        memo.put(2, i, names, str(i))
    assert len(memo) == 2 and memo.get(2, 0, names) is None and memo.get(2, 2, names) == "2"


def test_a_node_name_list_is_taken_as_decoded_and_still_checked() -> None:
    from extender.httpapi.wire import ExtenderArgs

    names = ["a", "b"]
    assert ExtenderArgs.model_validate({"Pod": {}, "NodeNames": names}).node_names is names
    for bad in (["a", 1], "a", [None]):
        try:
            ExtenderArgs.model_validate({"Pod": {}, "NodeNames": bad})
        except ValueError as exc:
            assert "NodeNames" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")
