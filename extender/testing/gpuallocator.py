"""NVIDIA's go-gpuallocator as an oracle: its build, its input for a node, its answers.

``hack/gpuallocator-oracle/build.sh`` compiles a small Go program (``main.go`` there) against
``github.com/NVIDIA/go-gpuallocator``; it reads one JSON document on stdin and answers each
request with go-gpuallocator's best-effort policy, the policy NVIDIA's device plugin answers
``GetPreferredAllocation`` with. Two callers: the conformance test, which compares gangslice's
prediction with it, and the e2e tier's fake-GPU device plugin, which answers the kubelet with it.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

from extender.topology.fake_nvml import FakeNvml
from extender.topology.nvml import NvmlInvalidArgument, NvmlNotSupported

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "gpuallocator-oracle" / "build.sh"
PRINTS = "GANGSLICE_GPUALLOCATOR_ORACLE="


class OracleError(RuntimeError):
    """The oracle could not be built or failed to answer (the message carries its output)."""


def build() -> tuple[Path, str]:
    """Build the oracle (idempotent: cached outside the repository) and return its path and the
    build's progress output. Raises :class:`OracleError` naming what to install when it fails."""
    proc = subprocess.run(["bash", str(BUILD)], cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OracleError(
            f"hack/gpuallocator-oracle/build.sh failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PRINTS):
            return Path(line.split("=", 1)[1]), proc.stderr
    raise OracleError(f"build.sh printed no {PRINTS} line:\n{proc.stdout[-2000:]}")


def ask(oracle: Path, document: dict[str, Any]) -> list[dict[str, Any]]:
    """The oracle's output lines for ``document`` (see main.go for both shapes)."""
    proc = subprocess.run(
        [str(oracle)], input=json.dumps(document), capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        raise OracleError(f"the oracle failed (exit {proc.returncode}): {proc.stderr[-4000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines()]


def nvml_facts(fake: FakeNvml) -> dict[str, Any]:
    """What ``fake`` answers to the NVML calls go-gpuallocator's ``NewDevices`` makes (device
    count, UUID, PCI bus id, NVLink state and remote bus id per link, common ancestors): the
    oracle's ``nvml`` entry, from which go-gpuallocator finds the links itself."""
    gpus = []
    for i in range(fake.device_count()):
        links = []
        for link in itertools.count():
            try:
                enabled = fake.nvlink_state(i, link)
            except (NvmlInvalidArgument, NvmlNotSupported):
                break
            links.append({"enabled": enabled, "remoteBusId": fake.nvlink_remote_pci_bus_id(i, link)})
        gpus.append({"uuid": fake.uuid(i), "busId": fake.pci_bus_id(i), "nvlinks": links})
    ancestors = [
        {"a": a, "b": b, "level": fake.topology_common_ancestor(a, b)}
        for a, b in itertools.combinations(range(len(gpus)), 2)
    ]
    return {"gpus": gpus, "ancestors": ancestors}
