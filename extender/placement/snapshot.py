"""A point-in-time view of the cluster the solver reads: nodes, their GPU graphs, what is taken."""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from extender.placement import feasibility
from extender.placement.feasibility import NO_FACTS, UNLIMITED, NodeFacts, Resources
from extender.placement.hardware import NOTHING_WAITS, Worth
from extender.placement.plugin_fit import plugin_kind
from extender.placement.request import NodeNeeds, NodeRequirement, PodRequests
from extender.placement.search.memory import SolverMemory
from extender.placement.slice import PodSlot
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import DomainKey, Hierarchy
from extender.topology.kubelet import KubeletAlignment
from extender.topology.model import GpuGraph, NodeShape

#: A multi-node NVLink clique: a node's label path down to the fabric level.
Clique = tuple[str | None, ...]
#: How many pod requests' room tables a snapshot keeps (the oldest goes first).
ROOM_TABLES = 8
#: How many per-node tables (:meth:`ClusterSnapshot.per_node`, one per pod shape) a snapshot keeps.
PER_NODE_TABLES = 16
#: Views of one free table with what waits set (:meth:`ClusterSnapshot.with_waiting`) kept.
WAITING_VIEWS = 16
#: A pod set's node requirements, all of which a node meets.
Selector = tuple[NodeRequirement, ...]
#: Nodes alike for placement as far as allocation goes: (node kind, free mask).
FreeClass = tuple[str, int]
#: Nodes alike for one pod set where nodes limit resources: (node kind, free mask, room).
RoomClass = tuple[str, int, int]
#: :meth:`ClusterSnapshot.room_classes` per pod shape, with the free table and nodes they hold for.
RoomTables = tuple[list[int], "list[NodeState]", dict[object, dict[RoomClass, list[int]]]]
#: A per-node table: how each entry is derived from its node, and the entries by node index.
_Derived = tuple[Callable[["NodeState"], Any], list[Any]]


@dataclass
class NodeState:
    """One node. GPU sets are GPU *indices*; masks are positions in the node's shape."""

    name: str
    labels: Mapping[str, str]
    graph: GpuGraph
    allocated: frozenset[int] = frozenset()
    unhealthy: frozenset[int] = frozenset()
    #: The gang that holds this node's multi-node NVLink (IMEX) channel, if any.
    mnnvl_gang: str | None = None
    #: A ComputeDomain no gang here holds that the node belongs to (in words: NVIDIA's driver
    #: labels the node with it and refuses a second one): no gang may join the node to its own.
    foreign_domain: str | None = None
    #: Who picks the pod's GPUs on this node (see :mod:`extender.topology.allocation`).
    allocation: Allocation = Allocation.DEVICE_PLUGIN
    #: Taints, cordon, allocatable and what other pods request: what kube-scheduler's
    #: filters read (:mod:`extender.placement.feasibility`); the default constrains nothing.
    facts: NodeFacts = NO_FACTS
    #: What the kubelet aligns to NUMA nodes here (None: not known, taken as no alignment).
    kubelet: KubeletAlignment | None = None
    #: The Topology Manager rule per kind of pod (:func:`extender.placement.numa_fit.rule_for`),
    #: kept with the node state it was derived from (a changed node is a new state).
    numa_rules: dict[object, object] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sick = {g.index for g in self.graph.gpus if not self.graph.healthy(g.index)}
        self.unhealthy = frozenset(self.unhealthy | sick)
        known = set(self.graph.indices)
        for what, gpus in (("allocatedGpus", self.allocated), ("unhealthyGpus", self.unhealthy)):
            unknown = set(gpus) - known
            if unknown:
                raise ValueError(f"node {self.name}: {what} names GPUs {sorted(unknown)} it does not have")

    @property
    def shape(self) -> NodeShape:
        return self.graph.shape

    @property
    def plugin(self) -> bool:
        """Whether the device plugin, not gangslice, picks the pod's GPUs here."""
        return self.allocation == Allocation.DEVICE_PLUGIN

    @property
    def kind(self) -> str:
        """The node's type as placement memoises it: its GPU graph's shape, and under the
        device plugin also what the plugin sees of the graph (the in-node choice differs)."""
        return plugin_kind(self.graph) if self.plugin else self.graph.shape.key


