"""``gangslice explain``: why a gang waits, in one screen.

Online: ``gangslice explain workload/NS/NAME`` (or ``podgroup/NS/NAME``, ``gang/NS/NAME``)
reads the object, our admission check's stored state, the gang's SliceReservation and the
cluster (Nodes, Pods, NodeTopologies, SliceReservations) through ``--kubeconfig``, and dry
runs the engine on the current snapshot with the gang's own hold left out.

Offline (no API server): ``--cluster FILE`` with ``--gang FILE`` (a gang file) or
``--workload FILE`` (a Workload object as YAML): a dry run only, plus the check state the
Workload object carries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from typing import Any

from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNPLACEABLE, EXIT_UNREACHABLE
from extender.controllers.common import Cache
from extender.controllers.explain import CheckState, Facts, render, to_json
from extender.controllers.kueue import assignment, workload_gang
from extender.controllers.kueue import contract as kueue
from extender.controllers.objects import object_ref, reservation_from_object
from extender.kube import names
from extender.kube.api import (
    ADMISSION_CHECKS,
    PODGROUPS,
    RESOURCE_FLAVORS,
    SLICE_RESERVATIONS,
    WORKLOADS,
    KubeClient,
    KubeError,
    NotFound,
)
from extender.kube.crd_models import CrdError, object_name
from extender.placement.files import FileError, load_cluster, load_gang
from extender.placement.reading import load_yaml
from extender.placement.request import GangRequest
from extender.placement.scoring import LevelError
from extender.placement.slice import Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place

KINDS = ("workload", "podgroup", "gang")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "explain",
        help="why a gang waits: what it asks for, what it holds, what the cluster lacks",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", nargs="?", help="KIND/NAMESPACE/NAME, KIND one of workload, podgroup, gang")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--cluster", help="cluster file: dry run on it instead of the live cluster")
    p.add_argument("--gang", help="gang file (offline, with --cluster)")
    p.add_argument("--workload", help="a Workload object as YAML (offline, with --cluster)")
    p.add_argument("--check", help="offline: the name of our AdmissionCheck on the Workload")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    p.set_defaults(func=run)


def parse_target(text: str) -> tuple[str, str, str]:
    parts = text.split("/")
    if len(parts) != 3 or not all(parts) or parts[0].lower() not in KINDS:
        raise ValueError(f"target {text!r}: expected KIND/NAMESPACE/NAME with KIND one of {', '.join(KINDS)}")
    return parts[0].lower(), parts[1], parts[2]


# -- offline -----------------------------------------------------------------------------------


def explain_gang_file(snap: ClusterSnapshot, gang: GangRequest, where: str) -> Facts:
    facts = Facts(target=f"gang {gang.name} (from {where})", gang=gang)
    try:
        facts.dry_run = place(snap, gang)
    except LevelError as exc:
        facts.problems.append(str(exc))
    return facts


def explain_workload_object(snap: ClusterSnapshot, wl: Mapping[str, Any], checks: set[str] | None) -> Facts:
    """A Workload as it stands (its check state) plus a dry run on ``snap``. ``checks``: the
    names of our AdmissionChecks; None takes the Workload's only entry, if it has one."""
    ns, name = object_ref(wl)
    facts = Facts(target=f"workload {ns}/{name}")
    entries = list((wl.get("status") or {}).get("admissionChecks") or ())
    if checks is None:
        checks = {str(entries[0].get("name"))} if len(entries) == 1 else set()
        if len(entries) > 1:
            facts.notes.append("the Workload has several admission checks; name ours with --check")
    mine = kueue.our_entries(wl, checks)
    if mine:
        e = mine[0]
        facts.check = CheckState(
            str(e.get("state")), str(e.get("message") or ""), e.get("lastTransitionTime")
        )
    _, why = kueue.decide(wl, checks, False)
    facts.notes.append(f"controller's view: {why}")
    _dry_run_workload(facts, snap, wl, {})
    return facts


