"""The node agent: fake NVML + a real PodResources gRPC server -> the NodeTopology it publishes."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.agent.agent import Agent, AgentConfig, Outcome
from extender.agent.discovery import TOPO_COMMAND, UUID_COMMAND, CommandFailed, Discovery, parse_uuids
from extender.agent.podresources import PodResourcesClient
from extender.agent.publish import (
    APPLY_CONTENT_TYPE,
    FIELD_MANAGER,
    KubeWriter,
    change_key,
)
from extender.cli import main
from extender.kube.api import Forbidden, Kind
from extender.kube.client import ApiServerClient
from extender.kube.crd_models import parse_node_topology
from extender.testing.clock import FakeClock
from extender.testing.kube import FakeKube
from extender.testing.kubelet import FakeKubelet, serve
from extender.testing.publish import RecordingWriter
from extender.topology.allocation import Allocation
from extender.topology.fake_nvml import FakeNvml
from extender.topology.model import GpuHealth
from extender.topology.nvidia_smi import render_topo
from extender.topology.nvml import (
    HealthThresholds,
    NvmlBackend,
    NvmlError,
    NvmlUnavailable,
    discover,
    health_counters,
    health_from_rates,
)
from extender.topology.serialize import graph_from_dict, graph_to_dict

NODE = "gpu-a-01"
NODE_UID = "0b5e7e3c-1d2f-4a6b-8c9d-0e1f2a3b4c5d"
INTERVAL = 30.0


class Wall:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def __call__(self) -> datetime:
        return datetime(2026, 8, 1, 12, 0, tzinfo=UTC) + timedelta(seconds=self.clock.now - 5000.0)


@dataclass
class Node:
    """One fake GPU node with its kubelet, and an agent over both."""

    fake: FakeNvml
    sysfs: Path
    kubelet: FakeKubelet
    socket: Path
    clock: FakeClock
    writer: RecordingWriter
    agent: Agent

    def uuid(self, index: int) -> str:
        return self.fake.gpus[index].uuid

    def step(self, seconds: float = INTERVAL) -> Outcome:
        self.clock.now += seconds
        return self.agent.cycle()

    @property
    def last(self) -> dict[str, Any]:
        return self.writer.published[-1]


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in obj["status"]["conditions"]}


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ag"))  # short: unix socket paths are limited to 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _opener(backend: NvmlBackend) -> Callable[[], NvmlBackend]:
    return lambda: backend


def _agent(
    fake: FakeNvml | None,
    socket: Path,
    sysfs: Path | None,
    clock: FakeClock,
    writer: RecordingWriter,
    *,
    thresholds: HealthThresholds | None = None,
    open_nvml: Any = None,
    run: Any = None,
    **config: Any,
) -> Agent:
    if open_nvml is None:
        assert fake is not None
        open_nvml = _opener(fake)
    discovery = Discovery(open_nvml, sysfs_root=sysfs, run=run, thresholds=thresholds, clock=clock)
    client = PodResourcesClient(socket, clock=clock)
    return Agent(
        AgentConfig(**{"node": NODE, "interval_s": INTERVAL, **config}),
        discovery,
        client,
        writer,
        clock=clock,
        wall=Wall(clock),
        rng=random.Random(7),
    )


@pytest.fixture
def node(workdir: Path) -> Iterator[Node]:
    """A running agent on a fake HGX H100 (NVML, sysfs, a kubelet on a socket): not a
    NodeState, so none of the placement builders (:mod:`extender.testing.builders`)."""
    fake = FakeNvml.hgx_h100()
    sysfs = fake.write_sysfs(workdir / "sys")
    kubelet = FakeKubelet()
    kubelet.allocatable = {"nvidia.com/gpu": [g.uuid for g in fake.gpus]}
    clock = FakeClock(5000.0)
    writer = RecordingWriter(uid=NODE_UID)
    with serve(kubelet, workdir / "kubelet.sock") as sock:
        agent = _agent(fake, sock, sysfs, clock, writer)
        yield Node(fake, sysfs, kubelet, sock, clock, writer, agent)


# --- what is published -----------------------------------------------------------------


def test_publishes_the_allocation_mode_the_operator_names(workdir: Path) -> None:
    """`gangslice agent --allocation dra` publishes spec.allocation: dra, and the object reads
    back as a DRA node (the cache's NodeState then places by gangslice's own choice)."""
    fake = FakeNvml.hgx_h100()
    sysfs = fake.write_sysfs(workdir / "sys")
    kubelet = FakeKubelet()
    kubelet.allocatable = {"nvidia.com/gpu": [g.uuid for g in fake.gpus]}
    writer = RecordingWriter(uid=NODE_UID)
    with serve(kubelet, workdir / "kubelet.sock") as sock:
        for mode in Allocation:
            agent = _agent(fake, sock, sysfs, FakeClock(5000.0), writer, allocation=mode)
            obj = agent.build()
            assert obj["spec"]["allocation"] == str(mode)
            assert parse_node_topology(obj).allocation is mode


def test_publishes_the_node_topology(node: Node) -> None:
    node.kubelet.assign("ml", "llama-0", "server", [node.uuid(3), f"{node.uuid(2)}::1"])
    node.kubelet.assign("ml", "llama-0", "server", ["MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"])

    assert node.agent.cycle() is Outcome.PUBLISHED

    obj = node.last
    assert obj["apiVersion"] == "gangslice.io/v1alpha1"
    assert obj["kind"] == "NodeTopology"
    assert obj["metadata"] == {
        "name": NODE,
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID}],
    }
    spec = obj["spec"]
    graph = discover(node.fake, sysfs_root=node.sysfs)
    graph = dataclasses.replace(graph, health=health_from_rates({}, health_counters(node.fake), 1.0))
    kubelet_part = ("devicesInUse", "allocatableDevices", "source", "allocation")
    graph_part = {k: v for k, v in spec.items() if k not in kubelet_part}
    assert graph_part == graph_to_dict(graph)
    assert len(spec["gpus"]) == 8 and len(spec["nics"]) == 8
    assert spec["devicesInUse"] == [
        {"deviceId": node.uuid(2), "index": 2, "namespace": "ml", "pod": "llama-0", "container": "server"},
        {"deviceId": node.uuid(3), "index": 3, "namespace": "ml", "pod": "llama-0", "container": "server"},
        {"deviceId": "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "namespace": "ml", "pod": "llama-0",
         "container": "server"},
    ]  # fmt: skip
    assert spec["allocatableDevices"] == sorted(g.uuid for g in node.fake.gpus)
    assert spec["source"] == "nvml"
    assert spec["allocation"] == "devicePlugin"  # the default of `gangslice agent --allocation`
    conditions = _conditions(obj)
    assert conditions["Discovered"] == {
        "type": "Discovered",
        "status": "True",
        "reason": "Nvml",
        "message": "8 GPUs discovered through NVML",
        "lastTransitionTime": "2026-08-01T12:00:00Z",
    }
    assert conditions["PodResourcesAvailable"]["status"] == "True"
    assert conditions["PodResourcesAvailable"]["message"] == "2 of 8 allocatable GPUs held by 1 pods"
    assert obj["status"]["lastPublished"] == "2026-08-01T12:00:00Z"
    assert obj["status"]["observedGeneration"] == 1
    # The reader of the spec gets the published graph back.
    assert graph_to_dict(graph_from_dict(spec)) == graph_part


def test_a_second_cycle_with_no_change_publishes_nothing(node: Node) -> None:
    assert node.agent.cycle() is Outcome.PUBLISHED
    assert node.step() is Outcome.UNCHANGED
    node.fake.add_errors(0, pcie_replays=30)  # 1/s: a rate, but far below the threshold
    assert node.step() is Outcome.UNCHANGED
    assert len(node.writer.published) == 1
    assert node.kubelet.calls["List"] == 3  # it did look each time


def test_a_pod_taking_a_gpu_publishes_once(node: Node) -> None:
    node.agent.cycle()
    node.kubelet.assign("ml", "decode-1", "server", [node.uuid(6)])
    assert node.step() is Outcome.PUBLISHED
    assert node.step() is Outcome.UNCHANGED
    assert len(node.writer.published) == 2
    assert [(d["index"], d["pod"]) for d in node.last["spec"]["devicesInUse"]] == [(6, "decode-1")]
    node.kubelet.remove("ml", "decode-1")
    assert node.step() is Outcome.PUBLISHED
    assert node.last["spec"]["devicesInUse"] == []


def test_an_nvlink_error_rate_over_the_threshold_marks_the_gpu_unhealthy_once(node: Node) -> None:
    node.agent.cycle()
    node.clock.now += INTERVAL
    node.fake.add_errors(5, crc=300)  # 10 CRC errors/s over the 30 s interval; threshold 1/s
    assert node.agent.cycle() is Outcome.PUBLISHED
    health = {h["index"]: h for h in node.last["spec"]["health"]}
    assert health[5]["healthy"] is False
    assert health[5]["nvlinkErrorsPerSecond"] == pytest.approx(10.0)
    assert "nvlink_crc_errors at 10.0/s" in health[5]["reason"]
    assert all(h["healthy"] for i, h in health.items() if i != 5)
    assert _conditions(node.last)["Discovered"]["message"].endswith("unhealthy: GPU5")
    node.fake.add_errors(5, crc=330)  # still 11/s: unhealthy, same state, no write
    assert node.step() is Outcome.UNCHANGED
    assert node.step() is Outcome.PUBLISHED  # the errors stopped: healthy again
    assert all(h["healthy"] for h in node.last["spec"]["health"])
    assert len(node.writer.published) == 3


def test_a_pcie_replay_rate_uses_its_own_configurable_threshold(workdir: Path) -> None:
    fake = FakeNvml.pcie_2socket()
    kubelet, clock, writer = FakeKubelet(), FakeClock(5000.0), RecordingWriter()
    with serve(kubelet, workdir / "k.sock") as sock:
        agent = _agent(fake, sock, None, clock, writer, thresholds=HealthThresholds(pcie_replays_per_s=100.0))
        agent.cycle()
        clock.now += INTERVAL
        fake.add_errors(1, pcie_replays=30 * 50)  # 50/s: unhealthy by default, not with 100/s allowed
        # Healthy, but its PCIe bandwidth is priced down by steps: the rate is published.
        assert agent.cycle() is Outcome.PUBLISHED
        (entry,) = [h for h in writer.published[-1]["spec"]["health"] if h["index"] == 1]
        assert entry["healthy"] is True and entry["pcieReplaysPerSecond"] == pytest.approx(50.0)
        clock.now += INTERVAL
        fake.add_errors(1, pcie_replays=30 * 150)
        assert agent.cycle() is Outcome.PUBLISHED
    health = {h["index"]: h for h in writer.published[-1]["spec"]["health"]}
    assert health[1]["healthy"] is False
    assert "pcie_replays at 150.0/s (threshold 100/s)" in health[1]["reason"]


def test_counters_that_cannot_be_read_mark_only_that_gpu_unhealthy(node: Node) -> None:
    node.fake.fail[("pcie_replay_counter", 4)] = NvmlError("GPU is lost")
    node.agent.cycle()
    health = {h["index"]: h for h in node.last["spec"]["health"]}
    assert health[4]["healthy"] is False and "GPU is lost" in health[4]["reason"]
    assert sum(h["healthy"] for h in health.values()) == 7
    assert node.last["spec"]["source"] == "nvml"


def test_published_objects_validate_against_the_crd(node: Node, workdir: Path) -> None:
    from extender.controllers.openapi import load_crd, validate, version_schema

    crd = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "gangslice.io_nodetopologies.yaml"
    schema = version_schema(load_crd(crd), "v1alpha1")
    node.kubelet.assign("ml", "p", "c", [node.uuid(1), "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"])
    objects = [node.agent.build()]
    node.fake.add_errors(2, crc=10**6)
    node.clock.now += INTERVAL
    objects.append(node.agent.build())  # with an unhealthy GPU2
    tray = FakeNvml.gb200_tray(bytes(range(1, 17)), 4)
    objects.append(_agent(tray, workdir / "none.sock", None, FakeClock(5000.0), RecordingWriter()).build())

    def no_nvml() -> NvmlBackend:
        raise NvmlUnavailable("no driver")

    objects.append(
        _agent(
            None, workdir / "none.sock", None, FakeClock(5000.0), RecordingWriter(), open_nvml=no_nvml
        ).build()
    )
    assert [o["spec"]["source"] for o in objects] == ["nvml", "nvml", "nvml", "none"]
    assert objects[1]["spec"]["health"][2]["healthy"] is False
    for obj in objects:
        validate(schema, obj, "NodeTopology")


# --- failures become conditions --------------------------------------------------------


def test_a_missing_socket_is_a_condition_and_the_agent_recovers(workdir: Path) -> None:
    fake, clock, writer = FakeNvml.dgx_a100(), FakeClock(5000.0), RecordingWriter()
    sock = workdir / "kubelet.sock"
    agent = _agent(fake, sock, None, clock, writer)

    assert agent.cycle() is Outcome.PUBLISHED
    obj = writer.published[-1]
    pr = _conditions(obj)["PodResourcesAvailable"]
    assert pr["status"] == "False" and pr["reason"] == "SocketMissing"
    assert f"{sock} does not exist" in pr["message"]
    assert obj["spec"]["devicesInUse"] == [] and obj["spec"]["allocatableDevices"] == []
    assert obj["spec"]["source"] == "nvml" and len(obj["spec"]["gpus"]) == 8
    clock.now += INTERVAL
    assert agent.cycle() is Outcome.UNCHANGED  # same failure, same object: no write

    kubelet = FakeKubelet()
    kubelet.allocatable = {"nvidia.com/gpu": [g.uuid for g in fake.gpus]}
    with serve(kubelet, sock):
        clock.now += INTERVAL
        assert agent.cycle() is Outcome.PUBLISHED
    pr = _conditions(writer.published[-1])["PodResourcesAvailable"]
    assert pr["status"] == "True" and pr["lastTransitionTime"] == "2026-08-01T12:01:00Z"
    assert len(writer.published[-1]["spec"]["allocatableDevices"]) == 8


def test_nvml_raising_is_a_condition_and_the_agent_recovers(node: Node) -> None:
    node.fake.fail["topology_common_ancestor"] = NvmlError("NVML_ERROR_GPU_IS_LOST")
    assert node.agent.cycle() is Outcome.PUBLISHED
    obj = node.last
    assert obj["spec"]["source"] == "none"
    assert obj["spec"]["gpus"] == [] and obj["spec"]["links"] == []
    discovered = _conditions(obj)["Discovered"]
    assert discovered["status"] == "False" and discovered["reason"] == "NoTopologySource"
    assert "NVML_ERROR_GPU_IS_LOST" in discovered["message"]
    # the kubelet still answers; ids it reports are kept even without a graph to map them to
    assert _conditions(obj)["PodResourcesAvailable"]["status"] == "True"

    del node.fake.fail["topology_common_ancestor"]
    assert node.step() is Outcome.PUBLISHED
    assert node.last["spec"]["source"] == "nvml"
    assert _conditions(node.last)["Discovered"]["status"] == "True"


def test_any_exception_from_the_backend_is_contained(node: Node) -> None:
    node.fake.fail["device_count"] = RuntimeError("segfault-ish surprise")
    assert node.agent.cycle() is Outcome.PUBLISHED
    assert "segfault-ish surprise" in _conditions(node.last)["Discovered"]["message"]


def _smi(graph_text: str, uuids: dict[int, str]) -> Any:
    def run(args: Sequence[str]) -> str:
        if tuple(args) == TOPO_COMMAND:
            return graph_text
        if tuple(args) == UUID_COMMAND:
            return "".join(f"{i}, {u}\n" for i, u in uuids.items())
        raise AssertionError(args)

    return run


def test_without_nvml_the_graph_comes_from_nvidia_smi(workdir: Path) -> None:
    fake = FakeNvml.pcie_2socket()
    text = render_topo(discover(fake))
    uuids = {i: g.uuid for i, g in enumerate(fake.gpus)}

    def unavailable() -> NvmlBackend:
        raise NvmlUnavailable("NVML Shared Library Not Found")

    kubelet, clock, writer = FakeKubelet(), FakeClock(5000.0), RecordingWriter()
    kubelet.assign("ml", "p", "c", [uuids[5]])
    with serve(kubelet, workdir / "k.sock") as sock:
        agent = _agent(None, sock, None, clock, writer, open_nvml=unavailable, run=_smi(text, uuids))
        agent.cycle()
    spec = writer.published[-1]["spec"]
    assert spec["source"] == "nvidia-smi"
    assert [g["uuid"] for g in spec["gpus"]] == [uuids[i] for i in range(8)]
    assert {(lk["a"], lk["b"]): lk["link"] for lk in spec["links"]}[(0, 1)] == "PIX"
    assert spec["health"] == []
    assert spec["devicesInUse"][0]["index"] == 5
    discovered = _conditions(writer.published[-1])["Discovered"]
    assert discovered["reason"] == "NvidiaSmiFallback"
    assert "NVML Shared Library Not Found" in discovered["message"]


def test_with_neither_source_it_publishes_source_none_naming_both_reasons(workdir: Path) -> None:
    def unavailable() -> NvmlBackend:
        raise NvmlUnavailable("NVML Shared Library Not Found")

    def no_smi(args: Sequence[str]) -> str:
        raise CommandFailed("nvidia-smi not found")

    writer = RecordingWriter()
    agent = _agent(
        None, workdir / "none.sock", None, FakeClock(5000.0), writer, open_nvml=unavailable, run=no_smi
    )
    assert agent.cycle() is Outcome.PUBLISHED
    discovered = _conditions(writer.published[-1])["Discovered"]
    assert discovered["status"] == "False"
    assert discovered["message"] == (
        "no GPU topology: NVML: NVML Shared Library Not Found; nvidia-smi: nvidia-smi not found"
    )
    assert writer.published[-1]["spec"]["source"] == "none"


def test_parse_uuids_reads_the_query_output() -> None:
    assert parse_uuids("0, GPU-a\n1, GPU-b\n\ngarbage\n") == {0: "GPU-a", 1: "GPU-b"}


# --- API errors, jitter, resync --------------------------------------------------------


def test_api_errors_back_off_exponentially_up_to_the_cap_then_recover(node: Node) -> None:
    agent = _agent(
        node.fake, node.socket, None, node.clock, node.writer, backoff_base_s=2.0, backoff_cap_s=20.0
    )
    node.writer.fail = [RuntimeError("503 Service Unavailable")] * 6
    ceilings = []
    for _ in range(6):
        assert agent.cycle() is Outcome.FAILED
        delay = agent.next_delay(Outcome.FAILED)
        ceilings.append(min(20.0, 2.0 * 2 ** (agent.failures - 1)))
        assert ceilings[-1] / 2 <= delay <= ceilings[-1]
    assert ceilings == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert agent.cycle() is Outcome.PUBLISHED  # retried although nothing changed
    assert agent.failures == 0
    assert 0.8 * INTERVAL <= agent.next_delay(Outcome.PUBLISHED) <= 1.2 * INTERVAL


def test_first_publish_and_intervals_are_jittered(node: Node) -> None:
    firsts = {node.agent.first_delay() for _ in range(50)}
    nexts = {node.agent.next_delay(Outcome.UNCHANGED) for _ in range(50)}
    assert all(0 <= d <= 0.2 * INTERVAL for d in firsts) and len(firsts) > 40
    assert all(0.8 * INTERVAL <= d <= 1.2 * INTERVAL for d in nexts) and len(nexts) > 40


def test_an_unchanged_object_is_rewritten_after_the_resync_period(workdir: Path, node: Node) -> None:
    agent = _agent(node.fake, node.socket, None, node.clock, node.writer, resync_s=100.0)
    agent.cycle()
    node.clock.now += 60
    assert agent.cycle() is Outcome.UNCHANGED
    node.clock.now += 60
    assert agent.cycle() is Outcome.PUBLISHED


def test_the_node_is_read_once_and_again_only_at_resync_when_unreadable(node: Node) -> None:
    asked = []

    class NoNode(RecordingWriter):
        def node_uid(self, name: str) -> str | None:
            asked.append(name)
            return None

    writer = NoNode()
    agent = _agent(node.fake, node.socket, None, node.clock, writer, resync_s=100.0)
    for _ in range(4):  # at 0, 40, 80 and 120 s
        agent.cycle()
        node.clock.now += 40
    assert asked == [NODE, NODE]  # first cycle, then the resync at +120 s
    assert "ownerReferences" not in writer.published[-1]["metadata"]


def test_run_cycles_until_stopped(node: Node) -> None:
    agent = _agent(node.fake, node.socket, None, node.clock, node.writer, interval_s=0.001, jitter=0.0)
    stop = threading.Event()
    agent.run(stop, max_cycles=3)
    assert len(node.writer.published) == 1  # three cycles, one change
    stop.set()
    agent.run(stop)  # returns at once
    assert len(node.writer.published) == 1


def test_change_key_ignores_small_rate_moves_and_messages_but_not_health_steps_or_reasons() -> None:
    base = {
        "metadata": {"name": NODE},
        "spec": {"gpus": [], "health": [{"index": 0, "healthy": True, "nvlinkErrorsPerSecond": 0.1}]},
        "status": {
            "conditions": [
                {
                    "type": "Discovered",
                    "status": "True",
                    "reason": "Nvml",
                    "message": "m",
                    "lastTransitionTime": "t1",
                }
            ]
        },
    }
    noisy = yaml.safe_load(yaml.safe_dump(base))
    noisy["spec"]["health"][0]["nvlinkErrorsPerSecond"] = 0.3  # within one step of the share
    noisy["status"]["conditions"][0]["lastTransitionTime"] = "t2"
    noisy["status"]["conditions"][0]["message"] = "rpc error at 12:00:31"
    noisy["status"]["lastPublished"] = "later"
    assert change_key(noisy) == change_key(base)
    flipped = yaml.safe_load(yaml.safe_dump(base))
    flipped["spec"]["health"][0]["healthy"] = False
    assert change_key(flipped) != change_key(base)
    # A rate that moves the share of bandwidth placement counts on by a step is a change.
    rising = yaml.safe_load(yaml.safe_dump(base))
    rising["spec"]["health"][0]["nvlinkErrorsPerSecond"] = 0.7
    assert change_key(rising) != change_key(base)
    reason = yaml.safe_load(yaml.safe_dump(base))
    reason["status"]["conditions"][0]["reason"] = "NvidiaSmiFallback"
    assert change_key(reason) != change_key(base)


def test_agent_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="node name"):
        AgentConfig(node="")
    with pytest.raises(ValueError, match="jitter"):
        AgentConfig(node=NODE, jitter=1.5)


# --- the Kubernetes writer -------------------------------------------------------------


def test_kube_writer_server_side_applies_spec_then_status(node: Node) -> None:
    node.agent.cycle()
    obj = dict(node.last)
    obj["status"] = {k: v for k, v in obj["status"].items() if k != "observedGeneration"}
    api = FakeKube()
    writer = KubeWriter(api)
    writer.publish(obj)
    writer.close()

    assert api.labels() == ["apply nodetopologies", "apply nodetopologies/status"]
    (plural1, _, name1, body1), (_, _, _, body2) = api.applies
    assert (plural1, name1) == ("nodetopologies", NODE)
    assert set(body1) == {"apiVersion", "kind", "metadata", "spec"}
    assert body1["spec"] == obj["spec"]
    assert APPLY_CONTENT_TYPE == "application/apply-patch+yaml" and FIELD_MANAGER == "gangslice-agent"
    assert body2["metadata"] == {"name": NODE}
    assert body2["status"]["observedGeneration"] == 1
    assert body2["status"]["conditions"] == obj["status"]["conditions"]
    stored = api.peek("nodetopologies", NODE)
    assert stored is not None and stored["status"]["conditions"] == obj["status"]["conditions"]


class _ApiServer(BaseHTTPRequestHandler):
    """Just enough of an API server: records PATCHes, answers a Node GET."""

    seen: list[tuple[str, str, dict[str, Any]]]

    def _reply(self, obj: dict[str, Any]) -> None:
        out = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, self.headers["Content-Type"], body))
        self._reply({"apiVersion": "gangslice.io/v1alpha1", "metadata": {"name": NODE, "generation": 3}})

    def do_GET(self) -> None:
        self._reply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": NODE_UID}})

    def log_message(self, *args: Any) -> None:
        pass


def test_kube_writer_on_the_wire_through_the_kubernetes_client(node: Node) -> None:
    from kubernetes import client

    node.agent.cycle()
    obj = dict(node.last)
    obj["status"] = {k: v for k, v in obj["status"].items() if k != "observedGeneration"}
    seen: list[tuple[str, str, dict[str, Any]]] = []
    handler = type("Handler", (_ApiServer,), {"seen": seen})
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{server.server_port}"
        writer = KubeWriter(ApiServerClient(client.ApiClient(config), field_manager=FIELD_MANAGER))
        assert writer.node_uid(NODE) == NODE_UID
        writer.publish(obj)
    finally:
        server.shutdown()
        server.server_close()
    (path1, type1, body1), (path2, type2, body2) = seen
    query = "fieldManager=gangslice-agent&force=true"
    assert path1 == f"/apis/gangslice.io/v1alpha1/nodetopologies/{NODE}?{query}"
    assert path2 == f"/apis/gangslice.io/v1alpha1/nodetopologies/{NODE}/status?{query}"
    assert type1 == type2 == "application/apply-patch+yaml"
    assert body1 == {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    assert body2["status"] == {**obj["status"], "observedGeneration": 3}


def test_once_publishes_through_a_kubeconfig(workdir: Path) -> None:
    seen: list[tuple[str, str, dict[str, Any]]] = []
    server = HTTPServer(("127.0.0.1", 0), type("Handler", (_ApiServer,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    try:
        code = main(
            ["agent", "--once", "--node", NODE, "--nvml-fake", "dgx-a100", "--kubeconfig", str(kubeconfig),
             "--pod-resources-socket", str(workdir / "missing.sock")]
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    assert [path.split("?")[0].rsplit("/", 1)[-1] for path, _, _ in seen] == [NODE, "status"]
    obj = seen[0][2]
    assert obj["metadata"]["ownerReferences"][0]["uid"] == NODE_UID
    assert obj["spec"]["source"] == "nvml" and len(obj["spec"]["gpus"]) == 8


def test_kube_writer_node_uid() -> None:
    api = FakeKube()
    api.put(Kind.NODES, {"metadata": {"name": NODE, "uid": NODE_UID}})
    assert KubeWriter(api).node_uid(NODE) == NODE_UID
    api.fail_next("get nodes", Forbidden(403, "nodes is forbidden"))
    assert KubeWriter(api).node_uid(NODE) is None


# --- the command -----------------------------------------------------------------------


def test_once_dry_run_prints_the_object_as_yaml(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNvml.hgx_h100()
    kubelet = FakeKubelet()
    kubelet.assign("ml", "p", "c", [fake.gpus[7].uuid])
    monkeypatch.delenv("NODE_NAME", raising=False)
    with serve(kubelet, workdir / "k.sock") as sock:
        code = main(
            ["agent", "--once", "--dry-run", "--node", NODE, "--nvml-fake", "hgx-h100",
             "--pod-resources-socket", str(sock), "--kubelet-config="]
        )  # fmt: skip
    assert code == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert obj["kind"] == "NodeTopology" and obj["metadata"] == {"name": NODE}
    assert "kubelet" not in obj["spec"]  # --kubelet-config= : not published
    assert obj["spec"]["source"] == "nvml"
    assert len(obj["spec"]["gpus"]) == 8 and len(obj["spec"]["links"]) == 28
    assert {lk["link"] for lk in obj["spec"]["links"]} == {"NV18"}
    assert [n["numaNode"] for n in obj["spec"]["nics"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert obj["spec"]["devicesInUse"] == [
        {"deviceId": fake.gpus[7].uuid, "index": 7, "namespace": "ml", "pod": "p", "container": "c"}
    ]
    assert {c["type"]: c["status"] for c in obj["status"]["conditions"]} == {
        "Discovered": "True",
        "PodResourcesAvailable": "True",
        "DevicesKnown": "True",
    }


def test_once_dry_run_on_a_gb200_tray_carries_the_clique(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["agent", "--once", "--dry-run", "--node", NODE, "--nvml-fake", "gb200-tray",
         "--pod-resources-socket", str(workdir / "missing.sock")]
    )  # fmt: skip
    assert code == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert obj["spec"]["clique"] == {"clusterUuid": "6a1f0c55-7d3e-4b8a-9c2d-1e0f5a6b7c8d", "cliqueId": 1}
    assert obj["spec"]["nvlinkGbps"] == 100.0
    pr = next(c for c in obj["status"]["conditions"] if c["type"] == "PodResourcesAvailable")
    assert pr["status"] == "False" and pr["reason"] == "SocketMissing"


def test_agent_needs_a_node_name(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main(["agent", "--once", "--dry-run", "--nvml-fake", "hgx-h100"]) == 2
    assert "NODE_NAME" in capsys.readouterr().err


def test_the_fake_flag_says_it_is_for_demos_and_tests(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--nvml-fake" in help_text and "FOR DEMOS AND TESTS ONLY" in help_text


def test_recording_writer_injects_failures_once_each() -> None:
    writer = RecordingWriter(fail=[RuntimeError("boom")])
    obj = {"metadata": {"name": NODE}, "spec": {}, "status": {"conditions": []}}
    with pytest.raises(RuntimeError):
        writer.publish(obj)
    writer.publish(obj)
    assert len(writer.published) == 1 and writer.published[0]["status"]["observedGeneration"] == 1


def test_health_type_in_graph_is_the_model_type(node: Node) -> None:
    node.agent.cycle()
    graph = graph_from_dict(node.last["spec"])
    assert all(isinstance(h, GpuHealth) and h.healthy for h in graph.health.values())


def test_devices_nvml_does_not_see_are_a_condition_naming_the_field_and_ids(node: Node) -> None:
    """Bad input: the kubelet names GPUs this node's NVML does not have. The agent keeps
    publishing, says so on DevicesKnown, and those devices carry no GPU index (nothing
    counts on them); the known one is still in use."""
    ghost, spare = "GPU-deadbeef-0000-0000-0000-000000000000", "GPU-feedface-0000-0000-0000-000000000000"
    node.kubelet.allocatable = {"nvidia.com/gpu": [*(g.uuid for g in node.fake.gpus), ghost, spare]}
    node.kubelet.assign("ml", "llama-0", "server", [node.uuid(1), ghost])
    assert node.agent.cycle() is Outcome.PUBLISHED
    known = _conditions(node.last)["DevicesKnown"]
    assert known["status"] == "False" and known["reason"] == "UnknownDevices"
    assert f"List: containers[].devices[].device_ids {ghost} (pod ml/llama-0)" in known["message"]
    assert f"GetAllocatableResources: devices[].device_ids {spare}" in known["message"]
    assert ghost not in known["message"].split("GetAllocatableResources")[1]
    in_use = node.last["spec"]["devicesInUse"]
    assert [d.get("index") for d in in_use if d["pod"] == "llama-0"] == [1, None]
    assert _conditions(node.last)["PodResourcesAvailable"]["status"] == "True"
    # Fixed on the kubelet's side: the condition turns True and the object is written again.
    node.kubelet.allocatable = {"nvidia.com/gpu": [g.uuid for g in node.fake.gpus]}
    node.kubelet.remove("ml", "llama-0")
    assert node.step() is Outcome.PUBLISHED
    assert _conditions(node.last)["DevicesKnown"]["status"] == "True"


def test_the_agent_exports_each_gpus_interconnect_counters_under_dcgm_exporters_names(node: Node) -> None:
    """Per-GPU NVLink and PCIe error counters (dcgm-exporter's names), their rates, health and a
    lost GPU, from the fake NVML with injected errors."""
    from extender.topology.nvml import NvmlError

    node.agent.cycle()
    node.clock.now += INTERVAL
    node.fake.add_errors(5, crc=300, replay=6, pcie_replays=60)  # CRC 10/s: over 1/s
    node.fake.fail[("pcie_replay_counter", 2)] = NvmlError("GPU is lost")
    node.agent.cycle()
    text = node.agent.metrics.render().decode()
    uuid5 = node.uuid(5)
    assert f'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{UUID="{uuid5}",gpu="5"}} 300.0' in text
    assert f'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{UUID="{uuid5}",gpu="5"}} 6.0' in text
    assert f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{UUID="{uuid5}",gpu="5"}} 60.0' in text
    assert f'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0{{UUID="{uuid5}",gpu="5"}} 300.0' in text
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L1{" not in text  # a clean link has no series
    assert f'gangslice_agent_gpu_nvlink_errors_per_second{{UUID="{uuid5}",gpu="5"}} 10.2' in text
    assert f'gangslice_agent_gpu_pcie_replays_per_second{{UUID="{uuid5}",gpu="5"}} 2.0' in text
    assert f'gangslice_agent_gpu_healthy{{UUID="{uuid5}",gpu="5"}} 0.0' in text
    assert f'gangslice_agent_gpu_healthy{{UUID="{node.uuid(0)}",gpu="0"}} 1.0' in text
    uuid2 = node.uuid(2)
    assert f'gangslice_agent_gpu_lost{{UUID="{uuid2}",gpu="2"}} 1.0' in text
    assert f'gangslice_agent_gpu_healthy{{UUID="{uuid2}",gpu="2"}} 0.0' in text
    assert f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{UUID="{uuid2}"' not in text  # no value, no sample
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER untyped" in text  # the name exactly dcgm-exporter's
