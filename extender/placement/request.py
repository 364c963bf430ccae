"""What a gang asks for: pod sets, their sizes, communication and topology wishes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from extender.cost import Comm, ModelDims


@dataclass(frozen=True, slots=True)
class Colocation:
    """This pod set should share one domain at ``level`` with pod set ``pod_set``."""

    pod_set: str
    level: str


def split_colocation(text: str) -> tuple[str, str | None]:
    """The ``<pod set>[@level]`` form users write a colocation in: ``decode@leaf`` ->
    (``decode``, ``leaf``), ``decode`` -> (``decode``, None). ValueError when it names no pod set."""
    target, _, level = text.partition("@")
    target, level = target.strip(), level.strip()
    if not target:
        raise ValueError(f"{text!r} names no pod set")
    return target, level or None


#: The operators of a Kubernetes ``NodeSelectorRequirement`` (``nodeAffinity``
#: ``requiredDuringSchedulingIgnoredDuringExecution`` match expressions).
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One node-label requirement of a pod set, with the semantics of a Kubernetes
    ``NodeSelectorRequirement``: ``In``/``NotIn`` a set of values, ``Exists``/``DoesNotExist``,
    ``Gt``/``Lt`` an integer (one value), as GPU Feature Discovery's ``nvidia.com/gpu.memory``
    (MiB) is compared. A ``nodeSelector`` entry is ``In`` with one value."""

    key: str
    operator: str = "In"
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise ValueError(f"operator {self.operator!r}: expected one of {', '.join(OPERATORS)}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{self.key} {self.operator}: needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"{self.key} {self.operator}: takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not _is_int(self.values[0])):
            raise ValueError(f"{self.key} {self.operator}: needs exactly one integer value")

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or not _is_int(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if op == "Gt" else int(value) < bound

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        if self.operator == "In" and len(self.values) == 1:
            return f"{self.key}={self.values[0]}"
        return f"{self.key} {self.operator} {','.join(self.values)}"


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


#: The field selector key a ``matchFields`` requirement may name (the only one Kubernetes
#: supports: ``ValidateNodeFieldSelectorRequirement`` in pkg/apis/core/validation).
NODE_NAME_FIELD = "metadata.name"


@dataclass(frozen=True, slots=True)
class NodeTerm:
    """One ``NodeSelectorTerm`` of a pod's node affinity: label match expressions and
    ``matchFields`` on ``metadata.name``, all of them ANDed. A term with neither selects no
    node (k8s.io/component-helpers/scheduling/corev1/nodeaffinity ``nodeSelectorTerm.match``)."""

    expressions: tuple[NodeRequirement, ...] = ()
    fields: tuple[NodeRequirement, ...] = ()

    def __post_init__(self) -> None:
        for f in self.fields:
            if f.key != NODE_NAME_FIELD:
                raise ValueError(f"matchFields key {f.key!r}: only {NODE_NAME_FIELD} is supported")
            if f.operator not in ("In", "NotIn") or len(f.values) != 1:
                raise ValueError(f"matchFields {f.key}: operator In or NotIn with exactly one value")

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.expressions and not self.fields:
            return False
        node_fields = {NODE_NAME_FIELD: name}
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches(node_fields) for r in self.fields
        )

    def __str__(self) -> str:
        parts = [str(r) for r in (*self.expressions, *self.fields)]
        return " and ".join(parts) if parts else "(empty term)"


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    """One ``preferredDuringSchedulingIgnoredDuringExecution`` entry: a node that matches
    ``term`` scores ``weight`` (1-100) more, as kube-scheduler's NodeAffinity Score sums them."""

    weight: int
    term: NodeTerm

    def __post_init__(self) -> None:
        if not 1 <= self.weight <= 100:
            raise ValueError(f"weight {self.weight}: must be between 1 and 100")


