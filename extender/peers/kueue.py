"""Kueue Topology-Aware Scheduling at admission, on a ClusterQueue with one ResourceFlavor
per GPU model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.peers.common import Fail, Work, admitted, run_policy
from extender.placement import feasibility
from extender.placement.request import GangRequest, NodeRequirement, PodSet
from extender.placement.scoring import ANYWHERE, node_scope, resolve_need
from extender.placement.slice import Placement
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.gpus import PRODUCT_LABEL, gpu_spec

# -- the ClusterQueue's ResourceFlavors --------------------------------------------------

#: The name of the flavor of the nodes that carry no ``nvidia.com/gpu.product`` label.
UNLABELLED = "no-gpu-product-label"


@dataclass(frozen=True, slots=True)
class Flavor:
    """One ResourceFlavor of the modelled ClusterQueue: its ``nodeLabels`` and the nodes
    that match them (node indices in snapshot order)."""

    name: str
    node_labels: Mapping[str, str]
    nodes: tuple[int, ...]


def resource_flavors(snap: ClusterSnapshot) -> list[Flavor]:
    """The flavors in the order the ClusterQueue lists them: one per ``nvidia.com/gpu.product``
    value present, cheapest model first (:attr:`~extender.topology.gpus.GpuSpec.price_order`;
    models the table does not know after the known ones; ties by name), then one flavor for
    the nodes without the label. A TAS flavor needs at least one nodeLabel
    (apis/kueue/v1beta2/resourceflavor_types.go); that last flavor stands for a pool the
    administrator labels by another key, so its nodeLabels never name the product key."""
    products = snap.per_node(("kueue-tas", PRODUCT_LABEL), lambda n: n.labels.get(PRODUCT_LABEL))
    members: dict[str | None, list[int]] = {}
    for i, product in enumerate(products):
        members.setdefault(product, []).append(i)

    def order(product: str) -> tuple[int, int, str]:
        spec = gpu_spec(product)
        return (0, spec.price_order, product) if spec is not None else (1, 0, product)

    out = [
        Flavor(product, {PRODUCT_LABEL: product}, tuple(members[product]))
        for product in sorted((p for p in members if p is not None), key=order)
    ]
    if None in members:
        out.append(Flavor(UNLABELLED, {}, tuple(members[None])))
    return out


def flavor_allows(flavor: Flavor, ps: PodSet) -> bool:
    """Whether the pod set's node requirements leave ``flavor`` in the running
    (pkg/scheduler/flavorassigner/flavorassigner.go ``checkFlavorForPodSets`` and
    ``flavorSelector``, v0.19.2): the nodeSelector and each required node-affinity term keep
    only the requirements on keys of the flavor's own nodeLabels and are matched against those
    labels as if they were a node's; a term left with no requirement lets any flavor through
    (the terms are ORed), and ``matchFields`` terms are not consulted. The flavors carry no
    ``nodeTaints``, so tolerations decide nothing here (TAS still applies them per node)."""
    labels = flavor.node_labels
    if not all(r.matches(labels) for r in ps.node_selector if r.key in labels):
        return False
    kept: list[list[NodeRequirement]] = []
    for term in ps.affinity:
        own = [r for r in term.expressions if r.key in labels]
        if not own:
            return True
        kept.append(own)
    return not kept or any(all(r.matches(labels) for r in own) for own in kept)


# -- Kueue TAS --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Domain:
    """A domain in Kueue's tree with its capacity in pods (``podCount``)."""

    count: int
    values: tuple[str, ...]
    nodes: tuple[int, ...]


def _pods_fit(work: Work, i: int, ps: PodSet) -> int:
    """Kueue's leaf capacity (``fillLeafCounts``): copies of the pod's request that fit the
    node's free resources, counted (``CountInWithLimitingResource``: not capped at the pod
    set's size, so a pod set without GPUs still tells a full node from an empty one). No device
    model, so no NVLink or PCIe coherence."""
    room = work.room(i, ps) if work.limits else feasibility.UNLIMITED
    if ps.gpus_per_pod == 0:
        return room if room < feasibility.UNLIMITED else ps.count
    fit = work.free(i).bit_count() // ps.gpus_per_pod
    return fit if fit < room else room


