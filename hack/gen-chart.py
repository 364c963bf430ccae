#!/usr/bin/env python3
"""Write the Helm chart charts/gangslice/ from the kustomize manifests, its one source.

Each install kustomization is rendered with ``kubectl kustomize`` and becomes one template
file, switched on by a value; a few fields become values (the images, the controller's
replicas, the TLS Secret). With the default values the chart renders exactly what
``kubectl kustomize manifests/`` does (tests/e2e/test_chart.py compares them object by object
and checks that the committed chart is what this script writes).

Usage: hack/gen-chart.py [--check] [--kubectl PATH]
  --kubectl   default: $GANGSLICE_E2E_BIN/kubectl, else the one hack/e2e/build.sh builds
  --check     write nothing; exit 1 when charts/gangslice differs from what would be written
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "manifests"
CHART = REPO / "charts" / "gangslice"
GANGSLICE_IMAGE = "ghcr.io/gangslice/gangslice"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"
NAMESPACE = "gangslice-system"

#: The base with the OpenShift component, as a user's overlay holds them (docs/install.md).
OPENSHIFT = "base+components/openshift"

#: template file -> (kustomization, the condition that renders it). The OpenShift overlay holds
#: the base (adapted to restricted-v2) and replaces it; the others add to either.
PARTS: dict[str, tuple[str, str]] = {
    "base.yaml": ("", "not .Values.openshift.enabled"),
    "openshift.yaml": (OPENSHIFT, ".Values.openshift.enabled"),
    "scheduler.yaml": ("scheduler", "and .Values.scheduler.enabled (not .Values.openshift.enabled)"),
    "openshift-scheduler.yaml": (
        "openshift-scheduler",
        "and .Values.scheduler.enabled .Values.openshift.enabled",
    ),
    "kueue.yaml": ("kueue", ".Values.kueue.enabled"),
    "volcano.yaml": ("volcano", ".Values.volcano.enabled"),
    "cert-manager.yaml": ("components/cert-manager", ".Values.tls.certManager.enabled"),
    "monitoring.yaml": ("monitoring", ".Values.monitoring.enabled"),
    "dra.yaml": ("dra", ".Values.dra.enabled"),
}
HEADER = "# Written by hack/gen-chart.py from manifests/{source}; do not edit.\n"


def kustomize(kubectl: str, relative: str) -> list[dict[str, Any]]:
    """``kubectl kustomize manifests/<relative>``; for OPENSHIFT, of an overlay holding the base
    and the OpenShift component."""
    with tempfile.TemporaryDirectory() as tmp:
        target = str(MANIFESTS / relative)
        if relative == OPENSHIFT:
            up = os.path.relpath(MANIFESTS, tmp)
            Path(tmp, "kustomization.yaml").write_text(
                f"resources: [{up}]\ncomponents: [{up}/components/openshift]\n"
            )
            target = tmp
        out = subprocess.run(
            [kubectl, "kustomize", target], capture_output=True, text=True, check=True
        ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def image_of(relative: str = "") -> tuple[str, str]:
    k = yaml.safe_load((MANIFESTS / relative / "kustomization.yaml").read_text())
    (entry,) = [i for i in k["images"] if i["name"] == GANGSLICE_IMAGE]
    return str(entry.get("newName", entry["name"])), str(entry["newTag"])


def _escape(text: str) -> str:
    """Text that Helm's template engine prints as it is (Prometheus and Grafana use {{ }})."""
    return text.replace("{{", "\0").replace("}}", '{{ "}}" }}').replace("\0", '{{ "{{" }}')


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


#: Placeholders set into objects before dumping, replaced by template expressions after.
VALUES = {
    "@@GANGSLICE_IMAGE@@": (
        '"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}'
        '{{ with .Values.image.digest }}@{{ . }}{{ end }}"'
    ),
    "@@SCHEDULER_IMAGE@@": '"{{ .Values.scheduler.image.repository }}:{{ .Values.scheduler.image.tag }}"',
    "@@CONTROLLER_REPLICAS@@": "{{ .Values.controller.replicas }}",
    "@@TLS_SECRET@@": "{{ .Values.tls.secretName }}",
    "@@KEEP_CLIQUES@@": '"--keep-cliques={{ .Values.controller.keepCliques }}"',
    "@@IMEX_DAEMON_REQUESTS@@": '"--imex-daemon-requests={{ .Values.controller.imexDaemonRequests }}"',
}
#: Controller args whose value the chart sets: the argument as the manifests default it ->
#: its placeholder.
ARG_VALUES = {
    "--keep-cliques=while-waiting": "@@KEEP_CLIQUES@@",
    "--imex-daemon-requests=": "@@IMEX_DAEMON_REQUESTS@@",
}


