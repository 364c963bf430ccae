#!/usr/bin/env python3
"""Write the Helm chart charts/gangslice/ from the kustomize manifests, its one source.

Each install kustomization is rendered with ``kubectl kustomize`` and becomes one template
file, switched on by a value; a few fields become values (the images, the controller's
replicas, the TLS Secret), and so do the usual settings of each pod the chart runs (PODS:
resources, scheduling, labels, security contexts, extra arguments and environment), their
defaults read from the manifests. With the default values the chart renders exactly what
``kubectl kustomize manifests/`` does (tests/e2e/test_chart.py compares them object by object
and checks that the committed chart is what this script writes). values.schema.json refuses
values of the wrong type and keys the chart does not know.

Usage: hack/gen-chart.py [--check] [--kubectl PATH]
  --kubectl   default: $GANGSLICE_E2E_BIN/kubectl, else the one hack/e2e/build.sh builds
  --check     write nothing; exit 1 when charts/gangslice differs from what would be written
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
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
        argv = [kubectl, "kustomize", target]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
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


def _image(key: str, tag: str) -> str:
    """The image reference a template writes: ``repository@digest`` when the digest is set (the
    tag is then ignored), else ``repository:tag``."""
    ref = "{{ .Values.%(k)s.repository }}{{ if .Values.%(k)s.digest }}@{{ .Values.%(k)s.digest }}"
    return '"' + ref % {"k": key} + "{{ else }}:" + tag + '{{ end }}"'


#: Placeholders set into objects before dumping, replaced by template expressions after.
VALUES = {
    "@@GANGSLICE_IMAGE@@": _image("image", "{{ .Values.image.tag | default .Chart.AppVersion }}"),
    "@@SCHEDULER_IMAGE@@": _image("scheduler.image", "{{ .Values.scheduler.image.tag }}"),
    "@@CONTROLLER_REPLICAS@@": "{{ .Values.controller.replicas }}",
    "@@TLS_SECRET@@": "{{ .Values.tls.secretName }}",
    "@@KEEP_CLIQUES@@": '"--keep-cliques={{ .Values.controller.keepCliques }}"',
    "@@MIGRATION@@": '"--migration={{ .Values.controller.migration }}"',
    "@@IMEX_DAEMON_REQUESTS@@": '"--imex-daemon-requests={{ .Values.controller.imexDaemonRequests }}"',
}
#: Controller args whose value the chart sets: the argument as the manifests default it ->
#: its placeholder.
ARG_VALUES = {
    "--keep-cliques=while-waiting": "@@KEEP_CLIQUES@@",
    "--migration=report": "@@MIGRATION@@",
    "--imex-daemon-requests=": "@@IMEX_DAEMON_REQUESTS@@",
}

#: The pods the chart runs -> the values key that holds their settings.
PODS = {
    ("Deployment", "gangslice-controller"): "controller",
    ("DaemonSet", "gangslice-agent"): "agent",
    ("Deployment", "gangslice-scheduler"): "scheduler",
}
#: Each pod's settings, in the order values.yaml lists them, with what each does to the pod:
#: ``block`` replaces the field (empty: none), ``string`` the same for a string, ``items`` adds to
#: the manifests' list or map, ``overlay`` sets keys of the manifests' map (null drops one).
POD_SETTINGS = {
    "resources": "block",
    "nodeSelector": "block",
    "tolerations": "block",
    "affinity": "block",
    "topologySpreadConstraints": "block",
    "priorityClassName": "string",
    "runtimeClassName": "string",  # only where the manifests set one (the agent)
    "podAnnotations": "items",
    "podLabels": "items",
    "podSecurityContext": "overlay",
    "securityContext": "overlay",
    "extraArgs": "items",
    "extraEnv": "items",
}
#: A directive left in the dumped text: ``key: '@@<kind> <values path>[ <overlay index>]@@'``, or
#: for ``items`` a list item ``- '@@...@@'`` or map entry ``'@@...@@': ''``.
DIRECTIVE = re.compile(
    r"^(?P<indent> *)(?:(?P<key>\w+): |- )?"
    r"'@@(?P<kind>block|string|items|overlay) (?P<path>[\w.]+)(?: (?P<index>\d+))?@@'(?:: '')?$",
    re.MULTILINE,
)
#: The template that lays a value over the manifests' security context, key by key.
HELPERS = """\
{{/* Written by hack/gen-chart.py; do not edit. */}}
{{/*
gangslice.overlay (list BASE VALUE): BASE, the manifests' map, with each key of VALUE, the
user's, set over it, as YAML; a key whose value is null drops BASE's key. Sprig's merge and
mergeOverwrite cannot set false or 0 over true or 1, hence the loop.
*/}}
{{- define "gangslice.overlay" -}}
{{- $out := index . 0 -}}
{{- range $key, $value := index . 1 -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $out $key -}}
{{- else -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}
"""


def _action(text: str) -> str:
    return "{{" + text + "}}"


@dataclass
class Values:
    """What the templates take from the values beyond VALUES: each pod setting's default (what
    the manifests set; every part that runs the pod must agree, since the chart has one value),
    the labels the manifests give each pod, and the manifests' security contexts a value is
    laid over (a directive names them by index)."""

    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, list[str]] = field(default_factory=dict)
    overlays: list[Any] = field(default_factory=list)

    def directive(self, key: str, name: str, manifest: Any, empty: Any, *, kind: str = "") -> str:
        """The placeholder of setting ``name`` of pod ``key``, whose manifests set ``manifest``;
        ``kind`` "block" where ``items`` have no list or map to go into."""
        default = empty if POD_SETTINGS[name] in ("items", "overlay") or manifest is None else manifest
        kind = kind or POD_SETTINGS[name]
        fields = self.pods.setdefault(key, {})
        if fields.setdefault(name, default) != default:
            raise SystemExit(
                f"the manifests give {key}.{name} two defaults, {fields[name]!r} and {default!r}; "
                "the chart has one value"
            )
        if kind == "overlay":
            if manifest is None:
                kind = "block"  # nothing to lay it over
            else:
                self.overlays.append(manifest)
                return f"@@overlay {key}.{name} {len(self.overlays) - 1}@@"
        return f"@@{kind} {key}.{name}@@"

    def expand(self, match: re.Match[str]) -> str:
        """The template text for one DIRECTIVE: a ``with`` block, so an empty value writes nothing."""
        indent, key, kind, path = match["indent"], match["key"], match["kind"], f".Values.{match['path']}"
        width = len(indent)
        if kind == "overlay":
            base = json.dumps(self.overlays[int(match["index"])], sort_keys=True)
            call = f'- include "gangslice.overlay" (list (fromJson `{base}`) {path}) | nindent {width + 2} '
            return f"{indent}{key}:\n{indent}  {_action(call)}"
        body = {
            "items": [_action(f"- toYaml . | nindent {width} ")],
            "string": [f"{key}: {_action(' . | quote ')}"],
            "block": [f"{key}:", "  " + _action(f"- toYaml . | nindent {width + 2} ")],
        }[kind]
        lines = [_action(f"- with {path} "), *body, _action("- end ")]
        return "\n".join(indent + line for line in lines)


def pod_settings(obj: dict[str, Any], key: str, values: Values) -> None:
    """Turn the pod template's settings into directives (POD_SETTINGS), in place."""
    template = obj["spec"]["template"]
    meta, spec = template["metadata"], template["spec"]
    (container,) = spec["containers"]

    def setting(name: str, manifest: Any, empty: Any, kind: str = "") -> str:
        return values.directive(key, name, manifest, empty, kind=kind)

    values.labels[key] = sorted(meta["labels"])
    meta["labels"][setting("podLabels", None, {})] = ""
    if "annotations" in meta:
        meta["annotations"][setting("podAnnotations", None, {})] = ""
    else:
        meta["annotations"] = setting("podAnnotations", None, {}, "block")
    for name in ("nodeSelector", "affinity"):
        spec[name] = setting(name, spec.get(name), {})
    for name in ("tolerations", "topologySpreadConstraints"):
        spec[name] = setting(name, spec.get(name), [])
    spec["priorityClassName"] = setting("priorityClassName", spec.get("priorityClassName"), "")
    if "runtimeClassName" in spec:
        spec["runtimeClassName"] = setting("runtimeClassName", spec["runtimeClassName"], "")
    spec["securityContext"] = setting("podSecurityContext", spec.get("securityContext"), {})
    if "imagePullSecrets" in spec:
        raise SystemExit(f"{key}: the chart sets imagePullSecrets from a value, not the manifests")
    spec["imagePullSecrets"] = "@@block imagePullSecrets@@"
    container["resources"] = setting("resources", container.get("resources"), {})
    container["securityContext"] = setting("securityContext", container.get("securityContext"), {})
    argv = "args" if "args" in container else "command"
    container[argv] = [*container[argv], setting("extraArgs", None, [])]
    if "env" in container:
        container["env"] = [*container["env"], setting("extraEnv", None, [])]
    else:
        container["env"] = setting("extraEnv", None, [], "block")
    spec["containers"] = [dict(sorted(container.items()))]
    template["spec"] = dict(sorted(spec.items()))


