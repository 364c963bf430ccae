"""/readyz and the leader label when the admission controller runs beside the extender."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from extender.httpapi.app import build_app
from extender.httpapi.server import label_own_pod
from extender.kube.api import Kind
from extender.kube.names import LEADER_LABEL
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, gang_pod, write_cluster
from extender.testing.kube import FakeKube


def _status(tmp_path: Path, leading: bool | None) -> tuple[int, str]:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    app = build_app(cache)
    if leading is not None:
        cache.book.fence.elect()
        if leading:
            cache.book.fence.hold_until(time.monotonic() + 60)
            cache.book.fence.leading = True

    async def go() -> tuple[int, str]:
        async with client_for(app) as client:
            resp = await client.get("/readyz")
            return resp.status, await resp.text()

    return asyncio.run(go())


def test_standby_replica_is_ready_and_says_standby(tmp_path: Path) -> None:
    assert _status(tmp_path, False) == (200, "ready (standby)\n")


def test_leader_replica_says_leader(tmp_path: Path) -> None:
    assert _status(tmp_path, True) == (200, "ready (leader)\n")


def test_leader_labels_its_own_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeKube()
    api.put(Kind.PODS, {"metadata": {"name": "ctl-0", "namespace": "gangslice-system"}})
    monkeypatch.setenv("POD_NAME", "ctl-0")
    monkeypatch.setenv("POD_NAMESPACE", "gangslice-system")
    asyncio.run(label_own_pod(api, True))
    assert api.peek(Kind.PODS, "ctl-0", "gangslice-system")["metadata"]["labels"][LEADER_LABEL] == "true"
    asyncio.run(label_own_pod(api, False))
    assert api.peek(Kind.PODS, "ctl-0", "gangslice-system")["metadata"]["labels"][LEADER_LABEL] == "false"


def test_without_controller_readiness_is_the_cache(tmp_path: Path) -> None:
    assert _status(tmp_path, None)[0] == 200


def test_a_standby_decides_nothing_and_says_why(tmp_path: Path) -> None:
    """Only the leader reserves or binds: a standby answers every verb with its error reply."""
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    app = build_app(cache)
    cache.book.fence.elect()
    member = gang_pod("g-0", "g", 2, 8)

    async def go() -> None:
        async with client_for(app) as client:
            body = {"Pod": member, "Nodes": None, "NodeNames": list(SMALL_CLUSTER_NODES)}
            got = await (await client.post("/gangslice/filter", json=body)).json()
            assert "standby" in got["Error"] and got["NodeNames"] == []
            assert await (await client.post("/gangslice/prioritize", json=body)).json() == []
            bind = {"PodName": "g-0", "PodNamespace": "llm", "PodUID": "", "Node": "h-0"}
            assert "standby" in (await (await client.post("/gangslice/bind", json=bind)).json())["Error"]
            assert cache.reservation("llm/g") is None
            cache.book.fence.hold_until(time.monotonic() + 60)
            cache.book.fence.leading = True
            got = await (await client.post("/gangslice/filter", json=body)).json()
            assert got["Error"] == "" and got["NodeNames"]
            assert cache.reservation("llm/g") is not None

    asyncio.run(go())
