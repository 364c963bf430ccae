"""What a verb is told, checked against what gangslice watches, before it decides.

A scheduler's request names a pod and a node; a forged one names pods nobody created,
another tenant's pod, a pod already running, or a node outside the pod's slot. So:

- filter, prioritize, predicate: the pod must be in the pod watch (or, where the watch has not
  shown it yet, on the API server) with the UID sent (a scheduler always sends it) and name one
  of our schedulers; if not, the verb reserves nothing and says why. The watched pod, not the
  request's copy, is what the decision reads; where the watch still shows it gated, it is read
  again from the API server (:func:`current`), and a pod gated there is refused.
- bind, allocate: the pod must be watched, with the UID sent, not bound elsewhere, not gated
  (kube-scheduler's verbs), and name one of our schedulers (``--scheduler-name``; ``volcano``
  for the Volcano verbs); the node must be a Node of the cluster. The slot check is the
  decider's (``Refused``).
- deallocate: frees a slot only while the pod is not running on a node: gone (per the
  watch, then the API server), finished, or not bound yet (Volcano undoing an allocation
  within its session). A running member's slot is freed when the pod ends.

In file mode (``serve --cluster``, no pod watch) pods are known only from requests: the
checks that need the watch are skipped there.
Every refusal is counted in ``gangslice_extender_refusals_total{verb,reason}``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from aiohttp import web

from extender.httpapi.handling import API, CACHE, METRICS
from extender.kube.api import PODS, Kind, KubeError, NotFound
from extender.kube.pods import PodInfo

log = logging.getLogger(__name__)

DEFAULT_SCHEDULERS = ("gangslice-scheduler",)
DEFAULT_VOLCANO_SCHEDULERS = ("volcano",)


@dataclasses.dataclass(frozen=True, slots=True)
class Schedulers:
    """Scheduler names whose pods the kube-scheduler verbs and the Volcano verbs may bind."""

    kube: frozenset[str] = frozenset(DEFAULT_SCHEDULERS)
    volcano: frozenset[str] = frozenset(DEFAULT_VOLCANO_SCHEDULERS)

    @classmethod
    def of(cls, kube: Iterable[str], volcano: Iterable[str]) -> Schedulers:
        return cls(frozenset(kube), frozenset(volcano))


SCHEDULERS = web.AppKey("schedulers", Schedulers)


class Refusal(Exception):
    """A request refused for what it claims; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def refused(request: web.Request, verb: str, exc: Refusal) -> str:
    """Count a refusal and give its message."""
    request.app[METRICS].refusals.labels(verb, exc.reason).inc()
    log.info("%s refused (%s): %s", verb, exc.reason, exc)
    return str(exc)


async def asked(request: web.Request, sent: PodInfo, *, volcano: bool = False) -> PodInfo:
    """The pod a filter, prioritize or predicate asks about, as watched. Raises Refusal."""
    cache = request.app[CACHE]
    if not cache.pods_watched:
        return sent
    known = await current(request, sent.namespace, sent.name, volcano=volcano)
    if known is None:
        raise Refusal(
            "unknown-pod",
            f"pod {sent.key} is not known to gangslice (not in its pod watch, nor on the API server); "
            "nothing reserved",
        )
    if not sent.uid:
        raise Refusal("uid-mismatch", f"no uid given for pod {sent.key}; nothing reserved")
    if known.uid and sent.uid != known.uid:
        raise Refusal("uid-mismatch", f"pod {sent.key} has uid {known.uid}, not {sent.uid}; nothing reserved")
    _our_scheduler(request, known, volcano)
    _not_gated(known, volcano)
    return known


