"""kube-scheduler extender verbs: filter, prioritize, bind, preempt.

Replies always carry explicit lists (a filter reply with neither ``NodeNames`` nor
``Nodes`` means "no node fits" to the scheduler); prioritize replies are a bare array.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from extender.httpapi import checks, nodelist
from extender.httpapi.access import add_verb
from extender.httpapi.decide import FilterOutcome, Scores, lookup, unsaved
from extender.httpapi.handling import BINDER, CACHE, DECIDER, METRICS, Encoded, dumps, json_endpoint
from extender.httpapi.wire import (
    MAX_EXTENDER_PRIORITY,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
)
from extender.kube.api import KubeError
from extender.kube.pods import PodInfo
from extender.reservations.book import Refused

log = logging.getLogger(__name__)

#: ``FilterOutcome.replies`` key of the nodeCacheCapable reply (NodeNames, no Node objects).
NAMES_FORM = "names"


def _names(args: ExtenderArgs) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Node names in request order, and the Node objects by name (non-cache mode)."""
    if args.node_names is not None:
        return args.node_names, {}
    items: dict[str, dict[str, Any]] = {}
    names = []
    for item in (args.nodes.items if args.nodes is not None else None) or []:
        meta = item.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str) and name:
            names.append(name)
            items.setdefault(name, item)
    return names, items


async def filter_nodes(request: web.Request, args: ExtenderArgs) -> dict[str, Any] | Encoded:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    names, items = _names(args)
    nodelist.check(names)
    try:
        pod = await checks.asked(request, PodInfo.from_obj(args.pod))
    except checks.Refusal as exc:
        reason = checks.refused(request, "filter", exc)
        failed = dict.fromkeys(names, reason)
        return {
            "Nodes": None,
            "NodeNames": [],
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
    if not cache.pods_watched:
        cache.remember(pod)

    def decide() -> FilterOutcome:
        with request.app[METRICS].decision_duration.labels("filter").time():
            return nodelist.filter_known(decider, pod, names)

    out = await cache.book.deciding(decide)
    why = await cache.book.promise(out.reserved)
    if why is not None:
        out = unsaved(out, why)
    request.app[METRICS].decisions.labels(out.outcome).inc()
    names_only = args.nodes is None and args.node_names is not None
    if names_only:
        encoded = out.replies.get(NAMES_FORM)
        if isinstance(encoded, Encoded):
            return encoded
    reply: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": out.failed,
        "FailedAndUnresolvableNodes": out.unresolvable,
        "Error": "",
    }
    if args.nodes is not None or args.node_names is None:
        reply["Nodes"] = {"metadata": {}, "items": [items[n] for n in out.passed if n in items]}
    if args.node_names is not None or args.nodes is None:
        reply["NodeNames"] = out.passed
    if names_only:
        # The reply is then a function of the outcome alone (no Node objects echoed).
        out.replies[NAMES_FORM] = encoded = Encoded(dumps(reply))
        return encoded
    return reply


