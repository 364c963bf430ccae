"""The one shape of the core/v1 Events gangslice posts: about pods, nodes, PodGroups and
Workloads, from the controller or the extender (``reportingComponent``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from extender.kube import names
from extender.kube.crd_models import rfc3339

__all__ = ["ObjectRef", "event"]

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
