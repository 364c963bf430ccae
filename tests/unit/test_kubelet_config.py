"""The agent's reading of what the kubelet aligns to NUMA nodes (extender/agent/kubelet_config.py):
kubelet configuration fixtures (tests/fixtures/kubelet/, see SOURCE.md there), sysfs NUMA nodes,
CPU ids and memory from a real PodResources gRPC server, the ``kubelet`` field and the
``KubeletTopologyRead`` condition, and the way from there to a placement."""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.agent.agent import Agent, AgentConfig, Outcome
from extender.agent.discovery import Discovery
from extender.agent.kubelet_config import (
    CONDITION,
    KubeletProblem,
    KubeletReader,
    parse_config,
    read_config,
    read_numa_cpus,
)
from extender.agent.podresources import PodResourcesClient
from extender.agent.publish import build_object, build_spec
from extender.cli import main
from extender.httpapi.decide import Decider, Refused
from extender.kube.api import Kind
from extender.kube.crd_models import CrdError, NodeTopologyObject, parse_node_topology
from extender.kube.names import GPU_RESOURCE
from extender.kube.pods import PodInfo
from extender.placement.files import FileError, cluster_from_data
from extender.placement.request import GangRequest, PodRequests, PodSet
from extender.placement.slice import Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import place
from extender.reservations import ClusterCache
from extender.testing.clock import FakeClock
from extender.testing.extender import node_obj, pod_obj
from extender.testing.kubelet import FakeKubelet, serve
from extender.testing.publish import RecordingWriter
from extender.topology.fake_nvml import FakeNvml
from extender.topology.kubelet import CpuPolicy, MemoryPolicy, TopologyPolicy, TopologyScope
from extender.topology.presets import preset_graph

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kubelet"
NODE = "gpu-a-01"
GiB = 2**30


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kc"))  # short: unix socket paths are limited to 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


# -- the configuration file -------------------------------------------------------------------


def test_reads_the_alignment_settings_of_a_kubelet_configuration() -> None:
    got = read_config(FIXTURES / "single-numa-node.yaml")
    assert got.topology_manager_policy is TopologyPolicy.SINGLE_NUMA_NODE
    assert got.topology_manager_scope is TopologyScope.POD
    assert got.cpu_manager_policy is CpuPolicy.STATIC
    assert got.memory_manager_policy is MemoryPolicy.STATIC


def test_fields_left_out_take_the_kubelets_defaults() -> None:
    got = read_config(FIXTURES / "kubeadm-defaults.yaml")
    assert got.topology_manager_policy is TopologyPolicy.NONE
    assert got.topology_manager_scope is TopologyScope.CONTAINER
    assert got.cpu_manager_policy is CpuPolicy.NONE
    assert got.memory_manager_policy is MemoryPolicy.NONE


@pytest.mark.parametrize(
    ("text", "reason", "words"),
    [
        (
            (FIXTURES / "bad-policy.yaml").read_text(),
            "ConfigInvalid",
            "topologyManagerPolicy: 'single-numa' is not",
        ),
        (
            "kind: KubeletConfiguration\ncpuManagerPolicy: Static\n",
            "ConfigInvalid",
            "cpuManagerPolicy: 'Static'",
        ),
        ("kind: Pod\n", "ConfigInvalid", "kind: expected KubeletConfiguration, got 'Pod'"),
        ("- a list\n", "ConfigInvalid", "expected a KubeletConfiguration mapping"),
        ("kind: [unclosed\n", "ConfigInvalid", "not valid YAML"),
    ],
    ids=["misspelt-policy", "capitalised-cpu-policy", "wrong-kind", "not-a-mapping", "not-yaml"],
)
def test_a_configuration_that_makes_no_sense_names_the_field(text: str, reason: str, words: str) -> None:
    with pytest.raises(KubeletProblem) as err:
        parse_config(text, "kubelet configuration x.yaml")
    assert err.value.reason == reason
    assert words in str(err.value) and "x.yaml" in str(err.value)


