"""OCI image archives written from plain files, for ``ctr images import`` on the real node
(tests/e2e/node.py), where no registry can be reached. One layer, no tools: the layout of
the OCI image spec (``oci-layout``, ``index.json``, ``blobs/sha256/``), dated 0 so the same
files give the same digests."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def pack(out: Path, name: str, files: Mapping[str, tuple[bytes, int]], entrypoint: Sequence[str]) -> Path:
    """Write an image ``name`` whose one layer holds ``files`` (path -> (bytes, mode)) to the
    archive ``out``; the index names it for containerd and for the OCI spec alike."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as lt:
        for path, (data, mode) in sorted(files.items()):
            _add(lt, path, data, mode)
    layer_bytes = layer.getvalue()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint)},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]},
    }
    with tarfile.open(out, "w") as tar:
        layer_ref = _blob(tar, layer_bytes)
        config_ref = _blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_ref},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_ref}],
        }
        manifest_ref = _blob(tar, json.dumps(manifest).encode())
        names = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": MANIFEST, **manifest_ref, "annotations": names}],
        }
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add(tar, "index.json", json.dumps(index).encode())
    return out
