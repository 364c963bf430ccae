"""Verbs check what they are told against the pod watch (extender/httpapi/checks.py): the
forged requests of issue "only the schedulers may call gangslice" are refused with a clear
error and counted in gangslice_extender_refusals_total{verb,reason}."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient

from extender.httpapi.app import build_app
from extender.kube import names as keys
from extender.kube.api import Kind
from extender.reservations import ClusterCache
from extender.testing.extender import client_for, gang_pod, node_obj, pod_obj
from extender.testing.reserve import hold

Client = TestClient[Any, Any]
NODES = ["n-0", "n-1", "n-2"]


def watched_cache(pods: list[dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache()
    for kind in Kind:
        objs = {Kind.NODES: [*map(node_obj, NODES), node_obj("cpu-0", gpus=0)], Kind.PODS: pods}
        cache.replace(kind, objs.get(kind, []))
    return cache


def run(pods: list[dict[str, Any]], body: Callable[[Client, ClusterCache], Awaitable[None]]) -> None:
    async def go() -> None:
        cache = watched_cache(pods)
        async with client_for(build_app(cache)) as client:
            await body(client, cache)

    asyncio.run(go())


async def post(client: Client, path: str, body: dict[str, Any]) -> Any:
    r = await client.post(path, json=body)
    assert r.status == 200, await r.text()
    return await r.json()


async def refusals(client: Client) -> str:
    return await (await client.get("/metrics")).text()


def bind_args(pod: dict[str, Any], node: str, uid: str | None = None) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": uid or meta["uid"],
        "Node": node,
    }


def test_a_filter_for_a_pod_nobody_created_reserves_nothing() -> None:
    invented = gang_pod("m-0", "invented", 2, 8)

    async def body(client: Client, cache: ClusterCache) -> None:
        reply = await post(client, "/gangslice/filter", {"Pod": invented, "NodeNames": NODES})
        assert reply["NodeNames"] == [] and set(reply["FailedNodes"]) == set(NODES)
        assert (
            "not known to gangslice (not in its pod watch, nor on the API server); nothing reserved"
            in reply["FailedNodes"]["n-0"]
        )
        assert cache.reservation("llm/invented") is None
        scores = await post(client, "/gangslice/prioritize", {"Pod": invented, "NodeNames": NODES})
        assert [s["Score"] for s in scores] == [0, 0, 0]
        text = await refusals(client)
        assert 'gangslice_extender_refusals_total{reason="unknown-pod",verb="filter"} 1.0' in text
        assert 'gangslice_extender_refusals_total{reason="unknown-pod",verb="prioritize"} 1.0' in text

    run([], body)


def test_a_pod_the_watch_has_not_shown_yet_is_read_from_the_api_server() -> None:
    """kube-scheduler may ask about a pod just created before the pod watch shows it (the watch
    lags under load): the verb reads it from the API server rather than sending the scheduler
    away to wait for an event that may never come; a pod the API server lacks is refused."""
    from extender.kube.api import PODS
    from extender.testing.kube import FakeKube

    async def go() -> None:
        api = FakeKube()
        cache = watched_cache([])
        fresh = gang_pod("m-0", "fresh", 1, 8)
        fresh["metadata"]["uid"] = "uid-fresh"
        api.put(PODS, fresh)
        async with client_for(build_app(cache, api=api)) as client:
            reply = await post(client, "/gangslice/filter", {"Pod": fresh, "NodeNames": NODES})
            assert reply["NodeNames"], reply
            assert cache.watched_pod("llm", "m-0") is not None
            assert cache.reservation("llm/fresh") is not None
            ghost = gang_pod("g-0", "ghost", 1, 8)
            reply = await post(client, "/gangslice/filter", {"Pod": ghost, "NodeNames": NODES})
            assert reply["NodeNames"] == [] and "nor on the API server" in reply["FailedNodes"]["n-0"]

    asyncio.run(go())


def test_a_filter_with_another_uid_reserves_nothing_and_a_watched_one_does() -> None:
    members = [gang_pod(f"m-{i}", "g", 2, 8) for i in range(2)]

    async def body(client: Client, cache: ClusterCache) -> None:
        forged = {**members[0], "metadata": {**members[0]["metadata"], "uid": "forged"}}
        reply = await post(client, "/gangslice/filter", {"Pod": forged, "NodeNames": NODES})
        assert "has uid uid-llm-m-0, not forged" in reply["FailedNodes"]["n-0"]
        assert cache.reservation("llm/g") is None
        reply = await post(client, "/gangslice/filter", {"Pod": members[0], "NodeNames": NODES})
        assert reply["NodeNames"] and cache.reservation("llm/g") is not None

    run(members, body)


def test_bind_refuses_what_no_scheduler_of_ours_would_send() -> None:
    mine = pod_obj("tp1", gpus=1)
    system = pod_obj("dns", namespace="kube-system", gpus=1, scheduler="default-scheduler")
    running = pod_obj("run", gpus=1, node="n-1")

    async def body(client: Client, cache: ClusterCache) -> None:
        cases = [
            (bind_args(pod_obj("ghost"), "n-0"), "unknown-pod", "pod llm/ghost is not known to gangslice"),
            (bind_args(mine, "n-0", uid="other"), "uid-mismatch", "has uid uid-llm-tp1, not other"),
            (bind_args(system, "n-0"), "other-scheduler", "names scheduler 'default-scheduler'"),
            (bind_args(running, "n-0"), "already-bound", "already bound to node n-1"),
            (bind_args(mine, "nowhere"), "unknown-node", "node 'nowhere' is not a node of the cluster"),
            (bind_args(mine, "cpu-0"), "no-slot", "node cpu-0 is not known to gangslice"),
        ]
        for args, reason, words in cases:
            reply = await post(client, "/gangslice/bind", args)
            assert words in reply["Error"], (reason, reply)
        text = await refusals(client)
        for _, reason, _ in cases:
            assert f'gangslice_extender_refusals_total{{reason="{reason}",verb="bind"}} 1.0' in text, reason
        assert cache.watched_pod("kube-system", "dns").node is None  # type: ignore[union-attr]
        assert (await post(client, "/gangslice/bind", bind_args(mine, "n-0"))) == {"Error": ""}
        assert cache.watched_pod("llm", "tp1").node == "n-0"  # type: ignore[union-attr]

    run([mine, system, running], body)


def volcano_pod(name: str, node: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    annotations = {keys.VOLCANO_GROUP: "pg"}
    return pod_obj(name, gpus=8, annotations=annotations, node=node, phase=phase, scheduler="volcano")


def task(pod: dict[str, Any], node: str = "", uid: str | None = None) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "UID": uid or meta["uid"],
        "Job": "llm/pg",
        "Name": meta["name"],
        "Namespace": "llm",
        "NodeName": node,
    }


def test_volcano_allocate_and_deallocate_check_the_pod() -> None:
    pods = [volcano_pod("w-0"), volcano_pod("w-1")]

    async def body(client: Client, cache: ClusterCache) -> None:
        from extender.placement.request import GangRequest, PodSet

        placed = hold(cache, "llm/pg", GangRequest("llm/pg", (PodSet("w", 2, 8),)))
        assert not isinstance(placed, str)
        r = cache.reservation("llm/pg")
        assert r is not None
        nodes = sorted({s.node for s in r.slice.slots})
        other = next(n for n in NODES if n not in nodes)
        forged = await post(client, "/gangslice/volcano/allocate", {"task": task(pods[0], nodes[0], uid="x")})
        assert "has uid uid-llm-w-0, not x" in forged["errorMessage"]
        nobody = await post(
            client, "/gangslice/volcano/allocate", {"task": task(volcano_pod("w-9"), nodes[0])}
        )
        assert "not known to gangslice" in nobody["errorMessage"]
        outside = await post(client, "/gangslice/volcano/allocate", {"task": task(pods[0], other)})
        assert "no free slot" in outside["errorMessage"]
        ok = await post(client, "/gangslice/volcano/allocate", {"task": task(pods[0], nodes[0])})
        assert ok == {"errorMessage": ""} and cache.reservation("llm/pg").slot_of("w-0") is not None  # type: ignore[union-attr]
        # Volcano undoing the allocation within its session: the pod is not bound yet.
        assert (await post(client, "/gangslice/volcano/deallocate", {"task": task(pods[0])})) == {
            "errorMessage": ""
        }
        assert cache.reservation("llm/pg").slot_of("w-0") is None  # type: ignore[union-attr]
        # A running member's slot is not freed by a forged deallocate.
        await post(client, "/gangslice/volcano/allocate", {"task": task(pods[1], nodes[-1])})
        cache.apply(Kind.PODS, "MODIFIED", volcano_pod("w-1", node=nodes[-1], phase="Running"))
        got = await post(client, "/gangslice/volcano/deallocate", {"task": task(pods[1])})
        assert (
            "runs on node" in got["errorMessage"]
            and "freed when the pod is gone or finished" in got["errorMessage"]
        )
        assert cache.reservation("llm/pg").slot_of("w-1") is not None  # type: ignore[union-attr]
        text = await refusals(client)
        for reason, verb in (
            ("uid-mismatch", "volcano-allocate"),
            ("unknown-pod", "volcano-allocate"),
            ("no-slot", "volcano-allocate"),
            ("pod-running", "volcano-deallocate"),
        ):
            assert f'gangslice_extender_refusals_total{{reason="{reason}",verb="{verb}"}} 1.0' in text, reason

    run(pods, body)


def test_a_pod_the_watch_still_shows_gated_is_read_again_and_decided_as_admitted() -> None:
    """Kueue lifts a pod group's gate in the update that writes its podSetUpdates (the
    reservation's name among them); kube-scheduler may ask about the pod before the watch shows
    that update. The pod then is read again from the API server and decided as a member of its
    reservation, never as the plain pod it was before its admission; a pod still gated there is
    refused (kube-scheduler places no gated pod)."""
    from extender.kube.api import PODS
    from extender.placement.request import GangRequest, PodSet
    from extender.testing.kube import FakeKube

    gate = [{"name": "kueue.x-k8s.io/admission"}]
    admitted = [pod_obj(f"pg-{i}", gpus=4, annotations={keys.RESERVATION: "wl-pg"}) for i in range(2)]
    gated = [pod_obj(f"pg-{i}", gpus=4) for i in range(2)]
    for pod in gated:
        pod["spec"]["schedulingGates"] = gate

    async def go() -> None:
        api = FakeKube()
        api.put(PODS, admitted[0])
        api.put(PODS, gated[1])
        cache = watched_cache(gated)
        placed = hold(
            cache, "llm/wl-pg", GangRequest("llm/wl-pg", (PodSet("main", 2, 4),)), {"name": "wl-pg"}
        )
        assert not isinstance(placed, str)
        slots = {(s.node, s.gpus) for s in placed.slots}
        nodes = sorted({node for node, _ in slots})
        async with client_for(build_app(cache, api=api)) as client:
            reply = await post(client, "/gangslice/filter", {"Pod": admitted[0], "NodeNames": NODES})
            assert reply["NodeNames"] == nodes, reply
            watched = cache.watched_pod("llm", "pg-0")
            assert watched is not None and watched.reservation_name == "wl-pg" and not watched.gated
            elsewhere = next(n for n in NODES if n not in nodes)
            cache.apply(Kind.PODS, "MODIFIED", gated[0])  # the watch's late event, as it comes
            got = await post(client, "/gangslice/bind", bind_args(admitted[0], elsewhere))
            assert "reservation llm/wl-pg has no free slot for pod pg-0" in got["Error"], got
            assert await post(client, "/gangslice/bind", bind_args(admitted[0], nodes[0])) == {"Error": ""}
            bound = cache.watched_pod("llm", "pg-0")
            assert bound is not None and (bound.node, bound.assigned_gpus) in slots
            r = cache.reservation("llm/wl-pg")
            assert r is not None and r.slot_of("pg-0") is not None

            # pg-1 is gated on the API server too: no scheduler of ours asks about it.
            for path, body in (
                ("/gangslice/filter", {"Pod": admitted[1], "NodeNames": NODES}),
                ("/gangslice/bind", bind_args(admitted[1], nodes[0])),
            ):
                reply = await post(client, path, body)
                text = reply.get("Error") or reply["FailedNodes"]["n-0"]
                assert "pod llm/pg-1 has scheduling gates" in text, reply
            assert r.slot_of("pg-1") is None
            text = await refusals(client)
            assert 'gangslice_extender_refusals_total{reason="gated",verb="bind"} 1.0' in text

    asyncio.run(go())
