"""Per-pod decisions over the cluster cache, shared by the kube-scheduler and Volcano routes.

Who a pod is (in this order): a pod annotated ``gangslice.io/reservation: <name>`` holds a
slot of that SliceReservation (Kueue path); a pod labelled ``gangslice.io/gang`` belongs to
gang ``<namespace>/<gang>``; a Volcano task belongs to its job's gang ``<namespace>/<podgroup>``.

- A gang pod with a reservation passes only on nodes where the reservation has a free slot
  of its pod set (``gangslice.io/pod-set`` if set), or on the node of the slot it holds.
- A plain gang pod (``gangslice.io/gang`` + ``gangslice.io/gang-size``) without one makes
  the extender place and reserve the whole gang, then is filtered to its slots.
- A GPU pod outside any gang passes where the free GPUs (after reservations) hold a set
  meeting the in-node rule, as the node hands them out (the device plugin's answer on a
  device-plugin node) and its kubelet's Topology Manager admits them (the same rules the
  solver holds gang pods to); nodes whose type can never hold one are unresolvable.
- A pod without GPUs passes everywhere.

Everything here is synchronous and must run under the book's lock
(:meth:`extender.reservations.book.ReservationBook.deciding`).
"""

from __future__ import annotations

import enum
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from extender.httpapi.memo import NamesKey, NamesMemo
from extender.httpapi.wire import MAX_EXTENDER_PRIORITY
from extender.kube.gangs import DEFAULT_POD_SET
from extender.kube.names import SLOT
from extender.kube.pods import PodError, PodInfo
from extender.placement import choice, hardware, numa_fit
from extender.placement.hardware import Worth
from extender.placement.node_fit import fit_for
from extender.placement.numa_fit import GpuFit
from extender.placement.request import PodSet
from extender.placement.scoring import LevelError, pod_set_micros, resolve_need
from extender.placement.slice import PodSlot, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.reservations import ClusterCache, ReservationRef
from extender.reservations.book import BindPlan, GangRef, Refused, free_slots, outside_slice
from extender.reservations.reserve import Claim, reserve
from extender.topology.gpus import GpuSpec
from extender.topology.model import NodeShape, Tier


class Code(enum.Enum):
    FIT = 0
    UNSCHEDULABLE = 1
    UNRESOLVABLE = 2


@dataclass(frozen=True, slots=True)
class Verdict:
    code: Code
    reason: str = ""


#: The one fitting verdict (compared by identity on the hot path).
PASS = Verdict(Code.FIT)
#: A node's raw score for a pod: (hardware loss, predicted microseconds, fragmentation), None
#: if it does not fit.
Raw = tuple[float, float, float] | None
#: Per-node tables kept (one per GPU count and level asked about) before all are dropped.
MAX_RULES = 64
MAX_RAW_VALUES = 100_000
UNKNOWN_NODE = Verdict(Code.UNSCHEDULABLE, "node is not known to gangslice (no GPUs seen, or not ready)")


@dataclass
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    #: Metric label: fit, no-fit, reserved, unplaceable, waiting, invalid (and unsaved,
    #: set by the routes: see :func:`extender.httpapi.nodelist.saved`).
    outcome: str
    #: Encoded replies of this outcome by wire form, filled by the routes: a remembered
    #: outcome (see :mod:`extender.httpapi.memo`) is then answered without encoding again.
    replies: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    #: The gang this filter reserved a slice for (its reservation is to be saved before
    #: the reply says so).
    reserved: str | None = field(default=None, compare=False)


@dataclass
class Scores:
    """Prioritize's answer: one score 0-10 per node name asked about, in the same order."""

    values: list[int]
    #: Encoded replies by wire form, as :attr:`FilterOutcome.replies`.
    replies: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def zeros(cls, n: int) -> Scores:
        return cls([0] * n)


