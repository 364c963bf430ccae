"""The Kubernetes API as gangslice uses it: one small async interface, :class:`KubeClient`.

Behind it sit the real client (:class:`extender.kube.client.ApiServerClient`, over the
``kubernetes`` package) and one in-memory fake (:class:`extender.testing.kube.FakeKube`).
Every component (the extender, the controllers, the node agent, the CLI) reads and writes
through it. Objects cross it as plain JSON dicts in the API's own lowerCamel shape; what a
call addresses is a :class:`Resource` (group, version, plural, scope).

Errors are mapped once, in the client, with the underlying exception chained as
``__cause__``::

    KubeError             any failed call (status = HTTP code, 0 when no answer came)
     +-- NotFound         404
     +-- Conflict         409 (already exists, stale resourceVersion, already bound)
     +-- Forbidden        401, 403 (RBAC: the message names the verb and resource)
     +-- Gone             410 (a watch's resourceVersion is too old: list again)
     +-- Unavailable      no answer, 429, 5xx (worth retrying later)
          +-- Throttled    429 (too many requests; an eviction a PodDisruptionBudget forbids now)

Writes of our own fields use server-side apply with one field manager, :data:`FIELD_MANAGER`
(``force``: gangslice owns those fields and nobody else should set them).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube import names

#: The one field manager of every server-side apply gangslice makes.
FIELD_MANAGER = "gangslice"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True, slots=True)
class Resource:
    """What an API call addresses: ``group`` is "" for the core API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
#: The owners whose replica counts size a plain gang's pod sets (:mod:`extender.kube.owners`).
REPLICA_SETS = Resource("apps", "v1", "replicasets", "ReplicaSet", namespaced=True)
STATEFUL_SETS = Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True)
JOBS = Resource("batch", "v1", "jobs", "Job", namespaced=True)
#: The upstream Workload API's gangs (KEP-4671, beta in Kubernetes 1.37): a pod joins one through
#: ``spec.schedulingGroup.podGroupName`` (:mod:`extender.kube.pod_groups`). Not Volcano's PodGroup.
WORKLOAD_POD_GROUPS = Resource("scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup", namespaced=True)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
NODE_TOPOLOGIES = Resource(names.GROUP, names.VERSION, names.NODE_TOPOLOGIES, "NodeTopology", False)
SLICE_RESERVATIONS = Resource(
    names.GROUP, names.VERSION, names.SLICE_RESERVATIONS, "SliceReservation", namespaced=True
)
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload", namespaced=True)
ADMISSION_CHECKS = Resource("kueue.x-k8s.io", "v1beta2", "admissionchecks", "AdmissionCheck", False)
RESOURCE_FLAVORS = Resource("kueue.x-k8s.io", "v1beta2", "resourceflavors", "ResourceFlavor", False)
PODGROUPS = Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", namespaced=True)
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True)
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
#: NVIDIA's DRA driver: a multi-node NVLink (IMEX) domain.
COMPUTE_DOMAINS = Resource(
    "resource.nvidia.com", "v1beta1", "computedomains", "ComputeDomain", namespaced=True
)
#: The DRA pinning webhook's registration (its caBundle: extender/controllers/webhook_ca/sync.py).
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)


class Kind(enum.Enum):
    """The kinds the cluster cache watches."""

    NODES = "nodes"
    PODS = "pods"
    NODE_TOPOLOGIES = "nodetopologies"
    SLICE_RESERVATIONS = "slicereservations"
    #: DRA (``resource.k8s.io/v1``): the devices drivers publish, the classes that select
    #: them, and the claims whose allocations take them.
    RESOURCE_SLICES = "resourceslices"
    DEVICE_CLASSES = "deviceclasses"
    RESOURCE_CLAIMS = "resourceclaims"
    #: The owners of plain gangs' pods: how many pods each pod set should have.
    REPLICA_SETS = "replicasets"
    STATEFUL_SETS = "statefulsets"
    #: The upstream Workload API's PodGroups: a gang and its size where the pods name one.
    WORKLOAD_POD_GROUPS = "podgroups.scheduling.k8s.io"

    @property
    def resource(self) -> Resource:
        return _WATCHED[self]

    @property
    def optional(self) -> bool:
        """A kind the API server may not serve (a beta API off by default): while it answers
        404 the cache holds none of it, and the watch asks again now and then."""
        return self in _OPTIONAL


