"""The ``NodeTopology`` object the node agent publishes, and the writer that publishes it.

Contract (group ``gangslice.io``, version ``v1alpha1``, kind ``NodeTopology``, plural
``nodetopologies``, cluster-scoped, one object per node named after the node; the CRD
declares the ``status`` subresource)::

    apiVersion: gangslice.io/v1alpha1
    kind: NodeTopology
    metadata:
      name: <node name>
      ownerReferences:             # when the agent could read its Node: deleted with the node
        - {apiVersion: v1, kind: Node, name: <node name>, uid: <node uid>}
    spec:
      # the GPU graph, exactly what extender.topology.serialize.graph_to_dict returns:
      gpus: [{index, uuid?, pciBusId?, numaNode?, cpuAffinity? ("0-47,96-143"), name?}]
      links: [{a, b, link}]        # one per GPU pair, link = NV18 | PIX | PXB | PHB | NODE | SYS
      nics: [{name, numaNode?, gpuLinks: {"<gpu index>": PIX | ...}}]
      health: [{index, healthy, nvlinkErrorsPerSecond, pcieReplaysPerSecond, reason?}]
      clique: {clusterUuid, cliqueId}   # optional: multi-node NVLink (GB200 NVL72)
      nvlinkGbps: <float>
      pcieGbps: <float>
      model: <str>                 # optional
      # from the kubelet PodResources API:
      devicesInUse:                # sorted by namespace, pod, container, deviceId
        - {deviceId: <GPU UUID as the kubelet reports it, "::n" replica suffix stripped>,
           index: <GPU index; absent, i.e. null, when the id is no GPU of the graph (MIG)>,
           namespace, pod, container}
      allocatableDevices: [<device ids from GetAllocatableResources, sorted>]
      kubelet:                     # absent when the kubelet configuration could not be read
        topologyManagerPolicy: none | best-effort | restricted | single-numa-node
        topologyManagerScope: container | pod
        cpuManagerPolicy: none | static
        memoryManagerPolicy: None | Static
        numaNodes:                 # absent when sysfs or PodResources could not be read
          - {id, cpus: "0-27,56-83" (sysfs), allocatableCpus, cpusInUse (PodResources),
             memory?, memoryInUse? (bytes; only with memoryManagerPolicy Static)}
      source: nvml | nvidia-smi | none
      allocation: devicePlugin | dra   # who picks each pod's GPUs (``gangslice agent --allocation``)
    status:
      conditions:
        - {type: Discovered | PodResourcesAvailable | DevicesKnown | KubeletTopologyRead,
           status: "True" | "False",
           reason: <CamelCase>, message, lastTransitionTime: <RFC 3339>}
      observedGeneration: <metadata.generation the status describes>
      lastPublished: <RFC 3339, when the agent wrote the object>

``DevicesKnown`` (present while PodResources is listed) is ``False``, reason
``UnknownDevices``, when the kubelet names GPU device ids NVML does not see on the node; its
message names the PodResources field and the ids. Those devices carry no ``index`` in
``devicesInUse``, so gangslice counts nothing on them and drops nothing it holds.

Reading it: with ``source: none`` the graph is empty (no GPUs known) and ``Discovered`` is
``False`` naming why. ``devicesInUse`` and ``allocatableDevices`` are empty whenever
``PodResourcesAvailable`` is ``False``, so read them only when it is ``True``. Health rates
and condition messages are refreshed whenever the object is written; a change of them alone
does not cause a write, a GPU turning healthy or unhealthy does (see :func:`change_key`).

Writing it: server-side apply, field manager ``gangslice-agent``, ``force=True``: first
``metadata`` and ``spec`` on the object, then ``status`` on the ``/status`` subresource
(``observedGeneration`` taken from the first reply). RBAC: ``get`` on ``nodes`` (the owner
reference), ``get``/``create``/``patch`` on ``nodetopologies`` and ``patch`` on
``nodetopologies/status``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.agent.podresources import DeviceUse
from extender.kube.api import APPLY_PATCH, NODE_TOPOLOGIES, NODES, KubeClient
from extender.kube.names import API_VERSION
from extender.topology.allocation import Allocation
from extender.topology.model import GpuGraph, GpuHealth
from extender.topology.serialize import graph_to_dict

log = logging.getLogger(__name__)

KIND = "NodeTopology"
GROUP = NODE_TOPOLOGIES.group
PLURAL = NODE_TOPOLOGIES.plural
FIELD_MANAGER = "gangslice-agent"
APPLY_CONTENT_TYPE = APPLY_PATCH

DISCOVERED = "Discovered"
POD_RESOURCES_AVAILABLE = "PodResourcesAvailable"
DEVICES_KNOWN = "DevicesKnown"

SOURCES = ("nvml", "nvidia-smi", "none")


def rfc3339(at: datetime) -> str:
    """``2026-08-01T12:00:00Z`` (seconds, UTC), the form Kubernetes writes."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass
