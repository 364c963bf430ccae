"""Cluster and gang files (YAML): a stable contract other tools and tests read.

Cluster file::

    levels: [fabric.topograph.run/tier-1, fabric.topograph.run/tier-0]   # optional
    network: {nicGbps: 100, oversubscription: 2}                         # optional
    nodes:
      - name: h100
        count: 16                       # optional: h100-0 .. h100-15, same labels
        labels: {fabric.topograph.run/tier-0: leaf-1}
        gpuTopology: hgx-h100           # a preset, or an nvidia-smi topo -m file (relative path)
        allocatedGpus: [0, 1]           # optional
        unhealthyGpus: []               # optional
        taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]   # optional
        unschedulable: false            # optional: cordoned
        allocatable: {cpu: "192", memory: 2Ti, ephemeral-storage: 7Ti, pods: 110}   # optional
        requested: {cpu: "8", memory: 64Gi, pods: 3}   # optional: what pods there already request
        kubelet:                        # optional: what the node's kubelet aligns to NUMA nodes
          topologyManagerPolicy: single-numa-node   # none | best-effort | restricted | single-numa-node
          topologyManagerScope: container           # container | pod
          cpuManagerPolicy: static                  # none | static
          memoryManagerPolicy: None                 # None | Static
          numaNodes:                    # allocatable CPUs (and memory, Static) per NUMA node
            - {id: 0, cpus: 56, cpusInUse: 0, memory: 512Gi, memoryInUse: 0}

Gang file::

    name: llama-70b
    podSets:
      - name: server
        count: 1
        gpusPerPod: 8
        comm: allreduce                 # allreduce | alltoall | pipeline | kv-transfer | none
        requiredLevel: node             # optional
        preferredLevel: nvlink          # optional
        colocateWith: {podSet: prefill, level: leaf}   # optional; a bare name means level node
        model: {hiddenSize: 8192, bytesPerElement: 2, tokens: 128, parameters: 70.6B}   # parameters,
                                        # activeParameters (MoE): the step's compute time
        nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}   # optional, as a pod's
        nodeAffinity:                   # optional: required node affinity match expressions
          - {key: nvidia.com/gpu.memory, operator: Gt, values: ["80000"]}
        nodeSelectorTerms:              # optional: a pod's required nodeSelectorTerms (any one)
          - matchExpressions: [{key: pool, operator: In, values: [a, b]}]
            matchFields: [{key: metadata.name, operator: NotIn, values: [n7]}]
        preferredNodeAffinity:          # optional: a tie-break among equally good slices
          - {weight: 50, preference: {matchExpressions: [{key: disk, operator: In, values: [nvme]}]}}
        tolerations:                    # optional, as a pod's
          - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        requests: {cpu: "16", memory: 256Gi, ephemeral-storage: 100Gi}   # optional, per pod
        guaranteed: false               # optional: Guaranteed QoS (requests equal limits)

Node facts and a pod set's requirements are judged as kube-scheduler's NodeUnschedulable,
TaintToleration, NodeAffinity and NodeResourcesFit filters judge them
(:mod:`extender.placement.feasibility`). A node without ``allocatable`` (or without one of
its resources) is not limited in that resource.

Bounds. Both files are read as :mod:`extender.placement.reading` reads every file (at most
16 MiB of UTF-8 YAML, nested at most 64 levels, at most 1,000,000 values with aliases
expanded). Their values are bounded far above any real fleet or model and low enough that a
slip (``count: 1000000000``) is refused at once, the bound named in the message, instead of
running for minutes; the bounds are :data:`LIMITS`:

- a cluster file has at most 100,000 nodes (each ``count`` expanded); a GPU index is at most
  1023; ``nicGbps`` at most 10,000 and ``oversubscription`` at most 1,000; a NUMA node's
  ``id`` at most 1023 and its ``cpus`` at most 65,536;
- a gang has at most 64 pod sets and 10,000 pods; a pod at most 64 GPUs;
- a model: ``hiddenSize`` at most 1,048,576, ``tokens`` 16,777,216, ``layers`` 10,000,
  ``kvHeads`` and ``headDim`` 65,536, ``expertsPerToken`` 1,024, ``bytesPerElement`` 16,
  ``parameters`` 10^15;
- quantities (``cpu``, ``memory``, ``pods``, sizes) fit Kubernetes' 64-bit integers;
- counts are whole numbers written as such (``8``, not ``8.0``, ``"8"`` or ``true``), and no
  number is ``.nan`` or ``.inf``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from extender.cost import Comm, ModelDims
from extender.placement import quantities
from extender.placement.feasibility import NOTHING, NodeFacts, Resources, Taint
from extender.placement.reading import FileError as FileError
from extender.placement.reading import load_yaml, read_text, shown
from extender.placement.request import (
    Colocation,
    GangRequest,
    NodeRequirement,
    NodeTerm,
    PodRequests,
    PodSet,
    PreferredTerm,
    Toleration,
)
from extender.placement.scoring import LevelError, resolve_level
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import HOSTNAME_LABEL, Hierarchy, HierarchyError, NetworkModel, parse_levels
from extender.topology.kubelet import (
    CpuPolicy,
    KubeletAlignment,
    MemoryPolicy,
    NumaNode,
    TopologyPolicy,
    TopologyScope,
)
from extender.topology.model import GpuGraph, TopologyError

# -- bounds ------------------------------------------------------------------------------

#: The most a cluster file or a gang file may say, by what is bounded (the module docstring
#: gives the reasons; ``python -m extender.docs`` lists them in docs/reference.md).
LIMITS: dict[str, int] = {
    "nodes in a cluster file (each count expanded)": 100_000,
    "a GPU index (allocatedGpus, unhealthyGpus)": 1023,
    "network.nicGbps": 10_000,
    "network.oversubscription": 1_000,
    "a NUMA node's id": 1023,
    "a NUMA node's cpus": 65_536,
    "pod sets in a gang": 64,
    "pods in a gang (all pod sets)": 10_000,
    "gpusPerPod": 64,
    "model.hiddenSize": 2**20,
    "model.tokens": 2**24,
    "model.layers": 10_000,
    "model.kvHeads, model.headDim": 65_536,
    "model.expertsPerToken": 1_024,
    "model.bytesPerElement": 16,
    "model.parameters, model.activeParameters": 10**15,
    "a quantity (cpu in thousandths, memory and sizes in bytes, pods)": 2**63 - 1,
}
MAX_NODES = LIMITS["nodes in a cluster file (each count expanded)"]
MAX_GPU_INDEX = LIMITS["a GPU index (allocatedGpus, unhealthyGpus)"]
MAX_NUMA_ID = LIMITS["a NUMA node's id"]
MAX_POD_SETS = LIMITS["pod sets in a gang"]
MAX_PODS = LIMITS["pods in a gang (all pod sets)"]
MAX_GPUS_PER_POD = LIMITS["gpusPerPod"]
MAX_QUANTITY = LIMITS["a quantity (cpu in thousandths, memory and sizes in bytes, pods)"]

#: A count: a whole number as written (not 8.0, "8" or true, which pydantic would take).
Whole = Annotated[int, Strict()]


def _not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {str(v).lower()}")
    return v


#: A number: an integer or a decimal (``1e3`` too, which YAML reads as text), not true or false.
Number = Annotated[float, BeforeValidator(_not_bool)]
GpuIndex = Annotated[int, Strict(), Field(ge=0, le=MAX_GPU_INDEX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    hidden_size: Whole = Field(8192, alias="hiddenSize", gt=0, le=LIMITS["model.hiddenSize"])
    bytes_per_element: Whole = Field(2, alias="bytesPerElement", gt=0, le=LIMITS["model.bytesPerElement"])
    tokens: Whole = Field(128, gt=0, le=LIMITS["model.tokens"])
    layers: Whole = Field(80, gt=0, le=LIMITS["model.layers"])
    kv_heads: Whole = Field(8, alias="kvHeads", gt=0, le=LIMITS["model.kvHeads, model.headDim"])
    head_dim: Whole = Field(128, alias="headDim", gt=0, le=LIMITS["model.kvHeads, model.headDim"])
    experts_per_token: Whole = Field(8, alias="expertsPerToken", gt=0, le=LIMITS["model.expertsPerToken"])
    parameters: Number = Field(0.0, ge=0, le=LIMITS["model.parameters, model.activeParameters"])
    active_parameters: Number = Field(
        0.0, alias="activeParameters", ge=0, le=LIMITS["model.parameters, model.activeParameters"]
    )

    @field_validator("parameters", "active_parameters", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        """``70e9``, ``"70.6e9"`` (YAML reads a bare 70.6e9 as text) or ``"70.6B"``."""
        return parse_count(v)

    @model_validator(mode="after")
    def _active_within_total(self) -> ModelSpec:
        if self.parameters and self.active_parameters > self.parameters:
            raise ValueError(
                f"activeParameters ({self.active_parameters:g}) exceeds parameters ({self.parameters:g})"
            )
        return self

    def dims(self) -> ModelDims:
        return ModelDims(**self.model_dump())


_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(v: Any) -> Any:
    """A parameter count written as a number, ``"7.6e9"`` or with a suffix (``"671B"``,
    ``"37B"``, ``"500M"``); anything else is left for the field's own check to refuse."""
    if not isinstance(v, str):
        return v
    text = v.strip().replace("_", "")
    scale = _SUFFIX.get(text[-1:].upper(), 1.0) if text else 1.0
    if scale != 1.0:
        text = text[:-1]
    try:
        return float(text) * scale
    except ValueError:
        return v


