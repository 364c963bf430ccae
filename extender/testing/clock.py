"""A clock a test sets by hand: what every component that takes ``clock: Callable[[], float]``
is given in tests."""

from __future__ import annotations


class FakeClock:
    """Returns :attr:`now`; a test moves time by assigning to it or calling :meth:`advance`."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
