"""The Kubernetes API as gangslice uses it: a small blocking interface behind which sit the
real client (:mod:`extender.kube.client`) and an in-memory fake (:mod:`extender.testing.kube`).

Objects cross this interface as plain JSON dicts (the API's own lowerCamel shape). Calls
block; async callers run them in a thread. Errors are mapped once, here::

    ApiError            any failed call (status = HTTP code, 0 when the server was not reached)
     +-- NotFound       404
     +-- Conflict       409 (already exists, already bound, uid precondition)
     +-- Gone           410 (a watch's resourceVersion is too old: list again)
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Kind(enum.Enum):
    NODES = "nodes"
    PODS = "pods"
    NODE_TOPOLOGIES = "nodetopologies"
    SLICE_RESERVATIONS = "slicereservations"


ALL_KINDS = tuple(Kind)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class Gone(ApiError):
    pass


def error_for(status: int, message: str) -> ApiError:
    cls = {404: NotFound, 409: Conflict, 410: Gone}.get(status, ApiError)
    return cls(status, message)


@dataclass(frozen=True, slots=True)
class Listing:
    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """``type`` is ADDED, MODIFIED, DELETED or BOOKMARK (a bookmark carries only a resourceVersion)."""

    type: str
    obj: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        meta = self.obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        return rv if isinstance(rv, str) else None


class KubeApi(Protocol):
    def list(self, kind: Kind) -> Listing: ...

    def watch(self, kind: Kind, resource_version: str, timeout_s: float) -> Iterator[WatchEvent]:
        """Events after ``resource_version`` until ``timeout_s`` passes; raises :class:`Gone`."""
        ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> None: ...

    def bind_pod(self, namespace: str, name: str, uid: str | None, node: str) -> None:
        """Create the pod's ``Binding`` (the ``pods/binding`` subresource)."""
        ...

    def create_reservation(self, obj: Mapping[str, Any]) -> None: ...

    def patch_reservation_spec(self, namespace: str, name: str, spec: Mapping[str, Any]) -> None: ...

    def patch_reservation_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    def delete_reservation(self, namespace: str, name: str) -> None: ...