def _dry_run_workload(
    facts: Facts, view: ClusterSnapshot, wl: Mapping[str, Any], flavors: Mapping[str, Mapping[str, str]]
) -> None:
    try:
        wg = workload_gang.gang_from_workload(wl, view.hierarchy)
    except workload_gang.WorkloadError as exc:
        facts.problems.append(str(exc))
        return
    facts.gang = wg.request
    facts.notes.extend(wg.notes)
    allowed = assignment.pod_set_nodes(wl, flavors)
    facts.dry_run = assignment.solve(view, wg.request, kueue.Stage.WIDENED, allowed, "")
    strict = workload_gang.strict_gang(wg.request, view.hierarchy)
    if strict is not None:
        held_out = assignment.solve(view, strict, kueue.Stage.WIDENED, allowed, "")
        got = "can be met now" if isinstance(held_out, Slice) else f"not met now: {held_out.reason}"
        facts.notes.append(f"preferred levels ({workload_gang.describe_request(strict)}): {got}")


# -- online ------------------------------------------------------------------------------------


async def explain_workload(api: KubeClient, cache: Cache, namespace: str, name: str) -> Facts:
    """A live Workload: our check's state, the reservation, a dry run on the cache's view."""
    facts = Facts(target=f"workload {namespace}/{name}")
    try:
        wl = await api.get(WORKLOADS, name, namespace)
    except NotFound:
        facts.problems.append(f"workload {namespace}/{name} not found")
        return facts
    checks = {
        str(ac["metadata"]["name"])
        for ac in (await api.list(ADMISSION_CHECKS)).items
        if kueue.is_our_check(ac)
    }
    key = kueue.gang_key(wl)
    mine = kueue.our_entries(wl, checks)
    if mine:
        e = mine[0]
        facts.check = CheckState(
            str(e.get("state")), str(e.get("message") or ""), e.get("lastTransitionTime")
        )
    else:
        facts.notes.append(f"no admission check of controller {names.CHECK_CONTROLLER} on this Workload")
    _, why = kueue.decide(wl, checks, cache.reservation(key) is not None)
    facts.notes.append(f"controller's view: {why}")
    facts.reservation = cache.reservation(key)
    if facts.reservation is None:
        try:
            facts.reservation = reservation_from_object(
                await api.get(SLICE_RESERVATIONS, object_name(key), namespace)
            )
        except (NotFound, CrdError):
            facts.reservation = None
    flavors: dict[str, dict[str, str]] = {}
    for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or ():
        for flavor in (psa.get("flavors") or {}).values():
            try:
                rf = await api.get(RESOURCE_FLAVORS, str(flavor))
            except NotFound:
                continue
            flavors[str(flavor)] = {
                str(k): str(v) for k, v in ((rf.get("spec") or {}).get("nodeLabels") or {}).items()
            }
    _dry_run_workload(facts, cache.view([key]), wl, flavors)
    return facts


def explain_pods(
    cache: Any,
    kind: str,
    namespace: str,
    name: str,
    stored: CheckState | None,
    podgroup: Mapping[str, Any] | None = None,
) -> Facts:
    """A plain gang (pods labelled ``gangslice.io/gang``) or a Volcano PodGroup (``podgroup``,
    with its pods annotated ``scheduling.k8s.io/group-name``): the request the controller
    would build from them, and a dry run of it."""
    from extender.controllers.podgroups.groups import PodGroup, PodGroupError, gang_request
    from extender.kube.gangs import Incomplete, plain_gang_request
    from extender.kube.pods import PodError

    key = f"{namespace}/{name}"
    facts = Facts(target=f"{kind} {key}", check=stored, reservation=cache.reservation(key))
    pods = [p for p in cache.pods() if (p.gang if kind == "gang" else p.volcano_group) == key]
    gang: GangRequest | None = None
    if kind == "podgroup" and podgroup is None:
        facts.problems.append(f"PodGroup {key} not found")
        return facts
    if not pods:
        facts.problems.append(f"no pods of {kind} {key} in the cluster")
    elif podgroup is not None:
        try:
            gang = gang_request(PodGroup.from_obj(podgroup), pods, cache.view([key]))
        except PodGroupError as exc:
            facts.problems.append(str(exc))
    else:
        try:
            # The first pod whose gang is sized (by its owners, its PodGroup or its annotations)
            # speaks for it, as in the extender.
            owners = cache.owners
            got = next((g for p in pods if (g := plain_gang_request(p, pods, owners)) is not None), None)
        except PodError as exc:
            facts.problems.append(str(exc))
        else:
            if isinstance(got, Incomplete):
                facts.problems.append(f"gang {key}: {got.reason}")
            else:
                gang = got
    if gang is not None:
        facts.gang = gang
        try:
            facts.dry_run = place(cache.view([key]), gang)
        except LevelError as exc:
            facts.problems.append(str(exc))
    return facts


