"""What the solver may carry from one decision to the next, in one object its caller owns.

A decision's own tables (:class:`~extender.placement.search.context.Decision`) die with it.
Two kinds of answers are worth keeping longer, because a cluster's node classes and its
topology recur from one decision to the next while its nodes change hands:

- :class:`ClassTables`: what the search works out per class of nodes (node type, free GPU
  mask, the kubelet's NUMA rule) for a pod set. Each entry is a function of the pod set,
  its resolved rules and the class alone (never of a node's name, labels or neighbours), so
  a table warmed on one cluster answers any other exactly as an empty one would.
- :class:`EmptyFits`: whether a gang fits its cluster with nothing allocated or reserved
  (``Unplaceable.feasible_when_empty``), per cluster topology and pod sets. A refusal asks
  it every time; the solve on the emptied cluster runs once per kind of gang.

A :class:`SolverMemory` holds both. Nothing here is module-global: the snapshot a caller
builds carries one (:attr:`~extender.placement.snapshot.ClusterSnapshot.memory`) and every
view derived from that snapshot shares it, so the extender's cache (which builds the
snapshot and keeps it for the life of the process) and the simulator (one base snapshot
per run) each own theirs; a caller may also hand one to
:func:`~extender.placement.search.decide.decide` itself. Both tables are bounded.

This module is the bottom layer of :mod:`extender.placement.search`: it imports none of the
other phases (the snapshot imports it), and learns the types it stores only for checking.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from extender.topology.model import Tier

if TYPE_CHECKING:
    from extender.placement.numa_fit import NumaRule
    from extender.placement.request import GangRequest, PodSet
    from extender.placement.scoring import Need
    from extender.placement.snapshot import ClusterSnapshot, TopologyKey

#: A capacity entry of one node for one pod set: (pods of the pod set that fit there, at most
#: its count; the node's free GPU mask; the in-node tier each pod gets).
Entry: TypeAlias = tuple[int, int, Tier]
#: Nodes alike for a pod set's capacity: (node type, free mask, the kubelet's NUMA rule there).
EntryClass: TypeAlias = "tuple[str, int, NumaRule | None]"
#: What a pod set's capacity entries are memoised under: the pod set, its resolved rules,
#: and whether its preferred tier applies.
PodSetKey: TypeAlias = "tuple[PodSet, Need, bool]"
#: (GPUs per pod, node type, free mask, tier, NUMA rule): one pod's best ring bandwidth.
GbpsKey: TypeAlias = "tuple[int, str, int, Tier, NumaRule | None]"
#: ((GPUs per pod, pods), node type, NUMA rule, entry): what the multi-node search reads.
SpeedKey: TypeAlias = "tuple[tuple[int, int], str, NumaRule | None, Entry]"


class ClassTables:
    """Per class of nodes, for a pod set: the capacity entries of the last
    :data:`POD_SETS` pod sets; one pod's best ring bandwidth (GB/s) per (GPUs, node type,
    free mask, tier, rule); per multi-node search class, that bandwidth with the class's
    packed counts; and per (node type, GPUs per pod, tier) the fastest GPU set's bandwidth."""

    POD_SETS = 256
    GBPS = 1 << 20

    def __init__(self) -> None:
        self._entries: OrderedDict[PodSetKey, dict[EntryClass, Entry | None]] = OrderedDict()
        self.gbps: dict[GbpsKey, float] = {}
        #: (pod bandwidth in GB/s, :func:`~extender.placement.search.across_nodes.pack` of the
        #: class's counts), per :data:`SpeedKey`.
        self.speeds: dict[SpeedKey, tuple[float, int]] = {}
        #: Per (node type, GPUs per pod, tier): the fastest GPU set's ring bandwidth, GB/s.
        self.tops: dict[tuple[str, int, Tier], float] = {}

    def entries(self, key: PodSetKey) -> dict[EntryClass, Entry | None]:
        """The capacity entries of one pod set (filled in by the caller), the pod set used
        longest ago dropped first; the bandwidth tables are emptied when they grow too large."""
        got = self._entries.get(key)
        if got is None:
            got = self._entries[key] = {}
            while len(self._entries) > self.POD_SETS:
                self._entries.popitem(last=False)
            if len(self.gbps) + len(self.speeds) > self.GBPS:
                self.gbps.clear()
                self.speeds.clear()
        else:
            self._entries.move_to_end(key)
        return got


class EmptyFits:
    """Whether a gang fits its cluster with nothing allocated or reserved, per cluster
    topology (:meth:`ClusterSnapshot.topology`: what allocation does not change) and pod sets
    (whatever the gang is called). Bounded: the last :data:`TOPOLOGIES` topologies, and
    :data:`GANGS` answers each."""

    TOPOLOGIES = 4
    GANGS = 1024

    def __init__(self) -> None:
        self._by_topology: OrderedDict[TopologyKey, tuple[ClusterSnapshot, dict[object, bool]]] = (
            OrderedDict()
        )

    def fits(
        self,
        snap: ClusterSnapshot,
        gang: GangRequest,
        exact_fallback: bool,
        solve: Callable[[ClusterSnapshot], bool],
    ) -> bool:
        """Whether ``gang`` fits ``snap`` emptied: ``solve(emptied)`` once per topology and
        pod sets, remembered after. A snapshot that is empty already did not fit (the caller
        asks after a refusal), so it is not solved again."""
        if (
            all(not (n.allocated or n.mnnvl_gang or n.foreign_domain) for n in snap.nodes)
            and not any(snap.reserved.values())
            and not snap.reserved_mnnvl
        ):
            return False
        topology = snap.topology()
        got = self._by_topology.get(topology)
        if got is None:
            got = self._by_topology[topology] = (snap.emptied(), {})
            while len(self._by_topology) > self.TOPOLOGIES:
                self._by_topology.popitem(last=False)
        else:
            self._by_topology.move_to_end(topology)
        empty, answers = got
        key = (gang.pod_sets, exact_fallback)
        if key not in answers:
            if len(answers) >= self.GANGS:
                answers.pop(next(iter(answers)))
            answers[key] = solve(empty)
        return answers[key]


@dataclass(eq=False)
class SolverMemory:
    """Everything the solver keeps across decisions: owned by whoever builds the snapshot (or
    passes it to :func:`~extender.placement.search.decide.decide`), never by a module."""

    classes: ClassTables = field(default_factory=ClassTables)
    empty_fits: EmptyFits = field(default_factory=EmptyFits)
