"""A plain gang as a gang request: pods labelled ``gangslice.io/gang``, so the extender can
place the whole gang on first sight.

Pods a ReplicaSet (a Deployment's) or a StatefulSet owns are sized by their owners: each pod
set holds as many pods as its owners want (:mod:`extender.kube.owners`), and the size
annotations below are not read. So are the pods of an upstream PodGroup that is their gang
(:mod:`extender.kube.pod_groups`). Pods without such an owner carry the gang's size in
``gangslice.io/gang-size``.

Every pod of a pod set is taken to look like the first one seen, down to what it asks of a
node (node selector and affinity, tolerations, requests: :mod:`extender.kube.pod_needs`). Without
``gangslice.io/pod-set-size`` the gang is N pods alike, placed on first sight (a
``gangslice.io/pod-set`` role then only names pods). A gang of pod sets that differ
(prefill and decode of other sizes, a leader and its workers) gives every pod its pod set's
size and is placed once a pod of every pod set has been seen, that is once the sizes of the
pod sets seen add up to ``gang-size``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extender.cost import Comm
from extender.kube import names
from extender.kube.pods import PodError, PodInfo
from extender.placement.request import Colocation, GangRequest, PodSet, split_colocation

if TYPE_CHECKING:
    from extender.kube.owners import OwnerTable, PodSetSize

#: The pod set name of a plain gang whose pods name none.
DEFAULT_POD_SET = "pods"


@dataclass(frozen=True, slots=True)
class Incomplete:
    """A gang of several pod sets whose every pod set has not been seen yet."""

    reason: str


def plain_gang_request(
    pod: PodInfo, peers: Iterable[PodInfo] = (), owners: OwnerTable | None = None
) -> GangRequest | Incomplete | None:
    """The gang request ``pod`` and the other pods seen of its gang (``peers``) imply; None
    when the pod carries no gang size and no owner sizes its gang. Raises :class:`PodError`
    for a size, a communication pattern or a colocation that cannot be read, or sizes that
    do not add up."""
    gang = pod.gang
    if gang is None:
        return None
    first: dict[str, PodInfo] = {pod.pod_set or DEFAULT_POD_SET: pod}
    for p in sorted(peers, key=lambda p: p.name):
        if p.gang == gang and not p.terminal and not p.deleting:
            first.setdefault(p.pod_set or DEFAULT_POD_SET, p)
    waiting = owners.waiting(gang, pod) if owners is not None else None
    if waiting is not None:
        return Incomplete(waiting)
    sizes = owners.sizes(gang, pod) if owners is not None else None
    if sizes is not None:
        return _owned_request(gang, first, sizes, owners)
    if pod.joins_pod_group:
        return Incomplete(f"waiting for PodGroup {gang} (scheduling.k8s.io) to be seen")
    size = pod.gang_size
    if size is None:
        return None
    if all(p.pod_set_size is None for p in first.values()):
        # No pod sizes its pod set: the gang is N pods alike (roles only name the pods).
        return GangRequest(name=gang, pod_sets=(_pod_set(pod, pod.pod_set or DEFAULT_POD_SET, size),))
    counts: dict[str, int] = {}
    for role, p in first.items():
        count = p.pod_set_size
        if count is None:
            raise PodError(
                f"pod {p.key}: gang {gang} has pod sets {', '.join(sorted(first))}; "
                f"each pod needs the annotation {names.POD_SET_SIZE}"
            )
        counts[role] = count
    seen = sum(counts.values())
    if seen > size:
        raise PodError(
            f"gang {gang}: its pod sets' sizes ({_sizes(counts)}) add up to {seen}, "
            f"more than {names.GANG_SIZE}={size}"
        )
    if seen < size:
        return Incomplete(
            f"pod sets seen ({_sizes(counts)}) hold {seen} of {size} pods; "
            "waiting for a pod of every other pod set"
        )
    pod_sets = tuple(_pod_set(first[role], role, counts[role]) for role in sorted(first))
    try:
        return GangRequest(name=gang, pod_sets=pod_sets)
    except ValueError as exc:
        raise PodError(f"gang {gang}: {exc}") from None


def _owned_request(
    gang: str, first: dict[str, PodInfo], sizes: Mapping[str, PodSetSize], owners: OwnerTable | None
) -> GangRequest | Incomplete:
    """The gang as its owners size it: every pod set an owner wants pods for, each read from
    a pod of it seen (else from its owner's template); the size annotations are not read."""
    missing = sorted(set(first) - set(sizes))
    if missing:
        return Incomplete(f"no ReplicaSet or StatefulSet wants pods of pod set {', '.join(missing)} now")
    pod_sets = []
    for role, size in sorted(sizes.items()):
        model = first.get(role) or (owners.template(gang, role) if owners is not None else None)
        if model is None:
            return Incomplete(f"waiting for a pod of pod set {role}")
        level = owners.required_level(gang, model) if owners is not None else None
        pod_sets.append(_pod_set(model, role, size.desired, required=level))
    try:
        return GangRequest(name=gang, pod_sets=tuple(pod_sets))
    except ValueError as exc:
        raise PodError(f"gang {gang}: {exc}") from None


def _sizes(counts: dict[str, int]) -> str:
    return ", ".join(f"{role} {n}" for role, n in sorted(counts.items()))


def member_pod_set(pod: PodInfo, owners: OwnerTable | None = None) -> PodSet:
    """The pod set of one more pod like ``pod`` (its role, one pod), bound as its gang's
    upstream PodGroup bounds it where ``owners`` are given. Raises PodError."""
    gang = pod.gang
    level = owners.required_level(gang, pod) if owners is not None and gang else None
    return _pod_set(pod, pod.pod_set or DEFAULT_POD_SET, 1, required=level)


def _pod_set(pod: PodInfo, name: str, count: int, *, required: str | None = None) -> PodSet:
    if pod.needs_problem:
        raise PodError(pod.needs_problem)
    comm = Comm.NONE
    if pod.comm is not None:
        try:
            comm = Comm(pod.comm)
        except ValueError:
            known = ", ".join(c.value for c in Comm)
            raise PodError(f"pod {pod.key}: {names.COMM}={pod.comm!r} is not one of {known}") from None
    colocate = None
    if pod.colocate_with:
        try:
            target, level = split_colocation(pod.colocate_with)
        except ValueError as exc:
            raise PodError(f"pod {pod.key}: {names.COLOCATE_WITH}: {exc}") from None
        colocate = Colocation(target, level or "node")
    return pod.needs.on(
        PodSet(
            name=name,
            count=count,
            gpus_per_pod=pod.gpus,
            comm=comm,
            required_level=required or pod.required_level,
            preferred_level=pod.preferred_level,
            colocate_with=colocate,
        )
    )
