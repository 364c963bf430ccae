"""/readyz follows the leader lease when the admission controller runs beside the extender."""

from __future__ import annotations

import asyncio
from pathlib import Path

from extender.kube.cache import ClusterCache
from extender.webhook.app import build_app
from extender.webhook.handling import LEADING
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


def test_standby_replica_is_not_ready(tmp_path: Path) -> None:
    status, text = _status(tmp_path, {"now": False})
    assert status == 503
    assert "standby" in text


def test_leader_replica_is_ready(tmp_path: Path) -> None:
    assert _status(tmp_path, {"now": True})[0] == 200


def test_without_controller_readiness_is_the_cache(tmp_path: Path) -> None:
    assert _status(tmp_path, None)[0] == 200
