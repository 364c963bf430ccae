"""The kubelet's report against our promise: which GPUs a bound pod really holds.

Bind writes the GPUs gangslice chose (``gangslice.io/gpus``, ``gangslice.io/gpu-uuids``), but
on a device-plugin node the kubelet asks the device plugin, which picks from the free
devices without seeing the pod. The node agent reports what the kubelet gave each pod
(NodeTopology ``devicesInUse``, from PodResources ``List``); that report is the truth. A pod
whose reported GPUs differ from its annotation is a :class:`DeviceMismatch`: the cache
counts its GPUs as reported, moves its reservation slot onto them, and the reservation's
status carries the ``DevicesMismatch`` condition (:func:`devices_condition`) naming both sets
and whether the reported set still meets the pod set's in-node rule: the pod's own required
in-node level (``gangslice.io/required-level``: ``nvlink``, ``pcie``, ...), else the default
rule, the tightest tier the node type offers for that many GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from extender.kube.pods import PodInfo
from extender.placement.scoring import LevelError, resolve_level
from extender.topology.hierarchy import Hierarchy
from extender.topology.model import GpuGraph, Tier

if TYPE_CHECKING:  # crd_models imports this module (the condition)
    from extender.kube.crd_models import NodeTopology

#: The SliceReservation condition type, and its reasons.
DEVICES_MISMATCH = "DevicesMismatch"
#: The reported set differs from the promise but meets the pod set's rule.
DEVICES_DIFFER = "DevicesDiffer"
#: The reported set differs and breaks the pod set's rule.
COHERENCE_BROKEN = "CoherenceBroken"
#: Every bound pod holds what it was promised (again).
DEVICES_MATCH = "DevicesMatch"


def _tier_words(tier: Tier) -> str:
    return tier.words or "node-wide (across sockets)"


def _gpus(indices: Sequence[int], uuids: Sequence[str] | None) -> str:
    listed = ",".join(map(str, indices)) or "none"
    return f"{listed} ({', '.join(uuids)})" if uuids else listed


@dataclass(frozen=True, slots=True)
class DeviceMismatch:
    """One bound pod whose GPUs, as the kubelet reports them, are not the ones promised."""

    pod: str
    uid: str
    node: str
    promised: tuple[int, ...]
    reported: tuple[int, ...]
    promised_uuids: tuple[str, ...] | None
    reported_uuids: tuple[str, ...] | None
    #: The pod set's in-node rule on this node, and the tier of the reported set (None when
    #: the node's graph cannot tell).
    rule: Tier | None
    actual: Tier | None
    #: The reservation and slot the pod holds, when it holds one.
    gang: str | None = None
    slot: str | None = None
    #: Why the slot does not follow the kubelet ("" when it does, or there is no slot).
    not_corrected: str = ""
    #: What the last eviction of the pod came to ("" when none was tried).
    eviction: str = ""

    @property
    def sets(self) -> tuple[str, str, tuple[int, ...], tuple[int, ...]]:
        """What makes two reports of a mismatch the same one."""
        return self.pod, self.uid, self.promised, self.reported

    @property
    def coherent(self) -> bool:
        """Whether the reported set meets the pod set's rule (True when it cannot be told)."""
        return self.rule is None or self.actual is None or self.actual <= self.rule

    def message(self) -> str:
        where = f"pod {self.pod} on {self.node}" + (f" (slot {self.slot})" if self.slot else "")
        text = (
            f"{where}: promised GPUs {_gpus(self.promised, self.promised_uuids)}, "
            f"the kubelet reports {_gpus(self.reported, self.reported_uuids)}"
        )
        if self.rule is not None and self.actual is not None:
            verdict = "meets" if self.coherent else "breaks"
            text += (
                f"; the reported set is {_tier_words(self.actual)}: it {verdict} the pod set's rule "
                f"({_tier_words(self.rule)} or tighter)"
            )
        if self.gang is not None:
            text += (
                "; the reservation follows the kubelet"
                if not self.not_corrected
                else f"; the reservation keeps the promise: {self.not_corrected}"
            )
        if self.eviction:
            text += f"; {self.eviction}"
        return text


