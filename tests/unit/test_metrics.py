"""The extender's /metrics, scraped through the app on a four-node cluster with one
reservation (one slot bound, one not), one allocated pod, fragmented and unhealthy GPUs; and
on a two-node cluster where one node lacks the leaf label, for the per-level GPU counts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families
from test_hardware import H100, L40S, fleet, template
from test_solver_cliques import mixed, one

from extender.cost import Comm
from extender.httpapi.app import build_app
from extender.placement.waiting import WAITING_TTL_S
from extender.reservations import ClusterCache
from extender.testing.extender import client_for, gang_pod, pod_obj, write_cluster
from extender.topology.hierarchy import DEFAULT_LEVELS

#: leaf-1: h-0, h-1 idle HGX H100; h-2 HGX H100 with GPUs 0-4 taken and 7 unhealthy.
#: leaf-2: p-0, a dual-socket PCIe server (switch pairs 0-1, 2-3 | 4-5, 6-7) with 0 and 2 taken.
CLUSTER = """\
levels: [fabric.topograph.run/tier-1, fabric.topograph.run/tier-0]
nodes:
  - name: h
    count: 2
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-1}
    gpuTopology: hgx-h100
  - name: h-2
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-1}
    gpuTopology: hgx-h100
    allocatedGpus: [0, 1, 2, 3, 4]
    unhealthyGpus: [7]
  - name: p-0
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-2}
    gpuTopology: pcie-8gpu-2socket
    allocatedGpus: [0, 2]
"""
NODES = ["h-0", "h-1", "h-2", "p-0"]
#: Two idle HGX H100 under spine-1; only h-0 carries a leaf label.
PARTLY_LABELLED = """\
levels: [fabric.topograph.run/tier-1, fabric.topograph.run/tier-0]
nodes:
  - name: h-0
    labels: {fabric.topograph.run/tier-1: spine-1, fabric.topograph.run/tier-0: leaf-1}
    gpuTopology: hgx-h100
  - name: h-1
    labels: {fabric.topograph.run/tier-1: spine-1}
    gpuTopology: hgx-h100
