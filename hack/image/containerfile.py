#!/usr/bin/env python3
"""Write the Containerfile from hack/image/recipe.env and the image entry of
manifests/kustomization.yaml, so that building with a container engine follows the same
recipe as ``make image`` (its build stage runs hack/image/rootfs.sh). ``--check`` exits 1
when the committed Containerfile differs from what this writes (tests/image/test_image.py).

Usage: hack/image/containerfile.py [--check]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "hack" / "image"
CONTAINERFILE = REPO / "Containerfile"
KEYS = ("DEBIAN_SUITE", "IMAGE_USER", "IMAGE_SOURCE", "IMAGE_TITLE", "IMAGE_DESCRIPTION", "IMAGE_LICENSES")
KEYS += ("IMAGE_ENTRYPOINT", "IMAGE_CMD", "IMAGE_ENV")


def recipe() -> dict[str, str]:
    """The recipe's values as bash sees them (recipe.env is sourced, not parsed)."""
    script = f"source {HERE / 'recipe.env'}; " + "; ".join(f'printf "%s\\0" "${k}"' for k in KEYS)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout.decode()
    return dict(zip(KEYS, out.split("\0")[: len(KEYS)], strict=True))


def image() -> tuple[str, str]:
    k = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())
    (entry,) = [i for i in k["images"] if i["name"].endswith("/gangslice")]
    return str(entry.get("newName", entry["name"])), str(entry["newTag"])


def render() -> str:
    r = recipe()
    name, version = image()
    labels = {
        "org.opencontainers.image.title": r["IMAGE_TITLE"],
        "org.opencontainers.image.description": r["IMAGE_DESCRIPTION"],
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.source": r["IMAGE_SOURCE"],
        "org.opencontainers.image.licenses": r["IMAGE_LICENSES"],
        "org.opencontainers.image.ref.name": version,
    }
    label_lines = " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in labels.items())
    env = " ".join(r["IMAGE_ENV"].split())
    return f"""\
# Written by hack/image/containerfile.py from hack/image/recipe.env; do not edit.
# The same recipe as `make image` (hack/image/build.sh, no container engine needed), for
# those who build with one:
#   podman build --platform linux/amd64 -f Containerfile -t {name}:{version} .
# The build stage runs hack/image/rootfs.sh: Debian's Python unpacked with mmdebstrap, the
# locked wheels (hack/image/requirements.lock, hashes checked), then gangslice's wheel.
FROM docker.io/library/debian:{r["DEBIAN_SUITE"]} AS build
ARG TARGETARCH=amd64
ENV SOURCE_DATE_EPOCH=0
RUN apt-get update \\
 && apt-get install -y --no-install-recommends mmdebstrap python3-pip python3-venv ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN python3 -m venv /venv \\
 && /venv/bin/pip install --quiet "setuptools>=77" wheel \\
 && /venv/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /dist /src \\
 && export PIP="/venv/bin/python -m pip" \\
 && /src/hack/image/rootfs.sh debian /rootfs "$TARGETARCH" \\
 && /src/hack/image/rootfs.sh deps /deps "$TARGETARCH" \\
 && cp -a /deps/. /rootfs/ \\
 && /src/hack/image/rootfs.sh app /rootfs "$TARGETARCH" /dist/gangslice-*.whl

FROM scratch
COPY --from=build /rootfs/ /
ENV {env}
USER {r["IMAGE_USER"]}:{r["IMAGE_USER"]}
WORKDIR /
ENTRYPOINT {r["IMAGE_ENTRYPOINT"]}
CMD {r["IMAGE_CMD"]}
LABEL {label_lines}
"""


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not CONTAINERFILE.is_file() or CONTAINERFILE.read_text() != text:
            print("Containerfile is not what hack/image/containerfile.py writes: run it", file=sys.stderr)
            return 1
        return 0
    CONTAINERFILE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
