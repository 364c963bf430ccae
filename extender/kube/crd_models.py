"""The gangslice custom resources: ``NodeTopology`` and ``SliceReservation`` (group
``gangslice.io``, version ``v1alpha1``), modelled once, here.

These pydantic models are the one schema of both kinds: the CRDs in ``manifests/crds/`` are
generated from them (``make crds``, :mod:`extender.kube.crd_schema`; a unit test fails when
the files are stale), the node agent's objects validate against them and the cluster cache
reads NodeTopology objects with them. ``description=`` texts and ``json_schema_extra`` keys
(``x-kubernetes-list-type``, ``nullable``, ``crdDefault``) go into the CRD; class docstrings
are for Python readers only.

``NodeTopology`` (cluster-scoped, one per node, named after the node) is written by the node
agent (see :mod:`extender.agent.publish` for the full contract); its spec is the GPU graph in
the shape of :func:`extender.topology.serialize.graph_to_dict` plus ``devicesInUse``,
``allocatableDevices`` and ``source``. ``nvlinkGbps`` and ``pcieGbps`` are bandwidths the
cost model divides by, so both must be above 0: the API server refuses 0 on write, and an
object stored before that rule (or written by hand) is refused by :func:`parse_node_topology`,
which keeps the node out of placement and names the field (see
:mod:`extender.kube.topology_status`).

``SliceReservation`` (namespaced) has as spec exactly the ledger's ``Reservation.to_dict()``
(``gang``, ``slice``, ``expiresAt``, ``bound``, ``phase``, ``meta``), so
``Reservation.from_dict(obj["spec"])`` reads it back; a restart rebuilds the ledger from spec
alone. Its ``status`` (:func:`reservation_status`) is what people and kubectl read: phase,
which pod holds which slot, nodes, GPU count, a ``Held`` condition, once the kubelet
reports a bound pod on other GPUs than promised a ``DevicesMismatch`` condition
(:mod:`extender.kube.devices`), and, per slot, its node, GPUs, pod and (on DRA nodes) the
ResourceClaim that pins it. Whoever writes the
object writes its status too, through the ``/status`` subresource, and again whenever a slot
binds or is freed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from extender.kube import names
from extender.kube.api import as_map
from extender.kube.devices import DeviceMismatch, devices_condition
from extender.placement.ledger import Phase, Reservation
from extender.placement.slice import PodSlot
from extender.topology.allocation import Allocation
from extender.topology.kubelet import (
    CpuPolicy,
    KubeletAlignment,
    MemoryPolicy,
    NumaNode,
    TopologyPolicy,
    TopologyScope,
)
from extender.topology.model import GpuGraph, TopologyError
from extender.topology.serialize import graph_from_dict, index_ranges, parse_cpu_ranges


class CrdError(ValueError):
    """A custom resource that cannot be used; the message names the object and the field.

    ``field`` is the path of the offending field (``spec.nvlinkGbps``), ``problem`` what is
    wrong with it; both empty when the object as a whole is unusable."""

    def __init__(self, message: str, field: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.problem = problem


def _list(kind: str, *keys: str) -> dict[str, Any]:
    """``json_schema_extra`` of a list field: how server-side apply merges it."""
    out: dict[str, Any] = {"x-kubernetes-list-type": kind}
    if keys:
        out["x-kubernetes-list-map-keys"] = list(keys)
    return out


#: ``json_schema_extra`` of a map a writer replaces whole: server-side apply then drops the
#: keys the new value lacks (a freed slot's entry goes) instead of merging key by key.
_ATOMIC_MAP: dict[str, Any] = {"x-kubernetes-map-type": "atomic"}


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _rfc3339(value: str) -> str:
    try:
        datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 date-time") from None
    if "T" not in value.upper():
        raise ValueError(f"{value!r} is not an RFC 3339 date-time")
    return value


#: An RFC 3339 timestamp kept as the string the API server returns.
Rfc3339 = Annotated[str, AfterValidator(_rfc3339), WithJsonSchema({"type": "string", "format": "date-time"})]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    type: str = Field(min_length=1)
    status: ConditionStatus
    reason: str | None = None
    message: str | None = None
    last_transition_time: Rfc3339 = Field(alias="lastTransitionTime")


# -- NodeTopology -------------------------------------------------------------------------


class Source(enum.StrEnum):
    NVML = "nvml"
    NVIDIA_SMI = "nvidia-smi"
    NONE = "none"


class PcieName(enum.StrEnum):
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"


class GpuEntry(_Model):
    index: int = Field(ge=0)
    uuid: str | None = None
    pci_bus_id: str | None = Field(None, alias="pciBusId")
    numa_node: int | None = Field(None, alias="numaNode", ge=-1)
    cpu_affinity: str | None = Field(
        None,
        alias="cpuAffinity",
        pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$",
        description="CPU ranges, e.g. 0-47,96-143",
    )
    name: str | None = None


class LinkEntry(_Model):
    a: int = Field(ge=0)
    b: int = Field(ge=0)
    link: str = Field(
        pattern=r"^(NV[0-9]+|PIX|PXB|PHB|NODE|SYS|SOC)$",
        description="the nvidia-smi topo -m cell (NV18, PIX, PXB, PHB, NODE, SYS)",
    )


class NicEntry(_Model):
    name: str
    numa_node: int | None = Field(None, alias="numaNode", ge=-1)
    gpu_links: dict[str, PcieName] = Field(
        default_factory=dict,
        alias="gpuLinks",
        description="GPU index -> PCIe level between the NIC and that GPU",
    )


class HealthEntry(_Model):
    index: int = Field(ge=0)
    healthy: bool
    reason: str | None = None
    nvlink_errors_per_second: float = Field(0.0, alias="nvlinkErrorsPerSecond", ge=0)
    pcie_replays_per_second: float = Field(0.0, alias="pcieReplaysPerSecond", ge=0)


class CliqueEntry(_Model):
    cluster_uuid: str = Field(alias="clusterUuid")
    clique_id: int = Field(alias="cliqueId", ge=0)


class DeviceInUse(_Model):
    device_id: str = Field(alias="deviceId")
    index: int | None = Field(None, ge=0)
    namespace: str
    pod: str
    container: str


class NumaNodeEntry(_Model):
    id: int = Field(ge=0)
    cpus: str = Field("", description="the NUMA node's CPUs (sysfs cpulist, e.g. 0-27,56-83)")
    allocatable_cpus: str = Field(
        "",
        alias="allocatableCpus",
        description="its CPUs the kubelet may hand out exclusively (PodResources GetAllocatableResources)",
    )
    cpus_in_use: str = Field(
        "", alias="cpusInUse", description="its CPUs containers hold exclusively (PodResources List)"
    )
    memory: int | None = Field(
        None, ge=0, description="allocatable memory, bytes (only where memoryManagerPolicy is Static)"
    )
    memory_in_use: int = Field(0, alias="memoryInUse", ge=0, description="memory containers hold, bytes")


class KubeletEntry(_Model):
    topology_manager_policy: TopologyPolicy = Field(
        TopologyPolicy.NONE,
        alias="topologyManagerPolicy",
        description="the kubelet's topologyManagerPolicy: none, best-effort, restricted or single-numa-node",
    )
    topology_manager_scope: TopologyScope = Field(
        TopologyScope.CONTAINER, alias="topologyManagerScope", description="container or pod"
    )
    cpu_manager_policy: CpuPolicy = Field(
        CpuPolicy.NONE, alias="cpuManagerPolicy", description="none or static"
    )
    memory_manager_policy: MemoryPolicy = Field(
        MemoryPolicy.NONE, alias="memoryManagerPolicy", description="None or Static"
    )
    numa_nodes: list[NumaNodeEntry] = Field(
        default_factory=list, alias="numaNodes", json_schema_extra=_list("map", "id")
    )

    def alignment(self) -> KubeletAlignment:
        """The pure-core view; ValueError naming the field for a CPU list that does not parse."""
        nodes = []
        for k, n in enumerate(self.numa_nodes):
            counts = []
            for name, text in (("allocatableCpus", n.allocatable_cpus), ("cpusInUse", n.cpus_in_use)):
                try:
                    counts.append(len(parse_cpu_ranges(text)))
                except TopologyError:
                    raise ValueError(
                        f"kubelet.numaNodes[{k}].{name}: expected CPU ranges like 0-27,56-83"
                    ) from None
            nodes.append(NumaNode(n.id, counts[0], counts[1], n.memory, n.memory_in_use))
        return KubeletAlignment(
            self.topology_manager_policy,
            self.topology_manager_scope,
            self.cpu_manager_policy,
            self.memory_manager_policy,
            tuple(nodes),
        )


class NodeTopologySpec(_Model):
    gpus: list[GpuEntry] = Field(json_schema_extra=_list("map", "index"))
    links: list[LinkEntry] = Field(
        description="one entry per unordered GPU pair", json_schema_extra=_list("atomic")
    )
    nics: list[NicEntry] = Field(default_factory=list, json_schema_extra=_list("map", "name"))
    health: list[HealthEntry] = Field(default_factory=list, json_schema_extra=_list("map", "index"))
    clique: CliqueEntry | None = Field(
        None, description="multi-node NVLink membership (nvidia.com/gpu.clique = clusterUuid.cliqueId)"
    )
    nvlink_gbps: float = Field(
        50.0, alias="nvlinkGbps", gt=0, description="bandwidth of one NVLink, GB/s, bidirectional (above 0)"
    )
    pcie_gbps: float = Field(
        64.0,
        alias="pcieGbps",
        gt=0,
        description="bandwidth of a GPU's PCIe slot, GB/s, bidirectional (above 0)",
    )
    model: str | None = None
    devices_in_use: list[DeviceInUse] = Field(
        default_factory=list,
        alias="devicesInUse",
        description="GPUs the kubelet has given to containers (from the PodResources API)",
        json_schema_extra=_list("atomic"),
    )
    allocatable_devices: list[str] = Field(
        default_factory=list,
        alias="allocatableDevices",
        description="device IDs the kubelet can allocate",
        json_schema_extra=_list("atomic"),
    )
    allocation: Allocation = Field(
        Allocation.DEVICE_PLUGIN,
        description="who picks a pod's GPUs: devicePlugin (the kubelet asks the NVIDIA device plugin) or dra",
    )
    kubelet: KubeletEntry | None = Field(
        None,
        description=(
            "what the kubelet aligns to NUMA nodes (Topology Manager, CPU and memory managers) and each "
            "NUMA node's CPUs and memory; absent when the agent could not read the kubelet's configuration"
        ),
    )
    source: Source

    def graph_dict(self) -> dict[str, Any]:
        keep = {"gpus", "links", "nics", "health", "clique", "nvlink_gbps", "pcie_gbps", "model"}
        return self.model_dump(by_alias=True, exclude_none=True, include=keep, mode="json")

    def to_graph(self) -> GpuGraph:
        """The GPU graph; :class:`TopologyError` for one that does not hold together."""
        return graph_from_dict(self.graph_dict(), "NodeTopology spec")

    def gpus_in_use(self) -> dict[str, frozenset[int]]:
        """GPU indices the kubelet gave each pod (``namespace/name``), from devicesInUse."""
        out: dict[str, set[int]] = {}
        for d in self.devices_in_use:
            if d.index is not None:
                out.setdefault(f"{d.namespace}/{d.pod}", set()).add(d.index)
        return {k: frozenset(v) for k, v in out.items()}


class NodeTopologyStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_list("map", "type"))
    observed_generation: int | None = Field(
        None, alias="observedGeneration", ge=0, description="the metadata.generation this status describes"
    )
    last_published: Rfc3339 | None = Field(None, alias="lastPublished")


class NodeTopologyObject(_Model):
    """A whole NodeTopology object."""

    api_version: str = Field(names.API_VERSION, alias="apiVersion")
    kind: str = "NodeTopology"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: NodeTopologySpec
    status: NodeTopologyStatus | None = None


# -- SliceReservation ---------------------------------------------------------------------


class SlotRequests(_Model):
    cpu_millis: NonNegativeInt = Field(0, alias="cpuMillis")
    memory_bytes: NonNegativeInt = Field(0, alias="memoryBytes")
    ephemeral_storage_bytes: NonNegativeInt = Field(0, alias="ephemeralStorageBytes")


class PodSlotEntry(_Model):
    pod_set: str = Field(alias="podSet", min_length=1)
    index: int = Field(ge=0)
    node: str = Field(min_length=1)
    gpus: list[NonNegativeInt] = Field(
        description="GPU indices on the node", json_schema_extra=_list("atomic")
    )
    numa_nodes: list[NonNegativeInt] = Field(
        default_factory=list, alias="numaNodes", json_schema_extra=_list("atomic")
    )
    nic: str | None = Field(None, json_schema_extra={"nullable": True})
    requests: SlotRequests = Field(
        default_factory=lambda: SlotRequests.model_validate({}),
        description="what the pod requests of the node besides GPUs, held with the slot until it binds",
    )


class CostEntry(_Model):
    per_layer_micros: float = Field(alias="perLayerMicros", ge=0)
    pod_sets: dict[str, NonNegativeFloat] = Field(alias="podSets")


class SliceEntry(_Model):
    gang: str = Field(min_length=1)
    pods: list[PodSlotEntry] = Field(
        description="one slot per pod of the gang", json_schema_extra=_list("atomic")
    )
    cost: CostEntry
    score: float = 0.0
    domains: dict[str, str] = Field(
        default_factory=dict, description="pod set -> the domain it landed in (leaf leaf-3, node n1)"
    )
    notes: list[str] = Field(default_factory=list)
    mnnvl_nodes: list[str] = Field(default_factory=list, alias="mnnvlNodes")


class SliceReservationSpec(_Model):
    gang: str = Field(min_length=1, description="the gang key, <namespace>/<name>")
    slice: SliceEntry
    expires_at: float = Field(
        alias="expiresAt", ge=0, description="unix seconds; the hold lapses then unless every pod has bound"
    )
    bound: dict[str, str] = Field(
        default_factory=dict, description="slot key (podSet/index) -> pod name", json_schema_extra=_ATOMIC_MAP
    )
    phase: Phase = Field(
        Phase.RESERVED,
        description="the ledger's own record, read back on restart; people read status.phase",
        json_schema_extra={"crdDefault": Phase.RESERVED.value},
    )
    meta: dict[str, str] = Field(
        default_factory=dict,
        description="adapter data kept with the reservation (owner, attempt)",
        json_schema_extra=_ATOMIC_MAP,
    )


class SlotStatus(_Model):
    """One slot as people read it: where it is, who holds it, its ResourceClaim on DRA nodes."""

    name: str = Field(description="slot key, podSet/index")
    node: str
    gpus: str = Field(description="GPU indices, e.g. 4-7")
    pod: str | None = Field(None, description="the pod bound to it")
    claim: str | None = Field(None, description="the ResourceClaim that pins its GPUs (DRA nodes)")


class SliceReservationStatus(_Model):
    phase: Phase | None = None
    bound_pods: dict[str, str] = Field(
        default_factory=dict,
        alias="boundPods",
        description="slot key (podSet/index) -> pod name",
        json_schema_extra=_ATOMIC_MAP,
    )
    nodes: str | None = Field(None, description="nodes of the slice, comma-separated")
    gpus: int | None = Field(None, ge=0)
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_list("map", "type"))
    slots: list[SlotStatus] = Field(default_factory=list, json_schema_extra=_list("map", "name"))


class SliceReservationObject(_Model):
    """A whole SliceReservation object."""

    api_version: str = Field(names.API_VERSION, alias="apiVersion")
    kind: str = "SliceReservation"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SliceReservationSpec
    status: SliceReservationStatus | None = None


# -- reading NodeTopology -----------------------------------------------------------------


@dataclass(frozen=True)
class NodeTopology:
    """What the cache keeps of a NodeTopology: the graph (None when the agent found no
    GPUs) and the GPUs the kubelet reports in use, by pod key."""

    node: str
    graph: GpuGraph | None
    in_use: Mapping[str, frozenset[int]] = field(default_factory=dict)
    allocation: Allocation = Allocation.DEVICE_PLUGIN
    kubelet: KubeletAlignment | None = None


def first_problem(err: ValidationError, prefix: str) -> tuple[str, str]:
    """(field path, problem) of a validation error's first entry; the problem says how
    many more there are."""
    errors = err.errors()
    e = errors[0]
    loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return loc, f"{e['msg']}{more}"


def parse_node_topology(obj: Mapping[str, Any]) -> NodeTopology:
    """Read a NodeTopology object; :class:`CrdError` naming the field when it cannot be used."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise CrdError("NodeTopology without metadata.name", "metadata.name", "missing")
    where = f"NodeTopology {name}"
    raw = obj.get("spec")
    if not isinstance(raw, Mapping):
        raise CrdError(f"{where}: no spec", "spec", "missing")
    try:
        spec = NodeTopologySpec.model_validate(raw)
    except ValidationError as err:
        loc, problem = first_problem(err, "spec")
        raise CrdError(f"{where}: {loc}: {problem}", loc, problem) from None
    kubelet = None
    if spec.kubelet is not None:
        try:
            kubelet = spec.kubelet.alignment()
        except ValueError as exc:
            loc, _, problem = str(exc).partition(": ")
            raise CrdError(f"{where}: spec.{loc}: {problem}", f"spec.{loc}", problem) from None
    if spec.source is Source.NONE or not spec.gpus:
        return NodeTopology(name, None, allocation=spec.allocation, kubelet=kubelet)
    try:
        graph = spec.to_graph()
    except TopologyError as exc:
        problem = str(exc).removeprefix("NodeTopology spec: ")
        raise CrdError(f"{where}: {problem}", "spec", problem) from None
    return NodeTopology(name, graph, spec.gpus_in_use(), spec.allocation, kubelet)


