"""Feeds the cluster cache from the API: list, then watch, per kind, each in its own task.

Events are applied on the loop, one at a time, so the cache is only ever touched by the loop.
A watch that ends (server timeout) resumes from the last resourceVersion; ``410 Gone``
lists again, and the cache keeps its state until the new list replaces it; any other error
waits a moment and retries (listing again after repeated failures). An optional kind the API
server does not serve (``404``: a beta API left off) counts as listed and empty, and is asked for
again every ``absent_retry_s``.

Whoever reacts to a kind's objects listens here rather than watching it a second time
(:meth:`Watcher.listen`): each listener is told every object after the cache took it in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from extender.kube.api import ALL_KINDS, Gone, Kind, KubeClient, NotFound
from extender.kube.cache import ClusterInformer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Listed:
    kind: Kind
    items: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class _Event:
    kind: Kind
    type: str
    obj: dict[str, Any]


#: Told ``(event type, object)`` after the cache applied it: ADDED, MODIFIED or DELETED, and
#: None for each object of a list (the first, or a relist after ``410 Gone``), as kopf's
#: event handlers are. It runs on the loop and must not block; what awaits, it queues.
Listener = Callable[[str | None, dict[str, Any]], None]


@dataclass
class WatchStats:
    lists: dict[Kind, int] = field(default_factory=lambda: {k: 0 for k in Kind})
    events: int = 0
    errors: int = 0


class Watcher:
    def __init__(
        self,
        api: KubeClient,
        cache: ClusterInformer,
        kinds: Iterable[Kind] = ALL_KINDS,
        *,
        watch_timeout_s: float = 300.0,
        retry_s: float = 1.0,
        absent_retry_s: float = 60.0,
    ) -> None:
        self.api = api
        self.cache = cache
        self.kinds = tuple(kinds)
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.absent_retry_s = absent_retry_s
        self.stats = WatchStats()
        self._stop = asyncio.Event()
        self._listeners: dict[Kind, list[Listener]] = {}

    def listen(self, kind: Kind, listener: Listener) -> None:
        self._listeners.setdefault(kind, []).append(listener)

    async def run(self) -> None:
        """Watch every kind and apply what comes until cancelled (or :meth:`stop`)."""
        tasks = [asyncio.create_task(self._loop(kind), name=f"watch-{kind.value}") for kind in self.kinds]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        self._stop.set()

    def _apply(self, item: _Listed | _Event) -> None:
        try:
            if isinstance(item, _Listed):
                self.stats.lists[item.kind] += 1
                self.cache.replace(item.kind, item.items)
            else:
                self.stats.events += 1
                self.cache.apply(item.kind, item.type, item.obj)
        except Exception:
            log.exception("applying a %s update failed; continuing", item.kind.value)
        for listener in self._listeners.get(item.kind, ()):
            try:
                if isinstance(item, _Listed):
                    for obj in item.items:
                        listener(None, obj)
                else:
                    listener(item.type, item.obj)
            except Exception:
                log.exception("a listener to %s failed; continuing", item.kind.value)

    async def _loop(self, kind: Kind) -> None:
        rv: str | None = None
        failures = 0
        absent = False
        res = kind.resource
        while not self._stop.is_set():
            try:
                if rv is None:
                    listing = await self.api.list(res)
                    self._apply(_Listed(kind, listing.items))
                    rv = listing.resource_version
                    absent = False
                async for ev in self.api.watch(res, rv, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    rv = ev.resource_version or rv
                    if ev.type in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(_Event(kind, ev.type, ev.obj))
                failures = 0
            except Gone:
                log.info("watch of %s expired (410 Gone); listing again", kind.value)
                rv = None
            except Exception as exc:
                if isinstance(exc, NotFound) and kind.optional:
                    if not absent:
                        log.info(
                            "the API server does not serve %s/%s; none are read (asking again every %.0f s)",
                            res.api_version,
                            res.plural,
                            self.absent_retry_s,
                        )
                        self._apply(_Listed(kind, []))
                        absent = True
                    rv = None
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.absent_retry_s)
                    continue
                self.stats.errors += 1
                failures += 1
                log.warning("watch of %s failed (%s); retrying", kind.value, exc)
                if failures >= 3:
                    rv = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.retry_s)
