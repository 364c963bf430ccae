"""The API calls the controller makes, as one async interface: Kueue Workloads and
AdmissionChecks (``kueue.x-k8s.io/v1beta2``), SliceReservations, Events and the leader Lease.

Objects are plain JSON dicts. Status writes are server-side apply (``application/apply-patch
+yaml``) on the ``/status`` subresource with field manager ``gangslice`` and ``force=true``.
Errors are :mod:`extender.kube.api`'s (``NotFound``, ``Conflict``, ``ApiError``).

:class:`ClientControllerApi` runs the blocking ``kubernetes`` client in a worker thread;
:class:`extender.testing.controller_api.FakeControllerApi` is the in-memory twin for tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from extender.kube import names
from extender.kube.api import ApiError, error_for

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
WORKLOADS = "workloads"
ADMISSION_CHECKS = "admissionchecks"
RESOURCE_FLAVORS = "resourceflavors"
FIELD_MANAGER = "gangslice"
APPLY_PATCH = "application/apply-patch+yaml"
PODGROUP_GROUP = "scheduling.volcano.sh"
PODGROUP_VERSION = "v1beta1"
PODGROUPS = "podgroups"


class ControllerApi(Protocol):
    async def get_workload(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def apply_workload_status(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Server-side apply of ``body`` (a Workload with only ``status.admissionChecks``)."""
        ...

    async def list_admission_checks(self) -> list[dict[str, Any]]: ...

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``group/version`` (Kueue and Volcano
        are optional: gangslice runs without either)."""
        ...

    async def get_resource_flavor(self, name: str) -> dict[str, Any]: ...

    async def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def list_reservations(self) -> list[dict[str, Any]]: ...

    async def get_reservation(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_reservation(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...

    async def apply_reservation_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...

    async def delete_reservation(self, namespace: str, name: str) -> None: ...

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace guarded by ``metadata.resourceVersion`` in ``body`` (409 when stale)."""
        ...


class PodGroupApi(Protocol):
    """Volcano PodGroups (``scheduling.volcano.sh/v1beta1``), pod annotations and Events: what
    the PodGroup controller and the plain-gang reporter call. PodGroup has no status
    subresource, so our writes are a replace of the whole object guarded by its
    ``metadata.resourceVersion`` (409 when stale)."""

    async def get_podgroup(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def replace_podgroup(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


class ClientControllerApi:
    """:class:`ControllerApi` over the official ``kubernetes`` client (blocking, in a thread)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._coord = client.CoordinationV1Api(api_client)
        self._api_client = api_client

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as exc:
            raise error_for(int(exc.status or 0), _reason(exc)) from None
        except OSError as exc:  # connection refused, DNS, TLS
            raise ApiError(0, str(exc)) from None

    def _apply(self) -> dict[str, Any]:
        return {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY_PATCH}

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any]:
        got = await self._call(
            self._custom.get_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, name
        )
        return dict(got)

    async def apply_workload_status(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        got = await self._call(
            self._custom.patch_namespaced_custom_object_status,
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            WORKLOADS,
            name,
            dict(body),
            **self._apply(),
        )
        return dict(got)

    async def list_admission_checks(self) -> list[dict[str, Any]]:
        got = await self._call(
            self._custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, ADMISSION_CHECKS
        )
        return [dict(i) for i in got.get("items", [])]

    async def get_resource_flavor(self, name: str) -> dict[str, Any]:
        got = await self._call(
            self._custom.get_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, RESOURCE_FLAVORS, name
        )
        return dict(got)

    async def apply_admission_check_status(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        got = await self._call(
            self._custom.patch_cluster_custom_object_status,
            KUEUE_GROUP,
            KUEUE_VERSION,
            ADMISSION_CHECKS,
            name,
            dict(body),
            **self._apply(),
        )
        return dict(got)

    async def list_reservations(self) -> list[dict[str, Any]]:
        got = await self._call(
            self._custom.list_cluster_custom_object, names.GROUP, names.VERSION, names.SLICE_RESERVATIONS
        )
        return [dict(i) for i in got.get("items", [])]

    async def get_reservation(self, namespace: str, name: str) -> dict[str, Any]:
        got = await self._call(
            self._custom.get_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            namespace,
            names.SLICE_RESERVATIONS,
            name,
        )
        return dict(got)

    async def create_reservation(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        body = {k: v for k, v in obj.items() if k != "status"}
        got = await self._call(
            self._custom.create_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            str(obj["metadata"]["namespace"]),
            names.SLICE_RESERVATIONS,
            body,
        )
        return dict(got)

    async def apply_reservation_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        await self._call(
            self._custom.patch_namespaced_custom_object_status,
            names.GROUP,
            names.VERSION,
            namespace,
            names.SLICE_RESERVATIONS,
            name,
            dict(body),
            **self._apply(),
        )

    async def delete_reservation(self, namespace: str, name: str) -> None:
        await self._call(
            self._custom.delete_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            namespace,
            names.SLICE_RESERVATIONS,
            name,
        )

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        await self._call(self._core.create_namespaced_event, namespace, dict(event))

    async def serves(self, group: str, version: str, plural: str) -> bool:
        try:
            got = await self._call(self._custom.get_api_resources, group, version)
        except ApiError:
            return False
        return any(r.name == plural for r in (got.resources or []))

    async def get_podgroup(self, namespace: str, name: str) -> dict[str, Any]:
        got = await self._call(
            self._custom.get_namespaced_custom_object,
            PODGROUP_GROUP,
            PODGROUP_VERSION,
            namespace,
            PODGROUPS,
            name,
        )
        return dict(got)

    async def replace_podgroup(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        got = await self._call(
            self._custom.replace_namespaced_custom_object,
            PODGROUP_GROUP,
            PODGROUP_VERSION,
            namespace,
            PODGROUPS,
            name,
            dict(body),
        )
        return dict(got)

    async def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        await self._call(self._core.patch_namespaced_pod, name, namespace, body)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        got = await self._call(self._coord.read_namespaced_lease, name, namespace)
        return dict(self._api_client.sanitize_for_serialization(got))

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        got = await self._call(self._coord.create_namespaced_lease, namespace, dict(body))
        return dict(self._api_client.sanitize_for_serialization(got))

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        got = await self._call(self._coord.replace_namespaced_lease, name, namespace, dict(body))
        return dict(self._api_client.sanitize_for_serialization(got))


def _reason(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, (str, bytes)):
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])
    return str(getattr(exc, "reason", "") or exc)
