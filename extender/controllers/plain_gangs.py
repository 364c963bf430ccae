"""Plain gangs that can never fit: say so on their pods.

The extender places a plain gang (``gangslice.io/gang`` + ``gangslice.io/gang-size``) on
its first member's filter and answers "unresolvable" when no slice exists even on an empty
cluster; kube-scheduler then only retries. This reporter, run by the controller's leader on
the pod watch, checks an unbound member of a gang without a reservation against the empty
cluster once per gang shape, and when the gang can never fit it puts the reason on every
such pod: a Warning Event ``NeverFits`` and the annotation ``gangslice.io/status``.

A gang that merely waits for capacity is left to the extender (its filter reason shows in
kube-scheduler's own ``FailedScheduling`` Event); an expired hold is placed again on the
next member's filter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from extender.controllers import owned
from extender.controllers.controller import Cache
from extender.kube import names
from extender.kube.api import ApiError
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodError, PodInfo
from extender.logs import fields
from extender.placement.request import GangRequest
from extender.placement.slice import Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place

log = logging.getLogger(__name__)


class PlainGangApi(owned.EventApi, Protocol):
    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...


def never_fits(request: GangRequest, snap: ClusterSnapshot) -> str | None:
    """Why ``request`` can never be placed on this cluster, or None when it can be."""
    try:
        result = place(snap.emptied(), request)
    except ValueError as exc:  # an unknown level name and the like
        return str(exc)
    return result.reason if isinstance(result, Unplaceable) else None


class PlainGangReporter:
    def __init__(
        self,
        api: PlainGangApi,
        cache: Cache,
        clock: Callable[[], float] = time.time,
        identity: str = "gangslice",
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self.identity = identity
        self.leader = False
        #: Verdicts by (gang key, request): the reason it never fits, or None.
        self._verdicts: dict[tuple[str, GangRequest], str | None] = {}

    async def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        if not self.leader or not self.cache.ready or event_type == "DELETED":
            return
        pod = PodInfo.from_obj(obj)
        if pod.node is not None or pod.terminal or pod.deleting or pod.gang is None:
            return
        if self.cache.reservation(pod.gang) is not None:
            return
        try:
            request = plain_gang_request(pod, self.cache.pods_of_gang(pod.gang))
        except PodError as exc:
            await self._say(obj, pod, "Invalid", str(exc), "InvalidGang")
            return
        if not isinstance(request, GangRequest):
            return
        memo = (pod.gang, request)
        if memo not in self._verdicts:
            self._verdicts[memo] = never_fits(request, self.cache.snapshot())
        reason = self._verdicts[memo]
        if reason is not None:
            await self._say(
                obj, pod, "NeverFits", f"gang {pod.gang} can never fit this cluster: {reason}", "NeverFits"
            )

    def forget(self) -> None:
        """Drop remembered verdicts (the cluster's nodes changed)."""
        self._verdicts.clear()

    async def _say(self, obj: Mapping[str, Any], pod: PodInfo, state: str, message: str, reason: str) -> None:
        text = f"{state}: {message}"[:1024]
        if pod.annotations.get(names.STATUS) == text:
            return
        try:
            await self.api.patch_pod_annotations(pod.namespace, pod.name, {names.STATUS: text})
        except ApiError as exc:
            log.warning("pod %s: %s", pod.key, exc, extra=fields(gang=pod.gang, pod=pod.key))
            return
        await owned.post_event(
            self.api,
            {"apiVersion": "v1", "kind": "Pod", **obj},
            "Warning",
            reason,
            message,
            self.clock(),
            self.identity,
        )
