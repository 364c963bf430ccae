"""``gangslice bench scheduler``'s machinery on the real control plane, at a small size: every
pod of every case bound, no GPU handed out twice, no gang split across leaves. No timing is
asserted; the figures are the benchmark's to print."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.bench.scheduler import SchedulerBenchOptions, render, run_scheduler_bench

pytestmark = pytest.mark.e2e


def test_bench_scheduler_binds_every_pod_without_double_booking_or_split_gangs(e2e_bin_dir: Path) -> None:
    options = SchedulerBenchOptions(
        nodes=20, pods=40, gpus=2, gang_sizes=(4,), nodes_per_leaf=4, timeout_s=180
    )
    results = run_scheduler_bench(options, e2e_bin_dir)
    table = render(options, results)
    assert [r.case for r in results] == ["default scheduler", "extender, pods", "extender, gangs of 4"], table
    for r in results:
        assert r.pods == 40 and r.bound == 40, table
        assert r.double_booked_gpus == 0, table
        assert r.split_gangs == 0, table
    gangs = results[-1]
    assert gangs.gangs == 10, table
    # The extender saw and bound every pod of its cases.
    for r in results[1:]:
        assert r.extender_calls_per_pod.get("bind", 0) >= 1.0, table