class ColocateSpec(_Strict):
    pod_set: str = Field(alias="podSet")
    level: str = "node"


class RequirementSpec(_Strict):
    key: str = Field(min_length=1)
    operator: str
    values: list[str] = Field(default_factory=list)

    @field_validator("values", mode="before")
    @classmethod
    def _numbers_as_text(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        return [str(x) if isinstance(x, int) and not isinstance(x, bool) else x for x in v]


class TermSpec(_Strict):
    match_expressions: list[RequirementSpec] = Field(default_factory=list, alias="matchExpressions")
    match_fields: list[RequirementSpec] = Field(default_factory=list, alias="matchFields")

    def term(self) -> NodeTerm:
        return NodeTerm(
            tuple(NodeRequirement(r.key, r.operator, tuple(r.values)) for r in self.match_expressions),
            tuple(NodeRequirement(r.key, r.operator, tuple(r.values)) for r in self.match_fields),
        )


class PreferredSpec(_Strict):
    weight: Whole = Field(ge=1, le=100)
    preference: TermSpec


class TolerationSpec(_Strict):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @model_validator(mode="after")
    def _valid(self) -> TolerationSpec:
        Toleration(self.key, self.operator, self.value, self.effect)
        return self


class TaintSpec(_Strict):
    key: str = Field(min_length=1)
    value: str = ""
    effect: str

    @model_validator(mode="after")
    def _valid(self) -> TaintSpec:
        Taint(self.key, self.value, self.effect)
        return self


Quantity = str | int | float


def _quantity(v: Any) -> Any:
    if v is not None:
        quantities.whole(v)  # raises QuantityError (a ValueError) naming the value
    return v


def _cpu(v: Any) -> Any:
    if v is not None:
        quantities.milli(v)
    return v


class RequestsSpec(_Strict):
    cpu: Quantity = 0
    memory: Quantity = 0
    ephemeral_storage: Quantity = Field(0, alias="ephemeral-storage")

    _cpus = field_validator("cpu", mode="before")(_cpu)
    _quantities = field_validator("memory", "ephemeral_storage", mode="before")(_quantity)


class ResourcesSpec(_Strict):
    cpu: Quantity | None = None
    memory: Quantity | None = None
    ephemeral_storage: Quantity | None = Field(None, alias="ephemeral-storage")
    pods: Whole | None = Field(None, ge=0, le=MAX_QUANTITY)

    _cpus = field_validator("cpu", mode="before")(_cpu)
    _quantities = field_validator("memory", "ephemeral_storage", mode="before")(_quantity)

    def resources(self) -> Resources:
        return Resources(
            None if self.cpu is None else quantities.milli(self.cpu),
            None if self.memory is None else quantities.whole(self.memory),
            None if self.ephemeral_storage is None else quantities.whole(self.ephemeral_storage),
            self.pods,
        )


class PodSetSpec(_Strict):
    name: str
    count: Whole = Field(ge=1, le=MAX_PODS)
    gpus_per_pod: Whole = Field(alias="gpusPerPod", ge=0, le=MAX_GPUS_PER_POD)
    comm: Comm = Comm.NONE
    required_level: str | None = Field(None, alias="requiredLevel")
    preferred_level: str | None = Field(None, alias="preferredLevel")
    colocate_with: ColocateSpec | None = Field(None, alias="colocateWith")
    model: ModelSpec = Field(default_factory=lambda: ModelSpec.model_validate({}))
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    node_affinity: list[RequirementSpec] = Field(default_factory=list, alias="nodeAffinity")
    node_selector_terms: list[TermSpec] = Field(default_factory=list, alias="nodeSelectorTerms")
    preferred_node_affinity: list[PreferredSpec] = Field(default_factory=list, alias="preferredNodeAffinity")
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    requests: RequestsSpec = Field(default_factory=lambda: RequestsSpec.model_validate({}))
    guaranteed: bool = False

    def pod_requests(self) -> PodRequests:
        r = self.requests
        return PodRequests(
            quantities.milli(r.cpu),
            quantities.whole(r.memory),
            quantities.whole(r.ephemeral_storage),
            self.guaranteed,
        )

    def requirements(self) -> tuple[NodeRequirement, ...]:
        """``nodeSelector`` entries (each an ``In`` of one value), then the affinity's."""
        out = [NodeRequirement(k, "In", (v,)) for k, v in sorted(self.node_selector.items())]
        out += [NodeRequirement(r.key, r.operator, tuple(r.values)) for r in self.node_affinity]
        return tuple(out)

    @field_validator("colocate_with", mode="before")
    @classmethod
    def _bare_name(cls, v: Any) -> Any:
        return {"podSet": v} if isinstance(v, str) else v


class GangSpec(_Strict):
    name: str
    pod_sets: list[PodSetSpec] = Field(alias="podSets", min_length=1, max_length=MAX_POD_SETS)

    @model_validator(mode="after")
    def _pods(self) -> GangSpec:
        pods = sum(p.count for p in self.pod_sets)
        if pods > MAX_PODS:
            raise ValueError(f"{pods} pods in all; a gang has at most {MAX_PODS}")
        return self

    def request(self) -> GangRequest:
        return GangRequest(
            name=self.name,
            pod_sets=tuple(
                PodSet(
                    name=p.name,
                    count=p.count,
                    gpus_per_pod=p.gpus_per_pod,
                    comm=p.comm,
                    required_level=p.required_level,
                    preferred_level=p.preferred_level,
                    colocate_with=Colocation(p.colocate_with.pod_set, p.colocate_with.level)
                    if p.colocate_with
                    else None,
                    model=p.model.dims(),
                    node_selector=p.requirements(),
                    requests=p.pod_requests(),
                    affinity=tuple(t.term() for t in p.node_selector_terms),
                    preferred=tuple(
                        PreferredTerm(t.weight, t.preference.term()) for t in p.preferred_node_affinity
                    ),
                    tolerations=tuple(
                        Toleration(t.key, t.operator, t.value, t.effect) for t in p.tolerations
                    ),
                )
                for p in self.pod_sets
            ),
        )


def _bytes(v: Any) -> Any:
    """A size in bytes, or a Kubernetes quantity (``512Gi``)."""
    return quantities.whole(v) if isinstance(v, str) else v


class NumaNodeSpec(_Strict):
    id: Whole = Field(ge=0, le=MAX_NUMA_ID)
    cpus: Whole = Field(0, ge=0, le=LIMITS["a NUMA node's cpus"])
    cpus_in_use: Whole = Field(0, alias="cpusInUse", ge=0, le=LIMITS["a NUMA node's cpus"])
    memory: Whole | None = Field(None, ge=0, le=MAX_QUANTITY)
    memory_in_use: Whole = Field(0, alias="memoryInUse", ge=0, le=MAX_QUANTITY)

    @field_validator("memory", "memory_in_use", mode="before")
    @classmethod
    def _sizes(cls, v: Any) -> Any:
        return _bytes(v)


class KubeletSpec(_Strict):
    topology_manager_policy: TopologyPolicy = Field(TopologyPolicy.NONE, alias="topologyManagerPolicy")
    topology_manager_scope: TopologyScope = Field(TopologyScope.CONTAINER, alias="topologyManagerScope")
    cpu_manager_policy: CpuPolicy = Field(CpuPolicy.NONE, alias="cpuManagerPolicy")
    memory_manager_policy: MemoryPolicy = Field(MemoryPolicy.NONE, alias="memoryManagerPolicy")
    numa_nodes: list[NumaNodeSpec] = Field(default_factory=list, alias="numaNodes")

    def alignment(self) -> KubeletAlignment:
        return KubeletAlignment(
            self.topology_manager_policy,
            self.topology_manager_scope,
            self.cpu_manager_policy,
            self.memory_manager_policy,
            tuple(NumaNode(n.id, n.cpus, n.cpus_in_use, n.memory, n.memory_in_use) for n in self.numa_nodes),
        )


class NodeSpec(_Strict):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_topology: str = Field(alias="gpuTopology")
    allocated_gpus: list[GpuIndex] = Field(default_factory=list, alias="allocatedGpus")
    unhealthy_gpus: list[GpuIndex] = Field(default_factory=list, alias="unhealthyGpus")
    count: Whole | None = Field(None, ge=1, le=MAX_NODES)
    allocation: Allocation = Allocation.DEVICE_PLUGIN
    taints: list[TaintSpec] = Field(default_factory=list)
    unschedulable: bool = False
    allocatable: ResourcesSpec | None = None
    requested: ResourcesSpec | None = None

    def facts(self) -> NodeFacts:
        return NodeFacts(
            tuple(Taint(t.key, t.value, t.effect) for t in self.taints),
            self.unschedulable,
            self.allocatable.resources() if self.allocatable else Resources(),
            NOTHING.plus(self.requested.resources()) if self.requested else NOTHING,
        )

    kubelet: KubeletSpec | None = None


class NetworkSpec(_Strict):
    nic_gbps: Number = Field(100.0, alias="nicGbps", gt=0, le=LIMITS["network.nicGbps"])
    oversubscription: Number = Field(2.0, ge=1, le=LIMITS["network.oversubscription"])


class ClusterSpec(_Strict):
    levels: list[str | dict[str, Any]] | None = None
    network: NetworkSpec = Field(default_factory=lambda: NetworkSpec.model_validate({}))
    nodes: list[NodeSpec] = Field(min_length=1, max_length=MAX_NODES)

    @model_validator(mode="after")
    def _nodes(self) -> ClusterSpec:
        nodes = sum(1 if n.count is None else n.count for n in self.nodes)
        if nodes > MAX_NODES:
            raise ValueError(
                f"{nodes} nodes in all, each count expanded; a cluster file has at most {MAX_NODES}"
            )
        return self


def _known_fields(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names (as written in files) of the model found at ``loc`` under ``model``."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next(
            (f for name, f in model.model_fields.items() if part in (name, f.alias)),
            None,
        )
        if field is None:
            return []
        inner = field.annotation
        for arg in (*getattr(inner, "__args__", ()), inner):
            for sub in (*getattr(arg, "__args__", ()), arg):
                if isinstance(sub, type) and issubclass(sub, BaseModel):
                    model = sub
                    break
            else:
                continue
            break
    return [f.alias or name for name, f in model.model_fields.items()]


def _first_error(where: str, err: ValidationError, model: type[BaseModel] | None = None) -> FileError:
    """The error to report: an unknown field before anything else (a misspelt field also
    shows up as the real one missing), with the known field it is closest to."""
    errors = err.errors()
    e = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) if len(str(p)) <= 60 else shown(p) for p in e["loc"]) or "(top level)"
    if e["type"] == "extra_forbidden" and model is not None:
        known = _known_fields(model, tuple(e["loc"]))
        close = difflib.get_close_matches(str(e["loc"][-1]), known, n=1)
        hint = f"; did you mean {close[0]}?" if close else (f"; known: {', '.join(known)}" if known else "")
        return FileError(f"{where}: field {loc}: unknown field{hint}")
    return FileError(f"{where}: field {loc}: {e['msg']}")