def pod_rule(pod: PodInfo, graph: GpuGraph, hierarchy: Hierarchy) -> Tier | None:
    """The in-node tier the pod's GPUs must reach on a node of ``graph``'s type: its required
    in-node level, else the tightest the node type offers for that many GPUs."""
    if pod.required_level:
        try:
            _, tier = resolve_level(pod.required_level, hierarchy)
        except LevelError:
            tier = None
        if tier is not None:
            return tier
    count = pod.gpus or len(pod.assigned_gpus or ())
    return graph.shape.tightest_tier(count)


def tier_of(graph: GpuGraph, gpus: Iterable[int]) -> Tier | None:
    known = [g for g in gpus if g in graph.indices]
    if not known:
        return None
    shape = graph.shape
    return shape.tier_of(shape.mask_of(known))


def compare(
    pod: PodInfo,
    reported: Iterable[int],
    graph: GpuGraph | None,
    hierarchy: Hierarchy,
    promise: Iterable[int] | None = None,
) -> DeviceMismatch | None:
    """The mismatch of a bound pod between what it was promised (``promise``, else its
    ``gangslice.io/gpus`` annotation) and what the kubelet reports it holds; None when they
    agree or either is missing."""
    promised = tuple(sorted((pod.assigned_gpus or ()) if promise is None else set(promise)))
    got = tuple(sorted(set(reported)))
    if not promised or not got or set(promised) == set(got) or pod.node is None:
        return None
    return DeviceMismatch(
        pod=pod.key,
        uid=pod.uid,
        node=pod.node,
        promised=promised,
        reported=got,
        promised_uuids=_uuids(graph, promised),
        reported_uuids=_uuids(graph, got),
        rule=pod_rule(pod, graph, hierarchy) if graph is not None else None,
        actual=tier_of(graph, got) if graph is not None else None,
    )


def node_mismatches(
    node: str,
    pods: Iterable[PodInfo],
    topology: NodeTopology | None,
    hierarchy: Hierarchy,
    promises: Mapping[str, Iterable[int]] | None = None,
) -> dict[str, DeviceMismatch]:
    """The mismatches of the bound, running pods of ``node`` its NodeTopology reports (pod key
    -> mismatch); none without a NodeTopology or a report of the pod. ``promises``: what a pod
    was promised where that is not its annotation (pod key -> GPUs)."""
    if topology is None:
        return {}
    out = {}
    for pod in pods:
        reported = topology.in_use.get(pod.key)
        if pod.node != node or not pod.holds_gpus or pod.deleting or not reported:
            continue
        m = compare(pod, reported, topology.graph, hierarchy, (promises or {}).get(pod.key))
        if m is not None:
            out[pod.key] = m
    return out


def _uuids(graph: GpuGraph | None, gpus: Sequence[int]) -> tuple[str, ...] | None:
    if graph is None or any(g not in graph.indices for g in gpus):
        return None
    return graph.uuids(gpus)


def devices_condition(
    mismatches: Sequence[DeviceMismatch], previous: Mapping[str, Any] | None, stamp: str
) -> dict[str, str] | None:
    """The ``DevicesMismatch`` condition of a reservation whose pods show ``mismatches``:
    True naming each, False once there are none after there were some, None when there never
    were. ``previous`` is the status written before: the condition keeps its
    lastTransitionTime while its status does not change."""
    before: Mapping[str, Any] | None = None
    for c in (previous or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == DEVICES_MISMATCH:
            before = c
    if mismatches:
        status = "True"
        reason = DEVICES_DIFFER if all(m.coherent for m in mismatches) else COHERENCE_BROKEN
        message = "; ".join(m.message() for m in sorted(mismatches, key=lambda m: m.pod))
    elif before is not None:
        status, reason = "False", DEVICES_MATCH
        message = "no bound pod is reported holding other GPUs than it was promised"
    else:
        return None
    since = stamp
    if before is not None and before.get("status") == status:
        since = str(before.get("lastTransitionTime") or stamp)
    return {
        "type": DEVICES_MISMATCH,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
    }
