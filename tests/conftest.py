"""Fixtures every test tier shares."""

from __future__ import annotations

import pytest

from extender.testing.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