class Decider:
    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        #: The cache version the memo tables below describe.
        self._memo_version: int | None = None
        self._fit: dict[tuple[numa_fit.RuleKey, Tier | None], dict[str, Verdict]] = {}
        #: Per rule, node -> index into ``_raw_values`` (equal raw scores share one index,
        #: so a request's scores are normalised over the few distinct values).
        self._raw: dict[tuple[numa_fit.RuleKey, Tier | None, Tier | None, Worth], dict[str, int]] = {}
        self._raw_values: list[Raw] = []
        self._raw_ids: dict[Raw, int] = {}
        self._micros: dict[tuple[str, int, int], float] = {}
        #: Whole answers per (rule, node list), for the same list sent again and again.
        self._filtered: NamesMemo[FilterOutcome] = NamesMemo()
        self._scored: NamesMemo[Scores] = NamesMemo()

    # -- who the pod is ------------------------------------------------------------------
    def gang_of(self, pod: PodInfo, job: str | None = None) -> GangRef | None:
        """The pod's gang, or None for a pod in no gang. Raises PodError for bad annotations."""
        return self.cache.book.gang_of(pod, job)

    # -- filter --------------------------------------------------------------------------
    def filter(self, pod: PodInfo, names: Sequence[str], job: str | None = None) -> FilterOutcome:
        try:
            ref = self.gang_of(pod, job)
        except PodError as exc:
            return _all(names, Code.UNRESOLVABLE, str(exc), "invalid")
        outcome = "fit"
        if ref is not None:
            r = self.cache.book.reservation(ref.key)
            if r is not None and pod.gpus > 0 and r.slot_of(pod.name) is None:
                try:
                    if self.cache.book.heal(pod):
                        # Every slot was lost with its node: the gang is placed afresh.
                        ref = self.gang_of(pod, job)
                        assert ref is not None
                except PodError as exc:
                    return _all(names, Code.UNRESOLVABLE, str(exc), "invalid")
                r = self.cache.book.reservation(ref.key)
            if r is None and ref.request is not None and pod.gpus > 0:
                try:
                    placed = reserve(self.cache.book, ref.request, Claim(ref.key))
                except LevelError as exc:
                    return _all(names, Code.UNRESOLVABLE, f"gang {ref.key}: {exc}", "invalid")
                if isinstance(placed, Unplaceable):
                    code = Code.UNSCHEDULABLE if placed.feasible_when_empty else Code.UNRESOLVABLE
                    return _all(names, code, f"gang {ref.key}: {placed.reason}", "unplaceable")
                r = self.cache.book.reservation(ref.key)
                ref.reservation_label = (
                    self.cache.book.ref_of(r).label if r else ReservationRef.parse(ref.key, None).label
                )
                outcome = "reserved"
            if (
                r is not None
                and pod.gpus > 0
                and r.slot_of(pod.name) is None
                and (not free_slots(r, pod) or self.cache.book.lacks_pod_set(pod))
            ):
                try:
                    grown = self.cache.book.grow(pod)
                except (PodError, LevelError) as exc:
                    return _all(names, Code.UNRESOLVABLE, str(exc), "invalid")
                if isinstance(grown, Unplaceable):
                    return _all(
                        names, Code.UNSCHEDULABLE, f"{ref.reservation_label}: {grown.reason}", "unplaceable"
                    )
                if grown is not None:
                    r, outcome = grown, "reserved"
            try:
                if r is not None and outside_slice(ref.reservation_label, r, pod):
                    return FilterOutcome(list(names), {}, {}, outcome, reserved=ref.key if r else None)
            except Refused as exc:
                return _all(names, Code.UNRESOLVABLE, str(exc), "invalid")
            if r is not None:
                nodes, reason = self._slot_nodes(pod, ref)
                if outcome == "reserved":
                    got = self._slot_split(names, nodes, reason)
                    if got.outcome == "fit":
                        got.outcome = outcome
                    got.reserved = ref.key
                    return got
                # The answer is a function of the slot nodes and the reason alone.
                key = NamesKey(names)
                rule = ("slots", frozenset(nodes), reason)
                version = self.cache.version
                memo = self._filtered.get(version, rule, key)
                if memo is None:
                    got = self._slot_split(key.names, nodes, reason, offered_only=True)
                    memo = self._filtered.put(version, rule, key, got)
                return memo
            if pod.gpus > 0:
                return _all(names, Code.UNSCHEDULABLE, ref.waiting, "waiting")
        if pod.gpus <= 0:
            return FilterOutcome(list(names), {}, {}, "fit")
        try:
            tier = self._required_tier(pod)
        except LevelError as exc:
            return _all(names, Code.UNRESOLVABLE, f"pod {pod.key}: {exc}", "invalid")
        view = self._fresh()
        ps = self._pod_set(pod)
        shape = numa_fit.rule_key(ps)
        table = self._fit.setdefault((shape, tier), {})
        # After _fresh: the version its verdicts describe.
        version = self.cache.version
        key = NamesKey(names)
        remembered = self._filtered.get(version, ("fit", shape, tier), key)
        if remembered is not None:
            return remembered
        try:
            verdicts = lookup(table, key.names)
        except KeyError:
            for n in key.names:
                if n not in table:
                    self._node_verdict(view, n, ps, tier, table)
            verdicts = lookup(table, key.names)
        return self._filtered.put(version, ("fit", shape, tier), key, _split(key.names, verdicts))

    def _slot_split(
        self, names: Sequence[str], nodes: set[str], reason: str, offered_only: bool = False
    ) -> FilterOutcome:
        """What _split gives for PASS on ``nodes`` and ``reason`` elsewhere, in C-level passes.
        ``offered_only``: when a slot node is offered, no other node is listed with the reason.
        kube-scheduler reads FailedNodes only to explain a pod that no node fits, and on a
        large cluster they were nearly all of a gang member's reply, decoded in its one
        scheduling loop."""
        passed = list(filter(nodes.__contains__, names))
        if passed and offered_only:
            return FilterOutcome(passed, {}, {}, "fit")
        failed = dict.fromkeys(names, reason)
        for n in passed:
            failed.pop(n, None)
        return FilterOutcome(passed, failed, {}, "fit" if passed else "no-fit")

    def _slot_nodes(self, pod: PodInfo, ref: GangRef) -> tuple[set[str], str]:
        r = self.cache.book.reservation(ref.key)
        assert r is not None
        label = ref.reservation_label
        mine = r.slot_of(pod.name)
        if mine is not None:
            return {mine.node}, f"{label}: pod {pod.name} holds slot {mine.key} on {mine.node}"
        free = free_slots(r, pod)
        given = next((s for s in free if s.key == pod.annotations.get(SLOT)), None)
        if given is not None:
            # Handed out at its admission (its claims name that node's devices or channel).
            return {given.node}, f"{label}: pod {pod.name} was given slot {given.key} on {given.node}"
        which = f" for pod set {pod.pod_set}" if pod.pod_set else ""
        if not free:
            bound = f"{len(r.bound)}/{len(r.slice.slots)} bound"
            sizes = self.cache.owners.sizes(pod.gang) if pod.gang is not None else None
            size = sizes.get(pod.pod_set or DEFAULT_POD_SET) if sizes is not None else None
            if size is not None:
                # An owned pod set at its owners' limit: the pod waits for one of it to leave.
                bound += (
                    f"; its owners let {size.limit} pods of it hold slots at once: waiting for one to leave"
                )
            return set(), f"{label}: no free slot{which} ({bound})"
        return {s.node for s in free}, f"{label}: no free slot{which} on this node"

    # -- the in-node rule for pods outside gangs -----------------------------------------
    def _required_tier(self, pod: PodInfo) -> Tier | None:
        need = resolve_need(self._pod_set(pod), self.cache.hierarchy)
        return need.tier

    def _pod_set(self, pod: PodInfo) -> PodSet:
        return pod.alone()

    def _fresh(self) -> ClusterSnapshot:
        """The current view, with the memo tables brought up to date: entries of nodes that
        changed are dropped (recomputed on demand); everything when too much changed."""
        view = self.cache.book.view()
        version = self.cache.version
        if len(self._fit) + len(self._raw) > MAX_RULES or len(self._raw_values) > MAX_RAW_VALUES:
            self._memo_version = None  # one table per pod rule asked about: bounded all the same
        if version != self._memo_version:
            changed = self.cache.changes_since(self._memo_version) if self._memo_version is not None else None
            if changed is None or len(changed) > len(view.nodes) // 4:
                self._fit.clear()
                self._raw.clear()
                self._raw_values.clear()
                self._raw_ids.clear()
            else:
                for verdicts in self._fit.values():
                    for node in changed:
                        verdicts.pop(node, None)
                for raws in self._raw.values():
                    for node in changed:
                        raws.pop(node, None)
            self._memo_version = version
        return view

    def _node_verdict(
        self, view: ClusterSnapshot, name: str, ps: PodSet, tier: Tier | None, table: dict[str, Verdict]
    ) -> Verdict:
        if not view.has_node(name):
            problem = self.cache.node_problem(name)
            table[name] = UNKNOWN_NODE if problem is None else Verdict(Code.UNSCHEDULABLE, problem)
            return table[name]
        i = view.index(name)
        node = view.nodes[i]
        shape = node.shape
        gpus = ps.gpus_per_pod
        rule = _rule(shape, gpus, tier)
        free = view.free_mask(i)
        if rule is None:
            v = Verdict(Code.UNRESOLVABLE, f"node type has {shape.size} GPUs; the pod needs {gpus}")
        elif fit_for(shape).capacity(shape.full_mask, gpus, rule) == 0:
            v = Verdict(Code.UNRESOLVABLE, f"no {gpus} GPUs of this node type are {_words(rule)}")
        elif choice.capacity(node, shape.full_mask, gpus, rule) == 0:
            why = choice.reason(node, shape.full_mask, gpus, rule, 1)
            v = Verdict(Code.UNRESOLVABLE, why or f"the device plugin gives no {_words(rule)} set of {gpus}")
        elif (empty := _emptied(node)) is not None and _on_node(empty, ps).capacity(
            shape.full_mask, gpus, rule
        ) == 0:
            # Not even on the empty node does the kubelet's Topology Manager admit the pod.
            why = (
                numa_fit.refusal(empty, ps, shape.full_mask, rule)
                or f"the kubelet admits no {gpus} GPUs here"
            )
            v = Verdict(Code.UNRESOLVABLE, why)
        elif _on_node(node, ps).capacity(free, gpus, rule) == 0:
            # What is left is the node's free GPUs (and, where its kubelet aligns pods, its
            # free CPUs and memory): evicting pods can change either, so not unresolvable.
            why = numa_fit.refusal(node, ps, free, rule) or choice.reason(node, free, gpus, rule, 1)
            left = free.bit_count()
            v = Verdict(
                Code.UNSCHEDULABLE,
                why or f"{left} free GPUs (after reservations) hold no {_words(rule)} set of {gpus}",
            )
        else:
            v = PASS
        table[name] = v
        return v

    # -- prioritize ----------------------------------------------------------------------
    def prioritize(self, pod: PodInfo, names: Sequence[str], job: str | None = None) -> Scores:
        """Scores 0-10, one per name: a gang pod gets 10 on nodes of its slots; a GPU pod
        outside gangs gets 10 on the best-fit node (see :meth:`_raw_score`); anything else 0."""
        try:
            ref = self.gang_of(pod, job)
        except PodError:
            return Scores.zeros(len(names))
        if ref is not None:
            if self.cache.book.reservation(ref.key) is None:
                return Scores.zeros(len(names))
            nodes, _ = self._slot_nodes(pod, ref)
            key = NamesKey(names)
            rule: tuple[object, ...] = ("slots", frozenset(nodes))
            version = self.cache.version
            got = self._scored.get(version, rule, key)
            if got is None:
                values = [MAX_EXTENDER_PRIORITY if n in nodes else 0 for n in key.names]
                got = self._scored.put(version, rule, key, Scores(values))
            return got
        if pod.gpus <= 0:
            return Scores.zeros(len(names))
        ps = self._pod_set(pod)
        try:
            need = resolve_need(ps, self.cache.hierarchy)
        except LevelError:
            return Scores.zeros(len(names))
        view = self.cache.waiting.view(self._fresh(), self.cache.clock())
        worth = view.worth
        version = self.cache.version
        key = NamesKey(names)
        shape = numa_fit.rule_key(ps)
        rule = ("score", shape, need.tier, need.preferred_tier, worth)
        got = self._scored.get(version, rule, key)
        if got is not None:
            return got
        table = self._raw.setdefault((shape, need.tier, need.preferred_tier, worth), {})
        try:
            ids = lookup(table, key.names)
        except KeyError:
            own = (hardware.speeds(view, ps), hardware.node_models(view))
            for n in key.names:
                if n not in table:
                    self._raw_score(view, n, ps, own, need.tier, need.preferred_tier, table)
            ids = lookup(table, key.names)
        distinct = list(set(ids))
        scores = normalise([self._raw_values[i] for i in distinct])
        return self._scored.put(
            version, rule, key, Scores(list(map(dict(zip(distinct, scores, strict=True)).__getitem__, ids)))
        )

    def _raw_score(
        self,
        view: ClusterSnapshot,
        name: str,
        ps: PodSet,
        own: tuple[Mapping[str, float] | None, Sequence[GpuSpec | None]],
        tier: Tier | None,
        preferred: Tier | None,
        table: dict[str, int],
    ) -> Raw:
        """(hardware loss, predicted per-layer microseconds of the best GPU set,
        fragmentation) or None when the pod does not fit. The hardware loss is the solver's
        (:func:`~extender.placement.hardware.node_loss`: what the node's GPUs are worth to the
        gangs asked for less the pod's speed there). Fragmentation = 2 x GPUs stranded
        outside the largest coherent block left + GPUs left free, both as fractions of the
        node: best fit leaves the node full, or leaves a block a later pod can use whole.
        ``own``: the pod's speeds and every node's GPU model, looked up once per request."""
        got: Raw = None
        if view.has_node(name):
            i = view.index(name)
            shape = view.nodes[i].shape
            gpus = ps.gpus_per_pod
            rule = _rule(shape, gpus, tier)
            free = view.free_mask(i)
            picked = _on_node(view.nodes[i], ps).pick(free, gpus, rule, 1) if rule is not None else None
            if picked:
                sub = picked[0]
                rest = free & ~sub
                micros = self._set_micros(view, name, shape, sub, gpus)
                if preferred is not None and shape.tier_of(sub) > preferred:
                    micros *= 1.5
                left = rest.bit_count()
                stranded = left - fit_for(shape).coherent_block(rest)
                speeds, models = own
                loss = hardware.node_loss(view, i, gpus, speeds, models[i])
                got = (round(loss, hardware.LOSS_DIGITS), micros, (2 * stranded + left) / shape.size)
        ident = self._raw_ids.get(got)
        if ident is None:
            ident = self._raw_ids[got] = len(self._raw_values)
            self._raw_values.append(got)
        table[name] = ident
        return got

    def _set_micros(self, view: ClusterSnapshot, node: str, shape: NodeShape, sub: int, gpus: int) -> float:
        key = (shape.key, sub, gpus)
        got = self._micros.get(key)
        if got is None:
            slot = PodSlot("pod", 0, node, shape.gpus_of(sub))
            got = self._micros[key] = pod_set_micros(view, PodSet("pod", 1, gpus), [slot])
        return got

    # -- bind ----------------------------------------------------------------------------
    def plan_bind(self, pod: PodInfo, node: str) -> BindPlan:
        """The book's Reserve without its lock (:meth:`ReservationBook.plan_bind`), this
        decider picking the GPUs of a pod in no gang. Raises :class:`Refused`."""
        return self.cache.book.plan_bind(pod, node, self.plan_gpus)

    def plan_gpus(self, pod: PodInfo, node: str) -> BindPlan:
        """The GPUs of a pod in no gang on ``node``. Raises :class:`Refused`."""
        if pod.node == node and pod.assigned_gpus:
            # A retried bind of a pod already recorded on this node: the same GPUs again.
            view = self._fresh()
            if view.has_node(node):
                shape = view.node(node).shape
                known = [g for g in pod.assigned_gpus if g in shape.indices]
                return BindPlan(pod, node, tuple(known), shape.numa_of(shape.mask_of(known)))
        try:
            tier = self._required_tier(pod)
        except LevelError as exc:
            raise Refused(f"pod {pod.key}: {exc}") from None
        view = self._fresh()
        if not view.has_node(node):
            raise Refused(f"node {node} is not known to gangslice")
        i = view.index(node)
        shape = view.nodes[i].shape
        rule = _rule(shape, pod.gpus, tier)
        free = view.free_mask(i)
        on_node = _on_node(view.nodes[i], self._pod_set(pod))
        picked = on_node.pick(free, pod.gpus, rule, 1) if rule is not None else None
        if not picked:
            raise Refused(f"node {node} no longer has {pod.gpus} free GPUs meeting the pod's rule")
        return BindPlan(pod, node, shape.gpus_of(picked[0]), shape.numa_of(picked[0]))

    # -- preempt -------------------------------------------------------------------------
    def preempt(self, pod: PodInfo, victims: Mapping[str, Sequence[tuple[str, PodInfo | None]]]) -> list[str]:
        """The nodes (of ``victims``) where removing the given victims lets the pod fit;
        victims are never added. Returns the node names to keep."""
        try:
            ref = self.gang_of(pod)
        except PodError:
            return []
        if pod.gpus <= 0:
            return list(victims)
        if ref is not None:
            if self.cache.book.reservation(ref.key) is None:
                return list(victims)
            nodes, _ = self._slot_nodes(pod, ref)
            return [n for n in victims if n in nodes]
        try:
            tier = self._required_tier(pod)
        except LevelError:
            return []
        view = self._fresh()
        ps = self._pod_set(pod)
        held = self.cache.book.ledger.held()
        keep = []
        for node, pods in victims.items():
            if not view.has_node(node):
                continue
            i = view.index(node)
            shape = view.nodes[i].shape
            freed: set[int] = set()
            for uid, info in pods:
                known = self.cache.pod_by_uid(uid) if uid else None
                if known is not None and known.node == node:
                    freed |= self.cache.gpus_of(known.key)
                elif info is not None and info.assigned_gpus:
                    freed |= set(info.assigned_gpus)
            freed -= held.get(node, frozenset())
            freed &= set(shape.indices)
            free = view.free_mask(i) | shape.mask_of(freed)
            rule = _rule(shape, pod.gpus, tier)
            if rule is not None and _on_node(view.nodes[i], ps).capacity(free, pod.gpus, rule) > 0:
                keep.append(node)
        return keep

    # -- Volcano allocate / deallocate ---------------------------------------------------
    def allocate(self, pod: PodInfo, node: str, job: str | None) -> None:
        """Volcano allocated a task in its session: take the matching slot. Raises Refused."""
        self.cache.book.allocate(pod, node, job)

    def deallocate(self, pod: PodInfo, job: str | None) -> None:
        self.cache.book.deallocate(pod, job)