def _domains_at(snap: ClusterSnapshot, level: int, counts: dict[int, int]) -> list[_Domain]:
    """Every domain at ``level`` (a hierarchy level index, or ``node_scope`` for single nodes)."""
    if level >= node_scope(snap.hierarchy):
        # A hostname-level domain's values are its whole path, hostname last, so domains
        # sort by topology path, then name (Kueue's "level values asc").
        return [_Domain(c, _node_values(snap, i), (i,)) for i, c in counts.items()]
    out = []
    for (lv, values), members in snap.domains().items():
        if lv == level:
            total = sum(counts.get(i, 0) for i in members)
            out.append(_Domain(total, tuple(v or "" for v in values), tuple(members)))
    return out


def _node_values(snap: ClusterSnapshot, i: int) -> tuple[str, ...]:
    return (*(v or "" for v in snap.path(i)), snap.nodes[i].name)


def _children(
    snap: ClusterSnapshot, nodes: Sequence[int], level: int, counts: dict[int, int]
) -> list[_Domain]:
    """The child domains of a domain, one level down (nodes below the last hierarchy level).
    A node without the level's label is a child of its own."""
    if level >= node_scope(snap.hierarchy):
        return [_Domain(counts.get(i, 0), (snap.nodes[i].name,), (i,)) for i in nodes]
    groups: dict[str, list[int]] = {}
    for i in nodes:
        label = snap.path(i)[level]
        groups.setdefault(label if label is not None else f"\0{snap.nodes[i].name}", []).append(i)
    return [_Domain(sum(counts.get(i, 0) for i in v), (k,), tuple(v)) for k, v in groups.items()]


def _take_minimum(children: list[_Domain], need: int, least_free: bool) -> list[tuple[_Domain, int]]:
    """``updateCountsToMinimumGeneric``: children in sorted order until the pods fit (BestFit:
    most pods first, so the fewest children; LeastFreeCapacity: fewest pods first, so the
    fullest), the last one swapped for the tightest child that still holds the rest."""
    if least_free:
        order = sorted(children, key=lambda d: (d.count, d.values))
    else:
        order = sorted(children, key=lambda d: (-d.count, d.values))
    out: list[tuple[_Domain, int]] = []
    remaining = need
    for k, child in enumerate(order):
        if child.count <= 0:
            continue
        if child.count >= remaining:
            last = min((d for d in order[k:] if d.count >= remaining), key=lambda d: (d.count, d.values))
            out.append((last, remaining))
            return out
        out.append((child, child.count))
        remaining -= child.count
    raise AssertionError("children hold fewer pods than their parent counted")


def _descend(
    snap: ClusterSnapshot,
    work: Work,
    ps: PodSet,
    nodes: Sequence[int],
    level: int,
    need: int,
    counts: dict[int, int],
    least_free: bool,
) -> None:
    """Walk down from a chosen domain to nodes, then give each node its pods (the GPUs it hands out)."""
    if level > node_scope(snap.hierarchy):
        for _ in range(need):
            work.take(ps, nodes[0])
        return
    for child, n in _take_minimum(_children(snap, nodes, level, counts), need, least_free):
        _descend(snap, work, ps, child.nodes, level + 1, n, counts, least_free)


