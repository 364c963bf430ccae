"""The gang a Kueue Workload asks for, from its pod sets and their pod templates.

One pod set per ``spec.podSets`` entry: its count as admitted (partial admission may lower
it), GPUs per pod from the template's ``nvidia.com/gpu`` requests/limits, what its pods ask
of a node (node selector and affinity, tolerations, requests: :mod:`extender.kube.pod_needs`;
a field that cannot be read rejects the Workload naming it), and the levels
from the template's ``gangslice.io/*`` annotations, else from Kueue's ``topologyRequest``
or its ``kueue.x-k8s.io/podset-{required,preferred}-topology`` annotations (label keys,
understood when they are levels of gangslice's hierarchy), so a Kueue TAS user changes
nothing. Kueue's ``podset-group-name`` (leader and workers together) becomes a colocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from extender.controllers.kueue.contract import assignments, gang_key, pod_sets
from extender.cost import Comm
from extender.kube import names
from extender.kube.api import as_map
from extender.kube.pod_needs import NeedsError, pod_needs
from extender.kube.pods import PodError, gpu_request
from extender.placement.request import Colocation, GangRequest, PodSet, split_colocation
from extender.placement.scoring import LevelError, resolve_level
from extender.topology.hierarchy import Hierarchy


class WorkloadError(ValueError):
    """A Workload whose gangslice settings cannot be used; the message says which and why."""


def _template_value(template: Mapping[str, Any], key: str) -> str | None:
    meta = as_map(template.get("metadata"))
    for part in ("annotations", "labels"):
        got = as_map(meta.get(part)).get(key)
        if isinstance(got, str) and got:
            return got
    return None


def _check_level(value: str, h: Hierarchy, where: str) -> str:
    try:
        resolve_level(value, h)
    except LevelError as exc:
        raise WorkloadError(f"{where}: {exc}") from None
    return value


def _kueue_level(value: str | None, h: Hierarchy, notes: list[str], where: str) -> str | None:
    """A Kueue topology level (a node label key) as one of our levels; one we do not model
    is left to Kueue's own topology assignment."""
    if not value:
        return None
    try:
        resolve_level(value, h)
    except LevelError:
        notes.append(f"{where}: level {value} is not in gangslice's hierarchy; left to Kueue")
        return None
    index = h.index_of(value)
    return h.levels[index].name if index is not None else value


@dataclass(frozen=True)
class WorkloadGang:
    request: GangRequest
    #: Kueue annotations we could not map, and similar remarks.
    notes: tuple[str, ...] = ()


def gang_from_workload(
    wl: Mapping[str, Any], h: Hierarchy, claim_gpus: Mapping[str, int] | None = None
) -> WorkloadGang:
    """The gang a Workload asks for: one pod set per ``spec.podSets`` entry, its count as
    admitted (partial admission may lower it), GPUs per pod from the template's containers
    plus ``claim_gpus[pod set]`` (the GPUs its ``gpu.nvidia.com`` ResourceClaimTemplate asks
    for, which the admission webhook pins per slot), levels from ``gangslice.io/*``
    annotations, else Kueue's ``topologyRequest`` or its ``podset-*-topology`` annotations.
    Raises :class:`WorkloadError`."""
    key = gang_key(wl)
    notes: list[str] = []
    assigned = assignments(wl)
    wanted: list[PodSet] = []
    groups: dict[str, list[tuple[str, int, str | None]]] = {}
    raw_sets = pod_sets(wl)
    if not raw_sets:
        raise WorkloadError(f"workload {key}: spec.podSets is empty")
    for raw in raw_sets:
        name = str(raw.get("name") or "main")
        where = f"workload {key}: pod set {name}"
        template = as_map(raw.get("template"))
        count = raw.get("count", 1)
        admitted = assigned.get(name, {}).get("count")
        if isinstance(admitted, int):
            count = admitted
        if not isinstance(count, int) or count < 0:
            raise WorkloadError(f"{where}: count {count!r} is not a pod count")
        if count == 0:
            continue
        try:
            gpus = gpu_request(as_map(template.get("spec"))) + (claim_gpus or {}).get(name, 0)
            needs = pod_needs(as_map(template.get("spec")), "template.spec")
        except (PodError, NeedsError) as exc:
            raise WorkloadError(f"{where}: {exc}") from None
        topo = as_map(raw.get("topologyRequest"))
        required = _template_value(template, names.REQUIRED_LEVEL)
        preferred = _template_value(template, names.PREFERRED_LEVEL)
        if required:
            required = _check_level(required, h, f"{where}: {names.REQUIRED_LEVEL}")
        else:
            kueue_req = topo.get("required") or _template_value(template, names.KUEUE_REQUIRED_TOPOLOGY)
            required = _kueue_level(kueue_req, h, notes, where)
        if preferred:
            preferred = _check_level(preferred, h, f"{where}: {names.PREFERRED_LEVEL}")
        else:
            kueue_pref = topo.get("preferred") or _template_value(template, names.KUEUE_PREFERRED_TOPOLOGY)
            preferred = _kueue_level(kueue_pref, h, notes, where)
        comm_text = _template_value(template, names.COMM)
        try:
            comm = Comm(comm_text) if comm_text else Comm.NONE
        except ValueError:
            known = ", ".join(c.value for c in Comm)
            raise WorkloadError(f"{where}: {names.COMM}={comm_text!r} is not one of {known}") from None
        colocate = _colocation(_template_value(template, names.COLOCATE_WITH), h, where)
        group = topo.get("podSetGroupName") or _template_value(template, names.KUEUE_PODSET_GROUP_NAME)
        if isinstance(group, str) and group and colocate is None:
            groups.setdefault(group, []).append((name, count, required or preferred))
        wanted.append(needs.on(PodSet(name, count, gpus, comm, required, preferred, colocate)))
    if not wanted:
        raise WorkloadError(f"workload {key}: every pod set has count 0")
    wanted = _group_colocations(wanted, groups)
    try:
        return WorkloadGang(GangRequest(key, tuple(wanted)), tuple(notes))
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None


