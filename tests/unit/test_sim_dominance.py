"""The dominance check's comparisons, on hand-made results (no simulation)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from extender.cli import main
from extender.sim.dominance import (
    MIN_PLACED,
    TRACES,
    compare,
    context,
    render,
    select,
    shortfalls_line,
    standings,
    tight,
)
from extender.sim.inputs import default_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def policy(placed: int, share: float, p50: float, p99: float, hw99: float, wait99: float) -> dict[str, Any]:
    ratio = {"median": p50, "p99": p99}
    return {
        "gangs": {"placed": placed, "coherentShare": share},
        "ttft": {"vsBest": {"ratio": ratio}, "vsSameHardware": {"ratio": {"median": 1.0, "p99": hw99}}},
        "waitSeconds": {"p99": wait99},
        "byTemplate": {
            "big": {"placed": MIN_PLACED, "coherentShare": share, "ttftRatioMedian": p50},
            "rare": {"placed": MIN_PLACED - 1, "coherentShare": 0.0, "ttftRatioMedian": 99.0},
        },
    }


def results(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    return {"policies": {"gangslice": ours, "volcano": theirs}}


def test_equal_results_clear_every_comparison() -> None:
    p = policy(100, 0.9, 1.0, 2.0, 1.5, 1000)
    cells = compare("t", results(p, copy.deepcopy(p)))
    assert cells and all(c.ok for c in cells)
    assert not any(c.scope == "rare" for c in cells)  # too few placed gangs to judge


def test_each_shortfall_fails_its_own_cell() -> None:
    ours = policy(99, 0.9, 1.0, 2.0, 1.5, 1051)
    cells = {
        (c.scope, c.metric): c for c in compare("t", results(ours, policy(100, 0.9, 1.0, 2.0, 1.5, 1000)))
    }
    assert not cells[("all gangs", "gangs placed")].ok
    assert not cells[("all gangs", "wait p99 (<= 1.05x)")].ok  # 1051 > 1.05 x 1000
    assert cells[("all gangs", "TTFT vs best p99")].ok
    slack = compare(
        "t", results(policy(100, 0.9, 1.0, 2.0, 1.5, 1050), policy(100, 0.9, 1.0, 2.0, 1.5, 1000))
    )
    assert all(c.ok for c in slack)  # 1.05x is within the bar


def test_per_template_slack_is_one_point_and_five_percent() -> None:
    theirs = policy(100, 0.90, 1.00, 2.0, 1.5, 1000)
    ours = copy.deepcopy(theirs)
    ours["byTemplate"]["big"].update(coherentShare=0.891, ttftRatioMedian=1.05)
    assert all(c.ok for c in compare("t", results(ours, theirs)))
    ours["byTemplate"]["big"].update(coherentShare=0.88, ttftRatioMedian=1.06)
    failing = {c.metric for c in compare("t", results(ours, theirs)) if not c.ok}
    assert failing == {"coherent share (-1 pt)", "TTFT vs best p50 (<= 1.05x)"}


def test_render_names_every_failure_and_counts() -> None:
    cells = compare(
        "seed 1", results(policy(99, 0.9, 1.0, 2.0, 1.5, 1000), policy(100, 0.9, 1.0, 2.0, 1.5, 1000))
    )
    text = render("seed 1", cells)
    assert text.startswith(
        f"seed 1: gangslice vs each peer ({len(cells) - 1} of {len(cells)} comparisons cleared)"
    )
    assert "99 vs 100 FAIL" in text


def test_context_gives_the_gpu_hours_each_policy_served() -> None:
    ours, theirs = policy(99, 0.9, 1.0, 2.0, 1.5, 1000), policy(100, 0.9, 1.0, 2.0, 1.5, 1000)
    ours["allocation"], theirs["allocation"] = {"gpuHours": 20257.4}, {"gpuHours": 18200.0}
    assert context(results(ours, theirs)).splitlines()[0] == (
        "not judged: GPU-hours served: gangslice 20,257, volcano 18,200"
    )


def test_standings_judge_each_policy_by_the_same_bar_against_the_others() -> None:
    # gangslice places fewer than volcano (1 shortfall); volcano waits 1.2x as long as both
    # and is less coherent than gangslice, overall and on its template (4); binpack places
    # fewer and is less coherent than both, overall and per template, and clears wait (6).
    gs = policy(99, 0.9, 1.0, 2.0, 1.5, 1000)
    vc = policy(100, 0.8, 1.0, 2.0, 1.5, 1200)
    bp = policy(98, 0.7, 1.0, 2.0, 1.5, 1000)
    res = {"policies": {"gangslice": gs, "volcano": vc, "binpack": bp}}
    assert standings(res) == {"gangslice": 1, "volcano": 4, "binpack": 6}
    assert [c.peer for c in compare("t", res, "volcano")][:1] == ["gangslice"]
    line = shortfalls_line(standings(res))
    assert line == (
        "not judged: the same bar with each policy in gangslice's place, its shortfalls: "
        "gangslice 1, volcano 4, binpack 6"
    )
    assert shortfalls_line({"a": 5, "b": 2}, " over the traces run").endswith("run: b 2, a 5")


def test_tight_fleet_drops_a_quarter_of_every_leaf() -> None:
    full = default_cluster()
    small = tight(full)
    assert len(small.nodes) == len(full.nodes) - len(full.nodes) // 4
    leaves = {n.labels.get("fabric.topograph.run/tier-0") for n in full.nodes}
    for leaf in leaves:
        before = sum(n.labels.get("fabric.topograph.run/tier-0") == leaf for n in full.nodes)
        after = sum(n.labels.get("fabric.topograph.run/tier-0") == leaf for n in small.nodes)
        assert before // 4 <= before - after <= -(-before // 4)


def test_dominance_traces_select_by_name_in_the_bars_order() -> None:
    assert select(None) == TRACES
    assert [t.name for t in TRACES] == ["seed-1", "seed-2", "seed-3", "tight"]
    got = select(" tight,seed-2 ")
    assert [(t.label(), t.seed, t.tight) for t in got] == [
        ("default fleet, seed 2", 2, False),
        ("tight fleet, seed 1", 1, True),
    ]
    held_out = select("seed-12,tight,seed-4")
    assert [(t.label(), t.seed, t.tight) for t in held_out] == [
        ("tight fleet, seed 1", 1, True),
        ("default fleet, seed 4", 4, False),
        ("default fleet, seed 12", 12, False),
    ]
    known = "known: seed-1, seed-2, seed-3, tight, or seed-N"
    with pytest.raises(ValueError, match=f"unknown trace 'seed-0'; {known}"):
        select("seed-1,seed-0")
    with pytest.raises(ValueError, match="unknown trace 'tight-2'"):
        select("tight-2")
    with pytest.raises(ValueError, match="no trace named"):
        select(" , ")


def test_dominance_traces_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--check-dominance", "--dominance-traces", "seed-x", "--quiet"]) == 2
    assert "--dominance-traces: unknown trace 'seed-x'" in capsys.readouterr().err
    assert main(["simulate", "--dominance-traces", "tight", "--quiet"]) == 2
    assert "--dominance-traces needs --check-dominance" in capsys.readouterr().err


def test_check_dominance_on_a_cluster_file_names_it_and_sums_the_standings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(
        [
            "simulate",
            "--check-dominance",
            "--cluster",
            str(EXAMPLES / "clusters" / "hgx-h100-4leaf.yaml"),
            "--policies",
            "gangslice,spread",
            "--dominance-traces",
            "seed-4,tight",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    tables = [line.split(":")[0] for line in out.splitlines() if ": gangslice vs each peer (" in line]
    assert tables == [
        "hgx-h100-4leaf.yaml less a quarter of its nodes, seed 1",
        "hgx-h100-4leaf.yaml, seed 4",
    ]
    per_trace = re.findall(r"in gangslice's place, its shortfalls: (.*)", out)
    total = re.search(r"its shortfalls over the traces run: (.*)", out)
    assert len(per_trace) == 2 and total is not None
    sums: dict[str, int] = {}
    for line in per_trace:
        for name, n in (part.rsplit(" ", 1) for part in line.split(", ")):
            sums[name] = sums.get(name, 0) + int(n)
    assert total.group(1) == ", ".join(f"{k} {v}" for k, v in sorted(sums.items(), key=lambda kv: kv[1]))
    # spread places far more (small) gangs on this small fleet: gangslice falls short, and the
    # list of shortfalls is gangslice's own standing.
    short = re.search(r"gangslice falls short in (\d+) comparisons", out)
    assert rc == 1 and short is not None and int(short.group(1)) == sums["gangslice"] > 0
