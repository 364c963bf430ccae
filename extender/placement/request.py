"""What a gang asks for: pod sets, their sizes, communication and topology wishes."""

from __future__ import annotations

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

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_pod


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