def topology_assignment(snap: ClusterSnapshot, work: Work, ps: PodSet, flavor: Flavor) -> Fail | None:
    """``findTopologyAssignment`` for one pod set inside one flavor: only the flavor's nodes
    count (pkg/cache/scheduler/tas_flavor_snapshot.go, v0.19.2: a TAS flavor's snapshot holds
    the nodes that match its nodeLabels, ``NodeMatchesFlavor`` in pkg/util/tas/node.go), and of
    those the ones the pod's own selector, affinity and tolerations admit. Books the pods on
    ``work``; on a miss books nothing and says why."""
    h = snap.hierarchy
    need = resolve_need(ps, h)
    counts = {i: c for i in admitted(snap, ps, flavor.nodes) if (c := _pods_fit(work, i, ps)) > 0}
    total = sum(counts.values())
    cluster_short = Fail(
        ps.name,
        f"pod set {ps.name}: the nodes of flavor {flavor.name} have room for {total} of {ps.count} pods",
        ps.count - total,
    )
    if need.preferred_scope is None and need.scope == ANYWHERE:
        # Unconstrained (implied TAS): ``levelKeyWithImpliedFallback`` searches the lowest
        # level (hostname), and ``findLevelWithFitDomains`` with LeastFreeCapacity sorts every
        # node at once (``sortedDomains``: podCount asc, then level values asc), takes the
        # first that holds every pod, else takes nodes in that order until all are placed
        # (no recursion upwards for unconstrained, no best-fit swap of the last one).
        if total < ps.count:
            return cluster_short
        order = sorted(_domains_at(snap, node_scope(h), counts), key=lambda d: (d.count, d.values))
        first = next((d for d in order if d.count >= ps.count), None)
        remaining = ps.count
        for d in [first] if first is not None else order:
            n = min(d.count, remaining)
            for _ in range(n):
                work.take(ps, d.nodes[0])
            remaining -= n
            if remaining == 0:
                break
        return None
    if need.preferred_scope is not None:
        # podset-preferred-topology: that level, then one level up at a time.
        levels = list(range(need.preferred_scope, max(need.scope, 0) - 1, -1))
    else:
        levels = [need.scope]  # podset-required-topology: that level only
    best: _Domain | None = None
    for level in levels:
        domains = _domains_at(snap, level, counts)
        fitting = [d for d in domains if d.count >= ps.count]
        if fitting:
            chosen = min(fitting, key=lambda d: (d.count, d.values))  # BestFit: least left over
            _descend(snap, work, ps, chosen.nodes, level + 1, ps.count, counts, least_free=False)
            return None
        best = max(domains, key=lambda d: d.count, default=None)
    if need.scope == ANYWHERE:
        # Preferred only, and no single top-level domain fits: admitted as distributed.
        if total < ps.count:
            return cluster_short
        _descend(snap, work, ps, list(counts), 0, ps.count, counts, least_free=False)
        return None
    level_name = h.levels[need.scope].name if need.scope < len(h.levels) else "node"
    have = best.count if best is not None else 0
    return Fail(
        ps.name,
        f"pod set {ps.name}: no {level_name} has room for {ps.count} pods of {ps.gpus_per_pod} GPUs "
        f"in flavor {flavor.name} (counting GPUs only)",
        ps.count - have,
        best.values[-1] if best is not None else None,
    )


def _kueue_core(snap: ClusterSnapshot, gang: GangRequest, work: Work) -> Fail | None:
    """Scheduling cycles on this snapshot until the gang is admitted or Kueue stops retrying.

    One cycle (``FlavorAssigner.assignFlavors``): each pod set, in order, takes the first flavor
    from its scan position on that its node requirements allow (quota always fits); a pod set
    with none left ends the cycle (NoFit). Then TAS runs for every pod set in its flavor; a miss
    turns the assignment to Preempt or NoFit, and with no preemption targets the gang waits.
    Each pod set's ``TriedFlavorIdx`` is the flavor it got, -1 for the ClusterQueue's last
    (``findFlavorForPodSets``); the next cycle resumes each pod set after it
    (``NextFlavorToTryForPodSetResource``, pkg/workload/workload.go) and comes at once while any
    pod set has flavors left (``PendingFlavors``, ``requeueIfNotPresent`` in
    pkg/cache/queue/cluster_queue.go). A pod set that found no flavor, and those after it,
    start from the first flavor again."""
    flavors = resource_flavors(snap)
    allowed = [[k for k, f in enumerate(flavors) if flavor_allows(f, ps)] for ps in gang.pod_sets]
    last = len(flavors) - 1
    start = [0] * len(gang.pod_sets)
    seen: set[tuple[int, ...]] = set()
    first: Fail | None = None
    tried: list[str] = []
    while tuple(start) not in seen:  # a repeated scan position repeats the cycle: never admitted
        seen.add(tuple(start))
        chosen: list[int] = []
        fail: Fail | None = None
        for p, ps in enumerate(gang.pod_sets):
            k = next((k for k in allowed[p] if k >= start[p]), None)
            if k is None:
                fail = _no_flavor(ps, flavors, start[p])
                break
            chosen.append(k)
        if fail is None:
            trial = work.copy()
            for ps, k in zip(gang.pod_sets, chosen, strict=True):
                fail = topology_assignment(snap, trial, ps, flavors[k])
                if fail is not None:
                    tried.append(flavors[k].name)
                    break
            if fail is None:
                work.adopt(trial)
                return None
        assert fail is not None
        first = first or fail
        resume = [-1 if k == last else k for k in chosen]
        if all(k == -1 for k in resume):
            break
        start = [k + 1 for k in resume] + [0] * (len(gang.pod_sets) - len(resume))
    assert first is not None
    if len(tried) > 1:
        first.reason += f" (TAS missed in flavors {', '.join(tried)}, one scheduling cycle each)"
    return first


