"""The conditions of a NodeTopology's status that gangslice's scheduler side owns, and reading
them off an object.

``Accepted`` says whether the spec reads (:func:`extender.kube.crd_models.parse_node_topology`);
``DevicesMatched`` whether a DRA node's published devices pair with its GPUs;
``InterconnectHealthy`` whether every GPU's NVLink and PCIe error rates are within the node
agent's thresholds (its ``spec.health``). The cluster cache reads them back from the watch; the
leader's reconciler (:mod:`extender.controllers.topology_status.reporter`) writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The NodeTopology condition gangslice's scheduler side owns.
ACCEPTED = "Accepted"
INVALID_SPEC = "InvalidSpec"
SPEC_VALID = "SpecValid"
#: The Event reason on the Node.
INVALID_NODE_TOPOLOGY = "InvalidNodeTopology"

#: The condition on a DRA node's NodeTopology: its published devices pair with its GPUs.
DEVICES_MATCHED = "DevicesMatched"
DEVICE_MISMATCH = "DeviceMismatch"
DEVICES_PAIRED = "DevicesPaired"
DRA_DEVICE_MISMATCH = "DraDeviceMismatch"

#: The condition on a NodeTopology whose GPUs' links are all within the agent's thresholds.
INTERCONNECT_HEALTHY = "InterconnectHealthy"
INTERCONNECT_DEGRADED = "InterconnectDegraded"
LINKS_WITHIN_THRESHOLDS = "LinksWithinThresholds"
#: The Event reason on the Node.
GPU_INTERCONNECT_DEGRADED = "GpuInterconnectDegraded"

#: The conditions gangslice's scheduler side owns (the cache reads them back from the watch).
SCHEDULER_CONDITIONS = (ACCEPTED, DEVICES_MATCHED, INTERCONNECT_HEALTHY)


def condition_of(obj: Mapping[str, Any], type_: str) -> tuple[str, str] | None:
    """The condition ``type_`` a NodeTopology object carries: (status, message), or None."""
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == type_:
            return str(c.get("status") or ""), str(c.get("message") or "")
    return None
