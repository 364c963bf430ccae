"""manifests/monitoring: the PrometheusRule passes ``promtool check rules``, its alerts fire on
sample series (``promtool test rules``), and every gangslice_* metric the rules and the Grafana
dashboard query is one the code exports.

promtool comes from ``hack/promtool.sh`` (Debian's ``prometheus`` package, cached under
~/.cache/gangslice/promtool/); without it these tests fail saying what to install."""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.agent.metrics import AgentMetrics
from extender.httpapi.metrics import Metrics
from extender.reservations import ClusterCache

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"
RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "gangslice-dashboard.json"
#: Alerts the rules must hold: extender errors and timeouts, certificates, waiting gangs,
#: device mismatches, agents not publishing.
ALERTS = {
    "GangsliceExtenderErrors",
    "GangsliceExtenderSlow",
    "GangsliceCertificateExpiresSoon",
    "GangsliceGangsWaitingLong",
    "GangsliceDeviceMismatch",
    "GangsliceAgentNotPublishing",
    "GangsliceGpuLinkErrors",
    "GangsliceGpuPcieReplays",
    "GangsliceGpuLost",
}


@cache
def promtool() -> str:
    proc = subprocess.run(
        [str(REPO / "hack" / "promtool.sh")], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"hack/promtool.sh failed:\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


def rule_spec() -> dict[str, Any]:
    obj = yaml.safe_load(RULE.read_text())
    assert obj["kind"] == "PrometheusRule" and obj["apiVersion"] == "monitoring.coreos.com/v1"
    spec: dict[str, Any] = obj["spec"]
    return spec


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "gangslice.rules.yaml"
    path.write_text(yaml.safe_dump(rule_spec()))
    return path


def test_promtool_accepts_the_rules(rules_file: Path) -> None:
    proc = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout


def test_the_alerts_the_issue_names_are_there() -> None:
    alerts = {r["alert"] for g in rule_spec()["groups"] for r in g["rules"] if "alert" in r}
    assert alerts >= ALERTS, ALERTS - alerts
    for group in rule_spec()["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def _alert(name: str, at: str, labels: dict[str, str]) -> dict[str, Any]:
    """A promtool expectation: ``name`` fires at ``at`` with ``labels`` (and its severity), or
    does not fire when ``labels`` is empty."""
    (severity,) = [
        r["labels"]["severity"] for g in rule_spec()["groups"] for r in g["rules"] if r.get("alert") == name
    ]
    fired = [{"exp_labels": {**labels, "severity": severity}}] if labels else []
    return {"eval_time": at, "alertname": name, "exp_alerts": fired}


def test_the_alerts_fire_on_sample_series(tmp_path: Path) -> None:
    """When each alert fires, on the rules without their annotations (promtool compares those
    too; their templates are checked by ``promtool check rules`` above). promtool's clock
    starts at 0: an expiry timestamp of 10 days is 10 days from then."""
    spec = rule_spec()
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules_file = tmp_path / "conditions.rules.yaml"
    rules_file.write_text(yaml.safe_dump(spec))
    ctl = 'namespace="gangslice-system",pod="ctl-0"'
    agent = 'namespace="gangslice-system",pod="agent-0"'
    series = [
        {"series": f'gangslice_certificate_expiry_timestamp_seconds{{{ctl},certificate="serving"}}',
         "values": f"{10 * 86400}x200"},
        {"series": f'gangslice_certificate_expiry_timestamp_seconds{{{ctl},certificate="ca"}}',
         "values": f"{3650 * 86400}x200"},
        {"series": f"gangslice_gang_longest_wait_seconds{{{ctl}}}", "values": "0+60x200"},
        {"series": f"gangslice_gangs_waiting{{{ctl}}}", "values": "1x200"},
        {"series": f'gangslice_agent_publishes_total{{{agent},result="applied"}}', "values": "5x200"},
        {"series": f'gangslice_extender_requests_total{{{ctl},verb="filter",code="500"}}',
         "values": "0+10x200"},
        {"series": f'gangslice_connections_closed_total{{{ctl},port="verbs",why="refused"}}',
         "values": "0+600x200"},
        {"series": f"gangslice_leader_fence_refusals_total{{{ctl}}}", "values": "0 0 0 3 3 3 3 3 3 3"},
        {"series": 'kube_pod_init_container_status_restarts_total{namespace="inference",pod="vllm-0",'
         'container="gangslice-preflight"}', "values": "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"},
        {"series": f'gangslice_agent_gpu_nvlink_errors_per_second{{{agent},gpu="5",UUID="GPU-5"}}',
         "values": "0 0 10x20"},
        {"series": f'gangslice_agent_gpu_nvlink_errors_per_second{{{agent},gpu="4",UUID="GPU-4"}}',
         "values": "0.5x22"},
        {"series": f'gangslice_agent_gpu_pcie_replays_per_second{{{agent},gpu="5",UUID="GPU-5"}}',
         "values": "0 0 20x20"},
        {"series": f'gangslice_agent_gpu_lost{{{agent},gpu="2",UUID="GPU-2"}}', "values": "0 0 1x20"},
    ]  # fmt: skip
    gpu = {"namespace": "gangslice-system", "pod": "agent-0"}
    tests = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    _alert("GangsliceCertificateExpiresSoon", "2h", {"namespace": "gangslice-system",
                           "pod": "ctl-0", "certificate": "serving"}),
                    _alert("GangsliceCertificateExpired", "2h", {}),
                    _alert("GangsliceGangsWaitingLong", "20m", {}),  # 20 min < 30 min
                    _alert("GangsliceGangsWaitingLong", "40m", {"namespace": "gangslice-system"}),
                    _alert("GangsliceAgentNotPublishing", "30m", {"namespace": "gangslice-system",
                           "pod": "agent-0"}),
                    _alert("GangsliceExtenderErrors", "20m", {"namespace": "gangslice-system", "pod": "ctl-0",
                           "verb": "filter"}),
                    _alert("GangsliceConnectionsRefused", "20m", {"namespace": "gangslice-system",
                           "pod": "ctl-0", "port": "verbs"}),
                    _alert("GangsliceLeaderStalled", "5m", {"namespace": "gangslice-system", "pod": "ctl-0"}),
                    _alert("GangsliceDeviceMismatch", "5m", {"namespace": "inference", "pod": "vllm-0",
                           "container": "gangslice-preflight"}),
                    _alert("GangsliceGpuLinkErrors", "5m", {}),  # rising for 3 minutes only
                    _alert("GangsliceGpuLinkErrors", "10m", {**gpu, "gpu": "5", "UUID": "GPU-5"}),
                    _alert("GangsliceGpuPcieReplays", "10m", {**gpu, "gpu": "5", "UUID": "GPU-5"}),
                    _alert("GangsliceGpuLost", "6m", {**gpu, "gpu": "2", "UUID": "GPU-2"}),
                ],
            }
        ],
    }  # fmt: skip
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@cache
def exported() -> set[str]:
    """Every sample name the controller and the agent can expose (counters with _total,
    histograms with _bucket/_sum/_count)."""
    out = set()
    for registry in (Metrics(ClusterCache()).registry, AgentMetrics().registry):
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
            }.get(family.type, ("",))
            out |= {family.name + s for s in suffixes}
    return out


def queried(expr: str) -> set[str]:
    return set(re.findall(r"\bgangslice_[a-z_]+", expr))


def test_rules_and_dashboard_query_only_metrics_the_code_exports() -> None:
    exprs = [r["expr"] for g in rule_spec()["groups"] for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = set().union(*(queried(e) for e in exprs))
    assert names - exported() == set(), f"not exported: {sorted(names - exported())}"
    assert {"gangslice_gpus", "gangslice_free_coherent_gpus", "gangslice_gangs_waiting"} <= names


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "gangslice"
    shown = set().union(*(queried(t["expr"]) for p in dashboard["panels"] for t in p["targets"]))
    assert {
        "gangslice_agent_gpu_nvlink_errors_per_second",
        "gangslice_agent_gpu_pcie_replays_per_second",
        "gangslice_agent_gpu_healthy",
    } <= shown
    assert {
        "gangslice_decisions_total",
        "gangslice_extender_request_duration_seconds_bucket",
        "gangslice_decision_duration_seconds_bucket",
        "gangslice_gpus",
        "gangslice_free_coherent_gpus",
        "gangslice_gangs_waiting",
    } <= shown
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