"""
Client = TestClient[Any, Any]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _post(client: Client, verb: str, body: dict[str, Any]) -> Any:
    resp = await client.post(f"/gangslice/{verb}", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def _filter_and_bind(
    client: Client, pod: dict[str, Any], node: str, nodes: list[str] = NODES
) -> list[str]:
    got = await _post(client, "filter", {"Pod": pod, "NodeNames": nodes})
    meta = pod["metadata"]
    bound = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    assert (await _post(client, "bind", bound))["Error"] == ""
    return list(got["NodeNames"])


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scrape(tmp_path: Path) -> tuple[Samples, ClusterCache]:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path, CLUSTER))

    async def go() -> str:
        async with client_for(build_app(cache)) as client:
            # A gang of two 8-GPU pods: only h-0 and h-1 hold 8; one member binds.
            assert await _filter_and_bind(client, gang_pod("g-0", "g", 2, 8), "h-0") == ["h-0", "h-1"]
            # A 4-GPU pod: only p-0's second socket (4-7) holds 4 at the tightest tier.
            assert await _filter_and_bind(client, pod_obj("solo", gpus=4), "p-0") == ["p-0"]
            resp = await client.get("/metrics")
            assert resp.status == 200
            return await resp.text()

    return _samples(asyncio.run(go())), cache


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: v for (n, labels), v in samples.items() if n == name}


def _by_level(samples: Samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["level"], dict(labels)["state"]): v
        for (n, labels), v in samples.items()
        if n == "gangslice_level_gpus"
    }


def test_metrics_are_named_by_the_conventions_and_count_every_gpu_state(tmp_path: Path) -> None:
    samples, cache = _scrape(tmp_path)
    r = cache.reservation("llm/g")
    assert r is not None and set(r.bound) == {"pods/0"}
    assert cache.snapshot().free_gpus("p-0") == frozenset({1, 3})

    names = {n for n, _ in samples}
    assert {
        "gangslice_decisions_total",
        "gangslice_decision_duration_seconds_count",
        "gangslice_decision_duration_seconds_bucket",
        "gangslice_extender_request_duration_seconds_count",
        "gangslice_extender_requests_total",
        "gangslice_reservations",
        "gangslice_gpus",
        "gangslice_free_coherent_gpus",
        "gangslice_level_gpus",
        "gangslice_cache_ready",
        "gangslice_cache_nodes",
    } <= names
    assert all(n.startswith("gangslice_") for n in names)

    # Two filters and two binds, each timed once around the decision.
    assert _by(samples, "gangslice_decision_duration_seconds_count", "verb") == {"filter": 2.0, "bind": 2.0}
    assert _by(samples, "gangslice_decisions_total", "outcome") == {"reserved": 1.0, "fit": 1.0, "bound": 2.0}
    assert _by(samples, "gangslice_reservations", "phase") == {"Reserved": 1.0, "Bound": 0.0}

    gpus = _by(samples, "gangslice_gpus", "state")
    assert gpus == {
        "total": 32.0,  # four 8-GPU nodes
        "allocated": 19.0,  # h-2's 5 + p-0's 2 from the file, g-0's 8 on h-0, solo's 4 on p-0
        "unhealthy": 1.0,  # h-2's GPU 7
        "reserved": 8.0,  # g's unbound slot on h-1
        "bound": 8.0,  # g-0's slot on h-0 (also allocated, now that the pod is bound)
        "free": 4.0,  # h-2: 5, 6; p-0: 1, 3
    }
    # Bound slots are the only GPUs counted twice.
    assert gpus["allocated"] + gpus["unhealthy"] + gpus["reserved"] + gpus["free"] == gpus["total"]

    # h-2's 5, 6 are NVSwitch-connected (a block of 2); p-0's 1 and 3 sit under different PCIe
    # switches, and the tightest tier for 2 GPUs there is one switch: a block of 1.
    assert _by(samples, "gangslice_free_coherent_gpus", "level") == {
        "node": 2.0,
        "leaf": 2.0,  # leaf-1: 0 + 0 + 2; leaf-2: 1
        "spine": 3.0,  # spine-1: 2 + 1
    }
    # Every node carries both labels: each level counts g's two slots, as gangslice_gpus does.
    assert _by_level(samples) == {
        (level, state): 8.0 for level in ("node", "leaf", "spine") for state in ("reserved", "bound")
    }
    assert samples[("gangslice_cache_nodes", ())] == 4.0


def test_level_gpus_count_only_the_slots_on_nodes_of_that_level(tmp_path: Path) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path, PARTLY_LABELLED))

    async def go() -> str:
        async with client_for(build_app(cache)) as client:
            pod = gang_pod("g-0", "g", 2, 8)
            assert await _filter_and_bind(client, pod, "h-0", ["h-0", "h-1"]) == ["h-0", "h-1"]
            return await (await client.get("/metrics")).text()

    samples = _samples(asyncio.run(go()))
    r = cache.reservation("llm/g")
    assert r is not None and {s.node: s.key in r.bound for s in r.slice.slots} == {"h-0": True, "h-1": False}
    assert _by_level(samples) == {
        ("node", "reserved"): 8.0,  # the unbound slot on h-1
        ("node", "bound"): 8.0,  # g-0's slot on h-0
        ("spine", "reserved"): 8.0,
        ("spine", "bound"): 8.0,
        ("leaf", "reserved"): 0.0,  # h-1 is under no leaf
        ("leaf", "bound"): 8.0,
    }
    assert _by(samples, "gangslice_gpus", "state")["reserved"] == 8.0


def test_an_empty_cache_scrapes_zeroes_for_every_level() -> None:
    async def go() -> str:
        async with client_for(build_app(ClusterCache())) as client:
            return await (await client.get("/metrics")).text()

    families = {f.name: f for f in text_string_to_metric_families(asyncio.run(go()))}
    coherent = {s.labels["level"]: s.value for s in families["gangslice_free_coherent_gpus"].samples}
    levels = [lv.name for lv in DEFAULT_LEVELS]
    assert coherent == dict.fromkeys([*levels, "node"], 0)
    assert {s.labels["state"]: s.value for s in families["gangslice_gpus"].samples} == dict.fromkeys(
        ["total", "allocated", "unhealthy", "reserved", "bound", "free"], 0
    )
    by_level = {
        (s.labels["level"], s.labels["state"]): s.value for s in families["gangslice_level_gpus"].samples
    }
    assert by_level == {(level, state): 0 for level in coherent for state in ("reserved", "bound")}


def test_the_clique_gauges_follow_the_gangs_refused() -> None:
    now = [0.0]
    cache = ClusterCache.from_snapshot(mixed(), clock=lambda: now[0])
    wide = one("wide", 4, 4, Comm.ALLTOALL, required_level="clique")

    async def scrape() -> Samples:
        async with client_for(build_app(cache)) as client:
            return _samples(await (await client.get("/metrics")).text())

    def gauges() -> tuple[float, float]:
        samples = asyncio.run(scrape())
        return samples[("gangslice_refused_gangs", ())], samples[("gangslice_cliques_kept", ())]

    cache.waiting.refused(cache.view(), wide, 0.0)
    assert gauges() == (1.0, 1.0)  # not known yet: kept
    now[0] = WAITING_TTL_S
    assert gauges() == (1.0, 1.0)  # the wide gang waits
    cache.waiting.placed("wide")
    cache.waiting.refused(cache.view(), one("small", 1, 2), now[0])
    assert gauges() == (1.0, 0.0)


def test_the_gpu_worth_gauge_shows_what_the_gangs_asked_for_would_get() -> None:
    cache = ClusterCache.from_snapshot(fleet(("h", H100, "a", 0), ("l", L40S, "b", 0)), clock=lambda: 0.0)
    cache.waiting.asked(cache.view(), template("deepseek-v3-wideep-4", "wide"), 0.0)
    cache.waiting.asked(cache.view(), template("llama-70b-tp8", "tp8"), 0.0)

    async def scrape() -> Samples:
        async with client_for(build_app(cache)) as client:
            return _samples(await (await client.get("/metrics")).text())

    samples = asyncio.run(scrape())
    worth = {k[1]: round(v, 3) for k, v in samples.items() if k[0] == "gangslice_gpu_worth"}
    assert worth == {
        (("model", "H100 SXM"), ("pod_gpus", "8")): 1.0,
        (("model", "L40S"), ("pod_gpus", "8")): 0.171,  # its TP=8 all-reduces cross PCIe there
    }
