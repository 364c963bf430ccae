"""Plain gangs that can never fit: say so on their pods.

The extender places a plain gang (``gangslice.io/gang`` + ``gangslice.io/gang-size``) on
its first member's filter and answers "unresolvable" when no slice exists even on an empty
cluster; kube-scheduler then only retries. This reporter, run by the controller's leader on
the pod watch, checks an unbound member of a gang without a reservation against the empty
cluster once per gang shape, and when the gang can never fit it says why on every such
pod with a Warning Event ``NeverFits`` (``InvalidGang`` for settings it cannot read), once
per pod and message. It writes nothing on the pods (the controller has no cluster-wide
``pods: patch``): the Event is the signal, next to the pod's ``PodScheduled`` condition, in
which kube-scheduler records the extender's filter reason (the same words), and
``gangslice explain pod``.

A gang that merely waits for capacity is left to the extender (its filter reason shows in
kube-scheduler's own ``FailedScheduling`` Event); an expired hold is placed again on the
next member's filter.

A verdict holds for the cluster it was made on: it is kept with the cache's
``node_generation`` and made again once a node joins, leaves or changes, so a gang that
could not fit fits when a big enough node arrives. One verdict per gang, forgotten when the
gang is placed or a member is deleted, and at most :data:`MAX_VERDICTS` in all; with it
goes what was said to which pod (after a restart each pod is told once more).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from extender.controllers import owned
from extender.controllers.common import Cache
from extender.kube.api import KubeClient
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodError, PodInfo
from extender.logs import fields
from extender.placement.request import GangRequest
from extender.placement.slice import Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place

log = logging.getLogger(__name__)

#: Verdicts remembered at most (the oldest go first); a gang forgotten is judged again.
MAX_VERDICTS = 10_000


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
        api: KubeClient,
        cache: Cache,
        clock: Callable[[], float] = time.time,
        identity: str = "gangslice",
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self.identity = identity
        self.leader = False
        #: gang key -> (the request judged, the cache's node generation then, the reason
        #: it never fits or None).
        self._verdicts: OrderedDict[str, tuple[GangRequest, int, str | None]] = OrderedDict()
        #: gang key -> pod key -> what its last Event said (each pod is told a message once).
        self._told: dict[str, dict[str, str]] = {}

    @property
    def remembered(self) -> int:
        """How many gangs' verdicts are kept."""
        return len(self._verdicts)

    async def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        pod = PodInfo.from_obj(obj)
        if pod.gang is not None and (event_type == "DELETED" or self.cache.reservation(pod.gang) is not None):
            self.forget(pod.gang)  # gone, or placed: judged afresh if it waits again
            return
        if not self.leader or not self.cache.ready:
            return
        if pod.node is not None or pod.terminal or pod.deleting or pod.gang is None:
            return
        try:
            request = plain_gang_request(pod, self.cache.pods_of_gang(pod.gang), self.cache.owners)
        except PodError as exc:
            await self._say(obj, pod, "Invalid", str(exc), "InvalidGang")
            return
        if not isinstance(request, GangRequest):
            return
        reason = self._verdict(pod.gang, request)
        if reason is not None:
            await self._say(
                obj, pod, "NeverFits", f"gang {pod.gang} can never fit this cluster: {reason}", "NeverFits"
            )

    def _verdict(self, gang: str, request: GangRequest) -> str | None:
        generation = self.cache.node_generation
        known = self._verdicts.get(gang)
        if known is not None and known[0] == request and known[1] == generation:
            self._verdicts.move_to_end(gang)
            return known[2]
        reason = never_fits(request, self.cache.snapshot())
        self._verdicts[gang] = (request, generation, reason)
        self._verdicts.move_to_end(gang)
        while len(self._verdicts) > MAX_VERDICTS:
            self._told.pop(self._verdicts.popitem(last=False)[0], None)
        return reason

    def forget(self, gang: str) -> None:
        """Drop the verdict of ``gang`` (placed, or a member deleted)."""
        self._verdicts.pop(gang, None)
        self._told.pop(gang, None)

    async def _say(self, obj: Mapping[str, Any], pod: PodInfo, state: str, message: str, reason: str) -> None:
        text = f"{state}: {message}"[:1024]
        gang = pod.gang or ""
        told = self._told.get(gang, {})
        if told.get(pod.key) == text:
            return
        self._told.setdefault(gang, {})[pod.key] = text
        while len(self._told) > MAX_VERDICTS:
            self._told.pop(next(iter(self._told)))
        log.info("pod %s: %s", pod.key, text, extra=fields(gang=pod.gang, pod=pod.key))
        await owned.post_event(
            self.api,
            {"apiVersion": "v1", "kind": "Pod", **obj},
            "Warning",
            reason,
            message,
            self.clock(),
            self.identity,
        )
