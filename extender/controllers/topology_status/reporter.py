"""A NodeTopology gangslice cannot use is said so, on the object and on its Node.

The cluster cache keeps a node whose NodeTopology fails validation
(:func:`extender.kube.crd_models.parse_node_topology`) out of placement, and remembers why
(:meth:`~extender.kube.cache.ClusterInformer.refused_topologies`); the extender's filter names
that reason for the node and ``gangslice explain`` lists it. this reconciler
makes it visible in the API too, from the leader's housekeeping loop:

- the NodeTopology gets the condition ``Accepted=False``, reason ``InvalidSpec``, message
  ``<field>: <problem>`` (e.g. ``spec.nvlinkGbps: Input should be greater than 0``), applied
  to its ``/status`` subresource with server-side apply through the controller's one client
  (field manager ``gangslice``), so the node agent's own conditions, applied under
  ``gangslice-agent``, are left alone (``status.conditions`` is a list-map keyed by type).
  This condition is the one part of a NodeTopology the agent does not write;
- its Node gets a Warning Event, reason ``InvalidNodeTopology``, once per new message;
- once the spec reads again, the condition turns ``Accepted=True``, reason ``SpecValid``.

A DRA node (its GPUs published by NVIDIA's ``gpu.nvidia.com`` driver, see
:mod:`extender.kube.dra`) whose devices do not pair with the NodeTopology's GPUs gets the same
treatment under a second condition, ``DevicesMatched=False`` reason ``DeviceMismatch`` (Event
reason ``DraDeviceMismatch``), naming the device or GPU; ``DevicesMatched=True`` once they pair.

A node whose agent reports a GPU unhealthy (``spec.health``: an NVLink or PCIe error rate over
the agent's threshold, or counters NVML cannot read) gets a third, ``InterconnectHealthy=False``
reason ``InterconnectDegraded``, naming each GPU, its UUID and the rate over its threshold, and
the Event ``GpuInterconnectDegraded`` on its Node; ``InterconnectHealthy=True`` once every GPU
is back within the thresholds. (The Node object's own conditions are left to the kubelet and
node-problem-detector: writing them would take ``nodes/status: patch`` on every node.)

What is written follows what the watch shows: the condition is (re)written while the object
does not carry it with the current message, so a restart, a lost write or a fresh replica
converges on the same state without remembering anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube import events, names
from extender.kube.api import EVENTS, NODE_TOPOLOGIES, KubeClient
from extender.kube.crd_models import rfc3339
from extender.kube.events import ObjectRef
from extender.kube.topology_status import (
    ACCEPTED,
    DEVICE_MISMATCH,
    DEVICES_MATCHED,
    DEVICES_PAIRED,
    DRA_DEVICE_MISMATCH,
    GPU_INTERCONNECT_DEGRADED,
    INTERCONNECT_DEGRADED,
    INTERCONNECT_HEALTHY,
    INVALID_NODE_TOPOLOGY,
    INVALID_SPEC,
    LINKS_WITHIN_THRESHOLDS,
    SPEC_VALID,
)

log = logging.getLogger(__name__)

#: Events about cluster-scoped Nodes live in ``default``, with the node's name as uid: what
#: the kubelet writes and what ``kubectl describe node`` selects on.
NODE_EVENT_NAMESPACE = "default"
#: Conditions written per :meth:`TopologyStatusReporter.sync` at most (the rest on the next
#: one): a fleet of agents writing a bad spec at once must not hold up housekeeping.
MAX_WRITES_PER_SYNC = 50


@dataclass(frozen=True, slots=True)
class _Rule:
    """One condition this module writes: its type, reasons and the Event of a problem."""

    type: str
    bad: str
    good: str
    good_message: str
    event_reason: str
    event_text: str


_RULES = (
    _Rule(
        ACCEPTED,
        INVALID_SPEC,
        SPEC_VALID,
        "the spec reads; the node takes part in placement",
        INVALID_NODE_TOPOLOGY,
        "NodeTopology {node} refused, node kept out of placement: {problem}",
    ),
    _Rule(
        DEVICES_MATCHED,
        DEVICE_MISMATCH,
        DEVICES_PAIRED,
        "every gpu.nvidia.com device of the node pairs with a GPU of this NodeTopology",
        DRA_DEVICE_MISMATCH,
        "DRA devices of node {node} do not match its NodeTopology, "
        "node kept out of in-node choices: {problem}",
    ),
    _Rule(
        INTERCONNECT_HEALTHY,
        INTERCONNECT_DEGRADED,
        LINKS_WITHIN_THRESHOLDS,
        "every GPU's NVLink and PCIe error rates are within the node agent's thresholds",
        GPU_INTERCONNECT_DEGRADED,
        "GPU interconnect of node {node} degraded; these GPUs are given to no new gang: {problem}",
    ),
)


def condition(problem: str | None, now: float, rule: _Rule = _RULES[0]) -> dict[str, str]:
    """The ``Accepted`` (or ``rule``'s) condition: False naming ``problem``, or True when there is none."""
    return {
        "type": rule.type,
        "status": "False" if problem else "True",
        "reason": rule.bad if problem else rule.good,
        "message": problem or rule.good_message,
        "lastTransitionTime": rfc3339(now),
    }


def node_event(node: str, message: str, now: float, reason: str = INVALID_NODE_TOPOLOGY) -> dict[str, Any]:
    return events.event(
        ObjectRef("v1", "Node", node, uid=node), reason, message, now, namespace=NODE_EVENT_NAMESPACE
    )


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

    def device_problems(self) -> Mapping[str, str]: ...

    def interconnect_problems(self) -> Mapping[str, str]: ...

    def conditions_shown(self, type_: str) -> Mapping[str, tuple[str, str]]: ...


class TopologyStatusReporter:
    """Brings each NodeTopology's ``Accepted`` condition (and its Node's Events) in line with
    what the cache refused; call :meth:`sync` on the leader now and then."""

    def __init__(self, api: TopologyStatusApi) -> None:
        self.api = api
        #: (condition type, node) -> the message last written and not yet seen back on the
        #: watch ("" for True): no second write while the first one's echo is on its way.
        #: Bounded by the nodes whose condition is out of date.
        self._sent: dict[tuple[str, str], str] = {}

    async def sync(self, cache: Refusals, now: float) -> int:
        """Write what is out of date; returns how many conditions were written."""
        problems = (cache.refused_topologies(), cache.device_problems(), cache.interconnect_problems())
        written = 0
        for rule, problem in zip(_RULES, problems, strict=True):
            budget = MAX_WRITES_PER_SYNC - written
            shown = cache.conditions_shown(rule.type)
            written += await self._sync_rule(rule, dict(problem), dict(shown), now, budget)
        return written

    async def _sync_rule(
        self,
        rule: _Rule,
        refused: dict[str, str],
        carried: dict[str, tuple[str, str]],
        now: float,
        budget: int,
    ) -> int:
        want: dict[str, str] = dict(refused)
        for node, (status, _) in carried.items():
            if status == "False" and node not in refused:
                want[node] = ""
        for key in [k for k in self._sent if k[0] == rule.type and k[1] not in want]:
            del self._sent[key]
        written = 0
        for node, problem in sorted(want.items()):
            if written >= budget:
                break
            key = (rule.type, node)
            if problem and carried.get(node) == ("False", problem):
                self._sent.pop(key, None)  # the object shows it: nothing on its way
                continue
            if self._sent.get(key) == problem:
                continue
            try:
                await self.api.apply_condition(node, condition(problem or None, now, rule))
            except Exception as exc:
                log.warning("cannot set condition %s on NodeTopology %s: %s", rule.type, node, exc)
                continue
            self._sent[key] = problem
            written += 1
            if problem:
                message = rule.event_text.format(node=node, problem=problem)
                log.warning("%s", message)
                try:
                    await self.api.create_event(node_event(node, message, now, rule.event_reason))
                except Exception as exc:
                    log.debug("event for node %s: %s", node, exc)
        return written
