"""How the simulator judges a slice, whichever policy made it.

Two questions: is the answer *usable* at all (the capacity rules: every pod gets the GPUs it
asked for, on a real node, free, none twice; a policy that breaks them has a bug and its
answer is refused), and is it *coherent* (the topology rules gangslice exists for; a policy
that breaks them still runs the gang, slower).
"""

from __future__ import annotations

from collections.abc import Sequence

from extender.cost import Comm
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest
from extender.placement.scoring import LevelError, resolve_level, shares_domain, violations
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.hierarchy import Hierarchy

#: Why a slice is not coherent, one word each (the keys of ``incoherentBy`` in results.json).
TIER = "tier"  # a pod's GPUs are not at its node type's tightest tier (split NVLink island, socket)
SPREAD = "spread"  # a pod set whose pods talk to each other spans more than one leaf or clique
COLOCATION = "colocation"  # a colocateWith wish is not met
RULES = "rules"  # scoring.violations reports a broken rule (required level, NVLink channel, ...)
REASONS = (TIER, SPREAD, COLOCATION, RULES)

#: Pod sets whose pods do not talk among themselves; ``spread`` does not apply to them.
_QUIET = (Comm.NONE, Comm.KV_TRANSFER)


def coherent_level(h: Hierarchy) -> int:
    """The level a multi-node pod set must stay within: the leaf (the finest switch level),
    or the finest level when the hierarchy has no switch level. Levels finer than the leaf
    (an NVLink domain, a clique) lie inside it."""
    switches = [i for i, lv in enumerate(h.levels) if lv.kind == "switch"]
    if switches:
        return switches[-1]
    return len(h.levels) - 1


def unusable(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> str | None:
    """The first capacity rule the slots break, or None."""
    counts = {ps.name: 0 for ps in gang.pod_sets}
    used: dict[str, set[int]] = {}
    for s in slots:
        if s.pod_set not in counts:
            return f"slot {s.key}: no pod set {s.pod_set!r} in the gang"
        ps = gang.pod_set(s.pod_set)
        counts[s.pod_set] += 1
        if not snap.has_node(s.node):
            return f"slot {s.key}: unknown node {s.node}"
        if len(set(s.gpus)) != len(s.gpus):
            return f"slot {s.key}: GPU list {list(s.gpus)} names a GPU twice"
        if len(s.gpus) != ps.gpus_per_pod:
            return f"slot {s.key}: {len(s.gpus)} GPUs for a pod of {ps.gpus_per_pod}"
        free = snap.free_gpus(s.node)
        if not set(s.gpus) <= free:
            return f"slot {s.key}: GPUs {sorted(set(s.gpus) - free)} on {s.node} are not free"
        taken = used.setdefault(s.node, set())
        if taken & set(s.gpus):
            return f"slot {s.key}: GPUs {sorted(taken & set(s.gpus))} on {s.node} given twice"
        taken.update(s.gpus)
    for ps in gang.pod_sets:
        if counts[ps.name] != ps.count:
            return f"pod set {ps.name}: {counts[ps.name]} slots for {ps.count} pods"
    return None


def incoherence(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> tuple[str, ...]:
    """Why a usable slice is not coherent (empty when it is), in :data:`REASONS` order."""
    found: set[str] = set()
    if violations(snap, gang, slots):
        found.add(RULES)
    h = snap.hierarchy
    scope = coherent_level(h)
    by_set: dict[str, list[PodSlot]] = {ps.name: [] for ps in gang.pod_sets}
    for s in slots:
        by_set[s.pod_set].append(s)
        node = snap.node(s.node)
        fit = fit_for(node.shape)
        tightest = fit.tightest(len(s.gpus))
        if tightest is not None and node.shape.tier_of(node.shape.mask_of(s.gpus)) > tightest:
            found.add(TIER)
    for ps in gang.pod_sets:
        nodes = [s.node for s in by_set[ps.name]]
        if ps.comm not in _QUIET and not shares_domain(snap, nodes, scope):
            # Pods of one NVLink clique talk over NVLink even across leaves of a custom hierarchy.
            cliques = {snap.clique(snap.index(n)) for n in nodes}
            if len(cliques) != 1 or None in cliques:
                found.add(SPREAD)
        if ps.colocate_with is not None:
            partner = [s.node for s in by_set.get(ps.colocate_with.pod_set, [])]
            try:
                level, _ = resolve_level(ps.colocate_with.level, h)
            except LevelError:
                level = None
            if level is not None and not shares_domain(snap, [*nodes, *partner], level):
                found.add(COLOCATION)
    return tuple(r for r in REASONS if r in found)
