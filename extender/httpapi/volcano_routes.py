"""Volcano extender plugin verbs, under ``{prefix}/volcano/``.

predicate and prioritize apply the same rules as the kube-scheduler verbs (a task's gang
is its job, ``<namespace>/<podgroup>``); jobEnqueueable holds a GPU job back until its
PodGroup's slice is reserved; allocate/deallocate follow Volcano's in-session allocations
on the reservation's slots. Prioritize scores are 0-100 (the extender's 0-10 times 10),
the range Volcano's own node-order plugins use, since Volcano adds them raw.

onSessionOpen/onSessionClose are served but their bodies are read and ignored: the
session-open body is the whole cluster snapshot, and a failed call with
``extender.ignorable: false`` would make Volcano skip the extender for the session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from extender.httpapi import checks, nodelist
from extender.httpapi.access import add_verb
from extender.httpapi.decide import FilterOutcome, Scores, unsaved
from extender.httpapi.handling import CACHE, DECIDER, METRICS, dumps, json_endpoint
from extender.httpapi.volcano_wire import (
    ABSTAIN,
    ERROR,
    PERMIT,
    REJECT,
    SUCCESS,
    UNSCHEDULABLE,
    UNSCHEDULABLE_AND_UNRESOLVABLE,
    EventHandlerRequest,
    JobInfo,
    JobRequest,
    PredicateRequest,
    PrioritizeRequest,
    TaskInfo,
)
from extender.kube import names as keys
from extender.kube.pods import PodError, PodInfo, quantity
from extender.reservations.book import Refused

#: Volcano's own node-order plugins score on roughly 0-100 x weight.
SCORE_SCALE = 10.0


def task_pod(task: TaskInfo) -> tuple[PodInfo, str | None]:
    """The pod of a task (from its embedded Pod, else its fields) and its job's gang key."""
    if task.pod:
        pod = PodInfo.from_obj(task.pod)
    else:
        gpus, problems = 0, tuple[str, ...]()
        try:
            gpus = task.resreq.gpus("task.Resreq") if task.resreq else 0
        except PodError as exc:
            problems = (str(exc),)
        pod = PodInfo(
            namespace=task.namespace or "default", name=task.name, uid=task.uid, gpus=gpus, problems=problems
        )
    if pod.pod_set is None and task.task_role:
        pod = dataclasses.replace(pod, labels={**pod.labels, keys.POD_SET: task.task_role})
    job = task.job or pod.volcano_group
    return pod, job or None


async def watched(
    request: web.Request, task: TaskInfo, sent: PodInfo, job: str | None
) -> tuple[PodInfo, str | None]:
    """The task's pod as watched (see extender.httpapi.checks), with its role and job."""
    pod = await checks.asked(request, sent, volcano=True)
    if pod is not sent:
        if pod.pod_set is None and task.task_role:
            pod = dataclasses.replace(pod, labels={**pod.labels, keys.POD_SET: task.task_role})
        job = pod.volcano_group or job
    return pod, job


async def predicate(request: web.Request, args: PredicateRequest) -> dict[str, Any]:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    pod, job = task_pod(args.task)
    node = args.node.node_name()
    try:
        pod, job = await watched(request, args.task, pod, job)
    except checks.Refusal as exc:
        return {"status": checks.refused(request, "volcano-predicate", exc), "code": UNSCHEDULABLE}

    def decide() -> FilterOutcome:
        with request.app[METRICS].decision_duration.labels("volcano-predicate").time():
            return nodelist.filter_known(decider, pod, [node], job)

    out = await cache.book.deciding(decide)
    why = await cache.book.promise(out.reserved)
    if why is not None:
        out = unsaved(out, why)
    request.app[METRICS].decisions.labels(out.outcome).inc()
    if out.passed:
        return {"status": "", "code": SUCCESS}
    if out.unresolvable:
        return {"status": next(iter(out.unresolvable.values())), "code": UNSCHEDULABLE_AND_UNRESOLVABLE}
    reason = next(iter(out.failed.values()), "node has no name")
    return {"status": reason, "code": UNSCHEDULABLE}


def predicate_error(message: str) -> dict[str, Any]:
    return {"status": message, "code": ERROR}


async def prioritize(request: web.Request, args: PrioritizeRequest) -> dict[str, Any]:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    pod, job = task_pod(args.task)
    names = [name for n in args.nodes or [] if (name := n.node_name())]
    nodelist.check(names)
    try:
        pod, job = await watched(request, args.task, pod, job)
    except checks.Refusal as exc:
        return {"nodeScore": {}, "errorMessage": checks.refused(request, "volcano-prioritize", exc)}

    def decide() -> tuple[Scores, bool]:
        with request.app[METRICS].decision_duration.labels("volcano-prioritize").time():
            return nodelist.prioritize_known(decider, pod, names, job)

    scores, _ = await cache.book.deciding(decide)
    request.app[METRICS].decisions.labels("scored").inc()
    node_score = {n: s * SCORE_SCALE for n, s in zip(names, scores.values, strict=True)}
    return {"nodeScore": node_score, "errorMessage": ""}


def prioritize_error(message: str) -> dict[str, Any]:
    return {"nodeScore": {}, "errorMessage": message}


