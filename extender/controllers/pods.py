"""Pod events for the controllers, from the cluster cache's own watch (pods are watched once).

The watch tells :meth:`PodFeed.tell` every pod it applied to the cache
(:meth:`extender.kube.watch.Watcher.listen`); the feed keeps those the controllers react to
(pods naming a Volcano PodGroup; pods of a plain gang; pods the DRA webhook gave a slot) and
:meth:`PodFeed.run` hands them on, in the order seen, to the PodGroup controller, the
plain-gang reporter and the claims controller, each with a queue of its own so a slow
reaction of one holds up only its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from extender.kube import names

log = logging.getLogger(__name__)

Event = tuple[str | None, dict[str, Any]]


class ReactsToPods(Protocol):
    async def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None: ...


def _has(obj: Mapping[str, Any], field: str, key: str) -> bool:
    meta = obj.get("metadata")
    got = meta.get(field) if isinstance(meta, Mapping) else None
    return isinstance(got, Mapping) and key in got


def _joins_pod_group(obj: Mapping[str, Any]) -> bool:
    """Whether the pod names an upstream PodGroup (``spec.schedulingGroup``): its gang."""
    spec = obj.get("spec")
    return isinstance(spec, Mapping) and isinstance(spec.get("schedulingGroup"), Mapping)


class PodFeed:
    def __init__(self) -> None:
        # Filled from the first event on, before the controllers exist: a pod listed before
        # they start is still handed on.
        self._podgroup_pods: asyncio.Queue[Event] = asyncio.Queue()
        self._plain_pods: asyncio.Queue[Event] = asyncio.Queue()
        self._slotted_pods: asyncio.Queue[Event] = asyncio.Queue()

    def tell(self, event_type: str | None, obj: dict[str, Any]) -> None:
        """A :data:`~extender.kube.watch.Listener` of the pod watch."""
        if _has(obj, "annotations", names.VOLCANO_GROUP):
            self._podgroup_pods.put_nowait((event_type, obj))
        if _has(obj, "labels", names.GANG) or _joins_pod_group(obj):
            self._plain_pods.put_nowait((event_type, obj))
        if _has(obj, "annotations", names.SLOT):
            self._slotted_pods.put_nowait((event_type, obj))

    @property
    def pending(self) -> int:
        return self._podgroup_pods.qsize() + self._plain_pods.qsize() + self._slotted_pods.qsize()

    async def run(
        self,
        stop: asyncio.Event,
        podgroups: ReactsToPods | None,
        plain: ReactsToPods | None,
        claims: ReactsToPods | None = None,
    ) -> None:
        """Hand the events on until ``stop`` is set; those of a controller not running are dropped."""
        tasks = [
            asyncio.create_task(self._drain(self._podgroup_pods, podgroups, "PodGroup")),
            asyncio.create_task(self._drain(self._plain_pods, plain, "plain gang")),
            asyncio.create_task(self._drain(self._slotted_pods, claims, "claims")),
        ]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    @staticmethod
    async def _drain(queue: asyncio.Queue[Event], to: ReactsToPods | None, what: str) -> None:
        while True:
            event_type, obj = await queue.get()
            if to is None:
                continue
            try:
                await to.on_pod(event_type, obj)
            except Exception:
                log.exception("the %s reaction to a pod event failed; continuing", what)