def unsaved(out: FilterOutcome, why: str) -> FilterOutcome:
    """The outcome of a filter whose reservation could not be saved (nothing is held now):
    every node unschedulable with the reason."""
    reason = f"gang {out.reserved}: the reservation could not be saved ({why}); nothing is held, will retry"
    names = [*out.passed, *out.failed, *out.unresolvable]
    return FilterOutcome([], dict.fromkeys(names, reason), {}, "unsaved")


def normalise(raws: Sequence[Raw]) -> list[int]:
    """Raw (hardware loss, microseconds, fragmentation) to 0-10 by rank: nodes that do not
    fit get 0; the others are ordered by hardware loss, then by ``badness = 10 x (micros /
    best micros - 1) + fragmentation`` (cost first, fit second) and the best gets 10, the next
    distinct rank 9, and so on down to 1. Ranks, not a linear scale, so a small fit
    difference is not flattened by a node type that is much slower."""
    distinct = {r for r in raws if r is not None}
    if not distinct:
        return [0] * len(raws)
    best_micros = min(r[1] for r in distinct) or 1.0
    bad = {r: (r[0], round(10 * (r[1] / best_micros - 1) + r[2], 9)) for r in distinct}
    rank = {b: i for i, b in enumerate(sorted(set(bad.values())))}
    score: dict[Raw, int] = {None: 0}
    for r, b in bad.items():
        score[r] = max(1, MAX_EXTENDER_PRIORITY - rank[b])
    return [score[r] for r in raws]


