"""Builders of the Kubernetes objects tests hand to the cache, the controllers and the API
fake, in the manner of Kueue's ``pkg/util/testing`` and kube-scheduler's
``MakePod().Name(..).Obj()`` wrappers::

    make_pod("w-0").gpus(4).gang("tp4", size=2).on_node("h-0").obj()
    make_node_object("h-0").gpus(8).labels({LEAF: "leaf-1"}).obj()
    make_node_topology("h-0").pcie_8gpu_2socket().in_use("w-0", 0, 1).obj()
    make_workload("tp4").pod_set("main", count=2, gpus=4).quota_reserved(AT).check("gangslice").obj()
    make_pod_group("pg").min_member(2).phase("Inqueue").obj()
    make_replica_set("decode-7f9").template(make_pod("t").gpus(2)).deployment("decode", 3, 4).obj()

Every builder is immutable (each setter returns a new one) and ``obj()`` returns a fresh
dict each call, so a test may change what it got. The objects are what the API server
returns: Pods and Nodes in core/v1, Workloads in ``kueue.x-k8s.io/v1beta2``, PodGroups in
``scheduling.volcano.sh/v1beta1``, NodeTopologies as the agent publishes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Self

from extender.agent.publish import build_object, build_spec
from extender.kube import names as keys
from extender.testing.builders import NamedHardware
from extender.topology.allocation import Allocation
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph

__all__ = [
    "NodeObjectBuilder",
    "NodeTopologyBuilder",
    "PodBuilder",
    "PodGroupBuilder",
    "ReplicaSetBuilder",
    "WorkloadBuilder",
    "make_node_object",
    "make_node_topology",
    "make_pod",
    "make_pod_group",
    "make_replica_set",
    "make_workload",
]

KUEUE_API = "kueue.x-k8s.io/v1beta2"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
#: When a NodeTopology was published unless a test says otherwise.
PUBLISHED = datetime(2026, 1, 1, tzinfo=UTC)


def _merged(old: tuple[tuple[str, str], ...], new: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return (*old, *new.items())


@dataclass(frozen=True)
class _Namespaced:
    """What every namespaced object's builder sets in ``metadata``."""

    _name: str
    _namespace: str = "llm"
    _uid: str | None = None
    _resource_version: str | None = None
    _labels: tuple[tuple[str, str], ...] = ()
    _annotations: tuple[tuple[str, str], ...] = ()

    def named(self, name: str) -> Self:
        return replace(self, _name=name)

    def namespace(self, namespace: str) -> Self:
        return replace(self, _namespace=namespace)

    def uid(self, uid: str | None) -> Self:
        """The object's uid (None: ``uid-<namespace>-<name>``)."""
        return replace(self, _uid=uid)

    def resource_version(self, version: str) -> Self:
        return replace(self, _resource_version=version)

    def label(self, key: str, value: str) -> Self:
        return replace(self, _labels=(*self._labels, (key, value)))

    def labels(self, labels: Mapping[str, str]) -> Self:
        return replace(self, _labels=_merged(self._labels, labels))

    def annotation(self, key: str, value: str) -> Self:
        return replace(self, _annotations=(*self._annotations, (key, value)))

    def annotations(self, annotations: Mapping[str, str]) -> Self:
        return replace(self, _annotations=_merged(self._annotations, annotations))

    def _metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self._name,
            "namespace": self._namespace,
            "uid": self._uid or f"uid-{self._namespace}-{self._name}",
        }
        if self._resource_version is not None:
            meta["resourceVersion"] = self._resource_version
        if self._labels:
            meta["labels"] = dict(self._labels)
        if self._annotations:
            meta["annotations"] = dict(self._annotations)
        return meta


