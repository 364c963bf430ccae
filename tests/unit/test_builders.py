"""The test builders (extender/testing): each default and setter, named hardware for every
preset, and Kubernetes objects the upstream schemas accept."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from extender.agent.publish import build_object, build_spec
from extender.controllers.openapi import load_crd, validate, version_schema
from extender.cost import Comm
from extender.kube import names as keys
from extender.kube.crd_models import parse_node_topology
from extender.placement.feasibility import NO_FACTS, NodeFacts, Resources
from extender.placement.files import load_cluster
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.snapshot import NodeState
from extender.testing import hardware
from extender.testing.builders import make_cluster, make_gang, make_node, make_node_like
from extender.testing.extender import gang_pod, node_obj, pod_obj
from extender.testing.fixtures import FIXTURES, fixture_path, load_cluster_fixture, load_fixture
from extender.testing.objects import (
    make_node_object,
    make_node_topology,
    make_pod,
    make_pod_group,
    make_workload,
)
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import DEFAULT_LEVELS, Hierarchy, Level
from extender.topology.kubelet import KubeletAlignment, TopologyPolicy
from extender.topology.presets import PRESETS, preset_graph

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "tests" / "fixtures" / "upstream"

# -- named hardware ----------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_has_named_hardware_and_a_node_setter(preset: str) -> None:
    name = preset.replace("-", "_")
    assert getattr(hardware, name)() is preset_graph(preset)
    assert getattr(make_node("n"), name)().obj().graph is preset_graph(preset)
    assert getattr(make_node_topology("n"), name)().obj() == make_node_topology("n").preset(preset).obj()


def test_level_names_the_default_levels() -> None:
    assert [hardware.level(lv.name) for lv in DEFAULT_LEVELS] == list(DEFAULT_LEVELS)
    assert (hardware.level("spine").label, hardware.level("leaf").label) == (hardware.SPINE, hardware.LEAF)
    assert hardware.level("clique") == Level("clique", hardware.CLIQUE, kind="fabric")
    with pytest.raises(ValueError, match="no default level 'rack'"):
        hardware.level("rack")


# -- nodes -------------------------------------------------------------------------------------


def test_a_node_by_default_is_an_unlabelled_free_hgx_h100_under_the_device_plugin() -> None:
    got = make_node("n1").obj()
    assert got == NodeState("n1", {}, preset_graph("hgx-h100"))
    assert (got.allocation, got.facts, got.kubelet, got.mnnvl_gang) == (
        Allocation.DEVICE_PLUGIN,
        NO_FACTS,
        None,
        None,
    )


def test_every_node_setter_lands_in_its_field() -> None:
    facts = NodeFacts(allocatable=Resources(cpu_millis=1000))
    kubelet = KubeletAlignment(TopologyPolicy.SINGLE_NUMA_NODE)
    got = (
        make_node("n1")
        .pcie_8gpu_2socket()
        .core("c")
        .spine("s")
        .leaf("l")
        .clique("q")
        .label("x/y", "z")
        .labels({"a/b": "c"})
        .allocated(0, [1, 2])
        .unhealthy(7)
        .dra()
        .facts(facts)
        .kubelet(kubelet)
        .mnnvl_gang("g")
        .foreign_domain("d")
        .obj()
    )
    labels = {hardware.CORE: "c", hardware.SPINE: "s", hardware.LEAF: "l", hardware.CLIQUE: "q"}
    assert got == NodeState(
        "n1",
        {**labels, "x/y": "z", "a/b": "c"},
        preset_graph("pcie-8gpu-2socket"),
        frozenset({0, 1, 2}),
        frozenset({7}),
        mnnvl_gang="g",
        foreign_domain="d",
        allocation=Allocation.DRA,
        facts=facts,
        kubelet=kubelet,
    )


@pytest.mark.parametrize(
    ("build", "taken"),
    [
        (lambda b: b.allocated(range(3), 5), {0, 1, 2, 5}),
        (lambda b: b.busy(3), {0, 1, 2}),
        (lambda b: b.free(0, 1), {2, 3, 4, 5, 6, 7}),
        (lambda b: b.free_count(2), {0, 1, 2, 3, 4, 5}),
        (lambda b: b.free_count(8), set()),
        (lambda b: b.busy(3).allocated(7), {7}),  # the last word wins
        (lambda b: b.l40s_4gpu().free(3), {0, 1, 2}),  # "the rest" of the node's own GPUs
    ],
    ids=["allocated", "busy", "free", "free_count", "free_count-all", "last-wins", "free-on-4"],
)
def test_gpus_in_use(build: object, taken: set[int]) -> None:
    assert callable(build)
    assert build(make_node("n")).obj().allocated == frozenset(taken)


def test_free_count_beyond_the_node_is_refused() -> None:
    with pytest.raises(ValueError, match="9 free GPUs of 8"):
        make_node("n").free_count(9).obj()


def test_a_label_of_none_removes_it_and_hostname_follows_the_name() -> None:
    template = make_node().leaf("leaf-1").spine("s").hostname()
    got = template.named("a").leaf(None).obj()
    assert got.labels == {hardware.SPINE: "s", "kubernetes.io/hostname": "a"}
    own = template.named("b").label("kubernetes.io/hostname", "b.example").obj()
    assert own.labels["kubernetes.io/hostname"] == "b.example"


def test_a_template_is_not_changed_by_what_is_derived_from_it() -> None:
    template = make_node("t").hgx_h100().leaf("leaf-1")
    before = template.obj()
    template.named("x").dra().allocated(0).leaf("leaf-2").gb200_tray().obj()
    assert template.obj() == before


def test_make_node_like_rebuilds_the_node_it_was_given() -> None:
    node = (
        make_node("n")
        .gb200_tray()
        .leaf("l")
        .clique("c")
        .allocated(1)
        .unhealthy(2)
        .dra()
        .mnnvl_gang("g")
        .foreign_domain("d")
        .obj()
    )
    assert make_node_like(node).obj() == node
    assert make_node_like(node).busy(1).obj() == replace(node, allocated=frozenset({0}))


# -- clusters ----------------------------------------------------------------------------------


def test_a_cluster_takes_builders_and_states_in_order_with_the_default_hierarchy() -> None:
    a, b = make_node("a"), make_node("b").leaf("l").obj()
    got = make_cluster(a, b).nodes(make_node("c")).obj()
    assert [n.name for n in got.nodes] == ["a", "b", "c"]
    assert got.hierarchy == Hierarchy()
    assert got.nodes[1] is b


def test_levels_by_name_or_level_and_held_gpus() -> None:
    rack = Level("rack", "x/rack", kind="group")
    got = make_cluster(make_node("a")).levels("spine", "leaf", rack).reserved("a", 0, 1).obj()
    assert got.hierarchy == Hierarchy((hardware.level("spine"), hardware.level("leaf"), rack))
    assert got.reserved == {"a": frozenset({0, 1})}
    assert got.nodes == [make_node("a").obj()]


def test_a_cluster_template_is_not_changed_by_what_is_derived_from_it() -> None:
    template = make_cluster().levels("leaf")
    template.nodes(make_node("a")).obj()
    assert template.obj().nodes == []


# -- gangs -------------------------------------------------------------------------------------


def test_a_gang_with_pod_sets_and_a_colocation_in_words() -> None:
    got = (
        make_gang("pd")
        .pod_set("prefill", count=2, gpus=4, comm=Comm.NONE, required_level="leaf")
        .pod_set("decode", 1, 8, Comm.KV_TRANSFER, colocate_with="prefill@clique")
        .obj()
    )
    assert got == GangRequest(
        "pd",
        (
            PodSet("prefill", 2, 4, Comm.NONE, required_level="leaf"),
            PodSet("decode", 1, 8, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "clique")),
        ),
    )
    assert make_gang().pod_set("w").obj() == GangRequest("g", (PodSet("w", 1, 1),))


def test_a_gang_is_checked_as_any_gang_request() -> None:
    with pytest.raises(ValueError, match="duplicate pod set names"):
        make_gang("g").pod_set("w").pod_set("w").obj()
    with pytest.raises(ValueError, match="no pod sets"):
        make_gang("g").obj()


# -- Kubernetes objects ------------------------------------------------------------------------


def test_a_pod_is_what_the_api_writes() -> None:
    got = make_pod("w-0").gpus(4).gang("tp4", size=2).on_node("h-0").running().obj()
    assert got == {
        "metadata": {
            "name": "w-0",
            "namespace": "llm",
            "uid": "uid-llm-w-0",
            "labels": {keys.GANG: "tp4"},
            "annotations": {keys.GANG_SIZE: "2"},
        },
        "spec": {
            "schedulerName": "gangslice-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "vllm/vllm-openai",
                    "resources": {
                        "requests": {keys.GPU_RESOURCE: "4"},
                        "limits": {keys.GPU_RESOURCE: "4"},
                    },
                }
            ],
            "nodeName": "h-0",
        },
        "status": {"phase": "Running"},
    }
    assert got == gang_pod("w-0", "tp4", 2, 4, node="h-0", phase="Running")
    cpu = make_pod("c", "ns").uid("u").scheduler("volcano").obj()
    assert cpu["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1"}}
    assert cpu == pod_obj("c", namespace="ns", uid="u", scheduler="volcano")


def test_a_node_object_has_gpu_capacity_and_the_product_label() -> None:
    got = make_node_object("h-0").labels({hardware.LEAF: "leaf-1"}).obj()
    assert got == {
        "metadata": {
            "name": "h-0",
            "labels": {
                "kubernetes.io/hostname": "h-0",
                hardware.LEAF: "leaf-1",
                keys.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
            },
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": "96", keys.GPU_RESOURCE: "8"},
            "allocatable": {"cpu": "96", keys.GPU_RESOURCE: "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    bare = make_node_object("c").gpus(0).product(None).not_ready().unschedulable().obj()
    assert bare["status"]["capacity"] == {"cpu": "96"}
    assert bare["spec"] == {"unschedulable": True}
    assert bare["status"]["conditions"] == [{"type": "Ready", "status": "False"}]
    assert keys.GPU_PRODUCT_LABEL not in bare["metadata"]["labels"]
    assert bare == node_obj("c", gpus=0, product=None, ready=False, unschedulable=True)


def test_a_node_topology_is_what_the_agent_publishes_and_reads_back() -> None:
    graph = preset_graph("pcie-8gpu-2socket")
    got = make_node_topology("p-0").pcie_8gpu_2socket().in_use("w-0", 0, 1).in_use("w-1", 4, container="c")
    in_use = [
        {"deviceId": "GPU-0", "index": 0, "namespace": "llm", "pod": "w-0", "container": "main"},
        {"deviceId": "GPU-1", "index": 1, "namespace": "llm", "pod": "w-0", "container": "main"},
        {"deviceId": "GPU-4", "index": 4, "namespace": "llm", "pod": "w-1", "container": "c"},
    ]
    published = datetime(2026, 1, 1, tzinfo=UTC)
    assert got.obj() == build_object("p-0", build_spec(graph, "nvml", in_use, []), [], published)
    topo = parse_node_topology(got.dra().obj())
    assert topo.node == "p-0" and topo.graph == graph
    crd = load_crd(REPO / "manifests" / "crds" / "gangslice.io_nodetopologies.yaml")
    validate(version_schema(crd, "v1alpha1"), got.owned_by_node("u-1").obj(), "NodeTopology")


def test_a_workload_is_a_kueue_v1beta2_workload() -> None:
    at = "2026-08-25T10:05:00Z"
    got = (
        make_workload("tp4")
        .label(keys.GANG, "tp4")
        .annotation(keys.COLOCATE_WITH, "a@leaf")
        .pod_set("main", 2, 4, annotations={keys.COMM: "allreduce"})
        .pod_set("claims", 1, claim="gpus", restart_policy="Never")
        .quota_reserved(at)
        .condition("Admitted", "False", at, reason="UnsatisfiedAdmissionChecks")
        .check("gangslice")
        .obj()
    )
    main, claims = got["spec"]["podSets"]
    assert main["template"]["spec"]["containers"][0]["resources"] == {"limits": {keys.GPU_RESOURCE: "4"}}
    assert claims["template"]["spec"]["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "gpus"}
    ]
    assert [c["type"] for c in got["status"]["conditions"]] == ["QuotaReserved", "Admitted"]
    assert got["status"]["admission"]["podSetAssignments"][0] == {
        "name": "main",
        "count": 2,
        "flavors": {"cpu": "default"},
    }
    assert got["status"]["admissionChecks"] == [
        {"name": "gangslice", "state": "Pending", "message": "", "lastTransitionTime": at}
    ]
    crd = load_crd(UPSTREAM / "kueue" / "kueue.x-k8s.io_workloads.yaml")
    validate(version_schema(crd, "v1beta2"), got, "Workload")
    bare = make_workload("w").obj()
    assert (bare["spec"], bare["status"]) == ({"active": True, "queueName": "gpu", "podSets": []}, {})


def test_a_pod_group_is_a_volcano_v1beta1_pod_group() -> None:
    got = (
        make_pod_group("pg")
        .min_member(4)
        .min_task_member("worker", 3)
        .min_gpus(32)
        .queue("default")
        .annotation(keys.COMM, "allreduce")
        .phase("Inqueue")
        .obj()
    )
    assert got["spec"] == {
        "minMember": 4,
        "minTaskMember": {"worker": 3},
        "queue": "default",
        "minResources": {keys.GPU_RESOURCE: "32"},
    }
    crd = load_crd(UPSTREAM / "volcano" / "scheduling.volcano.sh_podgroups.yaml")
    validate(version_schema(crd, "v1beta1"), got, "PodGroup")


# -- fixtures ----------------------------------------------------------------------------------


def test_load_fixture_gives_one_document_or_the_list_and_a_fresh_copy_each_time() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    assert wl["kind"] == "Workload"
    wl["metadata"]["name"] = "changed"
    assert load_fixture("kueue/workload-lws.yaml")["metadata"]["name"] == "leaderworkerset-vllm-0-3f2a1"
    pods = load_fixture("volcano/pods-llama.yaml")
    assert isinstance(pods, list) and len(pods) > 1 and all(p["kind"] == "Pod" for p in pods)
    assert fixture_path("kueue/cluster.yaml") == FIXTURES / "kueue" / "cluster.yaml"
    with pytest.raises(FileNotFoundError, match=r"no fixture 'kueue/nothing\.yaml'"):
        load_fixture("kueue/nothing.yaml")


def test_load_cluster_fixture_is_the_cli_reading_of_the_file() -> None:
    got = load_cluster_fixture("volcano/gb200.yaml")
    want = load_cluster(FIXTURES / "volcano" / "gb200.yaml")
    assert got.nodes == want.nodes and got.hierarchy == want.hierarchy
    assert got is not load_cluster_fixture("volcano/gb200.yaml")
