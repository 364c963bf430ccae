"""A NodeTopology gangslice cannot use is said so, on the object and on its Node.

The cluster cache keeps a node whose NodeTopology fails validation
(:func:`extender.kube.crd_models.parse_node_topology`) out of placement, and remembers why
(:meth:`~extender.kube.cache.ClusterCache.refused_topologies`); the extender's filter names
that reason for the node and ``gangslice explain`` lists it. :class:`TopologyStatusReporter`
makes it visible in the API too, from the leader's housekeeping loop:

- the NodeTopology gets the condition ``Accepted=False``, reason ``InvalidSpec``, message
  ``<field>: <problem>`` (e.g. ``spec.nvlinkGbps: Input should be greater than 0``), applied
  to its ``/status`` subresource with server-side apply through the controller's one client
  (field manager ``gangslice``), so the node agent's own conditions, applied under
  ``gangslice-agent``, are left alone (``status.conditions`` is a list-map keyed by type).
  This condition is the one part of a NodeTopology the agent does not write;
- its Node gets a Warning Event, reason ``InvalidNodeTopology``, once per new message;
- once the spec reads again, the condition turns ``Accepted=True``, reason ``SpecValid``.

What is written follows what the watch shows: the condition is (re)written while the object
does not carry it with the current message, so a restart, a lost write or a fresh replica
converges on the same state without remembering anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.kube import names
from extender.kube.api import EVENTS, NODE_TOPOLOGIES, KubeClient

log = logging.getLogger(__name__)

#: The NodeTopology condition gangslice's scheduler side owns.
ACCEPTED = "Accepted"
INVALID_SPEC = "InvalidSpec"
SPEC_VALID = "SpecValid"
#: The Event reason on the Node.
INVALID_NODE_TOPOLOGY = "InvalidNodeTopology"
#: Events about cluster-scoped Nodes live in ``default``, with the node's name as uid: what
#: the kubelet writes and what ``kubectl describe node`` selects on.
NODE_EVENT_NAMESPACE = "default"
#: Conditions written per :meth:`TopologyStatusReporter.sync` at most (the rest on the next
#: one): a fleet of agents writing a bad spec at once must not hold up housekeeping.
MAX_WRITES_PER_SYNC = 50


def accepted_condition(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``Accepted`` condition a NodeTopology object carries: (status, message), or None."""
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == ACCEPTED:
            return str(c.get("status") or ""), str(c.get("message") or "")
    return None


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(problem: str | None, now: float) -> dict[str, str]:
    """The ``Accepted`` condition: False naming ``problem``, or True when there is none."""
    return {
        "type": ACCEPTED,
        "status": "False" if problem else "True",
        "reason": INVALID_SPEC if problem else SPEC_VALID,
        "message": problem or "the spec reads; the node takes part in placement",
        "lastTransitionTime": _rfc3339(now),
    }


def node_event(node: str, message: str, now: float) -> dict[str, Any]:
    stamp = _rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": NODE_EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "type": "Warning",
        "reason": INVALID_NODE_TOPOLOGY,
        "message": message[:1024],
        "source": {"component": "gangslice"},
        "reportingComponent": names.EVENT_COMPONENT,
        "reportingInstance": "gangslice-controller",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class TopologyStatusApi(Protocol):
    async def apply_condition(self, node: str, condition: Mapping[str, str]) -> None:
        """Server-side apply ``condition`` to the NodeTopology's status (raise on failure)."""
        ...

    async def create_event(self, event: Mapping[str, Any]) -> None: ...


class KubeTopologyStatusApi:
    """:class:`TopologyStatusApi` over the one Kubernetes client."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def apply_condition(self, node: str, condition: Mapping[str, str]) -> None:
        body = {
            "apiVersion": names.API_VERSION,
            "kind": "NodeTopology",
            "metadata": {"name": node},
            "status": {"conditions": [dict(condition)]},
        }
        await self._api.apply(NODE_TOPOLOGIES, body, subresource="status")

    async def create_event(self, event: Mapping[str, Any]) -> None:
        await self._api.create(EVENTS, event)


class Refusals(Protocol):
    """What the reporter reads of the cluster cache."""

    def refused_topologies(self) -> Mapping[str, str]: ...

    def accepted_conditions(self) -> Mapping[str, tuple[str, str]]: ...


class TopologyStatusReporter:
    """Brings each NodeTopology's ``Accepted`` condition (and its Node's Events) in line with
    what the cache refused; call :meth:`sync` on the leader now and then."""

    def __init__(self, api: TopologyStatusApi) -> None:
        self.api = api
        #: node -> the message last written and not yet seen back on the watch ("" for True):
        #: no second write while the first one's echo is on its way. Bounded by the nodes
        #: whose condition is out of date.
        self._sent: dict[str, str] = {}

    async def sync(self, cache: Refusals, now: float) -> int:
        """Write what is out of date; returns how many conditions were written."""
        refused = dict(cache.refused_topologies())
        carried = dict(cache.accepted_conditions())
        want: dict[str, str] = dict(refused)
        for node, (status, _) in carried.items():
            if status == "False" and node not in refused:
                want[node] = ""
        for node in [n for n in self._sent if n not in want]:
            del self._sent[node]
        written = 0
        for node, problem in sorted(want.items()):
            if written >= MAX_WRITES_PER_SYNC:
                break
            if problem and carried.get(node) == ("False", problem):
                self._sent.pop(node, None)  # the object shows it: nothing on its way
                continue
            if self._sent.get(node) == problem:
                continue
            try:
                await self.api.apply_condition(node, condition(problem or None, now))
            except Exception as exc:
                log.warning("cannot set condition %s on NodeTopology %s: %s", ACCEPTED, node, exc)
                continue
            self._sent[node] = problem
            written += 1
            if problem:
                message = f"NodeTopology {node} refused, node kept out of placement: {problem}"
                log.warning("%s", message)
                try:
                    await self.api.create_event(node_event(node, message, now))
                except Exception as exc:
                    log.debug("event for node %s: %s", node, exc)
        return written
