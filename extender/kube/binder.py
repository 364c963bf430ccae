"""Binding a pod to a node: one ``Binding`` that carries the pod's GPU annotations.

The API server's ``pods/binding`` (``BindingREST`` in kube-apiserver's pod storage) sets
``spec.nodeName`` and merges the Binding's ``metadata.annotations`` into the pod's in the
same update, so the pod never runs, nor shows as bound, without its GPU indices, and the bind
needs no ``pods: patch``. :class:`ApiBinder` is the only code that binds pods;
:class:`LocalBinder` is for a service without an API server (``serve --cluster FILE``),
where the cache's own record of the bind is all there is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from extender.kube.api import PODS, Conflict, KubeClient
from extender.kube.fence import Fence
from extender.kube.pods import PodInfo


class Binder(Protocol):
    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        """Raises :class:`~extender.kube.api.KubeError` when the pod could not be bound."""
        ...


class ApiBinder:
    def __init__(self, api: KubeClient, fence: Fence | None = None) -> None:
        self.api = api
        #: A deposed leader binds nothing (:mod:`extender.kube.fence`).
        self.fence = fence or Fence()

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.fence.check(f"binding pod {pod.key} to {node}")
        # The annotations travel on the Binding: set with nodeName in one update, before the
        # kubelet (and the device plugin) can see the pod on its node.
        meta: dict[str, object] = {"name": pod.name, "namespace": pod.namespace}
        if pod.uid:
            meta["uid"] = pod.uid
        if annotations:
            meta["annotations"] = dict(annotations)
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
