"""Whether a pod may run on a node at all, as kube-scheduler's filters judge it.

Four of kube-scheduler's default Filter plugins decide whether a node can take a pod
independently of GPUs, and every policy here (the solver, the exact search, the baselines)
keeps them for every pod it places, so no reservation holds a node its pods cannot use:

- **NodeUnschedulable** (pkg/scheduler/framework/plugins/nodeunschedulable): a node with
  ``spec.unschedulable`` (cordoned) takes only pods that tolerate the taint
  ``node.kubernetes.io/unschedulable:NoSchedule``.
- **TaintToleration** (plugins/tainttoleration, ``v1helper.FindMatchingUntoleratedTaint``):
  every taint with effect ``NoSchedule`` or ``NoExecute`` must be tolerated;
  ``PreferNoSchedule`` only lowers a node's score and is ignored here.
- **NodeAffinity** (plugins/nodeaffinity, k8s.io/component-helpers nodeaffinity): every
  ``nodeSelector`` entry, and one of the required ``nodeSelectorTerms`` (matchExpressions on
  labels, matchFields on ``metadata.name``, ANDed within a term).
- **NodeResourcesFit** (plugins/noderesources/fit.go ``fitsRequest``): the pod count below
  ``allocatable.pods``, and each of cpu, memory and ephemeral-storage the pod requests
  within allocatable less what the pods already on the node request. Several pods of one
  gang on one node are counted together (:func:`room`).

The first three depend on the pod set and the node only (:func:`admits`, cached per pod set
by :meth:`~extender.placement.snapshot.ClusterSnapshot.admitted`); the fourth also on what
else lands on the node (:func:`room`, a cap on how many pods of a set a node takes).
A refusal names the filter and the field (:class:`Refusal`), as kube-scheduler's own
reasons do. The order is kube-scheduler's default filter order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from extender.placement.request import (
    TAINT_EFFECTS,
    NodeNeeds,
    PodRequests,
    PodSet,
    PreferredTerm,
    Toleration,
)

#: The taint NodeUnschedulable treats a cordoned node as carrying (core/v1 ``TaintNodeUnschedulable``).
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
#: Effects the TaintToleration filter enforces.
FILTERED_EFFECTS = ("NoSchedule", "NoExecute")
#: How many pods a node takes when nothing limits it.
UNLIMITED = 1 << 30


@dataclass(frozen=True, slots=True)
class Taint:
    """One of a node's ``spec.taints``."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("a taint needs a key")
        if self.effect not in TAINT_EFFECTS:
            raise ValueError(
                f"taint {self.key}: effect {self.effect!r}: expected one of {', '.join(TAINT_EFFECTS)}"
            )

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Resources:
    """Amounts of the resources NodeResourcesFit counts besides extended ones (GPUs are
    counted by the GPU model). ``None`` in an allocatable: the node reports no such
    resource, and it limits nothing (a kubelet always reports all four; a Node object
    written by hand may not)."""

    cpu_millis: int | None = None
    memory_bytes: int | None = None
    ephemeral_bytes: int | None = None
    pods: int | None = None

    def plus(self, other: Resources) -> Resources:
        return Resources(
            _add(self.cpu_millis, other.cpu_millis),
            _add(self.memory_bytes, other.memory_bytes),
            _add(self.ephemeral_bytes, other.ephemeral_bytes),
            _add(self.pods, other.pods),
        )

    @property
    def reported(self) -> bool:
        return any(
            v is not None for v in (self.cpu_millis, self.memory_bytes, self.ephemeral_bytes, self.pods)
        )


NOTHING = Resources(0, 0, 0, 0)
#: What the IMEX daemon pod takes of each node of a ComputeDomain. NVIDIA's DRA driver starts
#: one per node (a DaemonSet per ComputeDomain, selected by the node label its kubelet plugin
#: sets when a pod of the domain is prepared there): one pod slot, and the container resources
#: of the driver's chart value ``controller.containers.computeDomain.resources`` (the
#: controller's ``--cd-daemon-resources-json``), empty by default, so no cpu or memory.
IMEX_DAEMON = Resources(0, 0, 0, 1)


