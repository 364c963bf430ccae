"""Capacity tables: how many pods of a pod set each node holds now, and at which tier.

A node's entry for a pod set is (pods that fit, at most the set's count; the node's free GPU
mask; the in-node tier each pod gets), or none. It depends only on the node's class (node
type, free mask, the kubelet's NUMA rule for the pod set), so it is worked out once per class
(kept across decisions in :class:`~extender.placement.search.memory.ClassTables`) and a
table is a grouping of the nodes by (node type, rule, entry): a search reads a few nodes'
entries, and a table of every node's would cost more than the search itself on a large
cluster. Where nodes limit cpu, memory or pod slots (NodeResourcesFit), each node's room for
the pod set's pods caps its entry, and the groups are split by that room.

A branch of the search that took GPUs on some nodes gets the table of the empty branch with
those nodes' entries overridden (memoised per decision by what was taken). Also here: the
room a placement leaves next to it for the pod sets that colocate with it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence

from extender.cost import Comm
from extender.placement.feasibility import Resources
from extender.placement.numa_fit import NumaRule
from extender.placement.request import PodSet
from extender.placement.scoring import Need, node_scope, pod_tier, pods_talk, resolve_level, room_taken
from extender.placement.search.context import Decision, Taken
from extender.placement.search.memory import Entry, EntryClass
from extender.topology.model import Tier

#: (node type, the kubelet's NUMA rule, capacity entry): nodes the search works out once.
GroupKey = tuple[str, NumaRule | None, Entry]
#: Nodes with the same capacity entry (each list in node index order), by group key.
Groups = dict[GroupKey, list[int]]
#: Room for colocated pod sets is checked on domains of at most this many nodes (larger ones
#: count as roomy), and on at most this many candidate nodes of each node type.
ROOM_CHECK_NODES = 64

_MISSING: Entry | None = (-1, -1, Tier.NODE)  # a memo miss (no capacity entry looks like it)


class CapacityTable(Mapping[int, Entry]):
    """A capacity table of the nodes in ``groups``. A node's entry is looked up by its class
    (node type, free mask, the kubelet's NUMA rule: ``rules`` by node index, None where no
    kubelet aligns) in ``entries``, the pod set's entry per class, unless ``override`` has it
    (nodes this gang took from). Where nodes limit resources, ``rooms`` (by node index,
    NodeResourcesFit's room for one pod set's pods) caps each class entry. ``admitted``
    (the nodes the pod set's filters admit; None: all) and ``within`` (None: no restriction)
    leave nodes out."""

    __slots__ = (
        "_admitted",
        "_entries",
        "_free",
        "_kinds",
        "_len",
        "_override",
        "_rooms",
        "_rules",
        "_within",
        "groups",
    )

    def __init__(
        self,
        groups: Groups,
        entries: Mapping[EntryClass, Entry | None],
        kinds: Sequence[str],
        free: Sequence[int],
        admitted: frozenset[int] | None,
        rules: Sequence[NumaRule | None] | None,
        override: Mapping[int, Entry | None] | None = None,
        within: set[int] | None = None,
        rooms: Sequence[int] | None = None,
    ) -> None:
        self.groups = groups
        self._entries, self._kinds, self._free, self._rules = entries, kinds, free, rules
        self._admitted, self._override, self._within = admitted, override, within
        self._rooms = rooms
        self._len = sum(map(len, groups.values()))

    def get(self, i: int, default: Entry | None = None) -> Entry | None:  # type: ignore[override]
        if self._override is not None and i in self._override:
            entry = self._override[i]
        elif self._admitted is not None and i not in self._admitted:
            return default
        else:
            rule = self._rules[i] if self._rules is not None else None
            entry = self._entries.get((self._kinds[i], self._free[i], rule))
            if entry is not None and self._rooms is not None and self._rooms[i] < entry[0]:
                room = self._rooms[i]
                entry = (room, entry[1], entry[2]) if room > 0 else None
        if entry is None or (self._within is not None and i not in self._within):
            return default
        return entry

    def __getitem__(self, i: int) -> Entry:
        entry = self.get(i)
        if entry is None:
            raise KeyError(i)
        return entry

    def __contains__(self, i: object) -> bool:
        return isinstance(i, int) and self.get(i) is not None

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self.groups.values())

    def __len__(self) -> int:
        return self._len

    def patched(
        self, groups: Groups, override: Mapping[int, Entry | None], within: set[int] | None
    ) -> CapacityTable:
        """The same lookups over other groups, with more overrides or fewer nodes."""
        merged = {**(self._override or {}), **override} if override else self._override
        if within is not None and self._within is not None:
            within = within & self._within
        return CapacityTable(
            groups,
            self._entries,
            self._kinds,
            self._free,
            self._admitted,
            self._rules,
            merged,
            within if within is not None else self._within,
            self._rooms,
        )

    def table(self) -> dict[int, Entry]:
        """Every node's entry (for the paths that read them all)."""
        out: dict[int, Entry] = {}
        for (_, _, entry), members in self.groups.items():
            out.update(dict.fromkeys(members, entry))
        return out


def table(ctx: Decision, ps: PodSet, need: Need, taken: Taken, preferred: bool) -> CapacityTable:
    """Nodes that fit at least one pod of ``ps`` given what this gang already took (the same
    table for every order and beam branch that took the same GPUs)."""
    key = (ps.name, preferred, taken.key())
    got = ctx.tables.caps.get(key)
    if got is not None:
        assert isinstance(got, CapacityTable)
        return got
    if taken.gpus or taken.used:
        base = table(ctx, ps, need, Taken(), preferred)
        kinds = ctx.snap.kinds()
        rules = ctx.rules(ps) if ctx.aligning else None
        groups = dict(base.groups)
        touched: set[GroupKey] = set()
        override: dict[int, Entry | None] = {}
        for i in dict.fromkeys([*taken.gpus, *taken.used]):
            rule = rules[i] if rules is not None else None
            old = base.get(i)
            if old is not None:
                k = (kinds[i], rule, old)
                if k not in touched:
                    groups[k] = list(groups[k])
                    touched.add(k)
                groups[k].remove(i)
                if not groups[k]:
                    del groups[k]
                    touched.discard(k)
            free = ctx.snap.free_mask(i) & ~taken.gpus.get(i, 0)
            entry = override[i] = node_entry(ctx, ps, need, i, free, preferred, taken.used.get(i))
            if entry is not None:
                k = (kinds[i], rule, entry)
                if k not in touched:
                    groups[k] = list(groups.get(k, ()))
                    touched.add(k)
                bisect.insort(groups[k], i)
        caps = base.patched(groups, override, None)
    else:
        caps = _scan(ctx, ps, need, preferred)
    ctx.tables.caps[key] = caps
    return caps


def _scan(ctx: Decision, ps: PodSet, need: Need, preferred: bool) -> CapacityTable:
    """Every node's capacity for ``ps``: one capacity search per node type and free mask,
    one tier per node type."""
    snap = ctx.snap
    memo = _entries(ctx, ps, need, preferred)
    gpus = ps.gpus_per_pod
    groups: Groups = {}
    admitted = snap.admitted(ps.node_needs)
    kinds, frees = snap.kinds(), snap.free_masks()
    rules = ctx.rules(ps) if ctx.aligning else None

    def entry_of(kind: str, free: int, rule: NumaRule | None, first: int) -> Entry | None:
        """The class's entry (its first member stands for all), computed once per table."""
        k = (kind, free, rule)
        entry = memo.get(k, _MISSING)
        if entry is _MISSING:
            entry = memo[k] = _class_entry(ctx, ps, need, first, free, preferred)
        return entry

    if snap.limits_resources:
        # A node's room (NodeResourcesFit) caps its entry: the classes are split by room, so
        # the work stays per class.
        room_key, rooms = _rooms_of(ctx, ps)
        classes = snap.room_classes(ps.node_needs, room_key, rooms, gpus, ps.count)
        for (kind, free, room), members in classes.items():
            if free.bit_count() < gpus:
                continue
            for rule, alike in _by_rule(members, rules):
                entry = entry_of(kind, free, rule, alike[0])
                if entry is None:
                    continue
                if room < entry[0]:
                    entry = (room, entry[1], entry[2])
                key = (kind, rule, entry)
                known = groups.get(key)
                # Rooms above what the GPUs hold of these pods fall into one group.
                groups[key] = alike if known is None else sorted(known + alike)
        return CapacityTable(groups, memo, kinds, frees, admitted, rules, rooms=rooms)
    for (kind, free), members in snap.free_classes().items():
        if free.bit_count() < gpus:
            continue
        if admitted is not None:
            members = [i for i in members if i in admitted]
            if not members:
                continue
        for rule, alike in _by_rule(members, rules):
            entry = entry_of(kind, free, rule, alike[0])
            if entry is not None:
                groups[(kind, rule, entry)] = alike
    return CapacityTable(groups, memo, kinds, frees, admitted, rules)


def _rooms_of(ctx: Decision, ps: PodSet) -> tuple[object, list[int]]:
    """Every node's room for one more pod of ``ps`` (:func:`_within_room` with nothing of the
    gang there yet), by node index, and a key naming that table."""
    snap = ctx.snap
    plain = snap.rooms(ps.requests)
    if not ctx.has_fabric or not ps.gpus_per_pod or not pods_talk(ps):
        return (ps.requests, None), plain
    key = (ps.requests, ctx.gang.name)
    rooms = ctx.tables.rooms.get(key)
    if rooms is None:
        # Only clique nodes keep room for the IMEX daemon (scoring.room_taken).
        rooms = ctx.tables.rooms[key] = list(plain)
        for i in ctx.clique_nodes:
            taken = room_taken(snap, ctx.gang.name, ps, i, None)
            if taken is not None:
                rooms[i] = snap.room(i, ps.requests, taken)
    return key, rooms


def restricted(ctx: Decision, ps: PodSet, caps: CapacityTable, nodes: set[int]) -> CapacityTable:
    """``caps`` on ``nodes`` only."""
    kinds = ctx.snap.kinds()
    groups: Groups = {}
    for i in sorted(nodes) if len(nodes) < len(caps) else caps:
        entry = caps.get(i) if i in nodes else None
        if entry is not None:
            groups.setdefault((kinds[i], ctx.rule(i, ps), entry), []).append(i)
    return caps.patched(groups, {}, nodes)


def node_entry(
    ctx: Decision, ps: PodSet, need: Need, i: int, free: int, preferred: bool, used: Resources | None = None
) -> Entry | None:
    """(pods of ``ps`` that fit, free mask, tier) on node ``i`` with ``free`` GPUs, or None
    when none fits: the same for every node of one type with the same free GPUs, capped by
    what the node's other resources hold (``used``: taken there by this gang already)."""
    if free.bit_count() < ps.gpus_per_pod:
        return None
    admitted = ctx.snap.admitted(ps.node_needs)
    if admitted is not None and i not in admitted:
        return None
    memo = _entries(ctx, ps, need, preferred)
    k = (ctx.snap.kinds()[i], free, ctx.rule(i, ps))
    if k not in memo:
        memo[k] = _class_entry(ctx, ps, need, i, free, preferred)
    got = memo[k]
    return _within_room(ctx, ps, i, got, used) if got is not None else None


def _within_room(ctx: Decision, ps: PodSet, i: int, entry: Entry, used: Resources | None) -> Entry | None:
    """``entry`` with at most as many pods as NodeResourcesFit lets onto node ``i``."""
    snap = ctx.snap
    if not snap.limits_resources:
        return entry
    room = snap.room(i, ps.requests, room_taken(snap, ctx.gang.name, ps, i, used))
    if room >= entry[0]:
        return entry
    return (room, entry[1], entry[2]) if room > 0 else None


def _entries(ctx: Decision, ps: PodSet, need: Need, preferred: bool) -> dict[EntryClass, Entry | None]:
    """The capacity entries of ``ps`` per class, shared with earlier decisions for the same
    pod set (:class:`~extender.placement.search.memory.ClassTables`)."""
    got = ctx.tables.entries.get((ps.name, preferred))
    if got is None:
        got = ctx.tables.entries[(ps.name, preferred)] = ctx.memory.classes.entries((ps, need, preferred))
    return got


def _class_entry(ctx: Decision, ps: PodSet, need: Need, i: int, free: int, preferred: bool) -> Entry | None:
    """The entry of node ``i``'s class, worked out on node ``i``."""
    tier = pod_tier(ctx.snap, i, ps, need, preferred)
    if tier is None:
        return None
    cap = ctx.fit(i, ps).capacity(free, ps.gpus_per_pod, tier)
    return (min(cap, ps.count), free, tier) if cap else None


def _by_rule(
    members: list[int], rules: Sequence[NumaRule | None] | None
) -> Iterable[tuple[NumaRule | None, list[int]]]:
    """``members`` split by the kubelet's NUMA rule for the pod set (each part in order)."""
    if rules is None:
        return ((None, members),)
    parts: dict[NumaRule | None, list[int]] = {}
    for i in members:
        parts.setdefault(rules[i], []).append(i)
    return parts.items()


# -- room next to a placement for the pod sets that colocate with it -------------------------
def colocation_nodes(ctx: Decision, nodes: set[int], level: str) -> set[int] | None:
    """The nodes that share a domain at ``level`` with one of ``nodes`` (None: the level is
    an in-node one, not judged)."""
    scope, _ = resolve_level(level, ctx.h)
    if scope is None:
        return None
    if scope >= node_scope(ctx.h):
        return nodes
    keys = {ctx.h.domain(ctx.snap.path(i), scope) for i in nodes}
    if None in keys:
        return nodes
    domains = ctx.snap.domains()
    return {i for k in keys if k is not None for i in domains.get(k, ())}


def room_for(
    ctx: Decision,
    dependents: Sequence[PodSet],
    masks: Mapping[int, int],
    taken: Taken,
    nodes: Iterable[int] | None = None,
) -> bool:
    """Whether every pod set colocating with a pod set placed on ``nodes`` (by default the
    nodes of ``masks``, the GPUs it takes) still fits next to it."""
    where = set(masks if nodes is None else nodes)
    for d in dependents:
        assert d.colocate_with is not None
        domain = colocation_nodes(ctx, where, d.colocate_with.level)
        if domain is None or len(domain) > ROOM_CHECK_NODES:
            continue
        need = ctx.needs[d.name]
        room = 0
        for i in domain:
            free = ctx.snap.free_mask(i) & ~taken.gpus.get(i, 0) & ~masks.get(i, 0)
            entry = node_entry(ctx, d, need, i, free, False, taken.used.get(i))
            room += entry[0] if entry else 0
        if room < d.count:
            return False
    return True


def kv_short(ctx: Decision, dependents: Sequence[PodSet], masks: Mapping[int, int], taken: Taken) -> int:
    """How many pods of the kv-transfer sets colocating with a pod set placed on ``masks`` find
    no room on its nodes (where their KV hand-off would stay inside a node)."""
    short = 0
    for d in dependents:
        if d.comm != Comm.KV_TRANSFER or d.gpus_per_pod == 0:
            continue
        need = ctx.needs[d.name]
        room = 0
        for i in masks:
            free = ctx.snap.free_mask(i) & ~taken.gpus.get(i, 0) & ~masks[i]
            entry = node_entry(ctx, d, need, i, free, False, taken.used.get(i))
            room += entry[0] if entry else 0
        short += max(0, d.count - room)
    return short
