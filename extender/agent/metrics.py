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

Interconnect health, per GPU (labels ``gpu``, the index, and ``UUID``, as dcgm-exporter
labels them), from the last NVML sample:

- the cumulative error counters under dcgm-exporter's names, so dashboards built on it read
  them: ``DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``,
  ``DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL``, ``DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL``,
  ``DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL`` (summed over the GPU's active links), the same
  per link as dcgm-exporter names them (``..._COUNT_L<n>``, only for links that counted an error)
  and ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``. They are exposed untyped: the Python client would give a
  counter a ``_total`` name of its own, and the names must stay dcgm-exporter's;
- ``gangslice_agent_gpu_nvlink_errors_per_second`` and
  ``gangslice_agent_gpu_pcie_replays_per_second``: the rates between the last two samples,
  which the agent's thresholds judge (``--nvlink-errors-per-s``, ``--pcie-replays-per-s``);
- ``gangslice_agent_gpu_healthy``: 1, or 0 when a rate is over its threshold or the GPU's
  counters cannot be read;
- ``gangslice_agent_gpu_lost``: 1 when NVML cannot read the GPU's counters at all (a GPU
  fallen off the bus answers every call with an error).

A GPU the last sample did not see has no series; before the first NVML sample there are none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.metrics_core import Metric

from extender.topology.model import GpuGraph, GpuHealth
from extender.topology.nvml import HealthCounters

PUBLISH_RESULTS = ("applied", "unchanged", "error")
DISCOVERY_SOURCES = ("nvml", "nvidia-smi", "pod-resources", "kubelet")

#: dcgm-exporter's names (its ``etc/default-counters.csv``) for the counters the agent samples.
DCGM_COUNTERS = (
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc_flit_errors",
     "Total number of NVLink flow-control CRC errors (all active links)."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "nvlink_crc_data_errors",
     "Total number of NVLink data CRC errors (all active links)."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "nvlink_replay_errors",
     "Total number of NVLink retries (all active links)."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "nvlink_recovery_errors",
     "Total number of NVLink recovery errors (all active links)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replays", "Total number of PCIe retries."),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _GpuSample:
    labels: Mapping[str, str]
    counters: HealthCounters
    health: GpuHealth


class GpuHealthCollector:
    """The per-GPU series of the last sample (:meth:`observe`)."""

    def __init__(self) -> None:
        self._gpus: tuple[_GpuSample, ...] = ()

    def observe(self, graph: GpuGraph, counters: Mapping[int, HealthCounters]) -> None:
        samples = []
        for gpu in graph.gpus:
            got = counters.get(gpu.index)
            if got is None:
                continue
            labels = {"gpu": str(gpu.index), "UUID": gpu.uuid or ""}
            samples.append(_GpuSample(labels, got, graph.health.get(gpu.index, GpuHealth())))
        self._gpus = tuple(samples)

    def collect(self) -> Iterator[Metric]:
        gpus = self._gpus
        per_link: dict[str, tuple[str, list[tuple[Mapping[str, str], float]]]] = {}
        for g in gpus:
            for link, *counts in g.counters.links:
                # Four counts per link (flit, data, replay, recovery): the PCIe counter has none.
                for (name, _, doc), value in zip(DCGM_COUNTERS, counts, strict=False):
                    link_name = name.replace("_TOTAL", f"_L{link}")
                    per_link.setdefault(link_name, (f"{doc.split(' (')[0]} on NVLink {link}.", []))[1].append(
                        (g.labels, value)
                    )
        for name, (doc, samples) in sorted(per_link.items()):
            yield _family(name, doc, "unknown", iter(samples))
        for name, field, doc in DCGM_COUNTERS:
            yield _family(
                name,
                doc,
                "unknown",
                ((g.labels, getattr(g.counters, field)) for g in gpus if not g.counters.error),
            )
        yield _family(
            "gangslice_agent_gpu_nvlink_errors_per_second",
            "NVLink CRC, replay and recovery errors per second between the last two samples, per GPU.",
            "gauge",
            ((g.labels, g.health.nvlink_errors_per_s) for g in gpus),
        )
        yield _family(
            "gangslice_agent_gpu_pcie_replays_per_second",
            "PCIe replays per second between the last two samples, per GPU.",
            "gauge",
            ((g.labels, g.health.pcie_replays_per_s) for g in gpus),
        )
        yield _family(
            "gangslice_agent_gpu_healthy",
            "1 while the GPU's error rates are within the agent's thresholds and its counters read.",
            "gauge",
            ((g.labels, 1.0 if g.health.healthy else 0.0) for g in gpus),
        )
        yield _family(
            "gangslice_agent_gpu_lost",
            "1 when NVML cannot read the GPU's error counters at all.",
            "gauge",
            ((g.labels, 1.0 if g.counters.error else 0.0) for g in gpus),
        )


def _family(name: str, doc: str, kind: str, samples: Iterator[tuple[Mapping[str, str], float]]) -> Metric:
    family = Metric(name, doc, kind)
    for labels, value in samples:
        family.add_sample(name, dict(labels), float(value))
    return family


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
        self.gpus = GpuHealthCollector()
        self.registry.register(self.gpus)
        # Every series exists from the start, so a rate over a fresh agent reads 0, not nothing.
        for result in PUBLISH_RESULTS:
            self.publishes.labels(result)
        for source in DISCOVERY_SOURCES:
            self.discovery_errors.labels(source)

    def render(self) -> bytes:
        return generate_latest(self.registry)