async def live_cache(api: KubeClient | None, cluster: str | None) -> Any:
    """A cluster cache filled by one list of every kind (or from a cluster file)."""
    from extender.kube.api import ALL_KINDS, Kind
    from extender.reservations import ClusterCache

    if cluster or api is None:
        assert cluster is not None
        return ClusterCache.from_cluster_file(cluster)
    cache = ClusterCache()
    for kind in ALL_KINDS:
        try:
            items = (await api.list(kind.resource)).items
        except NotFound:
            if not kind.optional:
                raise
            items = []  # an API this cluster does not serve
        cache.replace(kind, items)
        if kind is Kind.SLICE_RESERVATIONS:
            rs = []
            for obj in items:
                try:
                    rs.append(reservation_from_object(obj))
                except CrdError:
                    continue  # the controller's log names it; explain shows what it can
            cache.rebuild(rs)
    return cache


async def _podgroup(api: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await api.get(PODGROUPS, name, namespace)
    except KubeError:
        return None


def podgroup_state(pg: Mapping[str, Any] | None) -> CheckState | None:
    """What gangslice last said of the PodGroup (its ``gangslice.io/status`` annotation,
    ``State: message``), else Volcano's phase and last condition."""
    if pg is None:
        return None
    meta = pg.get("metadata") or {}
    ours = str((meta.get("annotations") or {}).get(names.STATUS) or "")
    if ours:
        state, _, message = ours.partition(": ")
        return CheckState(state, message, None)
    status = pg.get("status") or {}
    conds = [c for c in status.get("conditions") or () if isinstance(c, Mapping)]
    last = conds[-1] if conds else {}
    return CheckState(
        str(status.get("phase") or "Unknown"), str(last.get("message") or ""), last.get("lastTransitionTime")
    )


async def _online(args: argparse.Namespace, kind: str, namespace: str, name: str) -> Facts:
    from extender.kube.client import ApiServerClient

    api = ApiServerClient.connect(args.kubeconfig)
    cache = await live_cache(api, args.cluster)
    if kind == "workload":
        facts = await explain_workload(api, cache, namespace, name)
    else:
        pg = await _podgroup(api, namespace, name) if kind == "podgroup" else None
        facts = explain_pods(cache, kind, namespace, name, podgroup_state(pg), pg)
    await add_slot_claims(api, cache, facts)
    add_mismatches(cache, facts)
    add_migration(cache, facts)
    facts.problems.extend(refused_nodes(cache))
    return facts


def add_migration(cache: Any, facts: Facts) -> None:
    """For a gang with no slice now: a migration under way for it, or the plan ``serve
    --migration`` would report or carry out once it has waited (the domain cheapest to drain
    by moving replicas labelled movable), or why there is none."""
    from extender.controllers.migration.reporter import describe, movers
    from extender.placement.migration import MIN_GPUS, plan_drain
    from extender.reservations.handover import for_gang

    gang = facts.gang
    if gang is None or not isinstance(facts.dry_run, Unplaceable) or not facts.dry_run.feasible_when_empty:
        return
    held = cache.held_for(for_gang(gang.name))
    if held:
        facts.migration = f"under way: the drained slice is held for this gang ({', '.join(held)})"
        return
    if gang.gpus < MIN_GPUS:
        facts.migration = f"none: gangs of fewer than {MIN_GPUS} GPUs wait without moves"
        return
    pods = movers(cache)
    facts.plan = plan_drain(cache.view([gang.name]), gang, [m for m, _ in pods.values()])
    if facts.plan is None:
        facts.migration = (
            f"no plan: no domain this gang fits is freed by moving the {len(pods)} movable replica(s) "
            "(running, labelled gangslice.io/movable, owned by a controller) to hardware at least as fast"
        )
    else:
        facts.migration = f"once it has waited, serve --migration would move {describe(facts.plan, pods)}"


def add_mismatches(cache: Any, facts: Facts) -> None:
    """The gang's bound pods the kubelet reports on other GPUs than promised."""
    if facts.reservation is not None and hasattr(cache, "device_mismatches"):
        facts.mismatches = [m.message() for m in cache.device_mismatches(facts.reservation.gang)]


async def add_slot_claims(api: KubeClient, cache: Any, facts: Facts) -> None:
    """On DRA nodes: per slot, the devices its ResourceClaim pins and what the claim says now
    (allocated, reserved for, prepared)."""
    from extender.kube.api import RESOURCE_CLAIMS
    from extender.kube.crd_models import claim_name
    from extender.kube.slot_claims import claim_state
    from extender.reservations.store import ReservationRef

    r = facts.reservation
    if r is None:
        return
    namespace, name = ReservationRef.of(r).key
    claims = {
        c.get("metadata", {}).get("name"): c for c in (await api.list(RESOURCE_CLAIMS, namespace)).items
    }
    for slot in r.slice.slots:
        device_map = cache.device_map(slot.node)
        if device_map is None:
            continue
        pod = cache.watched_pod(namespace, r.bound[slot.key]) if slot.key in r.bound else None
        running = pod is not None and pod.phase == "Running"
        wanted = claim_name(name, slot)
        pins = ",".join(device_map.device(g).name for g in slot.gpus)
        facts.slot_claims[slot.key] = (pins, claim_state(wanted, claims.get(wanted), running).describe())


def refused_nodes(cache: Any) -> list[str]:
    """One line per node kept out of placement because its NodeTopology is refused, or its
    DRA devices do not pair with it; and per node whose agent reports GPUs unhealthy, or
    healthy GPUs whose links retry (priced at a share of their bandwidth)."""
    refused = cache.refused_topologies()
    lines = [
        f"node {node} kept out of placement: its NodeTopology is refused: {refused[node]}"
        for node in sorted(refused)
    ]
    mismatched = cache.device_problems()
    lines += [
        f"node {node} kept out of in-node choices: its DRA devices do not match its NodeTopology: {why}"
        for node, why in sorted(mismatched.items())
    ]
    degraded = cache.interconnect_problems()
    lines += [
        f"node {node} has GPUs given to no gang (interconnect degraded): {why}"
        for node, why in sorted(degraded.items())
    ]
    retrying = cache.retrying_links()
    lines += [
        f"node {node} has GPUs whose links retry, priced at a share of their bandwidth: {why}"
        for node, why in sorted(retrying.items())
    ]
    return lines


# -- the command -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    try:
        if args.gang or args.workload:
            if not args.cluster:
                print(
                    "gangslice explain: --gang/--workload need --cluster (offline dry run)", file=sys.stderr
                )
                return EXIT_BAD_INPUT
            snap = load_cluster(args.cluster)
            if args.gang:
                facts = explain_gang_file(snap, load_gang(args.gang, snap.hierarchy), args.gang)
            else:
                wl = load_yaml(args.workload)
                if not isinstance(wl, dict) or wl.get("kind") != "Workload":
                    print(f"gangslice explain: {args.workload}: not a Workload object", file=sys.stderr)
                    return EXIT_BAD_INPUT
                checks = {args.check} if args.check else None
                facts = explain_workload_object(snap, wl, checks)
        elif args.target:
            kind, namespace, name = parse_target(args.target)
            facts = asyncio.run(_online(args, kind, namespace, name))
        else:
            print(
                "gangslice explain: give KIND/NAMESPACE/NAME, or --cluster with --gang or --workload",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    except (FileError, ValueError) as exc:
        print(f"gangslice explain: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KubeError as exc:
        print(f"gangslice explain: the API server: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(json.dumps(to_json(facts), indent=2) if args.json else render(facts))
    return EXIT_UNPLACEABLE if isinstance(facts.dry_run, Unplaceable) else EXIT_OK
