"""At the HTTP edge only bad input and unplaceable gangs are verdicts: an internal error
(a bug, of whatever exception type) answers as an error, in the verb's error form, is
logged with its traceback once and counted as ``error``, never as "unresolvable"."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from extender.httpapi.app import build_app
from extender.reservations import ClusterCache
from extender.testing.extender import client_for, gang_pod, pod_obj, write_cluster


def _bug(*args: Any, **kwargs: Any) -> Any:
    raise ValueError("an internal inconsistency")


def _errors(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('gangslice_decisions_total{outcome="error"}'):
            return float(line.split()[-1])
    return 0.0


async def _call(app: Any, verb: str, body: dict[str, Any]) -> tuple[int, Any, float]:
    async with client_for(app) as client:
        resp = await client.post(f"/gangslice/{verb}", json=body)
        reply = await resp.json()
        metrics = await (await client.get("/metrics")).text()
        return resp.status, reply, _errors(metrics)


@pytest.mark.parametrize(
    ("target", "pod"),
    [
        ("extender.reservations.reserve.place", gang_pod("g-0", "g", 2, 8)),  # placing a plain gang
        ("extender.httpapi.decide.resolve_need", pod_obj("solo", gpus=4)),  # a GPU pod's in-node rule
    ],
)
def test_an_internal_error_in_filter_answers_as_an_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    target: str,
    pod: dict[str, Any],
) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    names = cache.node_names()
    monkeypatch.setattr(target, _bug)
    caplog.set_level(logging.ERROR, logger="extender.httpapi.handling")
    status, reply, errors = asyncio.run(_call(build_app(cache), "filter", {"Pod": pod, "NodeNames": names}))
    assert status == 200
    assert reply["Error"] == "internal error in filter: ValueError: an internal inconsistency"
    assert not reply["FailedAndUnresolvableNodes"] and not reply["NodeNames"]
    assert errors == 1.0
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and "filter failed" in logged[0].getMessage()


def test_a_bad_level_name_is_still_a_verdict(tmp_path: Path) -> None:
    """Bad input stays a verdict: every node unresolvable, named, and no internal error."""
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    names = cache.node_names()
    pod = gang_pod("g-0", "g", 2, 8, extra={"gangslice.io/required-level": "galaxy"})
    status, reply, errors = asyncio.run(_call(build_app(cache), "filter", {"Pod": pod, "NodeNames": names}))
    assert status == 200 and reply["Error"] == ""
    assert set(reply["FailedAndUnresolvableNodes"]) == set(names)
    assert "unknown level 'galaxy'" in next(iter(reply["FailedAndUnresolvableNodes"].values()))
    assert errors == 0.0


def test_an_internal_error_in_bind_is_undone_and_answered_as_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    class BrokenBinder:
        async def bind(self, *args: Any) -> None:
            raise TypeError("a bug in the binder")

    pod = pod_obj("solo", gpus=1)
    app = build_app(cache, binder=BrokenBinder())

    async def go() -> tuple[Any, float]:
        async with client_for(app) as client:
            filtered = await (
                await client.post("/gangslice/filter", json={"Pod": pod, "NodeNames": cache.node_names()})
            ).json()
            node = filtered["NodeNames"][0]
            body = {"PodName": "solo", "PodNamespace": "llm", "PodUID": "", "Node": node}
            reply = await (await client.post("/gangslice/bind", json=body)).json()
            return reply, _errors(await (await client.get("/metrics")).text())

    reply, errors = asyncio.run(go())
    assert reply["Error"] == "internal error in bind: TypeError: a bug in the binder"
    assert errors == 1.0
    assert cache.pod("llm", "solo") is not None and cache.pod("llm", "solo").node is None  # type: ignore[union-attr]