# -- core/v1 Pod -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodBuilder(_Namespaced):
    """A core/v1 Pod as the API (and kube-scheduler) writes it; see :func:`make_pod`."""

    _gpus: int = 0
    _node: str | None = None
    _phase: str = "Pending"
    _scheduler: str = "gangslice-scheduler"
    _pod_group: str | None = None

    def gpus(self, count: int) -> PodBuilder:
        """``nvidia.com/gpu`` requested and limited (0: a CPU pod requesting one core)."""
        return replace(self, _gpus=count)

    def gang(self, gang: str, size: int) -> PodBuilder:
        """A pod of a plain gang: label ``gangslice.io/gang`` and annotation ``gang-size``."""
        return self.label(keys.GANG, gang).annotation(keys.GANG_SIZE, str(size))

    def on_node(self, node: str | None) -> PodBuilder:
        """Bound to ``node`` (``spec.nodeName``)."""
        return replace(self, _node=node)

    def phase(self, phase: str) -> PodBuilder:
        return replace(self, _phase=phase)

    def running(self) -> PodBuilder:
        return self.phase("Running")

    def scheduler(self, name: str) -> PodBuilder:
        return replace(self, _scheduler=name)

    def joins(self, pod_group: str) -> PodBuilder:
        """A member of the upstream PodGroup ``pod_group`` (``spec.schedulingGroup``)."""
        return replace(self, _pod_group=pod_group)

    def obj(self) -> dict[str, Any]:
        resources: dict[str, Any] = {"requests": {"cpu": "1"}}
        if self._gpus:
            count = str(self._gpus)
            resources = {"requests": {keys.GPU_RESOURCE: count}, "limits": {keys.GPU_RESOURCE: count}}
        spec: dict[str, Any] = {
            "schedulerName": self._scheduler,
            "containers": [{"name": "main", "image": "vllm/vllm-openai", "resources": resources}],
        }
        if self._node:
            spec["nodeName"] = self._node
        if self._pod_group:
            spec["schedulingGroup"] = {"podGroupName": self._pod_group}
        # A pod read back from the API server always has both maps, empty or not.
        meta = {"labels": {}, "annotations": {}, **self._metadata()}
        return {
            "metadata": meta,
            "spec": spec,
            "status": {"phase": self._phase},
        }


def make_pod(name: str, namespace: str = "llm") -> PodBuilder:
    """A pending CPU pod of one container for ``gangslice-scheduler``; ``.gpus(n)``,
    ``.gang(name, size)``, ``.on_node(node)``, ``.running()`` change it."""
    return PodBuilder(name, namespace)


def make_workload_pod_group(
    name: str, namespace: str = "llm", *, min_count: int | None = None, topology: str | None = None
) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1beta1`` PodGroup: a gang of ``min_count`` (None: the basic
    policy), its pods sharing a value of node label ``topology`` where given."""
    policy: dict[str, Any] = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    spec: dict[str, Any] = {"schedulingPolicy": policy}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


# -- apps/v1 ReplicaSet and StatefulSet ----------------------------------------------------------


@dataclass(frozen=True)
class ReplicaSetBuilder(_Namespaced):
    """An apps/v1 ReplicaSet (or, with ``.stateful()``, a StatefulSet) whose pods are the
    template's; see :func:`make_replica_set`."""

    _template: PodBuilder | None = None
    _replicas: int = 1
    #: (Deployment name, desired-replicas, max-replicas, revision) for a Deployment's ReplicaSet.
    _deployment: tuple[str, int, int, int] | None = None
    _kind: str = "ReplicaSet"

    def template(self, pod: PodBuilder) -> ReplicaSetBuilder:
        """The pod template: the pod's labels, annotations and spec."""
        return replace(self, _template=pod)

    def replicas(self, count: int) -> ReplicaSetBuilder:
        return replace(self, _replicas=count)

    def deployment(
        self, name: str, desired: int, most: int | None = None, revision: int = 1
    ) -> ReplicaSetBuilder:
        """Owned by Deployment ``name``, whose replicas (``desired``) and replicas + maxSurge
        (``most``) the deployment controller writes on it."""
        return replace(self, _deployment=(name, desired, desired if most is None else most, revision))

    def stateful(self) -> ReplicaSetBuilder:
        return replace(self, _kind="StatefulSet")

    def obj(self) -> dict[str, Any]:
        meta = self._metadata()
        if self._deployment is not None:
            name, desired, most, revision = self._deployment
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": name,
                    "uid": f"uid-{name}",
                    "controller": True,
                }
            ]
            meta.setdefault("annotations", {}).update(
                {
                    "deployment.kubernetes.io/desired-replicas": str(desired),
                    "deployment.kubernetes.io/max-replicas": str(most),
                    "deployment.kubernetes.io/revision": str(revision),
                }
            )
        pod = (self._template or PodBuilder("template", self._namespace)).obj()
        template = {
            "metadata": {"labels": pod["metadata"]["labels"], "annotations": pod["metadata"]["annotations"]},
            "spec": pod["spec"],
        }
        return {
            "apiVersion": "apps/v1",
            "kind": self._kind,
            "metadata": meta,
            "spec": {"replicas": self._replicas, "template": template},
        }


