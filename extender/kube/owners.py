"""Who owns a plain gang's pods, and how many pods each pod set should have.

A Deployment's pods are labelled ``gangslice.io/gang`` (and ``gangslice.io/pod-set``) in its
pod template; their number follows ``replicas``, which an autoscaler changes at any time. So a
gang's pod sets are sized from their owners, never from a count kept by hand:

- a **ReplicaSet** of a Deployment carries the Deployment's ``replicas`` and ``replicas +
  maxSurge`` in the annotations ``deployment.kubernetes.io/desired-replicas`` and
  ``deployment.kubernetes.io/max-replicas`` (the deployment controller keeps them on every
  ReplicaSet of the Deployment); the one of the newest revision speaks for the Deployment;
- a ReplicaSet of its own wants ``spec.replicas``, never more;
- a **StatefulSet** wants ``spec.replicas`` and never surges (a rolling update deletes a pod
  before it creates its successor).

The template is read as a pod (:meth:`PodInfo.from_obj`), so its gang key, pod set and what it
asks of a node follow the very rules a pod's do. LeaderWorkerSet templates are left out: each
replica group is a gang of its own, sized by the LeaderWorkerSet's ``size``.

An upstream **PodGroup** (``scheduling.k8s.io``) sizes the gang its pods form when no label names
another (:mod:`extender.kube.pod_groups`): from its ``minCount`` and the pods that live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.kube import names
from extender.kube.api import WORKLOAD_POD_GROUPS
from extender.kube.gangs import DEFAULT_POD_SET
from extender.kube.names import DESIRED_REPLICAS, MAX_REPLICAS, REVISION
from extender.kube.pod_groups import PodGroup, group_sizes, read_pod_group
from extender.kube.pods import PodError, PodInfo, controller_ref, digits
from extender.topology.hierarchy import Hierarchy

LWS_PREFIX = "leaderworkerset.sigs.k8s.io/"
#: The kind :meth:`OwnerTable.put` takes an upstream PodGroup under.
GROUP_KIND = WORKLOAD_POD_GROUPS.kind


@dataclass(frozen=True, slots=True)
class PodSetSize:
    """How many pods a pod set's owners want (``desired``) and let run at once during a
    rolling update (``limit``: desired plus the surge)."""

    desired: int
    limit: int


@dataclass(frozen=True, slots=True)
class Owner:
    """A ReplicaSet or StatefulSet whose pod template names a plain gang."""

    kind: str
    namespace: str
    name: str
    #: What the owner's size speaks for: ``Deployment/<name>`` for a Deployment's ReplicaSets
    #: (all its revisions are one), else the owner itself.
    workload: str
    revision: int
    size: PodSetSize
    #: The pod template, read as a pod.
    template: PodInfo

    @property
    def gang(self) -> str:
        gang = self.template.gang
        assert gang is not None
        return gang

    @property
    def pod_set(self) -> str:
        return self.template.pod_set or DEFAULT_POD_SET


def read_owner(kind: str, obj: Mapping[str, Any]) -> Owner | None:
    """The owner ``obj`` is (``kind``: ReplicaSet or StatefulSet), or None when its template
    names no plain gang (or is a LeaderWorkerSet's)."""
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    template = _map(spec.get("template"))
    tmeta = _map(template.get("metadata"))
    labels = _map(tmeta.get("labels"))
    if not labels.get(names.GANG) or any(str(k).startswith(LWS_PREFIX) for k in labels):
        return None
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    pod = PodInfo.from_obj(
        {"metadata": {**tmeta, "namespace": namespace, "name": name}, "spec": _map(template.get("spec"))}
    )
    if pod.gang is None or not name:
        return None
    replicas = spec.get("replicas", 1)
    want = replicas if isinstance(replicas, int) and replicas >= 0 else 0
    annotations = _map(meta.get("annotations"))
    ref = controller_ref(meta) if kind == "ReplicaSet" else None
    deployment = ref[2] if ref is not None and ref[1] == "Deployment" and ref[2] else None
    if deployment is not None:
        desired = _count(annotations.get(DESIRED_REPLICAS), want)
        size = PodSetSize(desired, max(desired, _count(annotations.get(MAX_REPLICAS), desired)))
        workload = f"Deployment/{deployment}"
    else:
        size = PodSetSize(want, want)
        workload = f"{kind}/{name}"
    revision = _count(annotations.get(REVISION), 0)
    return Owner(kind, namespace, name, workload, revision, size, pod)


def _no_pods(gang: str) -> Iterable[PodInfo]:
    return ()


class OwnerTable:
    """The owners seen, by gang: what :func:`pod_set_sizes` reads; and the upstream PodGroups,
    which size a gang from ``pods_of_gang`` (its pods seen)."""

    def __init__(
        self,
        pods_of_gang: Callable[[str], Iterable[PodInfo]] = _no_pods,
        hierarchy: Hierarchy | None = None,
    ) -> None:
        self._owners: dict[tuple[str, str, str], Owner] = {}
        self._by_gang: dict[str, dict[tuple[str, str, str], Owner]] = {}
        self._groups: dict[str, PodGroup] = {}
        self._pods_of_gang = pods_of_gang
        self.hierarchy = hierarchy or Hierarchy()

    def put(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        """An owner (or a PodGroup) added or changed; the gangs whose sizes may have changed."""
        meta = _map(obj.get("metadata"))
        if kind == GROUP_KIND:
            group = read_pod_group(obj)
            return self._set_group(group.key, group)
        key = (kind, str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        try:
            owner = read_owner(kind, obj)
        except PodError:
            owner = None
        return self._set(key, owner)

    def drop(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        meta = _map(obj.get("metadata"))
        if kind == GROUP_KIND:
            return self._set_group(read_pod_group(obj).key, None)
        return self._set((kind, str(meta.get("namespace") or "default"), str(meta.get("name") or "")), None)

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> set[str]:
        """A full list of one kind of owner."""
        changed: set[str] = set()
        for key in [k for k in self._owners if k[0] == kind]:
            changed |= self._set(key, None)
        if kind == GROUP_KIND:
            for gang in list(self._groups):
                changed |= self._set_group(gang, None)
        for obj in objs:
            changed |= self.put(kind, obj)
        return changed

    def _set(self, key: tuple[str, str, str], owner: Owner | None) -> set[str]:
        if self._owners.get(key) == owner:
            return set()  # a status update: nothing the table keeps changed
        old = self._owners.pop(key, None)
        changed: set[str] = set()
        if old is not None:
            members = self._by_gang.get(old.gang, {})
            members.pop(key, None)
            if not members:
                self._by_gang.pop(old.gang, None)
            changed.add(old.gang)
        if owner is not None:
            self._owners[key] = owner
            self._by_gang.setdefault(owner.gang, {})[key] = owner
            changed.add(owner.gang)
        return changed

    def _set_group(self, gang: str, group: PodGroup | None) -> set[str]:
        if self._groups.get(gang) == group:
            return set()
        if group is None:
            self._groups.pop(gang, None)
        else:
            self._groups[gang] = group
        return {gang}

    def of_gang(self, gang: str) -> list[Owner]:
        return list(self._by_gang.get(gang, {}).values())

    def group(self, gang: str, member: PodInfo | None = None) -> PodGroup | None:
        """The upstream PodGroup that is gang ``gang``, if seen: not where a pod of the gang
        (``member``, or one seen) carries the ``gangslice.io/gang`` label (a plain gang of the
        same name keeps its own sizes, and a PodGroup its pods also join only gates
        kube-scheduler)."""
        group = self._groups.get(gang)
        if group is None or (member is not None and not member.joins_pod_group):
            return None  # the common case, asked on every trim and grow: no scan of the pods
        return None if any(not p.joins_pod_group for p in self._pods_of_gang(gang)) else group

    def sizes(self, gang: str, member: PodInfo | None = None) -> dict[str, PodSetSize] | None:
        """Each pod set's size, summed over the workloads that own its pods, else as the
        upstream PodGroup and its live pods make it (None: neither sizes the gang, so its pods
        size it by annotation)."""
        owned = pod_set_sizes(self.of_gang(gang))
        group = self.group(gang, member) if owned is None else None
        if owned is not None or group is None:
            return owned
        got = group_sizes(group, self._pods_of_gang(gang))
        return {role: PodSetSize(n, n) for role, n in got.sizes.items()}

    def waiting(self, gang: str, member: PodInfo | None = None) -> str | None:
        """Why the upstream PodGroup that is ``gang`` cannot be placed yet (None: it can, or it
        is no such gang). Raises PodError for a PodGroup that cannot be used."""
        group = self.group(gang, member)
        if group is None or self.of_gang(gang):
            return None
        if group.problem:
            raise PodError(group.problem)
        return group_sizes(group, self._pods_of_gang(gang)).waiting

    def required_level(self, gang: str, member: PodInfo) -> str | None:
        """The finer of ``member``'s own required level and the one its gang's upstream PodGroup
        constrains it to. Raises PodError for a topology key that is no level."""
        own = member.required_level
        group = self.group(gang, member)
        if group is None:
            return own
        return self.hierarchy.finer(own, group.required_level(self.hierarchy))

    def template(self, gang: str, pod_set: str) -> PodInfo | None:
        """The pod template of the newest owner of a pod set of ``gang``."""
        owners = [o for o in self.of_gang(gang) if o.pod_set == pod_set]
        return max(owners, key=lambda o: (o.revision, o.name)).template if owners else None


def pod_set_sizes(owners: Iterable[Owner]) -> dict[str, PodSetSize] | None:
    """Per pod set, the sizes of its workloads summed; a Deployment speaks through its newest
    ReplicaSet. Pod sets no workload wants pods for are left out; None without owners."""
    newest: dict[str, Owner] = {}
    for o in owners:
        seen = newest.get(o.workload)
        if seen is None or (o.revision, o.name) > (seen.revision, seen.name):
            newest[o.workload] = o
    if not newest:
        return None
    out: dict[str, PodSetSize] = {}
    for o in newest.values():
        if o.size.desired == 0:
            continue
        got = out.get(o.pod_set, PodSetSize(0, 0))
        out[o.pod_set] = PodSetSize(got.desired + o.size.desired, got.limit + o.size.limit)
    return out


def _count(raw: object, default: int) -> int:
    got = digits(raw) if isinstance(raw, str) else None
    return got if got is not None else default


def _map(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}
