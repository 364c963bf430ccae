"""Holding Python's cycle collector off while requests hold their decoded bodies.

A full NodeList body (kube-scheduler without ``nodeCacheCapable``, Volcano's prioritize)
decodes into ~10^5 dicts and lists, all in the young generation. Allocation sets off a
young-generation collection every few hundred new containers, and one that starts while
such a tree is alive walks all of it: ~10 ms at 500 Nodes, several times per request.
Decoded JSON is a tree, so reference counting frees it whole when the request ends and
there is nothing in it for the collector to find; paused until then, the collection that
follows finds a small young generation again.

The pause is shared: it starts when the first request enters and ends when the last one
leaves. Under load that never lets the count reach zero, a collection of the young
generations still runs once the pause has lasted ``max_pause_s``, so cyclic garbage from
elsewhere in the process waits at most that long.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: The longest the collector stays off while requests keep overlapping.
MAX_PAUSE_S = 1.0


class CollectorPause:
    def __init__(self, max_pause_s: float = MAX_PAUSE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_pause_s = max_pause_s
        self.clock = clock
        self.holders = 0
        #: Whether the pause turned the collector off (it was on): only then turn it back on.
        self._owned = False
        self._since = 0.0

    @contextmanager
    def held(self) -> Iterator[None]:
        if self.holders == 0:
            self._owned = gc.isenabled()
            self._since = self.clock()
            gc.disable()
        self.holders += 1
        try:
            yield
        finally:
            self.holders -= 1
            if self.holders == 0:
                if self._owned:
                    gc.enable()
            elif self._owned and self.clock() - self._since > self.max_pause_s:
                gc.collect(1)
                self._since = self.clock()
