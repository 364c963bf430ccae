"""Prometheus metrics of the extender service, on a registry of its own (one per app).

- ``gangslice_extender_request_duration_seconds{verb}``: histogram of handling time.
- ``gangslice_extender_requests_total{verb,code}``: requests by HTTP status.
- ``gangslice_decisions_total{outcome}``: decisions by outcome (``fit``, ``no-fit``,
  ``reserved``, ``unplaceable``, ``waiting``, ``invalid``, ``bound``, ``bind-failed``,
  ``scored``, ``preempt``, ``permit``, ``reject``, ``abstain``, ``allocated``, ``error``).
- ``gangslice_reservations{phase}``: reservations held now, by phase (Reserved, Bound).
- ``gangslice_cache_ready``: 1 once the first full list of every watched kind is in.
- ``gangslice_cache_nodes``: GPU nodes in the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.kube.cache import ClusterCache
from extender.placement.ledger import Phase

#: Buckets for a service whose target is well under 5 ms.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _CacheCollector(Collector):
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_phase = {Phase.RESERVED.value: 0, Phase.BOUND.value: 0}
        for r in self.cache.ledger.reservations():
            by_phase[r.phase.value] = by_phase.get(r.phase.value, 0) + 1
        g = GaugeMetricFamily("gangslice_reservations", "Reservations held, by phase.", labels=["phase"])
        for phase, n in sorted(by_phase.items()):
            g.add_metric([phase], n)
        yield g
        yield GaugeMetricFamily(
            "gangslice_cache_ready", "1 once every watched kind is listed.", value=int(self.cache.ready)
        )
        yield GaugeMetricFamily(
            "gangslice_cache_nodes", "GPU nodes in the snapshot.", value=len(self.cache.snapshot().nodes)
        )


class Metrics:
    def __init__(self, cache: ClusterCache) -> None:
        self.registry = CollectorRegistry()
        self.duration = Histogram(
            "gangslice_extender_request_duration_seconds",
            "Time to handle one extender request.",
            ["verb"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "gangslice_extender_requests",
            "Extender requests, by verb and HTTP status.",
            ["verb", "code"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "gangslice_decisions", "Decisions, by outcome.", ["outcome"], registry=self.registry
        )
        self.registry.register(_CacheCollector(cache))

    def render(self) -> bytes:
        return generate_latest(self.registry)