async def current(request: web.Request, namespace: str, name: str, *, volcano: bool) -> PodInfo | None:
    """The pod as watched, read from the API server (and taken into the cache as the watch
    would) where a scheduler asking about it has seen a newer one than the watch has shown:
    a pod the watch does not show yet (it lags behind under load, and kube-scheduler may ask
    about a pod just created), or one it still shows gated (kube-scheduler places no gated pod:
    the update that lifted the gate, which carries Kueue's podSetUpdates, is still on its way).
    Without that read, the scheduler would be sent away to wait for an event that may never
    come, or the pod decided as the plain pod it was before its admission. Without a pod watch:
    the pod as last seen in a request, read from the API server when never seen."""
    cache = request.app[CACHE]
    watched = cache.pods_watched
    known = cache.watched_pod(namespace, name) if watched else cache.pod(namespace, name)
    stale = known is None or (watched and known.gated and not volcano)
    api = request.app[API]
    if not stale or api is None:
        return known
    try:
        obj = await api.get(PODS, name, namespace)
    except NotFound:
        return None if watched else known
    except KubeError as exc:
        log.warning("pod %s: cannot read it from the API server: %s", f"{namespace}/{name}", exc)
        return known
    if not watched:
        cache.remember(PodInfo.from_obj(obj))
        return cache.pod(namespace, name)
    now = cache.watched_pod(namespace, name)
    if now is known:  # else the watch came meanwhile, and it is as new
        cache.apply(Kind.PODS, "ADDED" if known is None else "MODIFIED", obj)
    return cache.watched_pod(namespace, name)


def _not_gated(pod: PodInfo, volcano: bool) -> None:
    """kube-scheduler places no pod with scheduling gates (Volcano's own gates are its
    business): a request about one is not kube-scheduler's."""
    if pod.gated and not volcano:
        raise Refusal(
            "gated", f"pod {pod.key} has scheduling gates: kube-scheduler places it once they are lifted"
        )


def _our_scheduler(request: web.Request, pod: PodInfo, volcano: bool) -> None:
    schedulers = request.app.get(SCHEDULERS) or Schedulers()
    allowed = schedulers.volcano if volcano else schedulers.kube
    if pod.scheduler not in allowed:
        names = ", ".join(sorted(allowed))
        raise Refusal("other-scheduler", f"pod {pod.key} names scheduler {pod.scheduler!r}, not {names}")


async def to_bind(
    request: web.Request,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    *,
    volcano: bool,
    sent: PodInfo | None = None,
) -> PodInfo:
    """The pod a bind or allocate may place on ``node``, as watched (without a watch: as last
    seen, else as ``sent``). Raises Refusal."""
    cache = request.app[CACHE]
    key = f"{namespace}/{name}"
    pod = await current(request, namespace, name, volcano=volcano) or (None if cache.pods_watched else sent)
    if pod is None:
        raise Refusal("unknown-pod", f"pod {key} is not known to gangslice")
    if uid and pod.uid and uid != pod.uid:
        raise Refusal("uid-mismatch", f"pod {key} has uid {pod.uid}, not {uid}")
    if cache.pods_watched and not uid:
        raise Refusal("uid-mismatch", f"no uid given for pod {key}")
    if pod.node is not None and pod.node != node:  # the same node again: a retried bind
        raise Refusal("already-bound", f"pod {key} is already bound to node {pod.node}")
    if pod.terminal or pod.deleting:
        raise Refusal("pod-finished", f"pod {key} is {'being deleted' if pod.deleting else pod.phase}")
    _our_scheduler(request, pod, volcano)
    _not_gated(pod, volcano)
    if not cache.has_node_object(node):
        raise Refusal("unknown-node", f"node {node!r} is not a node of the cluster")
    if uid and not pod.uid:
        pod = dataclasses.replace(pod, uid=uid)
    return pod


async def to_free(request: web.Request, sent: PodInfo) -> PodInfo:
    """The pod whose slot a deallocate may free. Raises Refusal while it runs on a node."""
    cache = request.app[CACHE]
    if not cache.pods_watched:
        return sent
    pod = cache.watched_pod(sent.namespace, sent.name)
    api = request.app[API]
    if pod is None and api is not None:
        try:
            pod = PodInfo.from_obj(await api.get(PODS, sent.name, sent.namespace))
        except NotFound:
            return sent
        except KubeError as exc:
            raise Refusal("api-error", f"cannot tell whether pod {sent.key} is gone: {exc}") from None
    if pod is None:
        return sent
    if sent.uid != pod.uid:
        raise Refusal("uid-mismatch", f"pod {pod.key} has uid {pod.uid}, not {sent.uid or '(none)'}")
    if pod.node is not None and not pod.terminal:
        raise Refusal(
            "pod-running",
            f"pod {pod.key} runs on node {pod.node}; its slot is freed when the pod is gone or finished",
        )
    return dataclasses.replace(pod, labels={**sent.labels, **pod.labels})
