"""The kubelet's report is the truth: a bound pod whose GPUs, as the node agent reports the
kubelet's allocation, differ from its ``gangslice.io/gpus`` promise is counted as reported,
its reservation slot follows the kubelet, its SliceReservation says so (``DevicesMismatch``,
both sets, whether the reported set meets the pod set's rule), a metric counts it, an Event
tells the pod, and ``--on-mismatch`` evicts it: by default only when its GPUs break its pod
set's rule, with ``evict`` always (a PodDisruptionBudget's 429 is no error)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from extender.controllers.mismatch.reporter import EVICTED, EVICTION_BLOCKED, MismatchReporter, OnMismatch
from extender.httpapi.metrics import Metrics
from extender.kube import names as keys
from extender.kube.api import PODS, Kind
from extender.kube.devices import COHERENCE_BROKEN, DEVICES_DIFFER, DEVICES_MATCH, DEVICES_MISMATCH
from extender.placement.ledger import Ledger, LedgerError
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot, Slice
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore, KubeReservationStore
from extender.testing.extender import gang_pod, node_obj
from extender.testing.kube import FakeKube
from extender.testing.objects import make_node_topology
from extender.testing.reserve import hold
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph

NODE = "a"


def with_uuids(graph: GpuGraph) -> GpuGraph:
    """The graph as NVML discovery gives it: every GPU with a UUID."""
    gpus = tuple(
        dataclasses.replace(g, uuid=f"GPU-{g.index:08x}-0000-0000-0000-000000000000") for g in graph.gpus
    )
    return dataclasses.replace(graph, gpus=gpus)


def uuid(graph: GpuGraph, index: int) -> str:
    got = graph.gpu(index).uuid
    assert got is not None
    return got


def kube_cache(**kw: Any) -> ClusterCache:
    cache = ClusterCache(**kw)
    for kind in Kind:
        cache.replace(kind, [])
    return cache


def topology(graph: GpuGraph, held: dict[str, list[int]]) -> dict[str, Any]:
    """The NodeTopology the agent publishes when the kubelet gave pod ``llm/<name>`` those GPUs."""
    topology = make_node_topology(NODE).graph(graph)
    for pod, gpus in sorted(held.items()):
        topology = topology.in_use(pod, *gpus)
    return topology.obj()


def one_pod_gang(name: str, gpus: int, required: str | None = None) -> GangRequest:
    return GangRequest(name, (PodSet("main", 1, gpus, required_level=required),))


def bound_pod(name: str, gang: str, gpus: tuple[int, ...], uid: str = "") -> dict[str, Any]:
    pod = gang_pod(name, gang, 1, len(gpus), node=NODE, phase="Running", uid=uid or f"uid-{name}")
    pod["metadata"]["annotations"][keys.GPUS] = ",".join(map(str, gpus))
    return pod


def setup(
    preset: str = "hgx-h100", gpus: int = 4, required: str | None = None, **kw: Any
) -> tuple[ClusterCache, GpuGraph, PodSlot]:
    """A node of ``preset`` and gang ``llm/g`` (one pod of ``gpus`` GPUs) held and bound as promised."""
    graph = with_uuids(preset_graph(preset))
    cache = kube_cache(**kw)
    cache.apply(Kind.NODES, "ADDED", node_obj(NODE))
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", topology(graph, {}))
    placed = hold(cache, "llm/g", one_pod_gang("llm/g", gpus, required))
    assert isinstance(placed, Slice)
    slot = placed.slots[0]
    extra = {keys.REQUIRED_LEVEL: required} if required else {}
    pod = bound_pod("g-0", "g", slot.gpus)
    pod["metadata"]["annotations"].update(extra)
    cache.apply(Kind.PODS, "ADDED", pod)
    r = cache.reservation("llm/g")
    assert r is not None and r.bound == {slot.key: "g-0"}
    return cache, graph, slot


def devices_condition(store: InMemoryReservationStore) -> dict[str, Any] | None:
    """The DevicesMismatch condition of gang ``llm/g``'s SliceReservation."""
    obj = store.objects[("llm", "g")]
    for c in obj["status"]["conditions"]:
        if c["type"] == DEVICES_MISMATCH:
            return dict(c)
    return None


