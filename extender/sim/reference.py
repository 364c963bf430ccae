"""The best step a gang can get on a fleet: an exact optimum found without the gangslice solver.

The simulator judges every policy's slice against the fastest step (compute + communication,
:func:`~extender.placement.step.slice_step`) any valid slice achieves for that gang on the
cluster with no simulated gang. The optimum comes from an exhaustive search of its own, so
the judge does not take gangslice's answer for the best one: it enumerates every way of
putting the gang's pods on nodes and their GPUs, keeps the slices
:func:`~extender.placement.scoring.violations` accepts (the hard rules every policy's slice
is priced by) and takes the fastest.

Three reductions keep the search small without losing the optimum:

- **Identical nodes.** On the cluster with no simulated gang, the nodes under the same finest
  domain with the same GPU graph, allocation mode, free GPUs, labels (other than the
  hierarchy's) and node facts are interchangeable. A pod goes either to a node of its unit
  already used or to the unit's first unused one, and at most as many nodes as the gang has
  pods are kept per unit.
- **Identical domains.** Sibling domains whose contents are identical (node for node) are
  interchangeable; at most as many as the gang has pods are kept.
- **Interchangeable pods.** Pods of one pod set take (unit, node) in non-decreasing order; a
  pod set that must stay within one domain (its required level) is cut as soon as it leaves it.

On each node the GPUs are chosen as that node does it: on a DRA node every set of free GPUs
that keeps each pod's tier is a choice (one of each kind: choices giving every group of the
pods there the same tier, ring bandwidth and NUMA nodes are alike to the step and to the
rules); on a device-plugin node the pods of each pod set get the plugin's answers in turn,
after the pod sets before them, in every order of the pod sets.

The search stops after :data:`BUDGET` complete slices; an optimum found within it but not
proven is marked inexact and the run says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from extender.placement.node_fit import fit_for
from extender.placement.plugin_fit import plugin_pick
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import (
    ANYWHERE,
    node_scope,
    pod_tier,
    resolve_need,
    violations,
)
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.step import StepTime, slice_step
from extender.topology.model import Tier

if TYPE_CHECKING:
    from extender.sim.trace import Trace

#: Complete slices evaluated at most per search.
BUDGET = 200_000


@dataclass(frozen=True)
class Best:
    """The fastest valid slice of a gang: its step (microseconds) and where it runs."""

    step: StepTime
    slots: tuple[PodSlot, ...]
    #: False when the search ran out of budget before it proved this the optimum.
    exact: bool = True

    @property
    def step_us(self) -> float:
        return self.step.total_us


@dataclass
class _Unit:
    """Interchangeable nodes: node indices (kept ones only), the same finest domain and class."""

    nodes: list[int]
    path: tuple[str | None, ...]


def _class_key(snap: ClusterSnapshot, i: int, level_labels: frozenset[str]) -> object:
    n: NodeState = snap.nodes[i]
    labels = tuple(sorted((k, v) for k, v in n.labels.items() if k not in level_labels))
    return (
        n.kind,
        n.graph.model,
        snap.free_mask(i),
        labels,
        n.facts,
        repr(n.kubelet),
        n.mnnvl_gang,
        n.foreign_domain,
    )


def reduced_units(snap: ClusterSnapshot, keep: int) -> list[_Unit]:
    """The cluster as units of interchangeable nodes, at most ``keep`` nodes a unit and ``keep``
    identical sibling domains a parent (see the module docstring)."""
    levels = snap.hierarchy.levels
    level_labels = frozenset(lv.label for lv in levels) | {"kubernetes.io/hostname"}
    units: dict[tuple[tuple[str | None, ...], object], list[int]] = {}
    for i in sorted(range(len(snap.nodes)), key=lambda i: (_sortable(snap.path(i)), snap.nodes[i].name)):
        units.setdefault((snap.path(i), _class_key(snap, i, level_labels)), []).append(i)
    # Domain signatures, finest first: a domain's contents relative to it.
    depth = len(levels)
    content: dict[tuple[str | None, ...], list[_Item]] = {}
    for (path, key), members in units.items():
        for level in range(depth + 1):
            content.setdefault(path[:level], []).append(
                (path[level:] if level < depth else (), key, len(members))
            )
    dropped: set[tuple[str | None, ...]] = set()
    for level in range(1, depth + 1):
        siblings: dict[tuple[tuple[str | None, ...], object], list[tuple[str | None, ...]]] = {}
        for prefix in sorted({p for p in content if len(p) == level}, key=_sortable):
            if prefix[-1] is None or prefix[:-1] in dropped:
                continue  # a node without the level's label shares that level with nobody
            sig = _signature(content[prefix])
            siblings.setdefault((prefix[:-1], sig), []).append(prefix)
        for same in siblings.values():
            dropped.update(same[keep:])
    out = []
    for (path, _), members in units.items():
        if any(path[:level] in dropped for level in range(1, depth + 1)):
            continue
        out.append(_Unit(members[:keep], path))
    return out


def _sortable(path: tuple[str | None, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, v or "") for v in path)


_Item = tuple[tuple[str | None, ...], object, int]


def _signature(items: list[_Item]) -> object:
    """Contents of a domain with its own sub-domain names replaced by their order of appearance,
    so two siblings holding the same nodes in the same arrangement get the same signature."""
    names: dict[tuple[int, str | None], int] = {}
    out = []
    for rel, key, count in sorted(items, key=repr):
        renamed = tuple(v if v is None else names.setdefault((k, v), len(names)) for k, v in enumerate(rel))
        out.append((renamed, repr(key), count))
    return tuple(sorted(out, key=repr))


@dataclass
class _Search:
    snap: ClusterSnapshot
    gang: GangRequest
    units: list[_Unit]
    budget: int
    evaluated: int = 0
    best: Best | None = None
    memo: dict[tuple[object, ...], list[tuple[int, ...]]] = field(default_factory=dict)
    keys: dict[int, object] = field(default_factory=dict)


def best_slice(snap: ClusterSnapshot, gang: GangRequest, budget: int = BUDGET) -> Best | None:
    """The fastest valid slice of ``gang`` on ``snap`` (see the module docstring), None when
    no valid slice exists."""
    if gang.pods == 0:
        return None
    units = reduced_units(snap, gang.pods)
    h = snap.hierarchy
    needs = {ps.name: resolve_need(ps, h) for ps in gang.pod_sets}
    order = sorted(gang.pod_sets, key=lambda ps: (-ps.gpus_per_pod, -ps.count))
    pods = [ps for ps in order for _ in range(ps.count)]
    options: dict[str, list[int]] = {}
    for ps in order:
        admitted = snap.admitted(ps.node_needs)
        options[ps.name] = [
            u
            for u, unit in enumerate(units)
            if (admitted is None or unit.nodes[0] in admitted)
            and snap.free_mask(unit.nodes[0]).bit_count() >= ps.gpus_per_pod
            and pod_tier(snap, unit.nodes[0], ps, needs[ps.name]) is not None
        ]
    search = _Search(snap, gang, units, budget)
    opened = [0] * len(units)
    # Per used node (unit, k): GPUs taken so far, and the pod sets of its pods in order.
    used: dict[tuple[int, int], int] = {}
    on_node: dict[tuple[int, int], list[str]] = {}
    where: list[tuple[int, int]] = []

    def scope_ok(ps: PodSet, u: int, start: int) -> bool:
        """Whether a pod of ``ps`` in unit ``u`` stays in the domain its first pod chose."""
        scope = needs[ps.name].scope
        if scope == ANYWHERE or start == len(where):
            return True
        u0 = where[start][0]
        if scope >= node_scope(h):
            return u0 == u  # the node itself is checked by the caller
        a, b = units[u0].path[: scope + 1], units[u].path[: scope + 1]
        return a == b and a[-1] is not None

    def walk(p: int) -> None:
        if search.evaluated >= search.budget:
            return
        if p == len(pods):
            _evaluate(search, on_node)
            return
        ps = pods[p]
        start = _first_of_set(pods, p)
        low = where[p - 1] if p > start else (-1, -1)
        for u in options[ps.name]:
            if u < low[0] or not scope_ok(ps, u, start):
                continue
            cap = snap.free_mask(units[u].nodes[0]).bit_count()
            for k in range(min(opened[u] + 1, len(units[u].nodes))):
                if (u, k) < low:
                    continue
                if needs[ps.name].scope >= node_scope(h) and p > start and (u, k) != where[start]:
                    continue
                taken = used.get((u, k), 0)
                if taken + ps.gpus_per_pod > cap:
                    continue
                fresh = k == opened[u]
                if fresh:
                    opened[u] += 1
                used[(u, k)] = taken + ps.gpus_per_pod
                on_node.setdefault((u, k), []).append(ps.name)
                where.append((u, k))
                walk(p + 1)
                where.pop()
                on_node[(u, k)].pop()
                if not on_node[(u, k)]:
                    del on_node[(u, k)]
                if taken:
                    used[(u, k)] = taken
                else:
                    del used[(u, k)]
                if fresh:
                    opened[u] -= 1

    walk(0)
    if search.best is not None and search.evaluated >= search.budget:
        return Best(search.best.step, search.best.slots, exact=False)
    return search.best


def _first_of_set(pods: Sequence[PodSet], p: int) -> int:
    k = p
    while k > 0 and pods[k - 1] is pods[p]:
        k -= 1
    return k


def _evaluate(search: _Search, on_node: dict[tuple[int, int], list[str]]) -> None:
    snap, gang = search.snap, search.gang
    per_node = []
    for (u, k), names in sorted(on_node.items()):
        i = search.units[u].nodes[k]
        choices = _node_choices(search, i, tuple(names))
        if not choices:
            return
        per_node.append([(i, names, masks) for masks in choices])
    for combo in itertools.product(*per_node):
        if search.evaluated >= search.budget:
            return
        search.evaluated += 1
        slots = _slots(snap, gang, combo)
        if violations(snap, gang, slots):
            continue
        step = slice_step(snap, gang, slots)
        if search.best is None or step.total_us < search.best.step_us - 1e-9:
            search.best = Best(step, tuple(slots))


def _slots(
    snap: ClusterSnapshot, gang: GangRequest, combo: Sequence[tuple[int, list[str], tuple[int, ...]]]
) -> list[PodSlot]:
    index = dict.fromkeys((ps.name for ps in gang.pod_sets), 0)
    out = []
    for i, names, masks in combo:
        node = snap.nodes[i]
        fit = fit_for(node.shape)
        for name, mask in zip(names, masks, strict=True):
            gpus, numa, nic = fit.slot_of(mask)
            out.append(PodSlot(name, index[name], node.name, gpus, numa, nic))
            index[name] += 1
    return out


def _node_choices(search: _Search, i: int, names: tuple[str, ...]) -> list[tuple[int, ...]]:
    """GPU masks for the pods ``names`` (pod set names, grouped) on node ``i``, one of each kind."""
    snap = search.snap
    key = search.keys.get(i)
    if key is None:
        level_labels = frozenset(lv.label for lv in snap.hierarchy.levels)
        key = search.keys[i] = _class_key(snap, i, level_labels)
    memo_key = (key, names)
    got = search.memo.get(memo_key)
    if got is None:
        got = search.memo[memo_key] = node_choices(snap, search.gang, i, names)
    return got


def node_choices(
    snap: ClusterSnapshot, gang: GangRequest, i: int, names: Sequence[str]
) -> list[tuple[int, ...]]:
    """The ways node ``i`` gives GPUs to pods of ``gang`` (``names``: their pod sets, grouped),
    each pod within its tier there: on a DRA node every choice of free GPUs, one of each kind
    (every group of the pods with the same tier, ring bandwidth and NUMA nodes); on a
    device-plugin node the plugin's answers to each pod set in turn, in every order of the pod
    sets. Each choice is one GPU mask per pod, in the order of ``names``."""
    names = tuple(names)
    by_name = {ps.name: ps for ps in gang.pod_sets}
    tiers = {n: pod_tier(snap, i, by_name[n], resolve_need(by_name[n], snap.hierarchy)) for n in set(names)}
    if snap.nodes[i].plugin:
        return _plugin_choices(snap, i, names, by_name, tiers)
    return _free_choices(snap, i, names, by_name, tiers)


def _plugin_choices(
    snap: ClusterSnapshot,
    i: int,
    names: tuple[str, ...],
    by_name: dict[str, PodSet],
    tiers: dict[str, Tier | None],
) -> list[tuple[int, ...]]:
    node = snap.nodes[i]
    groups = list(dict.fromkeys(names))
    out: list[tuple[int, ...]] = []
    for order in itertools.permutations(groups):
        free = snap.free_mask(i)
        masks: dict[str, tuple[int, ...]] = {}
        for name in order:
            tier = tiers[name]
            got = (
                plugin_pick(node.graph, free, by_name[name].gpus_per_pod, tier, names.count(name))
                if tier is not None
                else None
            )
            if got is None:
                break
            masks[name] = got
            for m in got:
                free &= ~m
        else:
            chosen = tuple(m for name in groups for m in masks[name])
            if chosen not in out:
                out.append(chosen)
    return out


def _free_choices(
    snap: ClusterSnapshot,
    i: int,
    names: tuple[str, ...],
    by_name: dict[str, PodSet],
    tiers: dict[str, Tier | None],
) -> list[tuple[int, ...]]:
    shape = snap.nodes[i].shape
    free = snap.free_mask(i)
    single: dict[str, list[int]] = {}
    for name in set(names):
        g, tier = by_name[name].gpus_per_pod, tiers[name]
        single[name] = [
            m
            for combo in itertools.combinations([b for b in range(shape.size) if free >> b & 1], g)
            if (m := sum(1 << b for b in combo)) >= 0 and tier is not None and shape.tier_of(m) <= tier
        ]
    members = [g for r in range(1, len(names) + 1) for g in itertools.combinations(range(len(names)), r)]
    kinds: dict[tuple[object, ...], tuple[int, ...]] = {}

    def walk(k: int, taken: int, chosen: list[int]) -> None:
        if k == len(names):
            sig: list[object] = []
            for group in members:
                union = 0
                for p in group:
                    union |= chosen[p]
                sig.append((shape.tier_of(union), shape.gbps_of(union), shape.numa_of(union)))
            kinds.setdefault(tuple(sig), tuple(chosen))
            return
        for mask in single[names[k]]:
            if mask & taken or (k and names[k - 1] == names[k] and mask < chosen[-1]):
                continue
            walk(k + 1, taken | mask, [*chosen, mask])

    walk(0, 0, [])
    return list(kinds.values())


class Reference:
    """Best steps of requests, memoised per request shape; shared by every policy of a run.

    ``best``: on the whole cluster with no simulated gang. ``same_hardware``: on that cluster
    cut down to the node types a slice actually got (:attr:`NodeState.kind`), which separates
    a worse arrangement from slower hardware.
    """

    def __init__(self, empty: ClusterSnapshot, search: Callable[..., Best | None] = best_slice) -> None:
        self.empty = empty
        self._search = search
        self._memo: dict[tuple[frozenset[str] | None, tuple[PodSet, ...]], Best | None] = {}
        self._clusters: dict[frozenset[str], ClusterSnapshot] = {}
        #: Searches that raised or ran out of budget (the first few), as ``{gang, error}``.
        self.errors: list[dict[str, str]] = []

    def best(self, gang: GangRequest) -> Best | None:
        return self._solve(None, gang)

    def same_hardware(self, gang: GangRequest, node_types: frozenset[str]) -> Best | None:
        return self._solve(node_types, gang)

    def _solve(self, node_types: frozenset[str] | None, gang: GangRequest) -> Best | None:
        key = (node_types, gang.pod_sets)
        if key not in self._memo:
            cluster = self.empty if node_types is None else self._cut(node_types)
            try:
                got = self._search(cluster, gang)
            except Exception as exc:  # a bug: reported with the run, not fatal to it
                got = None
                self._note(gang, f"{type(exc).__name__}: {exc}")
            if got is not None and not got.exact:
                self._note(gang, f"the exact search stopped after {BUDGET} slices; its best is not proven")
            self._memo[key] = got
        return self._memo[key]

    def templates(self, trace: Trace) -> dict[str, Best | None]:
        """The best slice of each template (or inline deployment) of a trace."""
        return {d.template or d.name: self.best(d.gang) for d in trace.deployments}

    def _note(self, gang: GangRequest, error: str) -> None:
        if len(self.errors) < 20:
            self.errors.append({"gang": gang.name, "error": error})

    def _cut(self, node_types: frozenset[str]) -> ClusterSnapshot:
        got = self._clusters.get(node_types)
        if got is None:
            nodes = [n for n in self.empty.nodes if n.kind in node_types]
            got = self._clusters[node_types] = ClusterSnapshot(nodes, self.empty.hierarchy)
        return got