def make_replica_set(name: str, namespace: str = "llm") -> ReplicaSetBuilder:
    """A ReplicaSet of one pod like ``.template(make_pod(...))``; ``.deployment(name, desired,
    most)`` makes it a Deployment's, ``.stateful()`` a StatefulSet."""
    return ReplicaSetBuilder(name, namespace)


# -- core/v1 Node ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeObjectBuilder:
    """A core/v1 Node; see :func:`make_node_object`."""

    _name: str
    _gpus: int = 8
    _labels: tuple[tuple[str, str], ...] = ()
    _product: str | None = "NVIDIA-H100-80GB-HBM3"
    _ready: bool = True
    _unschedulable: bool = False

    def named(self, name: str) -> NodeObjectBuilder:
        return replace(self, _name=name)

    def gpus(self, count: int) -> NodeObjectBuilder:
        """``nvidia.com/gpu`` capacity and allocatable (0: none, a CPU node or a DRA node)."""
        return replace(self, _gpus=count)

    def label(self, key: str, value: str) -> NodeObjectBuilder:
        return replace(self, _labels=(*self._labels, (key, value)))

    def labels(self, labels: Mapping[str, str]) -> NodeObjectBuilder:
        return replace(self, _labels=_merged(self._labels, labels))

    def product(self, product: str | None) -> NodeObjectBuilder:
        """GPU Feature Discovery's ``nvidia.com/gpu.product`` (None: no such label)."""
        return replace(self, _product=product)

    def not_ready(self) -> NodeObjectBuilder:
        return replace(self, _ready=False)

    def unschedulable(self) -> NodeObjectBuilder:
        """Cordoned (``spec.unschedulable``)."""
        return replace(self, _unschedulable=True)

    def obj(self) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": self._name, **dict(self._labels)}
        if self._product:
            labels[keys.GPU_PRODUCT_LABEL] = self._product
        capacity = {"cpu": "96", keys.GPU_RESOURCE: str(self._gpus)} if self._gpus else {"cpu": "96"}
        return {
            "metadata": {"name": self._name, "labels": labels},
            "spec": {"unschedulable": True} if self._unschedulable else {},
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
                "conditions": [{"type": "Ready", "status": "True" if self._ready else "False"}],
            },
        }


def make_node_object(name: str) -> NodeObjectBuilder:
    """A ready core/v1 Node with 8 ``nvidia.com/gpu``, 96 CPUs and GFD's H100 product label."""
    return NodeObjectBuilder(name)


# -- gangslice.io/v1alpha1 NodeTopology ----------------------------------------------------------


@dataclass(frozen=True)
class NodeTopologyBuilder(NamedHardware):
    """A NodeTopology as the agent publishes it; see :func:`make_node_topology`."""

    _node: str
    _graph: GpuGraph | None = None
    _source: str = "nvml"
    #: (namespace, pod, container, GPU indices) per pod the kubelet gave GPUs.
    _in_use: tuple[tuple[str, str, str, tuple[int, ...]], ...] = ()
    _allocatable: tuple[str, ...] = ()
    _allocation: Allocation = Allocation.DEVICE_PLUGIN
    _conditions: tuple[Mapping[str, str], ...] = ()
    _published: datetime = PUBLISHED
    _node_uid: str | None = None

    def graph(self, graph: GpuGraph) -> Self:
        return replace(self, _graph=graph)

    def source(self, source: str) -> NodeTopologyBuilder:
        """Where the agent read the graph (``nvml``, ``nvidia-smi``...)."""
        return replace(self, _source=source)

    def in_use(
        self, pod: str, *gpus: int, namespace: str = "llm", container: str = "main"
    ) -> NodeTopologyBuilder:
        """The kubelet gave these GPUs to ``pod``; each device id is the GPU's UUID, or
        ``GPU-<index>`` when the graph has none."""
        return replace(self, _in_use=(*self._in_use, (namespace, pod, container, gpus)))

    def allocatable(self, *device_ids: str) -> NodeTopologyBuilder:
        return replace(self, _allocatable=device_ids)

    def dra(self) -> NodeTopologyBuilder:
        return replace(self, _allocation=Allocation.DRA)

    def allocation(self, allocation: Allocation) -> NodeTopologyBuilder:
        return replace(self, _allocation=allocation)

    def condition(self, condition: Mapping[str, str]) -> NodeTopologyBuilder:
        return replace(self, _conditions=(*self._conditions, condition))

    def published(self, at: datetime) -> NodeTopologyBuilder:
        return replace(self, _published=at)

    def owned_by_node(self, uid: str) -> NodeTopologyBuilder:
        """An owner reference to the Node of that uid."""
        return replace(self, _node_uid=uid)

    def obj(self) -> dict[str, Any]:
        graph = self._graph if self._graph is not None else preset_graph("hgx-h100")
        in_use = [
            {
                "deviceId": graph.gpu(i).uuid or f"GPU-{i}",
                "index": i,
                "namespace": ns,
                "pod": pod,
                "container": container,
            }
            for ns, pod, container, gpus in self._in_use
            for i in gpus
        ]
        spec = build_spec(graph, self._source, in_use, self._allocatable, self._allocation)
        return build_object(self._node, spec, self._conditions, self._published, self._node_uid)


