"""Pydantic models of the two gangslice custom resources, field for field as the CRDs in
``manifests/crds/`` declare them (a unit test holds the two together).

``NodeTopology.spec`` is :func:`extender.topology.serialize.graph_to_dict` plus
``devicesInUse``, ``allocatableDevices`` and ``source`` (the node agent's
:func:`extender.agent.publish.build_spec`; the cluster cache reads it with the lenient
:mod:`extender.kube.crd_models`). ``SliceReservation.spec`` is the
ledger's ``Reservation.to_dict()``; its ``status`` is a mirror for people and kubectl.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from extender.kube.names import API_VERSION
from extender.placement.ledger import Phase


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
        None, alias="cpuAffinity", pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"
    )
    name: str | None = None


class LinkEntry(_Model):
    a: int = Field(ge=0)
    b: int = Field(ge=0)
    link: str = Field(pattern=r"^(NV[0-9]+|PIX|PXB|PHB|NODE|SYS|SOC)$")


class NicEntry(_Model):
    name: str
    numa_node: int | None = Field(None, alias="numaNode", ge=-1)
    gpu_links: dict[str, PcieName] = Field(default_factory=dict, alias="gpuLinks")


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


class NodeTopologySpec(_Model):
    gpus: list[GpuEntry]
    links: list[LinkEntry]
    nics: list[NicEntry] = Field(default_factory=list)
    health: list[HealthEntry] = Field(default_factory=list)
    clique: CliqueEntry | None = None
    nvlink_gbps: float = Field(50.0, alias="nvlinkGbps", ge=0)
    pcie_gbps: float = Field(64.0, alias="pcieGbps", ge=0)
    model: str | None = None
    devices_in_use: list[DeviceInUse] = Field(default_factory=list, alias="devicesInUse")
    allocatable_devices: list[str] = Field(default_factory=list, alias="allocatableDevices")
    source: Source


class NodeTopologyStatus(_Model):
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = Field(None, alias="observedGeneration", ge=0)
    last_published: Rfc3339 | None = Field(None, alias="lastPublished")


class NodeTopology(_Model):
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = "NodeTopology"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: NodeTopologySpec
    status: NodeTopologyStatus | None = None


# -- SliceReservation ---------------------------------------------------------------------


class PodSlotEntry(_Model):
    pod_set: str = Field(alias="podSet", min_length=1)
    index: int = Field(ge=0)
    node: str = Field(min_length=1)
    gpus: list[NonNegativeInt]
    numa_nodes: list[NonNegativeInt] = Field(default_factory=list, alias="numaNodes")
    nic: str | None = None


class CostEntry(_Model):
    per_layer_micros: float = Field(alias="perLayerMicros", ge=0)
    pod_sets: dict[str, NonNegativeFloat] = Field(alias="podSets")


class SliceEntry(_Model):
    gang: str = Field(min_length=1)
    pods: list[PodSlotEntry]
    cost: CostEntry
    score: float = 0.0
    domains: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    mnnvl_nodes: list[str] = Field(default_factory=list, alias="mnnvlNodes")


class SliceReservationSpec(_Model):
    gang: str = Field(min_length=1)
    slice: SliceEntry
    expires_at: float = Field(alias="expiresAt", ge=0)
    bound: dict[str, str] = Field(default_factory=dict)
    phase: Phase = Phase.RESERVED
    meta: dict[str, str] = Field(default_factory=dict)


class SliceReservationStatus(_Model):
    phase: Phase | None = None
    bound_pods: dict[str, str] = Field(default_factory=dict, alias="boundPods")
    nodes: str | None = None
    gpus: int | None = Field(None, ge=0)
    conditions: list[Condition] = Field(default_factory=list)


class SliceReservation(_Model):
    api_version: str = Field(API_VERSION, alias="apiVersion")
    kind: str = "SliceReservation"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SliceReservationSpec
    status: SliceReservationStatus | None = None
