"""The one shape of the core/v1 Events gangslice posts: about pods, nodes, PodGroups and
Workloads, from the controller or the extender (``reportingComponent``)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extender.kube import names
from extender.kube.api import EVENTS, KubeClient, KubeError
from extender.kube.crd_models import rfc3339
from extender.kube.pods import PodInfo

__all__ = ["ObjectRef", "Teller", "event"]

log = logging.getLogger(__name__)

#: Event messages past this are cut (the API server refuses messages over 1 KiB in events.k8s.io).
MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (``involvedObject``); a Node has no namespace."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def pod(cls, pod: PodInfo) -> ObjectRef:
        return cls("v1", "Pod", pod.name, pod.namespace, pod.uid)

    @property
    def key(self) -> str:
        """How the log names it: ``pod ns/name``, ``workload ns/name``, ``node name``."""
        return (
            f"{self.kind.lower()} {self.namespace}/{self.name}"
            if self.namespace
            else f"{self.kind.lower()} {self.name}"
        )


def event(
    about: ObjectRef,
    reason: str,
    message: str,
    now: float,
    *,
    type: str = "Warning",
    namespace: str | None = None,
    component: str = names.EVENT_COMPONENT,
    instance: str = "gangslice-controller",
) -> dict[str, Any]:
    """A core/v1 Event about ``about``, kept in ``namespace`` (default: the object's own)."""
    stamp = rfc3339(now)
    involved: dict[str, Any] = {"apiVersion": about.api_version, "kind": about.kind, "name": about.name}
    if about.namespace:
        involved["namespace"] = about.namespace
    involved["uid"] = about.uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about.name}.", "namespace": namespace or about.namespace},
        "involvedObject": involved,
        "type": type,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": "gangslice"},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


#: (object, message) pairs a :class:`Teller` remembers having told, at most; the oldest go first
#: (an object forgotten and still waiting hears its message again, once).
TOLD_KEPT = 4096


class Teller:
    """Warning Events of one reason saying why something waits, on its pod (or on the object a
    gang waits as: a Workload, a PodGroup): each message once per object (a controller that
    retries every pass does not repeat itself), logged as well."""

    def __init__(self, api: KubeClient, clock: Callable[[], float], reason: str) -> None:
        self.api = api
        self.clock = clock
        self.reason = reason
        #: (object, message) already told, oldest first.
        self._told: OrderedDict[tuple[ObjectRef, str], None] = OrderedDict()

    async def tell(self, pod: PodInfo | None, message: str) -> None:
        if pod is not None:
            await self.tell_about(ObjectRef.pod(pod), message)

    async def tell_about(self, about: ObjectRef, message: str) -> None:
        text = f"gangslice: {message}"[:MAX_MESSAGE]
        if (about, text) in self._told:
            return
        self._told[(about, text)] = None
        if len(self._told) > TOLD_KEPT:
            self._told.popitem(last=False)
        log.warning("%s: %s", about.key, text)
        try:
            await self.api.create(EVENTS, event(about, self.reason, text, self.clock()))
        except KubeError as exc:
            log.debug("event for %s: %s", about.key, exc)