def test_a_missing_file_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(KubeletProblem) as err:
        read_config(tmp_path / "config.yaml")
    assert err.value.reason == "ConfigUnreadable"
    assert "--kubelet-config" in str(err.value)


# -- sysfs ------------------------------------------------------------------------------------


def _numa(root: Path, cpus: dict[int, str]) -> Path:
    for n, text in cpus.items():
        (root / f"node{n}").mkdir(parents=True)
        (root / f"node{n}" / "cpulist").write_text(text + "\n")
    (root / "possible").write_text("0-1\n")  # other entries there are not NUMA nodes
    return root


def test_reads_each_numa_nodes_cpus(tmp_path: Path) -> None:
    root = _numa(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"})
    got = read_numa_cpus(root)
    assert got == {0: frozenset([0, 1, 2, 3, 8, 9, 10, 11]), 1: frozenset([4, 5, 6, 7, 12, 13, 14, 15])}


@pytest.mark.parametrize("cpus", [{}, {0: "zero-three"}], ids=["no-nodes", "garbage"])
def test_unreadable_sysfs_is_a_problem(tmp_path: Path, cpus: dict[int, str]) -> None:
    with pytest.raises(KubeletProblem) as err:
        read_numa_cpus(_numa(tmp_path, cpus))
    assert err.value.reason == "SysfsUnreadable"


# -- the agent: config + sysfs + PodResources -> the kubelet field ----------------------------


def _agent(workdir: Path, sock: Path, config: Path, fake: FakeNvml) -> tuple[Agent, RecordingWriter]:
    sysfs = fake.write_sysfs(workdir / "sys")
    writer = RecordingWriter()
    pr = PodResourcesClient(sock, min_interval_s=0.0)
    reader = KubeletReader(config, sysfs / "devices" / "system" / "node", pr)
    discovery = Discovery(lambda: fake, sysfs_root=sysfs, run=None)
    agent = Agent(AgentConfig(node=NODE), discovery, pr, writer, clock=FakeClock(5000.0), kubelet=reader)
    return agent, writer


def _condition(obj: dict[str, Any]) -> dict[str, str]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == CONDITION)


def test_publishes_policies_and_cpus_per_numa_node(workdir: Path) -> None:
    fake = FakeNvml.hgx_h100()  # NUMA node 0: CPUs 0-51, node 1: 52-103
    kubelet = FakeKubelet()
    kubelet.allocatable = {"nvidia.com/gpu": [g.uuid for g in fake.gpus]}
    kubelet.allocatable_cpus = [c for c in range(104) if c not in (0, 52)]  # reservedSystemCPUs
    kubelet.allocatable_memory = {0: 500 * GiB, 1: 512 * GiB}
    kubelet.assign("ml", "llama-0", "server", [g.uuid for g in fake.gpus[:4]])
    kubelet.pin("ml", "llama-0", "server", range(1, 41), memory=[(200 * GiB, (0,)), (64 * GiB, (0, 1))])
    with serve(kubelet, workdir / "k.sock") as sock:
        agent, writer = _agent(workdir, sock, FIXTURES / "single-numa-node.yaml", fake)
        assert agent.cycle() is Outcome.PUBLISHED
    obj = writer.published[-1]
    assert obj["spec"]["kubelet"] == {
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "cpuManagerPolicy": "static",
        "memoryManagerPolicy": "Static",
        "numaNodes": [
            {"id": 0, "cpus": "0-51", "allocatableCpus": "1-51", "cpusInUse": "1-40",
             "memory": 500 * GiB, "memoryInUse": 232 * GiB},
            {"id": 1, "cpus": "52-103", "allocatableCpus": "53-103", "cpusInUse": "",
             "memory": 512 * GiB, "memoryInUse": 32 * GiB},
        ],
    }  # fmt: skip
    cond = _condition(obj)
    assert (cond["status"], cond["reason"]) == ("True", "Read")
    NodeTopologyObject.model_validate(obj)  # what the CRD schema is generated from accepts it

    # The controller's side: the object -> the node's alignment -> a placement that keeps it.
    topo = parse_node_topology(obj)
    assert topo.kubelet is not None and topo.graph is not None
    assert [(n.id, n.cpus, n.cpus_in_use) for n in topo.kubelet.numa_nodes] == [(0, 51, 40), (1, 51, 0)]
    state = NodeState(NODE, {}, topo.graph, frozenset(range(4)), kubelet=topo.kubelet)
    snap = ClusterSnapshot([state])
    tp8 = GangRequest("g", (PodSet("w", 1, 8),))
    assert isinstance(
        place(ClusterSnapshot([NodeState(NODE, {}, topo.graph, kubelet=topo.kubelet)]), tp8), Unplaceable
    )
    ps = PodSet("w", 1, 4, requests=PodRequests(cpu_millis=32000, memory_bytes=100 * GiB, guaranteed=True))
    got = place(snap, GangRequest("g", (ps,)))
    assert isinstance(got, Slice) and got.slots[0].gpus == (4, 5, 6, 7)