def make_node_topology(node: str) -> NodeTopologyBuilder:
    """The NodeTopology of ``node``: an HGX H100 read through NVML, no GPU in use, published
    at :data:`PUBLISHED`, no conditions."""
    return NodeTopologyBuilder(node)


# -- kueue.x-k8s.io/v1beta2 Workload --------------------------------------------------------------


@dataclass(frozen=True)
class _WorkloadPodSet:
    name: str
    count: int
    gpus: int
    claim: str | None
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    restart_policy: str | None
    flavors: tuple[tuple[str, str], ...]

    def spec(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": "x"}
        pod: dict[str, Any] = {}
        if self.restart_policy:
            pod["restartPolicy"] = self.restart_policy
        if self.claim:
            container["resources"] = {"claims": [{"name": self.claim}]}
            pod["containers"] = [container]
            pod["resourceClaims"] = [{"name": self.claim, "resourceClaimTemplateName": self.claim}]
        else:
            if self.gpus:
                container["resources"] = {"limits": {keys.GPU_RESOURCE: str(self.gpus)}}
            pod["containers"] = [container]
        meta: dict[str, Any] = {}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return {"name": self.name, "count": self.count, "template": {"metadata": meta, "spec": pod}}


@dataclass(frozen=True)
class WorkloadBuilder(_Namespaced):
    """A Kueue Workload; see :func:`make_workload`."""

    _queue: str = "gpu"
    _active: bool = True
    _pod_sets: tuple[_WorkloadPodSet, ...] = ()
    #: (when, ClusterQueue) once quota is reserved.
    _quota: tuple[str, str] | None = None
    _checks: tuple[Mapping[str, str], ...] = ()
    _conditions: tuple[Mapping[str, str], ...] = ()

    def queue(self, name: str) -> WorkloadBuilder:
        """The LocalQueue (``spec.queueName``)."""
        return replace(self, _queue=name)

    def inactive(self) -> WorkloadBuilder:
        return replace(self, _active=False)

    def pod_set(
        self,
        name: str,
        count: int = 1,
        gpus: int = 0,
        *,
        claim: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        restart_policy: str | None = None,
        flavors: Mapping[str, str] | None = None,
    ) -> WorkloadBuilder:
        """One more pod set of ``count`` pods whose one container limits ``gpus``
        ``nvidia.com/gpu``, or asks for its GPUs through the ResourceClaimTemplate ``claim``
        (a claim of the same name). ``flavors`` is its assignment once quota is reserved
        (default ``{"cpu": "default"}``)."""
        ps = _WorkloadPodSet(
            name,
            count,
            gpus,
            claim,
            tuple((labels or {}).items()),
            tuple((annotations or {}).items()),
            restart_policy,
            tuple((flavors or {"cpu": "default"}).items()),
        )
        return replace(self, _pod_sets=(*self._pod_sets, ps))

    def quota_reserved(self, at: str, cluster_queue: str = "gpu-cq") -> WorkloadBuilder:
        """Kueue reserved quota at ``at`` (RFC 3339) in ``cluster_queue``: the QuotaReserved
        condition and ``status.admission`` with every pod set's assignment."""
        return replace(self, _quota=(at, cluster_queue))

    def condition(
        self, type_: str, status: str, at: str, reason: str | None = None, message: str = ""
    ) -> WorkloadBuilder:
        """One more status condition (after QuotaReserved, when there is one)."""
        cond = {
            "type": type_,
            "status": status,
            "reason": reason or type_,
            "message": message,
            "lastTransitionTime": at,
        }
        return replace(self, _conditions=(*self._conditions, cond))

    def check(self, name: str, state: str = "Pending", at: str = "", message: str = "") -> WorkloadBuilder:
        """An entry of ``status.admissionChecks`` (``at`` defaults to the quota's time)."""
        entry = {"name": name, "state": state, "message": message, "lastTransitionTime": at}
        return replace(self, _checks=(*self._checks, entry))

    def obj(self) -> dict[str, Any]:
        meta = self._metadata()
        spec = {
            "active": self._active,
            "queueName": self._queue,
            "podSets": [p.spec() for p in self._pod_sets],
        }
        conditions = [dict(c) for c in self._conditions]
        quota_at = ""
        if self._quota is not None:
            quota_at = self._quota[0]
            reserved = {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""}
            conditions.insert(0, {**reserved, "lastTransitionTime": quota_at})
        status: dict[str, Any] = {"conditions": conditions} if conditions else {}
        if self._quota is not None:
            status["admission"] = {
                "clusterQueue": self._quota[1],
                "podSetAssignments": [
                    {"name": p.name, "count": p.count, "flavors": dict(p.flavors)} for p in self._pod_sets
                ],
            }
        if self._checks:
            status["admissionChecks"] = [
                {**c, "lastTransitionTime": c["lastTransitionTime"] or quota_at} for c in self._checks
            ]
        return {"apiVersion": KUEUE_API, "kind": "Workload", "metadata": meta, "spec": spec, "status": status}


def make_workload(name: str, namespace: str = "llm") -> WorkloadBuilder:
    """A Kueue v1beta2 Workload in LocalQueue ``gpu``, active, with no pod set, quota or
    check until ``.pod_set(...)``, ``.quota_reserved(at)`` and ``.check(name)`` add them."""
    return WorkloadBuilder(name, namespace)


# -- scheduling.volcano.sh/v1beta1 PodGroup --------------------------------------------------------


@dataclass(frozen=True)
class PodGroupBuilder(_Namespaced):
    """A Volcano PodGroup; see :func:`make_pod_group`."""

    _min_member: int = 1
    _min_task_member: tuple[tuple[str, int], ...] = ()
    _min_gpus: int | None = None
    _queue: str | None = None
    _phase: str = "Pending"

    def min_member(self, count: int) -> PodGroupBuilder:
        return replace(self, _min_member=count)

    def min_task_member(self, task: str, count: int) -> PodGroupBuilder:
        return replace(self, _min_task_member=(*self._min_task_member, (task, count)))

    def min_gpus(self, count: int) -> PodGroupBuilder:
        """``spec.minResources`` of ``nvidia.com/gpu``."""
        return replace(self, _min_gpus=count)

    def queue(self, name: str) -> PodGroupBuilder:
        return replace(self, _queue=name)

    def phase(self, phase: str) -> PodGroupBuilder:
        """``Pending``, ``Inqueue``, ``Running``..."""
        return replace(self, _phase=phase)

    def obj(self) -> dict[str, Any]:
        meta = self._metadata()
        spec: dict[str, Any] = {"minMember": self._min_member}
        if self._min_task_member:
            spec["minTaskMember"] = dict(self._min_task_member)
        if self._queue is not None:
            spec["queue"] = self._queue
        if self._min_gpus is not None:
            spec["minResources"] = {keys.GPU_RESOURCE: str(self._min_gpus)}
        return {
            "apiVersion": VOLCANO_API,
            "kind": "PodGroup",
            "metadata": meta,
            "spec": spec,
            "status": {"phase": self._phase},
        }


def make_pod_group(name: str, namespace: str = "llm") -> PodGroupBuilder:
    """A Volcano v1beta1 PodGroup of one member, Pending."""
    return PodGroupBuilder(name, namespace)
