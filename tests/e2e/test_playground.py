"""``gangslice playground`` as a user runs it: one command brings the control plane, the chart, the
fake GPU nodes, gangslice and the example gang up; the commands it prints work while it is up; Ctrl-C
stops every process it started.

The test runs the foreground mode, not ``--once``: the printed commands need the playground up, and
Ctrl-C is the way out that a user takes. ``--once`` differs only in stopping right after printing
(tests/unit/test_playground_setup.py).
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import REPO

pytestmark = pytest.mark.e2e

UP = "Up. Ctrl-C stops every process it started."
GANG = "inference/llama-70b-pd"


class Transcript:
    """The playground's stdout and stderr, line by line, read in a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the playground's output:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if line == text:
                return

    def rest(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (line := self._queue.get(timeout=max(0.1, deadline - time.monotonic()))) is not None:
            self.lines.append(line)

    def commands(self, first_word: str) -> list[list[str]]:
        return [shlex.split(line) for line in self.lines if line.startswith(f"  {first_word} ")]


@pytest.fixture
def playground(e2e_bin_dir: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Transcript, Path]]:
    folder = tmp_path / "playground"
    argv = [sys.executable, "-m", "extender.cli", "playground", f"--dir={folder}", f"--bin-dir={e2e_bin_dir}"]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        yield proc, Transcript(proc), folder
    finally:
        if proc.poll() is None:  # the test failed before its Ctrl-C
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr}\n{done.stdout}"
    return done.stdout


def processes_under(folder: Path) -> list[str]:
    """Command lines of the processes that name the folder (every one the playground starts does)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(a.decode(errors="replace") for a in argv)
        if str(folder) in line and "extender.cli playground" not in line:
            found.append(f"{proc.name}: {line[:200]}")
    return found


def test_the_playground_binds_the_gang_prints_working_commands_and_stops_on_ctrl_c(
    e2e_bin_dir: Path, playground: tuple[subprocess.Popen[str], Transcript, Path]
) -> None:
    proc, out, folder = playground
    began = time.monotonic()
    out.until(UP, timeout=300)
    up_s = time.monotonic() - began
    assert processes_under(folder), "the playground runs nothing under its folder"

    # The printed kubectl lines, run as printed (with the kubectl built here when none is on PATH).
    kubectl = [cmd[1:] for cmd in out.commands("kubectl")]
    assert kubectl, "\n".join(out.lines)
    reservations = next(a for a in kubectl if "slicereservations" in a)
    said = run([str(e2e_bin_dir / "kubectl"), *reservations])
    assert "llama-70b-pd" in said and "Bound" in said, said

    # Every pod of the gang is bound, to the nodes of its SliceReservation, with its GPUs written.
    kubeconfig = reservations[reservations.index("--kubeconfig") + 1]
    get = [str(e2e_bin_dir / "kubectl"), "--kubeconfig", kubeconfig, "get", "-n", "inference", "-o", "json"]
    pods = json.loads(run([*get, "pods"]))["items"]
    (reservation,) = json.loads(run([*get, "slicereservations"]))["items"]
    assert reservation["spec"]["gang"] == GANG and reservation["status"]["phase"] == "Bound"
    slots = {s["pod"]: s["node"] for s in reservation["status"]["slots"]}
    assert len(pods) == 2 and {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods} == slots
    assert all(p["metadata"]["annotations"].get("gangslice.io/gpus") for p in pods)

    # The printed explain line, and the metrics endpoint.
    (explain,) = out.commands("gangslice")
    assert explain[1:3] == ["explain", f"gang/{GANG}"], explain
    said = run([sys.executable, "-m", "extender.cli", *explain[1:]])
    assert GANG in said, said
    (curl,) = (line for line in out.lines if line.startswith("  curl "))
    words = shlex.split(curl)
    url, ca = next(w for w in words if w.startswith("https://")), words[words.index("--cacert") + 1]
    context = ssl.create_default_context(cafile=ca)
    with urllib.request.urlopen(url, timeout=10, context=context) as resp:
        assert b"gangslice_" in resp.read()

    began = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(90) == 0, "\n".join(out.lines)
    down_s = time.monotonic() - began
    out.rest(10)
    assert out.lines[-1].startswith("Stopped every process it started"), out.lines[-5:]
    assert not processes_under(folder)
    print(f"\nplayground up in {up_s:.1f} s, down in {down_s:.1f} s")
