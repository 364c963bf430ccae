"""Inside one node: which GPU sets a pod may get, how many pods fit, and which sets to take.

Everything here is a pure function of a node *type* (its :class:`NodeShape`) and a free
mask, so it is memoised per node type: a 5,000-node cluster of three node types costs three
small tables, not 5,000 searches.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from extender.topology.model import NodeShape, Tier


@dataclass(eq=False)
class NodeFit:
    """Memo tables for one node type (one object per type: :func:`fit_for`; compared and
    hashed by identity)."""

    shape: NodeShape
    _subsets: dict[tuple[int, Tier], tuple[int, ...]] = field(default_factory=dict)
    _capacity: dict[tuple[int, int, Tier], int] = field(default_factory=dict)
    _pick: dict[tuple[int, int, Tier, int], tuple[int, ...] | None] = field(default_factory=dict)
    _coherent: dict[int, int] = field(default_factory=dict)
    _tightest: dict[int, Tier | None] = field(default_factory=dict)
    _gbps: dict[int, float] = field(default_factory=dict)
    _masks: dict[tuple[int, ...], int] = field(default_factory=dict)
    _slots: dict[int, tuple[tuple[int, ...], tuple[int, ...], str | None]] = field(default_factory=dict)

    def tightest(self, gpus: int) -> Tier | None:
        """The tightest tier this node type offers for a pod of ``gpus`` GPUs: the default rule."""
        if gpus not in self._tightest:
            self._tightest[gpus] = self.shape.tightest_tier(gpus)
        return self._tightest[gpus]

    def best_gbps(self, gpus: int) -> float:
        """The ring bandwidth of the best set of ``gpus`` GPUs of the node type (its tightest
        tier; 0 when it has fewer GPUs)."""
        tier = self.tightest(gpus)
        subsets = self.subsets(gpus, tier) if tier is not None and 0 < gpus <= self.shape.size else ()
        return self.gbps(subsets[0]) if subsets else 0.0

    def gbps(self, mask: int) -> float:
        got = self._gbps.get(mask)
        if got is None:
            got = self._gbps[mask] = self.shape.gbps_of(mask)
        return got

    def mask_of(self, gpus: Sequence[int]) -> int:
        """The mask of a sequence of GPU indices."""
        key = gpus if isinstance(gpus, tuple) else tuple(gpus)
        got = self._masks.get(key)
        if got is None:
            got = self._masks[key] = self.shape.mask_of(key)
        return got

    def slot_of(self, mask: int) -> tuple[tuple[int, ...], tuple[int, ...], str | None]:
        """A pod's GPU indices, NUMA nodes and nearest NIC for a GPU mask."""
        got = self._slots.get(mask)
        if got is None:
            gpus = self.shape.gpus_of(mask)
            nic = self.shape.best_nic.get(gpus[0]) if gpus else None
            got = self._slots[mask] = (gpus, self.shape.numa_of(mask), nic)
        return got

    def subsets(self, gpus: int, tier: Tier) -> tuple[int, ...]:
        """Every set of ``gpus`` GPUs of the node type whose tier is ``tier`` or tighter,
        best first (tighter tier, higher bandwidth, fewer NUMA nodes, lowest positions)."""
        key = (gpus, tier)
        got = self._subsets.get(key)
        if got is None:
            found = []
            for combo in itertools.combinations(range(self.shape.size), gpus):
                mask = sum(1 << i for i in combo)
                t = self.shape.tier_of(mask)
                if t <= tier:
                    found.append((t, -self.gbps(mask), len(self.shape.numa_of(mask)), combo, mask))
            found.sort()
            got = self._subsets[key] = tuple(m for *_, m in found)
        return got

    def capacity(self, free: int, gpus: int, tier: Tier) -> int:
        """How many pods of ``gpus`` GPUs at ``tier`` fit in ``free`` at most (exact)."""
        if gpus <= 0:
            return 0
        key = (free, gpus, tier)
        got = self._capacity.get(key)
        if got is not None:
            return got
        if free.bit_count() < gpus:
            best = 0
        else:
            low = free & -free
            # Either the lowest free GPU stays unused, or it belongs to one of the pods.
            best = self.capacity(free & ~low, gpus, tier)
            for sub in self.subsets(gpus, tier):
                if sub & low and sub & free == sub:
                    best = max(best, 1 + self.capacity(free & ~sub, gpus, tier))
        self._capacity[key] = best
        return best

    def coherent_block(self, free: int) -> int:
        """The largest k such that ``free`` holds k GPUs as tightly as the node type can hold
        any k: the biggest pod the remainder can still serve without loss."""
        got = self._coherent.get(free)
        if got is None:
            got = 0
            for k in range(free.bit_count(), 0, -1):
                tier = self.tightest(k)
                if tier is not None and any(s & free == s for s in self.subsets(k, tier)):
                    got = k
                    break
            self._coherent[free] = got
        return got

    def pick(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
        """GPU sets for ``pods`` pods: each the tightest, fastest set that still leaves room for
        the remaining pods, breaking ties by the largest coherent remainder."""
        key = (free, gpus, tier, pods)
        if key in self._pick:
            return self._pick[key]
        chosen: list[int] = []
        left = free
        for remaining in range(pods, 0, -1):
            best: tuple[tuple[int, float, int, int], int] | None = None
            for sub in self.subsets(gpus, tier):
                if sub & left != sub:
                    continue
                rest = left & ~sub
                if remaining > 1 and self.capacity(rest, gpus, tier) < remaining - 1:
                    continue
                rank = (
                    int(self.shape.tier_of(sub)),
                    -self.gbps(sub),
                    len(self.shape.numa_of(sub)),
                    -self.coherent_block(rest),
                )
                if best is None or rank < best[0]:
                    best = (rank, sub)
            if best is None:
                self._pick[key] = None
                return None
            chosen.append(best[1])
            left &= ~best[1]
        result = tuple(chosen)
        self._pick[key] = result
        return result


_FITS: dict[str, NodeFit] = {}


def fit_for(shape: NodeShape) -> NodeFit:
    fit = _FITS.get(shape.key)
    if fit is None:
        fit = _FITS[shape.key] = NodeFit(shape)
    return fit
