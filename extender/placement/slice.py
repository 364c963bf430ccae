"""The answer to a gang request: a slot per pod, or the reason none exists."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.placement.request import PodRequests


@dataclass(frozen=True, slots=True)
class PodSlot:
    """Where one pod of the gang goes: node, exact GPU indices, NUMA node(s), nearest NIC,
    and what the pod requests of the node besides GPUs (held with the GPUs until it binds)."""

    pod_set: str
    index: int
    node: str
    gpus: tuple[int, ...]
    numa_nodes: tuple[int, ...] = ()
    nic: str | None = None
    requests: PodRequests = field(default_factory=PodRequests)

    @property
    def key(self) -> str:
        return f"{self.pod_set}/{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "podSet": self.pod_set,
            "index": self.index,
            "node": self.node,
            "gpus": list(self.gpus),
            "numaNodes": list(self.numa_nodes),
            "nic": self.nic,
            "requests": {
                "cpuMillis": self.requests.cpu_millis,
                "memoryBytes": self.requests.memory_bytes,
                "ephemeralStorageBytes": self.requests.ephemeral_bytes,
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PodSlot:
        return cls(
            pod_set=str(d["podSet"]),
            index=int(d["index"]),
            node=str(d["node"]),
            gpus=tuple(int(g) for g in d.get("gpus", ())),
            numa_nodes=tuple(int(n) for n in d.get("numaNodes", ())),
            nic=d.get("nic"),
            requests=_requests_of(d.get("requests") or {}),
        )


def _requests_of(d: Mapping[str, Any]) -> PodRequests:
    return PodRequests(
        cpu_millis=int(d.get("cpuMillis", 0)),
        memory_bytes=int(d.get("memoryBytes", 0)),
        ephemeral_bytes=int(d.get("ephemeralStorageBytes", 0)),
    )


@dataclass(frozen=True)
class Slice:
    gang: str
    slots: tuple[PodSlot, ...]
    #: Predicted per-layer communication time, microseconds, per pod set.
    pod_set_micros: Mapping[str, float]
    #: The gang's predicted per-layer communication time in microseconds, rounded (the second
    #: term of :func:`extender.placement.scoring.objective`; the first, fabric waste, is not
    #: stored). Lower is better.
    score: float = 0.0
    #: The domain each pod set landed in, in the user's words (``leaf leaf-3``, ``node n1``).
    domains: Mapping[str, str] = field(default_factory=dict)
    #: Soft wishes that were not met (a preferred level, a colocation), said plainly.
    notes: tuple[str, ...] = ()
    #: Nodes whose multi-node NVLink channel this gang uses.
    mnnvl_nodes: tuple[str, ...] = ()

    @property
    def per_layer_micros(self) -> float:
        """The gang's per-layer communication time: the sum over its pod sets."""
        return sum(self.pod_set_micros.values())

    @property
    def gpus(self) -> int:
        """GPUs the slice holds, over all its pods."""
        return sum(len(s.gpus) for s in self.slots)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({s.node for s in self.slots}))

    def held(self) -> dict[str, frozenset[int]]:
        out: dict[str, set[int]] = {}
        for s in self.slots:
            out.setdefault(s.node, set()).update(s.gpus)
        return {k: frozenset(v) for k, v in out.items()}

    def slot(self, key: str) -> PodSlot:
        for s in self.slots:
            if s.key == key:
                return s
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gang": self.gang,
            "pods": [s.to_dict() for s in self.slots],
            "cost": {
                "perLayerMicros": round(self.per_layer_micros, 3),
                "podSets": {k: round(v, 3) for k, v in self.pod_set_micros.items()},
            },
            "score": self.score,
            "domains": dict(self.domains),
            "notes": list(self.notes),
            "mnnvlNodes": list(self.mnnvl_nodes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Slice:
        cost = d.get("cost") or {}
        return cls(
            gang=str(d["gang"]),
            slots=tuple(PodSlot.from_dict(p) for p in d.get("pods", ())),
            pod_set_micros={str(k): float(v) for k, v in (cost.get("podSets") or {}).items()},
            score=float(d.get("score", 0.0)),
            domains={str(k): str(v) for k, v in (d.get("domains") or {}).items()},
            notes=tuple(str(n) for n in d.get("notes", ())),
            mnnvl_nodes=tuple(str(n) for n in d.get("mnnvlNodes", ())),
        )


@dataclass(frozen=True)
class Unplaceable:
    """No slice exists now. ``reason`` names the binding constraint in the user's terms;
    ``short_by`` is how many more pods of ``pod_set`` the closest domain would need."""

    gang: str
    reason: str
    pod_set: str | None = None
    closest: str | None = None
    short_by: int = 0
    #: False when the gang can never fit this cluster, even empty.
    feasible_when_empty: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "gang": self.gang,
            "reason": self.reason,
            "podSet": self.pod_set,
            "closest": self.closest,
            "shortBy": self.short_by,
            "feasibleWhenEmpty": self.feasible_when_empty,
        }


Placement = Slice | Unplaceable