def _level_fields(ps: PodSet) -> list[tuple[str, str]]:
    """The (field, level name) pairs of a pod set that name a level."""
    named = [("requiredLevel", ps.required_level), ("preferredLevel", ps.preferred_level)]
    if ps.colocate_with is not None:
        named.append(("colocateWith.level", ps.colocate_with.level))
    return [(field, level) for field, level in named if level is not None]


def check_levels(gang: GangRequest, hierarchy: Hierarchy, where: str = "gang") -> None:
    """Every level the gang names must be one of ``hierarchy``'s (or ``node``, or an in-node
    level); the error names the field, which a solver's error cannot."""
    for i, ps in enumerate(gang.pod_sets):
        for field, level in _level_fields(ps):
            try:
                resolve_level(level, hierarchy)
            except LevelError as exc:
                raise FileError(f"{where}: podSets[{i}].{field}: {exc}") from None


def _check_gpus(spec: GangSpec, where: str) -> None:
    """GPU-less pods exist only as helpers next to GPU pods (a router beside its decode
    set): a gang asks for GPUs, and a pod set without them names the set it sits with."""
    if all(p.gpus_per_pod == 0 for p in spec.pod_sets):
        raise FileError(
            f"{where}: podSets: every pod set has gpusPerPod: 0; a gang without GPUs is the "
            "default scheduler's to place, not gangslice's"
        )
    for i, p in enumerate(spec.pod_sets):
        if p.gpus_per_pod == 0 and p.colocate_with is None:
            raise FileError(
                f"{where}: podSets[{i}].gpusPerPod: 0 GPUs, and no colocateWith: a pod set without "
                "GPUs must name the pod set it sits next to"
            )


