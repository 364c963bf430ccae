"""gangslice with migration of restartable replicas, as the simulator runs it.

The policy places as the solver does. A gang of at least :data:`MIN_GPUS` GPUs that it
refuses after the gang has waited :data:`AFTER_S` gets a plan instead, when one exists
(:func:`~extender.placement.migration.plan_drain`): running replicas the engine marks movable
(one pod of at most :data:`MAX_MOVER_GPUS` GPUs, owned by a Deployment that is not rolling,
serving) leave the domain cheapest to drain for slots at least as fast, and each restarts
(its model loads again, charged by the engine as restart GPU-hours).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extender.placement.migration import Mover, plan_drain
from extender.placement.request import GangRequest
from extender.placement.slice import Placement, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.sim.records import Plan, Running

#: Seconds a gang waits before replicas are moved for it.
AFTER_S = 600.0
#: Gangs smaller than this wait without moves (they fit the holes small replicas leave).
MIN_GPUS = 8
#: Replicas of more GPUs than this are not moved (a whole node frees nothing by moving).
MAX_MOVER_GPUS = 4


@dataclass(frozen=True)
class Migrating:
    """The gangslice solver, moving restartable replicas for gangs that waited."""

    after_s: float = AFTER_S

    def __call__(self, snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        return place(snap, gang)

    def plan(
        self, snap: ClusterSnapshot, gang: GangRequest, running: Sequence[Running], waited_s: float = 0.0
    ) -> Placement | Plan:
        got = place(snap, gang)
        if isinstance(got, Slice) or waited_s < self.after_s or gang.gpus < MIN_GPUS:
            return got
        movers = [
            Mover(r.gang, r.slots, r.load_s) for r in running if r.movable and r.gang.gpus <= MAX_MOVER_GPUS
        ]
        drain = plan_drain(snap, gang, movers)
        if drain is None:
            return got
        return Plan(drain.slice, drain.moves)
