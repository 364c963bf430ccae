"""In-node pairing: the GPUs of a KV hand-off's two sides on one node, chosen together.

The search places pod sets one after another, and a pod set's GPUs on a node are picked for
the pod set alone (best fit: a broken PCIe pair first). When a kv-transfer set then lands on
the node of its colocateWith set, the hand-off runs over whatever link joins the two picks:
on a PCIe box with GPU 1 taken, a 1-GPU prefill gets GPU 0 and its decode GPU 2, across
PCIe switches, while GPUs 2 and 3 share one. So once a branch is complete, each node that
holds pods of both sides has those pods' GPUs chosen again, together, from the GPUs they hold
and those the slice leaves free there: the cheapest gang (the judge's communication model,
:func:`~extender.placement.scoring.gang_micros`) wins, then the most coherent remainder; the
first pick stays unless one is strictly better.

Only where gangslice chooses the GPUs: not on device-plugin nodes, nor where the kubelet's
Topology Manager aligns them. A pod keeps its tier or gets a tighter one, so its own rules
hold; the new slice must pass :func:`~extender.placement.scoring.violations` or is dropped.
The work is bounded: at most :data:`MAX_PODS` pods per node and :data:`MAX_TRIES` assignments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

from extender.cost import Comm
from extender.placement.node_fit import NodeFit, fit_for
from extender.placement.scoring import gang_micros, violations
from extender.placement.search.context import Decision
from extender.placement.search.option import Option
from extender.placement.search.rank import quantize
from extender.placement.slice import PodSlot

#: Pods of a pair's two sides on one node beyond which their GPUs are not chosen again.
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
    mine = [s for name in sides for s in placed[name].slots if s.node == node]
    if len(mine) > MAX_PODS:
        return None
    fit = fit_for(state.shape)
    shape = state.shape
    held = 0
    for ps in gang.pod_sets:
        for s in placed[ps.name].slots:
            if s.node == node:
                held |= fit.mask_of(s.gpus)
    ours = 0
    for s in mine:
        ours |= fit.mask_of(s.gpus)
    pool = ours | (snap.free_mask(i) & ~held)
    choices = [
        [m for m in fit.subsets(len(s.gpus), shape.tier_of(fit.mask_of(s.gpus))) if m & pool == m]
        for s in mine
    ]

    def score(masks: Sequence[int]) -> tuple[float, int]:
        slots = _with(placed, i, mine, masks, fit)
        used = 0
        for m in masks:
            used |= m
        total = sum(gang_micros(snap, gang, [s for o in slots.values() for s in o.slots]).values())
        return quantize(total), -fit.coherent_block(pool & ~used)

    first = [fit.mask_of(s.gpus) for s in mine]
    best, best_score = first, score(first)
    for tries, masks in enumerate(_assignments(mine, choices)):
        if tries >= MAX_TRIES:
            break
        got = score(masks)
        if got < best_score:
            best, best_score = masks, got
    if best is first:
        return None
    out = _with(placed, i, mine, best, fit)
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


def _with(
    placed: Mapping[str, Option], i: int, mine: Sequence[PodSlot], masks: Sequence[int], fit: NodeFit
) -> dict[str, Option]:
    """``placed`` with the slots of ``mine`` (on node ``i``) on GPU sets ``masks``."""
    moved: dict[tuple[str, int], PodSlot] = {}
    for s, m in zip(mine, masks, strict=True):
        gpus, numa, nic = fit.slot_of(m)
        moved[(s.pod_set, s.index)] = dataclasses.replace(s, gpus=gpus, numa_nodes=numa, nic=nic)
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
