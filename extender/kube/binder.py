"""Binding a pod to a node: write the GPU annotations, then create the ``Binding``.

:class:`ApiBinder` talks to the API server (in a thread); :class:`LocalBinder` is for a
service without one (``serve --cluster FILE``), where the cache's own record of the bind
is all there is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from extender.kube.api import MERGE_PATCH, PODS, Conflict, KubeClient
from extender.kube.pods import PodInfo


class Binder(Protocol):
    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        """Raises :class:`~extender.kube.api.KubeError` when the pod could not be bound."""
        ...


class ApiBinder:
    def __init__(self, api: KubeClient) -> None:
        self.api = api

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        # Annotations first: once bound, the device plugin may read them at admission.
        if annotations:
            body = {"metadata": {"annotations": dict(annotations)}}
            await self.api.patch(PODS, pod.name, body, namespace=pod.namespace, patch_type=MERGE_PATCH)
        meta = {"name": pod.name, "namespace": pod.namespace, **({"uid": pod.uid} if pod.uid else {})}
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.api.create(PODS, binding, subresource="binding")
        except Conflict:
            # A retried bind of a pod that is already on this node has succeeded before.
            current = await self.api.get(PODS, pod.name, pod.namespace)
            if (current.get("spec") or {}).get("nodeName") != node:
                raise


class LocalBinder:
    """Records binds only; ``bound`` lists (pod key, node, annotations) in order."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, dict[str, str]]] = []

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.bound.append((pod.key, node, dict(annotations)))
