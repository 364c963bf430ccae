"""The dominance check's comparisons, on hand-made results (no simulation)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.cli import main
from extender.sim.dominance import MIN_PLACED, TRACES, compare, context, render, select, tight
from extender.sim.inputs import default_cluster


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
    assert context(results(ours, theirs)) == "not judged: GPU-hours served: gangslice 20,257, volcano 18,200"


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
    assert [(t.label, t.seed, t.tight) for t in got] == [
        ("default fleet, seed 2", 2, False),
        ("tight fleet, seed 1", 1, True),
    ]
    with pytest.raises(ValueError, match="unknown trace 'seed-9'; known: seed-1, seed-2, seed-3, tight"):
        select("seed-1,seed-9")
    with pytest.raises(ValueError, match="no trace named"):
        select(" , ")


def test_dominance_traces_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--check-dominance", "--dominance-traces", "seed-4", "--quiet"]) == 2
    assert "--dominance-traces: unknown trace 'seed-4'" in capsys.readouterr().err
    assert main(["simulate", "--dominance-traces", "tight", "--quiet"]) == 2
    assert "--dominance-traces needs --check-dominance" in capsys.readouterr().err
