"""Whether this replica may act as the leader now, judged by its own clock.

The election task renews the Lease every few seconds; between renewals the replica believes
it leads. If its event loop stalls past the lease (a long GC pause, a SIGSTOP, a starved
node), a standby takes the lease and starts binding; when the old leader's loop runs again it
would serve the requests queued meanwhile before its election task notices, promising GPUs
the new leader has promised too. So leadership is not a flag but a deadline: every renewal
opens the fence until ``start of that renewal + renew deadline`` on this process's monotonic
clock, and every decision and every write to the API (a Binding, a SliceReservation) checks
the fence first. A stalled loop wakes past its deadline and refuses, before anything reaches
the API. The margin between the renew deadline and the lease duration (5 s by default)
covers the clock rates of the two machines.

A replica that decides alone (no election) has a fence that is always open.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from extender.kube.api import KubeError


class Deposed(KubeError):
    """A leader's write refused because this replica's lease may have passed to another."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class Fence:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: False: no election, this replica decides alone and the fence is always open.
        self.elected = False
        self._until = -math.inf
        #: The replica holding the lease has rebuilt its ledger and may decide.
        self.leading = False
        #: Writes and decisions refused since the start (a metric).
        self.refused = 0

    def elect(self) -> None:
        """Leadership comes from a Lease from now on: closed until the first renewal."""
        self.elected = True
        self._until = -math.inf
        self.leading = False

    def hold_until(self, deadline: float) -> None:
        """A renewal that began at ``deadline - renew deadline`` succeeded."""
        self._until = max(self._until, deadline)

    def close(self) -> None:
        self._until = -math.inf
        self.leading = False

    def holds(self) -> bool:
        """Whether this replica may write: its lease is valid by its own clock."""
        return not self.elected or self.clock() < self._until

    def decides(self) -> bool:
        """Whether this replica may decide: it may write, and leads (its ledger is rebuilt)."""
        return not self.elected or (self.leading and self.holds())

    def check(self, what: str) -> None:
        """Raise :class:`Deposed` unless the fence holds."""
        if self.holds():
            return
        self.refused += 1
        if self._until == -math.inf:
            raise Deposed(f"{what} refused: this gangslice replica does not hold the leader lease")
        late = self.clock() - self._until
        raise Deposed(
            f"{what} refused: this replica has not renewed the leader lease for {late:.1f} s past "
            "its renew deadline (its process stalled?); another replica may lead now"
        )