def job_gpus(job: JobInfo) -> int:
    """GPUs a Volcano job asks for: its total request, or its PodGroup's minResources.
    Raises PodError, naming the field, for a count that is not whole and non-negative."""
    total = job.total_request.gpus("job.TotalRequest") if job.total_request is not None else 0
    if total > 0:
        return total
    pg: Any = job.pod_group or {}
    for spec in (pg.get("spec"), (pg.get("PodGroup") or {}).get("spec") if isinstance(pg, Mapping) else None):
        if isinstance(spec, Mapping) and isinstance(spec.get("minResources"), Mapping):
            got = spec["minResources"].get(keys.GPU_RESOURCE)
            try:
                if got is not None:
                    return quantity(got)
            except PodError as exc:
                raise PodError(f"job.PodGroup.spec.minResources[{keys.GPU_RESOURCE}]: {exc}") from None
    return 0


async def job_enqueueable(request: web.Request, args: JobRequest) -> dict[str, Any]:
    """Permit a job whose PodGroup has a reserved slice; Reject a GPU job without one;
    Abstain for jobs without GPUs."""
    cache = request.app[CACHE]
    metrics = request.app[METRICS]
    try:
        gpus = job_gpus(args.job)
    except PodError as exc:
        metrics.decisions.labels("invalid").inc()
        return {"status": REJECT, "errorMessage": f"job {args.job.key}: {exc}"}
    if cache.book.reservation(args.job.key) is not None:
        status, outcome = PERMIT, "permit"
    elif gpus > 0:
        status, outcome = REJECT, "reject"
    else:
        status, outcome = ABSTAIN, "abstain"
    metrics.decisions.labels(outcome).inc()
    return {"status": status}


def job_enqueueable_error(message: str) -> dict[str, Any]:
    return {"status": REJECT}


async def allocate(request: web.Request, args: EventHandlerRequest) -> dict[str, Any]:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    sent, job = task_pod(args.task)
    node = args.task.node_name
    try:
        pod = await checks.to_bind(
            request, sent.namespace, sent.name, args.task.uid, node, volcano=True, sent=sent
        )
    except checks.Refusal as exc:
        return {
            "errorMessage": f"cannot allocate on {node}: {checks.refused(request, 'volcano-allocate', exc)}"
        }
    if pod is not sent:
        if pod.pod_set is None and sent.pod_set is not None:
            pod = dataclasses.replace(pod, labels={**pod.labels, keys.POD_SET: sent.pod_set})
        job = pod.volcano_group or job

    def decide() -> None:
        with request.app[METRICS].decision_duration.labels("volcano-allocate").time():
            decider.allocate(pod, node, job)

    try:
        await cache.book.deciding(decide)
    except Refused as exc:
        return {
            "errorMessage": checks.refused(request, "volcano-allocate", checks.Refusal("no-slot", str(exc)))
        }
    await cache.book.flush()
    request.app[METRICS].decisions.labels("allocated").inc()
    return {"errorMessage": ""}


async def deallocate(request: web.Request, args: EventHandlerRequest) -> dict[str, Any]:
    cache, decider = request.app[CACHE], request.app[DECIDER]
    pod, job = task_pod(args.task)
    try:
        pod = await checks.to_free(request, pod)
    except checks.Refusal as exc:
        return {"errorMessage": checks.refused(request, "volcano-deallocate", exc)}
    job = pod.volcano_group or job

    def decide() -> None:
        with request.app[METRICS].decision_duration.labels("volcano-deallocate").time():
            decider.deallocate(pod, job)

    await cache.book.deciding(decide)
    await cache.book.flush()
    return {"errorMessage": ""}


def event_error(message: str) -> dict[str, Any]:
    return {"errorMessage": message}


async def session_event(request: web.Request) -> web.Response:
    async for _ in request.content.iter_chunked(1 << 16):
        pass
    return web.Response(body=dumps({}), content_type="application/json")


VERBS = (
    "predicate",
    "prioritize",
    "jobEnqueueable",
    "allocate",
    "deallocate",
    "onSessionOpen",
    "onSessionClose",
)


def add_routes(app: web.Application, prefix: str) -> None:
    base = f"{prefix}/volcano"
    add_verb(
        app,
        f"{base}/predicate",
        json_endpoint("volcano-predicate", PredicateRequest, predicate, predicate_error),
    )
    add_verb(
        app,
        f"{base}/prioritize",
        json_endpoint("volcano-prioritize", PrioritizeRequest, prioritize, prioritize_error),
        large_body=True,
    )
    add_verb(
        app,
        f"{base}/jobEnqueueable",
        json_endpoint("volcano-jobEnqueueable", JobRequest, job_enqueueable, job_enqueueable_error),
        large_body=True,
    )
    add_verb(
        app, f"{base}/allocate", json_endpoint("volcano-allocate", EventHandlerRequest, allocate, event_error)
    )
    add_verb(
        app,
        f"{base}/deallocate",
        json_endpoint("volcano-deallocate", EventHandlerRequest, deallocate, event_error),
    )
    # A session's events carry the whole session (its jobs and nodes).
    add_verb(app, f"{base}/onSessionOpen", session_event, large_body=True)
    add_verb(app, f"{base}/onSessionClose", session_event, large_body=True)