def test_what_the_kubelet_reports_wins_and_the_slot_follows_it() -> None:
    store = InMemoryReservationStore()
    cache, graph, slot = setup(store=store)
    promised = set(slot.gpus)
    reported = sorted(set(range(8)) - promised)[:4]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": reported}))
    # The pod's GPUs are the kubelet's, the slot moved onto them, the promised ones are free.
    assert cache.gpus_of("llm/g-0") == frozenset(reported)
    assert cache.snapshot().node(NODE).allocated == frozenset(reported)
    r = cache.reservation("llm/g")
    assert r is not None and r.slice.slot(slot.key).gpus == tuple(reported)
    assert cache.view().free_gpus(NODE) == frozenset(promised)
    # The next gang is promised the free GPUs, never the ones in use.
    nxt = hold(cache, "llm/h", one_pod_gang("llm/h", 4))
    assert isinstance(nxt, Slice) and set(nxt.slots[0].gpus) == promised
    (m,) = cache.device_mismatches()
    assert (m.pod, m.gang, m.slot, m.promised, m.reported) == (
        "llm/g-0",
        "llm/g",
        slot.key,
        slot.gpus,
        tuple(reported),
    )
    assert cache.mismatches_found == {NODE: 1}
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and c["status"] == "True" and c["reason"] == DEVICES_DIFFER
    for i in (*slot.gpus, *reported):
        assert uuid(graph, i) in c["message"]
    assert ",".join(map(str, slot.gpus)) in c["message"] and ",".join(map(str, reported)) in c["message"]
    assert "meets the pod set's rule" in c["message"] and "follows the kubelet" in c["message"]


def test_a_reported_set_that_breaks_the_pod_sets_rule_says_so() -> None:
    """Two GPUs on one PCIe switch of a two-socket PCIe node were promised; the kubelet gave
    one of them and one across the sockets."""
    store = InMemoryReservationStore()
    cache, graph, slot = setup("pcie-8gpu-2socket", gpus=2, store=store)
    far = 7 if slot.gpus[0] < 4 else 0
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": [slot.gpus[0], far]}))
    (m,) = cache.device_mismatches()
    assert not m.coherent
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and c["reason"] == COHERENCE_BROKEN
    assert "breaks the pod set's rule (PCIe-switch-local or tighter)" in c["message"]


def test_a_required_in_node_level_is_the_rule_judged() -> None:
    """Required ``numa``: a NUMA-local set other than the promised one still meets it."""
    store = InMemoryReservationStore()
    cache, graph, slot = setup("pcie-8gpu-2socket", gpus=2, required="numa", store=store)
    numa = graph.gpu(slot.gpus[0]).numa_node
    same = [g.index for g in graph.gpus if g.numa_node == numa and g.index not in slot.gpus][:2]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": same}))
    (m,) = cache.device_mismatches()
    assert m.coherent and m.actual is not None and m.rule is not None and m.actual <= m.rule
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and c["reason"] == DEVICES_DIFFER and "NUMA-local or tighter" in c["message"]


def test_the_condition_clears_when_the_sets_agree_and_when_the_pod_goes() -> None:
    store = InMemoryReservationStore()
    cache, graph, slot = setup(store=store)
    other = sorted(set(range(8)) - set(slot.gpus))[:4]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": other}))
    asyncio.run(cache.flush())
    first = devices_condition(store)
    assert first is not None and first["status"] == "True"
    # The pod's annotation is now what the kubelet reports (e.g. a fresh pod bound there).
    pod = bound_pod("g-0", "g", tuple(other))
    cache.apply(Kind.PODS, "MODIFIED", pod)
    assert cache.device_mismatches() == []
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and c["status"] == "False" and c["reason"] == DEVICES_MATCH
    # A second difference, then the pod is deleted: False again; one count per difference.
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": list(slot.gpus)}))
    assert len(cache.device_mismatches()) == 1 and cache.mismatches_found == {NODE: 2}
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": list(slot.gpus)}))
    assert cache.mismatches_found == {NODE: 2}  # the same difference again is not a new one
    cache.apply(Kind.PODS, "DELETED", pod)
    assert cache.device_mismatches() == []