def _image_placeholder(image: str) -> str:
    repository, _, tag = image.rpartition(":")
    if repository == SCHEDULER_IMAGE and tag != scheduler_image()[1]:
        raise SystemExit(f"{image}: the chart has one kube-scheduler tag, {scheduler_image()[1]}")
    placeholders = {GANGSLICE_IMAGE: "@@GANGSLICE_IMAGE@@", SCHEDULER_IMAGE: "@@SCHEDULER_IMAGE@@"}
    return placeholders.get(repository, image)


def templated(obj: dict[str, Any], values: Values) -> tuple[dict[str, Any], bool]:
    """The object with its values as placeholders, and whether it is the Namespace the
    chart may leave to the user (``namespace.create``)."""
    for c in _containers(obj):
        c["image"] = _image_placeholder(c["image"])
    if obj["kind"] == "SecondaryScheduler":  # OpenShift's operator runs this kube-scheduler image
        obj["spec"]["imageSpec"] = _image_placeholder(obj["spec"]["imageSpec"])
    if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "gangslice-controller":
        obj["spec"]["replicas"] = "@@CONTROLLER_REPLICAS@@"
        for c in _containers(obj):
            c["args"] = [ARG_VALUES.get(a, a) for a in c.get("args", [])]
    for volume in obj.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
        if volume.get("secret", {}).get("secretName") == "gangslice-tls":
            volume["secret"]["secretName"] = "@@TLS_SECRET@@"
    if (obj["kind"], obj["metadata"]["name"]) in PODS:
        pod_settings(obj, PODS[obj["kind"], obj["metadata"]["name"]], values)
    return obj, obj["kind"] == "Namespace" and obj["metadata"]["name"] == NAMESPACE


