"""The GPUs NVIDIA's device plugin hands out on a node: go-gpuallocator's best-effort policy.

Under the device-plugin model the kubelet, not the scheduler, picks a container's GPUs: it
asks the plugin's ``GetPreferredAllocation`` with the free device ids, the ids it must
include and a count, and never says which pod it is for. NVIDIA's k8s-device-plugin answers
for whole GPUs with ``gpuallocator.NewBestEffortPolicy()`` of go-gpuallocator (v0.6.0 here;
``internal/rm`` ``alignedAlloc``), run on the device list it builds from NVML on every call.
This module computes that answer from a node's :class:`GpuGraph`, so the scheduler can judge
a node by the set the node will actually deliver. It is a re-derivation of the policy's
rules, checked against the Go library itself by ``tests/conformance/test_conformance_gpuallocator.py``.

What the policy sees (:func:`plugin_view`), following go-gpuallocator's ``NewDevices``:

- every ordered pair of GPUs gets one PCIe link from ``nvmlDeviceGetTopologyCommonAncestor``
  and, when some of the first GPU's NVLinks have the second GPU's PCI bus id as their remote
  end, one NVLink entry counting them (``internal/links`` ``GetP2PLink``/``GetNVLink``);
- links into an NVSwitch have the switch as remote end, so on HGX/DGX boards (and GB200
  trays) the policy sees no NVLink at all and ranks pairs by PCIe alone. The graph records
  bonded NVLinks the way ``nvidia-smi`` prints them, switched or not; a GPU whose pairs add
  up to more links than one GPU has (18) must be on a switch, and then every NVLink of the
  node is taken to be switched (``switched=`` overrides the inference);
- where the graph does not know a pair's PCIe level (``nvidia-smi`` prints ``NV#`` instead),
  it is taken as NODE within one NUMA node and SYS across, the level HGX boards report.

How it scores (``besteffort_policy.go``): a pair scores the sum of its links, PCIe SYS 10,
NODE 20, PHB 30, PXB 40, PIX 50 (an on-board pair, NVML INTERNAL, would be 60; the graph
folds it into PIX), plus 100 per NVLink. A set scores the sum over its pairs, a partition
the sum over its sets.

How it chooses (``Allocate``):

1. Nothing (an empty answer) when the count is not positive, exceeds the available GPUs, or
   fewer GPUs are available than must be included.
2. A count of 1 takes the first available GPU that holds every must-include GPU, in the
   order the request lists them.
3. Otherwise the available list, in request order, is padded with empty slots to a multiple
   of the count and every partition into groups of that size is scored. A group holds no
   padding or all of it. Partitions are visited with each group led by the first device not
   yet grouped and its other members in combination order; only partitions with a padding-
   free group holding every must-include GPU count; the first one with the highest score
   wins (later ones must score strictly more).
4. From the winning partition, of the groups holding every must-include GPU, the first with
   the highest set score is the answer. With nothing to include, that may be the padded
   group: the policy then answers fewer real GPUs than asked, and the plugin, reading each
   answer's UUID, meets an empty slot (:attr:`Allocation.padded`). Such a node gives no
   usable preference and is judged as unpredictable.
5. On 13 or more GPUs a partition of 7 or more groups is assembled in a slice whose tail is
   shared with its siblings (Go's ``append`` grows a slice of length 4 to capacity 8, of 8 to
   16, and later siblings write over the tail in place), so the kept partition carries the
   groups of the last partition visited after its fixed prefix. This is modelled, because
   it is what the code does (for such requests :attr:`Allocation.possible` holds the answers
   of the best partitions and the answer for the order given, not every order's answer).

Order matters only among ties, and ties are common (uniform boards): the kubelet sends the
free ids as ``sets.Set.UnsortedList()``, a Go map's order, so the same request can get any
of the tied answers. :attr:`Allocation.gpus` is the answer for the order given (ascending
GPU index by default); :attr:`Allocation.possible` is every answer some order can produce
(the best groups of every best partition), which is what a node must be judged by.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from extender.topology.model import GpuGraph, PcieLevel

__all__ = [
    "MAX_LINKS_PER_GPU",
    "POSSIBLE_LIMIT",
    "Allocation",
    "PluginView",
    "pair_score",
    "plugin_view",
    "preferred_allocation",
]

#: The most NVLinks one GPU has (Hopper, Blackwell); go-nvml's NVLINK_MAX_LINKS, which
#: bounds the links go-gpuallocator scans, is 18 too.
MAX_LINKS_PER_GPU = 18

#: Points of a pair's PCIe link by level, and of each NVLink (``calculateGPUPairScore``).
PCIE_POINTS: Mapping[PcieLevel, int] = {
    PcieLevel.SYS: 10,
    PcieLevel.NODE: 20,
    PcieLevel.PHB: 30,
    PcieLevel.PXB: 40,
    PcieLevel.PIX: 50,
}
NVLINK_POINTS = 100

#: How many tied best partitions :func:`preferred_allocation` looks at for ``possible``.
POSSIBLE_LIMIT = 20_000


@dataclass(frozen=True)
class PluginView:
    """A node's GPUs as go-gpuallocator's ``Device.Links`` describe them.

    ``pcie`` and ``nvlinks`` hold one entry per unordered pair ``(low, high)`` of GPU index;
    ``nvlinks`` counts only NVLinks the policy can see (direct GPU-to-GPU ones).
    """

    gpus: tuple[int, ...]
    pcie: Mapping[tuple[int, int], PcieLevel]
    nvlinks: Mapping[tuple[int, int], int]
    switched: bool = False
    scores: Mapping[tuple[int, int], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        scores = {key: pair_score(level, self.nvlinks.get(key, 0)) for key, level in self.pcie.items()}
        object.__setattr__(self, "scores", scores)

    def pair(self, a: int, b: int) -> tuple[PcieLevel, int]:
        key = (a, b) if a < b else (b, a)
        return self.pcie[key], self.nvlinks.get(key, 0)


def pair_score(pcie: PcieLevel, nvlinks: int) -> int:
    return PCIE_POINTS[pcie] + NVLINK_POINTS * min(nvlinks, MAX_LINKS_PER_GPU)


def plugin_view(graph: GpuGraph, *, switched: bool | None = None) -> PluginView:
    """What the device plugin's allocator sees of ``graph`` (see the module notes)."""
    if switched is None:
        switched = _switched(graph)
    pcie: dict[tuple[int, int], PcieLevel] = {}
    nvlinks: dict[tuple[int, int], int] = {}
    for (a, b), link in graph.links.items():
        level = link.pcie
        if level is None:
            na, nb = graph.gpu(a).numa_node, graph.gpu(b).numa_node
            level = PcieLevel.NODE if na is not None and na == nb else PcieLevel.SYS
        pcie[(a, b)] = level
        if link.nvlinks and not switched:
            nvlinks[(a, b)] = link.nvlinks
    return PluginView(gpus=graph.indices, pcie=pcie, nvlinks=nvlinks, switched=switched)


