"""Binding a pod to a node: write the GPU annotations, then create the ``Binding``.

:class:`ApiBinder` talks to the API server (in a thread); :class:`LocalBinder` is for a
service without one (``serve --cluster FILE``), where the cache's own record of the bind
is all there is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from extender.kube.api import Conflict, KubeApi
from extender.kube.pods import PodInfo


class Binder(Protocol):
    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        """Raises :class:`~extender.kube.api.ApiError` when the pod could not be bound."""
        ...


class ApiBinder:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        # Annotations first: once bound, the device plugin may read them at admission.
        if annotations:
            await asyncio.to_thread(
                self.api.patch_pod_annotations, pod.namespace, pod.name, dict(annotations)
            )
        try:
            await asyncio.to_thread(self.api.bind_pod, pod.namespace, pod.name, pod.uid or None, node)
        except Conflict:
            # A retried bind of a pod that is already on this node has succeeded before.
            current = await asyncio.to_thread(self.api.get_pod, pod.namespace, pod.name)
            if (current.get("spec") or {}).get("nodeName") != node:
                raise


class LocalBinder:
    """Records binds only; ``bound`` lists (pod key, node, annotations) in order."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, dict[str, str]]] = []

    async def bind(self, pod: PodInfo, node: str, annotations: Mapping[str, str]) -> None:
        self.bound.append((pod.key, node, dict(annotations)))