def render_part(objects: list[dict[str, Any]], condition: str, source: str, values: Values) -> str:
    where = {"": "(the base)", OPENSHIFT: " with manifests/components/openshift"}.get(source, source)
    lines = [HEADER.format(source=where), f"{{{{- if {condition} }}}}\n"]
    for obj in objects:
        obj, is_namespace = templated(obj, values)
        text = _escape(yaml.safe_dump(obj, sort_keys=False, width=1000))
        for placeholder, expression in VALUES.items():
            text = text.replace(f"'{placeholder}'", expression).replace(placeholder, expression)
        text = DIRECTIVE.sub(values.expand, text)
        if "@@" in text:
            raise SystemExit(f"a placeholder is left in {obj['kind']} {obj['metadata']['name']}")
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


#: values.yaml's note above a pod setting.
NOTES = {
    ("controller", "resources"): (
        "The cache holds every Node, Pod, NodeTopology and SliceReservation: raise\n"
        "resources.limits.memory with the cluster (about 1 GiB per 20,000 pods)."
    ),
    ("agent", "runtimeClassName"): (
        "The NVIDIA runtime's RuntimeClass; \"\" where that runtime is containerd's default\n"
        "(the GPU Operator's default runtime, CDI)."
    ),
}


def _pod_values(key: str, values: Values) -> str:
    """The settings of pod ``key`` as values.yaml lines under its key."""
    lines = []
    for name, default in sorted(values.pods[key].items(), key=lambda kv: list(POD_SETTINGS).index(kv[0])):
        lines += [f"# {line}" for line in NOTES.get((key, name), "").splitlines()]
        lines += yaml.safe_dump({name: default}, sort_keys=False, width=1000).replace("''", '""').splitlines()
    return "".join(f"  {line}\n" for line in lines)


