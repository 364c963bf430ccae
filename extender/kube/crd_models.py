"""The gangslice custom resources as Python: ``NodeTopology`` and ``SliceReservation``.

``NodeTopology`` (``nodetopologies.gangslice.io/v1alpha1``, cluster-scoped, one per node,
named after the node) is written by the node agent (see :mod:`extender.agent.publish` for
the full contract); its spec is the GPU graph in the shape of
:func:`extender.topology.serialize.graph_to_dict` plus what the kubelet reports::

    spec:
      gpus: [{index, uuid?, pciBusId?, numaNode?, cpuAffinity? ("0-47,96-143"), name?}]
      links: [{a, b, link}]              # NV18 | PIX | PXB | PHB | NODE | SYS
      nics: [{name, numaNode?, gpuLinks: {"0": PIX}}]
      health: [{index, healthy, reason?, nvlinkErrorsPerSecond?, pcieReplaysPerSecond?}]
      clique: {clusterUuid, cliqueId}    # optional
      nvlinkGbps, pcieGbps, model        # optional
      devicesInUse: [{deviceId, index?, namespace, pod, container}]
      allocatableDevices: [<device id>]
      source: nvml | nvidia-smi | none   # none: no GPUs discovered (empty graph)

``SliceReservation`` (``slicereservations.gangslice.io/v1alpha1``, namespaced) has as spec
exactly the ledger's ``Reservation.to_dict()`` (``gang``, ``slice``, ``expiresAt``,
``bound``, ``phase``, ``meta``), so ``Reservation.from_dict(obj["spec"])`` reads it back; a
restart rebuilds the ledger from spec alone. Its ``status`` (:func:`reservation_status`) is what
people and kubectl read: phase, which pod holds which slot, nodes, GPU count and a ``Held``
condition. Whoever writes the object writes its status too, through the ``/status``
subresource, and again whenever a slot binds or is freed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extender.kube import names
from extender.placement.ledger import Phase, Reservation
from extender.topology.model import GpuGraph, TopologyError
from extender.topology.serialize import graph_from_dict


class CrdError(ValueError):
    """A custom resource that cannot be used; the message names the object and the field."""


class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class GpuSpec(_Spec):
    index: int = Field(ge=0)
    uuid: str | None = None
    pci_bus_id: str | None = Field(None, alias="pciBusId")
    numa_node: int | None = Field(None, alias="numaNode")
    cpu_affinity: str | None = Field(None, alias="cpuAffinity")
    name: str | None = None


class LinkSpec(_Spec):
    a: int = Field(ge=0)
    b: int = Field(ge=0)
    #: The ``nvidia-smi topo -m`` cell: NV<n>, PIX, PXB, PHB, NODE or SYS.
    link: str


class NicSpec(_Spec):
    name: str
    numa_node: int | None = Field(None, alias="numaNode")
    gpu_links: dict[str, str] = Field(default_factory=dict, alias="gpuLinks")


class HealthSpec(_Spec):
    index: int = Field(ge=0)
    healthy: bool = True
    reason: str | None = None
    nvlink_errors_per_second: float = Field(0.0, alias="nvlinkErrorsPerSecond")
    pcie_replays_per_second: float = Field(0.0, alias="pcieReplaysPerSecond")


class CliqueSpec(_Spec):
    cluster_uuid: str = Field(alias="clusterUuid")
    clique_id: int = Field(alias="cliqueId")


class DeviceInUse(_Spec):
    device_id: str = Field(alias="deviceId")
    index: int | None = None
    namespace: str
    pod: str
    container: str = ""


class NodeTopologySpec(_Spec):
    gpus: list[GpuSpec] = Field(default_factory=list)
    links: list[LinkSpec] = Field(default_factory=list)
    nics: list[NicSpec] = Field(default_factory=list)
    health: list[HealthSpec] = Field(default_factory=list)
    clique: CliqueSpec | None = None
    nvlink_gbps: float = Field(50.0, alias="nvlinkGbps", gt=0)
    pcie_gbps: float = Field(64.0, alias="pcieGbps", gt=0)
    model: str | None = None
    devices_in_use: list[DeviceInUse] = Field(default_factory=list, alias="devicesInUse")
    allocatable_devices: list[str] = Field(default_factory=list, alias="allocatableDevices")
    source: str = "nvml"

    def graph_dict(self) -> dict[str, Any]:
        keep = {"gpus", "links", "nics", "health", "clique", "nvlink_gbps", "pcie_gbps", "model"}
        return self.model_dump(by_alias=True, exclude_none=True, include=keep)

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


@dataclass(frozen=True)
class NodeTopology:
    """What the cache keeps of a NodeTopology: the graph (None when the agent found no
    GPUs) and the GPUs the kubelet reports in use, by pod key."""

    node: str
    graph: GpuGraph | None
    in_use: Mapping[str, frozenset[int]] = field(default_factory=dict)


def parse_node_topology(obj: Mapping[str, Any]) -> NodeTopology:
    """Read a NodeTopology object; :class:`CrdError` when it cannot be used."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise CrdError("NodeTopology without metadata.name")
    where = f"NodeTopology {name}"
    raw = obj.get("spec")
    if not isinstance(raw, Mapping):
        raise CrdError(f"{where}: no spec")
    try:
        spec = NodeTopologySpec.model_validate(raw)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        raise CrdError(f"{where}: spec.{loc}: {e['msg']}") from None
    if spec.source == "none" or not spec.gpus:
        return NodeTopology(name, None)
    try:
        graph = spec.to_graph()
    except TopologyError as exc:
        raise CrdError(f"{where}: {exc}") from None
    return NodeTopology(name, graph, spec.gpus_in_use())


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
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    where = f"SliceReservation {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise CrdError(f"{where}: no spec")
    try:
        r = Reservation.from_dict(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise CrdError(f"{where}: spec does not hold a reservation: {exc!r}") from None
    extra = {k: str(meta[k]) for k in ("namespace", "name") if isinstance(meta.get(k), str)}
    if not extra:
        return r
    return Reservation(r.gang, r.slice, r.expires_at, r.bound, r.phase, {**r.meta, **extra})


#: The condition every SliceReservation status carries: True while the slice is held.
HELD_CONDITION = "Held"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reservation_status(
    r: Reservation, now: float, previous: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``status`` of ``r``'s SliceReservation. ``previous`` is the status written before:
    the ``Held`` condition keeps its lastTransitionTime while its status does not change, so
    an unchanged reservation yields an equal dict (and needs no write)."""
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
    return {
        "phase": r.phase.value,
        "boundPods": dict(r.bound),
        "nodes": ",".join(sl.nodes),
        "gpus": sl.gpus,
        "conditions": [
            {
                "type": HELD_CONDITION,
                "status": held,
                "reason": r.phase.value,
                "message": message,
                "lastTransitionTime": since,
            }
        ],
    }
