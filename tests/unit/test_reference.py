"""docs/reference.md is what the code says: regenerated here and compared byte for byte, and
every label/annotation key written as a literal anywhere in the package is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from extender import docs
from extender.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference.md"
#: A ``domain/key`` string literal (label, annotation, resource or API name).
KEY_LITERAL = re.compile(r"[\"']((?:[a-z0-9-]+\.)+[a-z]{2,}/[A-Za-z0-9._-]+)[\"']")
API_VERSION = re.compile(r"/v\d+((alpha|beta)\d+)?$")
#: Fixtures and benchmarks build fake nodes with labels gangslice never reads.
NOT_READ = ("sim/", "bench/extender.py", "testing/", "fake", "docs.py")


@pytest.fixture(scope="module")
def rendered() -> str:
    return docs.render()


def test_the_committed_reference_is_current(rendered: str) -> None:
    current = REFERENCE.read_text() if REFERENCE.exists() else ""
    assert current == rendered, "docs/reference.md is out of date: run `make reference`"


def test_every_key_the_code_spells_out_is_documented(rendered: str) -> None:
    found: dict[str, str] = {}
    for path in sorted((REPO / "extender").rglob("*.py")):
        relative = str(path.relative_to(REPO / "extender"))
        if any(part in relative for part in NOT_READ):
            continue
        for key in KEY_LITERAL.findall(path.read_text()):
            if not key.startswith("example.com/") and not API_VERSION.search(key):
                found.setdefault(key, relative)
    assert "gangslice.io/gang" in found  # the scan sees the package
    missing = {k: where for k, where in found.items() if f"`{k}`" not in rendered}
    assert not missing, f"keys used in the code but not in the reference (extender/docs.py): {missing}"


def test_every_command_and_option_is_documented(rendered: str) -> None:
    commands = list(docs.walk_commands(build_parser()))
    assert {words[0] for words, _, _ in commands} >= {"serve", "agent", "explain", "place", "simulate"}
    for words, _, parser in commands:
        assert f"`gangslice {' '.join(words)}`" in rendered
        for action in docs._options(parser):
            for option in action.option_strings:
                assert f"`{option}" in rendered, f"gangslice {' '.join(words)} {option}"


def test_the_key_table_has_one_row_per_key() -> None:
    keys = docs.keys()
    assert len(keys) == len(set(keys))
    for k in docs.ALL_KEYS:
        assert k.kind and k.on and k.use and k.meaning, k.constant
        if not k.constant.startswith("literal:"):
            assert docs.defined_in(k.key), f"{k.key}: defined in none of {docs.CONSTANT_MODULES}"


def test_check_mode_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "reference.md"
    target.write_text("stale\n")
    assert docs.main(["--output", str(target), "--check"]) == 1
    assert "make reference" in capsys.readouterr().err
    assert docs.main(["--output", str(target)]) == 0
    assert docs.main(["--output", str(target), "--check"]) == 0


def test_troubleshooting_names_every_event_and_condition_reason() -> None:
    """Every Event reason the controller posts and every NodeTopology condition reason the
    agent writes is explained in docs/troubleshooting.md."""
    text = (REPO / "docs" / "troubleshooting.md").read_text()
    patterns = {
        "controllers": re.compile(r"\"(?:Normal|Warning)\",\s*\"([A-Z]\w+)\""),
        "agent": re.compile(
            r"(?:Condition\(\s*\w+,\s*(?:True|False),\s*|PodResourcesUnavailable\(\s*|\"[A-Z_]+\":\s*"
            r"|reasons\.get\(name,\s*)\"([A-Z][a-z]\w+)\""
        ),
    }
    found: set[str] = set()
    for folder, pattern in patterns.items():
        for path in (REPO / "extender" / folder).rglob("*.py"):
            found |= set(pattern.findall(path.read_text()))
    assert {"SliceReserved", "WaitingForSlice", "Nvml", "Listed", "RateLimited", "RpcFailed"} <= found
    missing = sorted(r for r in found if f"`{r}`" not in text)
    assert not missing, f"reasons not explained in docs/troubleshooting.md: {missing}"
