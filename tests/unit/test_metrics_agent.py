"""The node agent's counters: publish results and discovery errors by source, after cycles
with the in-memory writer (one injected API error) and failing NVML, nvidia-smi and kubelet."""

from __future__ import annotations

import random
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from extender.agent.agent import Agent, AgentConfig, Outcome
from extender.agent.discovery import CommandFailed, Discovery
from extender.agent.podresources import DeviceUse, PodResourcesUnavailable
from extender.cli import main
from extender.testing.clock import FakeClock
from extender.testing.publish import RecordingWriter
from extender.topology.fake_nvml import FakeNvml
from extender.topology.nvml import NvmlError


class Kubelet:
    """PodResources that answers, or not (``down``)."""

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.down = False

    def devices_in_use(self) -> list[DeviceUse]:
        if self.down:
            raise PodResourcesUnavailable("SocketMissing", "kubelet.sock does not exist")
        return []

    def allocatable(self) -> list[str]:
        return list(self.uuids)


def no_smi(args: Sequence[str]) -> str:
    raise CommandFailed("nvidia-smi not found")


def counters(agent: Agent, text: str | None = None) -> dict[str, dict[str, float]]:
    text = agent.metrics.render().decode() if text is None else text
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_total"):
                (value,) = s.labels.values()
                out.setdefault(s.name, {})[value] = s.value
    return out


@pytest.fixture
def agent(tmp_path: Path) -> tuple[Agent, FakeNvml, Kubelet, RecordingWriter, FakeClock]:
    fake = FakeNvml.hgx_h100()
    sysfs = fake.write_sysfs(tmp_path / "sys")
    clock = FakeClock(100.0)
    kubelet = Kubelet([g.uuid for g in fake.gpus])
    writer = RecordingWriter(fail=[RuntimeError("503 Service Unavailable")])
    discovery = Discovery(lambda: fake, sysfs_root=sysfs, run=no_smi, clock=clock)
    config = AgentConfig(node="gpu-a-01", interval_s=30.0)
    return (
        Agent(config, discovery, kubelet, writer, clock=clock, rng=random.Random(3)),
        fake,
        kubelet,
        writer,
        clock,
    )


def test_publish_results_and_discovery_errors_are_counted(
    agent: tuple[Agent, FakeNvml, Kubelet, RecordingWriter, FakeClock],
) -> None:
    a, fake, kubelet, writer, clock = agent
    zero = {
        "gangslice_agent_publishes_total": {"applied": 0.0, "unchanged": 0.0, "error": 0.0},
        "gangslice_agent_discovery_errors_total": {
            "nvml": 0.0,
            "nvidia-smi": 0.0,
            "pod-resources": 0.0,
            "kubelet": 0.0,
        },
    }
    assert counters(a) == zero

    assert a.cycle() is Outcome.FAILED  # the injected API error
    clock.now += 2.0
    assert a.cycle() is Outcome.PUBLISHED
    clock.now += 30.0
    assert a.cycle() is Outcome.UNCHANGED
    kubelet.down = True
    clock.now += 30.0
    assert a.cycle() is Outcome.PUBLISHED  # PodResourcesAvailable turned False
    kubelet.down = False
    fake.fail["device_count"] = NvmlError("NVML_ERROR_GPU_IS_LOST")
    clock.now += 30.0
    assert a.cycle() is Outcome.PUBLISHED  # source none: NVML failed, then the nvidia-smi fallback
    assert len(writer.published) == 3

    assert counters(a) == {
        "gangslice_agent_publishes_total": {"applied": 3.0, "unchanged": 1.0, "error": 1.0},
        "gangslice_agent_discovery_errors_total": {
            "nvml": 1.0,
            "nvidia-smi": 1.0,
            "pod-resources": 1.0,
            "kubelet": 0.0,
        },
    }


def test_without_a_fallback_only_nvml_is_counted(tmp_path: Path) -> None:
    fake = FakeNvml.hgx_h100()
    fake.fail["device_count"] = NvmlError("NVML_ERROR_GPU_IS_LOST")
    discovery = Discovery(lambda: fake, sysfs_root=None, run=None)
    a = Agent(AgentConfig(node="gpu-a-01"), discovery, Kubelet([]), RecordingWriter())
    assert a.cycle() is Outcome.PUBLISHED
    assert counters(a)["gangslice_agent_discovery_errors_total"] == {
        "nvml": 1.0,
        "nvidia-smi": 0.0,
        "pod-resources": 0.0,
        "kubelet": 0.0,
    }


def test_the_registry_is_served_over_http(
    agent: tuple[Agent, FakeNvml, Kubelet, RecordingWriter, FakeClock],
) -> None:
    a = agent[0]
    a.cycle()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=a.metrics.registry)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert counters(a, text)["gangslice_agent_publishes_total"]["error"] == 1.0


def test_metrics_port_must_be_a_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--node", "n", "--dry-run", "--once", "--metrics-port", "70000"]) == 2
    assert "--metrics-port" in capsys.readouterr().err
