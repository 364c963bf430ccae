"""serve --migration report: the plan for a gang that waited is told once, nothing is evicted
(extender.controllers.migration)."""

from __future__ import annotations

import asyncio
from typing import Any

from extender.controllers.migration.reporter import REASON, Migration, MigrationReporter
from extender.kube import names as keys
from extender.kube.api import Kind
from extender.placement.request import GangRequest, PodSet
from extender.reservations import ClusterCache
from extender.testing.extender import gang_pod, node_obj, pod_obj
from extender.testing.kube import FakeKube
from extender.testing.objects import make_node_topology
from extender.topology.presets import preset_graph

WIDE = GangRequest("llm/wide", (PodSet("experts", 2, 8, required_level="leaf"),))


def leaf(name: str) -> dict[str, str]:
    return {"fabric.topograph.run/tier-1": "s", "fabric.topograph.run/tier-0": name}


def fleet(now: list[float]) -> ClusterCache:
    """Leaf a: a1 (a movable 1-GPU replica on GPU 0) and a2; leaf c: c1, free."""
    cache = ClusterCache(clock=lambda: now[0])
    for kind in Kind:
        cache.replace(kind, [])
    for name, where in (("a1", "a"), ("a2", "a"), ("c1", "c")):
        cache.apply(Kind.NODES, "ADDED", node_obj(name, labels=leaf(where)))
        cache.apply(
            Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(name).graph(preset_graph("hgx-h100")).obj()
        )
    replica = movable("server-1", "a1", "0", restart="45")
    cache.apply(Kind.PODS, "ADDED", replica)
    cache.apply(Kind.PODS, "ADDED", gang_pod("wide-0", "wide", 2, 8))
    return cache


def movable(name: str, node: str, gpus: str, restart: str | None = None, mark: bool = True) -> dict[str, Any]:
    annotations = {keys.GPUS: gpus, **({keys.RESTART_SECONDS: restart} if restart else {})}
    labels = {keys.MOVABLE: "true"} if mark else {}
    pod = pod_obj(name, gpus=len(gpus.split(",")), labels=labels, node=node, phase="Running")
    pod["metadata"]["annotations"].update(annotations)
    return pod


def test_a_gang_that_waited_hears_the_plan_once_and_nothing_is_evicted() -> None:
    now = [0.0]
    cache = fleet(now)
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    api = FakeKube()
    reporter = MigrationReporter(api, after_s=600.0)
    assert asyncio.run(reporter.sync(cache, 599.0)) == []  # not waited long enough
    now[0] = 600.0
    (plan,) = asyncio.run(reporter.sync(cache, 600.0))
    assert plan.domain == "leaf a" and plan.restart_gpu_s == 45.0
    assert [(m.gang, m.slots[0].node) for m in plan.moves] == [("llm/server-1", "c1")]
    for _ in range(2):
        asyncio.run(reporter.sync(cache, 700.0))
    (event,) = api.events
    assert event["reason"] == REASON and event["involvedObject"]["name"] == "wide-0"
    assert "would move 1 replica(s) off leaf a" in event["message"]
    assert "llm/server-1 from a1 to c1" in event["message"] and "45 GPU-seconds" in event["message"]
    assert not [c for c in api.calls if c.subresource == "eviction"]
    assert (cache.book.migration_plans, cache.book.migration_moves, cache.book.migration_restart_gpu_s) == (
        1,
        1,
        45.0,
    )
    # Placed, the gang is no longer waited for.
    cache.waiting.placed(WIDE.name)
    assert asyncio.run(reporter.sync(cache, 800.0)) == []


def test_only_pods_marked_movable_outside_gangs_are_planned_with_and_off_means_off() -> None:
    now = [600.0]
    cache = fleet(now)
    cache.apply(Kind.PODS, "MODIFIED", movable("server-1", "a1", "0", mark=False))
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    assert asyncio.run(MigrationReporter(FakeKube(), after_s=0.0).sync(cache, 600.0)) == []
    cache = fleet(now)
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    api = FakeKube()
    assert asyncio.run(MigrationReporter(api, Migration.OFF, after_s=0.0).sync(cache, 600.0)) == []
    assert not api.events
