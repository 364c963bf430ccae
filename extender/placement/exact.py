"""The exact search small gangs fall back on when the solver's candidate search places none.

A depth-first search over (node, GPU set) per pod, best options first, that keeps every hard
rule on the way down and returns the best valid slice by the objective
(:func:`~extender.placement.scoring.objective`) found within a budget. It only runs on small
gangs and small clusters, where it is cheap and where it makes the solver complete: the
solver does not call a gang unplaceable while a slice exists.

On a device-plugin node a pod does not choose its GPUs: the n-th pod of a pod set there gets
the plugin's n-th answer (:mod:`extender.placement.choice`), from what the gang's earlier pod
sets left on the node, and the node is no option for it when some answer breaks its tier.
"""

from __future__ import annotations

import dataclasses

from extender.cost import Comm
from extender.placement import feasibility, numa_fit
from extender.placement.feasibility import Resources
from extender.placement.node_fit import fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import (
    Need,
    colocation_misses,
    gang_micros,
    mnnvl_nodes,
    objective,
    pod_tier,
    pods_talk,
    room_taken,
    violations,
)
from extender.placement.slice import PodSlot, Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.model import Tier

#: Partial assignments tried at most.
EXACT_BUDGET = 20_000
#: Gangs of more pods, or clusters of more nodes, are not searched.
EXACT_MAX_PODS = 8
EXACT_MAX_NODES = 16

NOTE = "placed by exact search"


def exact_slice(snap: ClusterSnapshot, gang: GangRequest, needs: dict[str, Need]) -> Slice | None:
    """The best valid slice for a small gang found within the budget, or None.

    Pods of one pod set take their options in increasing order (they are interchangeable),
    and a pod set's own rules (scope, cliques) are checked as its pods are added, so a dead
    branch is cut at once.
    """
    if gang.pods > EXACT_MAX_PODS or len(snap.nodes) > EXACT_MAX_NODES:
        return None
    order = sorted(gang.pod_sets, key=lambda ps: -ps.gpus)
    options = {ps.name: _options(snap, ps, needs[ps.name]) for ps in order}
    pods = [(ps, k) for ps in order for k in range(ps.count)]
    budget = [EXACT_BUDGET]
    best: list[tuple[tuple[int, float, float], list[PodSlot]]] = []
    chosen: list[PodSlot] = []
    taken: dict[int, int] = {}
    used: dict[int, Resources] = {}
    limits = snap.limits_resources
    # GPUs of device-plugin nodes each pod set holds there so far, per (pod set, node).
    own: dict[tuple[str, int], int] = {}
    tiers = {ps.name: [pod_tier(snap, i, ps, needs[ps.name]) for i in range(len(snap.nodes))] for ps in order}
    alone = {
        (ps.name, k): GangRequest(gang.name, (_alone(ps, k),)) for ps in order for k in range(1, ps.count + 1)
    }

    def search(k: int, start: int) -> None:
        if k == len(pods):
            # Every rule was kept on the way down (the whole slice is checked once below).
            key = objective(snap, gang, chosen)
            if not best or key < best[0][0]:
                best[:] = [(key, list(chosen))]
            return
        ps, index = pods[k]
        opts = options[ps.name]
        for j in range(start if index else 0, len(opts)):
            if budget[0] <= 0:
                return
            budget[0] -= 1
            i, mask, nth = opts[j]
            here = used.get(i, feasibility.NOTHING)
            if limits and snap.room(i, ps.requests, room_taken(snap, gang.name, ps, i, here)) < 1:
                continue  # NodeResourcesFit: the gang's pods (and IMEX daemon) there fill the node
            node = snap.nodes[i]
            if nth >= 0:
                held = own.get((ps.name, i), 0)
                handed = _handed(snap, i, ps, tiers[ps.name][i], taken.get(i, 0), held, nth)
                if handed is None:
                    continue
                mask = handed
            elif taken.get(i, 0) & mask:
                continue
            gpus, numa, nic = fit_for(node.shape).slot_of(mask)
            chosen.append(PodSlot(ps.name, index, node.name, gpus, numa, nic))
            mine = [s for s in chosen if s.pod_set == ps.name]
            # Options already keep each pod's own rules (free GPUs at its tier); what a new
            # pod can break is its pod set's span, and only when it adds a node.
            spans = len({s.node for s in mine}) > len({s.node for s in mine[:-1]}) > 0
            if _numa_ok(snap, gang, i, chosen) and (
                not spans or not violations(snap, alone[(ps.name, index + 1)], mine)
            ):
                taken[i] = taken.get(i, 0) | mask
                used[i] = here.plus(feasibility.usage(ps.requests))
                if nth >= 0:
                    own[(ps.name, i)] = own.get((ps.name, i), 0) | mask
                search(k + 1, j if ps.gpus_per_pod == 0 else j + 1)
                taken[i] &= ~mask
                used[i] = here
                if nth >= 0:
                    own[(ps.name, i)] &= ~mask
            chosen.pop()

    search(0, 0)
    if not best or violations(snap, gang, best[0][1]):
        return None
    names = [p.name for p in gang.pod_sets]
    slots = sorted(best[0][1], key=lambda s: (names.index(s.pod_set), s.index))
    micros = gang_micros(snap, gang, slots)
    misses = colocation_misses(snap, gang, slots)
    return Slice(
        gang=gang.name,
        slots=tuple(slots),
        pod_set_micros=micros,
        score=round(sum(micros.values()), 3),
        domains=dict.fromkeys((s.pod_set for s in slots), "exact search"),
        notes=(NOTE, *(f"pod set {name}: {why}" for name, why in misses.items())),
        mnnvl_nodes=mnnvl_nodes(snap, gang, slots),
    )


