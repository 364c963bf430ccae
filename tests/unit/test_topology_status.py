"""A NodeTopology that fails validation is never dropped silently: the node is kept out of
placement with the field and the problem named (the filter's reason, ``gangslice explain``),
and the NodeTopology and its Node say so in the API."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from extender.commands.explain import refused_nodes
from extender.controllers.topology_status.reporter import TopologyStatusReporter
from extender.httpapi.decide import Decider
from extender.httpapi.nodelist import filter_known
from extender.kube.api import Kind
from extender.kube.pods import PodInfo
from extender.kube.topology_status import ACCEPTED, INVALID_NODE_TOPOLOGY, INVALID_SPEC, SPEC_VALID
from extender.reservations import ClusterCache
from extender.testing.clock import FakeClock
from extender.testing.extender import pod_obj
from extender.testing.objects import make_node_object, make_node_topology

ZERO = "spec.nvlinkGbps: Input should be greater than 0"


def topology(node: str, **spec: Any) -> dict[str, Any]:
    """The HGX H100 NodeTopology the agent publishes for ``node``, with ``spec`` fields changed."""
    obj = make_node_topology(node).hgx_h100().obj()
    obj["spec"].update(spec)
    return obj


def two_node_cache() -> ClusterCache:
    """A synced cache of nodes a and b, each an HGX H100 with its NodeTopology."""
    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    for name in ("a", "b"):
        cache.apply(Kind.NODES, "ADDED", make_node_object(name).obj())
        cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", topology(name))
    return cache


def test_a_zero_nvlink_bandwidth_keeps_the_node_out_with_the_field_named() -> None:
    cache = two_node_cache()
    assert cache.node_names() == ["a", "b"]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology("b", nvlinkGbps=0))
    assert cache.node_names() == ["a"]
    assert cache.refused_topologies() == {"b": ZERO}
    # Not a guessed graph from the Node's GPU count either: out until the agent fixes it.
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology("b", nvlinkGbps=50.0))
    assert cache.node_names() == ["a", "b"]
    assert cache.refused_topologies() == {}


def test_a_relist_refuses_the_same_way() -> None:
    cache = two_node_cache()
    cache.replace(Kind.NODE_TOPOLOGIES, [topology("a"), topology("b", nvlinkGbps=0)])
    assert cache.node_names() == ["a"]
    assert cache.refused_topologies() == {"b": ZERO}
    cache.apply(Kind.NODE_TOPOLOGIES, "DELETED", topology("b", nvlinkGbps=0))
    assert cache.refused_topologies() == {}


def test_the_filter_and_explain_name_the_reason() -> None:
    cache = two_node_cache()
    decider = Decider(cache)
    pod = PodInfo.from_obj(pod_obj("p", gpus=1))
    assert decider.filter(pod, ["a", "b"]).passed == ["a", "b"]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology("b", nvlinkGbps=0))
    out = decider.filter(pod, ["a", "b"])
    assert out.passed == ["a"]
    # Failed, not unresolvable: the agent may republish a good spec.
    assert out.failed == {"b": f"NodeTopology b is refused: {ZERO}"}
    assert out.unresolvable == {}
    assert refused_nodes(cache) == [f"node b kept out of placement: its NodeTopology is refused: {ZERO}"]
    # The routes' filter (unknown names asked about as one stand-in) names it too.
    routed = filter_known(decider, pod, ["a", "b", "no-such-node"])
    assert routed.passed == ["a"]
    assert routed.failed["b"] == f"NodeTopology b is refused: {ZERO}"
    assert "not known to gangslice" in routed.failed["no-such-node"]


class RecordingStatusApi:
    def __init__(self) -> None:
        self.conditions: list[tuple[str, dict[str, str]]] = []
        self.events: list[dict[str, Any]] = []
        self.fail = False

    async def apply_condition(self, node: str, condition: Mapping[str, str]) -> None:
        if self.fail:
            raise RuntimeError("503: unavailable")
        self.conditions.append((node, dict(condition)))

    async def create_event(self, event: Mapping[str, Any]) -> None:
        self.events.append(dict(event))


def echo(cache: ClusterCache, obj: dict[str, Any], condition: Mapping[str, str]) -> None:
    """The watch event of our own status write."""
    obj["status"]["conditions"] = [*obj["status"]["conditions"], dict(condition)]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", obj)


def test_the_nodetopology_gets_a_condition_and_the_node_an_event(clock: FakeClock) -> None:
    cache = two_node_cache()
    api = RecordingStatusApi()
    reporter = TopologyStatusReporter(api)
    assert asyncio.run(reporter.sync(cache, clock())) == 0
    broken = topology("b", nvlinkGbps=0)
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", broken)
    assert asyncio.run(reporter.sync(cache, clock())) == 1
    ((node, cond),) = api.conditions
    assert node == "b"
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        ACCEPTED,
        "False",
        INVALID_SPEC,
        ZERO,
    )
    (event,) = api.events
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "b", "uid": "b"}
    assert (event["type"], event["reason"]) == ("Warning", INVALID_NODE_TOPOLOGY)
    assert ZERO in event["message"]
    # Nothing again while the write's echo is on its way, nor once it is seen.
    assert asyncio.run(reporter.sync(cache, clock())) == 0
    echo(cache, broken, cond)
    assert asyncio.run(reporter.sync(cache, clock())) == 0
    # The agent republishes a good spec (its status keeps our condition): True, no event.
    fixed = topology("b")
    fixed["status"]["conditions"] = [cond]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", fixed)
    assert cache.node_names() == ["a", "b"]
    assert asyncio.run(reporter.sync(cache, clock())) == 1
    node, cleared = api.conditions[-1]
    assert (node, cleared["status"], cleared["reason"]) == ("b", "True", SPEC_VALID)
    assert len(api.events) == 1
    fixed["status"]["conditions"] = [cleared]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", fixed)
    assert asyncio.run(reporter.sync(cache, clock())) == 0


def test_a_failed_write_is_tried_again_and_a_restart_converges(clock: FakeClock) -> None:
    cache = two_node_cache()
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology("b", nvlinkGbps=0))
    api = RecordingStatusApi()
    api.fail = True
    reporter = TopologyStatusReporter(api)
    assert asyncio.run(reporter.sync(cache, clock())) == 0
    api.fail = False
    assert asyncio.run(reporter.sync(cache, clock())) == 1
    # A new replica reads the object with the condition already on it: nothing to write.
    _, cond = api.conditions[-1]
    broken = topology("b", nvlinkGbps=0)
    broken["status"]["conditions"] = [cond]
    fresh = two_node_cache()
    fresh.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", broken)
    again = RecordingStatusApi()
    assert asyncio.run(TopologyStatusReporter(again).sync(fresh, clock())) == 0
    assert again.conditions == [] and again.events == []


def test_one_sync_writes_a_bounded_number(clock: FakeClock, monkeypatch: Any) -> None:
    monkeypatch.setattr("extender.controllers.topology_status.reporter.MAX_WRITES_PER_SYNC", 1)
    cache = two_node_cache()
    for name in ("a", "b"):
        cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(name, nvlinkGbps=0))
    api = RecordingStatusApi()
    reporter = TopologyStatusReporter(api)
    assert asyncio.run(reporter.sync(cache, clock())) == 1
    assert asyncio.run(reporter.sync(cache, clock())) == 1
    assert sorted(node for node, _ in api.conditions) == ["a", "b"]


def test_a_degraded_gpu_link_sets_interconnect_healthy_false_and_an_event_naming_the_gpu(
    clock: FakeClock,
) -> None:
    from extender.kube.topology_status import (
        GPU_INTERCONNECT_DEGRADED,
        INTERCONNECT_DEGRADED,
        INTERCONNECT_HEALTHY,
        LINKS_WITHIN_THRESHOLDS,
    )

    cache = two_node_cache()
    api = RecordingStatusApi()
    reporter = TopologyStatusReporter(api)
    why = "nvlink_crc_errors at 10.0/s (threshold 1/s)"
    sick = [{"index": 5, "healthy": False, "reason": why, "nvlinkErrorsPerSecond": 10.0}]
    obj = topology("b", health=sick)
    for gpu in obj["spec"]["gpus"]:
        gpu["uuid"] = f"GPU-b-{gpu['index']}"
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", obj)
    named = "GPU5 (GPU-b-5)"
    assert cache.interconnect_problems() == {"b": f"{named}: {why}"}
    assert 5 not in cache.snapshot().free_gpus("b")  # given to no gang
    line = f"node b has GPUs given to no gang (interconnect degraded): {named}: {why}"
    assert line in refused_nodes(cache)
    asyncio.run(reporter.sync(cache, clock()))
    ((node, cond),) = [(n, c) for n, c in api.conditions if c["type"] == INTERCONNECT_HEALTHY]
    assert (node, cond["status"], cond["reason"]) == ("b", "False", INTERCONNECT_DEGRADED)
    assert f"{named}: {why}" in cond["message"]
    (event,) = [e for e in api.events if e["reason"] == GPU_INTERCONNECT_DEGRADED]
    assert event["involvedObject"]["name"] == "b" and "GPU5" in event["message"]
    echo(cache, obj, cond)
    assert asyncio.run(reporter.sync(cache, clock())) == 0  # shown: nothing more to write
    healed = topology("b")
    healed["status"] = obj["status"]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", healed)
    asyncio.run(reporter.sync(cache, clock()))
    last = [c for n, c in api.conditions if c["type"] == INTERCONNECT_HEALTHY][-1]
    assert (last["status"], last["reason"]) == ("True", LINKS_WITHIN_THRESHOLDS)


def test_explain_names_a_gpu_whose_links_retry_and_the_share_it_is_priced_at() -> None:
    cache = two_node_cache()
    retrying = [{"index": 3, "healthy": True, "nvlinkErrorsPerSecond": 0.5, "pcieReplaysPerSecond": 0.0}]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology("a", health=retrying))
    assert cache.retrying_links() == {"a": "GPU3: NVLink at 67% (0.5 errors/s), PCIe at 100% (0 replays/s)"}
    assert cache.interconnect_problems() == {}  # healthy: no condition, no Event
    (line,) = [x for x in refused_nodes(cache) if "retry" in x]
    assert line.startswith("node a has GPUs whose links retry") and "GPU3: NVLink at 67%" in line
