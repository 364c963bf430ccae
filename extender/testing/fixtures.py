"""The test fixture files (``tests/fixtures``), read in one way: :func:`load_fixture` for
objects, :func:`load_cluster_fixture` for cluster files."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from extender.placement.files import load_cluster
from extender.placement.snapshot import ClusterSnapshot

__all__ = ["FIXTURES", "fixture_path", "load_cluster_fixture", "load_fixture"]

#: The fixture folder of the source tree (this module is test-only code run from it).
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def fixture_path(name: str) -> Path:
    """``tests/fixtures/<name>``, e.g. ``fixture_path("kueue/cluster.yaml")``; FileNotFoundError
    when there is no such file."""
    path = FIXTURES / name
    if not path.is_file():
        raise FileNotFoundError(f"no fixture {name!r} under {FIXTURES}")
    return path


@functools.cache
def _documents(name: str) -> tuple[Any, ...]:
    return tuple(yaml.safe_load_all(fixture_path(name).read_text()))


def load_fixture(name: str) -> Any:
    """The YAML fixture ``name`` (relative to ``tests/fixtures``): its one document, or the
    list of its documents when it holds several. Each file is parsed once per process and
    every call returns a fresh copy, which the test may change."""
    docs = copy.deepcopy(_documents(name))
    return docs[0] if len(docs) == 1 else list(docs)


def load_cluster_fixture(name: str) -> ClusterSnapshot:
    """The cluster file ``name`` under ``tests/fixtures`` (``kueue/cluster.yaml``...) as the
    CLI reads it: a fresh snapshot each call."""
    return load_cluster(fixture_path(name))
