"""The recorded Kueue objects, the variants the tests derive from them, and every status body
the controller applies are valid against Kueue v0.19.2's own CRD schemas (v1beta2)."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from extender.controllers.kueue import contract as kueue
from extender.controllers.openapi import SchemaError, load_crd, validate, version_schema
from extender.testing.fixtures import load_fixture

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kueue"
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "kueue"
PLURALS = {"Workload": "workloads", "AdmissionCheck": "admissionchecks", "ResourceFlavor": "resourceflavors"}


@cache
def upstream_schema(kind: str, version: str = "v1beta2") -> dict[str, Any]:
    return version_schema(load_crd(UPSTREAM / f"kueue.x-k8s.io_{PLURALS[kind]}.yaml"), version)


def kueue_fixtures() -> list[str]:
    return sorted(p.name for p in FIXTURES.glob("*.yaml") if p.name not in ("cluster.yaml", "gang.yaml"))


def test_there_are_fixtures_of_every_kind() -> None:
    kinds = {load_fixture(f"kueue/{n}")["kind"] for n in kueue_fixtures()}
    assert kinds == set(PLURALS)


@pytest.mark.parametrize("name", kueue_fixtures())
def test_fixture_matches_upstream_schema(name: str) -> None:
    obj = load_fixture(f"kueue/{name}")
    assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    validate(upstream_schema(obj["kind"]), obj, name)


def test_schema_check_has_teeth() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["status"]["admissionChecks"][0]["state"] = "Waiting"
    with pytest.raises(SchemaError, match="state"):
        validate(upstream_schema("Workload"), wl)
    wl = load_fixture("kueue/workload-lws.yaml")
    del wl["status"]["admissionChecks"][0]["message"]
    with pytest.raises(SchemaError, match="message"):
        validate(upstream_schema("Workload"), wl)


def _set_condition(wl: dict[str, Any], kind: str, status: str, reason: str) -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    conds = [c for c in wl["status"]["conditions"] if c["type"] != kind]
    conds.append(
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": reason,
            "lastTransitionTime": "2026-08-25T11:00:00Z",
        }
    )
    wl["status"]["conditions"] = conds
    return wl


def variants() -> dict[str, dict[str, Any]]:
    """The Workload states the controller tests use, derived from the recorded objects."""
    lws = load_fixture("kueue/workload-lws.yaml")
    out = {
        "finished": _set_condition(lws, "Finished", "True", "Succeeded"),
        "evicted": _set_condition(lws, "Evicted", "True", "Preempted"),
        "quota-gone": _set_condition(lws, "QuotaReserved", "False", "Pending"),
    }
    deactivated = copy.deepcopy(lws)
    deactivated["spec"]["active"] = False
    out["deactivated"] = deactivated
    requeued = _set_condition(lws, "Evicted", "False", "QuotaReserved")
    requeued["status"]["admissionChecks"][0]["retryCount"] = 1
    out["requeued"] = requeued
    return out


@pytest.mark.parametrize("name", sorted(variants()))
def test_derived_variants_match_upstream_schema(name: str) -> None:
    validate(upstream_schema("Workload"), variants()[name], name)


def test_our_status_bodies_match_upstream_schema() -> None:
    """The SSA bodies: Ready with pod set updates, Pending, Retry with requeueAfterSeconds."""
    wl = load_fixture("kueue/workload-lws.yaml")
    current = wl["status"]["admissionChecks"][0]
    updates = [
        {"name": "leader", "annotations": {"gangslice.io/reservation": "vllm"}},
        {
            "name": "worker",
            "annotations": {"gangslice.io/reservation": "vllm"},
            "nodeSelector": {"fabric.topograph.run/tier-0": "leaf-a"},
        },
    ]
    bodies = [
        kueue.check_entry(current, "Ready", "slice vllm", "2026-08-25T10:00:07Z", updates),
        kueue.check_entry(
            current, "Pending", "waiting for a slice: no leaf has room", "2026-08-25T10:00:07Z"
        ),
        kueue.check_entry(current, "Retry", "no slice", "2026-08-25T10:12:00Z", requeue_after_s=60),
    ]
    for entry in bodies:
        body = kueue.workload_apply_body(wl, [entry])
        validate(upstream_schema("Workload"), body, f"{entry['state']} body")
        assert [e["name"] for e in body["status"]["admissionChecks"]] == ["gangslice"]
    ac = load_fixture("kueue/admissioncheck.yaml")
    ac_body = kueue.admission_check_apply_body(ac, "2026-08-25T10:00:00Z")
    assert ac_body is not None
    validate(upstream_schema("AdmissionCheck"), ac_body, "AdmissionCheck body")