def test_gpus_reserved_for_another_gang_keep_the_slot_on_its_promise() -> None:
    """The kubelet gave the pod GPUs another gang holds: the ledger never double-books, the
    condition says why the slot stays, and the GPUs count as in use anyway."""
    store = InMemoryReservationStore()
    cache, graph, slot = setup(store=store)
    other = hold(cache, "llm/h", one_pod_gang("llm/h", 4))
    assert isinstance(other, Slice)
    taken = list(other.slots[0].gpus)
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": taken}))
    r = cache.reservation("llm/g")
    assert r is not None and r.slice.slot(slot.key).gpus == slot.gpus
    assert cache.snapshot().node(NODE).allocated == frozenset(taken)
    (m,) = cache.device_mismatches()
    assert "llm/h" in m.not_corrected
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and "keeps the promise" in c["message"] and "llm/h" in c["message"]


def test_the_followed_slot_is_persisted_and_a_restart_rebuilds_it() -> None:
    store = InMemoryReservationStore()
    cache, graph, slot = setup(store=store)
    other = sorted(set(range(8)) - set(slot.gpus))[:4]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": other}))
    asyncio.run(cache.flush())
    again = kube_cache(store=store)
    again.apply(Kind.NODES, "ADDED", node_obj(NODE))
    again.apply(Kind.NODE_TOPOLOGIES, "ADDED", topology(graph, {"g-0": other}))
    again.apply(Kind.PODS, "ADDED", bound_pod("g-0", "g", slot.gpus))
    assert asyncio.run(again.rebuild_ledger()) == 1
    r = again.reservation("llm/g")
    assert r is not None and r.slice.slot(slot.key).gpus == tuple(other)
    assert again.view().free_gpus(NODE) == frozenset(slot.gpus)


def test_the_kube_store_writes_the_condition_to_the_status_subresource() -> None:
    api = FakeKube()
    cache, graph, slot = setup(store=KubeReservationStore(api))
    asyncio.run(cache.flush())
    other = sorted(set(range(8)) - set(slot.gpus))[:4]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": other}))
    asyncio.run(cache.flush())
    obj = api.peek(Kind.SLICE_RESERVATIONS, "g", "llm")
    assert obj is not None
    assert obj["spec"]["slice"]["pods"][0]["gpus"] == other
    types = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert types == {"Held": "True", DEVICES_MISMATCH: "True"}


def test_metrics_count_mismatches_per_node_and_pods_mismatched_now() -> None:
    cache, graph, slot = setup()
    other = sorted(set(range(8)) - set(slot.gpus))[:4]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": other}))
    text = Metrics(cache).render().decode()
    assert f'gangslice_devices_mismatch_total{{node="{NODE}"}} 1.0' in text
    assert "gangslice_devices_mismatched_pods 1.0" in text
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": list(slot.gpus)}))
    text = Metrics(cache).render().decode()
    assert "gangslice_devices_mismatched_pods 0.0" in text
    assert f'gangslice_devices_mismatch_total{{node="{NODE}"}} 1.0' in text


def api_with_pod(cache: ClusterCache) -> FakeKube:
    api = FakeKube()
    pod = cache.watched_pod("llm", "g-0")
    assert pod is not None
    api.put(
        PODS, {"metadata": {"name": "g-0", "namespace": "llm", "uid": pod.uid}, "spec": {"nodeName": NODE}}
    )
    return api


def mismatched() -> tuple[ClusterCache, InMemoryReservationStore]:
    store = InMemoryReservationStore()
    cache, graph, slot = setup(store=store)
    other = sorted(set(range(8)) - set(slot.gpus))[:4]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": other}))
    return cache, store


def test_report_tells_the_pod_once_and_evicts_nothing() -> None:
    cache, _ = mismatched()
    api = api_with_pod(cache)
    reporter = MismatchReporter(api, OnMismatch.REPORT)
    for _ in range(3):
        assert asyncio.run(reporter.sync(cache, 0.0)) == 0
    (event,) = api.events
    assert event["type"] == "Warning" and event["reason"] == DEVICES_MISMATCH
    assert event["involvedObject"]["kind"] == "Pod" and event["involvedObject"]["name"] == "g-0"
    assert "the kubelet reports" in event["message"]
    assert not [c for c in api.calls if c.subresource == "eviction"]
    assert api.peek(PODS, "g-0", "llm") is not None