def _add(a: int | None, b: int | None) -> int | None:
    if a is None and b is None:
        return None
    return (a or 0) + (b or 0)


def usage(requests: PodRequests, pods: int = 1) -> Resources:
    """What ``pods`` pods with these requests take of a node (one pod slot each)."""
    return Resources(
        requests.cpu_millis * pods, requests.memory_bytes * pods, requests.ephemeral_bytes * pods, pods
    )


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What kube-scheduler's filters read of a node besides labels and GPUs. The default is
    a node that constrains nothing (cluster files and tests without these fields)."""

    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    allocatable: Resources = Resources()
    #: What the non-terminal pods already bound to the node request (pods: how many).
    requested: Resources = NOTHING
    #: What the IMEX daemon pod of a ComputeDomain takes here (:func:`with_imex_daemon`).
    imex_daemon: Resources = IMEX_DAEMON

    @property
    def constrains(self) -> bool:
        return bool(self.taints or self.unschedulable)

    def emptied(self) -> NodeFacts:
        """The same node with no pods on it."""
        return NodeFacts(self.taints, self.unschedulable, self.allocatable, imex_daemon=self.imex_daemon)

    def static(self) -> tuple[object, ...]:
        """What of the node counts on an empty cluster."""
        return (self.taints, self.unschedulable, self.allocatable, self.imex_daemon)


NO_FACTS = NodeFacts()


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a filter refuses a node: the plugin's name and what failed, naming the field."""

    filter: str
    reason: str

    def __str__(self) -> str:
        return f"{self.filter}: {self.reason}"


# -- the rules ------------------------------------------------------------------------------


def tolerates(t: Toleration, taint: Taint) -> bool:
    """core/v1 ``Toleration.ToleratesTaint``: the effect matches (or the toleration names
    none), the key matches (or is empty, with Exists), and Exists, or Equal with the value."""
    if t.effect and t.effect != taint.effect:
        return False
    if t.key and t.key != taint.key:
        return False
    return t.operator == "Exists" or t.value == taint.value