class ConditionClock:
    """Keeps each condition's ``lastTransitionTime``: it moves only when the status flips."""

    _since: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def stamp(self, conditions: Sequence[Condition], now: datetime) -> list[dict[str, str]]:
        out = []
        for c in conditions:
            prev = self._since.get(c.type)
            if prev is None or prev[0] != c.status:
                self._since[c.type] = (c.status, rfc3339(now))
            out.append(
                {
                    "type": c.type,
                    "status": "True" if c.status else "False",
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": self._since[c.type][1],
                }
            )
        return out


def devices_in_use(uses: Sequence[DeviceUse], graph: GpuGraph) -> list[dict[str, Any]]:
    """``devicesInUse`` entries: each kubelet device id with the GPU index it names."""
    by_uuid = {g.uuid: g.index for g in graph.gpus if g.uuid}
    out = []
    for u in sorted(uses):
        entry: dict[str, Any] = {"deviceId": u.device_id}
        if u.device_id in by_uuid:
            entry["index"] = by_uuid[u.device_id]
        out.append({**entry, "namespace": u.namespace, "pod": u.pod, "container": u.container})
    return out


def devices_known(uses: Sequence[DeviceUse], allocatable: Sequence[str], graph: GpuGraph) -> Condition:
    """``DevicesKnown``: whether every GPU device id the kubelet names is a GPU NVML sees.
    MIG devices (``MIG-…``) are not whole GPUs of the graph and are not counted as unknown."""
    seen = {g.uuid for g in graph.gpus if g.uuid}

    def unknown(device: str) -> bool:
        return device not in seen and not device.upper().startswith("MIG-")

    held: dict[str, set[str]] = {}
    for u in uses:
        if unknown(u.device_id):
            held.setdefault(u.device_id, set()).add(f"{u.namespace}/{u.pod}")
    spare = sorted({d for d in allocatable if unknown(d)} - set(held))
    if not held and not spare:
        return Condition(DEVICES_KNOWN, True, "AllSeen", "every GPU the kubelet names is one NVML sees")
    parts = []
    if held:
        listed = ", ".join(f"{d} (pod {', '.join(sorted(p))})" for d, p in sorted(held.items()))
        parts.append(f"List: containers[].devices[].device_ids {listed}")
    if spare:
        parts.append(f"GetAllocatableResources: devices[].device_ids {', '.join(spare)}")
    return Condition(
        DEVICES_KNOWN,
        False,
        "UnknownDevices",
        "the kubelet's PodResources names GPUs NVML does not see on this node (not counted): "
        + "; ".join(parts),
    )


def build_spec(
    graph: GpuGraph,
    source: str,
    in_use: Sequence[Mapping[str, Any]],
    allocatable: Sequence[str],
    allocation: Allocation = Allocation.DEVICE_PLUGIN,
) -> dict[str, Any]:
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    return {
        **graph_to_dict(graph),
        "devicesInUse": [dict(d) for d in in_use],
        "allocatableDevices": sorted(allocatable),
        "source": source,
        "allocation": str(allocation),
    }