def _colocation(value: str | None, h: Hierarchy, where: str) -> Colocation | None:
    if not value:
        return None
    try:
        pod_set, named = split_colocation(value)
    except ValueError as exc:
        raise WorkloadError(f"{where}: {names.COLOCATE_WITH}: {exc}") from None
    level = named or "node"
    _check_level(level, h, f"{where}: {names.COLOCATE_WITH}")
    return Colocation(pod_set, level)


def _group_colocations(
    pod_sets: list[PodSet], groups: Mapping[str, list[tuple[str, int, str | None]]]
) -> list[PodSet]:
    """Kueue's ``podset-group-name`` (leader + workers placed together): the smaller pod sets
    of a group share the largest one's domain at the group's level."""
    extra: dict[str, Colocation] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        anchor = max(members, key=lambda m: (m[1], m[0]))
        for name, _, level in members:
            if name != anchor[0]:
                extra[name] = Colocation(anchor[0], level or anchor[2] or "node")
    return [replace(ps, colocate_with=extra[ps.name]) if ps.name in extra else ps for ps in pod_sets]


def strict_gang(gang: GangRequest, h: Hierarchy) -> GangRequest | None:
    """The gang with every preferred level made required, where the two can be combined
    into one level; None when nothing changes (no pod set has a usable preference)."""
    changed = False
    out: list[PodSet] = []
    for ps in gang.pod_sets:
        if ps.preferred_level and _can_tighten(ps, h):
            out.append(replace(ps, required_level=ps.preferred_level, preferred_level=None))
            changed = True
        else:
            out.append(ps)
    return replace(gang, pod_sets=tuple(out)) if changed else None


def _can_tighten(ps: PodSet, h: Hierarchy) -> bool:
    assert ps.preferred_level is not None
    p_scope, p_tier = resolve_level(ps.preferred_level, h)
    if not ps.required_level:
        return True
    r_scope, r_tier = resolve_level(ps.required_level, h)
    if r_tier is None and r_scope is not None:  # a network level: prefer a finer one or a node
        return p_scope is not None and p_scope > r_scope
    if r_scope is None and r_tier is not None:  # an in-node level: prefer a tighter one
        return p_scope is None and p_tier is not None and p_tier < r_tier
    return False  # required "node": an in-node preference cannot be combined with it


def describe_request(gang: GangRequest) -> str:
    parts = []
    for ps in gang.pod_sets:
        where = []
        if ps.required_level:
            where.append(f"within {ps.required_level}")
        if ps.preferred_level:
            where.append(f"preferring {ps.preferred_level}")
        parts.append(
            f"{ps.name} {ps.count}x{ps.gpus_per_pod} GPUs" + (f" ({', '.join(where)})" if where else "")
        )
    return "; ".join(parts)