def test_a_cpu_id_outside_the_node_is_named_and_the_rest_published(workdir: Path) -> None:
    fake = FakeNvml.hgx_h100()
    kubelet = FakeKubelet()
    kubelet.allocatable_cpus = [*range(104), 300]
    kubelet.pin("ml", "p", "c", [5, 6, 999])
    with serve(kubelet, workdir / "k.sock") as sock:
        agent, writer = _agent(workdir, sock, FIXTURES / "single-numa-node.yaml", fake)
        assert agent.cycle() is Outcome.PUBLISHED
    obj = writer.published[-1]
    cond = _condition(obj)
    assert (cond["status"], cond["reason"]) == ("False", "CpuOutsideNode")
    assert "GetAllocatableResources cpu_ids: CPUs 300" in cond["message"]
    assert "(and 1 more)" in cond["message"]
    nodes = obj["spec"]["kubelet"]["numaNodes"]
    assert [(n["allocatableCpus"], n["cpusInUse"]) for n in nodes] == [("0-51", "5-6"), ("52-103", "")]
    assert len(obj["spec"]["gpus"]) == 8  # the rest is published as before
    assert agent.metrics.discovery_errors.labels("kubelet")._value.get() == 1.0


def test_an_unreadable_configuration_leaves_the_field_out_and_says_so(workdir: Path) -> None:
    fake = FakeNvml.hgx_h100()
    with serve(FakeKubelet(), workdir / "k.sock") as sock:
        agent, writer = _agent(workdir, sock, workdir / "missing.yaml", fake)
        assert agent.cycle() is Outcome.PUBLISHED
    obj = writer.published[-1]
    assert "kubelet" not in obj["spec"] and len(obj["spec"]["gpus"]) == 8
    cond = _condition(obj)
    assert (cond["status"], cond["reason"]) == ("False", "ConfigUnreadable")
    assert "missing.yaml" in cond["message"]


def test_a_kubelet_that_cannot_be_asked_keeps_the_policies(workdir: Path) -> None:
    fake = FakeNvml.hgx_h100()
    agent, writer = _agent(workdir, workdir / "nobody.sock", FIXTURES / "single-numa-node.yaml", fake)
    assert agent.cycle() is Outcome.PUBLISHED
    obj = writer.published[-1]
    assert obj["spec"]["kubelet"]["topologyManagerPolicy"] == "single-numa-node"
    assert "numaNodes" not in obj["spec"]["kubelet"]
    assert _condition(obj)["reason"] == "PodResourcesUnavailable"


