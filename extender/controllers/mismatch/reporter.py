"""What the controller does about a pod the kubelet gave other GPUs than promised.

The cluster cache finds such pods (:mod:`extender.kube.devices`) as soon as the node agent's
NodeTopology shows them, counts their GPUs as reported and moves their reservation slots.
:class:`MismatchReporter`, run from the leader's housekeeping loop, makes it visible and
acts as ``gangslice serve --on-mismatch`` says:

- ``report``: a Warning Event ``DevicesMismatch`` on the pod, once per mismatch (the sets
  promised and reported, and whether the reported set meets the pod set's rule); the
  reservation's ``DevicesMismatch`` condition says the same;
- ``evict-incoherent`` (the default): that, and an eviction of a pod whose GPUs break its
  pod set's in-node rule (two GPUs across sockets where one NVLink island was required). Such
  a pod cannot run as placed (``gangslice preflight`` in it fails), and left alone it would
  crash-loop holding those GPUs; a pod whose GPUs still meet the rule keeps them, and its
  slot follows the kubelet;
- ``evict``: an eviction of every such pod.

An eviction goes through ``pods/eviction`` (policy/v1), so the PodDisruptionBudget is
honoured, and the pod's controller makes a new pod, placed again. A 429 (the budget allows no
disruption now) is no error: the Event and the condition say so and the eviction is tried
again at the next pass (every housekeeping period, 5 s by default).
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Protocol

from extender.kube import events, evictions
from extender.kube.api import EVENTS, KubeClient, KubeError
from extender.kube.devices import DEVICES_MISMATCH, DeviceMismatch
from extender.kube.events import ObjectRef
from extender.kube.evictions import Result

log = logging.getLogger(__name__)

#: The Event reason when the pod was evicted, and when its budget held the eviction off.
EVICTED = "DevicesMismatchEvicted"
EVICTION_BLOCKED = "DevicesMismatchEvictionBlocked"


class OnMismatch(enum.StrEnum):
    """``gangslice serve --on-mismatch``."""

    REPORT = "report"
    EVICT_INCOHERENT = "evict-incoherent"
    EVICT = "evict"

    def evicts(self, m: DeviceMismatch) -> bool:
        return self is OnMismatch.EVICT or (self is OnMismatch.EVICT_INCOHERENT and not m.coherent)


def pod_event(m: DeviceMismatch, reason: str, message: str, now: float) -> dict[str, Any]:
    namespace, name = m.pod.split("/", 1)
    return events.event(ObjectRef("v1", "Pod", name, namespace, m.uid), reason, message, now)


class Mismatches(Protocol):
    """What the reporter reads of (and tells) the cluster cache."""

    def device_mismatches(self, gang: str | None = None) -> list[DeviceMismatch]: ...

    def note_eviction(self, pod_key: str, result: str, text: str) -> None: ...


class MismatchReporter:
    """Events (and evictions, as :class:`OnMismatch` says) for the cache's device mismatches; call
    :meth:`sync` on the leader now and then."""

    def __init__(self, api: KubeClient, on_mismatch: OnMismatch = OnMismatch.EVICT_INCOHERENT) -> None:
        self.api = api
        self.on_mismatch = on_mismatch
        #: Mismatches (:attr:`DeviceMismatch.sets`) already told by an Event / already evicted.
        self._told: set[tuple[object, ...]] = set()
        self._blocked: set[tuple[object, ...]] = set()
        self._evicted: set[tuple[object, ...]] = set()

    async def sync(self, cache: Mismatches, now: float) -> int:
        """Tell (and act on) the mismatches not dealt with yet; returns how many pods were evicted."""
        current = cache.device_mismatches()
        keys = {m.sets for m in current}
        for seen in (self._told, self._blocked, self._evicted):
            seen &= keys
        evicted = 0
        for m in current:
            if m.sets not in self._told:
                await self._event(m, DEVICES_MISMATCH, m.message(), now)
                self._told.add(m.sets)
            if self.on_mismatch.evicts(m) and m.sets not in self._evicted:
                evicted += await self._evict(cache, m, now)
        return evicted

    async def _evict(self, cache: Mismatches, m: DeviceMismatch, now: float) -> int:
        namespace, name = m.pod.split("/", 1)
        got = await evictions.evict(self.api, namespace, name, m.uid)
        if got.result is Result.BLOCKED:
            text = f"eviction held off by the pod's PodDisruptionBudget ({got.detail}); tried again later"
            cache.note_eviction(m.pod, "blocked", text)
            if m.sets not in self._blocked:
                self._blocked.add(m.sets)
                await self._event(m, EVICTION_BLOCKED, f"pod {m.pod}: {text}", now)
            return 0
        if got.result is Result.GONE:
            self._evicted.add(m.sets)
            return 0
        if got.result is Result.FAILED:
            log.warning("evicting pod %s (GPUs differ from the promise) failed: %s", m.pod, got.detail)
            cache.note_eviction(m.pod, "failed", f"eviction failed ({got.detail}); tried again later")
            return 0
        self._evicted.add(m.sets)
        text = f"evicted to be placed again (--on-mismatch={self.on_mismatch.value})"
        cache.note_eviction(m.pod, "evicted", text)
        log.warning("pod %s evicted: the kubelet gave it other GPUs than promised", m.pod)
        await self._event(m, EVICTED, f"pod {m.pod} {text}: {m.message()}", now)
        return 1

    async def _event(self, m: DeviceMismatch, reason: str, message: str, now: float) -> None:
        try:
            await self.api.create(EVENTS, pod_event(m, reason, message, now))
        except KubeError as exc:
            log.debug("event for pod %s: %s", m.pod, exc)
