"""The gangslice solver: a slice for the whole gang, from rack down to GPU index, or a reason.

For each pod set the solver weighs a few candidate placements by the objective itself
(:func:`~extender.placement.scoring.objective`, lexicographic: first the GPUs of multi-node
NVLink cliques taken by pod sets that do not use multi-node NVLink, then the predicted
per-layer communication time): the best single nodes, and at each level of the hierarchy
(clique, leaf, spine, ...) the best-fitting domains that can hold every pod, filled from
their fastest nodes. It climbs to coarser levels only while a coarser level could still be
better. A colocateWith the user asked for is kept before cost (a slice that misses it loses
to any that keeps it), and binds both pod sets whichever the search places first. Among
equally good candidates it keeps the preferred level, room next to the pod set for the sets
that colocate with it (on its own nodes for KV hand-offs), then breaks the fewest whole
free nodes, then the finer domain, then the node type worth least to others, the fullest
enclosing domains and the tightest fit (so large blocks stay whole; for a pod set without a
required level the tightest fit comes before the domains), then topology path and name;
inside a node it takes the GPU sets that are tightest and leave the largest coherent
remainder. Node requirements (a pod's nodeSelector and required node affinity) are hard.
Every key it compares is in :mod:`~extender.placement.search.rank`, with its parts named.

Cliques are kept for the pod sets that span nodes over them: a pod set that does not (one
that fits on one node, or whose pods do not talk) goes to nodes outside cliques, and to
clique nodes only when nothing else fits, when its clique already carries such pods
(:meth:`ClusterSnapshot.spilled_cliques`: that rack is no longer whole for a gang that needs
it all, and filling it keeps whole nodes outside cliques and the other racks whole), or when
its clique is not the one kept (:meth:`ClusterSnapshot.kept_cliques`: while a gang that needs
a clique waits, only the whole one with the most free GPUs is kept for it).

Pod sets are placed one after another on a shared view of what is taken, the few best
placements of each early pod set are each carried forward, and every order of the pod sets
is tried, so a gang's total cost and its colocations are judged as a whole. Small gangs that
no order places fall back to an exact search (:mod:`extender.placement.exact`), so the
solver does not call a gang unplaceable while a slice exists.

This module is the entry point; the phases (order, search, finish, explain a refusal) are
functions over one per-decision context in :mod:`extender.placement.search`
(:func:`~extender.placement.search.decide.decide` runs them). What the solver keeps between
decisions lives in a :class:`~extender.placement.search.memory.SolverMemory` its caller
owns: by default the one the snapshot carries, shared by every view derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.placement.request import GangRequest
from extender.placement.search.decide import decide
from extender.placement.search.memory import SolverMemory
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot


@dataclass(frozen=True)
class Solver:
    """Places gangs on one snapshot; holds no state of its own between calls.

    ``exact_fallback`` turns the exact search for small gangs on (the default) or off (to
    measure the candidate search on its own); ``memory`` is what the solver may keep across
    decisions (None: the one the snapshot carries).
    """

    snap: ClusterSnapshot
    exact_fallback: bool = True
    memory: SolverMemory | None = None

    def place(self, gang: GangRequest) -> Placement:
        return decide(self.snap, gang, exact_fallback=self.exact_fallback, memory=self.memory)


def place(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Place one gang on a snapshot (reserved capacity already excluded from it)."""
    return decide(snapshot, gang)
