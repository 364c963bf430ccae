"""Smoke test: the real kube-scheduler binds a GPU pod to a fake GPU node; an oversized pod stays pending."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import wait_for
from kubernetes import client

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"


@pytest.fixture
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    api = control_plane.api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def make_gpu_node(core: client.CoreV1Api, name: str, gpus: int) -> None:
    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}))
    )
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status: dict[str, Any] = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake node for e2e",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }
    core.patch_node_status(name, status)


def gpu_pod(name: str, gpus: int) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.k8s.io/pause:3.10",
                    resources=client.V1ResourceRequirements(limits={GPU: str(gpus)}),
                )
            ],
        ),
    )


def node_and_conditions(
    core: client.CoreV1Api, ns: str, name: str
) -> tuple[str | None, list[client.V1PodCondition]]:
    """The pod's ``spec.nodeName`` and ``status.conditions`` (the client types both parents as optional)."""
    pod = core.read_namespaced_pod(name, ns)
    assert pod.spec is not None and pod.status is not None
    return pod.spec.node_name, list(pod.status.conditions or [])


def test_scheduler_binds_gpu_pod_and_rejects_oversized(
    control_plane: ControlPlane, core: client.CoreV1Api
) -> None:
    suffix = uuid.uuid4().hex[:6]
    node, ns = f"gpu-node-{suffix}", f"smoke-{suffix}"
    make_gpu_node(core, node, gpus=8)
    status = core.read_node(node).status
    assert status is not None and status.allocatable is not None
    assert status.allocatable[GPU] == "8"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

    core.create_namespaced_pod(ns, gpu_pod("one-gpu", 1))
    core.create_namespaced_pod(ns, gpu_pod("sixteen-gpus", 16))

    bound = wait_for("one-gpu to be bound", lambda: node_and_conditions(core, ns, "one-gpu")[0], 30)
    assert bound == node

    def unschedulable() -> bool:
        _, conditions = node_and_conditions(core, ns, "sixteen-gpus")
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in conditions
        )

    wait_for("sixteen-gpus to be marked Unschedulable", unschedulable, 30)
    node_name, conditions = node_and_conditions(core, ns, "sixteen-gpus")
    assert node_name is None
    message = next(c.message for c in conditions if c.type == "PodScheduled")
    assert (
        message is not None and GPU in message
    )  # e.g. "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. ..."
