"""The repository stands alone: no code or test reads a file from outside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Ways a path can climb out of the checkout to a sibling folder.
OUTSIDE = re.compile(r"""parents?\[\d\]\s*/\s*["']\.\.["']|\.parent\s*/\s*["']shared["']|["']\.\./shared""")


def test_no_source_reaches_outside_the_checkout() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for root in ("extender", "tests", "hack")
        for path in sorted((REPO / root).rglob("*"))
        if path.suffix in {".py", ".sh"} and path.is_file()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line) and path.name != "test_repository.py"
    ]
    assert offenders == []


def test_every_fixture_folder_names_its_source() -> None:
    folders = [p for p in (REPO / "tests" / "fixtures").rglob("*") if p.is_dir() and any(p.glob("*.yaml"))]
    folders += [REPO / "tests" / "fixtures" / "nvidia-smi-topo"]
    missing = [
        str(f.relative_to(REPO))
        for f in folders
        if not any((f / n).is_file() for n in ("SOURCE.md", "README.md"))
    ]
    assert missing == []
