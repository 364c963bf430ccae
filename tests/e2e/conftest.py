"""Fixtures for the end-to-end tier: build the upstream binaries, start a real control plane.

The build runs ``hack/e2e/build.sh`` (idempotent: a warm run builds nothing). It never skips: if Go is
missing or a build fails, the session errors with the script's message, which says what to install.
Set ``GANGSLICE_E2E_BIN`` to a folder of prebuilt binaries to bypass the build.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import Gangslice, clean_namespace, new_namespace, running_control_plane

from extender.bench.controlplane import ControlPlane, build_binaries


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end tests against a real control plane")


@pytest.fixture(scope="session")
def e2e_bin_dir() -> Path:
    """Folder with etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kueue,
    vc-scheduler, lws, jobset and helm (``crds/`` and ``webhooks/`` beside it)."""
    prebuilt = os.environ.get("GANGSLICE_E2E_BIN")
    if prebuilt:
        return Path(prebuilt)
    return build_binaries()


@pytest.fixture(scope="session")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-scheduler (default config), shared by the whole session.

    ``GANGSLICE_E2E_KEEP=1`` keeps the temp folder (logs, configs, certificates) after the run."""
    with running_control_plane(e2e_bin_dir) as cp:
        yield cp


@pytest.fixture
def ns(request: pytest.FixtureRequest, control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[str]:
    """A fresh namespace ``<module's POOL>-<random>`` once the module's ``gangslice`` stack is up; its pods,
    reservations and queue objects are deleted after the test."""
    name = new_namespace(control_plane, f"{request.module.POOL}-{uuid.uuid4().hex[:6]}")
    try:
        yield name
    finally:
        clean_namespace(control_plane, name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Attach the control-plane component logs to the report of a failing e2e test."""
    report = yield
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        cp = item.funcargs.get("control_plane") if hasattr(item, "funcargs") else None
        if isinstance(cp, ControlPlane):
            report.sections.append(("control plane logs", cp.dump_logs(tail_lines=80)))
    return report
