"""``gangslice pin -- CMD``: the command runs on the CPUs of its GPUs' NUMA node(s) that the
container may use; where none are, it runs unpinned and says why. The plan is checked on the
fake HGX H100 (GPUs 0-3 on NUMA node 0, CPUs 0-51; GPUs 4-7 on node 1, CPUs 52-103); the command
end to end in a child process, whose own affinity it prints."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from extender.agent.fakes import fake_node
from extender.agent.pin import plan
from extender.agent.preflight import visible_gpus
from extender.topology.model import GpuGraph
from extender.topology.nvml import discover


@pytest.fixture(scope="module")
def hgx() -> GpuGraph:
    with fake_node("hgx-h100") as (fake, sysfs):
        return discover(fake, sysfs_root=sysfs)


def test_the_plan_is_the_gpus_numa_cpus_within_the_containers_cpuset(hgx: GpuGraph) -> None:
    visible = visible_gpus(hgx, {"NVIDIA_VISIBLE_DEVICES": "4,5"})
    got = plan(hgx, visible, range(0, 104))
    assert got.cpus == frozenset(range(52, 104)) and got.numa_nodes == (1,)
    assert got.note == "GPUs GPU4,GPU5 on NUMA node 1: running on CPUs 52-103"
    cpuset = plan(hgx, visible, [0, 1, 60, 61, 62])  # a Guaranteed pod's few CPUs
    assert cpuset.cpus == frozenset({60, 61, 62})


def test_no_cpu_of_the_gpus_node_in_the_cpuset_leaves_the_affinity_and_says_why(hgx: GpuGraph) -> None:
    visible = visible_gpus(hgx, {"NVIDIA_VISIBLE_DEVICES": "4"})
    got = plan(hgx, visible, [0, 1])
    assert got.cpus is None
    assert "none of which the container may use (CPUs 0-1)" in got.note


def test_gpus_on_two_nodes_run_on_both_nodes_cpus(hgx: GpuGraph) -> None:
    visible = visible_gpus(hgx, {"NVIDIA_VISIBLE_DEVICES": "3,4"})
    got = plan(hgx, visible, range(0, 104))
    assert got.cpus == frozenset(range(0, 104)) and got.numa_nodes == (0, 1)


def _pin(visible: str, cpu: int) -> subprocess.CompletedProcess[str]:
    """``gangslice pin`` in a child process allowed CPU ``cpu`` only, printing its command's affinity."""
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": visible}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "extender.cli", "pin", "--nvml-fake", "hgx-h100", "--"]
    return subprocess.run(
        [*argv, sys.executable, "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )


def _gpu_on(cpu: int, same_node: bool) -> str:
    """A GPU of the fake HGX H100 whose NUMA node holds ``cpu`` (or the other node's)."""
    node0 = cpu < 52
    return "0" if node0 == same_node else "4"


def test_the_command_runs_pinned_to_the_gpus_cpus_it_may_use() -> None:
    cpu = min(os.sched_getaffinity(0))
    done = _pin(_gpu_on(cpu, same_node=True), cpu)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([cpu]), (done.stdout, done.stderr)
    assert f"running on CPUs {cpu}" in done.stderr, done.stderr


def test_the_command_runs_unpinned_when_none_of_its_cpus_may_be_used() -> None:
    cpu = min(os.sched_getaffinity(0))
    done = _pin(_gpu_on(cpu, same_node=False), cpu)
    assert done.returncode == 0 and done.stdout.strip() == str([cpu]), (done.stdout, done.stderr)
    assert "none of which the container may use" in done.stderr and "left as it is" in done.stderr


def test_no_command_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "extender.cli", "pin"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "no command given" in done.stderr
