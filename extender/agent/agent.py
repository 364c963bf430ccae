"""The node agent loop: observe the node, build its ``NodeTopology``, write it when it changed.

Each cycle discovers the GPU graph and health (:mod:`extender.agent.discovery`), asks the
kubelet which GPUs pods hold (:mod:`extender.agent.podresources`), builds the object
(:mod:`extender.agent.publish`) and writes it only when :func:`~extender.agent.publish.change_key`
differs from the last successful write, or when ``resync_s`` has passed since (so a deleted
object comes back). On 5,000 nodes that keeps the API server quiet:

- the first cycle waits a random fraction of ``jitter * interval`` and every interval is
  stretched or shrunk by up to ``jitter`` (default 20%), so agents started together drift apart;
- a failed write is retried after an exponential back-off (``backoff_base_s`` doubling up
  to ``backoff_cap_s``, each delay drawn from its upper half), not at the next interval;
- nothing raises out of a cycle: NVML and kubelet failures become conditions on the object.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.agent.discovery import Observation
from extender.agent.kubelet_config import CONDITION as KUBELET_TOPOLOGY_READ
from extender.agent.metrics import AgentMetrics
from extender.agent.podresources import DeviceUse, PodResourcesUnavailable
from extender.agent.publish import (
    POD_RESOURCES_AVAILABLE,
    Condition,
    ConditionClock,
    Writer,
    build_object,
    build_spec,
    change_key,
    devices_in_use,
    devices_known,
)
from extender.topology.allocation import Allocation

log = logging.getLogger(__name__)


class Observer(Protocol):
    def observe(self) -> Observation: ...


class KubeletSource(Protocol):
    """The ``kubelet`` field and its condition (:class:`~extender.agent.kubelet_config.KubeletReader`)."""

    def observe(self) -> tuple[dict[str, Any] | None, tuple[bool, str, str]]: ...


class PodResources(Protocol):
    def devices_in_use(self) -> list[DeviceUse]: ...

    def allocatable(self) -> list[str]: ...


@dataclass(frozen=True)
class AgentConfig:
    node: str
    interval_s: float = 30.0
    jitter: float = 0.2
    resync_s: float = 1800.0
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 300.0
    #: Who picks the pods' GPUs on this node, published as ``spec.allocation``.
    allocation: Allocation = Allocation.DEVICE_PLUGIN

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("the agent needs its node name (--node or $NODE_NAME)")
        if self.interval_s <= 0:
            raise ValueError(f"interval must be positive, got {self.interval_s}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")


class Outcome(enum.Enum):
    PUBLISHED = "published"
    UNCHANGED = "unchanged"
    FAILED = "failed"


#: ``gangslice_agent_publishes_total{result}`` of each outcome.
_RESULTS = {Outcome.PUBLISHED: "applied", Outcome.UNCHANGED: "unchanged", Outcome.FAILED: "error"}


@dataclass
class _Published:
    key: str
    at: float


@dataclass
class Agent:
    config: AgentConfig
    observer: Observer
    pod_resources: PodResources
    writer: Writer
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    rng: random.Random = field(default_factory=random.Random)
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    #: Reads what the kubelet aligns to NUMA nodes (None: the ``kubelet`` field is not published).
    kubelet: KubeletSource | None = None

    def __post_init__(self) -> None:
        self._conditions = ConditionClock()
        self._last: _Published | None = None
        self._failures = 0
        self._node_uid: str | None = None
        self._asked_uid = False

    # -- one cycle ----------------------------------------------------------------------

    def build(self, *, with_owner: bool = False) -> dict[str, Any]:
        """Observe the node and return the object to publish (never raises)."""
        seen = self.observer.observe()
        for source in seen.failed:
            self.metrics.discovery_errors.labels(source).inc()
        self.metrics.gpus.observe(seen.graph, seen.counters)
        known: Condition | None = None
        try:
            uses = self.pod_resources.devices_in_use()
            allocatable = self.pod_resources.allocatable()
            in_use = devices_in_use(uses, seen.graph)
            on_gpus = {d["index"] for d in in_use if "index" in d}
            pods = {(d["namespace"], d["pod"]) for d in in_use}
            pr = Condition(
                POD_RESOURCES_AVAILABLE,
                True,
                "Listed",
                f"{len(on_gpus)} of {len(allocatable)} allocatable GPUs held by {len(pods)} pods",
            )
            known = devices_known(uses, allocatable, seen.graph)
        except PodResourcesUnavailable as exc:
            in_use, allocatable = [], []
            pr = Condition(POD_RESOURCES_AVAILABLE, False, exc.reason, str(exc))
            self.metrics.discovery_errors.labels("pod-resources").inc()
        except Exception as exc:
            in_use, allocatable = [], []
            pr = Condition(POD_RESOURCES_AVAILABLE, False, "Error", f"{type(exc).__name__}: {exc}")
            self.metrics.discovery_errors.labels("pod-resources").inc()
        spec = build_spec(seen.graph, seen.source, in_use, allocatable, self.config.allocation)
        observed: list[Condition] = []
        if self.kubelet is not None:
            entry, (ok, reason, message) = self.kubelet.observe()
            if entry is not None:
                spec["kubelet"] = entry
            observed.append(Condition(KUBELET_TOPOLOGY_READ, ok, reason, message))
            if not ok:
                self.metrics.discovery_errors.labels("kubelet").inc()
        now = self.wall()
        listed = [seen.condition, pr] + ([known] if known is not None else []) + observed
        conditions = self._conditions.stamp(listed, now)
        uid = self._owner_uid() if with_owner else None
        return build_object(self.config.node, spec, conditions, now, node_uid=uid)

    def cycle(self) -> Outcome:
        """One observation; a write when something changed (or a resync is due)."""
        outcome = self._cycle()
        self.metrics.publishes.labels(_RESULTS[outcome]).inc()
        return outcome

    def _cycle(self) -> Outcome:
        now = self.clock()
        resync = self._last is not None and now - self._last.at >= self.config.resync_s
        if resync and self._node_uid is None:
            self._asked_uid = False  # ask for the Node again once per resync
        try:
            obj = self.build(with_owner=True)
        except Exception:  # a bug, not an environment problem; keep the agent alive anyway
            log.exception("building the NodeTopology failed")
            self._failures += 1
            return Outcome.FAILED
        key = change_key(obj)
        if self._last is not None and self._last.key == key and not resync:
            return Outcome.UNCHANGED
        try:
            self.writer.publish(obj)
        except Exception as exc:
            self._failures += 1
            log.warning(
                "publishing NodeTopology %s failed (attempt %d): %s", self.config.node, self._failures, exc
            )
            return Outcome.FAILED
        self._failures = 0
        self._last = _Published(key, now)
        log.info("published NodeTopology %s", self.config.node)
        return Outcome.PUBLISHED

    def _owner_uid(self) -> str | None:
        if self._node_uid is None and not self._asked_uid:
            self._asked_uid = True
            self._node_uid = self.writer.node_uid(self.config.node)
        return self._node_uid

    # -- timing -------------------------------------------------------------------------

    def first_delay(self) -> float:
        return self.rng.uniform(0.0, self.config.jitter * self.config.interval_s)

    def next_delay(self, outcome: Outcome) -> float:
        """Seconds to wait after a cycle: a jittered interval, or back-off after failures."""
        c = self.config
        if outcome is Outcome.FAILED and self._failures:
            ceiling = min(c.backoff_cap_s, c.backoff_base_s * 2 ** (self._failures - 1))
            return self.rng.uniform(ceiling / 2, ceiling)
        return c.interval_s * self.rng.uniform(1 - c.jitter, 1 + c.jitter)

    def run(self, stop: threading.Event, *, max_cycles: int | None = None) -> None:
        """Cycle until ``stop`` is set (or ``max_cycles`` ran)."""
        if stop.wait(self.first_delay()):
            return
        cycles = 0
        while True:
            outcome = self.cycle()
            cycles += 1
            if max_cycles is not None and cycles >= max_cycles:
                return
            if stop.wait(self.next_delay(outcome)):
                return

    @property
    def failures(self) -> int:
        return self._failures