def _numa_ok(snap: ClusterSnapshot, gang: GangRequest, i: int, chosen: list[PodSlot]) -> bool:
    """Whether the kubelet of node ``i`` admits every pod chosen there so far."""
    node = snap.nodes[i]
    if node.kubelet is None:
        return True
    pods = [
        (s.key, gang.pod_set(s.pod_set), node.shape.mask_of(s.gpus))
        for s in chosen
        if s.node == node.name and s.gpus
    ]
    return not numa_fit.violations(node, pods, snap.free_mask(i))


def _handed(
    snap: ClusterSnapshot, i: int, ps: PodSet, tier: Tier | None, taken: int, own: int, nth: int
) -> int | None:
    """The mask the device plugin hands the ``nth`` pod of ``ps`` on node ``i`` (0-based),
    its pods before it holding ``own`` there and the gang's GPUs there being ``taken``; None
    when it does not hold exactly ``nth`` pods there yet, or some answer breaks ``tier``."""
    if tier is None or own.bit_count() != nth * ps.gpus_per_pod:
        return None
    base = snap.free_mask(i) & ~(taken & ~own)
    node = snap.nodes[i]
    got = numa_fit.fit_on(node, numa_fit.rule_for(node, ps)).pick(base, ps.gpus_per_pod, tier, nth + 1)
    return None if got is None else got[nth]


def _options(snap: ClusterSnapshot, ps: PodSet, need: Need) -> list[tuple[int, int, int]]:
    """(node index, GPU mask, -1) for one pod of ``ps``: free, at its tier, on a node that
    kube-scheduler's filters admit, that has room for it (:mod:`extender.placement.feasibility`)
    and whose kubelet admits it; nodes outside cliques first for a pod set whose pods do not
    talk, then the tightest and fastest sets. On a
    device-plugin node, (node index, the plugin's n-th answer on the free GPUs, n) for each pod
    n the node can serve in turn (the mask is recomputed from what the gang took there)."""
    found: list[tuple[bool, int, float, int, int, int]] = []  # (..., node, n, mask)
    quiet = not pods_talk(ps)
    admitted = snap.admitted(ps.node_needs)
    for i, node in enumerate(snap.nodes):
        if (admitted is not None and i not in admitted) or snap.room(i, ps.requests) < 1:
            continue
        tier = pod_tier(snap, i, ps, need)
        if tier is None and ps.gpus_per_pod:
            continue
        fit = fit_for(node.shape)
        free = snap.free_mask(i)
        off = quiet and snap.clique(i) is not None
        rule = numa_fit.rule_for(node, ps)
        if rule is not None and rule.why:
            continue  # the kubelet admits no pod of this pod set here
        if node.plugin and tier is not None and ps.gpus_per_pod:
            handed = numa_fit.fit_on(node, rule)
            served = handed.capacity(free, ps.gpus_per_pod, tier)
            chain = handed.pick(free, ps.gpus_per_pod, tier, min(served, ps.count)) or ()
            # One node's answers stay together, in turn: the n-th pod there takes the n-th.
            first = chain[0] if chain else 0
            found.extend(
                (off, node.shape.tier_of(first), -fit.gbps(first), i, n, m) for n, m in enumerate(chain)
            )
            continue
        subs = fit.subsets(ps.gpus_per_pod, tier) if tier is not None and ps.gpus_per_pod else (0,)
        if rule is not None and rule.gpus_aligned:
            subs = tuple(m for m in subs if any(m & ~h[1] == 0 for h in rule.hints))
        found.extend((off, node.shape.tier_of(m), -fit.gbps(m), i, -1, m) for m in subs if m & free == m)
    found.sort()
    return [(i, m, n) for *_, i, n, m in found]


def _alone(ps: PodSet, count: int) -> PodSet:
    """The first ``count`` pods of ``ps`` as a gang of their own, for checking its own rules:
    without the colocateWith set, but under the same clique rules."""
    comm = ps.comm if ps.comm != Comm.KV_TRANSFER else Comm.ALLTOALL if pods_talk(ps) else Comm.NONE
    return dataclasses.replace(ps, count=count, colocate_with=None, comm=comm)