#: Toleration operators and taint effects core/v1 knows (``Exists``, ``Equal``;
#: ``NoSchedule``, ``PreferNoSchedule``, ``NoExecute``).
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Toleration:
    """One entry of a pod's ``spec.tolerations``. An empty ``key`` with ``Exists`` tolerates
    every taint; an empty ``effect`` matches every effect (core/v1 ``Toleration``)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def __post_init__(self) -> None:
        if self.operator not in TOLERATION_OPERATORS:
            raise ValueError(f"operator {self.operator!r}: expected one of {', '.join(TOLERATION_OPERATORS)}")
        if self.effect and self.effect not in TAINT_EFFECTS:
            raise ValueError(f"effect {self.effect!r}: expected one of {', '.join(TAINT_EFFECTS)} or none")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"key {self.key!r}: operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("an empty key needs operator Exists")

    def __str__(self) -> str:
        what = self.key or "*"
        if self.operator == "Equal":
            what += f"={self.value}"
        return f"{what}:{self.effect or '*'}"


@dataclass(frozen=True, slots=True)
class NodeNeeds:
    """What a pod asks of a node's labels, name and taints: the part of kube-scheduler's
    filters that is the same for every pod of a pod set whatever else runs on the node
    (NodeUnschedulable, TaintToleration, NodeAffinity). Hashable: snapshots cache the nodes
    that admit each one."""

    node_selector: tuple[NodeRequirement, ...] = ()
    affinity: tuple[NodeTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.node_selector or self.affinity or self.tolerations)


@dataclass(frozen=True, slots=True)
class PodRequests:
    """What one pod of a pod set requests of a node besides GPUs (the sum over its
    containers, as kube-scheduler's NodeResourcesFit counts it), and its QoS class."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    ephemeral_bytes: int = 0
    #: Guaranteed QoS: every container's requests equal its limits. With integer CPUs this
    #: is the pod the kubelet's static CPU manager and Topology Manager align.
    guaranteed: bool = False


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    gpus_per_pod: int
    comm: Comm = Comm.NONE
    required_level: str | None = None
    preferred_level: str | None = None
    colocate_with: Colocation | None = None
    model: ModelDims = field(default_factory=ModelDims)
    #: Node-label requirements every pod's node meets (all of them), as a pod's
    #: ``nodeSelector`` and required node affinity state them.
    node_selector: tuple[NodeRequirement, ...] = ()
    requests: PodRequests = field(default_factory=PodRequests)
    #: Required node affinity: the node meets one of these terms (none: no requirement).
    affinity: tuple[NodeTerm, ...] = ()
    #: Preferred node affinity: among equally good placements, nodes scoring more win.
    preferred: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_pod

    @property
    def node_needs(self) -> NodeNeeds:
        return NodeNeeds(self.node_selector, self.affinity, self.tolerations)


@dataclass(frozen=True, slots=True)
class GangRequest:
    name: str
    pod_sets: tuple[PodSet, ...]

    def __post_init__(self) -> None:
        names = [ps.name for ps in self.pod_sets]
        if not names:
            raise ValueError(f"gang {self.name}: no pod sets")
        if len(set(names)) != len(names):
            raise ValueError(f"gang {self.name}: duplicate pod set names {names}")
        for ps in self.pod_sets:
            if ps.count < 1 or ps.gpus_per_pod < 0:
                raise ValueError(f"gang {self.name}: pod set {ps.name}: count must be >= 1, gpusPerPod >= 0")
            if ps.colocate_with and ps.colocate_with.pod_set not in names:
                raise ValueError(
                    f"gang {self.name}: pod set {ps.name}: colocateWith names unknown pod set "
                    f"{ps.colocate_with.pod_set!r}"
                )

    @property
    def pods(self) -> int:
        return sum(ps.count for ps in self.pod_sets)

    @property
    def gpus(self) -> int:
        return sum(ps.gpus for ps in self.pod_sets)

    def pod_set(self, name: str) -> PodSet:
        for ps in self.pod_sets:
            if ps.name == name:
                return ps
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class PodNeeds:
    """Everything one pod's spec asks of its node, as a pod set carries it (read from a pod,
    a Workload's pod template or a gang file)."""

    node_selector: tuple[NodeRequirement, ...] = ()
    affinity: tuple[NodeTerm, ...] = ()
    preferred: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    requests: PodRequests = field(default_factory=PodRequests)

    def on(self, ps: PodSet) -> PodSet:
        """``ps`` asking for these (its own node requirements kept, these added)."""
        return replace(
            ps,
            node_selector=(*ps.node_selector, *self.node_selector),
            affinity=both_terms(ps.affinity, self.affinity),
            preferred=(*ps.preferred, *self.preferred),
            tolerations=(*ps.tolerations, *self.tolerations),
            requests=self.requests,
        )


def both_terms(a: tuple[NodeTerm, ...], b: tuple[NodeTerm, ...]) -> tuple[NodeTerm, ...]:
    """Two required node affinities at once (each an OR of terms) as one: every pair of
    terms ANDed; either alone when the other is empty (no requirement)."""
    if not a or not b:
        return a or b
    live = [t for t in (*a, *b) if t.expressions or t.fields]
    pairs = tuple(
        NodeTerm((*x.expressions, *y.expressions), (*x.fields, *y.fields))
        for x in a
        for y in b
        if x in live and y in live
    )
    return pairs or (NodeTerm(),)  # an empty term selects no node
