"""Feeds the cluster cache from the API: list, then watch, per kind, each in its own thread.

The blocking client runs in daemon threads; events cross to the asyncio loop through a
queue and are applied there, one at a time, so the cache is only ever touched by the loop.
A watch that ends (server timeout) resumes from the last resourceVersion; ``410 Gone``
lists again, and the cache keeps its state until the new list replaces it; any other error
waits a moment and retries (listing again after repeated failures).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from extender.kube.api import ALL_KINDS, Gone, Kind, KubeApi
from extender.kube.cache import ClusterCache

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


@dataclass
class WatchStats:
    lists: dict[Kind, int] = field(default_factory=lambda: {k: 0 for k in Kind})
    events: int = 0
    errors: int = 0


class Watcher:
    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        kinds: Iterable[Kind] = ALL_KINDS,
        *,
        watch_timeout_s: float = 300.0,
        retry_s: float = 1.0,
    ) -> None:
        self.api = api
        self.cache = cache
        self.kinds = tuple(kinds)
        self.watch_timeout_s = watch_timeout_s
        self.retry_s = retry_s
        self.stats = WatchStats()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    async def run(self) -> None:
        """Start the threads and apply what they send until cancelled."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Listed | _Event] = asyncio.Queue()

        def send(item: _Listed | _Event) -> None:
            if not self._stop.is_set():
                loop.call_soon_threadsafe(queue.put_nowait, item)

        for kind in self.kinds:
            t = threading.Thread(
                target=self._loop, args=(kind, send), name=f"watch-{kind.value}", daemon=True
            )
            t.start()
            self._threads.append(t)
        try:
            while True:
                item = await queue.get()
                try:
                    if isinstance(item, _Listed):
                        self.stats.lists[item.kind] += 1
                        self.cache.replace(item.kind, item.items)
                    else:
                        self.stats.events += 1
                        self.cache.apply(item.kind, item.type, item.obj)
                except Exception:
                    log.exception("applying a %s update failed; continuing", item.kind.value)
        finally:
            self.stop()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, kind: Kind, send: Any) -> None:
        rv: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if rv is None:
                    listing = self.api.list(kind)
                    send(_Listed(kind, listing.items))
                    rv = listing.resource_version
                for ev in self.api.watch(kind, rv, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    rv = ev.resource_version or rv
                    if ev.type in ("ADDED", "MODIFIED", "DELETED"):
                        send(_Event(kind, ev.type, ev.obj))
                failures = 0
            except Gone:
                log.info("watch of %s expired (410 Gone); listing again", kind.value)
                rv = None
            except Exception as exc:
                self.stats.errors += 1
                failures += 1
                log.warning("watch of %s failed (%s); retrying", kind.value, exc)
                if failures >= 3:
                    rv = None
                self._stop.wait(self.retry_s)
