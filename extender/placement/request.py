"""What a gang asks for: pod sets, their sizes, communication and topology wishes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_pod

    def admits(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels meets every node requirement."""
        return all(r.matches(labels) for r in self.node_selector)


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