def build_object(
    node: str,
    spec: Mapping[str, Any],
    conditions: Sequence[Mapping[str, str]],
    published_at: datetime,
    node_uid: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": node}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": copy.deepcopy(dict(spec)),
        "status": {"conditions": [dict(c) for c in conditions], "lastPublished": rfc3339(published_at)},
    }


def change_key(obj: Mapping[str, Any]) -> str:
    """What must differ for the agent to write again.

    The spec, the owner reference and each condition's type, status and reason. Left out,
    because they move a little every interval and would turn every sample into a write:
    the exact health rates and reasons (whether each GPU is healthy does count, and so does
    each step of √2 in the share of link bandwidth placement counts on for it,
    :attr:`GpuHealth.nvlink_share`), condition messages (an error text may name a different
    detail each time) and timestamps. They are refreshed by the next write.
    """
    spec = dict(obj["spec"])
    spec["health"] = [
        {"index": h["index"], "healthy": h["healthy"], "grade": _grade(h)} for h in spec.get("health", ())
    ]
    conditions = [(c["type"], c["status"], c.get("reason")) for c in obj["status"]["conditions"]]
    owner = obj["metadata"].get("ownerReferences")
    return json.dumps({"spec": spec, "conditions": conditions, "owner": owner}, sort_keys=True)


def _grade(entry: Mapping[str, Any]) -> tuple[int, int] | None:
    """Steps of √2 in the NVLink and PCIe bandwidth shares of one published health entry (None
    for an unhealthy GPU: nothing is placed on it whatever its rates)."""
    if not entry.get("healthy", True):
        return None
    h = GpuHealth(
        nvlink_errors_per_s=float(entry.get("nvlinkErrorsPerSecond", 0.0)),
        pcie_replays_per_s=float(entry.get("pcieReplaysPerSecond", 0.0)),
    )
    return math.floor(-2 * math.log2(h.nvlink_share)), math.floor(-2 * math.log2(h.pcie_share))


# --- writers ---------------------------------------------------------------------------


class Writer(Protocol):
    """Where NodeTopology objects go: the Kubernetes API, or a recorder in tests."""

    def node_uid(self, node: str) -> str | None:
        """The Node's UID for the owner reference; None when it cannot be read."""
        ...

    def publish(self, obj: Mapping[str, Any]) -> None:
        """Apply the object (spec, then status); raise on any API error."""
        ...


class KubeWriter:
    """:class:`Writer` over the one client (server-side apply as :data:`FIELD_MANAGER`): the
    only writer of NodeTopology objects.

    The agent's loop is synchronous (it samples NVML and the kubelet on a timer); the writer
    drives the async client on an event loop of its own, from the agent's thread.
    """

    def __init__(self, api: KubeClient) -> None:
        self._api = api
        self._loop = asyncio.new_event_loop()

    @classmethod
    def connect(cls, kubeconfig: str | None = None, *, timeout_s: float = 10.0) -> KubeWriter:
        """In-cluster credentials, or a kubeconfig file when given (or when not in a pod)."""
        from extender.kube.client import ApiServerClient, load_api_client

        return cls(
            ApiServerClient(load_api_client(kubeconfig), field_manager=FIELD_MANAGER, timeout_s=timeout_s)
        )

    def close(self) -> None:
        self._loop.close()

    def node_uid(self, node: str) -> str | None:
        try:
            obj = self._loop.run_until_complete(self._api.get(NODES, node))
        except Exception as exc:  # the owner reference is a nicety; never fail publishing for it
            log.warning("cannot read Node %s for the owner reference: %s", node, exc)
            return None
        uid = (obj.get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    def publish(self, obj: Mapping[str, Any]) -> None:
        self._loop.run_until_complete(self._publish(obj))

    async def _publish(self, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        body = {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        applied = await self._api.apply(NODE_TOPOLOGIES, body)
        status = dict(obj["status"])
        generation = (applied.get("metadata") or {}).get("generation")
        if generation is not None:
            status["observedGeneration"] = generation
        await self._api.apply(
            NODE_TOPOLOGIES,
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "status": status},
            subresource="status",
        )
