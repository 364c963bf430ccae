"""charts/gangslice with the helm built from helm.sh/helm/v3 (hack/e2e/build.sh):

- the committed chart is what ``hack/gen-chart.py`` writes from the kustomize manifests (one source);
- ``helm lint`` passes with the default values and with every part switched on;
- ``helm template`` with the default values gives exactly the objects of ``kubectl kustomize manifests/``,
  and each switch adds exactly its kustomization's objects;
- ``helm install`` into a fresh real API server (with Kueue's CRDs) creates every object it renders, and
  ``helm uninstall`` removes them again but for the CRDs (Helm never deletes those).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import MANIFESTS, REPO, kubectl

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "gangslice"
#: value -> the kustomization it adds.
SWITCHES = {
    "scheduler.enabled=true": "scheduler",
    "kueue.enabled=true": "kueue",
    "volcano.enabled=true": "volcano",
    "monitoring.enabled=true": "monitoring",
    "tls.certManager.enabled=true": "components/cert-manager",
    "dra.enabled=true": "dra",
}
EVERYTHING = tuple(SWITCHES)
Key = tuple[str, str, str | None, str]


def helm(bin_dir: Path, *args: str, kubeconfig: Path | None = None, home: Path | None = None) -> str:
    env = {**os.environ}
    if home is not None:  # helm's cache, config and data folders
        env |= {f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    proc = subprocess.run(
        [str(bin_dir / "helm"), *args], capture_output=True, text=True, env=env, timeout=180
    )
    assert proc.returncode == 0, (
        f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}\n{proc.stdout}"
    )
    return proc.stdout


def by_key(text: str) -> dict[Key, dict[str, Any]]:
    out = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            meta = doc["metadata"]
            out[(doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"])] = doc
    return out


def template(bin_dir: Path, *values: str, tmp: Path) -> dict[Key, dict[str, Any]]:
    sets = [a for v in values for a in ("--set", v)]
    return by_key(helm(bin_dir, "template", "gangslice", str(CHART), "--include-crds", *sets, home=tmp))


def test_the_chart_is_written_from_the_manifests(e2e_bin_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "hack" / "gen-chart.py"), "--check", f"--kubectl={e2e_bin_dir}/kubectl"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("values", [(), EVERYTHING, ("openshift.enabled=true", "scheduler.enabled=true")])
def test_helm_lint(e2e_bin_dir: Path, tmp_path: Path, values: tuple[str, ...]) -> None:
    sets = [a for v in values for a in ("--set", v)]
    out = helm(e2e_bin_dir, "lint", "--strict", str(CHART), *sets, home=tmp_path)
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


def _kustomize(cp_bin: Path, relative: str) -> dict[Key, dict[str, Any]]:
    proc = subprocess.run(
        [str(cp_bin / "kubectl"), "kustomize", str(MANIFESTS / relative)],
        capture_output=True,
        text=True,
        check=True,
    )
    return by_key(proc.stdout)


def test_the_default_values_render_exactly_the_base(e2e_bin_dir: Path, tmp_path: Path) -> None:
    rendered, base = template(e2e_bin_dir, tmp=tmp_path), _kustomize(e2e_bin_dir, "")
    assert rendered.keys() == base.keys(), sorted(set(rendered) ^ set(base))
    for key, obj in base.items():
        assert rendered[key] == obj, (
            f"{key} differs:\n{json.dumps(obj)[:800]}\n{json.dumps(rendered[key])[:800]}"
        )


@pytest.mark.parametrize(("value", "relative"), SWITCHES.items())
def test_each_switch_adds_its_kustomization(
    e2e_bin_dir: Path, tmp_path: Path, value: str, relative: str
) -> None:
    rendered, base = template(e2e_bin_dir, value, tmp=tmp_path), _kustomize(e2e_bin_dir, "")
    part = _kustomize(e2e_bin_dir, relative)
    assert rendered.keys() == base.keys() | part.keys()
    for key, obj in part.items():
        assert rendered[key] == obj, key


def test_values_reach_the_objects(e2e_bin_dir: Path, tmp_path: Path) -> None:
    sets = ("image.repository=registry.example/gs", "image.tag=9.9.9", "controller.replicas=3",
            "tls.secretName=my-tls", "namespace.create=false", "controller.keepCliques=always",
            "controller.imexDaemonRequests=cpu=100m\\,memory=64Mi")  # fmt: skip
    rendered = template(e2e_bin_dir, *sets, tmp=tmp_path)
    deploy = rendered[("apps/v1", "Deployment", "gangslice-system", "gangslice-controller")]
    assert deploy["spec"]["replicas"] == 3
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/gs:9.9.9"
    assert {"--keep-cliques=always", "--imex-daemon-requests=cpu=100m,memory=64Mi"} <= set(container["args"])
    assert {"my-tls"} == {v["secret"]["secretName"] for v in deploy["spec"]["template"]["spec"]["volumes"]
                          if "secret" in v}  # fmt: skip
    assert ("v1", "Namespace", None, "gangslice-system") not in rendered


def test_a_digest_pins_the_image(e2e_bin_dir: Path, tmp_path: Path) -> None:
    """The released chart sets image.digest (make release): every gangslice container then
    pulls <repository>@<digest>, whatever the tag says."""
    digest = "sha256:" + "0123456789abcdef" * 4
    rendered = template(e2e_bin_dir, f"image.digest={digest}", tmp=tmp_path)
    images = {
        c["image"]
        for obj in rendered.values()
        for c in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    }
    assert images == {f"ghcr.io/gangslice/gangslice@{digest}"}


@pytest.fixture(scope="module")
def fresh_cluster(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    """A control plane of its own: the chart's objects must not meet those the other modules apply."""
    cp = ControlPlane(e2e_bin_dir, scheduler=False)
    cp.start()
    try:
        cp.install_crds(cp.crd_dir / "kueue")
        yield cp
    finally:
        cp.stop()


