"""The cycle collector's pause: shared by overlapping requests, bounded in time, and never
turning on a collector that someone else turned off."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender.httpapi.app import build_app
from extender.httpapi.collector import CollectorPause
from extender.httpapi.decide import Decider
from extender.httpapi.handling import PAUSE
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, node_obj, pod_obj, write_cluster


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_overlapping_holders_share_one_pause() -> None:
    pause = CollectorPause()
    first, second = pause.held(), pause.held()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled() and pause.holders == 1
    second.__exit__(None, None, None)
    assert gc.isenabled() and pause.holders == 0


def test_the_collector_comes_back_after_an_error() -> None:
    pause = CollectorPause()
    with pytest.raises(RuntimeError), pause.held():
        raise RuntimeError("handler failed")
    assert gc.isenabled()


def test_a_collector_turned_off_elsewhere_stays_off() -> None:
    gc.disable()
    pause = CollectorPause()
    with pause.held():
        pass
    assert not gc.isenabled()


def test_a_pause_that_never_ends_still_collects_after_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    collected: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collected.append(generation) or 0)
    pause = CollectorPause(max_pause_s=1.0, clock=lambda: now[0])
    outer = pause.held()
    outer.__enter__()
    for t in (0.5, 0.9):  # requests come and go inside the bound: nothing collected
        now[0] = t
        with pause.held():
            pass
    assert collected == []
    now[0] = 1.5
    with pause.held():
        pass
    assert collected == [1] and not gc.isenabled()
    now[0] = 2.0  # the bound counts again from that collection
    with pause.held():
        pass
    assert collected == [1]
    outer.__exit__(None, None, None)
    assert gc.isenabled()


def test_requests_decide_with_the_collector_paused_and_leave_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter with a full NodeList decides while the collector is off; it is on again
    between requests, and no collection starts while a request holds its body."""
    inside: list[tuple[bool, int]] = []
    started_inside: list[int] = []
    decide = Decider.filter

    def probe(self: Decider, *args: Any, **kwargs: Any) -> Any:
        inside.append((gc.isenabled(), PAUSE.holders))
        return decide(self, *args, **kwargs)

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and PAUSE.holders:
            started_inside.append(info["generation"])

    monkeypatch.setattr(Decider, "filter", probe)
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
    nodes = [node_obj(n) for n in SMALL_CLUSTER_NODES]
    body = {"Pod": pod_obj("solo", gpus=4), "Nodes": {"items": nodes * 40}, "NodeNames": None}

    async def run() -> list[bool]:
        between: list[bool] = []
        async with client_for(build_app(cache)) as client:
            for _ in range(5):
                resp = await client.post("/gangslice/filter", json=body)
                assert resp.status == 200 and (await resp.json())["Error"] == ""
                between.append(gc.isenabled())
        return between

    gc.callbacks.append(watch)
    try:
        assert asyncio.run(run()) == [True] * 5
    finally:
        gc.callbacks.remove(watch)
    assert inside == [(False, 1)] * 5
    assert started_inside == []