def filter_error(message: str) -> dict[str, Any]:
    return {
        "Nodes": None,
        "NodeNames": [],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


#: ``{"Host":"<name>","Score":`` per node name: a 5,000-entry HostPriorityList is then a
#: join of strings, several times faster than encoding 5,000 dicts.
_HOST_PREFIX: dict[str, str] = {}
_SCORE_SUFFIX = [f"{s}}}" for s in range(MAX_EXTENDER_PRIORITY + 1)]


def encode_priorities(names: Sequence[str], scores: Sequence[int], remember: bool = True) -> Encoded:
    """The HostPriorityList; the names' prefixes are remembered only when ``remember`` (every
    name a known node), so the table is bounded by the cluster."""
    if not remember:
        hosts = [
            '{"Host":' + json.dumps(n) + ',"Score":' + _SCORE_SUFFIX[s]
            for n, s in zip(names, scores, strict=True)
        ]
        return Encoded(("[" + ",".join(hosts) + "]").encode())
    if len(_HOST_PREFIX) > 200_000:
        _HOST_PREFIX.clear()
    try:
        prefixes = lookup(_HOST_PREFIX, names)
    except KeyError:
        for name in names:
            if name not in _HOST_PREFIX:
                _HOST_PREFIX[name] = '{"Host":' + json.dumps(name) + ',"Score":'
        prefixes = lookup(_HOST_PREFIX, names)
    parts = map(str.__add__, prefixes, map(_SCORE_SUFFIX.__getitem__, scores))
    return Encoded(("[" + ",".join(parts) + "]").encode())


async def prioritize(request: web.Request, args: ExtenderArgs) -> Encoded:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    names, _ = _names(args)
    nodelist.check(names)
    try:
        pod = await checks.asked(request, PodInfo.from_obj(args.pod))
    except checks.Refusal as exc:
        checks.refused(request, "prioritize", exc)
        return encode_priorities(names, [0] * len(names), remember=False)
    if not cache.pods_watched:
        cache.remember(pod)

    def decide() -> tuple[Scores, bool]:
        with request.app[METRICS].decision_duration.labels("prioritize").time():
            return nodelist.prioritize_known(decider, pod, names)

    scores, known = await cache.book.deciding(decide)
    request.app[METRICS].decisions.labels("scored").inc()
    # Both node modes get the same bare array for the same names: one encoded form.
    encoded = scores.replies.get(NAMES_FORM)
    if not isinstance(encoded, Encoded):
        scores.replies[NAMES_FORM] = encoded = encode_priorities(names, scores.values, known)
    return encoded


def prioritize_error(message: str) -> list[dict[str, Any]]:
    # The scheduler ignores a failed prioritize; an empty list scores nothing.
    return []


async def bind(request: web.Request, args: ExtenderBindingArgs) -> dict[str, Any]:
    cache, decider, metrics = request.app[CACHE], request.app[DECIDER], request.app[METRICS]
    namespace = args.pod_namespace or "default"
    try:
        pod = await checks.to_bind(request, namespace, args.pod_name, args.pod_uid, args.node, volcano=False)
    except checks.Refusal as exc:
        metrics.decisions.labels("bind-failed").inc()
        return {"Error": f"cannot bind to {args.node}: {checks.refused(request, 'bind', exc)}"}
    try:
        with metrics.decision_duration.labels("bind").time():
            plan = await cache.book.reserve_pod(pod, args.node, decider.plan_gpus)
    except Refused as exc:
        metrics.decisions.labels("bind-failed").inc()
        message = f"cannot bind {pod.key} to {args.node}: {exc}"
        return {"Error": checks.refused(request, "bind", checks.Refusal("no-slot", message))}
    try:
        await request.app[BINDER].bind(pod, args.node, plan.annotations())
    except Exception as exc:
        await cache.book.unreserve(plan)
        if not isinstance(exc, KubeError):
            raise  # a bug, not a refusal: answered, logged and counted as an internal error
        metrics.decisions.labels("bind-failed").inc()
        return {"Error": f"binding {pod.key} to {args.node} failed: {exc}"}
    # The Binding and the GPU annotation are the truth of what the pod holds; the
    # reservation's record of it (spec.bound, status) is written in the background, several
    # binds of a gang together. After a restart before that write, the pod watch gives the
    # bound pod its slot again (ReservationBook.pod_bound).
    cache.book.flush_soon()
    metrics.decisions.labels("bound").inc()
    return {"Error": ""}


def bind_error(message: str) -> dict[str, Any]:
    return {"Error": message}


async def preempt(request: web.Request, args: ExtenderPreemptionArgs) -> dict[str, Any]:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    pod = PodInfo.from_obj(args.pod)
    victims: dict[str, list[tuple[str, PodInfo | None]]] = {}
    pdb: dict[str, int] = {}
    for node, mv in (args.node_name_to_meta_victims or {}).items():
        victims[node] = [(p.uid, None) for p in mv.pods or []]
        pdb[node] = mv.num_pdb_violations
    for node, v in (args.node_name_to_victims or {}).items():
        infos = [PodInfo.from_obj(p) for p in v.pods or []]
        victims[node] = [(i.uid, i) for i in infos]
        pdb[node] = v.num_pdb_violations

    def decide() -> list[str]:
        with request.app[METRICS].decision_duration.labels("preempt").time():
            return decider.preempt(pod, victims)

    keep = await cache.book.deciding(decide)
    request.app[METRICS].decisions.labels("preempt").inc()
    return {
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": uid} for uid, _ in victims[n]], "NumPDBViolations": pdb[n]} for n in keep
        }
    }


def preempt_error(message: str) -> dict[str, Any]:
    # ExtenderPreemptionResult has no Error field; an empty result proposes no node.
    return {"NodeNameToMetaVictims": {}}


def add_routes(app: web.Application, prefix: str) -> None:
    add_verb(
        app,
        f"{prefix}/filter",
        json_endpoint("filter", ExtenderArgs, filter_nodes, filter_error),
        large_body=True,
    )
    add_verb(
        app,
        f"{prefix}/prioritize",
        json_endpoint("prioritize", ExtenderArgs, prioritize, prioritize_error),
        large_body=True,
    )
    add_verb(app, f"{prefix}/bind", json_endpoint("bind", ExtenderBindingArgs, bind, bind_error))
    add_verb(
        app,
        f"{prefix}/preempt",
        json_endpoint("preempt", ExtenderPreemptionArgs, preempt, preempt_error),
        large_body=True,
    )
