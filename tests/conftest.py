"""Fixtures every test tier shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from extender.testing.clock import FakeClock
from extender.testing.kube import FakeKube, foreign_writes


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """The root logger as it was before the test: a command under test (``serve``, ``agent``)
    installs a handler on the stderr pytest captured for that test, which is closed once the
    test ends; a later log record (matplotlib's first font scan, say) would then print a
    logging error into another test's captured stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def one_writer_per_object(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeKube]]:
    """Every FakeKube a test makes is checked when it ends: SliceReservations were written
    only by the store, NodeTopologies only by the agent's writer, Bindings only by the binder,
    ResourceClaims only by the slot claims writer (extender/testing/kube.py WRITERS)."""
    made: list[FakeKube] = []
    original = FakeKube.__init__

    def init(self: FakeKube, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(FakeKube, "__init__", init)
    yield made
    bad = [w for api in made for w in foreign_writes(api)]
    assert not bad, f"written outside the object's one writer: {bad}"