def _switched(graph: GpuGraph) -> bool:
    per_gpu = {i: 0 for i in graph.indices}
    for (a, b), link in graph.links.items():
        per_gpu[a] += link.nvlinks
        per_gpu[b] += link.nvlinks
    return any(n > MAX_LINKS_PER_GPU for n in per_gpu.values())


@dataclass(frozen=True)
class Allocation:
    """The plugin's preferred allocation for one request.

    ``gpus``: the GPUs answered for the order given, () for an empty answer. ``padded``: the
    answer is the padded group, so it holds fewer GPUs than asked and the plugin cannot turn
    it into device ids. ``possible``: every answer some order of the same free GPUs produces;
    ``exhaustive`` is False when there were more than :data:`POSSIBLE_LIMIT` best partitions
    (uniform boards of 16 GPUs) and only the first of them were looked at.
    """

    gpus: tuple[int, ...]
    possible: frozenset[frozenset[int]]
    padded: bool = False
    exhaustive: bool = True

    @property
    def certain(self) -> bool:
        """True when every order of the request gets the same, usable answer."""
        return not self.padded and self.exhaustive and len(self.possible) == 1


_PAD = -1  # a padding slot's position value in a group (never a GPU index)


def preferred_allocation(
    view: PluginView,
    available: Iterable[int],
    size: int,
    required: Iterable[int] = (),
    *,
    order: Sequence[int] | None = None,
) -> Allocation:
    """The best-effort policy's answer for ``size`` GPUs out of ``available``.

    ``order`` is the order the request lists the available GPUs in (ascending index when
    not given); it decides only among ties.
    """
    free = sorted(set(available))
    listed = list(order) if order is not None else free
    if sorted(listed) != free:
        raise ValueError(f"order {listed} is not an ordering of the available GPUs {free}")
    must = frozenset(required)
    if size <= 0 or len(free) < size or len(must) > size or len(must) > len(free):
        return Allocation(gpus=(), possible=frozenset({frozenset()}))
    if size == 1:
        hits = [g for g in listed if must <= {g}]
        if not hits:
            return Allocation(gpus=(), possible=frozenset({frozenset()}))
        return Allocation(gpus=(hits[0],), possible=frozenset(frozenset({g}) for g in hits))
    search = _Search(view.scores, tuple(listed), size, must)
    gpus, padded = search.answer()
    possible, exhaustive = search.possible()
    return Allocation(gpus=gpus, possible=possible | {frozenset(gpus)}, padded=padded, exhaustive=exhaustive)


