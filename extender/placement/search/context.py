"""One decision's context: what every phase of the search reads, and the tables it fills.

A :class:`Decision` is made once per gang (:func:`~extender.placement.search.decide.decide`)
and passed to every phase explicitly: the snapshot, the gang and each pod set's rules
resolved against the hierarchy (:class:`~extender.placement.scoring.Need`), the work budget,
the memo tables that belong to this gang alone (:class:`DecisionTables`), and the
:class:`~extender.placement.search.memory.SolverMemory` its caller owns. Nothing a phase
reads is hidden on an object between calls: the pod set being placed is always an argument.

:class:`Taken` is the other half of the state: what the pod sets placed so far on one branch
of the search take. A branch copies it; the decision's tables are shared by every branch
(they are keyed by what was taken where that matters).

This module imports no other phase (only the memory beneath it).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from extender.placement.feasibility import Resources
from extender.placement.numa_fit import GpuFit, NumaRule, fit_on, rule_for, rule_key
from extender.placement.request import GangRequest, PodRequests, PodSet
from extender.placement.scoring import Need, resolve_need
from extender.placement.search.memory import Entry, EntryClass, SolverMemory
from extender.placement.slice import PodSlot
from extender.placement.snapshot import Clique, ClusterSnapshot, NodeState
from extender.topology.hierarchy import DomainKey, Hierarchy
from extender.topology.model import Tier

#: How many placements of an early pod set are carried forward (gangs of up to 3 pod sets),
#: and how many more than that of the best single nodes a pod set is offered.
BEAM = 3
#: Once the candidate search of one gang has looked at this many nodes (summed over its pod
#: set placements), it stops widening: no further beam branches or pod set orders, only
#: what completes the slice. Small clusters never reach it; a P/D gang on 5,000 nodes does.
WORK_BUDGET = 50_000


@dataclass
class WorkBudget:
    """How many nodes the candidate search may look at before it stops widening (summed
    over every pod set placement it weighs, every order and beam branch)."""

    limit: int = WORK_BUDGET
    spent: int = 0

    def spend(self, nodes: int) -> None:
        self.spent += nodes

    @property
    def exhausted(self) -> bool:
        return self.spent > self.limit


#: What a capacity table built on top of a branch's :class:`Taken` depends on.
TakenKey = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, Resources], ...]]


@dataclass
class Taken:
    """GPUs taken by pod sets of this gang placed so far on one branch, per node index (a
    mask), and what their pods take of the nodes' other resources (NodeResourcesFit: cpu,
    memory, pod slots)."""

    gpus: dict[int, int] = field(default_factory=dict)
    used: dict[int, Resources] = field(default_factory=dict)

    def copy(self) -> Taken:
        return Taken(dict(self.gpus), dict(self.used))

    def key(self) -> TakenKey:
        """What a capacity table built on top of this depends on."""
        return tuple(sorted(self.gpus.items())), tuple(sorted(self.used.items()))


@dataclass(frozen=True)
class NodePick:
    """A pod set's GPU sets on one node, with what the choice costs and leaves behind."""

    masks: tuple[int, ...]
    union: int  # every GPU the pods take
    cost: float  # the pods' communication per layer on these sets, us
    leftover: int  # free GPUs left on the node
    coherent: int  # the largest coherent block of what is left


@dataclass
class DecisionTables:
    """Memo tables that belong to one gang (pod sets are keyed by name, so they cannot outlive
    the gang): capacity tables per (pod set, preferred tier, what the gang took so far); the
    pod set's capacity entries per class (taken from the memory, so shared with earlier
    decisions); GPU picks per (pod set, node type, free mask, tier, rule); scored slots per
    (pod set, slots, partner slots) with the tuples kept alive; every node's room for one
    more pod per (requests, gang); each node type's worth; in-node pairings of KV pairs."""

    #: (:class:`~extender.placement.search.capacity.CapacityTable`, a mapping of node index
    #: to entry, typed here as the mapping: this module imports no phase.)
    caps: dict[tuple[str, bool, TakenKey], Mapping[int, Entry]] = field(default_factory=dict)
    entries: dict[tuple[str, bool], dict[EntryClass, Entry | None]] = field(default_factory=dict)
    picks: dict[tuple[str, str, int, Tier, NumaRule | None], NodePick] = field(default_factory=dict)
    micros: dict[tuple[str, int, int], tuple[float, object, object]] = field(default_factory=dict)
    rooms: dict[tuple[PodRequests, str], list[int]] = field(default_factory=dict)
    worths: dict[str, float] = field(default_factory=dict)
    #: Per pod set: its speed per GPU model (:func:`~extender.placement.hardware.speeds`).
    speeds: dict[str, Mapping[str, float] | None] = field(default_factory=dict)
    #: In-node pairings (:mod:`~extender.placement.search.pairing`): the best GPU sets of a KV
    #: pair's slots alone on a node, and their score, per what decides them.
    pairings: dict[tuple[object, ...], tuple[tuple[float, int], tuple[int, ...]]] = field(
        default_factory=dict
    )


