"""``make release``: out/release/ holds the wheel, the sdist, the amd64 and arm64 image archives,
the multi-arch archive whose OCI image index names exactly linux/amd64 and linux/arm64, the
SBOMs, the Helm chart pinning the image to that index's digest (appVersion = the package
version, ``helm lint`` clean), and a SHA256SUMS every line of which holds.

The build is conftest.py's ``release`` (once per session, shared with test_image.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from released import Release

from extender import __version__

IMAGE = "ghcr.io/gangslice/gangslice"
INDEX = "application/vnd.oci.image.index.v1+json"
ARCHES = ("amd64", "arm64")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _json(tar: tarfile.TarFile, name: str) -> Any:
    f = tar.extractfile(name)
    assert f is not None, name
    return json.loads(f.read())


def _blob(tar: tarfile.TarFile, digest: str) -> Any:
    return _json(tar, "blobs/" + digest.replace(":", "/"))


def test_the_release_holds_every_artifact(release: Release) -> None:
    v = __version__
    assert sorted(p.name for p in release.dir.iterdir()) == sorted([
        "SHA256SUMS",
        f"gangslice-{v}-py3-none-any.whl",
        f"gangslice-{v}.tar.gz",
        f"gangslice-{v}.oci.tar",
        f"gangslice-{v}.tgz",
        *(f"gangslice-{v}-{arch}.{kind}" for arch in ARCHES for kind in ("oci.tar", "spdx.json")),
    ])  # fmt: skip


def test_every_line_of_sha256sums_matches_its_file(release: Release) -> None:
    lines = (release.dir / "SHA256SUMS").read_text().splitlines()
    sums = dict(reversed(line.split("  ", 1)) for line in lines)
    assert sums.keys() == {p.name for p in release.dir.iterdir()} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert _sha256(release.dir / name) == digest, name


def test_the_index_names_exactly_amd64_and_arm64(release: Release) -> None:
    with tarfile.open(release.file(".oci.tar")) as tar:
        (entry,) = _json(tar, "index.json")["manifests"]
        assert entry["mediaType"] == INDEX and entry["digest"] == release.digest
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == f"{IMAGE}:{__version__}"
        f = tar.extractfile("blobs/" + release.digest.replace(":", "/"))
        assert f is not None
        assert "sha256:" + hashlib.sha256(f.read()).hexdigest() == release.digest
        index = _blob(tar, release.digest)
        assert index["annotations"]["org.opencontainers.image.version"] == __version__
        platforms = {}
        for m in index["manifests"]:
            config = _blob(tar, _blob(tar, m["digest"])["config"]["digest"])
            platform = f"{m['platform']['os']}/{m['platform']['architecture']}"
            assert f"{config['os']}/{config['architecture']}" == platform, "the config says another platform"
            platforms[platform] = m["digest"]
    assert len(index["manifests"]) == 2 and platforms.keys() == {"linux/amd64", "linux/arm64"}
    for arch in ARCHES:  # the archive of each platform is the image the index names
        with tarfile.open(release.file(f"-{arch}.oci.tar")) as tar:
            (entry,) = _json(tar, "index.json")["manifests"]
            assert entry["digest"] == platforms[f"linux/{arch}"], arch


def _chart(release: Release, name: str) -> Any:
    with tarfile.open(release.file(".tgz")) as tar:
        f = tar.extractfile(f"gangslice/{name}")
        assert f is not None
        return yaml.safe_load(f.read())


def _helm(helm_bin: Path, home: Path, *args: str) -> str:
    env = {**os.environ} | {f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
    proc = subprocess.run([str(helm_bin), *args], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}\n{proc.stdout}"
    return proc.stdout


def test_the_chart_pins_the_image_to_the_index_digest(
    release: Release, helm_bin: Path, tmp_path: Path
) -> None:
    chart = _chart(release, "Chart.yaml")
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("gangslice", __version__, __version__)
    assert _chart(release, "values.yaml")["image"]["digest"] == release.digest
    rendered = _helm(helm_bin, tmp_path, "template", "gangslice", str(release.file(".tgz")), "--set",
                     "dra.enabled=true")  # fmt: skip
    images = {
        c["image"]
        for obj in yaml.safe_load_all(rendered)
        if obj
        for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    }
    assert images == {f"{IMAGE}@{release.digest}"}
    out = _helm(helm_bin, tmp_path, "lint", "--strict", str(release.file(".tgz")))
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


def test_the_wheel_and_the_sdist_are_the_package_version(release: Release) -> None:
    with zipfile.ZipFile(release.file("-py3-none-any.whl")) as wheel:
        meta = HeaderParser().parsestr(wheel.read(f"gangslice-{__version__}.dist-info/METADATA").decode())
        assert "extender/cli.py" in wheel.namelist()
    assert (meta["Name"], meta["Version"]) == ("gangslice", __version__)
    with tarfile.open(release.file(".tar.gz")) as sdist:
        f = sdist.extractfile(f"gangslice-{__version__}/PKG-INFO")
        assert f is not None
        assert HeaderParser().parsestr(f.read().decode())["Version"] == __version__


@pytest.mark.parametrize("arch", ARCHES)
def test_each_image_has_its_sbom(release: Release, arch: str) -> None:
    sbom = json.loads(release.file(f"-{arch}.spdx.json").read_text())
    locators = [r["referenceLocator"] for p in sbom["packages"] for r in p["externalRefs"]]
    assert f"pkg:pypi/gangslice@{__version__}" in locators
    assert any(loc.startswith("pkg:deb/debian/libc6@") and f"arch={arch}" in loc for loc in locators)
