"""The kubelet's Topology Manager as a placement rule: the GPU sets a node admits a pod with.

Where a node's kubelet runs ``topologyManagerPolicy: single-numa-node`` or ``restricted``, a
pod whose resources it cannot align is rejected at admission (``TopologyAffinityError``,
and a controller that recreates it loops: kubernetes/kubernetes#84869). What is modelled,
as the kubelet does it (``pkg/kubelet/cm/topologymanager`` policy.go and
policy_{single_numa_node,restricted}.go, ``cpumanager`` policy_static.go
``generateCPUTopologyHints``, ``devicemanager`` topology_hints.go
``generateDeviceTopologyHints``; the Topology Manager task page of the Kubernetes docs):

- **Which resources are aligned.** GPUs, for a pod of *any* QoS class, when the device
  plugin reports their NUMA node (the NVIDIA plugin reports sysfs ``numa_node``; alignment
  of every QoS class since kubernetes/kubernetes#83492). Not on ``dra`` nodes: DRA devices
  are prepared after admission and give the Topology Manager no hints
  (kubernetes/website#56232). CPUs, when ``cpuManagerPolicy: static`` and the pod is
  Guaranteed with an integer CPU request. Memory, when ``memoryManagerPolicy: Static`` and
  the pod is Guaranteed. A pod with none of these is admitted anywhere.
- **Hints.** For each aligned resource, every set of NUMA nodes whose free amount holds the
  request; *preferred* when the set is as narrow as any set could be on this machine
  (counted over everything the node has, not what is free).
- **Merge.** One hint per resource, ANDed; the result is preferred only when every hint is
  preferred and all are the same set. The best result is a preferred one, then the
  narrowest, then the lowest-numbered NUMA nodes.
- **Admission.** ``single-numa-node``: one NUMA node holds every aligned resource.
  ``restricted``: one NUMA set that is the narrowest possible for *every* aligned resource,
  so a pod whose GPUs need two NUMA nodes but whose CPUs fit in one is refused.
  ``best-effort`` and ``none`` admit anything, and are not a rule here.
- **Allocation.** The device manager offers the device plugin only the GPUs of the chosen
  hint, the CPU manager takes CPUs from it likewise; pods admitted one after another each
  take the best hint left, so the lowest NUMA node with room fills first.

A pod is judged as one container holding its summed requests: exact for the usual
inference pod (one container holds the GPUs and the CPUs) under either
``topologyManagerScope``; with several containers holding aligned resources, ``container``
scope aligns each on its own and is looser than this rule. ``prefer-closest-numa-nodes``
(which orders hints of equal width by NUMA distance) is not modelled. CPUs and memory that
reserved but not yet running pods will take are not counted, nor those of another pod set
of the same gang on the same node.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from extender.placement import choice
from extender.placement.request import PodSet
from extender.placement.snapshot import NodeState
from extender.topology.allocation import Allocation
from extender.topology.kubelet import CpuPolicy, MemoryPolicy, TopologyPolicy
from extender.topology.model import Tier

__all__ = [
    "GpuFit",
    "NumaFit",
    "NumaRule",
    "RuleKey",
    "fit_on",
    "offer",
    "refusal",
    "rule_for",
    "rule_key",
    "violations",
]

#: A set of NUMA node ids (ascending) and the mask of the node's GPU positions on them.
Hint = tuple[tuple[int, ...], int]
#: Free amount per NUMA node id.
Budget = dict[int, int]


@dataclass(frozen=True, slots=True)
class NumaRule:
    """What the Topology Manager demands of each pod of one pod set on one node.

    ``hints``: the NUMA sets the policy can admit a pod on, in the kubelet's order (the
    narrowest, then the lowest-numbered), whatever is free; empty when none can be
    (``why`` says why). ``gpus_aligned``: the pod's GPUs come from the chosen set.
    """

    policy: TopologyPolicy
    hints: tuple[Hint, ...]
    gpus: int
    gpus_aligned: bool
    cpus: int  # aligned CPUs per pod (0: CPUs are not aligned)
    memory: int  # aligned bytes per pod (0: memory is not aligned)
    cpu_free: tuple[tuple[int, int], ...]
    memory_free: tuple[tuple[int, int], ...]
    why: str = ""
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Rules key the solver's memo tables on every node it scans: hash once.
        fields = (self.policy, self.hints, self.gpus, self.gpus_aligned, self.cpus, self.memory)
        object.__setattr__(self, "_hash", hash((*fields, self.cpu_free, self.memory_free, self.why)))

    def __hash__(self) -> int:
        return self._hash

    def budgets(self) -> tuple[Budget, Budget]:
        return dict(self.cpu_free), dict(self.memory_free)

    def fits(self, hint: Hint, gpu_free: int, cpu: Mapping[int, int], mem: Mapping[int, int]) -> bool:
        """Whether one pod's aligned resources fit in ``hint`` now."""
        ids, gmask = hint
        if self.gpus_aligned and (gpu_free & gmask).bit_count() < self.gpus:
            return False
        if self.cpus and sum(cpu.get(n, 0) for n in ids) < self.cpus:
            return False
        return not self.memory or sum(mem.get(n, 0) for n in ids) >= self.memory

    def choose(self, gpu_free: int, cpu: Mapping[int, int], mem: Mapping[int, int]) -> Hint | None:
        """The hint the kubelet admits the next pod with, or None: it is refused."""
        for hint in self.hints:
            if self.fits(hint, gpu_free, cpu, mem):
                return hint
        return None

    def consume(self, hint: Hint, pods: int, cpu: Budget, mem: Budget) -> None:
        """Take ``pods`` pods' CPUs and memory from the NUMA nodes of ``hint``, lowest first."""
        for need, budget in ((self.cpus * pods, cpu), (self.memory * pods, mem)):
            for n in hint[0]:
                if need <= 0:
                    break
                got = min(need, budget.get(n, 0))
                budget[n] = budget.get(n, 0) - got
                need -= got

    def no_room(self) -> str:
        """Why no hint admits a pod, when none does."""
        if self.why:
            return self.why
        width = len(self.hints[0][0])
        span = "NUMA node" if width == 1 else f"set of {width} NUMA nodes"
        return f"no {span} has {self.words} free"

    @property
    def words(self) -> str:
        parts = [f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"] if self.gpus_aligned else []
        if self.cpus:
            parts.append(f"{self.cpus} CPUs")
        if self.memory:
            parts.append(f"{_gib(self.memory)} of memory")
        return " and ".join(parts)


def _gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"


def _masks(ids: Sequence[int], width: int) -> list[tuple[int, ...]]:
    """Every set of ``width`` NUMA ids, lowest-numbered first (the kubelet's bitmask order)."""
    found = list(itertools.combinations(ids, width))
    return sorted(found, key=lambda c: sum(1 << n for n in c))


def _width(ids: Sequence[int], need: int, amount: Mapping[int, int]) -> int | None:
    """The fewest NUMA nodes that together have ``need`` (None: not even all of them)."""
    for width in range(1, len(ids) + 1):
        if any(sum(amount.get(n, 0) for n in c) >= need for c in itertools.combinations(ids, width)):
            return width
    return None


#: What of a pod set decides its Topology Manager rule on a node: GPUs per pod and requests.
RuleKey = tuple[int, int, int, bool]


def rule_key(ps: PodSet) -> RuleKey:
    """The part of ``ps`` :func:`rule_for` depends on (pod sets with equal keys get one rule)."""
    req = ps.requests
    return ps.gpus_per_pod, req.cpu_millis, req.memory_bytes, req.guaranteed


def rule_for(node: NodeState, ps: PodSet) -> NumaRule | None:
    """The Topology Manager's rule for a pod of ``ps`` on ``node``; None where it sets none
    (no refusing policy, nothing of the pod aligned, one NUMA node, or counts not known).
    Memoised on the node state, per kind of pod."""
    k = node.kubelet
    if k is None or k.topology_policy not in _REFUSING or ps.gpus_per_pod <= 0:
        return None
    key = rule_key(ps)
    memo = node.numa_rules
    got = memo.get(key, _UNSET)
    if got is _UNSET:
        rule = _rule_for(node, ps)
        # One object per distinct rule: the solver's memo tables compare rules by identity first.
        got = memo[key] = None if rule is None else _INTERNED.setdefault(rule, rule)
        if len(_INTERNED) > NUMA_FITS_KEPT:
            _INTERNED.clear()
    return got  # type: ignore[return-value]


_REFUSING = frozenset(t for t in TopologyPolicy if t.refuses)
_UNSET = object()
_INTERNED: dict[NumaRule, NumaRule] = {}


def _rule_for(node: NodeState, ps: PodSet) -> NumaRule | None:
    k = node.kubelet
    assert k is not None
    shape = node.shape
    req = ps.requests
    gpu_numa = {n for n in shape.numa if n is not None}
    gpus_aligned = node.allocation is Allocation.DEVICE_PLUGIN and bool(gpu_numa)
    known = bool(k.numa_nodes)
    cpus = (
        req.cpu_millis // 1000
        if (
            known
            and k.cpu_policy is CpuPolicy.STATIC
            and req.guaranteed
            and req.cpu_millis > 0
            and req.cpu_millis % 1000 == 0
        )
        else 0
    )
    memory = (
        req.memory_bytes
        if (known and k.memory_policy is MemoryPolicy.STATIC and req.guaranteed and req.memory_bytes > 0)
        else 0
    )
    if not (gpus_aligned or cpus or memory):
        return None
    ids = sorted(gpu_numa | {n.id for n in k.numa_nodes})
    if len(ids) <= 1:
        return None
    by_id = {n.id: n for n in k.numa_nodes}
    policy = k.topology_policy
    # (what, NUMA nodes it needs at least, the most one NUMA node has), per aligned resource
    wanted: list[tuple[str, int | None, str]] = []
    if gpus_aligned:
        all_gpus = {n: sum(1 for m in shape.numa if m == n) for n in ids}
        most = max(all_gpus.values())
        wanted.append((f"{ps.gpus_per_pod} GPUs", _width(ids, ps.gpus_per_pod, all_gpus), str(most)))
    if cpus:
        all_cpus = {n: by_id[n].cpus for n in by_id}
        wanted.append((f"{cpus} CPUs", _width(ids, cpus, all_cpus), str(max(all_cpus.values()))))
    if memory:
        mem_all = {n: by_id[n].memory_bytes or 0 for n in by_id}
        most_memory = _gib(max(mem_all.values()))
        wanted.append((f"{_gib(memory)} of memory", _width(ids, memory, mem_all), most_memory))
    why = ""
    widths = {w for _, w, _ in wanted}
    if None in widths:
        what = next(w for w, width, _ in wanted if width is None)
        why = f"the node has fewer than {what} on all its NUMA nodes together"
    elif policy is TopologyPolicy.SINGLE_NUMA_NODE and widths != {1}:
        what, _, most_text = next(x for x in wanted if x[1] != 1)
        why = f"no NUMA node has {what} (the most is {most_text})"
    elif len(widths) > 1:
        spans = ", ".join(
            f"the {w} need {width} NUMA node{'s' if width != 1 else ''}" for w, width, _ in wanted
        )
        why = f"{spans}: no alignment is the narrowest for all of them"
    hints: tuple[Hint, ...] = ()
    if not why:
        (width,) = widths
        assert width is not None
        hints = tuple(
            (c, sum(1 << p for p, n in enumerate(shape.numa) if n in c)) for c in _masks(ids, width)
        )
    return NumaRule(
        policy=policy,
        hints=hints,
        gpus=ps.gpus_per_pod,
        gpus_aligned=gpus_aligned,
        cpus=cpus,
        memory=memory,
        # Only what the rule reads, so nodes that differ in nothing else share one rule.
        cpu_free=tuple((n.id, n.cpus_free) for n in k.numa_nodes) if cpus else (),
        memory_free=tuple((n.id, n.memory_free) for n in k.numa_nodes) if memory else (),
        why=why,
    )


# -- in the solver: capacity and picks under the rule ---------------------------------------


class GpuFit(Protocol):
    """What the solver asks of a node type's GPU sets: :class:`NodeFit` on a DRA node,
    :class:`~extender.placement.choice.PluginChoice` under the device plugin, or
    :class:`NumaFit` over either for a node whose kubelet aligns the pod."""

    def capacity(self, free: int, gpus: int, tier: Tier) -> int: ...

    def pick(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None: ...

    def gbps(self, mask: int) -> float: ...

    def coherent_block(self, free: int) -> int: ...

    def subsets(self, gpus: int, tier: Tier) -> tuple[int, ...]: ...


@dataclass
class NumaFit:
    """A node type's GPU sets for a pod set under a :class:`NumaRule`: pods are admitted as
    the kubelet admits them, each on the first hint with room, and take GPUs of that hint only
    (where GPUs are aligned) at the pod set's tier."""

    base: GpuFit  # what the node hands out from the GPUs the kubelet offers (extender.placement.choice)
    rule: NumaRule
    _filled: dict[tuple[int, int, Tier, int], tuple[int, ...]] = field(default_factory=dict)
    _refusals: dict[tuple[int, int, Tier], str | None] = field(default_factory=dict)

    def _fill(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...]:
        key = (free, gpus, tier, pods)
        got = self._filled.get(key)
        if got is not None:
            return got
        rule, base = self.rule, self.base
        cpu, mem = rule.budgets()
        out: list[int] = []
        left = free
        while len(out) < pods:
            hint = rule.choose(left, cpu, mem)
            if hint is None:
                break
            ids, gmask = hint
            allowed = left & gmask if rule.gpus_aligned else left
            # The pods the kubelet sends to this hint in a row: while it has room for one more.
            row = pods - len(out)
            if rule.gpus_aligned:
                row = min(row, allowed.bit_count() // gpus)
            if rule.cpus:
                row = min(row, sum(cpu.get(n, 0) for n in ids) // rule.cpus)
            if rule.memory:
                row = min(row, sum(mem.get(n, 0) for n in ids) // rule.memory)
            take = min(row, base.capacity(allowed, gpus, tier))
            picked = base.pick(allowed, gpus, tier, take) if take else None
            if not picked:
                break
            out.extend(picked)
            for m in picked:
                left &= ~m
            rule.consume(hint, take, cpu, mem)
            if take < row:
                break  # the next pod is sent here too and finds no GPU set at its tier
        got = self._filled[key] = tuple(out)
        return got

    def capacity(self, free: int, gpus: int, tier: Tier) -> int:
        if gpus <= 0:
            return 0
        return len(self._fill(free, gpus, tier, free.bit_count() // gpus))

    def refusal(self, free: int, gpus: int, tier: Tier) -> str | None:
        """Why no pod fits ``free`` under the rule, in words (None: one does; memoised, since a
        refusal is explained for every node of the cluster)."""
        key = (free, gpus, tier)
        if key in self._refusals:
            return self._refusals[key]
        rule = self.rule
        why: str | None = None
        if self.capacity(free, gpus, tier) == 0:
            cpu, mem = rule.budgets()
            hint = rule.choose(free, cpu, mem)
            if hint is None:
                why = rule.no_room()
            else:
                why = (
                    f"the pod would get the GPUs of NUMA node{'s' if len(hint[0]) > 1 else ''} "
                    f"{','.join(map(str, hint[0]))}, and they hold no {tier.words or 'free'} set of {gpus}"
                )
        self._refusals[key] = why
        return why

    def pick(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
        got = self._fill(free, gpus, tier, pods)
        return got if len(got) == pods else None

    def gbps(self, mask: int) -> float:
        return self.base.gbps(mask)

    def coherent_block(self, free: int) -> int:
        return self.base.coherent_block(free)

    def subsets(self, gpus: int, tier: Tier) -> tuple[int, ...]:
        return self.base.subsets(gpus, tier)


_NUMA_FITS: OrderedDict[tuple[str, NumaRule], NumaFit] = OrderedDict()
#: NumaFit tables kept (one per node type and rule; a rule carries the free CPUs, so a busy
#: cluster has many): least recently used go first.
NUMA_FITS_KEPT = 4096


def fit_on(node: NodeState, rule: NumaRule | None) -> GpuFit:
    """The GPU-set tables for a pod set on ``node``: the node type's own, or under ``rule``."""
    base = choice.fit(node)
    if rule is None:
        return base
    key = (node.kind, rule)
    got = _NUMA_FITS.get(key)
    if got is None:
        got = _NUMA_FITS[key] = NumaFit(base, rule)
        while len(_NUMA_FITS) > NUMA_FITS_KEPT:
            _NUMA_FITS.popitem(last=False)
    else:
        _NUMA_FITS.move_to_end(key)
    return got


def refusal(node: NodeState, ps: PodSet, free: int, tier: Tier | None) -> str | None:
    """Why the Topology Manager leaves no room for a pod of ``ps`` on ``node`` (None: it leaves
    some, or sets no rule), in words naming the policy and the node."""
    rule = rule_for(node, ps)
    if rule is None or tier is None:
        return None
    fit = fit_on(node, rule)
    assert isinstance(fit, NumaFit)
    why = fit.refusal(free, ps.gpus_per_pod, tier)
    return None if why is None else f"topologyManagerPolicy {rule.policy} on {node.name}: {why}"


# -- checking a slice, and the kubelet's own choice for policies that choose nodes only ------


def offer(node: NodeState, earlier: Sequence[tuple[PodSet, int]], ps: PodSet, free: int) -> int | None:
    """The free GPUs the kubelet offers the device plugin for the next pod of ``ps`` on
    ``node``, after admitting ``earlier`` (pod set, GPU mask) in order: those of the chosen
    hint where GPUs are aligned, else all of ``free``; None when it refuses the pod."""
    cpu, mem = _node_budgets(node)
    left = free | _union(m for _, m in earlier)
    for eps, mask in earlier:
        rule = rule_for(node, eps)
        if rule is not None:
            hint = rule.choose(left, cpu, mem)
            if hint is not None:
                rule.consume(hint, 1, cpu, mem)
        left &= ~mask
    rule = rule_for(node, ps)
    if rule is None:
        return free
    hint = rule.choose(free, cpu, mem)
    if hint is None:
        return None
    return free & hint[1] if rule.gpus_aligned else free


def _node_budgets(node: NodeState) -> tuple[Budget, Budget]:
    k = node.kubelet
    if k is None:
        return {}, {}
    return {n.id: n.cpus_free for n in k.numa_nodes}, {n.id: n.memory_free for n in k.numa_nodes}


def _union(masks: Iterable[int]) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


def violations(node: NodeState, pods: Sequence[tuple[str, PodSet, int]], free: int) -> list[str]:
    """What the kubelet refuses among ``pods`` (slot key, pod set, GPU mask) placed on
    ``node`` from its ``free`` GPUs: a pod no NUMA set can admit, or GPUs that lie across the
    NUMA sets the policy admits (the kubelet hands out GPUs of one of them only). Which set a
    pod gets when several could hold it depends on admission order, so each pod is checked
    against the sets that contain its GPUs."""
    problems: list[str] = []
    cpu, mem = _node_budgets(node)
    left = free
    shape = node.shape
    for key, ps, mask in pods:
        rule = rule_for(node, ps)
        if rule is None:
            continue
        head = f"slot {key}: topologyManagerPolicy {rule.policy} on {node.name}"
        if rule.why:
            problems.append(f"{head}: {rule.why}")
            continue
        within = [h for h in rule.hints if not rule.gpus_aligned or mask & ~h[1] == 0]
        if not within:
            numa = ",".join(map(str, shape.numa_of(mask)))
            problems.append(
                f"{head}: GPUs {list(shape.gpus_of(mask))} lie on NUMA nodes {numa}, "
                f"not on one NUMA set the policy admits"
            )
            continue
        ok = next((h for h in within if rule.fits(h, left | mask, cpu, mem)), None)
        if ok is None:
            problems.append(f"{head}: no NUMA set with its GPUs has {rule.words} free")
            continue
        rule.consume(ok, 1, cpu, mem)
        left &= ~mask
    return problems
