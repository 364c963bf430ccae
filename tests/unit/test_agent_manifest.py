"""The agent's DaemonSet manifest: least privilege, the socket read-only, GPU taints tolerated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.agent.kubelet_config import DEFAULT_CONFIG as DEFAULT_KUBELET_CONFIG
from extender.agent.podresources import DEFAULT_SOCKET
from extender.agent.publish import GROUP, PLURAL

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "agent" / "daemonset.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}


def test_the_cluster_role_grants_exactly_what_the_agent_uses(docs: dict[str, dict[str, Any]]) -> None:
    rules = docs["ClusterRole"]["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "nodes", "get"),
        (GROUP, PLURAL, "get"),
        (GROUP, PLURAL, "create"),
        (GROUP, PLURAL, "patch"),
        (GROUP, f"{PLURAL}/status", "patch"),
    }
    assert not any("*" in part for g in granted for part in g)
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]


def test_the_daemonset_runs_unprivileged_with_the_socket_directory_read_only(
    docs: dict[str, dict[str, Any]],
) -> None:
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    socket_dir = str(DEFAULT_SOCKET.parent)
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": socket_dir, "readOnly": True}
    assert volumes["pod-resources"]["hostPath"] == {"path": socket_dir, "type": "Directory"}
    # The kubelet's configuration (its Topology Manager and CPU manager policies): one file,
    # read-only, type File (a missing file fails the mount instead of creating a host directory).
    assert mounts["kubelet-config"] == {
        "name": "kubelet-config",
        "mountPath": str(DEFAULT_KUBELET_CONFIG),
        "readOnly": True,
    }
    assert volumes["kubelet-config"]["hostPath"] == {"path": str(DEFAULT_KUBELET_CONFIG), "type": "File"}
    host = {name for name, v in volumes.items() if "hostPath" in v}
    assert host == {"pod-resources", "kubelet-config"}
    assert "nvidia.com/gpu" not in str(container["resources"])  # it must not take a GPU from workloads
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_daemonset_sees_every_gpu_knows_its_node_and_tolerates_gpu_taints(
    docs: dict[str, dict[str, Any]],
) -> None:
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert container["args"][0] == "agent"
