"""``simulate --check``: the standings on hand-made results, and one real run on a small fleet."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from extender.cli import main
from extender.sim.check import (
    GOODPUT_EACH,
    GOODPUT_SUMMED,
    STARVATION_POINTS,
    TRACES,
    select,
    standings,
    summed,
    tight,
)
from extender.sim.inputs import default_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def policy(goodput: float, gap: float | None, wait99: float) -> dict[str, Any]:
    return {
        "goodput": {"gpuHours": goodput},
        "starvation": {"gapPoints": gap, "template": None if gap is None else "big"},
        "waitSeconds": {"p99": wait99},
    }


def results(**policies: dict[str, Any]) -> dict[str, Any]:
    return {"policies": policies}


def by_name(rows: list[Any]) -> dict[str, Any]:
    return {s.policy: s for s in rows}


def test_each_policy_is_judged_against_the_best_other() -> None:
    rows = by_name(
        standings(
            results(
                gangslice=policy(1100.0, 5.0, 100.0),
                kueue=policy(1000.0, 12.0, 90.0),
                volcano=policy(900.0, None, 200.0),
            )
        )
    )
    ours = rows["gangslice"]
    assert ours.vs_best == pytest.approx(1.1)  # against kueue, the best other
    assert ours.wait_vs_best == pytest.approx(100 / 90)  # against kueue's lower p99
    assert ours.shortfalls == ("wait p99 1.11x the best other (target <= 1.05x)",)
    kueue = rows["kueue"]
    assert kueue.vs_best == pytest.approx(1000 / 1100)
    assert [m.split(" ")[0] for m in kueue.shortfalls] == ["goodput", "starvation"]
    assert f"target <= {STARVATION_POINTS:g}" in kueue.shortfalls[1]
    # Volcano's wait is compared with the lowest other p99 (90 s), its goodput with 1,100.
    assert rows["volcano"].wait_vs_best == pytest.approx(200 / 90)
    assert len(rows["volcano"].shortfalls) == 2


def test_goodput_targets_on_a_trace_and_summed() -> None:
    edge = GOODPUT_EACH * 1000.0
    assert not by_name(standings(results(a=policy(edge, 0.0, 1.0), b=policy(1000.0, 0.0, 1.0))))[
        "a"
    ].shortfalls
    short = by_name(standings(results(a=policy(edge - 1, 0.0, 1.0), b=policy(1000.0, 0.0, 1.0))))["a"]
    assert short.shortfalls and short.shortfalls[0].startswith("goodput")
    # Summed over traces: 1.05x on each of two traces clears each, not the summed 1.10x.
    day = standings(results(a=policy(1050.0, 0.0, 1.0), b=policy(1000.0, 0.0, 1.0)))
    total = by_name(summed([day, day]))
    assert total["a"].goodput == 2100.0 and total["a"].vs_best == pytest.approx(1.05)
    assert total["a"].shortfalls == (f"goodput summed 1.050x the best other (target {GOODPUT_SUMMED:.2f}x)",)
    assert total["b"].vs_best == pytest.approx(1000 / 1050)


def test_traces_of_the_bar_and_days_outside_it() -> None:
    assert [t.name for t in select(None)] == ["seed-1", "seed-2", "seed-3", "tight"]
    assert [t.name for t in select("seed-7,tight,seed-4")] == ["tight", "seed-4", "seed-7"]
    assert select("tight")[0].label() == "tight fleet, seed 1"
    assert TRACES[0].label("my.yaml") == "my.yaml, seed 1"
    with pytest.raises(ValueError, match="unknown trace 'seed-0'"):
        select("seed-1,seed-0")
    with pytest.raises(ValueError, match="no trace named"):
        select(" , ")
    fleet = default_cluster()
    assert len(tight(fleet).nodes) == len(fleet.nodes) - len(fleet.nodes) // 4


def test_check_options_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--check", "--check-traces", "seed-x", "--quiet"]) == 2
    assert "--check-traces: unknown trace 'seed-x'" in capsys.readouterr().err
    assert main(["simulate", "--check-traces", "tight", "--quiet"]) == 2
    assert "--check-traces needs --check" in capsys.readouterr().err
    assert main(["simulate", "--check", "--policies", "spread,binpack", "--quiet"]) == 2
    assert "--check needs gangslice and at least one peer" in capsys.readouterr().err


def test_check_on_a_cluster_file_names_it_and_judges_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "simulate",
            "--check",
            "--cluster",
            str(EXAMPLES / "clusters" / "mixed-pcie-h100.yaml"),
            "--policies",
            "gangslice,spread",
            "--check-traces",
            "seed-4,tight",
            "--quiet",
            "--workers",
            "1",
        ]
    )
    out = capsys.readouterr().out
    titles = [line.split(" (")[0] for line in out.splitlines() if line.endswith(" s):")]
    assert titles == [
        "mixed-pcie-h100.yaml less a quarter of its nodes, seed 1",
        "mixed-pcie-h100.yaml, seed 4",
    ]
    assert "summed over the 2 traces run:" in out
    misses = re.search(
        r"misses by policy, each judged against the others: gangslice (\d+), spread (\d+)", out
    )
    assert misses is not None
    falls = re.search(r"gangslice falls short of (\d+) targets", out)
    if rc == 1:
        assert falls is not None and int(falls.group(1)) == int(misses.group(1)) > 0
    else:
        assert rc == 0 and falls is None and int(misses.group(1)) == 0
