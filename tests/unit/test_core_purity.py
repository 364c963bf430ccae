"""The core (topology, cost, placement, the peers' baselines) imports nothing from Kubernetes,
kopf or HTTP."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import extender.peers
import extender.placement
import extender.topology

FORBIDDEN = ("kubernetes", "kopf", "aiohttp")


def core_modules() -> list[str]:
    names = ["extender.cost"]
    for package in (extender.topology, extender.placement, extender.peers):
        names.append(package.__name__)
        names.extend(m.name for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}."))
    return sorted(names)


def test_core_modules_are_found() -> None:
    names = core_modules()
    for expected in (
        "extender.cost",
        "extender.placement.solver",
        "extender.placement.ledger",
        "extender.topology.model",
    ):
        assert expected in names


def forbidden_after_importing(names: list[str]) -> list[str]:
    """Import ``names`` in a fresh interpreter; the forbidden packages that got loaded."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_core_imports_no_adapter_dependency() -> None:
    assert forbidden_after_importing(core_modules()) == []


def test_the_check_sees_an_adapter_dependency() -> None:
    assert "aiohttp" in forbidden_after_importing(["extender.cost", "aiohttp"])
