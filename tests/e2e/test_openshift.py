"""The OpenShift install against the real API server serving OpenShift's CRDs
(``tests/fixtures/openshift``: SecurityContextConstraints from openshift/api, SecondaryScheduler from
the Secondary Scheduler Operator; see SOURCE there): every object of the base with
``manifests/components/openshift``, of ``manifests/openshift-scheduler`` and of the chart in OpenShift mode
passes ``kubectl apply --server-side --dry-run=server`` (schema validation and admission), and the
rendered pods carry what restricted-v2 and the agent's SCC expect."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import MANIFESTS, REPO, create, install_gangslice, kubectl
from test_chart import CHART, helm

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

OPENSHIFT_CRDS = REPO / "tests" / "fixtures" / "openshift"
OPERATOR_NS = "openshift-secondary-scheduler-operator"


@pytest.fixture(scope="module")
def openshift_api(control_plane: ControlPlane) -> ControlPlane:
    cp = control_plane
    install_gangslice(cp)  # the namespace gangslice-system for the dry runs
    names = cp.install_crds(OPENSHIFT_CRDS)
    assert set(names) == {
        "securitycontextconstraints.security.openshift.io",
        "secondaryschedulers.operator.openshift.io",
    }
    create(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}}, exist_ok=True)
    return cp


def overlay(tmp_path: Path) -> Path:
    """A user's overlay: the base with the OpenShift component (docs/install.md)."""
    up = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{up}]\ncomponents: [{up}/components/openshift]\n"
    )
    return tmp_path


def dry_run(cp: ControlPlane, flag: str, source: str) -> list[str]:
    out = kubectl(cp, "apply", "--server-side", "--force-conflicts", "--dry-run=server", flag, source)
    return [line for line in out.splitlines() if line.endswith("(server dry run)")]


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_every_object_of_the_openshift_overlay_is_accepted(
    openshift_api: ControlPlane, tmp_path: Path
) -> None:
    cp = openshift_api
    path = str(overlay(tmp_path))
    objects = documents(kubectl(cp, "kustomize", path))
    assert len(dry_run(cp, "-k", path)) == len(objects)
    kinds = {o["kind"] for o in objects}
    assert {"SecurityContextConstraints", "Deployment", "DaemonSet", "CustomResourceDefinition"} <= kinds
    (controller,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = controller["spec"]["template"]["spec"]["securityContext"]
    assert pod == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # restricted-v2 assigns IDs
    (agent,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (scc,) = [o for o in objects if o["kind"] == "SecurityContextConstraints"]
    assert (
        agent["spec"]["template"]["spec"]["securityContext"]["seLinuxOptions"]
        == (scc["seLinuxContext"]["seLinuxOptions"])
    )


def test_the_secondary_scheduler_is_accepted(openshift_api: ControlPlane) -> None:
    cp = openshift_api
    path = str(MANIFESTS / "openshift-scheduler")
    objects = documents(kubectl(cp, "kustomize", path))
    assert {o["kind"] for o in objects} == {"SecondaryScheduler", "ConfigMap"}
    assert len(dry_run(cp, "-k", path)) == len(objects)


def test_the_chart_in_openshift_mode_is_accepted(openshift_api: ControlPlane, tmp_path: Path) -> None:
    cp = openshift_api
    sets = ("--set", "openshift.enabled=true", "--set", "scheduler.enabled=true")
    rendered = helm(cp.bin_dir, "template", "gangslice", str(CHART), *sets, home=tmp_path)
    objects = documents(rendered)
    assert "SecondaryScheduler" in {o["kind"] for o in objects}
    assert not [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gangslice-scheduler"
    ]
    file = tmp_path / "rendered.yaml"
    file.write_text(rendered)
    assert len(dry_run(cp, "-f", str(file))) == len(objects)