# -- SliceReservation objects -------------------------------------------------------------


_NAME_BAD = re.compile(r"[^a-z0-9.-]+")


def object_name(gang: str) -> str:
    """A SliceReservation name for a gang key: the part after the namespace, made a valid
    DNS subdomain (lower case, ``[a-z0-9.-]``, at most 253 characters)."""
    base = gang.split("/", 1)[-1].lower()
    base = _NAME_BAD.sub("-", base).strip("-.") or "gang"
    return base[:253].rstrip("-.") or "gang"


def gang_namespace(gang: str) -> str:
    return gang.split("/", 1)[0] if "/" in gang else "default"


def reservation_object(r: Reservation) -> dict[str, Any]:
    """The SliceReservation for a reservation; namespace and name come from its meta."""
    namespace = r.meta.get("namespace") or gang_namespace(r.gang)
    name = r.meta.get("name") or object_name(r.gang)
    return {
        "apiVersion": names.API_VERSION,
        "kind": "SliceReservation",
        "metadata": {"name": name, "namespace": namespace, "labels": {names.GANG: object_name(r.gang)}},
        "spec": r.to_dict(),
    }


def reservation_from_object(obj: Mapping[str, Any]) -> Reservation:
    """The reservation a SliceReservation holds, with its object's namespace/name in meta."""
    meta = as_map(obj.get("metadata"))
    where = f"SliceReservation {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise CrdError(f"{where}: no spec")
    try:
        r = Reservation.from_dict(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise CrdError(f"{where}: spec does not hold a reservation: {exc!r}") from None
    extra = {k: str(meta[k]) for k in ("namespace", "name") if isinstance(meta.get(k), str)}
    if "namespace" in extra and gang_namespace(r.gang) != extra["namespace"]:
        # Whoever may write SliceReservations in one namespace holds nothing for another's gangs.
        raise CrdError(
            f"{where}: spec.gang {r.gang!r} is a gang of namespace {gang_namespace(r.gang)!r}, "
            "not of the object's own"
        )
    if not extra:
        return r
    return Reservation(r.gang, r.slice, r.expires_at, r.bound, r.phase, {**r.meta, **extra})


#: The condition every SliceReservation status carries: True while the slice is held.
def claim_name(reservation_name: str, slot: PodSlot) -> str:
    """``<reservation>-<pod set>-<index>``, a DNS subdomain name (lower case, at most 253): the
    ResourceClaim of a slot (:mod:`extender.kube.slot_claims`)."""
    raw = f"{reservation_name}-{slot.pod_set}-{slot.index}".lower()
    cleaned = re.sub(r"[^a-z0-9.-]+", "-", raw).strip("-.")
    return cleaned[:253].rstrip("-.")


HELD_CONDITION = "Held"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reservation_status(
    r: Reservation,
    now: float,
    previous: Mapping[str, Any] | None = None,
    mismatches: Sequence[DeviceMismatch] = (),
) -> dict[str, Any]:
    """The ``status`` of ``r``'s SliceReservation. ``previous`` is the status written before:
    each condition keeps its lastTransitionTime while its status does not change, so an
    unchanged reservation yields an equal dict (and needs no write). ``mismatches``: its
    bound pods the kubelet reports holding other GPUs than promised (the ``DevicesMismatch``
    condition, see :mod:`extender.kube.devices`)."""
    sl = r.slice
    held = "True" if r.phase in (Phase.RESERVED, Phase.BOUND) else "False"
    since = rfc3339(now)
    for c in (previous or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == HELD_CONDITION and c.get("status") == held:
            since = str(c.get("lastTransitionTime") or since)
    message = (
        f"{len(r.bound)} of {len(sl.slots)} pods bound on {len(sl.nodes)} node(s), "
        f"{sl.per_layer_micros:.1f} us/layer"
    )
    slots = []
    for slot in sl.slots:
        entry = {"name": slot.key, "node": slot.node, "gpus": index_ranges(slot.gpus) or "-"}
        if slot.key in r.bound:
            entry["pod"] = r.bound[slot.key]
        if r.meta.get(names.META_SLOT_CLAIMS) == "true":
            entry["claim"] = claim_name(str(r.meta.get("name") or object_name(r.gang)), slot)
        slots.append(entry)
    conditions = [
        {
            "type": HELD_CONDITION,
            "status": held,
            "reason": r.phase.value,
            "message": message,
            "lastTransitionTime": since,
        }
    ]
    devices = devices_condition(mismatches, previous, rfc3339(now))
    if devices is not None:
        conditions.append(devices)
    return {
        "phase": r.phase.value,
        "boundPods": dict(r.bound),
        "slots": slots,
        "nodes": ",".join(sl.nodes),
        "gpus": sl.gpus,
        "conditions": conditions,
    }
