"""Where Kueue lets a Workload's pods run, and the slice and pod set updates that respect it.

Kueue constrains each pod set by its template's nodeSelector, its ResourceFlavor's
``nodeLabels`` and, on a TAS flavor, the ``topologyAssignment`` (domains with pod counts)
it computed at quota reservation. With a topology assignment for every pod set the nodes are
Kueue's choice and gangslice picks the GPUs on them (:func:`place_in_assignment`);
otherwise the solver places the whole gang on the nodes Kueue allows (:func:`solve`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from extender.controllers.kueue.contract import Stage, assignments, pod_sets
from extender.controllers.kueue.workload_gang import describe_request, strict_gang
from extender.kube import names
from extender.kube.api import as_map
from extender.placement.request import GangRequest, Toleration
from extender.placement.scoring import gang_micros, mnnvl_nodes
from extender.placement.slice import Placement, PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import place
from extender.topology.hierarchy import HOSTNAME_LABEL


def iter_topology_domains(ta: Mapping[str, Any]) -> Iterator[tuple[dict[str, str], int]]:
    """(level label -> value, pod count) per domain of a v1beta2 ``topologyAssignment``."""
    levels = [str(x) for x in ta.get("levels") or ()]
    for sl in ta.get("slices") or ():
        counts = as_map(sl.get("podCounts"))
        per_level = list(sl.get("valuesPerLevel") or ())
        for i in range(int(sl.get("domainCount", 0))):
            values: dict[str, str] = {}
            for label, lv in zip(levels, per_level, strict=False):
                if "universal" in lv:
                    values[label] = str(lv["universal"])
                else:
                    ind = as_map(lv.get("individual"))
                    values[label] = f"{ind.get('prefix', '')}{ind['roots'][i]}{ind.get('suffix', '')}"
            count = counts["universal"] if "universal" in counts else counts["individual"][i]
            yield values, int(count)


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class PodSetNodes:
    """Where Kueue lets one pod set run: node labels it must carry (template nodeSelector and
    the flavor's nodeLabels) and, with TAS, the assigned domains and their pod counts."""

    selector: Mapping[str, str] = field(default_factory=dict)
    domains: tuple[tuple[Mapping[str, str], int], ...] = ()
    tas_levels: tuple[str, ...] = ()

    @property
    def constrained(self) -> bool:
        return bool(self.selector or self.domains)

    def allows(self, labels: Mapping[str, str]) -> bool:
        if not _matches(labels, self.selector):
            return False
        return not self.domains or any(_matches(labels, d) for d, _ in self.domains)


def pod_set_nodes(
    wl: Mapping[str, Any], flavor_labels: Mapping[str, Mapping[str, str]]
) -> dict[str, PodSetNodes]:
    """Per pod set, the node constraints Kueue imposes. ``flavor_labels``: ResourceFlavor
    name -> its ``spec.nodeLabels``."""
    assigned = assignments(wl)
    out: dict[str, PodSetNodes] = {}
    for raw in pod_sets(wl):
        name = str(raw.get("name") or "main")
        spec = as_map(as_map(raw.get("template")).get("spec"))
        selector = {str(k): str(v) for k, v in as_map(spec.get("nodeSelector")).items()}
        psa = assigned.get(name, {})
        for flavor in set(as_map(psa.get("flavors")).values()):
            selector.update(flavor_labels.get(str(flavor), {}))
        ta = as_map(psa.get("topologyAssignment"))
        domains = tuple(iter_topology_domains(ta)) if ta else ()
        levels = tuple(str(x) for x in ta.get("levels") or ()) if ta else ()
        out[name] = PodSetNodes(selector, domains, levels)
    return out


def with_flavor_tolerations(
    gang: GangRequest, wl: Mapping[str, Any], tolerations: Mapping[str, Sequence[Toleration]]
) -> GangRequest:
    """The gang with each pod set tolerating what its ResourceFlavors' ``spec.tolerations``
    say (Kueue adds them to the pods it starts, as it adds the flavors' nodeLabels to their
    nodeSelector). ``tolerations``: ResourceFlavor name -> its tolerations."""
    assigned = assignments(wl)
    out = []
    for ps in gang.pod_sets:
        flavors = sorted({str(f) for f in as_map(assigned.get(ps.name, {}).get("flavors")).values()})
        extra = tuple(t for f in flavors for t in tolerations.get(f, ()) if t not in ps.tolerations)
        out.append(replace(ps, tolerations=(*ps.tolerations, *extra)) if extra else ps)
    return replace(gang, pod_sets=tuple(out))


def _only(view: ClusterSnapshot, keep: list[NodeState]) -> ClusterSnapshot:
    if len(keep) == len(view.nodes):
        return view
    return ClusterSnapshot(
        keep, view.hierarchy, dict(view.reserved), dict(view.reserved_mnnvl), memory=view.memory
    )


def restrict(view: ClusterSnapshot, allowed: Mapping[str, PodSetNodes]) -> ClusterSnapshot:
    """The view with only the nodes some pod set may use (all of it while a pod set is
    unconstrained)."""
    if not allowed or not all(a.constrained for a in allowed.values()):
        return view
    return _only(view, [n for n in view.nodes if any(a.allows(n.labels) for a in allowed.values())])


def candidate_views(view: ClusterSnapshot, allowed: Mapping[str, PodSetNodes]) -> list[ClusterSnapshot]:
    """The views the solver tries (it takes one snapshot for the whole gang): first the nodes
    every pod set may use, where any slice meets every pod set's constraints; then the nodes
    some pod set may use, where :func:`assignment_problem` checks each pod set's slots."""
    if not any(a.constrained for a in allowed.values()):
        return [view]
    every = _only(view, [n for n in view.nodes if all(a.allows(n.labels) for a in allowed.values())])
    some = restrict(view, allowed)
    views = [v for v in (every, some) if v.nodes]
    if len(views) == 2 and len(views[0].nodes) == len(views[1].nodes):
        views.pop()
    return views or [some]


def assignment_problem(sl: Slice, snap: ClusterSnapshot, allowed: Mapping[str, PodSetNodes]) -> str | None:
    """Why the slice breaks Kueue's constraints (a node outside a pod set's flavor or
    assigned domains, or per-domain pod counts that differ from Kueue's), or None."""
    for pod_set, rule in allowed.items():
        slots = [s for s in sl.slots if s.pod_set == pod_set]
        for s in slots:
            if not rule.allows(snap.node(s.node).labels):
                return f"pod set {pod_set}: node {s.node} is outside the nodes Kueue admitted it to"
        if rule.domains:
            for values, count in rule.domains:
                got = sum(1 for s in slots if _matches(snap.node(s.node).labels, values))
                if got != count:
                    where = ",".join(f"{k}={v}" for k, v in values.items())
                    return (
                        f"pod set {pod_set}: Kueue's topology assignment puts {count} pod(s) in "
                        f"{where}; the slice puts {got}"
                    )
    return None


def solver(
    stage: Stage, allowed: Mapping[str, PodSetNodes], widen_at: str
) -> Callable[[ClusterSnapshot, GangRequest], Placement]:
    """:func:`solve` for one stage and set of allowed nodes, as the reserve path takes it."""
    return lambda view, gang: solve(view, gang, stage, allowed, widen_at)


def solve(
    view: ClusterSnapshot, gang: GangRequest, stage: Stage, allowed: Mapping[str, PodSetNodes], widen_at: str
) -> Placement:
    """Place the gang on ``view`` (its own hold already excluded) where Kueue allows.

    With a topology assignment on every pod set, the GPUs are picked inside Kueue's domains.
    Otherwise the solver places the gang on the :func:`candidate_views` in turn, and
    :func:`assignment_problem` checks each pod set against its own constraints. While
    STRICT, the gang holds out for its preferred levels, unless they cannot be met even on an
    empty cluster; ``widen_at`` says until when (for the message).
    """
    if allowed and all(a.domains for a in allowed.values()):
        return place_in_assignment(view, gang, allowed)
    views = candidate_views(view, allowed)
    strict = strict_gang(gang, view.hierarchy) if stage is Stage.STRICT else None
    if strict is not None:
        got = _place_on(views, strict, allowed)
        if isinstance(got, Slice):
            return got
        if got.feasible_when_empty:
            return Unplaceable(
                gang.name,
                f"holding out for the preferred levels ({describe_request(strict)}) until {widen_at}: "
                f"{got.reason}",
                got.pod_set,
                got.closest,
                got.short_by,
                got.feasible_when_empty,
            )
    return _place_on(views, gang, allowed)


def _place_on(
    views: Sequence[ClusterSnapshot], gang: GangRequest, allowed: Mapping[str, PodSetNodes]
) -> Placement:
    """The first slice that meets Kueue's constraints; else the broadest view's reason."""
    got: Placement | None = None
    for v in views:
        got = place(v, gang)
        if isinstance(got, Slice):
            problem = assignment_problem(got, v, allowed)
            if problem is None:
                return got
            got = Unplaceable(gang.name, problem)
    assert got is not None
    return got


def place_in_assignment(
    view: ClusterSnapshot, gang: GangRequest, allowed: Mapping[str, PodSetNodes]
) -> Placement:
    """Kueue TAS chose the domains and how many pods go to each: pick, domain by domain, the
    GPUs those pods get (each pod's in-node rules still hold), on what is free."""
    h = view.hierarchy
    held: dict[str, set[int]] = {n: set(g) for n, g in view.reserved.items()}
    slots: list[PodSlot] = []
    for ps in gang.pod_sets:
        rule = allowed.get(ps.name, PodSetNodes())
        index = 0
        for values, count in rule.domains:
            where = ",".join(f"{k}={v}" for k, v in values.items())
            members = [n for n in view.nodes if rule.allows(n.labels) and _matches(n.labels, values)]
            part = GangRequest(gang.name, (replace(ps, count=count, colocate_with=None),))
            sub = ClusterSnapshot(
                members,
                h,
                {n: frozenset(g) for n, g in held.items()},
                dict(view.reserved_mnnvl),
                memory=view.memory,
            )
            got = place(sub, part) if members else Unplaceable(gang.name, "no such node in the cluster")
            if isinstance(got, Unplaceable):
                return Unplaceable(
                    gang.name,
                    f"pod set {ps.name}: in Kueue's assigned domain {where}: {got.reason}",
                    ps.name,
                    where,
                    max(got.short_by, 1),
                )
            for s in got.slots:
                slots.append(replace(s, pod_set=ps.name, index=index))
                held.setdefault(s.node, set()).update(s.gpus)
                index += 1
    return Slice(
        gang=gang.name,
        slots=tuple(slots),
        pod_set_micros=gang_micros(view, gang, slots),
        domains={ps.name: "Kueue's topology assignment" for ps in gang.pod_sets},
        mnnvl_nodes=mnnvl_nodes(view, gang, slots),
    )


# -- Ready: pod set updates --------------------------------------------------------------------


def shared_domain_selector(snap: ClusterSnapshot, nodes: Sequence[str]) -> dict[str, str]:
    """Node labels naming the finest domain every one of ``nodes`` shares: the hostname for
    one node, else the labels of the common hierarchy path; empty when they share none."""
    unique = sorted(set(nodes))
    if not unique:
        return {}
    if len(unique) == 1:
        labels = snap.node(unique[0]).labels
        return {HOSTNAME_LABEL: labels.get(HOSTNAME_LABEL, unique[0])}
    h = snap.hierarchy
    paths = [snap.path_of(n) for n in unique]
    level = h.common_level(paths)
    if level < 0:
        return {}
    return {h.levels[i].label: str(v) for i, v in enumerate(paths[0][: level + 1]) if v is not None}


def pod_set_updates(
    wl: Mapping[str, Any],
    sl: Slice,
    snap: ClusterSnapshot,
    reservation: str,
    allowed: Mapping[str, PodSetNodes] | None = None,
    pinned: Collection[str] = (),
) -> list[dict[str, Any]]:
    """One update per pod set of the Workload: our reservation annotation and, when every
    pod of the set shares one domain, a nodeSelector for it. Keys the template or the
    flavor already sets, and TAS level keys (Kueue's ungater writes those), are left out.
    The pod sets in ``pinned`` (GPUs through a DRA claim) also get the label
    ``gangslice.io/managed: "true"``, which sends their pods to the admission webhook that
    pins each one's claim with ``failurePolicy: Fail``."""
    allowed = allowed or {}
    updates: list[dict[str, Any]] = []
    for raw in pod_sets(wl):
        name = str(raw.get("name") or "main")
        update: dict[str, Any] = {"name": name, "annotations": {names.RESERVATION: reservation}}
        if name in pinned:
            update["labels"] = {names.MANAGED: "true"}
        nodes = [s.node for s in sl.slots if s.pod_set == name]
        rule = allowed.get(name, PodSetNodes())
        taken = set(rule.selector) | set(rule.tas_levels)
        selector = {k: v for k, v in shared_domain_selector(snap, nodes).items() if k not in taken}
        if selector:
            update["nodeSelector"] = selector
        updates.append(update)
    return updates
