"""Volcano PodGroups as gangs: the rules (no I/O).

A PodGroup (``scheduling.volcano.sh/v1beta1``) is a gang of ``minMember`` pods; its pods
carry the annotation ``scheduling.k8s.io/group-name: <podgroup>`` and ``schedulerName:
volcano``. The gang key is ``<namespace>/<podgroup>``, the key the Volcano extender
endpoints look reservations up by.

The request is built from the member pods once at least ``minMember`` of them exist: one pod
set per task role (``volcano.sh/task-spec``, else ``gangslice.io/pod-set``, else ``pods``),
each as large as the pods of that role present (or the role's ``minTaskMember`` when more
pods are present), GPUs per pod from the role's first pod, communication and levels from the
``gangslice.io/*`` annotations of that pod (else of the PodGroup).

``spec.networkTopology`` maps onto our levels by tier, as Volcano HyperNodes from ``gangslice
hypernodes`` do: tier 1 is the finest hierarchy level any node is labelled with, tier 2 the
next coarser one, and so on; ``highestTierName`` is a level name. ``mode: hard`` makes the
level required for every pod set (unless a pod asks for a finer one); ``soft`` makes it a
preferred level. A tier above the coarsest level constrains nothing (Volcano's cluster root).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.controllers.api import PODGROUP_GROUP, PODGROUP_VERSION
from extender.cost import Comm
from extender.kube import names
from extender.kube.api import as_map
from extender.kube.pods import PodError, PodInfo
from extender.placement.request import GangRequest, PodSet
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.hierarchy import Hierarchy

PODGROUP_API_VERSION = f"{PODGROUP_GROUP}/{PODGROUP_VERSION}"
PODGROUP_KIND = "PodGroup"
VOLCANO_SCHEDULER = "volcano"
DEFAULT_ROLE = "pods"


class PodGroupError(ValueError):
    """A PodGroup or member pod gangslice cannot turn into a gang; the message says why."""


@dataclass(frozen=True, slots=True)
class Topology:
    """``spec.networkTopology``: mode plus at most one of tier number and tier name."""

    hard: bool = True
    tier: int | None = None
    tier_name: str | None = None


@dataclass(frozen=True, slots=True)
class PodGroup:
    namespace: str
    name: str
    uid: str = ""
    min_member: int = 1
    min_task_member: Mapping[str, int] = field(default_factory=dict)
    topology: Topology | None = None
    phase: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    deleting: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def completed(self) -> bool:
        return self.phase == "Completed"

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> PodGroup:
        meta = as_map(obj.get("metadata"))
        spec = as_map(obj.get("spec"))
        status = as_map(obj.get("status"))
        where = f"PodGroup {meta.get('namespace', '?')}/{meta.get('name', '?')}"
        min_member = spec.get("minMember", 1)
        if isinstance(min_member, bool) or not isinstance(min_member, int) or min_member < 0:
            raise PodGroupError(f"{where}: spec.minMember {min_member!r} is not a count")
        per_task = {str(k): v for k, v in as_map(spec.get("minTaskMember")).items() if isinstance(v, int)}
        topo: Topology | None = None
        nt = spec.get("networkTopology")
        if isinstance(nt, Mapping):
            mode = nt.get("mode", "hard")
            if mode not in ("hard", "soft"):
                raise PodGroupError(f"{where}: networkTopology.mode {mode!r} is not hard or soft")
            tier, tier_name = nt.get("highestTierAllowed"), nt.get("highestTierName")
            if tier is not None and tier_name is not None:
                raise PodGroupError(f"{where}: highestTierAllowed and highestTierName are both set")
            if tier is not None and (isinstance(tier, bool) or not isinstance(tier, int) or tier < 0):
                raise PodGroupError(f"{where}: highestTierAllowed {tier!r} is not a tier")
            topo = Topology(mode == "hard", tier, str(tier_name) if tier_name is not None else None)
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            min_member=min_member,
            min_task_member=per_task,
            topology=topo,
            phase=str(status.get("phase") or ""),
            labels=_str_map(meta.get("labels")),
            annotations=_str_map(meta.get("annotations")),
            resource_version=str(meta.get("resourceVersion") or ""),
            deleting=meta.get("deletionTimestamp") is not None,
        )


def member_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup key ``<namespace>/<name>`` a Volcano pod belongs to, or None."""
    spec = as_map(pod.get("spec"))
    if spec.get("schedulerName") != VOLCANO_SCHEDULER:
        return None
    info = PodInfo.from_obj(pod)
    return info.volcano_group


def role_of(pod: PodInfo) -> str:
    return pod.pod_set or DEFAULT_ROLE


# -- networkTopology ------------------------------------------------------------------------------


def present_levels(h: Hierarchy, node_labels: Iterable[Mapping[str, str]]) -> list[int]:
    """Indices of the levels at least one node is labelled with, coarsest first."""
    used = {i for labels in node_labels for i, lv in enumerate(h.levels) if labels.get(lv.label)}
    return sorted(used)


