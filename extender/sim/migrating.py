"""gangslice with migration of restartable replicas, as the simulator runs it.

The policy places as the solver does. A gang it refuses that is due for moves
(:func:`~extender.placement.migration.due`: 8 GPUs or more, waited 10 minutes) gets a plan
instead, when one exists (:func:`~extender.placement.migration.plan_drain`): running replicas
the engine marks movable (one pod of a Deployment that is not rolling, serving) leave the
domain cheapest to drain for slots at least as fast, and each restarts (its model loads
again, charged by the engine as restart GPU-hours).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extender.placement.migration import AFTER_S, Mover, due, plan_drain
from extender.placement.request import GangRequest
from extender.placement.slice import Placement, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place
from extender.sim.records import Plan, Running


@dataclass(frozen=True)
class Migrating:
    """The gangslice solver, moving restartable replicas for gangs that waited."""

    after_s: float = AFTER_S

    def __call__(self, snap: ClusterSnapshot, gang: GangRequest) -> Placement:
        return place(snap, gang)

    def plan(
        self, snap: ClusterSnapshot, gang: GangRequest, running: Sequence[Running], waited_s: float
    ) -> Placement | Plan:
        got = place(snap, gang)
        if isinstance(got, Slice) or not due(gang, waited_s, self.after_s):
            return got
        drain = plan_drain(snap, gang, [Mover(r.gang, r.slots, r.load_s) for r in running if r.movable])
        if drain is None:
            return got
        return Plan(drain.slice, drain.moves)
