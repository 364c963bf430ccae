"""``make image``: the OCI archive hack/image/build.sh writes (the amd64 one of the session's
``make release``, conftest.py), unpacked and run with chroot (no container runtime):
``gangslice --version``, ``gangslice place`` on an example and ``gangslice serve --cluster``
answering its health endpoints, as the image's own user on a root filesystem it cannot write
to; its labels, user and entrypoint; no shell; the SBOM beside it naming what is inside; the
Containerfile written from the same recipe.

The build needs root, mmdebstrap and buildah (Debian packages); without them it fails saying
so. Its Debian and dependency steps are cached under ~/.cache/gangslice/image/<version>/."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from released import Release

from extender import __version__

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "hack" / "image" / "requirements.lock"
IMAGE = "ghcr.io/gangslice/gangslice"
EXAMPLES = REPO / "examples"


@dataclass(frozen=True)
class Unpacked:
    archive: Path
    rootfs: Path
    manifest: dict[str, Any]
    config: dict[str, Any]


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


@pytest.fixture(scope="module")
def image(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unpacked]:
    archive = release.file("-amd64.oci.tar")
    layout = tmp_path_factory.mktemp("oci")
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="tar")
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == f"{IMAGE}:{__version__}"
    manifest = json.loads(_blob(layout, entry["digest"]).read_text())
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
    rootfs = tmp_path_factory.mktemp("rootfs")
    for layer in manifest["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip", layer
        with gzip.open(_blob(layout, layer["digest"])) as raw, tarfile.open(fileobj=raw) as tar:
            tar.extractall(rootfs, filter="tar", numeric_owner=True)
    # Nothing in the image is the image user's to write, not even /tmp: what runs below runs
    # on a root filesystem as good as read-only (Kubernetes mounts an emptyDir at /tmp).
    rootfs.chmod(0o755)  # a pytest folder is 0700
    (rootfs / "tmp").chmod(0o755)
    (rootfs / "home" / "nonroot").chmod(0o555)
    inputs = rootfs / "inputs"
    inputs.mkdir()
    shutil.copy(EXAMPLES / "clusters" / "hgx-h100-4leaf.yaml", inputs / "cluster.yaml")
    shutil.copy(EXAMPLES / "gangs" / "llama-70b-tp8.yaml", inputs / "gang.yaml")
    yield Unpacked(archive, rootfs, manifest, config)


def run_in(image: Unpacked, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(image, *args), capture_output=True, text=True, timeout=timeout, check=False)


def _argv(image: Unpacked, *args: str) -> list[str]:
    """The image's entrypoint with ``args``, as its user, with only its environment, via chroot."""
    cfg = image.config["config"]
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    head = ["env", "-i", *cfg["Env"], chroot, f"--userspec={cfg['User']}", str(image.rootfs)]
    return [*head, *cfg["Entrypoint"], *args]


def test_the_image_says_what_it_is(image: Unpacked) -> None:
    cfg = image.config["config"]
    assert image.config["architecture"] == "amd64" and image.config["os"] == "linux"
    assert cfg["User"] == "65532:65532" and cfg["Entrypoint"] == ["/usr/local/bin/gangslice"]
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert len(labels["org.opencontainers.image.revision"]) == 40
    assert image.manifest["annotations"]["org.opencontainers.image.version"] == __version__
    for shell in ("bin/sh", "bin/bash", "bin/dash", "usr/bin/sh", "usr/bin/bash", "usr/bin/dash"):
        assert not (image.rootfs / shell).exists(), f"{shell}: the image needs no shell"


def test_gangslice_runs_inside(image: Unpacked) -> None:
    run = run_in(image, "--version")
    assert run.returncode == 0 and run.stdout.strip() == f"gangslice {__version__}", run.stdout + run.stderr
    run = run_in(image, "place", "--json", "--cluster", "/inputs/cluster.yaml", "--gang", "/inputs/gang.yaml")
    assert run.returncode == 0, run.stdout + run.stderr
    placed = json.loads(run.stdout)
    assert placed["placed"] is True and len(placed["pods"]) == 1, placed


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return 0


def test_serve_answers_its_health_endpoints_inside(image: Unpacked) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = _argv(image, "serve", "--cluster", "/inputs/cluster.yaml", "--host", "127.0.0.1", f"--port={port}")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while _status(f"http://127.0.0.1:{port}/healthz") != 200:
            assert proc.poll() is None, (
                f"serve exited {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}"
            )
            assert time.monotonic() < deadline, "serve did not answer /healthz within 60 s"
            time.sleep(0.3)
        assert _status(f"http://127.0.0.1:{port}/readyz") == 200
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0, f"serve exited {proc.returncode} on SIGTERM"


def test_the_sbom_beside_it_names_what_is_inside(image: Unpacked) -> None:
    sbom = json.loads(
        image.archive.with_name(image.archive.name.replace(".oci.tar", ".spdx.json")).read_text()
    )
    assert sbom["spdxVersion"] == "SPDX-2.3"
    purls = {
        ref["referenceLocator"].split("@")[0]: ref["referenceLocator"].split("@")[1]
        for p in sbom["packages"]
        for ref in p["externalRefs"]
    }
    assert "pkg:deb/debian/python3.11-minimal" in purls and "pkg:deb/debian/libc6" in purls
    assert purls["pkg:pypi/gangslice"] == __version__
    pinned = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.split()[0].partition("==")
            pinned[f"pkg:pypi/{name}"] = version
    installed = {k: v for k, v in purls.items() if k.startswith("pkg:pypi/") and k != "pkg:pypi/gangslice"}
    assert installed == pinned  # exactly the lock, nothing more


def test_the_containerfile_follows_the_same_recipe() -> None:
    proc = subprocess.run(
        [str(Path(os.sys.executable)), str(REPO / "hack" / "image" / "containerfile.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = (REPO / "Containerfile").read_text()
    assert "hack/image/rootfs.sh debian" in text and f'image.version="{__version__}"' in text
