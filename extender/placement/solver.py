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
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from extender.cost import Comm
from extender.placement import choice, feasibility
from extender.placement.exact import exact_slice
from extender.placement.feasibility import Resources
from extender.placement.node_fit import fit_for
from extender.placement.numa_fit import GpuFit, NumaRule, fit_on, refusal, rule_for, rule_key
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import (
    ANYWHERE,
    Need,
    Span,
    clique_gbps,
    colocation_misses,
    fabric_waste,
    in_node_span,
    mnnvl_nodes,
    node_scope,
    on_whole_clique,
    pod_set_cost,
    pod_set_fabric_waste,
    pod_set_micros,
    pod_tier,
    pods_talk,
    resolve_level,
    resolve_need,
    room_taken,
)
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState, TopologyKey
from extender.topology.hierarchy import DomainKey
from extender.topology.model import Tier

#: How many candidate domains per level are evaluated in full.
CANDIDATES = 4
#: How many placements of an early pod set are carried forward (gangs of up to 3 pod sets).
BEAM = 3
#: Gangs of more pod sets are placed in one order first, trying others only on failure.
ALL_ORDERS_UP_TO = 3
#: Once the candidate search of one gang has looked at this many nodes (summed over its pod
#: set placements), it stops widening: no further beam branches or pod set orders, only
#: what completes the slice. Small clusters never reach it; a P/D gang on 5,000 nodes does.
WORK_BUDGET = 50_000
#: Room for colocated pod sets is checked on domains of at most this many nodes (larger ones
#: count as roomy), and on at most this many candidate nodes of each node type.
ROOM_CHECK_NODES = 64

PREFERRED = "preferred level"
COLOCATE = "colocation"

#: node index -> (pods of the pod set that fit, at most its count; free mask; tier per pod)
Entry = tuple[int, int, Tier]
Caps = Mapping[int, Entry]
#: Nodes alike for a pod set's capacity: (node type, free mask, the kubelet's NUMA rule there).
EntryClass = tuple[str, int, NumaRule | None]
#: (node type, the kubelet's NUMA rule, capacity entry): nodes the solver works out once.
GroupKey = tuple[str, NumaRule | None, Entry]
#: Nodes with the same capacity entry, by group key.
Groups = dict[GroupKey, list[int]]