def test_the_command_reads_the_file_given(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubelet = FakeKubelet()
    kubelet.allocatable_cpus = list(range(104))
    with serve(kubelet, workdir / "k.sock") as sock:
        code = main(
            ["agent", "--once", "--dry-run", "--node", NODE, "--nvml-fake", "hgx-h100",
             "--pod-resources-socket", str(sock), "--kubelet-config", str(FIXTURES / "single-numa-node.yaml")]
        )  # fmt: skip
    assert code == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    k = obj["spec"]["kubelet"]
    assert k["topologyManagerPolicy"] == "single-numa-node"
    assert [(n["id"], n["allocatableCpus"]) for n in k["numaNodes"]] == [(0, "0-51"), (1, "52-103")]


# -- reading the field back, and cluster files ------------------------------------------------


def test_a_bad_cpu_list_in_the_object_names_the_field() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "n"},
        "spec": {
            "gpus": [],
            "links": [],
            "source": "none",
            "kubelet": {
                "topologyManagerPolicy": "restricted",
                "numaNodes": [{"id": 0, "allocatableCpus": "0-x"}],
            },
        },
    }
    with pytest.raises(CrdError) as err:
        parse_node_topology(obj)
    assert err.value.field == "spec.kubelet.numaNodes[0].allocatableCpus"
    obj["spec"]["kubelet"] = {"topologyManagerPolicy": "strict"}
    with pytest.raises(CrdError) as err2:
        parse_node_topology(obj)
    assert "kubelet.topologyManagerPolicy" in err2.value.field


def test_cluster_files_carry_the_kubelet_policies(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "nodes": [
            {
                "name": "hgx",
                "gpuTopology": "hgx-h100",
                "kubelet": {
                    "topologyManagerPolicy": "single-numa-node",
                    "cpuManagerPolicy": "static",
                    "memoryManagerPolicy": "Static",
                    "numaNodes": [
                        {"id": 0, "cpus": 56, "cpusInUse": 8, "memory": "512Gi"},
                        {"id": 1, "cpus": 56, "memory": 549755813888, "memoryInUse": "1Gi"},
                    ],
                },
            }
        ]
    }
    snap = cluster_from_data(data, tmp_path)
    k = snap.nodes[0].kubelet
    assert k is not None and k.topology_policy is TopologyPolicy.SINGLE_NUMA_NODE
    assert [(n.cpus_free, n.memory_bytes, n.memory_in_use) for n in k.numa_nodes] == [
        (48, 512 * GiB, 0),
        (56, 512 * GiB, GiB),
    ]
    assert isinstance(place(snap, GangRequest("g", (PodSet("w", 1, 8),))), Unplaceable)
    data["nodes"][0]["kubelet"]["topologyManagerPolicy"] = "single-numa"
    with pytest.raises(FileError, match="topologyManagerPolicy"):
        cluster_from_data(data, tmp_path)
    data["nodes"][0]["kubelet"] = {"numaNodes": [{"id": 0}, {"id": 0}]}
    with pytest.raises(FileError, match="kubelet: duplicate NUMA node ids"):
        cluster_from_data(data, tmp_path)


def aligning_cache(*nodes: str) -> ClusterCache:
    cache = ClusterCache()
    for kind in Kind:
        cache.replace(kind, [])
    for name in nodes:
        cache.apply(Kind.NODES, "ADDED", node_obj(name))
    return cache


def publish_numa(cache: ClusterCache, node: str, in_use_numa0: str) -> None:
    """An HGX H100 node's NodeTopology, its kubelet single-numa-node with the static CPU
    manager, 52 CPUs per NUMA node, ``in_use_numa0`` of NUMA node 0's taken."""
    spec = build_spec(preset_graph("hgx-h100"), "nvml", [], [])
    spec["kubelet"] = {
        "topologyManagerPolicy": "single-numa-node",
        "cpuManagerPolicy": "static",
        "numaNodes": [
            {"id": 0, "cpus": "0-51", "allocatableCpus": "0-51", "cpusInUse": in_use_numa0},
            {"id": 1, "cpus": "52-103", "allocatableCpus": "52-103", "cpusInUse": ""},
        ],
    }
    at = datetime(2026, 1, 1, tzinfo=UTC)
    cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", build_object(node, spec, [], at))