def render_values(values: Values) -> str:
    repository, _ = image_of()
    sched_repo, sched_tag = scheduler_image()
    return f"""\
# Written by hack/gen-chart.py; do not edit (the defaults come from manifests/). With these
# defaults the chart installs exactly `kubectl kustomize manifests/`; values.schema.json
# refuses a value of the wrong type and a key the chart does not know.
#
# Each pod the chart runs (controller, agent, scheduler) has these settings, their defaults
# what manifests/ sets:
# - resources, nodeSelector, tolerations, affinity, topologySpreadConstraints,
#   priorityClassName: the pod's or its container's field (empty: none). Helm merges a map
#   you set into the default one; set a key to null to drop it.
# - podAnnotations, podLabels: added to the pod template's (not its selector's labels).
# - podSecurityContext, securityContext: keys set over the manifests' securityContext of the
#   pod and of its container (with openshift.enabled, over the OpenShift variant's); null
#   drops a key.
# - extraArgs, extraEnv: appended to the container's arguments (a flag given again wins) and
#   environment variables (name, value or valueFrom).

# The gangslice image (controller, agent): manifests/kustomization.yaml `images:`; the tag
# defaults to the chart's appVersion, the package version. A digest (sha256:...) pins the
# image instead of the tag: repository@digest; the released chart sets the digest of the
# multi-arch image index (make release).
image:
  repository: {repository}
  tag: ""
  digest: ""

# The pull secrets of every pod the chart runs, as in a pod spec: [{{name: my-registry}}].
imagePullSecrets: []

# The controller Deployment gangslice-controller (manifests/controller/deployment.yaml).
controller:
  replicas: 2
  # serve --keep-cliques: keep a whole multi-node NVLink clique (GB200 NVL72 rack; the one
  # with the most free GPUs) for gangs that ask for one while such a gang waits
  # (while-waiting), or every clique always.
  keepCliques: while-waiting
  # serve --migration: for a gang of 8 or more GPUs that waited, find which pods labelled
  # gangslice.io/movable=true to move to drain a domain for it, and report the plan (report),
  # carry it out (on: hold the gang's slice and the new slots, then evict through
  # pods/eviction, PodDisruptionBudgets honoured), or do nothing (off).
  migration: report
  # serve --imex-daemon-requests: what NVIDIA's IMEX daemon pod requests on each node of a
  # ComputeDomain (the DRA driver's controller.containers.computeDomain.resources), e.g.
  # cpu=100m,memory=64Mi; empty: none.
  imexDaemonRequests: ""
{_pod_values("controller", values)}
# The node agent DaemonSet gangslice-agent on GPU nodes (manifests/agent/daemonset.yaml).
agent:
{_pod_values("agent", values)}
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
# With openshift.enabled the Secondary Scheduler Operator makes its pod: of these values only
# the image (without pull secrets) reaches it.
scheduler:
  enabled: false
  image:
    repository: {sched_repo}
    tag: {sched_tag}
    digest: ""
{_pod_values("scheduler", values)}
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


def _object(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A map with these keys and no other."""
    return {"type": "object", "properties": properties, "additionalProperties": False, **more}