_WATCHED = {
    Kind.NODES: NODES,
    Kind.PODS: PODS,
    Kind.NODE_TOPOLOGIES: NODE_TOPOLOGIES,
    Kind.SLICE_RESERVATIONS: SLICE_RESERVATIONS,
    Kind.RESOURCE_SLICES: RESOURCE_SLICES,
    Kind.DEVICE_CLASSES: DEVICE_CLASSES,
    Kind.RESOURCE_CLAIMS: RESOURCE_CLAIMS,
    Kind.REPLICA_SETS: REPLICA_SETS,
    Kind.STATEFUL_SETS: STATEFUL_SETS,
    Kind.WORKLOAD_POD_GROUPS: WORKLOAD_POD_GROUPS,
}
_OPTIONAL = frozenset({Kind.WORKLOAD_POD_GROUPS})

ALL_KINDS = tuple(Kind)


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Forbidden(KubeError):
    pass


class Gone(KubeError):
    pass


class Unavailable(KubeError):
    pass


class Throttled(Unavailable):
    """429: the server asks to try later; for an eviction, a PodDisruptionBudget allows no
    disruption now."""


def error_for(status: int, message: str) -> KubeError:
    """The typed error for an HTTP status (0: the server gave no answer)."""
    if status == 429:
        return Throttled(status, message)
    if status == 0 or status >= 500:
        return Unavailable(status, message)
    cls = {401: Forbidden, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone}.get(status, KubeError)
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


class KubeClient(Protocol):
    """The calls gangslice makes. ``namespace`` is ignored for cluster-scoped resources;
    a ``subresource`` is e.g. ``"status"`` or ``"binding"``."""

    async def get(self, res: Resource, name: str, namespace: str = "") -> dict[str, Any]: ...

    async def list(self, res: Resource, namespace: str = "") -> Listing: ...

    def watch(self, res: Resource, resource_version: str, timeout_s: float) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until ``timeout_s`` passes; raises :class:`Gone`."""
        ...

    async def create(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        """Create ``obj`` (its namespace and, for a subresource, its name from its metadata)."""
        ...

    async def replace(self, res: Resource, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Replace ``obj``; guarded by its ``metadata.resourceVersion`` (409 when stale)."""
        ...

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str = "",
        subresource: str = "",
        patch_type: str = MERGE_PATCH,
    ) -> dict[str, Any]: ...

    async def apply(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> dict[str, Any]:
        """Server-side apply of ``obj`` (apiVersion, kind, metadata.name[/namespace] and the
        fields we own) as :data:`FIELD_MANAGER`, forced; creates the object if missing."""
        ...

    async def delete(self, res: Resource, name: str, namespace: str = "") -> None: ...

    async def evict(self, namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> None:
        """Evict a pod through the ``pods/eviction`` subresource (a policy/v1 Eviction), so
        its PodDisruptionBudget is honoured: :class:`Throttled` (429) while the budget allows
        no disruption; ``uid``: only this very pod (409 for a later one of the name);
        ``dry_run``: the same checks, nothing evicted."""
        ...

    async def serves(self, res: Resource) -> bool:
        """Whether the API server serves ``res`` (Kueue and Volcano are optional)."""
        ...


def as_map(value: Any) -> Mapping[str, Any]:
    """``value`` where it is a mapping (a field of an object read from the API), else empty."""
    return value if isinstance(value, Mapping) else {}


def namespace_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, Mapping) else None
    return ns if isinstance(ns, str) else ""


def name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""
