"""/readyz and the leader label when the admission controller runs beside the extender."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extender.kube.api import Kind
from extender.kube.cache import ClusterCache
from extender.kube.fake import FakeKubeApi
from extender.kube.names import LEADER_LABEL
from extender.webhook.app import build_app
from extender.webhook.handling import LEADING
from extender.webhook.server import label_own_pod
from extender.webhook.testing import client_for, write_cluster


def _status(tmp_path: Path, leading: dict[str, bool] | None) -> tuple[int, str]:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    app = build_app(cache, housekeeping_s=None)
    if leading is not None:
        app[LEADING] = leading

    async def go() -> tuple[int, str]:
        async with client_for(app) as client:
            resp = await client.get("/readyz")
            return resp.status, await resp.text()

    return asyncio.run(go())


def test_standby_replica_is_ready_and_says_standby(tmp_path: Path) -> None:
    assert _status(tmp_path, {"now": False}) == (200, "ready (standby)\n")


def test_leader_replica_says_leader(tmp_path: Path) -> None:
    assert _status(tmp_path, {"now": True}) == (200, "ready (leader)\n")


def test_leader_labels_its_own_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeKubeApi()
    api.put(Kind.PODS, {"metadata": {"name": "ctl-0", "namespace": "gangslice-system"}})
    monkeypatch.setenv("POD_NAME", "ctl-0")
    monkeypatch.setenv("POD_NAMESPACE", "gangslice-system")
    asyncio.run(label_own_pod(api, True))
    assert api.get_pod("gangslice-system", "ctl-0")["metadata"]["labels"][LEADER_LABEL] == "true"
    asyncio.run(label_own_pod(api, False))
    assert api.get_pod("gangslice-system", "ctl-0")["metadata"]["labels"][LEADER_LABEL] == "false"


def test_without_controller_readiness_is_the_cache(tmp_path: Path) -> None:
    assert _status(tmp_path, None)[0] == 200
