"""In-node pairing: the GPUs of a KV hand-off's two sides on one node, chosen together.

The search places pod sets one after another, and a pod set's GPUs on a node are picked for
the pod set alone (best fit: a broken PCIe pair first). When a kv-transfer set then lands on
the node of its colocateWith set, the hand-off runs over whatever link joins the two picks:
on a PCIe box with GPU 1 taken, a 1-GPU prefill gets GPU 0 and its decode GPU 2, across
PCIe switches, while GPUs 2 and 3 share one. So once a branch is complete, a pair whose two
sides (and the KV partners of every pod set a move touches) sit wholly on one node has its pods'
GPUs chosen again, together, from the GPUs they hold and those the slice leaves free there (a
pair spread over nodes keeps its picks): the cheapest (the judge's communication model,
:func:`~extender.placement.scoring.pod_set_micros`, of the pod sets whose slots or KV partners
move) wins, then the most coherent remainder; the first pick stays unless one is strictly
better. The search's branches often finish on nodes of one type in the same state: the best
answer is kept per decision (``DecisionTables.pairings``).

Only where gangslice chooses the GPUs: not on device-plugin nodes, nor where the kubelet's
Topology Manager aligns them. A pod keeps its tier or gets a tighter one, so its own rules
hold; the new slice must pass :func:`~extender.placement.scoring.violations` or is dropped.
The work is bounded: at most :data:`MAX_PODS` pods per node and :data:`MAX_TRIES` assignments.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence

from extender.cost import Comm
from extender.placement.node_fit import NodeFit, fit_for
from extender.placement.scoring import pod_set_micros, violations
from extender.placement.search.context import Decision
from extender.placement.search.option import Option
from extender.placement.search.rank import quantize
from extender.placement.slice import PodSlot

#: Pods of a pair's two sides beyond which their GPUs are not chosen again.
MAX_PODS = 4
#: Complete assignments looked at per node, at most.
MAX_TRIES = 4096


def pair_in_nodes(ctx: Decision, placed: Mapping[str, Option]) -> dict[str, Option]:
    """``placed`` with the GPUs of each KV pair sharing a node chosen together (see the module
    docstring); unchanged where no pair shares a node or nothing better exists."""
    out = dict(placed)
    gang = ctx.gang
    pairs = [
        (ps.colocate_with.pod_set, ps.name)
        for ps in gang.pod_sets
        if ps.comm == Comm.KV_TRANSFER and ps.colocate_with is not None and ps.gpus_per_pod > 0
    ]
    for anchor, kv in pairs:
        if anchor not in out or gang.pod_set(anchor).gpus_per_pod <= 0:
            continue
        shared = {s.node for s in out[anchor].slots} & {s.node for s in out[kv].slots}
        for node in sorted(shared):
            better = _repick(ctx, out, (anchor, kv), node)
            if better is not None:
                out = better
    return out


def _repick(
    ctx: Decision, placed: Mapping[str, Option], sides: tuple[str, str], node: str
) -> dict[str, Option] | None:
    snap, gang = ctx.snap, ctx.gang
    i = snap.index(node)
    state = snap.nodes[i]
    if state.plugin or any(ctx.rule(i, gang.pod_set(name)) is not None for name in sides):
        return None
    # The pod sets whose cost a move can change: the two sides and those taking a KV cache
    # from one of them; with their KV partners, every slot must be on this node.
    touched = [
        ps
        for ps in gang.pod_sets
        if ps.name in sides or (ps.colocate_with is not None and ps.colocate_with.pod_set in sides)
    ]
    needed = {ps.name for ps in touched} | {ps.colocate_with.pod_set for ps in touched if ps.colocate_with}
    if any(s.node != node for name in needed for s in placed[name].slots):
        return None
    mine = [s for name in sides for s in placed[name].slots]
    if len(mine) > MAX_PODS:
        return None
    fit = fit_for(state.shape)
    held = 0
    for ps in gang.pod_sets:
        for s in placed[ps.name].slots:
            if s.node == node:
                held |= fit.mask_of(s.gpus)
    first = tuple(fit.mask_of(s.gpus) for s in mine)
    pool = snap.free_mask(i) & ~held
    for m in first:
        pool |= m

    def score(masks: Sequence[int]) -> tuple[float, int]:
        moved = _moved(mine, masks, fit)
        slots = {
            name: tuple(moved.get((s.pod_set, s.index), s) for s in placed[name].slots) for name in needed
        }
        cost = sum(
            pod_set_micros(
                snap, ps, slots[ps.name], slots[ps.colocate_with.pod_set] if ps.colocate_with else ()
            )
            for ps in touched
        )
        used = 0
        for m in masks:
            used |= m
        return quantize(cost), -fit.coherent_block(pool & ~used)

    # The best answer depends on the node's type, the GPUs it may use and the slots' shapes, not
    # on the node or the first pick: the search's branches share it.
    key = (
        snap.kinds()[i],
        pool,
        tuple((s.pod_set, len(s.gpus), fit.shape.tier_of(m)) for s, m in zip(mine, first, strict=True)),
    )
    best = ctx.tables.pairings.get(key)
    if best is None:
        choices = [[m for m in fit.subsets(n, tier) if m & pool == m] for _, n, tier in key[2]]
        found = min(
            itertools.islice(
                ((score(masks), tuple(masks)) for masks in _assignments(mine, choices)), MAX_TRIES
            ),
            default=None,
        )
        best = ctx.tables.pairings[key] = found if found is not None else (score(first), first)
    (best_score, masks) = best
    if not best_score < score(first):
        return None
    out = _with(placed, i, mine, masks, fit)
    if violations(snap, gang, [s for ps in gang.pod_sets for s in out[ps.name].slots]):
        return None
    return out


def _assignments(mine: Sequence[PodSlot], choices: Sequence[Sequence[int]]) -> Iterator[list[int]]:
    """Disjoint GPU sets, one per slot of ``mine``; pods of one pod set are interchangeable, so
    their sets come in increasing order."""

    def walk(k: int, used: int, chosen: list[int]) -> Iterator[list[int]]:
        if k == len(mine):
            yield list(chosen)
            return
        same = k > 0 and mine[k - 1].pod_set == mine[k].pod_set
        for m in choices[k]:
            if m & used or (same and m <= chosen[-1]):
                continue
            chosen.append(m)
            yield from walk(k + 1, used | m, chosen)
            chosen.pop()

    yield from walk(0, 0, [])


def _moved(mine: Sequence[PodSlot], masks: Sequence[int], fit: NodeFit) -> dict[tuple[str, int], PodSlot]:
    """The slots of ``mine`` on GPU sets ``masks``, by (pod set, index)."""
    out = {}
    for s, m in zip(mine, masks, strict=True):
        gpus, numa, nic = fit.slot_of(m)
        out[(s.pod_set, s.index)] = dataclasses.replace(s, gpus=gpus, numa_nodes=numa, nic=nic)
    return out


def _with(
    placed: Mapping[str, Option], i: int, mine: Sequence[PodSlot], masks: Sequence[int], fit: NodeFit
) -> dict[str, Option]:
    """``placed`` with the slots of ``mine`` (on node ``i``) on GPU sets ``masks``."""
    moved = _moved(mine, masks, fit)
    out = dict(placed)
    for name in {s.pod_set for s in mine}:
        o = placed[name]
        slots = tuple(moved.get((s.pod_set, s.index), s) for s in o.slots)
        union = 0
        for s in slots:
            if (s.pod_set, s.index) in moved:
                union |= fit.mask_of(s.gpus)
        out[name] = dataclasses.replace(o, slots=slots, masks={**o.masks, i: union})
    return out