def gang_from_data(data: Any, where: str = "gang", hierarchy: Hierarchy | None = None) -> GangRequest:
    """A gang from gang-file content; with ``hierarchy`` (the cluster's), its level names are
    checked too."""
    if not isinstance(data, dict):
        raise FileError(f"{where}: expected a mapping with name and podSets")
    try:
        spec = GangSpec.model_validate(data)
    except ValidationError as err:
        raise _first_error(where, err, GangSpec) from None
    _check_gpus(spec, where)
    try:
        gang = spec.request()
    except ValueError as exc:
        raise FileError(f"{where}: {exc}") from None
    if hierarchy is not None:
        check_levels(gang, hierarchy, where)
    return gang


def load_gang(path: str | Path, hierarchy: Hierarchy | None = None) -> GangRequest:
    p = Path(path)
    return gang_from_data(load_yaml(p), str(p), hierarchy)


def _graph_for(topology: str, base: Path, cache: dict[str, GpuGraph], where: str) -> GpuGraph:
    if topology in cache:
        return cache[topology]
    from extender.topology.presets import PRESETS, preset_graph

    graph: GpuGraph
    if topology in PRESETS:
        graph = preset_graph(topology)
    else:
        from extender.topology.nvidia_smi import parse_topo

        path = base / topology
        if not path.is_file():
            raise FileError(
                f"{where}: gpuTopology {topology!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                f"nor a file next to the cluster file"
            )
        try:
            graph = parse_topo(read_text(path), source=str(path))
        except FileError as exc:
            raise FileError(f"{where}: gpuTopology: {exc}") from None
        except TopologyError as exc:
            raise FileError(f"{where}: gpuTopology: {exc}") from None
    cache[topology] = graph
    return graph


