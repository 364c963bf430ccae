"""Pure placement engine: gang requests, the solver, scoring, the ledger, baseline policies."""

from extender.placement.ledger import Ledger, LedgerError, Phase, Reservation
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import Solver, place

__all__ = [
    "ClusterSnapshot",
    "Colocation",
    "GangRequest",
    "Ledger",
    "LedgerError",
    "NodeState",
    "Phase",
    "Placement",
    "PodSet",
    "PodSlot",
    "Reservation",
    "Slice",
    "Solver",
    "Unplaceable",
    "place",
]
