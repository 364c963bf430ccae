"""What a simulation records: each replica's runs, the cluster's timeline, a policy's whole
run, and the plans a moving policy answers with."""

from __future__ import annotations

from dataclasses import dataclass, field

from extender.placement.migration import Move
from extender.placement.request import GangRequest
from extender.placement.slice import Placement, PodSlot
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.step import StepTime
from extender.sim.reference import Best

PLACED = "placed"
REJECTED = "rejected"
WITHDRAWN = "withdrawn"
WAITING = "waiting"

#: Why a run ended.
DEPARTED = "departed"
MOVED = "moved"
NODE_LOST = "node-lost"


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's answer with moves: place the gang after moving these running replicas."""

    placement: Placement
    moves: tuple[Move, ...] = ()


@dataclass(frozen=True, slots=True)
class Running:
    """A running replica as a moving policy sees it."""

    name: str
    template: str | None
    gang: GangRequest
    slots: tuple[PodSlot, ...]
    #: Seconds until it serves again if moved now (its model load).
    load_s: float
    #: Whether its owner lets it be moved: one pod of a Deployment that is not rolling, serving.
    movable: bool = True


#: How a node type's name marks a node of a multi-node NVLink clique.
_IN_CLIQUE = " (NVLink clique)"


def node_type(cluster: ClusterSnapshot, k: int) -> str:
    """How results.json names node ``k``'s type: its GPU model and count, and whether it sits
    in a multi-node NVLink clique."""
    n = cluster.nodes[k]
    return f"{n.graph.model or 'unnamed'} x{n.shape.size}" + (
        _IN_CLIQUE if cluster.clique(k) is not None else ""
    )


def gpu_model(type_name: str) -> str:
    """The GPU model a :func:`node_type` name names (``GB200 x4 (NVLink clique)`` -> ``GB200``)."""
    return type_name.removesuffix(_IN_CLIQUE).rsplit(" x", 1)[0]


@dataclass
class Run:
    """One placement of a replica, from placement until it ends."""

    placed_at: float
    #: When it serves: after IMEX start-up (multi-node NVLink only) and the model load.
    ready_at: float
    imex_s: float
    slots: tuple[PodSlot, ...]
    #: Node index -> GPU mask held.
    held: dict[int, int]
    mnnvl: tuple[str, ...]
    step: StepTime
    micros: float
    comm_ms: float
    incoherent: tuple[str, ...]
    nodes: int
    #: Whether an earlier run of the same replica ended (a node lost, a move): its load is a restart.
    restart: bool = False
    ended_at: float | None = None
    cause: str | None = None

    def served_s(self, end: float) -> float:
        """Seconds it served, up to ``end`` when it has not ended."""
        stop = self.ended_at if self.ended_at is not None else end
        return max(0.0, stop - self.ready_at)

    def loading_s(self, end: float) -> float:
        """Seconds its GPUs were held before it served (IMEX start-up and model load)."""
        stop = self.ended_at if self.ended_at is not None else end
        return max(0.0, min(stop, self.ready_at) - self.placed_at)


@dataclass
class GangRecord:
    """One replica of one deployment: one gang, from arrival to departure."""

    name: str
    deployment: str
    template: str | None
    gang: GangRequest
    arrived: float
    seq: int
    load_s: float = 0.0
    revision: int = 0
    outcome: str = WAITING
    ended_at: float | None = None
    runs: list[Run] = field(default_factory=list)
    ideal: Best | None = None
    ideal_same_hardware: Best | None = None
    #: Whether it can never be placed by this policy (even on the cluster with no simulated gang).
    unplaceable: bool = False

    @property
    def run(self) -> Run | None:
        """The run in progress, if any."""
        return self.runs[-1] if self.runs and self.runs[-1].ended_at is None else None

    @property
    def first(self) -> Run | None:
        return self.runs[0] if self.runs else None

    @property
    def placed_at(self) -> float | None:
        return self.runs[0].placed_at if self.runs else None

    @property
    def imex_s(self) -> float:
        return self.runs[0].imex_s if self.runs else 0.0

    @property
    def micros(self) -> float | None:
        return self.runs[0].micros if self.runs else None

    @property
    def comm_ms(self) -> float | None:
        return self.runs[0].comm_ms if self.runs else None

    @property
    def incoherent(self) -> tuple[str, ...]:
        return self.runs[0].incoherent if self.runs else ()

    @property
    def nodes(self) -> int:
        return self.runs[0].nodes if self.runs else 0

    @property
    def held(self) -> dict[int, int]:
        """GPUs it holds now, or held in its last run."""
        return self.runs[-1].held if self.runs else {}

    @property
    def mnnvl(self) -> tuple[str, ...]:
        return self.runs[-1].mnnvl if self.runs else ()

    @property
    def waited(self) -> float | None:
        """Seconds from arrival until its pods first ran: in the queue, then for IMEX start-up."""
        first = self.first
        return None if first is None else first.placed_at - self.arrived + first.imex_s

    def waited_until(self, end: float) -> float:
        """:attr:`waited`, or for a replica never placed the time it waited until it was
        withdrawn (``end`` when it never was)."""
        got = self.waited
        if got is not None:
            return got
        return (self.ended_at if self.ended_at is not None else end) - self.arrived

    @property
    def coherent(self) -> bool | None:
        return None if not self.runs else not self.runs[0].incoherent

    def ready(self, t: float) -> bool:
        run = self.run
        return run is not None and run.ready_at <= t


@dataclass(frozen=True)
class Point:
    """The cluster after the scheduling pass at time ``t`` (a step: it holds until the next)."""

    t: float
    allocated_gpus: int
    waiting_gangs: int
    whole_free_nodes: int
    largest_free_leaf_gpus: int
    #: GPUs of replicas that serve, and the same weighted by each one's speed (step time of
    #: its template's best slice / its own): the rate at which goodput accrues.
    serving_gpus: int = 0
    goodput_gpus: float = 0.0
    nodes_down: int = 0


@dataclass
class PolicyRun:
    policy: str
    gangs: list[GangRecord]
    timeline: list[Point]
    end: float
    total_gpus: int
    #: Wall seconds of every policy call of the simulation (not the arrival checks).
    decision_seconds: list[float]
    failed_calls: int
    errors: list[dict[str, object]]
    error_count: int
    wall_seconds: float
    #: Each node's type (:func:`node_type`), by node index (the keys of ``GangRecord.held``).
    node_types: list[str] = field(default_factory=list)
    moves: int = 0


def speed(ideal: Best | None, step: StepTime) -> float:
    """How fast a run serves, as a share of its template's best step on the fleet (1: as fast
    as the best slice, and where there is no reference to judge by)."""
    if ideal is None or step.total_us <= 0:
        return 1.0
    return min(1.0, ideal.step_us / step.total_us)