def cluster_from_data(data: Any, base: Path, where: str = "cluster") -> ClusterSnapshot:
    if not isinstance(data, dict):
        raise FileError(f"{where}: expected a mapping with nodes")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise _first_error(where, err, ClusterSpec) from None
    try:
        levels = parse_levels(spec.levels)
    except HierarchyError as exc:
        raise FileError(f"{where}: {exc}") from None
    hierarchy = Hierarchy(levels, NetworkModel(spec.network.nic_gbps, spec.network.oversubscription))
    graphs: dict[str, GpuGraph] = {}
    nodes: list[NodeState] = []
    for k, ns in enumerate(spec.nodes):
        at = f"{where}: nodes[{k}] ({ns.name})"
        graph = _graph_for(ns.gpu_topology, base, graphs, at)
        try:
            kubelet = ns.kubelet.alignment() if ns.kubelet is not None else None
        except ValueError as exc:
            raise FileError(f"{at}: kubelet: {exc}") from None
        names = [ns.name] if ns.count is None else [f"{ns.name}-{i}" for i in range(ns.count)]
        facts = ns.facts()
        for name in names:
            labels = dict(ns.labels)
            labels.setdefault(HOSTNAME_LABEL, name)
            try:
                nodes.append(
                    NodeState(
                        name,
                        labels,
                        graph,
                        frozenset(ns.allocated_gpus),
                        frozenset(ns.unhealthy_gpus),
                        allocation=ns.allocation,
                        facts=facts,
                        kubelet=kubelet,
                    )
                )
            except ValueError as exc:
                raise FileError(f"{at}: {exc}") from None
    if spec.levels is not None:
        carried = {key for n in nodes for key in n.labels}
        for level in levels:
            if level.label not in carried:
                raise FileError(
                    f"{where}: levels: no node carries the label {level.label!r} of level "
                    f"{level.name!r}; label the nodes or drop the level"
                )
    try:
        return ClusterSnapshot(nodes, hierarchy)
    except ValueError as exc:
        raise FileError(f"{where}: {exc}") from None


def load_cluster(path: str | Path) -> ClusterSnapshot:
    p = Path(path)
    return cluster_from_data(load_yaml(p), p.parent, str(p))