def test_evict_evicts_the_pod_through_the_eviction_subresource() -> None:
    cache, store = mismatched()
    api = api_with_pod(cache)
    reporter = MismatchReporter(api, OnMismatch.EVICT)
    assert asyncio.run(reporter.sync(cache, 0.0)) == 1
    assert [c.label for c in api.calls if c.subresource == "eviction"] == ["create pods/eviction"]
    assert api.peek(PODS, "g-0", "llm") is None
    assert [e["reason"] for e in api.events] == [DEVICES_MISMATCH, EVICTED]
    assert cache.mismatch_evictions == {"evicted": 1}
    assert asyncio.run(reporter.sync(cache, 1.0)) == 0  # not evicted twice
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and "evicted to be placed again" in c["message"]


def test_by_default_only_a_pod_whose_gpus_break_its_rule_is_evicted() -> None:
    """The default (``evict-incoherent``): a pod on GPUs that still meet its pod set's rule keeps
    them (its slot follows the kubelet); one across the sockets where one PCIe switch was
    required is evicted, not left to crash-loop on its preflight holding them."""
    cache, _ = mismatched()  # HGX: any four GPUs are one NVLink island
    (m,) = cache.device_mismatches()
    assert m.coherent
    api = api_with_pod(cache)
    reporter = MismatchReporter(api)
    assert reporter.on_mismatch is OnMismatch.EVICT_INCOHERENT
    assert asyncio.run(reporter.sync(cache, 0.0)) == 0
    assert api.peek(PODS, "g-0", "llm") is not None
    cache, graph, slot = setup("pcie-8gpu-2socket", gpus=2)
    far = 7 if slot.gpus[0] < 4 else 0
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": [slot.gpus[0], far]}))
    (m,) = cache.device_mismatches()
    assert not m.coherent
    api = api_with_pod(cache)
    reporter = MismatchReporter(api)
    assert asyncio.run(reporter.sync(cache, 0.0)) == 1
    assert api.peek(PODS, "g-0", "llm") is None
    assert [e["reason"] for e in api.events] == [DEVICES_MISMATCH, EVICTED]
    assert cache.mismatch_evictions == {"evicted": 1}


def test_a_disruption_budget_429_is_reported_and_retried_next_period() -> None:
    cache, store = mismatched()
    api = api_with_pod(cache)
    api.budget_blocks.add("llm/g-0")
    reporter = MismatchReporter(api, OnMismatch.EVICT)
    assert asyncio.run(reporter.sync(cache, 0.0)) == 0
    assert asyncio.run(reporter.sync(cache, 5.0)) == 0
    assert len([c for c in api.calls if c.subresource == "eviction"]) == 2
    assert [e["reason"] for e in api.events] == [DEVICES_MISMATCH, EVICTION_BLOCKED]
    assert "PodDisruptionBudget" in api.events[1]["message"]
    assert cache.mismatch_evictions == {"blocked": 2}
    asyncio.run(cache.flush())
    c = devices_condition(store)
    assert c is not None and "PodDisruptionBudget" in c["message"]
    text = Metrics(cache).render().decode()
    assert 'gangslice_mismatch_evictions_total{result="blocked"} 2.0' in text
    api.budget_blocks.clear()
    assert asyncio.run(reporter.sync(cache, 10.0)) == 1
    assert api.peek(PODS, "g-0", "llm") is None


