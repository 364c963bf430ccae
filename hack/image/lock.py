#!/usr/bin/env python3
"""Write hack/image/requirements.lock: gangslice's dependencies pinned, with the sha256 of
their wheels for amd64 and arm64 (CPython 3.11, glibc as in Debian 12), for
``pip install --require-hashes`` in hack/image/rootfs.sh. A maintainer tool: run it after a
dependency changes in pyproject.toml (``hack/image/lock.py``), then commit the lock.

Usage: hack/image/lock.py [WHEEL]   (default: builds the wheel from the checkout)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "hack" / "image" / "requirements.lock"
ARCHES = ("x86_64", "aarch64")
GLIBC = ("2_5", "2_12", "2_17", "2_24", "2_26", "2_27", "2_28", "2_31", "2_34", "2_35", "2_36")


def resolve(wheel: Path, arch: str, work: Path) -> dict[tuple[str, str], set[str]]:
    platforms = [f"manylinux_{g}_{arch}" for g in GLIBC] + [f"manylinux2014_{arch}", f"linux_{arch}"]
    report = work / f"report-{arch}.json"
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed"]
    argv += ["--only-binary=:all:", "--python-version=3.11", "--implementation=cp"]
    argv += ["--abi=cp311", "--abi=abi3", "--abi=none", f"--target={work / 't'}", f"--report={report}"]
    argv += [f"--platform={p}" for p in platforms] + [str(wheel)]
    subprocess.run(argv, check=True)
    out: dict[tuple[str, str], set[str]] = {}
    for item in json.loads(report.read_text())["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if name == "gangslice":
            continue
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        out.setdefault((name.lower().replace("_", "-"), version), set()).add(digest)
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if len(sys.argv) > 1:
            wheel = Path(sys.argv[1]).resolve()
        else:
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(REPO)], check=True
            )
            (wheel,) = work.glob("gangslice-*.whl")
        pins: dict[tuple[str, str], set[str]] = {}
        for arch in ARCHES:
            for key, digests in resolve(wheel, arch, work).items():
                pins.setdefault(key, set()).update(digests)
    names = [n for n, _ in pins]
    assert len(names) == len(set(names)), f"the architectures resolve different versions: {sorted(pins)}"
    lines = [
        "# gangslice's runtime dependencies for the image, pinned with the sha256 of each wheel for",
        f"# {' and '.join(ARCHES)} (CPython 3.11). Written by hack/image/lock.py; do not edit.",
    ]
    for (name, version), digests in sorted(pins.items()):
        hashes = " ".join(f"--hash=sha256:{d}" for d in sorted(digests))
        lines.append(f"{name}=={version} {hashes}")
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"{LOCK.relative_to(REPO)}: {len(pins)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