@dataclass(eq=False)
class Decision:
    """The context of one decision: one gang on one snapshot."""

    snap: ClusterSnapshot
    gang: GangRequest
    #: Each pod set's rules resolved against the hierarchy, by pod set name.
    needs: dict[str, Need]
    memory: SolverMemory
    #: Whether small gangs no order places fall back on the exact search.
    exact_fallback: bool = True
    budget: WorkBudget = field(default_factory=WorkBudget)
    tables: DecisionTables = field(default_factory=DecisionTables)

    @classmethod
    def of(
        cls,
        snap: ClusterSnapshot,
        gang: GangRequest,
        memory: SolverMemory | None = None,
        exact_fallback: bool = True,
    ) -> Decision:
        """The context for placing ``gang`` on ``snap``; ``memory`` defaults to the one the
        snapshot carries. Raises LevelError for a level the hierarchy does not know."""
        needs = {ps.name: resolve_need(ps, snap.hierarchy) for ps in gang.pod_sets}
        return cls(snap, gang, needs, memory if memory is not None else snap.memory, exact_fallback)

    def __post_init__(self) -> None:
        self.h: Hierarchy = self.snap.hierarchy
        #: Whether any node's kubelet aligns pods to NUMA nodes (else no node has a rule).
        self.aligning = self.snap.aligning()
        #: Whether any node is in a multi-node NVLink clique (else no clique rule applies).
        self.has_fabric = self.snap.has_cliques

    # -- the kubelet's NUMA rule and the GPU sets it allows -----------------------------------
    def rules(self, ps: PodSet) -> list[NumaRule | None]:
        """Every node's rule for a pod of ``ps``, by node index (cached on the snapshot)."""
        return self.snap.per_node(("numa-rule", rule_key(ps)), functools.partial(_rule_on, ps=ps))

    def rule(self, i: int, ps: PodSet) -> NumaRule | None:
        """The kubelet's Topology Manager rule for a pod of ``ps`` on node ``i``."""
        return self.rules(ps)[i] if self.aligning else None

    def fit(self, i: int, ps: PodSet) -> GpuFit:
        """The GPU sets a pod of ``ps`` may get on node ``i``: the one place the kubelet's
        Topology Manager (:mod:`extender.placement.numa_fit`) restricts them."""
        return fit_on(self.snap.nodes[i], self.rule(i, ps))

    # -- multi-node NVLink cliques ------------------------------------------------------------
    def fabric_of(self, i: int) -> Clique | None:
        """Node ``i``'s clique (None: not in one, or no cliques in this cluster)."""
        return self.snap.clique(i) if self.has_fabric else None

    def owns_mnnvl(self, i: int) -> bool:
        """Whether this gang may use node ``i``'s NVLink (IMEX) channel: no other gang holds it."""
        return self.snap.channel_free(self.gang.name, i)

    @functools.cached_property
    def clique_nodes(self) -> list[int]:
        """The indices of the nodes in a clique."""
        return [i for i in range(len(self.snap.nodes)) if self.snap.clique(i) is not None]

    # -- domains --------------------------------------------------------------------------------
    @functools.cached_property
    def domains_by_level(self) -> dict[int, list[tuple[DomainKey | None, list[int]]]]:
        """The snapshot's domains (their keys and node indices), by level index."""
        out: dict[int, list[tuple[DomainKey | None, list[int]]]] = {}
        for key, members in self.snap.domains().items():
            out.setdefault(key[0], []).append((key, members))
        return out

    def domain_key(self, i: int, level: int) -> DomainKey:
        """The domain at ``level`` that holds node ``i``."""
        key = self.h.domain(self.snap.path(i), level)
        assert key is not None
        return key

    def slot_nodes(self, slots: tuple[PodSlot, ...]) -> set[int]:
        """The indices of the nodes some of ``slots`` are on."""
        return {self.snap.index(s.node) for s in slots}


def _rule_on(node: NodeState, ps: PodSet) -> NumaRule | None:
    return rule_for(node, ps)
