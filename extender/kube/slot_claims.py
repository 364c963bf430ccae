"""Per-slot ResourceClaims on DRA nodes: the claim that pins one slot's GPUs, how a pod is
matched to its slot, and the one writer of claims.

On a ``dra`` node the slice's in-node choice is made binding: each slot of a reservation
gets one ResourceClaim whose GPU request selects exactly the slot's devices by UUID (a CEL
selector; ``count`` = the slot's GPUs), plus ``matchAttribute: resource.kubernetes.io/pcieRoot``
when the slot's devices share one PCIe root (a safety net for the GPUs: it can only hold where
it holds already), joined by the template's NIC request where the node has enough NICs on that
root: the NIC beside the GPUs where one is free there, else any (``firstAvailable``). The
claim copies the rest of the pod's ResourceClaimTemplate (other requests, config,
constraints) so the pod's containers see what they asked for. kube-scheduler's
DynamicResources plugin allocates it (finalizer, in-flight tracking, ``reservedFor``);
gangslice never writes ``status.allocation``. The claim is owned by the gang's
SliceReservation, so the garbage collector deletes it when the gang's reservation goes.

Matching a pod to its slot happens at pod creation (a pod's ``resourceClaims`` are fixed
then), in :func:`pick_slot`: a pod that carries an index (a Job's completion index, a
StatefulSet's ordinal, a LeaderWorkerSet's worker index) gets the slot of that position in
its pod set, so a replacement pod of the same index gets the same devices; any other pod
gets the first slot of its pod set not yet handed out. The slot a pod got is written on it
(``gangslice.io/slot``), so which slots are handed out is read back from the pods after a
restart.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.kube import dra, names
from extender.kube.api import (
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    SLICE_RESERVATIONS,
    Conflict,
    KubeClient,
    NotFound,
    as_map,
)
from extender.kube.pods import PodInfo, digits
from extender.placement.ledger import Reservation
from extender.placement.slice import PodSlot

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
#: A LeaderWorkerSet pod's position in its group (the leader is 0).
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
#: Pod labels that give a pod's position in its pod set, in the order they are read.
INDEX_LABELS = ("batch.kubernetes.io/job-completion-index", "apps.kubernetes.io/pod-index", WORKER_INDEX)
#: JobSet: which Job of its replicatedJob a pod's Job is, and how many Jobs that makes.
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"


class SlotError(Exception):
    """A pod gangslice cannot give a slot (the message says why, for the admission reply)."""


def slot_label(slot: PodSlot) -> str:
    """The slot key as a label value (``decode-1``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", slot.key)[:63].strip("-_.")


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """The request of a ResourceClaimTemplate that asks for whole GPUs of ``gpu.nvidia.com``."""

    name: str
    device_class: str
    count: int


def gpu_request_of(template: Mapping[str, Any], drivers_of: Any) -> GpuRequest | None:
    """The GPU request of a ResourceClaimTemplate: one ``exactly`` request, ``ExactCount``, of a
    DeviceClass that selects ``gpu.nvidia.com`` (``drivers_of(name)`` -> drivers or None).
    Raises :class:`SlotError` for a GPU request gangslice cannot pin (``All``, several)."""
    spec = as_map(as_map(as_map(template.get("spec")).get("spec")).get("devices"))
    found = []
    for req in spec.get("requests") or ():
        exactly = as_map(as_map(req).get("exactly"))
        cls = exactly.get("deviceClassName")
        if not isinstance(cls, str):
            continue
        drivers = drivers_of(cls)
        if cls != dra.GPU_DEVICE_CLASS and (drivers is None or dra.GPU_DRIVER not in drivers):
            continue
        mode = exactly.get("allocationMode") or "ExactCount"
        count = exactly.get("count", 1)
        if mode != "ExactCount" or not isinstance(count, int) or count < 1:
            raise SlotError(
                f"request {req.get('name')} of {cls} is {mode}; gangslice pins ExactCount requests"
            )
        found.append(GpuRequest(str(req.get("name") or ""), cls, count))
    if len(found) > 1:
        raise SlotError("the template has several GPU requests; gangslice pins one per pod")
    return found[0] if found else None


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """The ``resourceClaims`` entry of a pod (or pod template) whose ResourceClaimTemplate asks
    for whole GPUs of ``gpu.nvidia.com``: its position, the entry, the template, its request."""

    position: int
    entry: Mapping[str, Any]
    template: Mapping[str, Any]
    request: GpuRequest


async def gpu_claim(
    api: KubeClient, namespace: str, spec: Mapping[str, Any], drivers_of: Any
) -> GpuClaim | None:
    """The GPU claim of a pod spec (the admission webhook's pod, a Kueue pod set's template),
    reading its ResourceClaimTemplates; None when it asks for no GPUs through DRA. Raises
    :class:`SlotError` for a missing template, a GPU request gangslice cannot pin, or several."""
    found = []
    for position, entry in enumerate(spec.get("resourceClaims") or ()):
        template_name = as_map(entry).get("resourceClaimTemplateName")
        if not isinstance(template_name, str) or not template_name:
            continue
        try:
            template = await api.get(RESOURCE_CLAIM_TEMPLATES, template_name, namespace)
        except NotFound:
            raise SlotError(f"ResourceClaimTemplate {namespace}/{template_name} does not exist") from None
        try:
            gpu = gpu_request_of(template, drivers_of)
        except SlotError as exc:
            raise SlotError(f"ResourceClaimTemplate {namespace}/{template_name}: {exc}") from None
        if gpu is not None:
            found.append(GpuClaim(position, entry, template, gpu))
    if len(found) > 1:
        raise SlotError("the pod has several GPU claims of gpu.nvidia.com; gangslice pins one per pod")
    return found[0] if found else None


def uuid_selector(uuids: Sequence[str]) -> str:
    """The CEL expression that admits exactly these GPUs (CEL cannot see device names)."""
    listed = ", ".join(json.dumps(u) for u in uuids)
    return f'device.attributes["{dra.GPU_DRIVER}"].uuid in [{listed}]'


def build_claim(
    *,
    namespace: str,
    name: str,
    template: Mapping[str, Any],
    request: GpuRequest,
    slot: PodSlot,
    devices: Sequence[dra.Device],
    reservation: Mapping[str, str],
    at_root: Callable[[str, str], int] | None = None,
) -> dict[str, Any]:
    """The ResourceClaim that pins ``slot`` to ``devices``: the template's claim spec with its
    GPU request narrowed to the devices' UUIDs. ``reservation``: name and uid of the owner.
    When the devices share one PCIe root, each other ``ExactCount`` request of the template whose
    DeviceClass has as many devices on that root of the slot's node (``at_root(class, root)``:
    NICs a network driver publishes) becomes two alternatives, the first of which joins the
    GPUs' ``matchAttribute`` on it: the NICs beside them where they are free, else any."""
    uuids = [d.uuid for d in devices if d.uuid]
    if len(uuids) != len(devices) or len(devices) != request.count:
        raise SlotError(
            f"slot {slot.key} has {len(devices)} devices with {len(uuids)} UUIDs; "
            f"the pod asks for {request.count}"
        )
    spec = copy.deepcopy(dict(as_map(as_map(template.get("spec")).get("spec"))))
    devs = spec.setdefault("devices", {})
    for req in devs.get("requests") or ():
        if req.get("name") == request.name:
            exactly = req["exactly"]
            exactly["allocationMode"] = "ExactCount"
            exactly["count"] = request.count
            exactly["selectors"] = [
                *(exactly.get("selectors") or ()),
                {"cel": {"expression": uuid_selector(uuids)}},
            ]
    roots = {d.pcie_root for d in devices}
    if len(roots) == 1 and None not in roots:
        (root,) = roots
        assert root is not None
        beside = []
        for req in devs.get("requests") or ():
            if _fits_root(req, request, root, at_root):
                req["firstAvailable"] = _beside_else_anywhere(req.pop("exactly"))
                beside.append(f"{req['name']}/{BESIDE}")
        devs["constraints"] = [
            *(devs.get("constraints") or ()),
            {"requests": [request.name, *beside], "matchAttribute": dra.PCIE_ROOT},
        ]
    gang_name = reservation.get("gang", "")
    labels = {names.SLOT: slot_label(slot), names.OWNER_KIND_LABEL: "SliceReservation"}
    if gang_name:
        labels[names.OWNER_NAME_LABEL] = names.label_value(gang_name)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                names.GPUS: ",".join(str(g) for g in slot.gpus),
                names.GPU_UUIDS: ",".join(uuids),
                names.SLOT_NODE: slot.node,
            },
            "ownerReferences": [
                {
                    "apiVersion": names.API_VERSION,
                    "kind": "SliceReservation",
                    "name": reservation["name"],
                    "uid": reservation["uid"],
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


#: The subrequests a NIC request becomes: a NIC on the GPUs' PCIe root, else any.
BESIDE, ANYWHERE = "beside", "anywhere"


def _beside_else_anywhere(exactly: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An ``exactly`` request as two alternatives (``firstAvailable``, GA since Kubernetes
    1.36, on by default since 1.34): the first joins the GPUs' root constraint, the second is
    the request as written, so a root whose NICs are taken leaves the pod a NIC elsewhere."""
    return [{"name": name, **copy.deepcopy(dict(exactly))} for name in (BESIDE, ANYWHERE)]


def _fits_root(
    req: Mapping[str, Any], gpu: GpuRequest, root: str, at_root: Callable[[str, str], int] | None
) -> bool:
    """Whether request ``req`` (not the GPU request) can be met on PCIe root ``root``."""
    exactly = as_map(req.get("exactly"))
    cls, count = exactly.get("deviceClassName"), exactly.get("count", 1)
    if req.get("name") == gpu.name or at_root is None or not isinstance(cls, str):
        return False
    if exactly.get("adminAccess"):  # a subrequest has no admin access: left as written
        return False
    if (exactly.get("allocationMode") or "ExactCount") != "ExactCount" or not isinstance(count, int):
        return False
    return at_root(cls, root) >= count


def pod_index(pod: PodInfo) -> int | None:
    """The pod's position in its pod set, from the first index label it carries."""
    for key in INDEX_LABELS:
        raw = pod.labels.get(key)
        if raw is not None:
            got = digits(raw)
            if got is not None:
                return got
    return None


def slot_index(pod: PodInfo, slots: int) -> int | None:
    """The pod's position among the ``slots`` slots of its pod set (None: it has none, and
    takes the first slot free):

    - a JobSet's pod: its Job's index times the pods per Job (the pod set's slots over the
      replicatedJob's replicas) plus its completion index; each Job numbers its pods from 0;
    - a LeaderWorkerSet's worker where the leader is a pod set of its own (its pod set has
      ``size - 1`` slots): its worker index less one, the leader being index 0;
    - else the first index label it carries (:func:`pod_index`).
    """
    index = pod_index(pod)
    if index is None:
        return None
    job = digits(pod.labels.get(JOBSET_JOB_INDEX, "") or "-")
    if job is not None:
        replicas = digits(pod.labels.get(JOBSET_REPLICAS, "") or "-")
        if not replicas or slots % replicas:
            return None
        return job * (slots // replicas) + index
    size = digits(pod.annotations.get(names.LWS_SIZE, "") or "-")
    if WORKER_INDEX in pod.labels and size is not None and slots == size - 1 and index >= 1:
        return index - 1
    return index


def pick_slot(r: Reservation, pod: PodInfo, handed: Mapping[str, str]) -> PodSlot:
    """The slot of ``r`` that ``pod`` (asking for ``pod.gpus`` GPUs) gets at creation.
    ``handed``: slot key -> the pod it went to. Raises :class:`SlotError`."""
    slots = [s for s in r.slice.slots if len(s.gpus) == pod.gpus]
    if pod.pod_set and any(s.pod_set == pod.pod_set for s in slots):
        slots = [s for s in slots if s.pod_set == pod.pod_set]
    slots.sort(key=lambda s: (s.pod_set, s.index))
    which = f" of pod set {pod.pod_set}" if pod.pod_set else ""
    if not slots:
        sizes = "/".join(str(n) for n in sorted({len(s.gpus) for s in r.slice.slots}))
        raise SlotError(f"no slot{which} has {pod.gpus} GPUs (the slots have {sizes})")
    index = slot_index(pod, len(slots))
    if index is not None:
        if index >= len(slots):
            raise SlotError(f"pod index {index} is past the {len(slots)} slots{which}")
        slot = slots[index]
        holder = handed.get(slot.key)
        if holder is not None and holder != pod.name:
            raise SlotError(f"slot {slot.key} (index {index}) is held by pod {holder}")
        return slot
    for slot in slots:
        if handed.get(slot.key) in (None, pod.name):
            return slot
    raise SlotError(f"every slot{which} is handed out ({len(slots)} of {len(r.slice.slots)})")


def handed_out(pods: Iterable[PodInfo]) -> dict[str, str]:
    """Slot key -> pod, for the live pods that carry the slot they got at creation."""
    out = {}
    for p in pods:
        key = p.annotations.get(names.SLOT)
        if key and not p.terminal and not p.deleting:
            out[key] = p.name
    return out


@dataclass(frozen=True, slots=True)
class ClaimState:
    """What a slot's ResourceClaim says now, for ``gangslice explain``."""

    name: str
    exists: bool
    #: Devices its allocation holds (None: not allocated).
    allocated: tuple[str, ...] | None = None
    #: Pods (names or UIDs) it is reserved for.
    reserved_for: tuple[str, ...] = ()
    #: Whether the driver reported every allocated device prepared (a ``Ready`` condition in
    #: ``status.devices``), or the pod using it runs (the kubelet prepared it).
    prepared: bool = False

    def describe(self) -> str:
        if not self.exists:
            return f"claim {self.name}: missing"
        if self.allocated is None:
            return f"claim {self.name}: not allocated"
        held = ",".join(self.allocated)
        who = f", reserved for {','.join(self.reserved_for)}" if self.reserved_for else ""
        return (
            f"claim {self.name}: allocated {held}{who}, {'prepared' if self.prepared else 'not yet prepared'}"
        )


def claim_state(name: str, claim: Mapping[str, Any] | None, pod_running: bool = False) -> ClaimState:
    if claim is None:
        return ClaimState(name, False)
    status = as_map(claim.get("status"))
    held = dra.allocated_devices(claim)
    if not as_map(status.get("allocation")):
        return ClaimState(name, True)
    reserved = tuple(
        str(as_map(r).get("name") or as_map(r).get("uid") or "") for r in status.get("reservedFor") or ()
    )
    ready = {
        str(as_map(d).get("device"))
        for d in status.get("devices") or ()
        if any(
            as_map(c).get("type") == "Ready" and as_map(c).get("status") == "True"
            for c in as_map(d).get("conditions") or ()
        )
    }
    devices = tuple(d for _, _, d in held)
    prepared = pod_running or (bool(devices) and set(devices) <= ready)
    return ClaimState(name, True, devices, reserved, prepared)


class SlotClaims:
    """The one writer of ResourceClaims (through the one client)."""

    def __init__(self, api: KubeClient) -> None:
        self._api = api

    async def owner(self, namespace: str, name: str, gang: str | None = None) -> dict[str, str]:
        """SliceReservation ``namespace/name`` as saved, as the owner of the claims (and the
        ComputeDomain) made for its gang: its name, UID and the gang's name (default: its own).
        KubeError passes through (not saved yet, or unreadable)."""
        saved = await self._api.get(SLICE_RESERVATIONS, name, namespace)
        return {
            "name": name,
            "uid": str(as_map(saved.get("metadata")).get("uid") or ""),
            "gang": gang or name,
        }

    async def ensure(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``claim``; one of that name with the same spec is kept; one with another spec
        (an earlier plan) is replaced while nothing holds it. Raises :class:`SlotError` when a
        stale claim is allocated."""
        meta = claim["metadata"]
        try:
            return await self._api.create(RESOURCE_CLAIMS, claim)
        except Conflict:
            pass
        try:
            have = await self._api.get(RESOURCE_CLAIMS, meta["name"], meta["namespace"])
        except NotFound:
            return await self._api.create(RESOURCE_CLAIMS, claim)
        if have.get("spec") == claim["spec"]:
            return have
        if as_map(have.get("status")).get("allocation") or as_map(have.get("status")).get("reservedFor"):
            raise SlotError(
                f"ResourceClaim {meta['namespace']}/{meta['name']} of an earlier plan is still allocated"
            )
        log.info("replacing ResourceClaim %s/%s of an earlier plan", meta["namespace"], meta["name"])
        await self._api.delete(RESOURCE_CLAIMS, meta["name"], meta["namespace"])
        return await self._api.create(RESOURCE_CLAIMS, claim)

    async def delete(self, namespace: str, name: str) -> None:
        try:
            await self._api.delete(RESOURCE_CLAIMS, name, namespace)
        except NotFound:
            return