def test_the_cache_follows_the_published_cpus_and_places_by_them() -> None:
    cache = aligning_cache("a")

    def publish(in_use_numa0: str) -> None:
        publish_numa(cache, "a", in_use_numa0)

    ps = PodSet("w", 1, 4, requests=PodRequests(cpu_millis=32000, guaranteed=True))
    publish("")
    first = place(cache.snapshot(), GangRequest("g", (ps,)))
    assert isinstance(first, Slice) and first.slots[0].gpus == (0, 1, 2, 3)
    publish("0-29")  # a pod took 30 CPUs of NUMA node 0: 22 are left there
    second = place(cache.snapshot(), GangRequest("g", (ps,)))
    assert isinstance(second, Slice) and second.slots[0].gpus == (4, 5, 6, 7)


def test_gpu_pods_outside_gangs_are_held_to_the_topology_manager_in_every_verb() -> None:
    """The extender judges a plain GPU pod by the rules the solver holds gang pods to: on a
    single-numa-node kubelet with the static CPU manager, a Guaranteed pod's GPUs and CPUs
    come from one NUMA node (filter, prioritize, bind and preempt alike)."""
    cache = aligning_cache("a", "b")
    publish = functools.partial(publish_numa, cache)

    def pod(name: str, gpus: int, cpus: int) -> PodInfo:
        obj = pod_obj(name, gpus=gpus)
        want = {GPU_RESOURCE: str(gpus), "cpu": str(cpus), "memory": "64Gi"}
        obj["spec"]["containers"][0]["resources"] = {"requests": want, "limits": want}
        return PodInfo.from_obj(obj)

    publish("a", "0-29")  # 22 CPUs left on NUMA node 0 of node a
    publish("b", "")
    decider = Decider(cache)
    four = pod("four", 4, 32)
    assert decider.filter(four, ["a", "b"]).passed == ["a", "b"]
    assert decider.plan_bind(four, "a").gpus == (4, 5, 6, 7)  # not 0-3: their NUMA node lacks CPUs
    # GPUs 0-3 are left on a, beside 22 free CPUs: no room for a second such pod there.
    again = decider.filter(pod("other", 4, 32), ["a", "b"])
    assert again.passed == ["b"] and "topologyManagerPolicy single-numa-node" in again.failed["a"]

    eight = pod("eight", 8, 8)
    got = decider.filter(eight, ["a", "b"])
    assert got.passed == []
    # Never on this node type, however empty: unresolvable, so kube-scheduler does not preempt for it.
    assert "topologyManagerPolicy single-numa-node" in got.unresolvable["a"]
    assert "no NUMA node has 8 GPUs" in got.unresolvable["a"]
    # 4 GPUs with 60 CPUs: no NUMA node has 60, ever (52 each). (The 32-CPU pod above was only
    # unschedulable on a: pods there may free CPUs.)
    wide = decider.filter(pod("wide", 4, 60), ["a", "b"])
    assert set(wide.unresolvable) == {"a", "b"} and wide.passed == []
    assert decider.prioritize(eight, ["a", "b"]).values == [0, 0]
    assert decider.preempt(eight, {"a": [], "b": []}) == []
    with pytest.raises(Refused, match="no longer has 8 free GPUs"):
        decider.plan_bind(eight, "b")

    # A pod the kubelet aligns nothing of (BestEffort: no CPUs pinned) still needs its GPUs
    # on one NUMA node, as the devicemanager's hints do for any QoS.
    small = PodInfo.from_obj(pod_obj("q", gpus=4))
    assert decider.filter(small, ["a"]).passed == ["a"]
    assert decider.plan_bind(small, "a").gpus == (0, 1, 2, 3)