def test_move_slot_never_double_books() -> None:
    ledger = Ledger()
    a = Slice("ns/a", (PodSlot("p", 0, "n", (0, 1)), PodSlot("p", 1, "n", (2, 3))), {})
    b = Slice("ns/b", (PodSlot("p", 0, "n", (4, 5)),), {})
    ledger.reserve(a, 0.0)
    ledger.reserve(b, 0.0)
    with pytest.raises(LedgerError, match="reserved for ns/b"):
        ledger.move_slot("ns/a", "p/0", (4, 6))
    with pytest.raises(LedgerError, match="another slot"):
        ledger.move_slot("ns/a", "p/0", (2, 6))
    r = ledger.move_slot("ns/a", "p/0", (7, 6), (1,))
    assert r.slice.slot("p/0").gpus == (6, 7) and r.slice.slot("p/0").numa_nodes == (1,)
    assert ledger.held() == {"n": frozenset({2, 3, 4, 5, 6, 7})}
    assert ledger.move_slot("ns/a", "p/0", (6, 7)) is r


@pytest.mark.parametrize("uuids", [True, False], ids=["graph-with-uuids", "graph-without"])
def test_bind_writes_the_slots_gpu_uuids_when_the_graph_has_them(uuids: bool) -> None:
    from extender.httpapi.decide import Decider
    from extender.kube.pods import PodInfo
    from extender.testing.extender import pod_obj

    graph = preset_graph("hgx-h100")
    graph = with_uuids(graph) if uuids else graph
    cache = kube_cache()
    cache.apply(Kind.NODES, "ADDED", node_obj(NODE))
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(NODE).graph(graph).obj())
    placed = hold(cache, "llm/g", one_pod_gang("llm/g", 4))
    assert isinstance(placed, Slice)
    decider = Decider(cache)
    gang = decider.plan_bind(PodInfo.from_obj(gang_pod("g-0", "g", 1, 4)), NODE)
    lone = decider.plan_bind(PodInfo.from_obj(pod_obj("lone", gpus=2)), NODE)
    for plan in (gang, lone):
        annotations = plan.annotations()
        assert annotations[keys.GPUS] == ",".join(map(str, plan.gpus))
        if uuids:
            assert annotations[keys.GPU_UUIDS] == ",".join(uuid(graph, i) for i in plan.gpus)
        else:
            assert keys.GPU_UUIDS not in annotations
        # The NICs next to the GPUs (one per GPU on an HGX board), in the three spellings.
        nics = graph.near_nics(plan.gpus)
        assert len(nics) == len(plan.gpus) and annotations[keys.NICS] == ",".join(nics)
        assert annotations[keys.NCCL_IB_HCA] == "=" + ",".join(nics)
        assert annotations[keys.UCX_NET_DEVICES] == ",".join(f"{nic}:1" for nic in nics)
    assert gang.gpus == placed.slots[0].gpus


def test_devices_nvml_does_not_see_change_nothing_held() -> None:
    """Bad input reaching the cache: the agent lists a device of the pod without a GPU index
    (NVML does not see it; the agent's DevicesKnown condition names it). The pod keeps its
    promised GPUs, its slot stays, nothing is counted as a mismatch."""
    cache, graph, slot = setup()
    topo = topology(graph, {})
    ghost = {"deviceId": "GPU-ghost", "namespace": "llm", "pod": "g-0", "container": "main"}
    topo["spec"]["devicesInUse"] = [ghost]
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topo)
    assert cache.refused_topologies() == {}
    assert cache.gpus_of("llm/g-0") == frozenset(slot.gpus)
    assert cache.device_mismatches() == []
    r = cache.reservation("llm/g")
    assert r is not None and r.slice.slot(slot.key).gpus == slot.gpus


def test_explain_shows_the_pods_whose_devices_differ() -> None:
    from extender.commands.explain import add_mismatches
    from extender.controllers.explain import Facts, render, to_json

    cache, graph, slot = setup()
    reported = sorted(set(range(8)) - set(slot.gpus))[:4]
    facts = Facts(target="gang llm/g", reservation=cache.reservation("llm/g"))
    add_mismatches(cache, facts)
    assert facts.mismatches == []
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology(graph, {"g-0": reported}))
    add_mismatches(cache, facts)
    assert len(facts.mismatches) == 1
    words = ",".join(map(str, reported))
    assert f"the kubelet reports {words} (GPU-" in render(facts)
    assert "devices differ: pod llm/g-0 on a" in render(facts)
    assert to_json(facts)["devicesMismatch"] == facts.mismatches
