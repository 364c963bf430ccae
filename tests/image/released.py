"""What tests/image's session build (conftest.py ``release``) hands the tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from extender import __version__


@dataclass(frozen=True)
class Release:
    """out/release/ (hack/release/build.sh) and the digest of its multi-arch image index."""

    dir: Path
    digest: str

    def file(self, suffix: str) -> Path:
        """``gangslice-<version><suffix>`` in the release, e.g. ``-amd64.oci.tar``."""
        return self.dir / f"gangslice-{__version__}{suffix}"