def test_helm_installs_the_chart_into_the_api_server(fresh_cluster: ControlPlane, tmp_path: Path) -> None:
    cp = fresh_cluster
    assert cp.kubeconfig is not None
    args = ("--namespace", "default", "--set", "scheduler.enabled=true", "--set", "kueue.enabled=true")
    helm(cp.bin_dir, "install", "gangslice", str(CHART), *args, kubeconfig=cp.kubeconfig, home=tmp_path)
    status = json.loads(helm(cp.bin_dir, "status", "gangslice", "-n", "default", "-o", "json",
                             kubeconfig=cp.kubeconfig, home=tmp_path))  # fmt: skip
    assert status["info"]["status"] == "deployed", status["info"]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(helm(cp.bin_dir, "get", "manifest", "gangslice", "-n", "default",
                             kubeconfig=cp.kubeconfig, home=tmp_path))  # fmt: skip
    expected = by_key(manifest.read_text())
    assert len(expected) > 20 and any(k[1] == "AdmissionCheck" for k in expected)
    found = kubectl(cp, "get", "-f", str(manifest), "-o", "name").split()
    assert len(found) == len(expected), found
    crds = kubectl(cp, "get", "crd", "-o", "name")
    assert "nodetopologies.gangslice.io" in crds and "slicereservations.gangslice.io" in crds
    helm(cp.bin_dir, "uninstall", "gangslice", "-n", "default", "--wait=false", kubeconfig=cp.kubeconfig,
         home=tmp_path)  # fmt: skip
    kinds = "deployments,daemonsets,clusterroles"
    left = kubectl(cp, "get", kinds, "-A", "-l", "app.kubernetes.io/part-of=gangslice", "-o", "name")
    assert left.strip() == "", left
    assert "slicereservations.gangslice.io" in kubectl(cp, "get", "crd", "-o", "name")
