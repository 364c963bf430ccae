"""Finish: one placement per pod set becomes the gang's slice, with its rank.

The GPUs of a KV hand-off's two sides on one node are first chosen together
(:mod:`~extender.placement.search.pairing`); then the pod sets' costs are recomputed together
(as :func:`~extender.placement.scoring.gang_micros`: each pod set on its slots, with its
colocateWith set's), every colocation the slice misses
gets a note (one placed before its colocateWith set was not judged against it, and one judged
against a set spread over several domains may sit next to some of its pods only), and the
slice is ranked by :class:`~extender.placement.search.rank.SliceRank` so the search keeps the
best over every pod set order and beam branch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from extender.placement import hardware
from extender.placement.scoring import colocation_misses, fabric_waste, mnnvl_nodes
from extender.placement.search.context import Decision
from extender.placement.search.option import Option
from extender.placement.search.pairing import pair_in_nodes
from extender.placement.search.rank import COLOCATE, SliceRank, micros, slice_rank, speeds
from extender.placement.slice import Slice


@dataclass(frozen=True)
class Finished:
    """A complete slice and how it ranks."""

    rank: SliceRank
    slice: Slice


def finish(ctx: Decision, placed: Mapping[str, Option]) -> Finished:
    """The slice of ``placed`` (an option for every pod set of the gang)."""
    snap, gang = ctx.snap, ctx.gang
    placed = pair_in_nodes(ctx, placed)
    slots = [s for ps in gang.pod_sets for s in placed[ps.name].slots]
    cost = {
        ps.name: micros(
            ctx, ps, placed[ps.name].slots, placed[ps.colocate_with.pod_set].slots if ps.colocate_with else ()
        )
        for ps in gang.pod_sets
    }
    notes = [n for ps in gang.pod_sets for n in placed[ps.name].notes]
    misses = colocation_misses(snap, gang, slots)
    for name, why in misses.items():
        if COLOCATE not in placed[name].misses:
            notes.append(f"pod set {name}: {why}; placed within {placed[name].where}")
    sl = Slice(
        gang=gang.name,
        slots=tuple(slots),
        pod_set_micros=cost,
        score=round(sum(cost.values()), 3),
        domains={ps.name: placed[ps.name].where for ps in gang.pod_sets},
        notes=tuple(notes),
        mnnvl_nodes=mnnvl_nodes(snap, gang, slots),
    )
    waste = fabric_waste(snap, gang, slots)
    loss = hardware.gang_loss(snap, gang, slots, lambda ps: speeds(ctx, ps))
    return Finished(slice_rank(waste, len(misses), loss, sl.per_layer_micros, len(notes)), sl)