STRING = {"type": "string"}
OBJECT = {"type": "object"}
SWITCH = _object({"enabled": {"type": "boolean"}})
QUANTITIES = {"type": "object", "additionalProperties": {"type": ["string", "number"]}}
IMAGE = _object(
    {
        "repository": {"type": "string", "minLength": 1},
        "tag": STRING,
        "digest": {"type": "string", "pattern": "^(sha256:[0-9a-f]{64})?$"},
    }
)
#: Each pod setting's schema. Kubernetes-shaped values check their own keys (ResourceRequirements,
#: Toleration, Affinity, EnvVar) and leave what lies below to the API server.
SETTING_SCHEMAS: dict[str, dict[str, Any]] = {
    "resources": _object({"limits": QUANTITIES, "requests": QUANTITIES, "claims": {"type": "array"}}),
    "nodeSelector": {"type": "object", "additionalProperties": STRING},
    "tolerations": {
        "type": "array",
        "items": _object(
            {
                "key": STRING,
                "operator": {"enum": ["Exists", "Equal"]},
                "value": STRING,
                "effect": {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]},
                "tolerationSeconds": {"type": "integer"},
            }
        ),
    },
    "affinity": _object({name: OBJECT for name in ("nodeAffinity", "podAffinity", "podAntiAffinity")}),
    "topologySpreadConstraints": {
        "type": "array",
        "items": {"type": "object", "required": ["maxSkew", "topologyKey", "whenUnsatisfiable"]},
    },
    "priorityClassName": STRING,
    "runtimeClassName": STRING,
    "podAnnotations": {"type": "object", "additionalProperties": STRING},
    "podLabels": {"type": "object", "additionalProperties": STRING},
    "podSecurityContext": OBJECT,
    "securityContext": OBJECT,
    "extraArgs": {"type": "array", "items": STRING},
    "extraEnv": {
        "type": "array",
        "items": _object({"name": STRING, "value": STRING, "valueFrom": OBJECT}, required=["name"]),
    },
}


def _pod_schema(key: str, values: Values) -> dict[str, Any]:
    """The schemas of pod ``key``'s settings; podLabels may not name a label the manifests give
    the pod (its controller selects it by them): the false schema refuses any value there."""
    out = {name: SETTING_SCHEMAS[name] for name in POD_SETTINGS if name in values.pods[key]}
    out["podLabels"] = {**out["podLabels"], "properties": dict.fromkeys(values.labels[key], False)}
    return out


def render_schema(values: Values) -> str:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$comment": "Written by hack/gen-chart.py; do not edit.",
        "title": "Values of the gangslice chart",
        **_object(
            {
                "image": IMAGE,
                "imagePullSecrets": {"type": "array", "items": _object({"name": STRING}, required=["name"])},
                "controller": _object(
                    {
                        "replicas": {"type": "integer", "minimum": 0},
                        "keepCliques": {"enum": ["while-waiting", "always"]},  # extender KeepCliques
                        "migration": {"enum": ["off", "report", "on"]},  # controllers.migration Migration
                        "imexDaemonRequests": STRING,
                        **_pod_schema("controller", values),
                    }
                ),
                "agent": _object(_pod_schema("agent", values)),
                "namespace": _object({"create": {"type": "boolean"}}),
                "tls": _object({"secretName": {"type": "string", "minLength": 1}, "certManager": SWITCH}),
                "scheduler": _object(
                    {"enabled": {"type": "boolean"}, "image": IMAGE, **_pod_schema("scheduler", values)}
                ),
                **{name: SWITCH for name in ("kueue", "volcano", "monitoring", "dra", "openshift")},
            }
        ),
    }
    return json.dumps(schema, indent=2) + "\n"


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
    files: dict[Path, str] = {CHART / "Chart.yaml": render_chart_yaml()}
    base = kustomize(kubectl, "")
    for crd in [o for o in base if o["kind"] == "CustomResourceDefinition"]:
        name = crd["metadata"]["name"]
        text = HEADER.format(source="crds") + yaml.safe_dump(crd, sort_keys=False, width=1000)
        files[CHART / "crds" / f"{name}.yaml"] = text
    values = Values()
    for file, (relative, condition) in PARTS.items():
        objects = [o for o in kustomize(kubectl, relative) if o["kind"] != "CustomResourceDefinition"]
        files[CHART / "templates" / file] = render_part(objects, condition, relative, values)
    files[CHART / "templates" / "_helpers.tpl"] = HELPERS
    files[CHART / "values.yaml"] = render_values(values)
    files[CHART / "values.schema.json"] = render_schema(values)
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
    present = {p for p in CHART.rglob("*") if p.is_file() and p.parent.name in ("templates", "crds")}
    if args.check:
        changed = {p for p in generated if not p.is_file() or p.read_text() != files[p]}
        stale = sorted(str(p.relative_to(REPO)) for p in changed)
        stale += sorted(str(p.relative_to(REPO)) for p in present - generated)
        if stale:
            stale_list = ", ".join(stale)
            print(f"charts/gangslice is not what hack/gen-chart.py writes: {stale_list}", file=sys.stderr)
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
