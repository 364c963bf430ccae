"""The one place gangslice evicts a pod: ``pods/eviction`` (a policy/v1 Eviction), so the
pod's PodDisruptionBudget is honoured and its controller makes a new pod.

Callers: a pod the kubelet gave other GPUs than promised (:mod:`extender.controllers.mismatch`)
and a movable replica a migration moves (:mod:`extender.controllers.migration`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from extender.kube.api import KubeClient, KubeError, NotFound, Throttled


class Result(enum.StrEnum):
    EVICTED = "evicted"
    #: The pod was gone already (its GPUs are free).
    GONE = "gone"
    #: Its PodDisruptionBudget allows no disruption now (429).
    BLOCKED = "blocked"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Eviction:
    result: Result
    #: What the API server said, for ``blocked`` and ``failed``.
    detail: str = ""

    @property
    def done(self) -> bool:
        """The pod is gone or going."""
        return self.result in (Result.EVICTED, Result.GONE)


async def evict(api: KubeClient, namespace: str, name: str, uid: str, *, dry_run: bool = False) -> Eviction:
    """Evict pod ``namespace/name`` of ``uid`` (only that very pod), or with ``dry_run`` ask
    whether it may be now (the same checks, budget included; nothing evicted)."""
    try:
        await api.evict(namespace, name, uid, dry_run=dry_run)
    except NotFound:
        return Eviction(Result.GONE)
    except Throttled as exc:
        return Eviction(Result.BLOCKED, exc.message)
    except KubeError as exc:
        return Eviction(Result.FAILED, str(exc))
    return Eviction(Result.EVICTED)
