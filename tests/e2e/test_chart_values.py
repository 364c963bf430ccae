"""The values of charts/gangslice beyond its switches, rendered by the helm that hack/e2e/build.sh
builds (that helm is why these sit in the e2e tier beside test_chart.py; none starts a control plane):

- each pod setting (resources, scheduling, labels, annotations, security contexts, extra arguments
  and environment) lands in its own pod and container and nowhere else: the rendered object equals
  the manifests' with the setting applied, and the other pods equal the manifests';
- a digest pins every image the chart references, and every pod takes the pull secrets;
- in OpenShift mode the default values render the OpenShift overlay exactly, and a security
  context value is laid over the overlay's;
- values.schema.json is a draft-07 schema that closes every map it defines, and ``helm template``
  refuses values of the wrong type and unknown keys, at the top and below, naming the value.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cluster import MANIFESTS
from test_chart import CHART, Key, by_key, helm
from test_openshift import overlay

from extender.placement.waiting import KeepCliques

pytestmark = pytest.mark.e2e

#: The chart's pods: the values key of their settings -> their object.
PODS: dict[str, Key] = {
    "controller": ("apps/v1", "Deployment", "gangslice-system", "gangslice-controller"),
    "agent": ("apps/v1", "DaemonSet", "gangslice-system", "gangslice-agent"),
    "scheduler": ("apps/v1", "Deployment", "gangslice-system", "gangslice-scheduler"),
}
DIGEST = "sha256:" + "0123456789abcdef" * 4
SCHEDULER_DIGEST = "sha256:" + "fedcba9876543210" * 4
#: A value for every pod setting; with_settings says where each lands.
SETTINGS: dict[str, Any] = {
    "resources": {"limits": {"memory": "8Gi"}},
    "nodeSelector": {"example.com/pool": "infra"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "example.com/pool", "operator": "In", "values": ["infra"]}]}
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {"maxSkew": 3, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/owner": "infra"},
    "podLabels": {"example.com/team": "infra"},
    "podSecurityContext": {"runAsUser": 4242, "seccompProfile": None},  # null drops the manifests' key
    "securityContext": {"readOnlyRootFilesystem": False, "runAsNonRoot": True},  # false over true
    "extraArgs": ["--example-flag=1"],
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ],
}


def render(bin_dir: Path, tmp: Path, values: dict[str, Any] | None = None, *sets: str) -> dict[Key, Any]:
    """``helm template`` with a values file holding ``values`` and ``--set`` each of ``sets``."""
    file = tmp / "values.yaml"
    file.write_text(yaml.safe_dump(values or {}))
    args = [a for s in sets for a in ("--set", s)]
    return by_key(helm(bin_dir, "template", "gangslice", str(CHART), "-f", str(file), *args, home=tmp))


def refusal(bin_dir: Path, tmp: Path, *sets: str) -> str:
    """What ``helm template`` says when it refuses ``sets``."""
    env = {**os.environ} | {f"HELM_{k}_HOME": str(tmp / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
    args = [a for s in sets for a in ("--set", s)]
    argv = [str(bin_dir / "helm"), "template", "gangslice", str(CHART), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180, check=False)
    assert proc.returncode != 0, f"helm accepted {sets}"
    return proc.stderr


def kustomize(bin_dir: Path, *paths: Path) -> dict[Key, Any]:
    out: dict[Key, Any] = {}
    for path in paths:
        argv = [str(bin_dir / "kubectl"), "kustomize", str(path)]
        out |= by_key(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return out


def with_settings(obj: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as SETTINGS should leave it: Helm merges a map into the default one; the security
    contexts take their keys over the manifests' (null drops one); the rest is added or replaced."""
    obj = copy.deepcopy(obj)
    meta, spec = obj["spec"]["template"]["metadata"], obj["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    c["resources"]["limits"] |= settings["resources"]["limits"]
    spec["nodeSelector"] = spec.get("nodeSelector", {}) | settings["nodeSelector"]
    for name in ("tolerations", "affinity", "topologySpreadConstraints", "priorityClassName"):
        spec[name] = settings[name]
    meta["annotations"] = meta.get("annotations", {}) | settings["podAnnotations"]
    meta["labels"] |= settings["podLabels"]
    pod = spec["securityContext"] | settings["podSecurityContext"]
    spec["securityContext"] = {k: v for k, v in pod.items() if v is not None}
    c["securityContext"] |= settings["securityContext"]
    c["args" if "args" in c else "command"] += settings["extraArgs"]
    c["env"] = [*c.get("env", []), *settings["extraEnv"]]
    if "runtimeClassName" in settings:
        spec.pop("runtimeClassName")
    return obj


@pytest.mark.parametrize("pod", PODS)
def test_each_pod_setting_lands_in_its_pod_only(e2e_bin_dir: Path, tmp_path: Path, pod: str) -> None:
    settings = SETTINGS | ({"runtimeClassName": ""} if pod == "agent" else {})  # "": no runtimeClassName
    values = {"scheduler": {"enabled": True}}
    values[pod] = values.get(pod, {}) | settings
    rendered = render(e2e_bin_dir, tmp_path, values)
    manifests = kustomize(e2e_bin_dir, MANIFESTS, MANIFESTS / "scheduler")
    for other, key in PODS.items():
        if other == pod:
            assert rendered[key] == with_settings(manifests[key], settings)
        else:
            assert rendered[key] == manifests[key], f"{pod}'s settings reached {other}"


def test_set_raises_the_controllers_memory_limit(e2e_bin_dir: Path, tmp_path: Path) -> None:
    """The docs' sizing advice, with --set: the limit changes, the requests stay."""
    rendered = render(e2e_bin_dir, tmp_path, None, "controller.resources.limits.memory=8Gi")
    (container,) = rendered[PODS["controller"]]["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "limits": {"memory": "8Gi"},
        "requests": {"cpu": "250m", "memory": "512Mi"},
    }


def test_digests_pin_every_image_and_every_pod_takes_the_pull_secrets(
    e2e_bin_dir: Path, tmp_path: Path
) -> None:
    values = {"image": {"tag": "9.9.9", "digest": DIGEST}, "imagePullSecrets": [{"name": "regcred"}],
              "scheduler": {"enabled": True, "image": {"digest": SCHEDULER_DIGEST}}}  # fmt: skip
    images = {"controller": f"ghcr.io/gangslice/gangslice@{DIGEST}",
              "agent": f"ghcr.io/gangslice/gangslice@{DIGEST}",
              "scheduler": f"registry.k8s.io/kube-scheduler@{SCHEDULER_DIGEST}"}  # fmt: skip
    rendered = render(e2e_bin_dir, tmp_path, values)
    for pod, key in PODS.items():
        spec = rendered[key]["spec"]["template"]["spec"]
        assert [c["image"] for c in spec["containers"]] == [images[pod]]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    openshift = render(e2e_bin_dir, tmp_path, values | {"openshift": {"enabled": True}})
    secondary = ("operator.openshift.io/v1", "SecondaryScheduler", "openshift-secondary-scheduler-operator",
                 "cluster")  # fmt: skip
    assert openshift[secondary]["spec"]["imageSpec"] == images["scheduler"]
    for pod in ("controller", "agent"):
        (container,) = openshift[PODS[pod]]["spec"]["template"]["spec"]["containers"]
        assert container["image"] == images[pod]


def test_openshift_mode_renders_the_overlay_and_takes_security_contexts_over_it(
    e2e_bin_dir: Path, tmp_path: Path
) -> None:
    on = {"openshift": {"enabled": True}, "scheduler": {"enabled": True}}
    rendered = render(e2e_bin_dir, tmp_path, on)
    (tmp_path / "overlay").mkdir()
    expected = kustomize(e2e_bin_dir, overlay(tmp_path / "overlay"), MANIFESTS / "openshift-scheduler")
    crds = {k for k in expected if k[1] == "CustomResourceDefinition"}
    assert rendered.keys() == expected.keys() - crds
    for key in rendered:
        assert rendered[key] == expected[key], key
    on["controller"] = {"podSecurityContext": {"runAsUser": 1000710000}}
    rendered = render(e2e_bin_dir, tmp_path, on)
    pod = rendered[PODS["controller"]]["spec"]["template"]["spec"]["securityContext"]
    assert pod == {
        "runAsNonRoot": True,
        "runAsUser": 1000710000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


#: A value helm template refuses -> what it says of it.
REFUSALS = {
    "controller.resources=bad": "at '/controller/resources': got string, want object",
    "controller.replicas=two": "at '/controller/replicas': got string, want integer",
    "controller.extraArgs=--v=4": "at '/controller/extraArgs': got string, want array",
    "agent.nodeSelector.pool=1": "at '/agent/nodeSelector/pool': got number, want string",
    "controller.keepCliques=sometimes": "at '/controller/keepCliques': value must be one of",
    "image.digest=latest": "at '/image/digest': 'latest' does not match pattern",
    "bogus=1": "at '': additional properties 'bogus' not allowed",
    "controller.bogus=1": "at '/controller': additional properties 'bogus' not allowed",
    "agent.resources.limit.memory=1Gi": "at '/agent/resources': additional properties 'limit'",
    "scheduler.image.bogus=1": "at '/scheduler/image': additional properties 'bogus' not allowed",
    "agent.tolerations[0].operater=Exists": "at '/agent/tolerations/0': additional properties 'operater'",
    "imagePullSecrets[0].nam=regcred": "at '/imagePullSecrets/0': missing property 'name'",
    "controller.podLabels.app\\.kubernetes\\.io/name=x": "at '/controller/podLabels/app.kubernetes.io~1name'",
}


@pytest.mark.parametrize(("value", "said"), REFUSALS.items(), ids=[v.split("=")[0] for v in REFUSALS])
def test_the_schema_refuses_wrong_types_and_unknown_keys(
    e2e_bin_dir: Path, tmp_path: Path, value: str, said: str
) -> None:
    out = refusal(e2e_bin_dir, tmp_path, value)
    assert "values don't meet the specifications of the schema" in out and said in out, out


def _maps(schema: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema under ``schema`` that lists properties, with where it is."""
    if not isinstance(schema, dict):
        return []
    found = [(where, schema)] if "properties" in schema else []
    for name, sub in schema.get("properties", {}).items():
        found += _maps(sub, f"{where}/{name}")
    return found + _maps(schema.get("items"), f"{where}[]")


def test_the_schema_closes_every_map_it_defines_and_holds_the_defaults() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    for where, sub in _maps(schema):
        refused_only = all(v is False for v in sub["properties"].values())  # podLabels' selector labels
        assert sub["additionalProperties"] is False or refused_only, where
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    keep = schema["properties"]["controller"]["properties"]["keepCliques"]["enum"]
    assert keep == [k.value for k in KeepCliques]