def templated(obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The object with its values as placeholders, and whether it is the Namespace the
    chart may leave to the user (``namespace.create``)."""
    for c in _containers(obj):
        repository = c["image"].rpartition(":")[0]
        if repository == GANGSLICE_IMAGE:
            c["image"] = "@@GANGSLICE_IMAGE@@"
        elif repository == SCHEDULER_IMAGE:
            c["image"] = "@@SCHEDULER_IMAGE@@"
    if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "gangslice-controller":
        obj["spec"]["replicas"] = "@@CONTROLLER_REPLICAS@@"
        for c in _containers(obj):
            c["args"] = [ARG_VALUES.get(a, a) for a in c.get("args", [])]
    for volume in obj.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
        if volume.get("secret", {}).get("secretName") == "gangslice-tls":
            volume["secret"]["secretName"] = "@@TLS_SECRET@@"
    return obj, obj["kind"] == "Namespace" and obj["metadata"]["name"] == NAMESPACE


def render_part(objects: list[dict[str, Any]], condition: str, source: str) -> str:
    where = {"": "(the base)", OPENSHIFT: " with manifests/components/openshift"}.get(source, source)
    lines = [HEADER.format(source=where), f"{{{{- if {condition} }}}}\n"]
    for obj in objects:
        obj, is_namespace = templated(obj)
        text = _escape(yaml.safe_dump(obj, sort_keys=False, width=1000))
        for placeholder, expression in VALUES.items():
            text = text.replace(f"'{placeholder}'", expression).replace(placeholder, expression)
        if is_namespace:
            text = f"{{{{- if .Values.namespace.create }}}}\n---\n{text}{{{{- end }}}}\n"
        else:
            text = f"---\n{text}"
        lines.append(text)
    lines.append("{{- end }}\n")
    return "".join(lines)


def scheduler_image() -> tuple[str, str]:
    k = yaml.safe_load((MANIFESTS / "scheduler" / "kustomization.yaml").read_text())
    (entry,) = [i for i in k["images"] if i["name"] == SCHEDULER_IMAGE]
    return SCHEDULER_IMAGE, str(entry["newTag"])


def render_values() -> str:
    repository, _ = image_of()
    sched_repo, sched_tag = scheduler_image()
    return f"""\
# Written by hack/gen-chart.py; do not edit (the defaults come from manifests/). With these
# defaults the chart installs exactly `kubectl kustomize manifests/`.

# The gangslice image (controller, agent): manifests/kustomization.yaml `images:`; the tag
# defaults to the chart's appVersion, the package version. With a digest (sha256:...) the
# image is pulled by it (<repository>:<tag>@<digest>): the released chart sets the digest of
# the multi-arch image index (make release).
image:
  repository: {repository}
  tag: ""
  digest: ""

controller:
  replicas: 2
  # serve --keep-cliques: keep a whole multi-node NVLink clique (GB200 NVL72 rack; the one
  # with the most free GPUs) for gangs that ask for one while such a gang waits
  # (while-waiting), or every clique always.
  keepCliques: while-waiting
  # serve --imex-daemon-requests: what NVIDIA's IMEX daemon pod requests on each node of a
  # ComputeDomain (the DRA driver's controller.containers.computeDomain.resources), e.g.
  # cpu=100m,memory=64Mi; empty: none.
  imexDaemonRequests: ""

# The chart creates the namespace {NAMESPACE} (with its Pod Security label). Everything
# lives there: the controller's Lease is {NAMESPACE}/gangslice-controller. Set false when the
# namespace exists already (helm install -n {NAMESPACE} --create-namespace would make it
# without the label).
namespace:
  create: true

tls:
  # The Secret with tls.crt, tls.key and ca.crt (hack/gen-certs.sh, cert-manager, or your own).
  secretName: gangslice-tls
  certManager:
    # cert-manager issues and rotates the Secret gangslice-tls from a CA of its own.
    enabled: false

# A second kube-scheduler, profile gangslice-scheduler, with the extender (manifests/scheduler).
scheduler:
  enabled: false
  image:
    repository: {sched_repo}
    tag: {sched_tag}

# Kueue: the AdmissionCheck gangslice and the Topology gangslice-fabric (manifests/kueue).
kueue:
  enabled: false

# Volcano: replaces volcano-system/volcano-scheduler-configmap with the extender plugin
# (manifests/volcano; see docs/install.md for the CA patch of Volcano's scheduler).
volcano:
  enabled: false

# ServiceMonitor, PodMonitor, PrometheusRule, the metrics-reader ClusterRole and the Grafana
# dashboard (manifests/monitoring; needs the Prometheus Operator's CRDs).
monitoring:
  enabled: false

# DRA nodes: the mutating admission webhook that pins each gang pod's GPU claim to its slot
# (manifests/dra; the controller sets its caBundle from the TLS Secret's ca.crt).
dra:
  enabled: false

# OpenShift (manifests/openshift): the controller under restricted-v2, the agent under the
# SecurityContextConstraints gangslice-agent; with scheduler.enabled, OpenShift's Secondary
# Scheduler Operator runs the second scheduler (SecondaryScheduler) instead of a Deployment.
openshift:
  enabled: false
"""


def package_version() -> str:
    """The one version of a release: pyproject.toml's. The chart's version and appVersion are
    it; the image tag in manifests/kustomization.yaml must be it too (tests/unit/test_manifests.py)."""
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def render_chart_yaml() -> str:
    version = package_version()
    return f"""\
# Written by hack/gen-chart.py; do not edit.
apiVersion: v2
name: gangslice
description: Topology-aware gang scheduling for LLM inference on Kubernetes
type: application
version: {version}
appVersion: "{version}"
kubeVersion: ">=1.30.0-0"
home: https://github.com/gangslice/gangslice
sources:
  - https://github.com/gangslice/gangslice
keywords: [gpu, scheduling, gang, nvlink, llm, inference, kueue, volcano]
"""


def chart_files(kubectl: str) -> dict[Path, str]:
    files: dict[Path, str] = {
        CHART / "Chart.yaml": render_chart_yaml(),
        CHART / "values.yaml": render_values(),
    }
    base = kustomize(kubectl, "")
    for crd in [o for o in base if o["kind"] == "CustomResourceDefinition"]:
        name = crd["metadata"]["name"]
        text = HEADER.format(source="crds") + yaml.safe_dump(crd, sort_keys=False, width=1000)
        files[CHART / "crds" / f"{name}.yaml"] = text
    for file, (relative, condition) in PARTS.items():
        objects = [o for o in kustomize(kubectl, relative) if o["kind"] != "CustomResourceDefinition"]
        files[CHART / "templates" / file] = render_part(objects, condition, relative)
    return files


def default_kubectl() -> str:
    if os.environ.get("GANGSLICE_E2E_BIN"):
        return str(Path(os.environ["GANGSLICE_E2E_BIN"]) / "kubectl")
    out = subprocess.run(
        [str(REPO / "hack" / "e2e" / "build.sh"), "kubectl"], capture_output=True, text=True, check=True
    ).stdout
    return out.strip().splitlines()[-1].removeprefix("GANGSLICE_E2E_BIN=") + "/kubectl"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--kubectl")
    args = parser.parse_args()
    files = chart_files(args.kubectl or default_kubectl())
    generated = {p for p in files}
    present = {p for p in CHART.rglob("*.yaml") if p.parent.name in ("templates", "crds")}
    if args.check:
        stale = sorted(
            str(p.relative_to(REPO)) for p in generated if not p.is_file() or p.read_text() != files[p]
        )
        stale += sorted(str(p.relative_to(REPO)) for p in present - generated)
        if stale:
            print(
                f"charts/gangslice is not what hack/gen-chart.py writes: {', '.join(stale)}", file=sys.stderr
            )
            return 1
        return 0
    for path in present - generated:
        path.unlink()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(files)} files under {CHART.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