def untolerated(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> Taint | None:
    """The first NoSchedule or NoExecute taint no toleration tolerates (TaintToleration)."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.effect in FILTERED_EFFECTS and not any(tolerates(t, taint) for t in tols):
            return taint
    return None


def unschedulable_refusal(tolerations: Iterable[Toleration], facts: NodeFacts) -> Refusal | None:
    """NodeUnschedulable: a cordoned node, unless the pod tolerates its taint."""
    if not facts.unschedulable:
        return None
    taint = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")
    if any(tolerates(t, taint) for t in tolerations):
        return None
    return Refusal(
        "NodeUnschedulable", f"spec.unschedulable is set (tolerate {UNSCHEDULABLE_TAINT} to use it)"
    )


def affinity_refusal(needs: NodeNeeds, name: str, labels: Mapping[str, str]) -> Refusal | None:
    """NodeAffinity: every nodeSelector entry, and one required term when there are any."""
    unmet = [str(r) for r in needs.node_selector if not r.matches(labels)]
    if unmet:
        return Refusal(
            "NodeAffinity", f"does not meet {', '.join(unmet)} (nodeSelector, required node affinity)"
        )
    if needs.affinity and not any(t.matches(name, labels) for t in needs.affinity):
        terms = " or ".join(f"({t})" for t in needs.affinity)
        return Refusal(
            "NodeAffinity", f"required node affinity: none of the nodeSelectorTerms {terms} matches"
        )
    return None


def taint_refusal(tolerations: Iterable[Toleration], facts: NodeFacts) -> Refusal | None:
    taint = untolerated(tolerations, facts.taints)
    if taint is None:
        return None
    return Refusal("TaintToleration", f"taint {taint} is not tolerated (spec.tolerations)")


def refusal(needs: NodeNeeds, name: str, labels: Mapping[str, str], facts: NodeFacts) -> Refusal | None:
    """The first of NodeUnschedulable, TaintToleration and NodeAffinity that refuses the
    node (kube-scheduler's default filter order), or None."""
    return (
        unschedulable_refusal(needs.tolerations, facts)
        or taint_refusal(needs.tolerations, facts)
        or affinity_refusal(needs, name, labels)
    )


def admits(needs: NodeNeeds, name: str, labels: Mapping[str, str], facts: NodeFacts) -> bool:
    return refusal(needs, name, labels, facts) is None


def room(requests: PodRequests, facts: NodeFacts, taken: Resources = NOTHING) -> int:
    """How many pods with ``requests`` NodeResourcesFit lets onto the node, with what the
    pods already there request and ``taken`` (pods of this gang placed there so far).

    A pod fits when ``pods + 1 <= allocatable.pods`` and, for each of cpu, memory and
    ephemeral-storage it requests (> 0), ``request <= allocatable - requested``; so k pods
    fit when k * request fits what is left (:data:`UNLIMITED` when nothing limits)."""
    alloc = facts.allocatable
    used = facts.requested if taken is NOTHING else facts.requested.plus(taken)
    best = UNLIMITED
    for want, have, already in (
        (requests.cpu_millis, alloc.cpu_millis, used.cpu_millis),
        (requests.memory_bytes, alloc.memory_bytes, used.memory_bytes),
        (requests.ephemeral_bytes, alloc.ephemeral_bytes, used.ephemeral_bytes),
    ):
        if want > 0 and have is not None:
            best = min(best, max(0, have - (already or 0)) // want)
    if alloc.pods is not None:
        best = min(best, max(0, alloc.pods - (used.pods or 0)))
    return best


def with_imex_daemon(taken: Resources | None, facts: NodeFacts) -> Resources:
    """What a gang takes of a node it joins to its ComputeDomain: its pods there (``taken``)
    and the IMEX daemon pod NVIDIA's driver starts on the node. kube-scheduler places that pod
    after the gang's first pod there is prepared, so its room must be left when the gang is
    placed, or the gang's pods wait in ContainerCreating for a daemon that has no room."""
    return (taken or NOTHING).plus(facts.imex_daemon)


def room_refusal(requests: PodRequests, facts: NodeFacts, taken: Resources = NOTHING) -> Refusal | None:
    """NodeResourcesFit's reason for a node without room for one more pod (``Insufficient
    cpu``, ``Too many pods``), naming the request and what is left."""
    alloc, used = facts.allocatable, facts.requested.plus(taken)
    if alloc.pods is not None and (used.pods or 0) + 1 > alloc.pods:
        return Refusal("NodeResourcesFit", f"too many pods ({used.pods} of allocatable pods {alloc.pods})")
    for what, want, have, already, unit in (
        ("cpu", requests.cpu_millis, alloc.cpu_millis, used.cpu_millis, "m"),
        ("memory", requests.memory_bytes, alloc.memory_bytes, used.memory_bytes, ""),
        ("ephemeral-storage", requests.ephemeral_bytes, alloc.ephemeral_bytes, used.ephemeral_bytes, ""),
    ):
        if want > 0 and have is not None and want > have - (already or 0):
            return Refusal(
                "NodeResourcesFit",
                f"insufficient {what}: requests.{what} {want}{unit}, allocatable {have}{unit} "
                f"less {already or 0}{unit} requested by pods on the node",
            )
    return None


def node_refusal(
    ps: PodSet, name: str, labels: Mapping[str, str], facts: NodeFacts, taken: Resources = NOTHING
) -> Refusal | None:
    """Why a pod of ``ps`` cannot go to this node at all, in filter order, or None."""
    return refusal(ps.node_needs, name, labels, facts) or room_refusal(ps.requests, facts, taken)


def preference(preferred: Iterable[PreferredTerm], name: str, labels: Mapping[str, str]) -> int:
    """NodeAffinity's Score before normalising: the weights of the preferred terms the node
    matches, summed."""
    return sum(p.weight for p in preferred if p.term.matches(name, labels))


def summarize(refusals: Iterable[Refusal]) -> str:
    """``2 by TaintToleration (taint ...), 1 by NodeUnschedulable (...)``: counts by filter,
    with the first reason of each."""
    counts: dict[str, tuple[int, str]] = {}
    for r in refusals:
        n, first = counts.get(r.filter, (0, r.reason))
        counts[r.filter] = (n + 1, first)
    return ", ".join(f"{n} by {f} ({why})" for f, (n, why) in counts.items())