class _Caps(Mapping[int, Entry]):
    """A capacity table of the nodes in ``groups``. A node's entry is looked up by its class
    (node type, free mask, the kubelet's NUMA rule: ``rules`` by node index, None where no
    kubelet aligns) in ``entries``, the pod set's entry per class, unless ``override`` has it
    (nodes this gang took from): a search reads a few nodes' entries, and a table of every
    node's would cost more than the search itself on a large cluster. Where nodes limit
    resources, ``rooms`` (by node index, NodeResourcesFit's room for one pod set's pods) caps
    each class entry, and the groups are split by that room."""

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

    def patched(self, groups: Groups, override: Mapping[int, Entry | None], within: set[int] | None) -> _Caps:
        """The same lookups over other groups, with more overrides or fewer nodes."""
        merged = {**(self._override or {}), **override} if override else self._override
        if within is not None and self._within is not None:
            within = within & self._within
        return _Caps(
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


#: How a finished slice ranks: (clique GPUs off the fabric, cost, notes), lower is better.
SliceKey = tuple[int, int, float, int]
#: (clique GPUs off the fabric, cost) of a placement: the objective, lexicographic.
Price = tuple[int, float]


_MISSING: Entry | None = (-1, -1, Tier.NODE)  # a memo miss (no capacity entry looks like it)


def _q(micros: float) -> float:
    """Costs this close are ties (float noise between equal placements)."""
    return round(micros, 6)


@dataclass
class _Shortfall:
    """Why a pod set has no placement. The reason text is built only for the failure that is
    finally reported (``explain`` returns the reason, the closest domain and the pods short)."""

    pod_set: str
    explain: Callable[[], tuple[str, str | None, int]]


@dataclass(frozen=True)
class _Done:
    key: SliceKey
    slice: Slice


@dataclass
class _State:
    """GPUs taken by pod sets of this gang placed so far, per node index, and what their
    pods take of the nodes' other resources (NodeResourcesFit: cpu, memory, pod slots)."""

    taken: dict[int, int] = field(default_factory=dict)
    used: dict[int, Resources] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(dict(self.taken), dict(self.used))


@dataclass(frozen=True)
class _Option:
    """One way to place one pod set."""

    slots: tuple[PodSlot, ...]
    masks: Mapping[int, int]  # node index -> GPUs taken there
    level: int  # node_scope for one node, else the level index of the domain (ANYWHERE: cluster)
    where: str
    waste: int  # clique GPUs taken off the fabric (scoring.pod_set_fabric_waste)
    cost: float
    fit: tuple[float, ...]  # fragmentation, lower is better
    misses: tuple[str, ...] = ()  # soft wishes not met: PREFERRED, COLOCATE
    notes: tuple[str, ...] = ()  # the misses said plainly
    no_room: bool = False  # a pod set that colocates with this one has no room next to it
    #: Pods of kv-transfer sets colocating with this one that its own nodes cannot hold: each
    #: of those hands its KV cache over the network rather than inside a node.
    kv_short: int = 0
    #: Nodes with every GPU free that this placement breaks into.
    opened: int = 0
    kinds: frozenset[str] = frozenset()  # the node types it uses

    @property
    def price(self) -> Price:
        return (self.waste, _q(self.cost))

    def key(self) -> tuple[float, ...]:
        return (
            self.waste,
            float(COLOCATE in self.misses),
            _q(self.cost),
            len(self.misses),
            float(self.no_room),
            self.kv_short,
            self.opened,
            -self.level,
            *self.fit,
        )


@dataclass(frozen=True)
class _Links:
    """The KV hand-offs a pod set's placement decides: from its partner, when it is a
    kv-transfer set whose colocateWith set is placed, and to the kv-transfer sets already
    placed that colocate with it."""

    partner: tuple[PodSlot, ...] = ()
    dependents: tuple[tuple[PodSet, tuple[PodSlot, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.partner or self.dependents)

    def groups(self) -> list[tuple[PodSlot, ...]]:
        return [g for g in (self.partner, *(slots for _, slots in self.dependents)) if g]


@dataclass(frozen=True)
class _NodePick:
    """A pod set's GPU sets on one node, with what the choice costs and leaves behind."""

    masks: tuple[int, ...]
    union: int  # every GPU the pods take
    cost: float
    leftover: int
    coherent: int


class Solver:
    """Places gangs on a snapshot. Stateless between calls apart from memo tables.

    ``exact_fallback`` turns the exact search for small gangs on (the default) or off (to
    measure the normal path on its own).
    """

    def __init__(self, snapshot: ClusterSnapshot, exact_fallback: bool = True) -> None:
        self.snap = snapshot
        self.h = snapshot.hierarchy
        self.exact_fallback = exact_fallback
        # Capacity tables per (pod set, preferred tier, GPUs this gang took so far).
        self._caps_memo: dict[
            tuple[str, bool, tuple[tuple[int, int], ...], tuple[tuple[int, Resources], ...]], Caps
        ] = {}
        # Capacity entries per (pod set, preferred tier), then per class (node type, free mask,
        # the kubelet's NUMA rule for the pod set there).
        self._entries: dict[tuple[str, bool], dict[EntryClass, Entry | None]] = {}
        self._picks: dict[tuple[str, str, int, Tier, NumaRule | None], _NodePick] = {}
        self._gbps: dict[tuple[int, str, int, Tier, NumaRule | None], float] = _CLASS_TABLES.gbps
        # pod_set_micros per (pod set, slots, partner slots), the tuples kept alive with it.
        self._micros: dict[tuple[str, int, int], tuple[float, object, object]] = {}
        # Every node's room for one more pod of a talking pod set (IMEX daemon room kept on
        # clique nodes), per (requests, gang).
        self._rooms: dict[tuple[object, str], list[int]] = {}
        self._aligning = snapshot.aligning()  # any node whose kubelet aligns pods to NUMA nodes
        self._worths: dict[str, float] = {}
        self._has_fabric = snapshot.has_cliques
        self._work = 0
        self._needs: dict[str, Need] = {}  # the gang being placed: each pod set's resolved rules
        self._gang = ""  # the name of the gang being placed
        self._placing: PodSet | None = None  # the pod set whose options are being found

    # -- entry point ---------------------------------------------------------------------
    def place(self, gang: GangRequest) -> Placement:
        # Memo tables keyed by pod set name belong to one gang.
        self._caps_memo.clear()
        self._micros.clear()
        self._rooms.clear()
        self._entries.clear()
        self._picks.clear()
        self._work = 0
        self._gang = gang.name
        needs = self._needs = {ps.name: resolve_need(ps, self.h) for ps in gang.pod_sets}
        best: _Done | None = None
        first_failure: _Shortfall | None = None
        try_all = len(gang.pod_sets) <= ALL_ORDERS_UP_TO
        for order in self._orders(gang):
            result = self._search(gang, order, needs, BEAM if try_all else 1)
            if isinstance(result, _Done):
                if best is None or result.key < best.key:
                    best = result
                if not try_all or self._work > WORK_BUDGET:
                    break
            elif first_failure is None:
                first_failure = result
        if best is not None:
            return best.slice
        assert first_failure is not None
        if self.exact_fallback and self._each_fits_alone(gang, needs):
            exact = exact_slice(self.snap, gang, needs)
            if exact is not None:
                return exact
        reason, closest, short_by = first_failure.explain()
        return Unplaceable(
            gang=gang.name,
            reason=reason,
            pod_set=first_failure.pod_set,
            closest=closest,
            short_by=short_by,
            feasible_when_empty=_EMPTY_FITS.fits(self.snap, gang, self.exact_fallback),
        )

    def _orders(self, gang: GangRequest) -> Iterable[Sequence[PodSet]]:
        """Pod sets others colocate with first, then the largest; then every other order."""
        anchors = {ps.colocate_with.pod_set for ps in gang.pod_sets if ps.colocate_with}
        default = sorted(gang.pod_sets, key=lambda ps: (ps.name not in anchors, -ps.gpus, ps.name))
        yield default
        for i, perm in enumerate(itertools.permutations(default)):
            if i >= 24:
                break
            if list(perm) != default:
                yield perm

    def _search(
        self, gang: GangRequest, order: Sequence[PodSet], needs: dict[str, Need], beam: int
    ) -> _Done | _Shortfall:
        """Place the pod sets in ``order``, carrying the ``beam`` best placements of every pod
        set but the last forward; the best complete slice by the objective wins."""
        best: list[_Done] = []
        failure: list[_Shortfall] = []

        def go(k: int, state: _State, placed: dict[str, _Option]) -> None:
            if k == len(order):
                done = self._finish(gang, placed)
                if not best or done.key < best[0].key:
                    best[:] = [done]
                return
            ps = order[k]
            got = self._options(gang, ps, needs[ps.name], state, placed)
            if isinstance(got, _Shortfall):
                if not failure:
                    failure.append(got)
                return
            for n, opt in enumerate(_beam(got, beam if k < len(order) - 1 else 1)):
                if n and self._work > WORK_BUDGET:
                    break
                trial = state.copy()
                self._commit(opt, trial, ps)
                go(k + 1, trial, {**placed, ps.name: opt})

        go(0, _State(), {})
        if best:
            return best[0]
        return failure[0]

    def _commit(self, opt: _Option, state: _State, ps: PodSet | None = None) -> None:
        for i, mask in opt.masks.items():
            state.taken[i] = state.taken.get(i, 0) | mask
        if ps is not None and self.snap.limits_resources:
            one = feasibility.usage(ps.requests)
            for slot in opt.slots:
                i = self.snap.index(slot.node)
                state.used[i] = state.used.get(i, feasibility.NOTHING).plus(one)

    def _finish(self, gang: GangRequest, placed: dict[str, _Option]) -> _Done:
        slots = [s for ps in gang.pod_sets for s in placed[ps.name].slots]
        # As scoring.gang_micros: each pod set on its slots, with its colocateWith set's.
        micros = {
            ps.name: self._pod_set_micros(
                ps, placed[ps.name].slots, placed[ps.colocate_with.pod_set].slots if ps.colocate_with else ()
            )
            for ps in gang.pod_sets
        }
        notes = [n for ps in gang.pod_sets for n in placed[ps.name].notes]
        # Every colocation the slice misses carries a note: one placed before its colocateWith
        # set was not judged against it, and one judged against a set spread over several
        # domains may sit next to some of its pods only.
        misses = colocation_misses(self.snap, gang, slots)
        for name, why in misses.items():
            if COLOCATE not in placed[name].misses:
                notes.append(f"pod set {name}: {why}; placed within {placed[name].where}")
        sl = Slice(
            gang=gang.name,
            slots=tuple(slots),
            pod_set_micros=micros,
            score=round(sum(micros.values()), 3),
            domains={ps.name: placed[ps.name].where for ps in gang.pod_sets},
            notes=tuple(notes),
            mnnvl_nodes=mnnvl_nodes(self.snap, gang, slots),
        )
        waste = fabric_waste(self.snap, gang, slots)
        return _Done((waste, len(misses), _q(sl.per_layer_micros), len(notes)), sl)

    def _pod_set_micros(self, ps: PodSet, slots: tuple[PodSlot, ...], partner: tuple[PodSlot, ...]) -> float:
        """scoring.pod_set_micros, once per placement: the price of an option and the
        finished slice read the same slots."""
        key = (ps.name, id(slots), id(partner))
        got = self._micros.get(key)
        if got is None:
            got = self._micros[key] = (pod_set_micros(self.snap, ps, slots, partner), slots, partner)
        return got[0]

    # -- one pod set: candidates ---------------------------------------------------------
    def _options(
        self, gang: GangRequest, ps: PodSet, need: Need, state: _State, placed: dict[str, _Option]
    ) -> list[_Option] | _Shortfall:
        """Every candidate placement of ``ps`` found, best first; or why there is none."""
        self._placing = ps
        if ps.gpus_per_pod == 0:
            got = self._gpuless(ps, state, placed)
            return [got] if isinstance(got, _Option) else got
        colo = ps.colocate_with
        partner: tuple[PodSlot, ...] = placed[colo.pod_set].slots if colo and colo.pod_set in placed else ()
        within, wish = self._colocation_scope(gang, ps, placed)
        links = _Links(
            partner if ps.comm == Comm.KV_TRANSFER else (),
            tuple(
                (d, placed[d.name].slots)
                for d in gang.pod_sets
                if d.comm == Comm.KV_TRANSFER
                and d.colocate_with
                and d.colocate_with.pod_set == ps.name
                and d.name in placed
            ),
        )
        dependents = [
            d
            for d in gang.pod_sets
            if d.colocate_with and d.colocate_with.pod_set == ps.name and d.name not in placed
        ]
        found: dict[tuple[tuple[int, int], ...], _Option] = {}
        shortfall: _Shortfall | None = None
        within_found = False
        for preferred in (True, False) if need.preferred_tier is not None else (False,):
            every = self._caps(gang, ps, need, state, preferred)
            for restrict in (within, None) if within is not None else (None,):
                caps = every if restrict is None else self._restricted(ps, every, restrict)
                opts = self._pass(gang, ps, need, caps, state, links, dependents)
                if not opts and not preferred and restrict is None:
                    shortfall = self._shortfall(gang, ps, need, caps)
                within_found = within_found or (restrict is not None and bool(opts))
                for o in opts:
                    found.setdefault(tuple(sorted(o.masks.items())), o)
        if not found:
            assert shortfall is not None
            return shortfall
        opts = [self._judge(ps, need, o, within, dependents, state) for o in found.values()]
        opts.sort(key=_Option.key)
        return [dataclasses.replace(o, notes=self._explain(ps, o, opts, within_found, wish)) for o in opts]

    def _gpuless(self, ps: PodSet, state: _State, placed: Mapping[str, _Option]) -> _Option | _Shortfall:
        """Pods without GPUs go next to their colocateWith set when it is placed, else to a
        node the gang already uses, else to the first node; each to the first of those its
        filters admit and that has room (NodeResourcesFit), then any other such node."""
        c = ps.colocate_with
        first: list[int] = []
        if c is not None and c.pod_set in placed:
            first = [self.snap.index(s.node) for s in placed[c.pod_set].slots]
        first += sorted(state.taken)
        admitted = self.snap.admitted(ps.node_needs)
        rest = range(len(self.snap.nodes))
        slots: list[PodSlot] = []
        names: list[str] = []
        for i in dict.fromkeys([*first, *rest]):
            if admitted is not None and i not in admitted:
                continue
            room = min(self.snap.room(i, ps.requests, state.used.get(i)), ps.count - len(slots))
            name = self.snap.nodes[i].name
            slots += [PodSlot(ps.name, len(slots) + k, name, ()) for k in range(room)]
            if room:
                names.append(name)
            if len(slots) == ps.count:
                break
        if len(slots) < ps.count:
            have = len(slots)
            return _Shortfall(
                ps.name,
                lambda: (
                    f"pod set {ps.name}: the cluster has room for {have} of {ps.count} pods without GPUs"
                    + self._refused_words(ps),
                    None,
                    ps.count - have,
                ),
            )
        cost = pod_set_micros(self.snap, ps, slots)
        where = f"node {names[0]}" if len(names) == 1 else "cluster"
        return _Option(tuple(slots), {}, node_scope(self.h), where, 0, cost, ())

    def _judge(
        self,
        ps: PodSet,
        need: Need,
        o: _Option,
        within: set[int] | None,
        dependents: Sequence[PodSet],
        state: _State,
    ) -> _Option:
        """The soft wishes an option misses, and whether it leaves room for colocated sets."""
        misses: list[str] = []
        nodes = sorted(o.masks) or [self.snap.index(s.node) for s in o.slots]
        if need.preferred_tier is not None:
            shapes = [self.snap.node(s.node).shape for s in o.slots]
            if any(
                sh.tier_of(fit_for(sh).mask_of(s.gpus)) > need.preferred_tier
                for sh, s in zip(shapes, o.slots, strict=True)
            ):
                misses.append(PREFERRED)
        if need.preferred_scope is not None and len(nodes) > 1:
            level = self.h.common_level([self.snap.path(i) for i in nodes])
            if need.preferred_scope >= node_scope(self.h) or level < need.preferred_scope:
                misses.append(PREFERRED)
        if within is not None and not set(nodes) <= within:
            misses.append(COLOCATE)
        no_room = bool(dependents) and not self._room_for(dependents, o.masks, state, nodes)
        kv_short = self._kv_short(dependents, o.masks, state)
        opened = sum(1 for i in o.masks if self._whole(i, state))
        return dataclasses.replace(
            o, misses=tuple(dict.fromkeys(misses)), no_room=no_room, kv_short=kv_short, opened=opened
        )

    def _whole(self, i: int, state: _State) -> bool:
        """Whether node ``i`` has every GPU free (none taken, by others or by this gang)."""
        node = self.snap.nodes[i]
        return not state.taken.get(i, 0) and self.snap.free_mask(i).bit_count() == node.shape.size

    def _kv_short(self, dependents: Sequence[PodSet], masks: Mapping[int, int], state: _State) -> int:
        """How many pods of the kv-transfer sets colocating with a pod set placed on ``masks``
        find no room on its nodes (where their KV hand-off would stay inside a node)."""
        short = 0
        for d in dependents:
            if d.comm != Comm.KV_TRANSFER or d.gpus_per_pod == 0:
                continue
            need = self._needs[d.name]
            room = 0
            for i in masks:
                free = self.snap.free_mask(i) & ~state.taken.get(i, 0) & ~masks[i]
                entry = self._cap_entry(d, need, i, free, False, state.used.get(i))
                room += entry[0] if entry else 0
            short += max(0, d.count - room)
        return short

    def _explain(
        self,
        ps: PodSet,
        chosen: _Option,
        opts: Sequence[_Option],
        within_found: bool,
        wish: tuple[str, str] | None,
    ) -> tuple[str, ...]:
        """Say where a pod set went when it missed a wish, and what keeping the wish would cost."""
        out = []
        where = chosen.where
        for miss in chosen.misses:
            kept = next((o for o in opts if miss not in o.misses), None)
            cost = ""
            if kept is not None and kept.waste > chosen.waste:
                cost = f" would take {kept.waste} GPUs of a multi-node NVLink clique without using its NVLink"
            elif kept is not None:
                cost = f" would cost {kept.cost:.1f} us/layer, not {chosen.cost:.1f}"
            if miss == PREFERRED:
                text = (
                    f"pod set {ps.name}: preferred level {ps.preferred_level} not met; placed within {where}"
                )
                if kept:
                    text += f" (keeping it{cost})"
            else:
                assert wish is not None
                partner, level = wish
                if within_found and kept:
                    text = (
                        f"pod set {ps.name}: placed apart from {partner}, within {where}: sharing a {level}"
                    )
                    text += cost
                else:
                    text = (
                        f"pod set {ps.name}: could not share a {level} with {partner}; placed within {where}"
                    )
            out.append(text)
        return tuple(out)

    def _caps(self, gang: GangRequest, ps: PodSet, need: Need, state: _State, preferred: bool) -> Caps:
        """Nodes that fit at least one pod of ``ps`` given what this gang already took (the
        same table for every order and beam branch that took the same GPUs)."""
        key = (ps.name, preferred, tuple(sorted(state.taken.items())), tuple(sorted(state.used.items())))
        got = self._caps_memo.get(key)
        if got is not None:
            return got
        if state.taken or state.used:
            base = self._caps(gang, ps, need, _State(), preferred)
            kinds = self.snap.kinds()
            rules = self._rules(ps) if self._aligning else None
            groups = dict(_groups_of(base, kinds, rules))
            touched: set[GroupKey] = set()
            override: dict[int, Entry | None] = {}
            for i in dict.fromkeys([*state.taken, *state.used]):
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
                free = self.snap.free_mask(i) & ~state.taken.get(i, 0)
                entry = override[i] = self._cap_entry(ps, need, i, free, preferred, state.used.get(i))
                if entry is not None:
                    k = (kinds[i], rule, entry)
                    if k not in touched:
                        groups[k] = list(groups.get(k, ()))
                        touched.add(k)
                    bisect.insort(groups[k], i)
            caps = _patched(base, groups, override, None)
        else:
            caps = self._scan(ps, need, preferred)
        self._caps_memo[key] = caps
        return caps

    def _scan(self, ps: PodSet, need: Need, preferred: bool) -> Caps:
        """Every node's capacity for ``ps``: one capacity search per node type and free mask,
        one tier per node type."""
        memo = self._entry_memo(ps, need, preferred)
        gpus = ps.gpus_per_pod
        groups: Groups = {}
        admitted = self.snap.admitted(ps.node_needs)
        kinds, frees = self.snap.kinds(), self.snap.free_masks()
        rules = self._rules(ps) if self._aligning else None

        def entry_of(kind: str, free: int, rule: NumaRule | None, first: int) -> Entry | None:
            """The class's entry (its first member stands for all), computed once per table."""
            k = (kind, free, rule)
            entry = memo.get(k, _MISSING)
            if entry is _MISSING:
                entry = memo[k] = self._entry(ps, need, first, free, preferred)
            return entry

        if self.snap.limits_resources:
            # A node's room (NodeResourcesFit) caps its entry: the classes are split by room,
            # so the work stays per class.
            room_key, rooms = self._rooms_of(ps)
            classes = self.snap.room_classes(ps.node_needs, room_key, rooms, gpus, ps.count)
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
            return _Caps(groups, memo, kinds, frees, admitted, rules, rooms=rooms)
        for (kind, free), members in self.snap.free_classes().items():
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
        return _Caps(groups, memo, kinds, frees, admitted, rules)

    def _rooms_of(self, ps: PodSet) -> tuple[object, list[int]]:
        """Every node's room for one more pod of ``ps`` (:meth:`_within_room` with nothing of
        the gang there yet), by node index, and a key naming that table."""
        plain = self.snap.rooms(ps.requests)
        if not self._has_fabric or not ps.gpus_per_pod or not pods_talk(ps):
            return (ps.requests, None), plain
        key = (ps.requests, self._gang)
        rooms = self._rooms.get(key)
        if rooms is None:
            # Only clique nodes keep room for the IMEX daemon (scoring.room_taken).
            rooms = self._rooms[key] = list(plain)
            for i in self._clique_nodes:
                taken = room_taken(self.snap, self._gang, ps, i, None)
                if taken is not None:
                    rooms[i] = self.snap.room(i, ps.requests, taken)
        return key, rooms

    @functools.cached_property
    def _clique_nodes(self) -> list[int]:
        return [i for i in range(len(self.snap.nodes)) if self.snap.clique(i) is not None]

    def _groups(self, ps: PodSet, caps: Caps) -> Groups:
        """The nodes of ``caps`` by node type, the kubelet's rule for ``ps`` and entry."""
        return _groups_of(caps, self.snap.kinds(), self._rules(ps) if self._aligning else None)

    def _restricted(self, ps: PodSet, caps: Caps, nodes: set[int]) -> Caps:
        """``caps`` on ``nodes`` only."""
        kinds = self.snap.kinds()
        groups: Groups = {}
        for i in sorted(nodes) if len(nodes) < len(caps) else caps:
            entry = caps.get(i) if i in nodes else None
            if entry is not None:
                groups.setdefault((kinds[i], self._rule(i, ps), entry), []).append(i)
        return _patched(caps, groups, {}, nodes)

    def _cap_entry(
        self, ps: PodSet, need: Need, i: int, free: int, preferred: bool, used: Resources | None = None
    ) -> Entry | None:
        """(pods of ``ps`` that fit, free mask, tier) on node ``i``, or None when none fits:
        the same for every node of one type with the same free GPUs, capped by what the
        node's other resources hold (``used``: taken there by this gang already)."""
        if free.bit_count() < ps.gpus_per_pod:
            return None
        admitted = self.snap.admitted(ps.node_needs)
        if admitted is not None and i not in admitted:
            return None
        memo = self._entry_memo(ps, need, preferred)
        k = (self.snap.kinds()[i], free, self._rule(i, ps))
        if k not in memo:
            memo[k] = self._entry(ps, need, i, free, preferred)
        got = memo[k]
        return self._within_room(ps, i, got, used) if got is not None else None

    def _within_room(self, ps: PodSet, i: int, entry: Entry, used: Resources | None) -> Entry | None:
        """``entry`` with at most as many pods as NodeResourcesFit lets onto node ``i``."""
        if not self.snap.limits_resources:
            return entry
        room = self.snap.room(i, ps.requests, room_taken(self.snap, self._gang, ps, i, used))
        if room >= entry[0]:
            return entry
        return (room, entry[1], entry[2]) if room > 0 else None

    def _entry_memo(self, ps: PodSet, need: Need, preferred: bool) -> dict[EntryClass, Entry | None]:
        """The capacity entries of ``ps`` per class, shared with earlier decisions for the same
        pod set (:data:`_CLASS_TABLES`)."""
        got = self._entries.get((ps.name, preferred))
        if got is None:
            got = self._entries[(ps.name, preferred)] = _CLASS_TABLES.entries((ps, need, preferred))
        return got

    def _entry(self, ps: PodSet, need: Need, i: int, free: int, preferred: bool) -> Entry | None:
        tier = pod_tier(self.snap, i, ps, need, preferred)
        if tier is None:
            return None
        cap = self._fit(i, ps).capacity(free, ps.gpus_per_pod, tier)
        return (min(cap, ps.count), free, tier) if cap else None

    def _rule(self, i: int, ps: PodSet) -> NumaRule | None:
        """The kubelet's Topology Manager rule for a pod of ``ps`` on node ``i``."""
        return self._rules(ps)[i] if self._aligning else None

    def _rules(self, ps: PodSet) -> list[NumaRule | None]:
        """Every node's rule for a pod of ``ps``, by node index (cached on the snapshot)."""
        return self.snap.per_node(("numa-rule", rule_key(ps)), functools.partial(_rule_on, ps=ps))

    def _fit(self, i: int, ps: PodSet) -> GpuFit:
        """The GPU sets a pod of ``ps`` may get on node ``i``: the one place the kubelet's
        Topology Manager (:mod:`extender.placement.numa_fit`) restricts them."""
        return fit_on(self.snap.nodes[i], self._rule(i, ps))

    def _pass(
        self,
        gang: GangRequest,
        ps: PodSet,
        need: Need,
        caps: Caps,
        state: _State,
        links: _Links,
        dependents: Sequence[PodSet],
    ) -> list[_Option]:
        self._work += len(caps)
        opts = self._single_options(ps, caps, links, dependents, state)
        if ps.count > 1 and need.scope < node_scope(self.h) and caps:
            best = min((o.price for o in opts), default=(0, float("inf")))
            # A set that hands KV caches to sets not placed yet: spreading it over several
            # nodes at no cost of its own lets each of their pods sit next to one of its pods,
            # so placements that only tie the best so far are kept too.
            ties = any(d.comm == Comm.KV_TRANSFER for d in dependents)
            opts.extend(self._multi_options(gang, ps, need, caps, state, links, best, ties))
        return opts

    def _price(
        self, ps: PodSet, slots: tuple[PodSlot, ...], links: _Links, own: float | None = None
    ) -> Price:
        """What placing ``ps`` on ``slots`` adds to the gang's objective: clique GPUs taken off
        the fabric, and cost: its own communication (``own`` when already known) and the KV
        hand-offs to its placed dependents."""
        if own is None or links.partner:
            own = self._pod_set_micros(ps, slots, links.partner)
        cost = own + sum(self._pod_set_micros(d, d_slots, slots) for d, d_slots in links.dependents)
        waste = 0
        if self._has_fabric:
            waste = pod_set_fabric_waste(self.snap, ps, slots, links.partner) + sum(
                pod_set_fabric_waste(self.snap, d, d_slots, slots) for d, d_slots in links.dependents
            )
        return waste, cost

    # -- one node ------------------------------------------------------------------------
    def _node_pick(self, ps: PodSet, i: int, free: int, tier: Tier) -> _NodePick:
        """The GPU sets of all of ``ps``'s pods on node ``i`` (memoised per node type and free
        mask); on a device-plugin node, the sets the plugin hands out."""
        node = self.snap.nodes[i]
        rule = self._rule(i, ps)
        key = (ps.name, self.snap.kinds()[i], free, tier, rule)
        got = self._picks.get(key)
        if got is None:
            fit = self._fit(i, ps)
            masks = fit.pick(free, ps.gpus_per_pod, tier, ps.count)
            assert masks is not None, "capacity said the pods fit; pick must agree"
            got = self._node_pick_of(ps, fit, free, masks)
            # Where the device plugin picks, or the kubelet aligns the GPUs and picks each pod's
            # NUMA node itself from all free GPUs, other unions are not deliverable.
            chosen = node.plugin or (rule is not None and rule.gpus_aligned)
            if not chosen and ps.count > 1 and ps.comm in (Comm.ALLREDUCE, Comm.ALLTOALL, Comm.PIPELINE):
                # The pods talk over the links among all their GPUs: try every set of GPUs
                # they could share and keep the cheapest, then the most coherent remainder.
                for union in fit.subsets(ps.count * ps.gpus_per_pod, Tier.NODE):
                    if union & free != union:
                        continue
                    inside = fit.pick(union, ps.gpus_per_pod, tier, ps.count)
                    if inside is None:
                        continue
                    other = self._node_pick_of(ps, fit, free, inside)
                    if (_q(other.cost), -other.coherent) < (_q(got.cost), -got.coherent):
                        got = other
            self._picks[key] = got
        return got

    @staticmethod
    def _node_pick_of(ps: PodSet, fit: GpuFit, free: int, masks: tuple[int, ...]) -> _NodePick:
        union = 0
        for m in masks:
            union |= m
        span = in_node_span(fit.gbps(union)) if ps.count > 1 else None
        cost = pod_set_cost(ps, [fit.gbps(m) for m in masks], span)
        rest = free & ~union
        return _NodePick(masks, union, cost, rest.bit_count(), fit.coherent_block(rest))

    def _single_options(
        self,
        ps: PodSet,
        caps: Caps,
        links: _Links,
        dependents: Sequence[PodSet],
        state: _State,
    ) -> list[_Option]:
        """The best nodes that hold every pod alone: the cheapest and tightest fits, the best
        one per relation to the pod sets it hands a KV cache to or from, and the best one
        that leaves room for pod sets colocating with this one."""
        ranked: list[tuple[tuple[float, ...], int]] = []
        for (_, _, (cap, free, tier)), members in self._groups(ps, caps).items():
            if cap < ps.count:
                continue
            for i in members:
                pick = self._node_pick(ps, i, free, tier)
                # One node's pods do not talk over the fabric (a KV hand-off to a partner in
                # the same clique may: the relation classes below offer that node too); a
                # clique pods off the fabric already use costs nothing more.
                waste = ps.gpus if self._has_fabric and on_whole_clique(self.snap, i) else 0
                ranked.append(((waste, _q(pick.cost), *self._tie(i, pick, ps)), i))
        if not ranked:
            return []
        ranked.sort()
        chosen = dict.fromkeys(r[-1] for r in ranked[: BEAM + 1])
        if links:
            classes: dict[object, int] = {}
            relations = [
                _Relation(self, sorted({self.snap.index(s.node) for s in g})) for g in links.groups()
            ]
            for _, i in ranked:
                classes.setdefault(tuple(rel(i) for rel in relations), i)
            chosen.update(dict.fromkeys(classes.values()))
        if dependents:
            # Where the colocated sets will go matters as much as this set's own fit: the best
            # node of each node type that leaves room for them.
            kinds: dict[str, list[int]] = {}
            for _, i in ranked:
                kinds.setdefault(self.snap.nodes[i].shape.key, []).append(i)
            for nodes in kinds.values():
                for i in nodes[:ROOM_CHECK_NODES]:
                    _, free, tier = caps[i]
                    if self._room_for(dependents, {i: self._node_pick(ps, i, free, tier).union}, state):
                        chosen[i] = None
                        break
        return [self._single(ps, i, caps, links) for i in chosen]

    def _single(self, ps: PodSet, i: int, caps: Caps, links: _Links = _Links()) -> _Option:
        _, free, tier = caps[i]
        pick = self._node_pick(ps, i, free, tier)
        slots = self._slots(ps, [(i, m) for m in pick.masks])
        waste, cost = self._price(ps, slots, links, pick.cost)
        name = self.snap.nodes[i].name
        fit = self._tie(i, pick, ps)
        kinds = frozenset({self.snap.nodes[i].shape.key})
        return _Option(
            slots, {i: pick.union}, node_scope(self.h), f"node {name}", waste, cost, fit, kinds=kinds
        )

    def _tie(self, i: int, pick: _NodePick, ps: PodSet) -> tuple[float, ...]:
        """How one-node placements of equal price rank, best first: a node already in use
        before a node with every GPU free (whole nodes stay whole); the node type whose GPUs
        are worth least to others (the lowest all-GPU ring bandwidth, so NVLink islands stay
        for the gangs that pay for them); then, for a pod set with a required level, the
        fullest enclosing domains from the coarsest level down (as Kueue's BestFit picks the
        fullest block, then rack, so a later gang that needs a whole domain still finds one)
        before the tightest fit on the node and the most coherent remainder; for a pod set
        without one, the tightest fit first (Kueue sorts every node at once for such pod sets,
        fullest first: the nearly full nodes fill up and more nodes stay whole for gangs that
        need them), then the fullest domains; then topology path and name
        (:meth:`ClusterSnapshot.order`)."""
        node = self.snap.nodes[i]
        fit = (float(pick.leftover), float(-pick.coherent))
        full = self.snap.fullness(i)
        first, then = (fit, full) if self._needs[ps.name].scope == ANYWHERE else (full, fit)
        return (
            float(-self._preference(i)),
            float(self.snap.free_mask(i).bit_count() == node.shape.size),
            self._worth(i),
            *first,
            *then,
            float(self.snap.order()[i]),
        )

    def _preference(self, i: int) -> int:
        """The preferred node affinity score of node ``i`` for the pod set being placed."""
        ps = self._placing
        if ps is None or not ps.preferred:
            return 0
        node = self.snap.nodes[i]
        return feasibility.preference(ps.preferred, node.name, node.labels)

    def _worth(self, i: int) -> float:
        kind = self.snap.kinds()[i]
        got = self._worths.get(kind)
        if got is None:
            shape = self.snap.nodes[i].shape
            got = self._worths[kind] = round(fit_for(shape).gbps(shape.full_mask), 3)
        return got

    # -- several nodes -------------------------------------------------------------------
    @functools.cached_property
    def _domains_by_level(self) -> dict[int, list[tuple[DomainKey | None, list[int]]]]:
        """The snapshot's domains (their keys and node indices), by level index."""
        out: dict[int, list[tuple[DomainKey | None, list[int]]]] = {}
        for key, members in self.snap.domains().items():
            out.setdefault(key[0], []).append((key, members))
        return out

    def _fabric_of(self, i: int) -> tuple[str | None, ...] | None:
        return self.snap.clique(i) if self._has_fabric else None

    def _owns_mnnvl(self, gang: str, i: int) -> bool:
        return self.snap.channel_free(gang, i)

    def _multi_floor(self, gang: str, ps: PodSet, i: int) -> int | None:
        """The coarsest level at which node ``i`` may be one of several nodes of ``ps``
        (ANYWHERE: any; None: none), as :meth:`_multi_usable` rules."""
        fd = self._fabric_of(i)
        if fd is None or not pods_talk(ps):
            return ANYWHERE
        return len(fd) - 1 if self._owns_mnnvl(gang, i) else None

    def _multi_usable(self, gang: str, ps: PodSet, i: int, level: int) -> bool:
        """May node ``i`` be one of several nodes of ``ps`` spanning a domain at ``level``?
        For a pod set whose pods talk, a clique node only inside its own clique
        (all-or-nothing), and only while no other gang holds its NVLink (IMEX) channel; a pod
        set whose pods do not talk uses no NVLink across nodes and may take any node."""
        fd = self._fabric_of(i)
        if fd is None or not pods_talk(ps):
            return True
        return level >= len(fd) - 1 and self._owns_mnnvl(gang, i)

    def _pod_gbps(self, ps: PodSet, i: int, entry: tuple[int, int, Tier]) -> float:
        """The best ring bandwidth one pod of ``ps`` gets on node ``i`` now."""
        _, free, tier = entry
        key = (ps.gpus_per_pod, self.snap.kinds()[i], free, tier, self._rule(i, ps))
        got = self._gbps.get(key)
        if got is None:
            fit = self._fit(i, ps)
            picked = fit.pick(free, ps.gpus_per_pod, tier, 1)
            got = self._gbps[key] = fit.gbps(picked[0]) if picked else 0.0
        return got

    def _top_gbps(self, ps: PodSet, caps: Caps) -> float:
        """At least the best ring bandwidth a pod of ``ps`` gets on any of these nodes: the
        fastest GPU set its tier allows on each node type."""
        groups = self._groups(ps, caps)
        kinds = {(kind, entry[2]): members[0] for (kind, _, entry), members in groups.items()}
        best = 0.0
        tops = _CLASS_TABLES.tops
        for (kind, tier), i in kinds.items():
            top = tops.get((kind, ps.gpus_per_pod, tier))
            if top is None:
                fit = fit_for(self.snap.nodes[i].shape)
                top = tops[(kind, ps.gpus_per_pod, tier)] = max(
                    (fit.gbps(m) for m in fit.subsets(ps.gpus_per_pod, tier)), default=0.0
                )
            best = max(best, top)
        return best

    def _span_cap(self, ps: PodSet, level: int) -> float:
        """Above this pod bandwidth, a faster node no longer helps a pod set spanning ``level``:
        an all-reduce or all-to-all ring is as slow as the network between the nodes."""
        if ps.comm in (Comm.ALLREDUCE, Comm.ALLTOALL) and not (level >= 0 and self.h.levels[level].fabric):
            return self.h.switch_gbps(level)
        return float("inf")

    def _bound(self, ps: PodSet, level: int, pod_gbps: float, links: _Links) -> float:
        """The least any placement of ``ps`` across nodes of a domain at ``level`` can cost."""
        span = Span(self.h.switch_gbps(level), True, False)
        kv = Span(float("inf"), False, True) if links.partner else None
        return pod_set_cost(ps, [pod_gbps] * ps.count, span, kv)

    def _multi_options(
        self,
        gang: GangRequest,
        ps: PodSet,
        need: Need,
        caps: Caps,
        state: _State,
        links: _Links,
        best: Price,
        ties: bool = False,
    ) -> list[_Option]:
        """Placements across several nodes: at each level from the finest up to the required
        one, the best-fitting domains that hold every pod, while a coarser level could still
        beat (with ``ties``: match) the best candidate so far."""
        h = self.h
        # Pods sharing one node are priced by that node's own links (single-node options);
        # these options span two nodes at least, so no node takes every pod.
        limit = ps.count - 1
        kinds = self.snap.kinds()
        rules = self._rules(ps) if self._aligning else None
        # Per class of nodes: the best ring bandwidth one pod gets, and the packed counts.
        per_class = _CLASS_TABLES.speeds
        shape = (ps.gpus_per_pod, ps.count)
        # A pod set whose pods do not talk takes clique nodes last (they are off the fabric).
        quiet = self._has_fabric and not pods_talk(ps)
        # Nodes alike for the search below (same speed class and the same coarsest level they
        # may span): per group, _pack(pods, free GPUs, 1) of each of its nodes at the node's
        # rank in the snapshot's order, where every domain is a range (domain_spans).
        groups: dict[tuple[int, float, int], list[int]] = {}
        size = len(self.snap.nodes)
        order = self.snap.order()
        for (kind, rule, entry), members in self._groups(ps, caps).items():
            known = per_class.get((shape, kind, rule, entry))
            if known is None:
                packed = _pack(min(entry[0], limit), entry[1].bit_count(), 1)
                pod_gbps = self._pod_gbps(ps, members[0], entry)
                known = per_class[(shape, kind, rule, entry)] = (pod_gbps, packed)
            got, packed = known
            if not self._has_fabric:
                table = groups.get((0, got, ANYWHERE))
                if table is None:
                    table = groups[(0, got, ANYWHERE)] = [0] * size
                for i in members:
                    table[order[i]] = packed
                continue
            for i in members:
                floor = self._multi_floor(gang.name, ps, i)
                if floor is None:
                    continue
                group = (1 if quiet and self._fabric_of(i) is not None else 0, got, floor)
                table = groups.get(group)
                if table is None:
                    table = groups[group] = [0] * size
                table[order[i]] = packed
        # Prefix sums: a domain's sum per group is two lookups.
        prefix = [list(itertools.accumulate(t, initial=0)) for t in groups.values()]
        spans = self.snap.domain_spans()

        top_gbps = self._top_gbps(ps, caps)
        by_level = self._domains_by_level
        opts: list[_Option] = []
        for level in range(len(h.levels) - 1, max(need.scope, ANYWHERE) - 1, -1):
            fabric = level >= 0 and h.levels[level].fabric
            bound = (0, _q(self._bound(ps, level, top_gbps, links)))
            if not fabric and (bound > best if ties else bound >= best):
                break
            domains: Sequence[tuple[DomainKey | None, list[int] | None]] = (
                [(None, None)] if level == ANYWHERE else by_level.get(level, [])
            )
            cap_gbps = self._span_cap(ps, level)
            # The fastest nodes that together hold every pod; a faster node than the
            # network between them buys nothing, so those count as equal. Each domain is
            # ranked from its groups' sums; only the best few are then looked at node by node.
            speeds: dict[tuple[int, float], list[list[int]]] = {}
            for (off, g, floor), p in zip(groups, prefix, strict=True):
                if floor <= level:
                    speeds.setdefault((off, -(g if g < cap_gbps else cap_gbps)), []).append(p)
            ranks = sorted(speeds.items(), key=lambda r: r[0])
            pods, gpus = ps.count, ps.count * ps.gpus_per_pod
            found: list[tuple[tuple[float, ...], list[int] | None]] = []
            for key, listed in domains:
                lo, hi = (0, size) if key is None else spans[key]
                # Packed sums add field by field (no field overflows into the next). The
                # fastest groups first, until they hold every pod; a domain whose groups
                # never do cannot hold the pod set.
                total = 0
                for speed, tables in ranks:
                    for p in tables:
                        total += p[hi] - p[lo]
                    if total & _MASK >= pods:
                        _, free, count = _unpack(total)
                        found.append(((speed[0], speed[1], float(free - gpus), float(count)), listed))
                        break
            found.sort(key=lambda f: f[0])
            for n, (rank_, listed) in enumerate(found[:CANDIDATES]):
                if n and not fabric and not ties and bound >= best:
                    break  # one candidate already costs the least any domain here can
                threshold = (int(rank_[0]), rank_[1])
                members = list(caps) if listed is None else listed
                rank: dict[int, tuple[int, float]] = {}
                gbps: dict[int, float] = {}
                capped: dict[int, Entry] = {}
                for i in members:
                    here = caps.get(i)
                    if here is None:
                        continue
                    if self._has_fabric and not self._multi_usable(gang.name, ps, i, level):
                        continue
                    off = 1 if quiet and self._fabric_of(i) is not None else 0
                    rule = rules[i] if rules is not None else None
                    gbps[i] = g = per_class[(shape, kinds[i], rule, here)][0]
                    rank[i] = r = (off, -(g if g < cap_gbps else cap_gbps))
                    if r <= threshold:
                        capped[i] = (here[0] if here[0] < limit else limit, here[1], here[2])
                fast = sorted(capped, key=rank.__getitem__)
                # Off-fabric nodes first: every non-clique node is used before any clique node.
                first = [i for i in fast if rank[i][0] < threshold[0]]
                assignment = {i: capped[i][0] for i in first}
                rest = [i for i in fast if i not in assignment]
                need_rest = ps.count - sum(assignment.values())
                if need_rest > 0:
                    assignment.update(self._fill(rest, level + 1, need_rest, capped, ps, gbps))
                opt = self._realise(ps, assignment, capped, links, level, rank_[2:])
                opts.append(opt)
                best = min(best, opt.price)
        return opts

    def _fill(
        self,
        nodes: list[int],
        level: int,
        need: int,
        caps: Caps,
        ps: PodSet,
        gbps: Mapping[int, float],
    ) -> dict[int, int]:
        """Spread ``need`` pods over ``nodes`` (all in one domain above ``level``): the
        best-fitting child domain that holds them all, else the roomiest children first."""
        if level >= len(self.h.levels):
            return self._fill_nodes(nodes, need, caps, gbps)
        groups: dict[object, list[int]] = {}
        for i in nodes:
            label = self.snap.path(i)[level]
            groups.setdefault(label if label is not None else ("unlabelled", i), []).append(i)
        if len(groups) == 1:
            return self._fill(nodes, level + 1, need, caps, ps, gbps)
        cap_of = {k: sum(caps[i][0] for i in v) for k, v in groups.items()}
        out: dict[int, int] = {}
        pool = sorted(groups, key=lambda k: (-cap_of[k], str(k)))
        remaining = need
        # Roomiest first: once one child holds the rest, those that do are the ones up to
        # the first that does not.
        for n, k in enumerate(pool):
            if remaining <= 0:
                break
            if cap_of[k] >= remaining:
                fitting = [c for c in pool[n:] if cap_of[c] >= remaining]
                best = min(fitting, key=lambda c: (cap_of[c], str(c)))
                out.update(self._fill(groups[best], level + 1, remaining, caps, ps, gbps))
                return out
            out.update(self._fill(groups[k], level + 1, cap_of[k], caps, ps, gbps))
            remaining -= cap_of[k]
        assert remaining <= 0, "the domains hold fewer pods than counted"
        return out

    def _fill_nodes(
        self, nodes: list[int], need: int, caps: Caps, gbps: Mapping[int, float]
    ) -> dict[int, int]:
        out: dict[int, int] = {}
        order = self.snap.order()
        pref = {i: self._preference(i) for i in nodes}
        pool = sorted(nodes, key=lambda i: (-caps[i][0], -gbps[i], -pref[i], order[i]))
        remaining = need
        for n, i in enumerate(pool):  # roomiest first, as in _fill
            if remaining <= 0:
                break
            if caps[i][0] >= remaining:
                fitting = [j for j in pool[n:] if caps[j][0] >= remaining]
                best = min(fitting, key=lambda j: (caps[j][0], -gbps[j], -pref[j], order[j]))
                out[best] = remaining
                return out
            out[i] = caps[i][0]
            remaining -= caps[i][0]
        assert remaining <= 0, "the nodes hold fewer pods than counted"
        return out

    def _realise(
        self,
        ps: PodSet,
        assignment: dict[int, int],
        caps: Caps,
        links: _Links,
        level: int,
        fit: tuple[float, ...],
    ) -> _Option:
        placed: list[tuple[int, int]] = []
        masks: dict[int, int] = {}
        for i in sorted(assignment, key=lambda j: self.snap.nodes[j].name):
            _, free, tier = caps[i]
            picked = self._fit(i, ps).pick(free, ps.gpus_per_pod, tier, assignment[i])
            if picked is None:  # capacity said it fits; pick must agree
                raise AssertionError(f"node {self.snap.nodes[i].name}: cannot pick {assignment[i]} pods")
            for m in picked:
                placed.append((i, m))
                masks[i] = masks.get(i, 0) | m
        slots = self._slots(ps, placed)
        waste, cost = self._price(ps, slots, links)
        if len(masks) == 1:
            (i,) = masks
            where, level = f"node {self.snap.nodes[i].name}", node_scope(self.h)
        else:
            common = self.h.common_level([self.snap.path(i) for i in masks])
            level = max(level, common)
            where = (
                "cluster"
                if level == ANYWHERE
                else self.h.describe(self._domain_key(next(iter(masks)), level))
            )
        kinds = frozenset(self.snap.nodes[i].shape.key for i in masks)
        return _Option(slots, masks, level, where, waste, cost, fit, kinds=kinds)

    def _domain_key(self, i: int, level: int) -> DomainKey:
        key = self.h.domain(self.snap.path(i), level)
        assert key is not None
        return key

    def _slots(self, ps: PodSet, placed: Sequence[tuple[int, int]]) -> tuple[PodSlot, ...]:
        out = []
        last, name, fit = -1, "", None
        for index, (i, mask) in enumerate(placed):
            if i != last:  # a node's pods come one after another: look the node up once
                node = self.snap.nodes[i]
                last, name, fit = i, node.name, fit_for(node.shape)
            assert fit is not None
            gpus, numa, nic = fit.slot_of(mask)
            out.append(PodSlot(ps.name, index, name, gpus, numa, nic))
        return tuple(out)

    # -- colocation ----------------------------------------------------------------------
    def _colocation_scope(
        self, gang: GangRequest, ps: PodSet, placed: Mapping[str, _Option]
    ) -> tuple[set[int] | None, tuple[str, str] | None]:
        """The nodes ``ps`` must stay within to keep the colocateWith wishes that join it to
        pod sets already placed: its own (next to its colocateWith set) and those of the pod
        sets that colocate with it and were placed first (a wish binds both sides, whichever
        the search places first), with the first such wish as (other pod set, level). None: no
        such wish is judged yet."""
        scope: set[int] | None = None
        wish: tuple[str, str] | None = None
        pairs = [(ps.colocate_with.pod_set, ps.colocate_with.level)] if ps.colocate_with else []
        pairs += [
            (d.name, d.colocate_with.level)
            for d in gang.pod_sets
            if d.colocate_with and d.colocate_with.pod_set == ps.name
        ]
        for other, level in pairs:
            if other not in placed or not placed[other].slots:
                continue
            nodes = self._colocation_nodes({self.snap.index(s.node) for s in placed[other].slots}, level)
            if nodes is not None:
                scope = nodes if scope is None else scope & nodes
                wish = wish or (other, level)
        return scope, wish

    def _colocation_nodes(self, nodes: set[int], level: str) -> set[int] | None:
        """The nodes that share a domain at ``level`` with one of ``nodes`` (None: the level is
        an in-node one, not judged)."""
        scope, _ = resolve_level(level, self.h)
        if scope is None:
            return None
        if scope >= node_scope(self.h):
            return nodes
        keys = {self.h.domain(self.snap.path(i), scope) for i in nodes}
        if None in keys:
            return nodes
        domains = self.snap.domains()
        return {i for k in keys if k is not None for i in domains.get(k, ())}

    def _room_for(
        self,
        dependents: Sequence[PodSet],
        masks: Mapping[int, int],
        state: _State,
        nodes: Iterable[int] | None = None,
    ) -> bool:
        """Whether every pod set colocating with a pod set placed on ``nodes`` (by default the
        nodes of ``masks``, the GPUs it takes) still fits next to it."""
        where = set(masks if nodes is None else nodes)
        for d in dependents:
            assert d.colocate_with is not None
            domain = self._colocation_nodes(where, d.colocate_with.level)
            if domain is None or len(domain) > ROOM_CHECK_NODES:
                continue
            need = self._needs[d.name]
            room = 0
            for i in domain:
                free = self.snap.free_mask(i) & ~state.taken.get(i, 0) & ~masks.get(i, 0)
                entry = self._cap_entry(d, need, i, free, False, state.used.get(i))
                room += entry[0] if entry else 0
            if room < d.count:
                return False
        return True

    # -- reasons -------------------------------------------------------------------------
    def _shortfall(self, gang: GangRequest, ps: PodSet, need: Need, caps: Caps) -> _Shortfall:
        def explain() -> tuple[str, str | None, int]:
            reason, closest, short_by = self._reason(gang, ps, need, caps)
            return self._numa_reason(ps, need, (reason + self._plugin_note(ps, need), closest, short_by))

        return _Shortfall(ps.name, explain)

    def _numa_reason(
        self, ps: PodSet, need: Need, why: tuple[str, str | None, int]
    ) -> tuple[str, str | None, int]:
        """``why`` with the nodes whose kubelet Topology Manager leaves no room for a pod of
        ``ps`` that its GPUs alone would (the first one's reason in full)."""
        if not self._aligning:
            return why
        first: str | None = None
        refused = 0
        admitted = self.snap.admitted(ps.node_needs)
        kinds, frees = self.snap.kinds(), self.snap.free_masks()
        seen: dict[tuple[str, int, NumaRule], bool] = {}
        for i, node in enumerate(self.snap.nodes):
            rule = self._rule(i, ps)
            if rule is None or (admitted is not None and i not in admitted):
                continue
            key = (kinds[i], frees[i], rule)
            if key not in seen:
                tier = pod_tier(self.snap, i, ps, need)
                fits = tier is not None and choice.capacity(node, frees[i], ps.gpus_per_pod, tier) > 0
                seen[key] = fits and refusal(node, ps, frees[i], tier) is not None
            if seen[key]:
                refused += 1
                if first is None:
                    first = refusal(node, ps, frees[i], pod_tier(self.snap, i, ps, need))
        if first is None:
            return why
        others = refused - 1
        more = f" (and {others} more node{'s' if others > 1 else ''})" if others else ""
        return (f"{why[0]}; the kubelet would refuse it: {first}{more}", why[1], why[2])

    def _plugin_note(self, ps: PodSet, need: Need) -> str:
        """When the device plugin is why a node is out: the first device-plugin node (in the
        tie-break order) that gangslice's own choice would give more of these pods, and the
        answer of the plugin that breaks the pod set's tier there."""
        gpus = ps.gpus_per_pod
        admitted = self.snap.admitted(ps.node_needs)
        order, kinds, nodes = self.snap.order(), self.snap.kinds(), self.snap.nodes
        seen: set[tuple[str, int]] = set()  # one look per node type and free GPUs
        for i in sorted((i for i, n in enumerate(nodes) if n.plugin), key=order.__getitem__):
            node, free = nodes[i], self.snap.free_mask(i)
            if free.bit_count() < gpus or (admitted is not None and i not in admitted):
                continue
            if (kinds[i], free) in seen:
                continue
            seen.add((kinds[i], free))
            tier = pod_tier(self.snap, i, ps, need)
            if tier is None:
                continue
            served = choice.capacity(node, free, gpus, tier)
            own = min(ps.count, fit_for(node.shape).capacity(free, gpus, tier))
            if served < own:
                why = choice.reason(node, free, gpus, tier, served + 1)
                if why:
                    return f"; node {node.name}'s free GPUs hold {own} such pods, but {why}"
        return ""

    def _reason(self, gang: GangRequest, ps: PodSet, need: Need, caps: Caps) -> tuple[str, str | None, int]:
        """Why ``ps`` has no placement on ``caps``: the reason, the closest domain, pods short."""
        if isinstance(caps, _Caps):
            caps = caps.table()
        words = self._tier_words(ps, need)
        what = f"{ps.count} pods of {ps.gpus_per_pod} free {words}GPU{'s' if ps.gpus_per_pod != 1 else ''}"
        largest = max((n.shape.size for n in self.snap.nodes), default=0)
        if ps.gpus_per_pod > largest:
            return (
                f"pod set {ps.name}: no node has {ps.gpus_per_pod} GPUs (the largest has {largest})",
                None,
                ps.count,
            )
        if need.scope >= node_scope(self.h):
            single = max(((c[0], i) for i, c in caps.items()), default=None)
            roomiest = (single[0], f"node {self.snap.nodes[single[1]].name}") if single else None
            return self._shortfall_reason(ps, "node", what, roomiest)
        if need.scope == ANYWHERE:
            have, where = self._room_in(gang.name, ps, sorted(caps), caps)
            if not pods_talk(ps) or not any(self._fabric_of(i) for i in caps):
                return self._shortfall_reason(ps, None, what, (have, "cluster"))
            return self._shortfall_reason(ps, "clique, nor the nodes outside cliques,", what, (have, where))
        best: tuple[int, str] | None = None
        for key, members in self.snap.domains().items():
            if key[0] == need.scope:
                have, _ = self._room_in(gang.name, ps, [i for i in members if i in caps], caps)
                if have and (best is None or have > best[0]):
                    best = (have, self.h.describe(key))
        return self._shortfall_reason(ps, self.h.levels[need.scope].name, what, best)

    def _room_in(self, gang: str, ps: PodSet, nodes: Sequence[int], caps: Caps) -> tuple[int, str]:
        """How many pods of a pod set these nodes hold at most, under the clique rules: one
        node, one clique, or the nodes outside cliques together; and which of those it is.
        A pod set whose pods do not talk is under no clique rule: all of them together."""
        if not pods_talk(ps):
            return (sum(caps[i][0] for i in nodes), "cluster")
        best = (0, "cluster")
        groups: dict[tuple[str | None, ...] | None, int] = {}
        for i in nodes:
            cap = caps[i][0]
            if cap > best[0]:
                best = (cap, f"node {self.snap.nodes[i].name}")
            fd = self._fabric_of(i)
            if fd is None or self._owns_mnnvl(gang, i):
                groups[fd] = groups.get(fd, 0) + cap
        for fd, cap in groups.items():
            if cap > best[0]:
                best = (
                    cap,
                    "the nodes outside cliques" if fd is None else self.h.describe((len(fd) - 1, fd)),
                )
        return best

    def _shortfall_reason(
        self, ps: PodSet, level: str | None, what: str, best: tuple[int, str] | None
    ) -> tuple[str, str | None, int]:
        have, where = best if best is not None else (0, None)
        need_more = ps.count - have
        if level is None:
            reason = f"pod set {ps.name}: the cluster has room for {have} of {what} (needs {need_more} more)"
        elif where is None:
            reason = f"pod set {ps.name}: no {level} has room for {what}"
        else:
            reason = (
                f"pod set {ps.name}: no {level} has room for {what}; best is {where} "
                f"with {have} (needs {need_more} more)"
            )
        return reason + self._refused_words(ps), where, need_more

    def _refused_words(self, ps: PodSet) -> str:
        """``; kube-scheduler's filters refuse 3 of 8 nodes: 2 by TaintToleration (...)``, or
        nothing when they refuse none."""
        snap = self.snap
        refused = snap.refusals(ps.node_needs)
        admitted = snap.admitted(ps.node_needs)
        daemon: list[str] = []
        if snap.limits_resources:
            for i, n in enumerate(snap.nodes):
                if admitted is None or i in admitted:
                    r = feasibility.room_refusal(ps.requests, n.facts)
                    if r is not None:
                        refused.append(r)
                    elif feasibility.room_refusal(
                        ps.requests, n.facts, room_taken(snap, self._gang, ps, i, None) or feasibility.NOTHING
                    ):
                        daemon.append(n.name)
        words = ""
        if refused:
            words = (
                f"; kube-scheduler's filters refuse {len(refused)} of {len(snap.nodes)} nodes for its pods: "
                + feasibility.summarize(refused)
            )
        if daemon:
            words += (
                f"; {len(daemon)} clique nodes have no room for a pod next to the IMEX daemon pod of "
                f"the gang's ComputeDomain ({', '.join(daemon[:3])}{', ...' if len(daemon) > 3 else ''})"
            )
        return words + self._domain_words(ps)

    def _domain_words(self, ps: PodSet) -> str:
        """``; 2 clique nodes belong to a ComputeDomain of someone else: t0 (ComputeDomain
        ...)`` for a pod set whose pods talk, or nothing."""
        snap = self.snap
        if not self._has_fabric or not pods_talk(ps):
            return ""
        foreign = [(n.name, n.foreign_domain) for n in snap.nodes if n.foreign_domain is not None]
        if not foreign:
            return ""
        shown = ", ".join(f"{name} ({why})" for name, why in foreign[:3])
        return (
            f"; {len(foreign)} clique nodes belong to a ComputeDomain of someone else, which NVIDIA's "
            f"driver lets no second domain join: {shown}{', ...' if len(foreign) > 3 else ''}"
        )

    def _tier_words(self, ps: PodSet, need: Need) -> str:
        if need.tier is not None:
            words = need.tier.words
        else:
            tiers = {fit_for(n.shape).tightest(ps.gpus_per_pod) for n in self.snap.nodes}
            found = [t for t in tiers if t is not None]
            words = min(found).words if found else ""
        return f"{words} " if words else ""

    # -- exact fallback ------------------------------------------------------------------
    def _each_fits_alone(self, gang: GangRequest, needs: dict[str, Need]) -> bool:
        """Whether every pod set has a placement on its own. The candidate search is complete
        for one pod set alone (node capacities are exact, and every domain at every level
        from the node up to the required one is looked at until one fits), so when a pod set
        does not fit alone the gang does not fit, and the exact search is spared."""
        return all(
            isinstance(self._options(gang, ps, needs[ps.name], _State(), {}), list) for ps in gang.pod_sets
        )


class _Relation:
    """How a node relates to the nodes of a pod set it exchanges a KV cache with, as far as
    the hand-off's bandwidth goes: one of that set's own nodes, or the finest level it shares
    with them (and, inside a clique, its NVLink bandwidth)."""

    def __init__(self, solver: Solver, partner_nodes: Sequence[int]) -> None:
        self.solver = solver
        self.partner = set(partner_nodes)
        paths = [solver.snap.path(i) for i in partner_nodes]
        self.first = paths[0]
        self.shared = solver.h.common_level(paths) if len(paths) > 1 else len(self.first) - 1

    def __call__(self, i: int) -> object:
        if i in self.partner:
            return ("node", i)
        path = self.solver.snap.path(i)
        for level in range(self.shared, -1, -1):
            if self.first[level] is not None and tuple(path[: level + 1]) == tuple(self.first[: level + 1]):
                if self.solver.h.levels[level].fabric:
                    return ("fabric", level, clique_gbps(self.solver.snap.nodes[i].graph))
                return ("level", level)
        return ("level", ANYWHERE)


def _patched(
    caps: Caps, groups: Groups, override: Mapping[int, Entry | None], within: set[int] | None
) -> Caps:
    """``caps`` over ``groups``, with ``override`` and restricted to ``within``."""
    if isinstance(caps, _Caps):
        return caps.patched(groups, override, within)
    return {i: e for (_, _, e), members in groups.items() for i in members}


def _groups_of(caps: Caps, kinds: Sequence[str], rules: Sequence[NumaRule | None] | None) -> Groups:
    """The nodes of ``caps`` grouped by node type, the kubelet's NUMA rule and entry."""
    if isinstance(caps, _Caps):
        return caps.groups
    groups: Groups = {}
    for i, entry in caps.items():
        groups.setdefault((kinds[i], rules[i] if rules is not None else None, entry), []).append(i)
    return groups


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


#: Bits per field of a packed node count (:func:`_pack`): room for any cluster's GPUs.
_FIELD = 32
_MASK = (1 << _FIELD) - 1


def _pack(pods: int, free: int, nodes: int) -> int:
    """Pods, free GPUs and nodes in one int, so one C-level ``sum`` adds all three."""
    return pods | free << _FIELD | nodes << 2 * _FIELD


def _unpack(packed: int) -> tuple[int, int, int]:
    return packed & _MASK, packed >> _FIELD & _MASK, packed >> 2 * _FIELD


def _rule_on(node: NodeState, ps: PodSet) -> NumaRule | None:
    return rule_for(node, ps)


def _beam(opts: Sequence[_Option], width: int) -> list[_Option]:
    """The ``width`` best options, skipping those that only repeat a better one (same price on
    the same node types), plus the best one that leaves room for colocated pod sets."""
    out: list[_Option] = []
    # Options that differ in how many nodes they span are different shapes of answer (a
    # prefill set on one node or spread so that each decode pod can sit next to one of its
    # pods) even at the same price: each gets its own place in the beam.
    seen: set[tuple[Price, frozenset[str], int]] = set()
    for o in opts:
        shape = (o.price, o.kinds, len(o.masks))
        if len(out) < width and shape not in seen:
            out.append(o)
            seen.add(shape)
    out.extend([o for o in opts if o not in out][: width - len(out)])
    out.sort(key=_Option.key)
    if width > 1 and all(o.no_room for o in out):
        out.extend(o for o in opts if not o.no_room)
        out = out[: width + 1]
    return out


class _ClassTables:
    """What the solver works out per class of nodes (node type, free mask, NUMA rule) for a pod set,
    kept across decisions as :mod:`~extender.placement.node_fit` keeps its tables per node
    type: each is a function of the pod set, its resolved rules and the class alone, and a
    cluster's classes recur from one decision to the next while its nodes change hands. The
    capacity entries of the last few hundred pod sets, one pod's best ring bandwidth per
    (GPUs, node type, free mask, tier), and what the multi-node search reads per entry.
    """

    POD_SETS = 256
    GBPS = 1 << 20

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[PodSet, Need, bool], dict[EntryClass, Entry | None]] = OrderedDict()
        self.gbps: dict[tuple[int, str, int, Tier, NumaRule | None], float] = {}
        #: Per ((GPUs per pod, pods), node type, NUMA rule, entry): (pod bandwidth, _pack of
        #: its counts).
        self.speeds: dict[tuple[tuple[int, int], str, NumaRule | None, Entry], tuple[float, int]] = {}
        #: Per (node type, GPUs per pod, tier): the fastest GPU set's bandwidth (_top_gbps).
        self.tops: dict[tuple[str, int, Tier], float] = {}

    def entries(self, key: tuple[PodSet, Need, bool]) -> dict[EntryClass, Entry | None]:
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


_CLASS_TABLES = _ClassTables()


class _EmptyFits:
    """Whether a gang fits a cluster with nothing allocated or reserved, memoised per cluster
    topology (:meth:`ClusterSnapshot.topology`: what allocation does not change) and pod sets.
    A refusal asks it every time; the solve on the emptied cluster runs once per kind of gang.
    Bounded: the last few topologies, and that many gangs each."""

    TOPOLOGIES = 4
    GANGS = 1024

    def __init__(self) -> None:
        self._by_topology: OrderedDict[TopologyKey, tuple[ClusterSnapshot, dict[object, bool]]] = (
            OrderedDict()
        )

    def fits(self, snap: ClusterSnapshot, gang: GangRequest, exact_fallback: bool) -> bool:
        if (
            all(not (n.allocated or n.mnnvl_gang or n.foreign_domain) for n in snap.nodes)
            and not any(snap.reserved.values())
            and not snap.reserved_mnnvl
        ):
            return False  # the snapshot is empty already, and the gang did not fit it
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
            answers[key] = isinstance(Solver(empty, exact_fallback).place(gang), Slice)
        return answers[key]


_EMPTY_FITS = _EmptyFits()


def place(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Place one gang on a snapshot (reserved capacity already excluded from it)."""
    return Solver(snapshot).place(gang)