def level_tiers(h: Hierarchy, snap: ClusterSnapshot) -> dict[int, int]:
    """Volcano tier -> level index: tier 1 is the finest present level."""
    present = present_levels(h, (n.labels for n in snap.nodes))
    return {t: idx for t, idx in enumerate(reversed(present), start=1)}


def topology_level(topo: Topology, h: Hierarchy, snap: ClusterSnapshot) -> str | None:
    """The level name a networkTopology bounds a gang to, or None for no bound."""
    if topo.tier_name is not None:
        idx = h.index_of(topo.tier_name)
        if idx is None:
            # Volcano skips an unknown tier name (no constraint); we say so rather than guess.
            known = ", ".join(lv.name for lv in h.levels)
            raise PodGroupError(
                f"networkTopology.highestTierName {topo.tier_name!r} is not a level ({known})"
            )
        return h.levels[idx].name
    if topo.tier is None:
        return None
    if topo.tier == 0:
        return "node"
    tiers = level_tiers(h, snap)
    idx = tiers.get(topo.tier)
    return h.levels[idx].name if idx is not None else None


# -- the request ---------------------------------------------------------------------------------


def _comm(raw: str | None, where: str) -> Comm:
    if raw is None:
        return Comm.NONE
    try:
        return Comm(raw)
    except ValueError:
        known = ", ".join(c.value for c in Comm)
        raise PodGroupError(f"{where}: {names.COMM}={raw!r} is not one of {known}") from None


def members_by_role(pods: Iterable[PodInfo]) -> dict[str, list[PodInfo]]:
    out: dict[str, list[PodInfo]] = {}
    for p in sorted(pods, key=lambda p: p.name):
        if not p.terminal and not p.deleting:
            out.setdefault(role_of(p), []).append(p)
    return out


def missing_pods(pg: PodGroup, pods: Sequence[PodInfo]) -> int:
    """How many more member pods must exist before the gang can be placed."""
    live = sum(len(v) for v in members_by_role(pods).values())
    return max(0, pg.min_member - live)


def gang_request(pg: PodGroup, pods: Sequence[PodInfo], snap: ClusterSnapshot) -> GangRequest:
    """The gang request of ``pg`` from its member pods (at least ``minMember`` of them)."""
    roles = members_by_role(pods)
    if not roles:
        raise PodGroupError(f"PodGroup {pg.key}: no member pods")
    h = snap.hierarchy
    bound = topology_level(pg.topology, h, snap) if pg.topology else None
    pod_sets = []
    for role, members in roles.items():
        first = members[0]
        if first.problems or first.needs_problem:
            raise PodGroupError(first.problems[0] if first.problems else str(first.needs_problem))
        count = len(members)
        wanted = pg.min_task_member.get(role)
        if wanted is not None and 0 < wanted < count:
            count = wanted
        where = f"PodGroup {pg.key} role {role}"
        comm = _comm(first.comm or pg.annotations.get(names.COMM), where)
        required = first.required_level or pg.annotations.get(names.REQUIRED_LEVEL)
        preferred = first.preferred_level or pg.annotations.get(names.PREFERRED_LEVEL)
        if bound is not None and pg.topology is not None:
            if pg.topology.hard:
                required = h.finer(required, bound)
            else:
                preferred = h.finer(preferred, bound)
        for p in members[1:]:
            if p.gpus != first.gpus:
                raise PodGroupError(
                    f"{where}: pods {first.name} and {p.name} ask for {first.gpus} and {p.gpus} GPUs; "
                    f"give them different {names.VOLCANO_TASK_SPEC} roles"
                )
        pod_sets.append(
            first.needs.on(
                PodSet(
                    name=role,
                    count=count,
                    gpus_per_pod=first.gpus,
                    comm=comm,
                    required_level=required,
                    preferred_level=preferred,
                )
            )
        )
    try:
        return GangRequest(name=pg.key, pod_sets=tuple(pod_sets))
    except ValueError as exc:
        raise PodGroupError(str(exc)) from None


def pod_infos(objs: Iterable[Mapping[str, Any]]) -> list[PodInfo]:
    out = []
    for o in objs:
        try:
            out.append(PodInfo.from_obj(o))
        except PodError:
            continue
    return out


def annotation_patch(obj: Mapping[str, Any], wanted: Mapping[str, str | None]) -> dict[str, Any] | None:
    """``obj`` with our annotations set (None removes one), keeping its resourceVersion; None
    when nothing would change."""
    meta = dict(as_map(obj.get("metadata")))
    current = dict(_str_map(meta.get("annotations")))
    changed = False
    for k, v in wanted.items():
        if v is None:
            changed |= current.pop(k, None) is not None
        elif current.get(k) != v:
            current[k] = v
            changed = True
    if not changed:
        return None
    out = dict(obj)
    meta["annotations"] = current
    out["metadata"] = meta
    return out


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}
