"""Pod feasibility on the Kubernetes side: what Nodes and their pods give the cache, what a
Workload's pod template, a plain gang's pod and a PodGroup member ask for, and a template
field that cannot be read rejecting the Workload while the controller keeps serving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_kueue_controller import World
from test_kueue_logic import hierarchy

from extender.controllers.kueue import workload_gang
from extender.controllers.podgroups.groups import PodGroup, PodGroupError, gang_request
from extender.kube.api import Kind
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodError, PodInfo
from extender.placement.feasibility import Resources, Taint
from extender.placement.request import GangRequest, NodeNeeds, NodeRequirement, PodNeeds, Toleration
from extender.reservations import ClusterCache
from extender.testing.extender import gang_pod, node_obj, pod_obj
from extender.testing.fixtures import load_fixture

GI = 2**30
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def kube_cache() -> ClusterCache:
    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    return cache


def with_spec(obj: dict[str, Any], **spec: Any) -> dict[str, Any]:
    obj["spec"].update(spec)
    return obj


def test_the_cache_reads_taints_allocatable_and_what_non_terminal_pods_request() -> None:
    cache = kube_cache()
    node = node_obj("a")
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    node["status"]["allocatable"].update({"memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"})
    cache.apply(Kind.NODES, "ADDED", node)
    running = pod_obj("r", node="a", phase="Running")
    running["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "4", "memory": "100Gi"}}
    done = pod_obj("d", node="a", phase="Succeeded")
    done["spec"]["containers"][0]["resources"] = {"requests": {"memory": "300Gi"}}
    for p in (running, done, pod_obj("pending")):
        cache.apply(Kind.PODS, "ADDED", p)
    facts = cache.snapshot().node("a").facts
    assert facts.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert facts.allocatable == Resources(96_000, 512 * GI, 1024 * GI, 110)
    assert facts.requested == Resources(4_000, 100 * GI, 0, 1)  # the finished pod is not counted
    cache.apply(Kind.PODS, "DELETED", running)
    assert cache.snapshot().node("a").facts.requested == Resources(0, 0, 0, 0)
    # A cordon is a change of what the node offers even on an empty cluster.
    generation = cache.node_generation
    cache.apply(Kind.NODES, "MODIFIED", node_obj("a", unschedulable=True))
    assert cache.snapshot().node("a").facts.unschedulable and cache.node_generation > generation


def test_a_workload_pod_set_carries_its_templates_needs() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    spec = wl["spec"]["podSets"][0]["template"]["spec"]
    spec["nodeSelector"] = {"disk": "nvme"}
    spec["tolerations"] = [TOLERATE_GPU]
    spec["containers"][0]["resources"]["requests"] = {"cpu": "16", "memory": "256Gi"}
    gang = workload_gang.gang_from_workload(wl, hierarchy()).request
    ps = gang.pod_sets[0]
    assert NodeRequirement("disk", "In", ("nvme",)) in ps.node_selector
    assert ps.tolerations == (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"),)
    assert (ps.requests.cpu_millis, ps.requests.memory_bytes) == (16_000, 256 * GI)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda s: s.update(tolerations=[{"key": "k", "operator": "Gt", "value": "3"}]),
            "tolerations[0].operator",
        ),
        (lambda s: s.update(tolerations=[{"key": "k", "effect": "Later"}]), "tolerations[0].effect"),
        (lambda s: s["containers"][0]["resources"].update(requests={"memory": "lots"}), "requests[memory]"),
    ],
)
def test_an_unreadable_template_field_rejects_the_workload_and_the_controller_goes_on(
    change: Any, field: str
) -> None:
    async def body() -> None:
        w = World()
        await w.start()
        wl = load_fixture("kueue/workload-lws.yaml")
        change(wl["spec"]["podSets"][1]["template"]["spec"])
        await w.kueue_writes(wl, None)
        entry = w.our_entry()
        assert entry["state"] == "Rejected"
        assert field in entry["message"] and "template.spec" in entry["message"], entry["message"]
        assert w.api.objects("slicereservations") == []
        # The same controller still places a good Workload.
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), "MODIFIED")
        assert w.our_entry()["state"] == "Ready"

    asyncio.run(body())


def test_a_plain_gang_pod_set_carries_the_pods_needs_and_a_bad_one_is_an_error() -> None:
    pod = with_spec(gang_pod("g-0", "g", 2, 8), tolerations=[TOLERATE_GPU], nodeSelector={"disk": "nvme"})
    got = plain_gang_request(PodInfo.from_obj(pod))
    assert isinstance(got, GangRequest)
    ps = got.pod_sets[0]
    assert ps.node_needs == NodeNeeds(
        (NodeRequirement("disk", "In", ("nvme",)),),
        (),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"),),
    )
    bad = PodInfo.from_obj(
        with_spec(gang_pod("g-0", "g", 2, 8), tolerations=[{"key": "k", "operator": "Near"}])
    )
    assert bad.needs_problem is not None and bad.needs == PodNeeds()
    with pytest.raises(PodError, match=r"spec\.tolerations\[0\]\.operator"):
        plain_gang_request(bad)


def test_a_podgroup_pod_set_carries_its_first_members_needs_and_a_bad_one_fails_it() -> None:
    from extender.placement.snapshot import ClusterSnapshot, NodeState
    from extender.topology.presets import preset_graph

    snap = ClusterSnapshot([NodeState("n", {}, preset_graph("hgx-h100"))])
    pg = PodGroup("llm", "pg", min_member=1)
    member = with_spec(pod_obj("m-0", gpus=8), tolerations=[TOLERATE_GPU])
    got = gang_request(pg, [PodInfo.from_obj(member)], snap)
    assert got.pod_sets[0].tolerations == (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"),)
    bad = with_spec(pod_obj("m-0", gpus=8), tolerations=[{"key": "k", "effect": "Soon"}])
    with pytest.raises(PodGroupError, match="effect"):
        gang_request(pg, [PodInfo.from_obj(bad)], snap)


def test_a_resource_flavors_tolerations_count_as_the_pods_own() -> None:
    """Kueue adds the flavor's ``spec.tolerations`` to the pods it starts: nodes tainted
    ``nvidia.com/gpu:NoSchedule`` are open to the fixture flavor's pods, others' taints not."""
    from dataclasses import replace

    from test_kueue_controller import fixture_cluster

    from extender.placement.feasibility import NodeFacts
    from extender.placement.snapshot import ClusterSnapshot

    def tainted(key: str) -> ClusterSnapshot:
        base = fixture_cluster()
        facts = NodeFacts(taints=(Taint(key, "", "NoSchedule"),))
        return ClusterSnapshot([replace(n, facts=facts) for n in base.nodes], base.hierarchy)

    async def body(key: str) -> str:
        w = World(tainted(key))
        await w.start()
        await w.kueue_writes(load_fixture("kueue/workload-lws.yaml"), None)
        return str(w.our_entry()["state"]) + ": " + str(w.our_entry()["message"])

    assert asyncio.run(body("nvidia.com/gpu")).startswith("Ready"), "the flavor tolerates this taint"
    waiting = asyncio.run(body("dedicated"))
    assert waiting.startswith("Pending") and "TaintToleration" in waiting, waiting
