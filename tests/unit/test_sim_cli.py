"""``gangslice simulate`` end to end: files in, table, report folder and results.json out."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from extender.cli import main
from extender.sim.generate import TraceShape, generate_trace
from extender.sim.inputs import default_cluster
from extender.sim.policies import available_policies
from extender.sim.report import _hardware
from extender.sim.runner import run_simulation

LEAF = "fabric.topograph.run/tier-0"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
L40S = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.memory": "46068"}


def schema() -> dict[str, Any]:
    text = resources.files("extender.sim").joinpath("results.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def validate(results: Any) -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.Draft202012Validator(schema()).validate(results)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "h", "count": 2, "gpuTopology": "hgx-h100", "labels": {LEAF: "leaf-1", **H100}},
                    {
                        "name": "p",
                        "count": 2,
                        "gpuTopology": "pcie-8gpu-2socket",
                        "labels": {LEAF: "leaf-2", **L40S},
                    },
                ]
            }
        )
    )
    trace = tmp_path / "trace.yaml"
    trace.write_text(
        yaml.safe_dump(
            {
                "events": [
                    {
                        "at": 0,
                        "deployment": "tp8",
                        "template": "llama-70b-tp8",
                        "replicas": 3,
                        "lifetime": 600,
                    },
                    {
                        "at": 10,
                        "deployment": "small",
                        "template": "qwen-14b-tp2",
                        "replicas": 4,
                        "lifetime": 900,
                    },
                    {"at": 20, "deployment": "pp", "template": "llama-405b-tp8-pp2", "lifetime": 300},
                    {"at": 100, "scale": "small", "replicas": 9},
                    {"at": 400, "scale": "tp8", "replicas": 1},
                ]
            }
        )
    )
    return cluster, trace


def test_report_folder(files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, trace = files
    out = tmp_path / "out"
    code = main(["simulate", "--cluster", str(cluster), "--trace", str(trace), "--out", str(out), "--quiet"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # --quiet
    for name in available_policies():
        assert f"\n{name} " in captured.out
    assert "coherent" in captured.out and "report:" in captured.out
    results = json.loads((out / "results.json").read_text())
    validate(results)
    assert list(results["policies"]) == list(available_policies())
    assert results["cluster"] == {
        "source": str(cluster),
        "nodes": 4,
        "gpus": 32,
        "nodeTypes": {"H100-SXM x8": 2, "L40S x8": 2},
        "nodeAllocation": {
            "H100-SXM x8": {"devicePlugin": 2, "dra": 0},
            "L40S x8": {"devicePlugin": 2, "dra": 0},
        },
    }
    assert results["trace"]["gangs"] == 3 + 9 + 1
    for png in ("goodput.png", "served-share.png", "wait-ccdf.png", "step-ratio.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "![Goodput over the day, one panel per policy](goodput.png)" in report
    assert "## Node types" in report and "| L40S x8 | 2 | 2 | 0 |" in report
    assert "claimed only where its choice can be delivered" in report
    assert "## Definitions" in report and "gangslice" in report
    # Where each template ran: the three TP=8 replicas take both H100 nodes and one L40S box
    # under gangslice (cost first), so its row names both models, largest share first.
    hours = results["policies"]["gangslice"]["byTemplate"]["llama-70b-tp8"]["gpuHoursByNodeType"]
    assert set(hours) == {"H100-SXM x8", "L40S x8"} and hours["H100-SXM x8"] > hours["L40S x8"]
    assert "## Where each workload ran" in report
    row = next(line for line in report.splitlines() if line.startswith("| llama-70b-tp8 |"))
    assert row.split("|")[2].strip().startswith("H100-SXM ")
    rows = [json.loads(line) for line in (out / "gangs.jsonl").read_text().splitlines()]
    assert len(rows) == 13 * len(results["policies"])
    replay = main(
        ["simulate", "--cluster", str(cluster), "--trace", str(out / "trace.yaml"), "--json", "--quiet"]
    )
    assert replay == 0
    again = json.loads(capsys.readouterr().out)
    assert strip_timing(again)["policies"] == strip_timing(results)["policies"]


def test_json_and_no_wait(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    cluster, trace = files
    args = ["simulate", "--cluster", str(cluster), "--trace", str(trace), "--json", "--quiet"]
    assert main([*args, "--policies", "gangslice,spread"]) == 0
    waiting = json.loads(capsys.readouterr().out)
    assert main([*args, "--policies", "gangslice,spread", "--no-wait"]) == 0
    rejecting = json.loads(capsys.readouterr().out)
    validate(waiting)
    validate(rejecting)
    assert (rejecting["noWait"], rejecting["queue"]) == (True, "reject")
    for name in ("gangslice", "spread"):
        w, r = waiting["policies"][name]["gangs"], rejecting["policies"][name]["gangs"]
        assert w["rejected"] == 0
        assert r["rejected"] > 0 and r["withdrawn"] == 0
        assert r["placed"] + r["rejected"] == r["arrived"]
        assert rejecting["policies"][name]["waitSeconds"]["max"] == 0


def test_progress_goes_to_stderr(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    cluster, trace = files
    assert main(["simulate", "--cluster", str(cluster), "--trace", str(trace), "--policies", "binpack"]) == 0
    err = capsys.readouterr().err
    assert "simulate binpack" in err and "done in" in err


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("events:\n  - {at: 0, template: llama-70b-tp8}\n", "events[0].lifetime: expected a number > 0"),
        (
            "events:\n  - {at: 0, template: what, lifetime: 5}\n",
            "events[0].template: unknown template 'what'",
        ),
        ("events: [\n", "not valid YAML"),
    ],
)
def test_bad_trace_exits_2_naming_file_and_field(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, words: str
) -> None:
    cluster, _ = files
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    assert main(["simulate", "--cluster", str(cluster), "--trace", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"gangslice simulate: {bad}")
    assert words in err


def test_bad_cluster_and_unknown_policy_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("nodes:\n  - {name: x, gpuTopology: no-such-machine}\n")
    assert main(["simulate", "--cluster", str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "gpuTopology" in err
    assert main(["simulate", "--policies", "gangslice,nope", "--quiet"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    for value in ("-1", "nan", "inf"):
        assert main(["simulate", "--imex-startup-s", value, "--quiet"]) == 2
        assert f"--imex-startup-s {value}: not a number of seconds" in capsys.readouterr().err


def strip_timing(results: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(results)
    out.pop("timing")
    for p in out["policies"].values():
        p.pop("timing")
    return out


def test_same_seed_same_results_except_wall_time() -> None:
    snap = default_cluster()
    shape = TraceShape(base_deployments=6, arrivals=25)
    policies = available_policies()

    def once(seed: int) -> dict[str, Any]:
        return run_simulation(snap, generate_trace(seed, shape), policies, seed=seed).results

    first, second, other = once(3), once(3), once(4)
    validate(first)
    assert strip_timing(first) == strip_timing(second)
    assert strip_timing(first)["policies"] != strip_timing(other)["policies"]
    assert first["policies"]["gangslice"]["gangs"]["placed"] > 0


def test_results_json_keeps_number_rows_on_one_line() -> None:
    from extender.sim.report import dumps

    data = {"points": [[0.0, 1, 2], [1.5e-05, -3, 4]], "names": ["a", "b"], "empty": []}
    text = dumps(data)
    assert json.loads(text) == data
    assert "[1.5e-05, -3, 4]" in text.splitlines()[3]


def test_where_each_workload_ran_sums_node_types_of_one_gpu_model() -> None:
    hours = {"GB200 x4 (NVLink clique)": 1.0, "H100-SXM x8": 2.0, "H100-SXM x4": 1.0, "L40S x8": 0.001}
    results = {"policies": {"gangslice": {"byTemplate": {"t": {"gpuHoursByNodeType": hours}}}}}
    row = next(line for line in _hardware(results) if line.startswith("| t |"))
    # One H100 share for both H100 node types; under 0.5% (L40S) left out.
    assert row == "| t | H100-SXM 75%, GB200 25% |"


def test_a_timeline_with_nothing_serving_has_a_goodput_rate_of_zero() -> None:
    """The goodput rate is a running sum of float speeds; when the last replica stops it
    must be 0, not rounding below it (the schema refuses a negative rate)."""
    trace = generate_trace(3, TraceShape(base_deployments=4, arrivals=12))
    results = run_simulation(default_cluster(), trace, available_policies(), seed=3).results
    validate(results)
    columns = results["policies"]["gangslice"]["timeline"]["columns"]
    serving, goodput = columns.index("servingGpus"), columns.index("goodputGpus")
    idle = [row for p in results["policies"].values() for row in p["timeline"]["points"] if row[serving] == 0]
    assert idle and all(row[goodput] == 0 for row in idle)
