"""Trace files: what they say, what they refuse, and the generated default day."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.sim.generate import DAY_S, TraceShape, generate_trace
from extender.sim.inputs import check_levels, default_cluster
from extender.sim.templates import builtin_templates
from extender.sim.trace import TraceError, load_trace, trace_from_data

GANG = {"podSets": [{"name": "server", "count": 1, "gpusPerPod": 2, "comm": "allreduce"}]}


def events(*evs: dict[str, Any]) -> dict[str, Any]:
    return {"events": list(evs)}


def test_yaml_trace_with_templates_inline_gangs_and_scales(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "templates": {"mine": GANG},
                "events": [
                    {"at": 5, "deployment": "x", "template": "mine", "replicas": 2, "lifetime": 100},
                    {"at": 0, "gang": GANG, "lifetime": 50},
                    {"at": 0, "template": "llama-70b-tp8", "lifetime": 10},
                    {"at": 20, "scale": "x", "replicas": 0},
                ],
            }
        )
    )
    t = load_trace(path)
    assert [d.name for d in t.deployments] == ["gang-1", "llama-70b-tp8-2", "x"]  # by time, then order
    x = t.deployments[2]
    assert (x.at, x.end, x.replicas, x.template) == (5, 105, 2, "mine")
    assert x.gang.pod_sets[0].gpus_per_pod == 2
    assert t.deployments[1].gang == builtin_templates()["llama-70b-tp8"]
    assert [(s.at, s.deployment, s.replicas) for s in t.scales] == [(20, "x", 0)]
    assert t.end == 105


def test_jsonl_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [
        {"templates": {"mine": GANG}},
        {"at": 0, "deployment": "a", "template": "mine", "lifetime": 60},
        {"at": 30, "scale": "a", "replicas": 3},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    t = load_trace(path)
    assert [d.name for d in t.deployments] == ["a"]
    assert t.scales[0].replicas == 3


def test_to_data_reads_back_to_the_same_trace() -> None:
    t = generate_trace(5, TraceShape(base_deployments=3, arrivals=10))
    again = trace_from_data(t.to_data(), "again")
    assert again.deployments == t.deployments
    assert again.scales == t.scales
    inline = trace_from_data(events({"at": 0, "deployment": "d", "gang": GANG, "lifetime": 9}))
    assert trace_from_data(inline.to_data()).deployments == inline.deployments


@pytest.mark.parametrize(
    ("data", "where", "words"),
    [
        (events({"at": 0, "template": "llama-70b-tp8"}), "events[0].lifetime", "expected a number > 0"),
        (events({"at": -1, "template": "llama-70b-tp8", "lifetime": 5}), "events[0].at", ">= 0"),
        (events({"at": 0, "template": "nope", "lifetime": 5}), "events[0].template", "unknown template"),
        (events({"at": 0, "lifetime": 5}), "events[0].gang", "exactly one of template"),
        (
            events({"at": 0, "template": "llama-70b-tp8", "lifetime": 5, "replicas": -2}),
            "events[0].replicas",
            "whole number",
        ),
        (
            events({"at": 0, "template": "llama-70b-tp8", "lifetime": 5, "colour": 1}),
            "events[0].colour",
            "unknown field",
        ),
        (
            events(
                {"at": 0, "gang": {"podSets": [{"name": "s", "count": 0, "gpusPerPod": 1}]}, "lifetime": 5}
            ),
            "events[0].gang: field podSets.0.count",
            "greater than or equal to 1",
        ),
        (
            events(
                {"at": 0, "template": "llama-70b-tp8", "lifetime": 5}, {"at": 1, "scale": "x", "replicas": 1}
            ),
            "events[1].scale",
            "no deployment named 'x'",
        ),
        (
            events(
                {"at": 0, "deployment": "x", "template": "llama-70b-tp8", "lifetime": 5},
                {"at": 5, "scale": "x", "replicas": 1},
            ),
            "events[1].at",
            "runs from 0 s to 5 s",
        ),
        (
            events(
                {"at": 0, "deployment": "x", "template": "llama-70b-tp8", "lifetime": 5},
                {"at": 1, "deployment": "x", "template": "llama-70b-tp8", "lifetime": 5},
            ),
            "events[1].deployment",
            "already used by t.yaml: events[0]",
        ),
        ({"events": []}, "events", "no deployments"),
        ({"evnts": []}, "evnts", "unknown top-level field"),
        ("hello", "t.yaml", "expected a mapping"),
    ],
)
def test_bad_trace_names_file_field_and_problem(data: Any, where: str, words: str) -> None:
    with pytest.raises(TraceError) as err:
        trace_from_data(data, "t.yaml")
    message = str(err.value)
    assert message.startswith("t.yaml")
    assert where in message and words in message
    assert "\n" not in message


def test_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"at": 0, "template": "llama-70b-tp8", "lifetime": 5}\n{"at": 1,\n')
    with pytest.raises(TraceError, match=r"t\.jsonl: line 2: not valid JSON"):
        load_trace(path)
    path.write_text('{"at": 0, "template": "llama-70b-tp8"}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl: line 1: lifetime: expected a number"):
        load_trace(path)


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("events: [\n")
    with pytest.raises(TraceError, match="not valid YAML"):
        load_trace(path)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.yaml")


def test_unknown_level_against_the_cluster_is_named() -> None:
    gang = {"podSets": [{"name": "s", "count": 2, "gpusPerPod": 8, "requiredLevel": "rack"}]}
    t = trace_from_data(events({"at": 0, "gang": gang, "lifetime": 5}), "t.yaml")
    with pytest.raises(
        TraceError, match=r"t\.yaml: events\[0\]\.gang\.podSets: pod set s: unknown level 'rack'"
    ):
        check_levels(t, default_cluster())


def test_generated_day_is_deterministic_and_valid() -> None:
    a, b, c = generate_trace(1), generate_trace(1), generate_trace(2)
    assert a == b
    assert a.deployments != c.deployments
    assert len(a.deployments) > 100 and len(a.scales) > 100
    names = {d.template for d in a.deployments}
    assert names == set(builtin_templates())  # every template of the mix shows up in a day
    for d in a.deployments:
        assert 0 <= d.at < d.end <= DAY_S
    for s in a.scales:
        d = next(x for x in a.deployments if x.name == s.deployment)
        assert d.at <= s.at < d.end
    check_levels(a, default_cluster())


def test_default_cluster_is_the_mixed_fleet() -> None:
    snap = default_cluster()
    models: dict[str, int] = {}
    for n in snap.nodes:
        models[n.graph.model or ""] = models.get(n.graph.model or "", 0) + 1
    assert models == {"H100-SXM": 64, "L40S": 32, "GB200": 36}
    cliques = {n.labels.get("nvidia.com/gpu.clique") for n in snap.nodes} - {None}
    assert len(cliques) == 2
    leaves = {n.labels["fabric.topograph.run/tier-0"] for n in snap.nodes}
    assert len(leaves) == 8
    spines_of_h100 = {
        n.labels["fabric.topograph.run/tier-1"] for n in snap.nodes if n.graph.model == "H100-SXM"
    }
    assert len(spines_of_h100) == 2