@dataclass
class ClusterSnapshot:
    """Nodes plus the hierarchy; ``reserved`` holds GPUs held by reservations, per node."""

    nodes: list[NodeState]
    hierarchy: Hierarchy = field(default_factory=Hierarchy)
    reserved: dict[str, frozenset[int]] = field(default_factory=dict)
    #: Nodes whose IMEX channel a reservation holds, by gang (from the ledger).
    reserved_mnnvl: dict[str, str] = field(default_factory=dict)
    #: Whether a gang that needs a multi-node NVLink clique is known to wait (None: not known,
    #: so cliques are kept whole as if one did; :func:`~extender.placement.scoring.on_whole_clique`).
    clique_demand: bool | None = None
    #: What a GPU of each model is worth to the gangs in demand
    #: (:mod:`~extender.placement.hardware`; nothing by default: every replica takes the
    #: fastest hardware it may use).
    worth: Worth = NOTHING_WAITS
    #: What the solver keeps across decisions on this cluster (per-class tables, fits on the
    #: emptied cluster): shared by every snapshot derived from this one, so the caller that
    #: builds the snapshot owns it; pass the same one to a rebuilt snapshot to keep it.
    memory: SolverMemory = field(default_factory=SolverMemory, kw_only=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate node names: {dupes}")
        self._by_name = {n.name: n for n in self.nodes}
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        self._paths = [self.hierarchy.path(n.labels) for n in self.nodes]
        self._domains: dict[DomainKey, list[int]] | None = None
        self._free = [self._compute_free(n) for n in self.nodes]
        # Derived tables, each kept with the table it was derived from (``_paths`` or ``nodes``)
        # so a copy whose tables were swapped (:meth:`updated`) recomputes them.
        self._cliques: tuple[list[tuple[str | None, ...]], list[Clique | None]] | None = None
        self._topology: tuple[list[NodeState], TopologyKey] | None = None
        self._kinds: tuple[list[NodeState], list[str]] | None = None
        self._aligning: tuple[list[NodeState], bool] | None = None
        self._per_node: tuple[list[NodeState], dict[object, _Derived]] | None = None
        self._admitted: tuple[list[NodeState], dict[NodeNeeds, frozenset[int] | None]] | None = None
        self._refusals: tuple[list[NodeState], dict[NodeNeeds, list[feasibility.Refusal]]] | None = None
        self._limits: tuple[list[NodeState], bool] | None = None
        self._rooms: tuple[list[NodeState], dict[tuple[PodRequests, Resources | None], list[int]]] | None = (
            None
        )
        self._order: tuple[list[tuple[str | None, ...]], list[int]] | None = None
        self._domain_free: tuple[list[int], dict[DomainKey, int]] | None = None
        self._fullness: tuple[list[int], dict[tuple[str | None, ...], tuple[int, ...]]] | None = None
        self._spans: tuple[list[tuple[str | None, ...]], dict[DomainKey, tuple[int, int]]] | None = None
        self._classes: tuple[list[int], list[str], dict[FreeClass, list[int]]] | None = None
        self._room_classes: RoomTables | None = None
        self._spilled: tuple[list[int], frozenset[Clique]] | None = None
        self._kept: tuple[list[int], bool | None, frozenset[Clique]] | None = None
        self._demand_copies: (
            tuple[list[int], list[NodeState], dict[tuple[bool | None, Worth], ClusterSnapshot]] | None
        ) = None

    def _compute_free(self, node: NodeState) -> int:
        shape = node.shape
        taken = node.allocated | node.unhealthy | self.reserved.get(node.name, frozenset())
        return shape.full_mask & ~shape.mask_of(g for g in taken if g in shape.indices)

    def node(self, name: str) -> NodeState:
        return self._by_name[name]

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    def all_known(self, names: Iterable[str]) -> bool:
        """Whether every name is a node here (one pass in C over a request's node list)."""
        return all(map(self._by_name.__contains__, names))

    def path(self, i: int) -> tuple[str | None, ...]:
        return self._paths[i]

    def path_of(self, name: str) -> tuple[str | None, ...]:
        return self._paths[self._index[name]]

    def index(self, name: str) -> int:
        return self._index[name]

    def free_mask(self, i: int) -> int:
        """Free GPUs of node ``i`` as a mask: not allocated, not unhealthy, not reserved."""
        return self._free[i]

    def free_masks(self) -> list[int]:
        """Every node's free mask, by node index (do not modify)."""
        return self._free

    def kinds(self) -> list[str]:
        """Every node's type (:attr:`NodeState.kind`: its GPU graph's shape and who picks its
        GPUs), by node index (cached; do not modify)."""
        if self._kinds is None or self._kinds[0] is not self.nodes:
            self._kinds = (self.nodes, [n.kind for n in self.nodes])
        return self._kinds[1]

    def free_classes(self) -> dict[FreeClass, list[int]]:
        """The node indices by node type and free mask, each list in index order: what the
        solver computes once per class instead of once per node (cached per free table, and
        kept up to date by :meth:`updated`; do not modify)."""
        kinds = self.kinds()
        if self._classes is None or self._classes[0] is not self._free or self._classes[1] is not kinds:
            table: dict[FreeClass, list[int]] = {}
            for i, k in enumerate(zip(kinds, self._free, strict=True)):
                got = table.get(k)
                if got is None:
                    table[k] = [i]
                else:
                    got.append(i)
            self._classes = (self._free, kinds, table)
        return self._classes[2]

    def room_classes(
        self, needs: NodeNeeds, key: object, rooms: Sequence[int], gpus_per_pod: int, count: int
    ) -> dict[RoomClass, list[int]]:
        """:meth:`free_classes` of the nodes ``needs`` admits, split by their room for one pod
        set (``rooms``, by node index, what :meth:`room` says for its pods; ``key`` names that
        table), at most ``count`` and the pods of ``gpus_per_pod`` GPUs the free GPUs hold;
        nodes without room left out; each list in index order (cached per free table; do not
        modify)."""
        if (
            self._room_classes is None
            or self._room_classes[0] is not self._free
            or self._room_classes[1] is not self.nodes
        ):
            self._room_classes = (self._free, self.nodes, {})
        tables = self._room_classes[2]
        full_key = (needs, key, gpus_per_pod, count)
        got = tables.get(full_key)
        if got is None:
            while len(tables) >= ROOM_TABLES:
                tables.pop(next(iter(tables)))
            admitted = self.admitted(needs)
            got = tables[full_key] = {}
            for (kind, free), members in self.free_classes().items():
                most = min(count, free.bit_count() // gpus_per_pod) if gpus_per_pod else count
                for i in members:
                    if admitted is not None and i not in admitted:
                        continue
                    room = min(rooms[i], most)
                    if room > 0:
                        listed = got.get((kind, free, room))
                        if listed is None:
                            got[(kind, free, room)] = [i]
                        else:
                            listed.append(i)
        return got

    def aligning(self) -> bool:
        """Whether the kubelet of any node may refuse a pod it cannot align to NUMA nodes
        (``single-numa-node`` or ``restricted``; cached per node list)."""
        if self._aligning is None or self._aligning[0] is not self.nodes:
            found = any(n.kubelet is not None and n.kubelet.topology_policy.refuses for n in self.nodes)
            self._aligning = (self.nodes, found)
        return self._aligning[1]

    def per_node(self, key: object, derive: Callable[[NodeState], Any]) -> list[Any]:
        """``derive(node)`` for every node, by node index, cached per node list under ``key``
        (which must name everything ``derive`` depends on besides the node; do not modify)."""
        if self._per_node is None or self._per_node[0] is not self.nodes:
            self._per_node = (self.nodes, {})
        table = self._per_node[1]
        got = table.get(key)
        if got is None:
            while len(table) >= PER_NODE_TABLES:  # carried across updates: bounded, oldest first
                del table[next(iter(table))]
            got = table[key] = (derive, [derive(n) for n in self.nodes])
        return got[1]

    def admitted(self, needs: NodeNeeds | Selector) -> frozenset[int] | None:
        """The indices of the nodes a pod with these needs passes kube-scheduler's
        NodeUnschedulable, TaintToleration and NodeAffinity filters on (None: every node;
        cached per needs). A bare selector is a pod with only a nodeSelector."""
        if not isinstance(needs, NodeNeeds):
            needs = NodeNeeds(tuple(needs))
        if self._admitted is None or self._admitted[0] is not self.nodes:
            self._admitted = (self.nodes, {})
        table = self._admitted[1]
        if needs in table:
            return table[needs]
        if not needs and not any(n.facts.constrains for n in self.nodes):
            got = None
        else:
            found = frozenset(
                i for i, n in enumerate(self.nodes) if feasibility.admits(needs, n.name, n.labels, n.facts)
            )
            got = None if len(found) == len(self.nodes) else found
        table[needs] = got
        return got

    def refusals(self, needs: NodeNeeds) -> list[feasibility.Refusal]:
        """Why each node the filters refuse for ``needs`` is refused (see :meth:`admitted`;
        cached per needs, a new list each call)."""
        if self._refusals is None or self._refusals[0] is not self.nodes:
            self._refusals = (self.nodes, {})
        table = self._refusals[1]
        got = table.get(needs)
        if got is None:
            got = table[needs] = [
                r
                for n in self.nodes
                if (r := feasibility.refusal(needs, n.name, n.labels, n.facts)) is not None
            ]
        return list(got)

    @property
    def limits_resources(self) -> bool:
        """Whether any node reports allocatable resources (else :meth:`room` is unlimited)."""
        if self._limits is None or self._limits[0] is not self.nodes:
            self._limits = (self.nodes, any(n.facts.allocatable.reported for n in self.nodes))
        return self._limits[1]

    def room(self, i: int, requests: PodRequests, taken: Resources | None = None) -> int:
        """How many pods with ``requests`` node ``i`` takes by NodeResourcesFit (cpu, memory,
        ephemeral storage, the pod count), after what its pods request and ``taken``."""
        if not self.limits_resources:
            return UNLIMITED
        facts = self.nodes[i].facts
        if taken == feasibility.NOTHING:
            taken = None
        if taken is not None and taken != facts.imex_daemon:
            return feasibility.room(requests, facts, taken)
        # Tabled: with nothing taken, and with only the IMEX daemon taken (a gang's first pod on
        # a clique node, :func:`~extender.placement.scoring.room_taken`).
        return self.rooms(requests, taken)[i]

    def rooms(self, requests: PodRequests, taken: Resources | None = None) -> list[int]:
        """Every node's :meth:`room` for pods with ``requests`` after ``taken`` on each
        (nothing, or the IMEX daemon), by node index (cached per node table; only where
        :attr:`limits_resources`; do not modify)."""
        if self._rooms is None or self._rooms[0] is not self.nodes:
            self._rooms = (self.nodes, {})
        tables = self._rooms[1]
        key = (requests, taken)
        table = tables.get(key)
        if table is None:
            while len(tables) >= ROOM_TABLES:
                tables.pop(next(iter(tables)))
            got = taken or feasibility.NOTHING
            table = tables[key] = [feasibility.room(requests, n.facts, got) for n in self.nodes]
        return table

    def domain_free(self) -> dict[DomainKey, int]:
        """Free GPUs of every domain at every level (cached per free table)."""
        if self._domain_free is None or self._domain_free[0] is not self._free:
            free = [m.bit_count() for m in self._free]
            table = {key: sum(free[i] for i in members) for key, members in self.domains().items()}
            self._domain_free = (self._free, table)
        return self._domain_free[1]

    def fullness(self, i: int) -> tuple[int, ...]:
        """Free GPUs of the domains that enclose node ``i``, from the coarsest level down:
        lower is fuller (the order Kueue's BestFit and Volcano's HyperNode bin-packing prefer;
        cached per free table)."""
        if self._fullness is None or self._fullness[0] is not self._free:
            self._fullness = (self._free, {})
        # By path: the nodes under one leaf share it (and so their fullness).
        memo = self._fullness[1]
        path = self._paths[i]
        got = memo.get(path)
        if got is not None:
            return got
        table = self.domain_free()
        out = []
        for level in range(len(self.hierarchy.levels)):
            key = self.hierarchy.domain(path, level)
            out.append(table.get(key, 0) if key is not None else 0)
        memo[path] = got = tuple(out)
        return got

    def order(self) -> list[int]:
        """Each node's rank in the one tie-break order every policy uses: by topology path
        (label values from the coarsest level down, unlabelled last), then by name (cached)."""
        if self._order is None or self._order[0] is not self._paths:
            keys = sorted(
                range(len(self.nodes)),
                key=lambda i: (tuple((v is None, v or "") for v in self._paths[i]), self.nodes[i].name),
            )
            rank = [0] * len(self.nodes)
            for r, i in enumerate(keys):
                rank[i] = r
            self._order = (self._paths, rank)
        return self._order[1]

    def free_gpus(self, name: str) -> frozenset[int]:
        i = self._index[name]
        return frozenset(self.nodes[i].shape.gpus_of(self._free[i]))

    def mnnvl_owner(self, i: int) -> str | None:
        node = self.nodes[i]
        return node.mnnvl_gang or self.reserved_mnnvl.get(node.name)

    def spilled_cliques(self) -> frozenset[Clique]:
        """The cliques pods off the fabric already use: a node of the clique has GPUs taken
        (allocated or reserved; unhealthy ones do not count) while nobody holds its NVLink
        (IMEX) channel (:meth:`channel_holder`; cached per free table)."""
        if self._spilled is None or self._spilled[0] is not self._free:
            out: set[Clique] = set()
            if self.has_cliques:
                for i, node in enumerate(self.nodes):
                    clique = self.clique(i)
                    # Taken by pods or reservations, not merely unhealthy: a GPU fault
                    # does not open the rack to small replicas.
                    taken = node.allocated or self.reserved.get(node.name)
                    if clique is not None and clique not in out and taken and self.channel_holder(i) is None:
                        out.add(clique)
            self._spilled = (self._free, frozenset(out))
        return self._spilled[1]

    def channel_free(self, gang: str, i: int) -> bool:
        """Whether ``gang`` may use node ``i``'s IMEX channel (join it to its ComputeDomain):
        no other gang holds it, and the node belongs to no ComputeDomain of someone else."""
        if self.nodes[i].foreign_domain is not None:
            return False
        owner = self.mnnvl_owner(i)
        return owner is None or owner == gang

    def kept_cliques(self) -> frozenset[Clique]:
        """The cliques kept whole for the gangs that need one: GPUs that pods off the fabric
        take there are fabric waste (:func:`~extender.placement.scoring.on_whole_clique`).
        Only cliques no such pods use yet (:meth:`spilled_cliques`) are kept, and of those:
        none while no gang that needs one waits (:attr:`clique_demand` False); while one
        waits, the one with the most free GPUs (then the first by topology path), so racks
        drain for it one at a time instead of all standing idle for one gang; while that is
        not known (None), every one. Cached per free table and demand."""
        kept = self._kept
        if kept is None or kept[0] is not self._free or kept[1] is not self.clique_demand:
            free: dict[Clique, int] = {}
            first: dict[Clique, int] = {}  # the rank of the clique's first node (:meth:`order`)
            if self.has_cliques and self.clique_demand is not False:
                spilled = self.spilled_cliques()
                order = self.order()
                for i in range(len(self.nodes)):
                    clique = self.clique(i)
                    if clique is None or clique in spilled:
                        continue
                    free[clique] = free.get(clique, 0) + self._free[i].bit_count()
                    first[clique] = min(first.get(clique, order[i]), order[i])
            if self.clique_demand is None or not free:
                chosen = frozenset(free)
            else:
                chosen = frozenset({max(free, key=lambda c: (free[c], -first[c]))})
            kept = self._kept = (self._free, self.clique_demand, chosen)
        return kept[2]

    def channel_holder(self, i: int) -> str | None:
        """Who holds node ``i``'s IMEX channel, in words (None: nobody)."""
        node = self.nodes[i]
        if node.foreign_domain is not None:
            return node.foreign_domain
        owner = self.mnnvl_owner(i)
        return None if owner is None else f"gang {owner}"

    def domains(self) -> dict[DomainKey, list[int]]:
        """Every domain at every level, with the indices of its nodes (cached)."""
        if self._domains is None:
            out: dict[DomainKey, list[int]] = {}
            for i, path in enumerate(self._paths):
                for level in range(len(self.hierarchy.levels)):
                    key = self.hierarchy.domain(path, level)
                    if key is not None:
                        out.setdefault(key, []).append(i)
            self._domains = out
        return self._domains

    def domain_spans(self) -> dict[DomainKey, tuple[int, int]]:
        """Each domain's nodes as a range ``[lo, hi)`` of ranks in :meth:`order`: that order
        sorts by label path, so every domain's nodes are contiguous in it and a sum over a
        domain is a difference of two prefix sums (cached per snapshot)."""
        if self._spans is None or self._spans[0] is not self._paths:
            rank = self.order()
            table: dict[DomainKey, tuple[int, int]] = {}
            for key, members in self.domains().items():
                ranks = [rank[i] for i in members]
                table[key] = (min(ranks), max(ranks) + 1)
            self._spans = (self._paths, table)
        return self._spans[1]

    @property
    def has_cliques(self) -> bool:
        """Whether the hierarchy has a multi-node NVLink (fabric) level at all."""
        return any(lv.fabric for lv in self.hierarchy.levels)

    def clique(self, i: int) -> Clique | None:
        """The multi-node NVLink clique node ``i`` belongs to (its path down to the fabric
        level), or None (cached per snapshot)."""
        if self._cliques is None or self._cliques[0] is not self._paths:
            fabric = [level for level, lv in enumerate(self.hierarchy.levels) if lv.fabric]
            found: list[Clique | None] = []
            for path in self._paths:
                level = next((lv for lv in fabric if path[lv] is not None), None)
                found.append(None if level is None else tuple(path[: level + 1]))
            self._cliques = (self._paths, found)
        return self._cliques[1][i]

    def topology(self) -> TopologyKey:
        """What placement sees of this cluster apart from what is taken: the hierarchy, and
        each node's name, type (GPU graph shape and who picks its GPUs), label path, unhealthy
        GPUs, filter facts (taints, cordon, allocatable) and what its kubelet aligns. Two
        snapshots with equal keys give every gang the same slice once nothing is allocated or
        reserved."""
        if self._topology is None or self._topology[0] is not self.nodes:
            parts = tuple(
                (
                    n.name,
                    n.kind,
                    self._paths[i],
                    n.unhealthy,
                    n.facts.static(),
                    n.kubelet and n.kubelet.emptied(),
                )
                for i, n in enumerate(self.nodes)
            )
            self._topology = (self.nodes, TopologyKey((self.hierarchy, parts)))
        return self._topology[1]

    def emptied(self) -> ClusterSnapshot:
        """The same cluster with nothing allocated, reserved or holding an NVLink channel."""
        nodes = [
            replace(
                n,
                allocated=frozenset(),
                mnnvl_gang=None,
                foreign_domain=None,
                facts=n.facts.emptied(),
                kubelet=n.kubelet and n.kubelet.emptied(),
            )
            for n in self.nodes
        ]
        snap = ClusterSnapshot(nodes, self.hierarchy, memory=self.memory)
        snap._domains = self._domains
        return snap

    def only(self, names: Iterable[str]) -> ClusterSnapshot:
        """The part of the cluster on ``names`` (unknown names ignored), with what is held there:
        a decision that must stay near a slice (a gang's pod set grown by one) places on it."""
        keep = set(names)
        return ClusterSnapshot(
            [n for n in self.nodes if n.name in keep],
            self.hierarchy,
            {n: g for n, g in self.reserved.items() if n in keep},
            {n: g for n, g in self.reserved_mnnvl.items() if n in keep},
            self.clique_demand,
            self.worth,
        )

    def with_clique_demand(self, demand: bool | None) -> ClusterSnapshot:
        """The same snapshot with :attr:`clique_demand` set (:meth:`with_waiting`)."""
        return self.with_waiting(demand, self.worth)

    def with_waiting(self, demand: bool | None, worth: Worth) -> ClusterSnapshot:
        """The same snapshot (every derived table shared) with what is known to wait set:
        :attr:`clique_demand` and :attr:`worth`. The copy is kept with this snapshot's free
        table and nodes, so decisions on one view reuse one copy and the tables it derives
        lazily (the cache's view lives until it changes); at most :data:`WAITING_VIEWS` are
        kept per free table."""
        if demand is self.clique_demand and worth == self.worth:
            return self
        memo = self._demand_copies
        if memo is None or memo[0] is not self._free or memo[1] is not self.nodes:
            memo = self._demand_copies = (self._free, self.nodes, {})
        snap = memo[2].get((demand, worth))
        if snap is None:
            while len(memo[2]) >= WAITING_VIEWS:
                del memo[2][next(iter(memo[2]))]
            snap = memo[2][(demand, worth)] = copy.copy(self)
            snap.clique_demand = demand
            snap.worth = worth
        return snap

    def without(self, gpus: Mapping[str, frozenset[int]]) -> ClusterSnapshot:
        """The same cluster with these GPUs (node name -> GPU indices) free: taken off what
        the node reports allocated and off what is reserved there (replicas that would move)."""
        states = {}
        held = dict(self.reserved)
        for name, g in gpus.items():
            node = self.node(name)
            if node.allocated & g:
                states[name] = replace(node, allocated=node.allocated - g)
            if name in held:
                held[name] = held[name] - g
        return self.updated(states, held, self.reserved_mnnvl, also=list(gpus))

    def with_taken(self, slots: Iterable[PodSlot]) -> ClusterSnapshot:
        """The same cluster with the slots' GPUs held too (as a reservation holds them)."""
        held = dict(self.reserved)
        names = []
        for s in slots:
            held[s.node] = held.get(s.node, frozenset()) | frozenset(s.gpus)
            names.append(s.node)
        return self.updated({}, held, self.reserved_mnnvl, also=names)

    def with_held(self, held: Mapping[str, frozenset[int]], mnnvl: Mapping[str, str]) -> ClusterSnapshot:
        """The same cluster with reservations' capacity taken out."""
        snap = ClusterSnapshot(self.nodes, self.hierarchy, dict(held), dict(mnnvl), memory=self.memory)
        # Same nodes and hierarchy: share the label paths too, so the clique table (kept with
        # the ``_paths`` it was derived from) is reused instead of rebuilt.
        snap._paths = self._paths
        snap._domains = self._domains
        snap._cliques = self._cliques
        snap._topology = self._topology
        snap._kinds = self._kinds
        snap._aligning = self._aligning
        snap._per_node = self._per_node
        snap._admitted = self._admitted
        snap._refusals = self._refusals
        snap._limits = self._limits
        snap._rooms = self._rooms
        snap._order = self._order
        snap._spans = self._spans
        if self._classes_current():
            # Only the nodes held here or in this snapshot can differ in free GPUs.
            changed = sorted(self._index[n] for n in {*held, *self.reserved} if n in self._index)
            snap._classes = (snap._free, snap.kinds(), self._moved_classes(snap, changed))
        return snap

    def with_held_masks(self, held: Mapping[int, int], mnnvl: Mapping[str, str]) -> ClusterSnapshot:
        """The same cluster with the GPUs of ``held`` (node index -> GPU mask) taken out too: what
        :meth:`with_held` gives for the same GPUs, without converting GPU sets to masks and back
        (the simulator's many snapshots of one cluster). Every table derived from the nodes and
        their labels is shared; those derived from free GPUs are recomputed when asked."""
        # The tables a copy fills in place, made here first so every copy fills the same ones.
        if self._per_node is None or self._per_node[0] is not self.nodes:
            self._per_node = (self.nodes, {})
        if self._admitted is None or self._admitted[0] is not self.nodes:
            self._admitted = (self.nodes, {})
        if self._refusals is None or self._refusals[0] is not self.nodes:
            self._refusals = (self.nodes, {})
        if self._rooms is None or self._rooms[0] is not self.nodes:
            self._rooms = (self.nodes, {})
        snap = copy.copy(self)
        reserved = dict(self.reserved)
        for i, mask in held.items():
            if mask:
                node = self.nodes[i]
                gpus = _gpu_set(node.shape, mask)
                reserved[node.name] = reserved[node.name] | gpus if node.name in reserved else gpus
        snap.reserved = reserved
        snap.reserved_mnnvl = {**self.reserved_mnnvl, **mnnvl}
        snap._free = [f & ~held[i] if i in held else f for i, f in enumerate(self._free)]
        snap._domain_free = None
        snap._fullness = None
        snap._room_classes = None
        snap._spilled = None
        snap._kept = None
        snap._demand_copies = None
        snap._classes = None
        if self._classes_current():
            snap._classes = (snap._free, snap.kinds(), self._moved_classes(snap, sorted(held)))
        return snap

    def updated(
        self,
        states: Mapping[str, NodeState],
        held: Mapping[str, frozenset[int]] | None = None,
        mnnvl: Mapping[str, str] | None = None,
        also: Iterable[str] = (),
    ) -> ClusterSnapshot:
        """This snapshot with the node states in ``states`` replaced and, when given, new
        reservations (``held``/``mnnvl``); ``also`` names nodes whose held GPUs changed.

        A watch event changes one node's allocation and a reservation the held GPUs of a
        few nodes, while a fresh build costs tens of milliseconds at 5,000 nodes (every
        node's label path and free mask). So when no node's membership or labels change,
        the per-node tables are copied (plain list and dict copies, done in C), only the
        changed nodes' free masks are recomputed, and the label paths, domains and derived
        tables are shared; otherwise the snapshot is built afresh."""
        if any(not self.has_node(name) or self.node(name).labels != s.labels for name, s in states.items()):
            return ClusterSnapshot(
                [states.get(n.name, n) for n in self.nodes],
                self.hierarchy,
                dict(held) if held is not None else dict(self.reserved),
                dict(mnnvl) if mnnvl is not None else dict(self.reserved_mnnvl),
                memory=self.memory,
            )
        snap = copy.copy(self)
        if held is not None:
            snap.reserved = dict(held)
        if mnnvl is not None:
            snap.reserved_mnnvl = dict(mnnvl)
        if states:
            # Only then a new node list: the per-node-list tables (kinds, topology) stay
            # valid across a change of reservations alone.
            snap.nodes = list(self.nodes)
            snap._by_name = dict(self._by_name)
            for name, state in states.items():
                snap.nodes[self._index[name]] = state
                snap._by_name[name] = state
        if states and self._admitted is not None and self._admitted[0] is self.nodes:
            # Labels are the same (else the snapshot is built afresh), so only the changed
            # nodes' taints or cordon can change which nodes a pod set's filters admit.
            changed = [self._index[name] for name in states]
            count = len(snap.nodes)
            admitted: dict[NodeNeeds, frozenset[int] | None] = {}
            for needs, got in self._admitted[1].items():
                members = set(range(count)) if got is None else set(got)
                for i in changed:
                    n = snap.nodes[i]
                    if feasibility.admits(needs, n.name, n.labels, n.facts):
                        members.add(i)
                    else:
                        members.discard(i)
                admitted[needs] = None if len(members) == count else frozenset(members)
            snap._admitted = (snap.nodes, admitted)
        if states and self._rooms is not None and self._rooms[0] is self.nodes:
            # What a node's other resources hold changes with its pods: recompute those only.
            changed = [self._index[name] for name in states]
            rooms = {}
            for (requests, taken), table in self._rooms[1].items():
                table = list(table)
                for i in changed:
                    table[i] = feasibility.room(requests, snap.nodes[i].facts, taken or feasibility.NOTHING)
                rooms[(requests, taken)] = table
            snap._rooms = (snap.nodes, rooms)
        if states and self._per_node is not None and self._per_node[0] is self.nodes:
            # Each entry derives from its node alone: recompute the changed nodes' only.
            changed = [self._index[name] for name in states]
            derived: dict[object, _Derived] = {}
            for key, (derive, values) in self._per_node[1].items():
                values = list(values)
                for i in changed:
                    values[i] = derive(snap.nodes[i])
                derived[key] = (derive, values)
            snap._per_node = (snap.nodes, derived)
        snap._free = list(self._free)
        changed = sorted(snap._index[name] for name in {*states, *also} if name in snap._index)
        for i in changed:
            snap._free[i] = snap._compute_free(snap.nodes[i])
        if states and self._kinds is not None and self._kinds[0] is self.nodes:
            kinds = list(self._kinds[1])
            for name, state in states.items():
                kinds[self._index[name]] = state.kind
            snap._kinds = (snap.nodes, kinds)
        if self._classes_current() and snap._kinds is not None and snap._kinds[0] is snap.nodes:
            snap._classes = (snap._free, snap._kinds[1], self._moved_classes(snap, changed))
        return snap

    def _classes_current(self) -> bool:
        """Whether :meth:`free_classes` is computed for this snapshot's free table and nodes."""
        return (
            self._classes is not None
            and self._classes[0] is self._free
            and self._kinds is not None
            and self._kinds[0] is self.nodes
            and self._classes[1] is self._kinds[1]
        )

    def _moved_classes(self, snap: ClusterSnapshot, changed: Iterable[int]) -> dict[FreeClass, list[int]]:
        """This snapshot's :meth:`free_classes` with the ``changed`` nodes moved to their class
        in ``snap`` (copy on write: the lists this snapshot hands out stay as they are)."""
        assert self._classes is not None
        old_kinds, table = self._classes[1], dict(self._classes[2])
        new_kinds = snap.kinds()
        copied: set[FreeClass] = set()

        def own(k: FreeClass) -> list[int]:
            if k not in copied:
                table[k] = list(table.get(k, ()))
                copied.add(k)
            return table[k]

        for i in changed:
            old, new = (old_kinds[i], self._free[i]), (new_kinds[i], snap._free[i])
            if old == new:
                continue
            members = own(old)
            members.remove(i)
            if not members:
                del table[old]
                copied.discard(old)
            bisect.insort(own(new), i)
        return table

    @property
    def total_gpus(self) -> int:
        return sum(n.shape.size for n in self.nodes)


_GPU_SETS: dict[tuple[str, int], frozenset[int]] = {}


def _gpu_set(shape: NodeShape, mask: int) -> frozenset[int]:
    """The GPU indices of a mask on a node shape, memoised (a few hundred masks per shape)."""
    key = (shape.key, mask)
    got = _GPU_SETS.get(key)
    if got is None:
        if len(_GPU_SETS) >= 1 << 16:
            _GPU_SETS.clear()
        got = _GPU_SETS[key] = frozenset(shape.gpus_of(mask))
    return got


class TopologyKey:
    """A hashable cluster topology (see :meth:`ClusterSnapshot.topology`) that hashes once."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TopologyKey) and (
            other is self or (self._hash == other._hash and self.parts == other.parts)
        )
