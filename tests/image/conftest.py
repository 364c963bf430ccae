"""The image tier's one build: ``make release`` (hack/release/build.sh), once per session.
test_image.py runs its amd64 image, test_release.py checks every artifact; nothing is built
twice. The image steps are cached under ~/.cache/gangslice/image/<version>/ (hack/image/build.sh),
helm comes from hack/e2e/build.sh (or $GANGSLICE_E2E_BIN)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from released import Release

from extender import __version__
from extender.bench.controlplane import build_binaries

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "release" / "build.sh"


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    prebuilt = os.environ.get("GANGSLICE_E2E_BIN")
    return (Path(prebuilt) if prebuilt else build_binaries(["helm"])) / "helm"


@pytest.fixture(scope="session")
def release(helm_bin: Path) -> Release:
    """The build as the release workflow runs it (with its tag), with the helm of the checks."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "HELM": str(helm_bin),
        "GANGSLICE_RELEASE_TAG": f"v{__version__}",
    }
    proc = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=3600, env=env, check=False)
    assert proc.returncode == 0, f"hack/release/build.sh failed:\n{proc.stderr[-4000:]}"
    said = dict(line.split("=", 1) for line in proc.stdout.splitlines()[-2:])
    return Release(Path(said["RELEASE_DIR"]), said["IMAGE_DIGEST"])
