"""The gangslice solver: a slice for the whole gang, from rack down to GPU index, or a reason.

For each pod set: find the finest level of the hierarchy (node, clique, leaf, spine, ...)
where one domain can hold every pod, pick among those domains the cheapest and then the
tightest fit (so large blocks stay whole), walk down that domain filling the best-fitting
children, and inside each node take the GPU sets that are tightest and leave the largest
coherent remainder. Pod sets are placed one after another on a shared view of what is taken;
if an order fails, other orders are tried, and small gangs fall back to an exact search, so
the solver does not call a gang unplaceable while a slice exists.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import (
    ANYWHERE,
    Need,
    fabric_domain,
    gang_micros,
    node_scope,
    pod_set_micros,
    pod_tier,
    resolve_need,
    violations,
)
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.model import Tier

#: How many candidate domains at the chosen level are evaluated in full.
CANDIDATES = 4
#: Exact-search budget (node/GPU-set choices tried) for small gangs the greedy cannot place.
EXACT_BUDGET = 20_000


@dataclass
class _Shortfall:
    pod_set: str
    reason: str
    closest: str | None
    short_by: int


@dataclass
class _State:
    """GPUs taken by pod sets of this gang placed so far, per node index."""

    taken: dict[int, int] = field(default_factory=dict)
    mnnvl: set[int] = field(default_factory=set)

    def copy(self) -> _State:
        return _State(dict(self.taken), set(self.mnnvl))


class Solver:
    """Places gangs on a snapshot. Stateless between calls apart from memo tables."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snap = snapshot
        self.h = snapshot.hierarchy

    # -- entry point ---------------------------------------------------------------------
    def place(self, gang: GangRequest) -> Placement:
        needs = {ps.name: resolve_need(ps, self.h) for ps in gang.pod_sets}
        first_failure: _Shortfall | None = None
        for order in self._orders(gang):
            result = self._place_in_order(gang, order, needs)
            if isinstance(result, Slice):
                return result
            first_failure = first_failure or result
        assert first_failure is not None
        exact = self._exact(gang, needs)
        if exact is not None:
            return exact
        return Unplaceable(
            gang=gang.name,
            reason=first_failure.reason,
            pod_set=first_failure.pod_set,
            closest=first_failure.closest,
            short_by=first_failure.short_by,
            feasible_when_empty=self._fits_empty(gang),
        )

    def _orders(self, gang: GangRequest) -> Iterable[Sequence[PodSet]]:
        anchors = {ps.colocate_with.pod_set for ps in gang.pod_sets if ps.colocate_with}
        default = sorted(gang.pod_sets, key=lambda ps: (ps.name not in anchors, -ps.gpus, ps.name))
        yield default
        if len(gang.pod_sets) > 1:
            for i, perm in enumerate(itertools.permutations(default)):
                if i >= 24:
                    break
                if list(perm) != default:
                    yield perm

    def _place_in_order(
        self, gang: GangRequest, order: Sequence[PodSet], needs: dict[str, Need]
    ) -> Slice | _Shortfall:
        state = _State()
        slots: dict[str, list[PodSlot]] = {}
        domains: dict[str, str] = {}
        notes: list[str] = []
        for ps in order:
            within: set[int] | None = None
            if ps.colocate_with and ps.colocate_with.pod_set in slots:
                within = self._colocation_nodes(slots[ps.colocate_with.pod_set], ps.colocate_with.level)
            got = self._place_pod_set(gang, ps, needs[ps.name], state, within)
            if isinstance(got, _Shortfall) and within is not None:
                assert ps.colocate_with is not None
                got = self._place_pod_set(gang, ps, needs[ps.name], state, None)
                if not isinstance(got, _Shortfall):
                    notes.append(
                        f"pod set {ps.name}: could not share a {ps.colocate_with.level} with "
                        f"{ps.colocate_with.pod_set}; placed apart"
                    )
            if isinstance(got, _Shortfall):
                return got
            placed, where, note = got
            slots[ps.name] = placed
            domains[ps.name] = where
            if note:
                notes.append(note)
        return self._finish(gang, [s for ps in gang.pod_sets for s in slots[ps.name]], domains, notes, state)

    def _finish(
        self,
        gang: GangRequest,
        slots: list[PodSlot],
        domains: dict[str, str],
        notes: list[str],
        state: _State,
    ) -> Slice:
        micros = gang_micros(self.snap, gang, slots)
        mnnvl = tuple(sorted(self.snap.nodes[i].name for i in state.mnnvl))
        return Slice(
            gang=gang.name,
            slots=tuple(slots),
            pod_set_micros=micros,
            score=round(sum(micros.values()), 3),
            domains=domains,
            notes=tuple(notes),
            mnnvl_nodes=mnnvl,
        )

    def _colocation_nodes(self, partner: Sequence[PodSlot], level: str) -> set[int] | None:
        from extender.placement.scoring import resolve_level

        scope, _ = resolve_level(level, self.h)
        if scope is None:
            return None
        nodes = {self.snap.index(s.node) for s in partner}
        if scope >= node_scope(self.h):
            return nodes
        keys = {self.h.domain(self.snap.path(i), scope) for i in nodes}
        if None in keys:
            return nodes
        domains = self.snap.domains()
        return {i for k in keys if k is not None for i in domains.get(k, ())}

    # -- one pod set ---------------------------------------------------------------------
    def _capacities(
        self, gang: str, ps: PodSet, need: Need, state: _State, within: set[int] | None, preferred: bool
    ) -> dict[int, tuple[int, int, Tier]]:
        """node index -> (pods that fit, free mask, tier) for every node that fits one pod."""
        caps: dict[int, tuple[int, int, Tier]] = {}
        snap = self.snap
        candidates: Iterable[int] = within if within is not None else range(len(snap.nodes))
        for i in candidates:
            free = snap.free_mask(i) & ~state.taken.get(i, 0)
            if free.bit_count() < ps.gpus_per_pod:
                continue
            tier = pod_tier(snap, i, ps, need, preferred)
            if tier is None:
                continue
            cap = fit_for(snap.nodes[i].shape).capacity(free, ps.gpus_per_pod, tier)
            if cap:
                caps[i] = (min(cap, ps.count), free, tier)
        return caps

    def _place_pod_set(
        self, gang: GangRequest, ps: PodSet, need: Need, state: _State, within: set[int] | None
    ) -> tuple[list[PodSlot], str, str | None] | _Shortfall:
        if ps.gpus_per_pod == 0:
            node = next(iter(state.taken), 0)
            slots = [PodSlot(ps.name, k, self.snap.nodes[node].name, ()) for k in range(ps.count)]
            return slots, f"node {self.snap.nodes[node].name}", None
        attempts: list[tuple[bool, int]] = []
        if need.preferred_tier is not None:
            attempts.append((True, need.preferred_scope if need.preferred_scope is not None else need.scope))
        if need.preferred_scope is not None:
            attempts.append((False, need.preferred_scope))
        attempts.append((False, need.scope))
        shortfall: _Shortfall | None = None
        for preferred_tier, scope in attempts:
            caps = self._capacities(gang.name, ps, need, state, within, preferred_tier)
            got = self._place_in_scope(gang.name, ps, caps, scope, state)
            if isinstance(got, _Shortfall):
                shortfall = got  # the last attempt is the required level: its reason binds
                continue
            slots, where = got
            note = None
            if (preferred_tier, scope) != attempts[0]:
                note = (
                    f"pod set {ps.name}: preferred level {ps.preferred_level} not met; placed within {where}"
                )
            return slots, where, note
        assert shortfall is not None
        return shortfall

    def _place_in_scope(
        self, gang: str, ps: PodSet, caps: dict[int, tuple[int, int, Tier]], scope: int, state: _State
    ) -> tuple[list[PodSlot], str] | _Shortfall:
        """Try scopes from one node up to ``scope``; the finest that fits wins."""
        n_levels = len(self.h.levels)
        need = ps.count
        best_short: tuple[int, str] | None = None
        # One node.
        single = [i for i, (cap, _, _) in caps.items() if cap >= need]
        if single:
            i = min(single, key=lambda j: (*self._node_rank(ps, j, caps[j]), j))
            return self._realise(gang, ps, {i: need}, caps, state), f"node {self.snap.nodes[i].name}"
        if scope >= node_scope(self.h):
            best = max(caps.items(), key=lambda kv: kv[1][0], default=None)
            if best is not None:
                best_short = (best[1][0], f"node {self.snap.nodes[best[0]].name}")
            return self._shortfall(ps, "node", best_short)
        if need > 1:
            multi = self._multi_node_caps(gang, caps)
            domains = self.snap.domains()
            for level in range(n_levels - 1, max(scope, ANYWHERE) - 1, -1):
                fabric = self.h.levels[level].fabric
                found: list[tuple[tuple[float, ...], list[int]]] = []
                for key, members in domains.items():
                    if key[0] != level:
                        continue
                    usable = [i for i in members if i in caps and (fabric or i in multi)]
                    if not usable:
                        continue
                    if fabric:
                        usable = [i for i in usable if multi.get(i, True) or self._owns_mnnvl(gang, i)]
                    total = sum(caps[i][0] for i in usable)
                    if total >= need:
                        found.append((self._domain_rank(ps, usable, caps, need), usable))
                    elif best_short is None or total > best_short[0]:
                        best_short = (total, self.h.describe(key))
                if found:
                    found.sort(key=lambda f: f[0])
                    return self._best_domain(gang, ps, found[:CANDIDATES], caps, state, level)
            if scope == ANYWHERE:
                usable = [i for i in caps if i in multi]
                total = sum(caps[i][0] for i in usable)
                if total >= need:
                    assignment = self._fill(usable, 0, need, caps, ps)
                    return self._realise(gang, ps, assignment, caps, state), "cluster"
                return self._shortfall(ps, None, (total, "cluster"))
        level_name = self.h.levels[scope].name if 0 <= scope < n_levels else None
        return self._shortfall(ps, level_name, best_short)

    def _owns_mnnvl(self, gang: str, i: int) -> bool:
        owner = self.snap.mnnvl_owner(i)
        return owner is None or owner == gang

    def _multi_node_caps(self, gang: str, caps: dict[int, tuple[int, int, Tier]]) -> dict[int, bool]:
        """Nodes a multi-node pod set may use outside a clique scope: those with no clique
        (a clique is all-or-nothing); inside a clique scope, nodes whose IMEX channel is free."""
        out: dict[int, bool] = {}
        for i in caps:
            if fabric_domain(self.snap, i) is None:
                out[i] = True
            elif not self._owns_mnnvl(gang, i):
                out[i] = False
        return {i: v for i, v in out.items() if v}

    def _node_rank(self, ps: PodSet, i: int, entry: tuple[int, int, Tier]) -> tuple[float, ...]:
        """Single-node choice: fastest GPU sets first, then the tightest fit, then the node
        whose remainder stays most coherent."""
        _, free, tier = entry
        fit = fit_for(self.snap.nodes[i].shape)
        picked = fit.pick(free, ps.gpus_per_pod, tier, ps.count) or ()
        gbps = min((fit.gbps(m) for m in picked), default=0.0)
        rest = free
        for m in picked:
            rest &= ~m
        return (-gbps, float(free.bit_count() - ps.gpus), float(-fit.coherent_block(rest)))

    def _domain_rank(
        self, ps: PodSet, usable: list[int], caps: dict[int, tuple[int, int, Tier]], need: int
    ) -> tuple[float, ...]:
        gbps = max(self._best_pod_gbps(ps, i, caps[i]) for i in usable)
        free = sum(caps[i][1].bit_count() for i in usable)
        return (-gbps, float(free - need * ps.gpus_per_pod), float(len(usable)))

    def _best_pod_gbps(self, ps: PodSet, i: int, entry: tuple[int, int, Tier]) -> float:
        _, free, tier = entry
        fit = fit_for(self.snap.nodes[i].shape)
        picked = fit.pick(free, ps.gpus_per_pod, tier, 1)
        return fit.gbps(picked[0]) if picked else 0.0

    def _best_domain(
        self,
        gang: str,
        ps: PodSet,
        found: list[tuple[tuple[float, ...], list[int]]],
        caps: dict[int, tuple[int, int, Tier]],
        state: _State,
        level: int,
    ) -> tuple[list[PodSlot], str]:
        best: tuple[tuple[float, ...], list[PodSlot], str] | None = None
        for rank, usable in found:
            assignment = self._fill(usable, level + 1, ps.count, caps, ps)
            trial = state.copy()
            slots = self._realise(gang, ps, assignment, caps, trial)
            micros = pod_set_micros(self.snap, ps, slots)
            key = (round(micros, 6), *rank[1:])
            if best is None or key < best[0]:
                where = self.h.describe((level, tuple(self.snap.path(usable[0])[: level + 1])))
                best = (key, slots, where)
        assert best is not None
        # Commit the winner's GPUs to the shared state.
        for s in best[1]:
            i = self.snap.index(s.node)
            shape = self.snap.nodes[i].shape
            state.taken[i] = state.taken.get(i, 0) | shape.mask_of(s.gpus)
        if len({s.node for s in best[1]}) > 1:
            state.mnnvl.update(
                self.snap.index(s.node) for s in best[1] if fabric_domain(self.snap, self.snap.index(s.node))
            )
        return best[1], best[2]

    def _fill(
        self, nodes: list[int], level: int, need: int, caps: dict[int, tuple[int, int, Tier]], ps: PodSet
    ) -> dict[int, int]:
        """Spread ``need`` pods over ``nodes`` (all in one domain above ``level``), preferring
        the fewest, best-fitting children at each level down to single nodes."""
        n_levels = len(self.h.levels)
        if level >= n_levels:
            return self._fill_nodes(nodes, need, caps, ps)
        groups: dict[object, list[int]] = {}
        for i in nodes:
            label = self.snap.path(i)[level]
            groups.setdefault(label if label is not None else ("unlabelled", i), []).append(i)
        if len(groups) == 1:
            return self._fill(nodes, level + 1, need, caps, ps)
        cap_of = {k: sum(caps[i][0] for i in v) for k, v in groups.items()}
        out: dict[int, int] = {}
        pool = sorted(groups, key=lambda k: (-cap_of[k], str(k)))
        remaining = need
        while remaining > 0:
            fitting = [k for k in pool if cap_of[k] >= remaining]
            if fitting:
                k = min(fitting, key=lambda k: (cap_of[k], str(k)))
                out.update(self._fill(groups[k], level + 1, remaining, caps, ps))
                return out
            k = pool.pop(0)
            out.update(self._fill(groups[k], level + 1, cap_of[k], caps, ps))
            remaining -= cap_of[k]
        return out

    def _fill_nodes(
        self, nodes: list[int], need: int, caps: dict[int, tuple[int, int, Tier]], ps: PodSet
    ) -> dict[int, int]:
        out: dict[int, int] = {}
        pool = sorted(nodes, key=lambda i: (-caps[i][0], -self._best_pod_gbps(ps, i, caps[i]), i))
        remaining = need
        while remaining > 0:
            fitting = [i for i in pool if caps[i][0] >= remaining]
            if fitting:
                i = min(fitting, key=lambda i: (caps[i][0], -self._best_pod_gbps(ps, i, caps[i]), i))
                out[i] = remaining
                return out
            i = pool.pop(0)
            out[i] = caps[i][0]
            remaining -= caps[i][0]
        return out

    def _realise(
        self,
        gang: str,
        ps: PodSet,
        assignment: dict[int, int],
        caps: dict[int, tuple[int, int, Tier]],
        state: _State,
    ) -> list[PodSlot]:
        slots: list[PodSlot] = []
        index = 0
        for i in sorted(assignment, key=lambda j: self.snap.nodes[j].name):
            count = assignment[i]
            _, free, tier = caps[i]
            free &= ~state.taken.get(i, 0)
            node = self.snap.nodes[i]
            fit = fit_for(node.shape)
            picked = fit.pick(free, ps.gpus_per_pod, tier, count)
            if picked is None:  # capacity said it fits; pick must agree
                raise AssertionError(f"node {node.name}: cannot pick {count} x {ps.gpus_per_pod} GPUs")
            for mask in picked:
                state.taken[i] = state.taken.get(i, 0) | mask
                gpus = node.shape.gpus_of(mask)
                slots.append(
                    PodSlot(
                        pod_set=ps.name,
                        index=index,
                        node=node.name,
                        gpus=gpus,
                        numa_nodes=node.shape.numa_of(mask),
                        nic=node.shape.best_nic.get(gpus[0]),
                    )
                )
                index += 1
        if len(assignment) > 1:
            state.mnnvl.update(i for i in assignment if fabric_domain(self.snap, i) is not None)
        return slots

    # -- reasons -------------------------------------------------------------------------
    def _shortfall(self, ps: PodSet, level: str | None, best: tuple[int, str] | None) -> _Shortfall:
        words = self._tier_words(ps)
        what = f"{ps.count} pods of {ps.gpus_per_pod} free {words}GPU{'s' if ps.gpus_per_pod != 1 else ''}"
        largest = max((n.shape.size for n in self.snap.nodes), default=0)
        if ps.gpus_per_pod > largest:
            return _Shortfall(
                ps.name,
                f"pod set {ps.name}: no node has {ps.gpus_per_pod} GPUs (the largest has {largest})",
                None,
                ps.count,
            )
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
        return _Shortfall(ps.name, reason, where, need_more)

    def _tier_words(self, ps: PodSet) -> str:
        need = resolve_need(ps, self.h)
        if need.tier is not None:
            words = need.tier.words
        else:
            tiers = {fit_for(n.shape).tightest(ps.gpus_per_pod) for n in self.snap.nodes}
            tiers.discard(None)
            words = min(t for t in tiers if t is not None).words if tiers else ""
        return f"{words} " if words else ""

    def _fits_empty(self, gang: GangRequest) -> bool:
        empty_nodes = [
            type(n)(n.name, n.labels, n.graph, frozenset(), n.unhealthy, None) for n in self.snap.nodes
        ]
        empty = ClusterSnapshot(empty_nodes, self.h)
        if all(not (n.allocated or n.mnnvl_gang) for n in self.snap.nodes) and not self.snap.reserved:
            return False
        solver = Solver(empty)
        needs = {ps.name: resolve_need(ps, self.h) for ps in gang.pod_sets}
        return any(isinstance(solver._place_in_order(gang, o, needs), Slice) for o in solver._orders(gang))

    # -- exact fallback ------------------------------------------------------------------
    def _exact(self, gang: GangRequest, needs: dict[str, Need]) -> Slice | None:
        """Depth-first search over (node, GPU set) per pod for small gangs, cheapest first."""
        if gang.pods > 8 or len(self.snap.nodes) > 16:
            return None
        pods = [(ps, k) for ps in gang.pod_sets for k in range(ps.count)]
        budget = [EXACT_BUDGET]
        best: list[tuple[float, list[PodSlot]]] = []
        chosen: list[PodSlot] = []
        taken: dict[int, int] = {}

        def options(ps: PodSet) -> list[tuple[int, int]]:
            out: list[tuple[int, int]] = []
            for i, node in enumerate(self.snap.nodes):
                tier = pod_tier(self.snap, i, ps, needs[ps.name])
                if tier is None:
                    continue
                free = self.snap.free_mask(i) & ~taken.get(i, 0)
                out.extend(
                    (i, sub)
                    for sub in fit_for(node.shape).subsets(ps.gpus_per_pod, tier)
                    if sub & free == sub
                )
            return out

        def search(k: int) -> None:
            if budget[0] <= 0:
                return
            if k == len(pods):
                if not violations(self.snap, gang, chosen):
                    micros = sum(gang_micros(self.snap, gang, chosen).values())
                    if not best or micros < best[0][0]:
                        best[:] = [(micros, list(chosen))]
                return
            ps, index = pods[k]
            for i, sub in options(ps):
                budget[0] -= 1
                if budget[0] <= 0:
                    return
                node = self.snap.nodes[i]
                gpus = node.shape.gpus_of(sub)
                chosen.append(
                    PodSlot(
                        ps.name,
                        index,
                        node.name,
                        gpus,
                        node.shape.numa_of(sub),
                        node.shape.best_nic.get(gpus[0]),
                    )
                )
                taken[i] = taken.get(i, 0) | sub
                search(k + 1)
                taken[i] &= ~sub
                chosen.pop()

        search(0)
        if not best:
            return None
        slots = best[0][1]
        state = _State()
        for s in slots:
            i = self.snap.index(s.node)
            state.taken[i] = state.taken.get(i, 0) | self.snap.nodes[i].shape.mask_of(s.gpus)
        by_set: dict[str, set[int]] = {}
        for s in slots:
            by_set.setdefault(s.pod_set, set()).add(self.snap.index(s.node))
        for nodes in by_set.values():
            if len(nodes) > 1:
                state.mnnvl.update(i for i in nodes if fabric_domain(self.snap, i) is not None)
        domains = {name: "exact search" for name in by_set}
        return self._finish(gang, slots, domains, ["placed by exact search"], state)


def place(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Place one gang on a snapshot (reserved capacity already excluded from it)."""
    return Solver(snapshot).place(gang)