def _no_flavor(ps: PodSet, flavors: Sequence[Flavor], start: int) -> Fail:
    names = ", ".join(f.name for f in flavors[start:]) or "none"
    return Fail(
        ps.name,
        f"pod set {ps.name}: its node selector and affinity exclude every ResourceFlavor left to try "
        f"({names})",
        ps.count,
    )


def kueue_tas(snapshot: ClusterSnapshot, gang: GangRequest) -> Placement:
    """Kueue (v0.19.2) admitting the gang through a ClusterQueue with Topology-Aware Scheduling
    on every flavor, as a fleet of mixed GPU models is set up for it.

    **The ClusterQueue modelled.** One ResourceFlavor per GPU model present
    (:func:`resource_flavors`: nodeLabels ``nvidia.com/gpu.product: <model>``, each with the
    TAS Topology; the nodes without the label a flavor of their own, last), listed in one
    resource group covering cpu, memory and ``nvidia.com/gpu``, cheapest model first as an
    administrator would list them. Every nominalQuota is larger than the fleet, so quota never
    binds: each flavor's quota check is Fit without borrowing, and flavorFungibility (its
    defaults, ``whenCanBorrow: MayStopSearch``, ``whenCanPreempt: TryNextFlavor``) never comes
    into play. Preemption is off (``withinClusterQueue: Never``, the default): all gangs are
    equals.

    **Flavor assignment** (pkg/scheduler/flavorassigner/flavorassigner.go
    ``findFlavorForPodSets``): each pod set on its own (pod sets share a flavor only through a
    ``podset-group-name``, which gangs do not use), the flavors in order, skipping those its
    node requirements exclude (:func:`flavor_allows`); with quota that never binds the first
    one left is taken, before TAS runs. TAS then runs inside that flavor only; a miss does not
    try the next flavor in the same cycle (``assignFlavors`` marks the pod set Preempt, or NoFit
    when it would not fit an empty cluster either), but the next scheduling cycle resumes the
    scan after that flavor (:func:`_kueue_core`). On one snapshot that is: the next flavor, a
    cycle later each. After a miss in the last flavor the gang waits until the cluster changes
    and then starts from the first flavor, as each call here does: a workload leaving the
    ClusterQueue advances its ``AllocatableResourceGeneration`` (``deleteWorkload``,
    pkg/cache/scheduler/clusterqueue.go), which outdates the recorded progress
    (``lastAssignmentOutdated``, pkg/scheduler/scheduler.go).

    **TAS inside a flavor** (pkg/cache/scheduler/tas_flavor_snapshot.go
    ``findTopologyAssignment``, profile ``TASProfileMixed``, the default since v0.15;
    :func:`topology_assignment`). The hierarchy's levels are the Topology's
    ``levels[].nodeLabel`` with hostname last. Per pod set, in order, on what earlier pod sets
    left: node capacity is how many copies of the pod's GPU request fit (``fillLeafCounts``;
    GPUs are a count, no NVLink/PCIe model), summed up the tree. ``requiredLevel`` ->
    ``podset-required-topology``: the BestFit domain at that level (fewest pods that still fit)
    or a miss. ``preferredLevel`` -> ``podset-preferred-topology``: that level, then one level
    up at a time (to the required level, if any); at the top, spread over several domains.
    Neither -> unconstrained (implied TAS): LeastFreeCapacity over the lowest level, every node
    sorted at once by pods that fit (fullest first), then topology path; the first that holds
    every pod, else nodes in that order. From the chosen domain down
    (``updateCountsToMinimumGeneric``): BestFit takes the fewest children, largest first, the
    last one the tightest that holds the rest. In-node levels (``nvlink``, ``numa``) have no
    Kueue equivalent and are ignored; so is ``colocateWith``. GPUs: as the node hands them out.

    Not modelled: a node that lacks one of the Topology's level labels is here a domain of its
    own at that level, where Kueue leaves it out of the flavor (``NodeMatchesFlavor``), as if
    each flavor's Topology had the levels its nodes carry; the capacity a waiting gang holds
    back from later ones in the same cycle (``reserveCapacityForUnreclaimablePreempt``).
    """
    return run_policy(snapshot, gang, _kueue_core, "kueue-tas")
