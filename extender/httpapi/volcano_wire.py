"""Wire types of Volcano's scheduler ``extender`` plugin (``pkg/scheduler/plugins/extender``).

Requests only: the routes build replies as dicts. Request and reply envelopes carry json
tags (``task``, ``node``, ``nodes``, ``job``, ``status``, ``code``, ``nodeScore``,
``errorMessage``); the scheduler objects inside them (TaskInfo, NodeInfo, JobInfo,
Resource) have none, so their keys are capitalised Go names. All are matched in any case
on input, as Go does. Scalar resources are in milli-units
(8 GPUs arrive as ``8000``).

Codes and statuses: predicate ``code`` 0 Success, 1 Error, 2 Unschedulable,
3 UnschedulableAndUnresolvable; jobEnqueueable ``status`` 1 Permit, 0 Abstain, -1 Reject.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from extender.httpapi.wire import GoModel
from extender.kube import names
from extender.kube.pods import milli_quantity

SUCCESS = 0
ERROR = 1
UNSCHEDULABLE = 2
UNSCHEDULABLE_AND_UNRESOLVABLE = 3

PERMIT = 1
ABSTAIN = 0
REJECT = -1


class Resource(GoModel):
    milli_cpu: float = Field(0.0, alias="MilliCPU")
    memory: float = Field(0.0, alias="Memory")
    #: Values stay as sent: the GPU count is read by the one strict reader (a string, a
    #: negative or a fractional count is refused, naming the field).
    scalar_resources: dict[str, Any] | None = Field(None, alias="ScalarResources")
    max_task_num: int = Field(0, alias="MaxTaskNum")

    def gpus(self, where: str = "Resource") -> int:
        """Whole GPUs; raises PodError naming ``where``.ScalarResources[nvidia.com/gpu]."""
        milli = (self.scalar_resources or {}).get(names.GPU_RESOURCE, 0)
        return milli_quantity(milli, f"{where}.ScalarResources[{names.GPU_RESOURCE}]")


class TaskInfo(GoModel):
    uid: str = Field("", alias="UID")
    #: ``<namespace>/<podgroup name>``
    job: str = Field("", alias="Job")
    name: str = Field("", alias="Name")
    namespace: str = Field("", alias="Namespace")
    task_role: str = Field("", alias="TaskRole")
    resreq: Resource | None = Field(None, alias="Resreq")
    init_resreq: Resource | None = Field(None, alias="InitResreq")
    node_name: str = Field("", alias="NodeName")
    status: int = Field(0, alias="Status")
    priority: int = Field(0, alias="Priority")
    pod: dict[str, Any] | None = Field(None, alias="Pod")


class NodeInfo(GoModel):
    name: str = Field("", alias="Name")
    node: dict[str, Any] | None = Field(None, alias="Node")
    idle: Resource | None = Field(None, alias="Idle")
    used: Resource | None = Field(None, alias="Used")
    allocatable: Resource | None = Field(None, alias="Allocatable")

    def node_name(self) -> str:
        if self.name:
            return self.name
        meta = (self.node or {}).get("metadata")
        got = meta.get("name") if isinstance(meta, dict) else None
        return got if isinstance(got, str) else ""


class JobInfo(GoModel):
    uid: str = Field("", alias="UID")
    name: str = Field("", alias="Name")
    namespace: str = Field("", alias="Namespace")
    queue: str = Field("", alias="Queue")
    min_available: int = Field(0, alias="MinAvailable")
    total_request: Resource | None = Field(None, alias="TotalRequest")
    pod_group: dict[str, Any] | None = Field(None, alias="PodGroup")

    @property
    def key(self) -> str:
        if self.namespace and self.name:
            return f"{self.namespace}/{self.name}"
        return self.uid


class PredicateRequest(GoModel):
    task: TaskInfo = Field(alias="task")
    node: NodeInfo = Field(alias="node")


class PrioritizeRequest(GoModel):
    task: TaskInfo = Field(alias="task")
    nodes: list[NodeInfo] | None = Field(None, alias="nodes")


class JobRequest(GoModel):
    """jobEnqueueable (and jobReady/jobEnqueued) request."""

    job: JobInfo = Field(alias="job")


class EventHandlerRequest(GoModel):
    """allocateFunc / deallocateFunc request."""

    task: TaskInfo = Field(alias="task")