class _Search:
    """The partition search of one request over positions 0..m-1 (the padded list)."""

    def __init__(
        self, scores: Mapping[tuple[int, int], int], listed: tuple[int, ...], size: int, must: frozenset[int]
    ):
        self.scores = scores
        self.size = size
        self.must = must
        padding = (-len(listed)) % size
        self.padding = padding
        self.slots: tuple[int, ...] = listed + (_PAD,) * padding
        self.full = (1 << len(self.slots)) - 1
        self._best: dict[tuple[int, bool], tuple[int, tuple[int, ...]] | None] = {}
        self._group_score: dict[int, int] = {}
        # Every best partition is walked again by possible(): the groups of a mask and the
        # GPUs of a group are asked for over and over, so each is worked out once.
        self._gpus: dict[int, tuple[int, ...]] = {}
        self._choices: dict[int, tuple[int, ...]] = {}

    # --- groups ---------------------------------------------------------------------

    def members(self, group: int) -> tuple[int, ...]:
        return tuple(self.slots[p] for p in range(len(self.slots)) if group >> p & 1)

    def gpus(self, group: int) -> tuple[int, ...]:
        got = self._gpus.get(group)
        if got is None:
            got = self._gpus[group] = tuple(g for g in self.members(group) if g != _PAD)
        return got

    def group_score(self, group: int) -> int:
        got = self._group_score.get(group)
        if got is None:
            real = self.gpus(group)
            got = sum(self.scores[(a, b) if a < b else (b, a)] for a, b in itertools.combinations(real, 2))
            self._group_score[group] = got
        return got

    def holds_must(self, group: int) -> bool:
        return self.must <= set(self.gpus(group))

    def choices(self, mask: int) -> tuple[int, ...]:
        """The groups the search tries first from ``mask``, in its order."""
        got = self._choices.get(mask)
        if got is None:
            got = self._choices[mask] = tuple(self._groups_from(mask))
        return got

    def _groups_from(self, mask: int) -> Iterable[int]:
        positions = [p for p in range(len(self.slots)) if mask >> p & 1]
        lead, rest = positions[0], positions[1:]
        if len(positions) == self.size:
            yield mask
            return
        pad = [int(slot == _PAD) for slot in self.slots]
        for combo in itertools.combinations(rest, self.size - 1):
            group = 1 << lead
            pads = pad[lead]
            for p in combo:
                group |= 1 << p
                pads += pad[p]
            if pads in (0, self.padding):
                yield group

    def qualifies(self, group: int) -> bool:
        return self.holds_must(group) and len(self.gpus(group)) == self.size

    # --- the best partition -----------------------------------------------------------

    def best(self, mask: int, need: bool) -> tuple[int, tuple[int, ...]] | None:
        """Highest score completing ``mask`` (and the first groups reaching it), or None."""
        key = (mask, need)
        if key in self._best:
            return self._best[key]
        result: tuple[int, tuple[int, ...]] | None
        if mask == 0:
            result = None if need else (0, ())
        else:
            result = None
            for group in self.choices(mask):
                rest = self.best(mask & ~group, need and not self.qualifies(group))
                if rest is None:
                    continue
                total = self.group_score(group) + rest[0]
                if result is None or total > result[0]:
                    result = (total, (group, *rest[1]))
        self._best[key] = result
        return result

    def answer(self) -> tuple[tuple[int, ...], bool]:
        found = self.best(self.full, True)
        if found is None:
            return (), False
        groups = _shared_tail(found[1], self)
        return self.pick(groups)

    def pick(self, groups: Sequence[int]) -> tuple[tuple[int, ...], bool]:
        chosen: int | None = None
        for group in groups:
            if not self.holds_must(group):
                continue
            if chosen is None or self.group_score(group) > self.group_score(chosen):
                chosen = group
        if chosen is None:
            return (), False
        return self.gpus(chosen), _PAD in self.members(chosen)

    # --- every order ------------------------------------------------------------------

    def possible(self) -> tuple[frozenset[frozenset[int]], bool]:
        """The answers of every best partition, and whether all of them were looked at."""
        top = self.best(self.full, True)
        if top is None:
            return frozenset({frozenset()}), True
        out: set[frozenset[int]] = set()
        for seen, groups in enumerate(self.optimal(self.full, True, top[0])):
            if seen == POSSIBLE_LIMIT:
                return frozenset(out), False
            real = [g for g in groups if self.holds_must(g)]
            high = max(self.group_score(g) for g in real)
            out.update(frozenset(self.gpus(g)) for g in real if self.group_score(g) == high)
        return frozenset(out), True

    def optimal(self, mask: int, need: bool, target: int) -> Iterable[tuple[int, ...]]:
        """Every partition of ``mask`` (as groups) scoring ``target``, the best possible."""
        if mask == 0:
            if not need and target == 0:
                yield ()
            return
        for group in self.choices(mask):
            next_need = need and not self.qualifies(group)
            rest = self.best(mask & ~group, next_need)
            if rest is None or self.group_score(group) + rest[0] != target:
                continue
            for tail in self.optimal(mask & ~group, next_need, rest[0]):
                yield (group, *tail)


def _shared_tail(groups: tuple[int, ...], search: _Search) -> tuple[int, ...]:
    """The partition as go-gpuallocator keeps it: its tail overwritten by the last sibling.

    The accumulated slice of groups gets a fresh backing array when an append finds it full,
    at lengths 0, 1, 2, 4, 8, 16, ... (capacity doubles; the size classes of a 24-byte slice
    header keep those capacities). Groups after the last fresh array share it with every
    partition that has the same groups up to that array's first element, and the last such
    partition visited writes them last.
    """
    k = len(groups)
    fresh = 0
    step = 1
    while step <= k - 1:
        fresh = step
        step *= 2
    if k - 1 - fresh < 2:  # one shared group is fixed by the rest: nothing to overwrite
        return groups
    prefix = groups[: fresh + 1]
    mask = search.full
    for g in prefix:
        mask &= ~g
    return prefix + _last_partition(mask, search)


def _last_partition(mask: int, search: _Search) -> tuple[int, ...]:
    out: list[int] = []
    while mask:
        *_, last = search.choices(mask)
        out.append(last)
        mask &= ~last
    return tuple(out)
