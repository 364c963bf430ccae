"""Prometheus metrics of the node agent, on a registry of its own (served by
``gangslice agent --metrics-port N``).

- ``gangslice_agent_publishes_total{result}``: cycles by what became of the NodeTopology:
  ``applied`` (written), ``unchanged`` (nothing to write), ``error`` (the write or the
  object's build failed; retried after back-off).
- ``gangslice_agent_discovery_errors_total{source}``: observations in which a source
  failed: ``nvml``, ``nvidia-smi`` (the fallback, when configured), ``pod-resources``
  (the kubelet's PodResources API) or ``kubelet`` (what the kubelet aligns to NUMA nodes:
  its configuration file, sysfs NUMA nodes, PodResources CPU ids; see the
  ``KubeletTopologyRead`` condition).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

PUBLISH_RESULTS = ("applied", "unchanged", "error")
DISCOVERY_SOURCES = ("nvml", "nvidia-smi", "pod-resources", "kubelet")


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.publishes = Counter(
            "gangslice_agent_publishes",
            "Agent cycles, by what became of the NodeTopology (applied, unchanged, error).",
            ["result"],
            registry=self.registry,
        )
        self.discovery_errors = Counter(
            "gangslice_agent_discovery_errors",
            "Observations in which a source failed, by source (nvml, nvidia-smi, pod-resources, kubelet).",
            ["source"],
            registry=self.registry,
        )
        # Every series exists from the start, so a rate over a fresh agent reads 0, not nothing.
        for result in PUBLISH_RESULTS:
            self.publishes.labels(result)
        for source in DISCOVERY_SOURCES:
            self.discovery_errors.labels(source)

    def render(self) -> bytes:
        return generate_latest(self.registry)