T = TypeVar("T")


def lookup(table: Mapping[str, T], names: Sequence[str]) -> list[T]:
    """``[table[n] for n in names]`` in one C call (5,000 names are the common case);
    KeyError when a name is missing."""
    if len(names) > 1:
        return list(operator.itemgetter(*names)(table))
    return [table[n] for n in names]


def _split(names: Sequence[str], verdicts: Sequence[Verdict]) -> FilterOutcome:
    # Bulk C-level passes (map/compress) rather than per-node Python: this runs per request.
    fits = list(map(operator.is_, verdicts, itertools.repeat(PASS)))
    passed = list(itertools.compress(names, fits))
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if len(passed) < len(verdicts):
        unresolved = Code.UNRESOLVABLE
        rejected = list(itertools.compress(zip(names, verdicts, strict=True), map(operator.not_, fits)))
        unresolvable = {n: v.reason for n, v in rejected if v.code is unresolved}
        failed = {n: v.reason for n, v in rejected if v.code is not unresolved}
    return FilterOutcome(passed, failed, unresolvable, "fit" if passed else "no-fit")


def _all(names: Iterable[str], code: Code, reason: str, outcome: str) -> FilterOutcome:
    target: dict[str, str] = dict.fromkeys(names, reason)
    if code is Code.UNRESOLVABLE:
        return FilterOutcome([], {}, target, outcome)
    return FilterOutcome([], target, {}, outcome)


def _on_node(node: NodeState, ps: PodSet) -> GpuFit:
    """The GPU sets ``node`` hands a pod of ``ps``: the device plugin's or gangslice's own
    (:mod:`~extender.placement.choice`), within what its kubelet's Topology Manager admits
    (:mod:`~extender.placement.numa_fit`), as the solver judges gang pods."""
    return numa_fit.fit_on(node, numa_fit.rule_for(node, ps))


def _emptied(node: NodeState) -> NodeState | None:
    """The node with nothing of its kubelet's CPUs and memory in use, where its kubelet aligns
    pods (None elsewhere: there the Topology Manager refuses nothing)."""
    k = node.kubelet
    if k is None or not k.topology_policy.refuses:
        return None
    return replace(node, kubelet=k.emptied())


def _rule(shape: NodeShape, gpus: int, tier: Tier | None) -> Tier | None:
    """The in-node rule a GPU pod outside gangs is held to: its own level, else the tightest
    tier this node type offers for that many GPUs (None: it has no such set at all)."""
    return tier if tier is not None else fit_for(shape).tightest(gpus)


def _words(tier: Tier) -> str:
    return tier.words or "on one node"
