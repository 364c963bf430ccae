#!/usr/bin/env python3
"""The archives of a release, written byte for byte the same from the same inputs
(hack/release/build.sh, ``make release``).

Usage:
  assemble.py oci-repack SRC DST         an OCI archive (buildah's oci-archive) rewritten with its
                                         entries in a fixed order, dated SOURCE_DATE_EPOCH
  assemble.py oci-index DST SRC...       one OCI archive holding the images SRC... (one platform
                                         each) under an OCI image index; prints the index's digest
  assemble.py chart-values VALUES DIGEST set image.digest in a chart's values.yaml
  assemble.py tgz SRC DST                a gzipped tar (an sdist, a helm package) rewritten with
                                         fixed dates, owners and modes and a gzip header without a date

Why rewrite: buildah dates an oci-archive's entries with the time of the build, ``helm package``
(v3.22, pkg/chartutil/save.go) every entry with time.Now(), setuptools' sdist each file with
its modification time in the checkout and its gzip header with the time of the build; the
blobs inside, the chart's files and the sources are the same from build to build. Dates are
SOURCE_DATE_EPOCH, which must be set.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

import yaml

INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


def epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if not value:
        sys.exit("assemble.py: SOURCE_DATE_EPOCH is not set")
    return int(value)


def _info(name: str, size: int = 0, *, directory: bool = False, executable: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory or executable else 0o644
    info.size = 0 if directory else size
    info.mtime = epoch()
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_info(name, len(data)), io.BytesIO(data))


class Layout:
    """An OCI image layout read from an archive: its index.json and its blobs (by digest)."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.members = {m.name.removeprefix("./"): m for m in self.tar.getmembers() if m.isfile()}
        self.index = json.loads(self.read("index.json"))

    def read(self, name: str) -> bytes:
        f = self.tar.extractfile(self.members[name])
        assert f is not None
        return f.read()

    def blob_names(self) -> list[str]:
        return sorted(n for n in self.members if n.startswith("blobs/"))

    def blob(self, digest: str) -> bytes:
        algorithm, _, hexdigest = digest.partition(":")
        return self.read(f"blobs/{algorithm}/{hexdigest}")

    def open_blob(self, name: str) -> IO[bytes]:
        f = self.tar.extractfile(self.members[name])
        assert f is not None
        return f

    def only_manifest(self) -> dict[str, Any]:
        (entry,) = self.index["manifests"]
        return dict(entry)


@contextmanager
def _layout_writer(dst: Path, index: dict[str, Any]) -> Iterator[tarfile.TarFile]:
    """A tar with oci-layout, index.json and the folders blobs/sha256/; the caller adds the
    blobs, in sorted order."""
    tmp = dst.with_name(dst.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _bytes(tar, "oci-layout", OCI_LAYOUT)
        _bytes(tar, "index.json", json.dumps(index, separators=(",", ":")).encode())
        tar.addfile(_info("blobs", directory=True))
        tar.addfile(_info("blobs/sha256", directory=True))
        yield tar
    tmp.replace(dst)


def oci_repack(src: Path, dst: Path) -> None:
    with tarfile.open(src) as source:
        layout = Layout(source)
        with _layout_writer(dst, layout.index) as tar:
            for name in layout.blob_names():
                tar.addfile(_info(name, layout.members[name].size), layout.open_blob(name))


def _platform(layout: Layout) -> dict[str, str]:
    manifest = json.loads(layout.blob(layout.only_manifest()["digest"]))
    config = json.loads(layout.blob(manifest["config"]["digest"]))
    platform = {"architecture": config["architecture"], "os": config["os"]}
    if config.get("variant"):
        platform["variant"] = config["variant"]
    return platform


def _common_annotations(layouts: list[Layout]) -> dict[str, str]:
    """The annotations every image's manifest carries with the same value (title, version,
    source, ...): a registry shows the index's (ghcr.io the description and the source). Not
    the empty ones (buildah's base.name of an image from scratch), nor ref.name, which names a
    manifest in a layout."""
    each = [json.loads(lay.blob(lay.only_manifest()["digest"])).get("annotations", {}) for lay in layouts]
    return {
        k: v
        for k, v in sorted(each[0].items())
        if v and k != REF_NAME and all(a.get(k) == v for a in each[1:])
    }


def oci_index(dst: Path, sources: list[Path]) -> str:
    """Write the multi-platform archive; return the digest of its image index."""
    with ExitStack() as stack:
        return _oci_index(dst, [Layout(stack.enter_context(tarfile.open(s))) for s in sources])


def _oci_index(dst: Path, layouts: list[Layout]) -> str:
    entries = [lay.only_manifest() for lay in layouts]
    (ref,) = {e.get("annotations", {}).get(REF_NAME) for e in entries}
    platforms = [_platform(lay) for lay in layouts]
    if len({json.dumps(p, sort_keys=True) for p in platforms}) != len(platforms):
        sys.exit(f"assemble.py: two images of one platform: {platforms}")
    image_index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {"mediaType": e["mediaType"], "digest": e["digest"], "size": e["size"], "platform": p}
            for e, p in zip(entries, platforms, strict=True)
        ],
        "annotations": _common_annotations(layouts),
    }
    data = json.dumps(image_index, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    top = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {"mediaType": INDEX, "digest": digest, "size": len(data), "annotations": {REF_NAME: ref}},
        ],
    }
    blobs: dict[str, Layout | bytes] = {f"blobs/sha256/{digest.removeprefix('sha256:')}": data}
    for lay in layouts:
        for name in lay.blob_names():
            blobs.setdefault(name, lay)
    with _layout_writer(dst, top) as tar:
        for name, source in sorted(blobs.items()):
            if isinstance(source, bytes):
                _bytes(tar, name, source)
            else:
                tar.addfile(_info(name, source.members[name].size), source.open_blob(name))
    return digest


def chart_values(values: Path, digest: str) -> None:
    """Set ``image.digest`` (hack/gen-chart.py writes it empty), keeping the comments."""
    lines = values.read_text().splitlines(keepends=True)
    start = lines.index("image:\n")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n")), len(lines))
    (at,) = [i for i in range(start, end) if lines[i].startswith("  digest:")]
    lines[at] = f'  digest: "{digest}"\n'
    values.write_text("".join(lines))
    assert yaml.safe_load(values.read_text())["image"]["digest"] == digest


def tgz(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    with (
        tarfile.open(src, "r:gz") as source,
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for member in source.getmembers():  # the order the tool chose (helm: Chart.yaml first)
            if member.isdir():
                tar.addfile(_info(member.name, directory=True))
            elif member.isfile():
                info = _info(member.name, member.size, executable=bool(member.mode & 0o111))
                tar.addfile(info, source.extractfile(member))
            else:
                sys.exit(f"assemble.py: {src}: {member.name} is neither a file nor a folder")
    tmp.replace(dst)


def main(argv: list[str]) -> int:
    match argv:
        case ["oci-repack", src, dst]:
            oci_repack(Path(src), Path(dst))
        case ["oci-index", dst, *sources] if len(sources) >= 2:
            print(oci_index(Path(dst), [Path(s) for s in sources]))
        case ["chart-values", values, digest] if digest.startswith("sha256:"):
            chart_values(Path(values), digest)
        case ["tgz", src, dst]:
            tgz(Path(src), Path(dst))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
