"""The mutating admission webhook for gang pods on DRA nodes: ``POST /admission/pods``.

At pod CREATE (``admission.k8s.io/v1`` AdmissionReview), a gang pod whose
``spec.resourceClaims`` names a ResourceClaimTemplate asking for whole GPUs of
``gpu.nvidia.com`` is given its slot. Its gang is :attr:`extender.kube.pods.PodInfo.gang_key`'s:
a Kueue Workload's reservation (``gangslice.io/reservation``, from gangslice's admission
check), a plain gang (``gangslice.io/gang``) or a Volcano PodGroup
(``scheduling.k8s.io/group-name``).

1. a plain gang is reserved if it is not yet (the one reserve path, in the book only), and
   only a gang that is real: kube-apiserver authenticated the call (``serve
   --admission-client-names``), or the pod's controller (its ReplicaSet, StatefulSet or Job,
   by UID) or the upstream PodGroup it joins exists. A Kueue or Volcano gang is its
   controller's to reserve, so a pod of one without a reservation is refused (retry), a
   member of a PodGroup that exists remembered so the PodGroup controller counts it;
2. the pod is matched to a slot (:func:`extender.kube.slot_claims.pick_slot`: its index,
   else first come), handed out in memory until the pod shows up on the watch;
3. the reply patches the pod: that ``resourceClaims`` entry names the slot's claim
   (``resourceClaimName``) instead of the template, and the pod is annotated with the slot,
   its GPU indices and UUIDs, its claim's GPU count and the template it asked for.

The webhook writes nothing to the API (``sideEffects: None``): the claims it names are made by
the leader's claims controller (:mod:`extender.controllers.claims.make`) once the pod exists,
so a forged review creates nothing, and a review for a gang that is not real reserves nothing.
kube-scheduler's DynamicResources plugin waits for the claim and then allocates it on the one
node whose devices it admits. Any other pod is allowed unchanged. A gang pod gangslice cannot
place is refused with a message that starts with ``gangslice:``; the shipped
MutatingWebhookConfiguration calls this path with ``failurePolicy: Fail`` for pods labelled
``gangslice.io/gang`` or ``gangslice.io/managed: "true"`` (so a pod that opted in never runs
unpinned) and ``Ignore`` for every other pod (so the cluster is never blocked by gangslice).

The path lies outside the extender verbs' prefix, so it needs no client certificate: the API
server presents none by default. Where kube-apiserver is given one (its AdmissionConfiguration's
``kubeConfigFile``), ``serve --admission-client-names`` requires it (docs/install.md). It answers
on the leader only (the Service selects it).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from extender.httpapi.access import ACCESS, ADMISSION_PATH, add_verb
from extender.httpapi.handling import API, CACHE, leads
from extender.kube import compute_domains as cds
from extender.kube import names
from extender.kube.api import (
    COMPUTE_DOMAINS,
    JOBS,
    PODGROUPS,
    REPLICA_SETS,
    STATEFUL_SETS,
    KubeClient,
    KubeError,
    NotFound,
    Resource,
    as_map,
)
from extender.kube.crd_models import claim_name
from extender.kube.dra import DeviceMap
from extender.kube.gangs import Incomplete
from extender.kube.pods import PodError, PodInfo
from extender.kube.slot_claims import SlotError, gpu_claim, pick_slot, pod_index
from extender.logs import fields
from extender.placement.ledger import Reservation
from extender.placement.scoring import LevelError
from extender.placement.slice import PodSlot, Unplaceable
from extender.reservations import ClusterCache
from extender.reservations.reserve import reserve_pinned_gang

log = logging.getLogger(__name__)

#: Whom a slot is handed to for a pod created with ``generateName`` (it has no name yet).
GENERATED_NAME = "<generated name>"

PATH = ADMISSION_PATH


class Refusal(Exception):
    """Refuse the pod; the message is shown to whoever created it."""


def review_reply(
    uid: str, *, patch: list[dict[str, Any]] | None = None, refused: str | None = None
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": refused is None}
    if refused is not None:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": f"gangslice: {refused}"}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


async def mutate_pods(request: web.Request) -> web.Response:
    try:
        review = await request.json()
        req = as_map(as_map(review).get("request"))
        uid = str(req["uid"])
    except (ValueError, KeyError, TypeError):
        return web.Response(status=400, text="body is not an admission.k8s.io/v1 AdmissionReview\n")
    access = request.app.get(ACCESS)
    authenticated = access is not None and bool(access.admission_names)
    reply: dict[str, Any]
    try:
        patch = await _pin(request.app, req, authenticated)
        reply = review_reply(uid, patch=patch)
    except Refusal as exc:
        log.warning("refused pod %s/%s: %s", req.get("namespace"), _pod_name(req), exc)
        reply = review_reply(uid, refused=str(exc))
    except Exception as exc:
        log.exception("admission of pod %s/%s failed", req.get("namespace"), _pod_name(req))
        reply = review_reply(uid, refused=f"internal error: {type(exc).__name__}: {exc}")
    return web.json_response(reply)


def _pod_name(req: Mapping[str, Any]) -> str:
    meta = as_map(as_map(req.get("object")).get("metadata"))
    return str(meta.get("name") or meta.get("generateName") or req.get("name") or "")


async def _pin(
    app: web.Application, req: Mapping[str, Any], authenticated: bool
) -> list[dict[str, Any]] | None:
    if req.get("operation") != "CREATE" or as_map(req.get("kind")).get("kind") != "Pod":
        return None
    if req.get("subResource") or req.get("dryRun"):
        return None  # a dry run is not handed a slot
    obj = as_map(req.get("object"))
    meta = as_map(obj.get("metadata"))
    namespace = str(req.get("namespace") or meta.get("namespace") or "default")
    seen = PodInfo.from_obj({**obj, "metadata": {**meta, "namespace": namespace}})
    if seen.gang_key is None:
        return None  # in no gang: a plain gang, a Kueue Workload's reservation, a Volcano PodGroup
    if seen.labels.get(names.LWS_NAME) and not seen.labels.get(names.LWS_GROUP_INDEX):
        # A LeaderWorkerSet's leader before the LWS pod webhook gave it its group: the API server
        # calls this webhook again once that one changed the pod (reinvocationPolicy IfNeeded).
        return None
    api, cache = app[API], app[CACHE]
    if api is None or _pinned_before(cache, seen):
        return None
    spec = as_map(obj.get("spec"))
    try:
        found = await gpu_claim(api, namespace, spec, cache.device_class_drivers)
    except SlotError as exc:
        raise Refusal(str(exc)) from None
    if found is None:
        return await _pin_device_plugin(app, namespace, obj, meta, spec, authenticated)
    position, entry, template, gpu = found.position, found.entry, found.template, found.request
    if not leads(app) or not cache.ready:
        raise Refusal("this replica is not ready or not the leader; retry")
    annotations = {**as_map(meta.get("annotations")), names.CLAIM_GPUS: str(gpu.count)}
    pod = PodInfo.from_obj({**obj, "metadata": {**meta, "namespace": namespace, "annotations": annotations}})
    if pod.problems:
        raise Refusal(pod.problems[0])
    await _real(api, cache, pod, obj, authenticated)

    def hand_out() -> tuple[Reservation, PodSlot, DeviceMap]:
        """The pod's gang reserved (a plain gang's first pod reserves it) and a slot handed out."""
        r = cache.book.reservation_of(pod)
        if r is None:
            r = _reserve(cache, pod)
        gang = r.gang
        handed = cache.book.handed(gang)
        if pod_index(pod) is None and cache.book.lacks_pod_set(pod):
            r = _grown(cache, pod, gang, "its pod set has no slot")  # an owner come after the placement
        try:
            slot = pick_slot(r, pod, handed)
        except SlotError as exc:
            # Every slot of its pod set is handed out: a rolling update's surge pod or a
            # scale-up's new pod. The gang grows by one slot beside its slice where its owners
            # let it (a pod with an index names its slot: it never grows one).
            if pod_index(pod) is not None:
                raise Refusal(f"gang {gang}: {exc}") from None
            grown = _grown(cache, pod, gang, str(exc))
            try:
                slot = pick_slot(grown, pod, handed)
            except SlotError as again:
                raise Refusal(f"gang {gang}: {again}") from None
            r = grown
        device_map = cache.device_map(slot.node)
        if device_map is None:
            raise Refusal(
                f"gang {gang}: slot {slot.key} is on {slot.node}, whose GPUs gpu.nvidia.com does not "
                "publish (a devicePlugin node): ask for nvidia.com/gpu there, not a DRA claim"
            )
        cache.book.hand(gang, slot.key, pod.name or GENERATED_NAME)
        return r, slot, device_map

    r, slot, device_map = await cache.book.deciding(hand_out)
    gang = r.gang
    try:
        res_name = cache.book.ref_of(r).key[1]
        name = claim_name(res_name, slot)
        devices = [device_map.device(g) for g in slot.gpus]
        log.info(
            "pod %s of gang %s: slot %s on %s, claim %s to pin %s",
            pod.name or meta.get("generateName"),
            gang,
            slot.key,
            slot.node,
            name,
            ",".join(d.name for d in devices),
            extra=fields(gang=gang),
        )
        pinned = {**dict(entry), "resourceClaimName": name}
        pinned.pop("resourceClaimTemplateName", None)
        ops: list[dict[str, Any]] = [
            {"op": "replace", "path": f"/spec/resourceClaims/{position}", "value": pinned}
        ]
        if slot.node in r.slice.mnnvl_nodes:
            ops += await _join_domain(
                api, namespace, res_name, slot.node, pod, spec, _claims_entry(str(entry.get("name")))
            )
        wanted = {
            names.CLAIM_GPUS: str(gpu.count),
            names.SLOT: slot.key,
            names.GPUS: ",".join(str(g) for g in slot.gpus),
            names.GPU_UUIDS: ",".join(d.uuid or "" for d in devices),
            names.CLAIM_TEMPLATE: str(as_map(template.get("metadata")).get("name") or ""),
        }
        return ops + _annotated(meta, wanted)
    except Refusal:
        cache.book.unhand(gang, slot.key)  # refused: the slot is not handed out
        raise


async def _join_domain(
    api: Any,
    namespace: str,
    reservation_name: str,
    node: str,
    pod: PodInfo,
    spec: Mapping[str, Any],
    uses_gpus: Callable[[Mapping[str, Any]], bool],
) -> list[dict[str, Any]]:
    """The patch that adds the node's channel claim of the gang's ComputeDomain to the pod and to
    the containers that use its GPUs (the claims controller makes the claim and the domain once
    the pod exists). A domain the pod adopts must exist."""
    if any(as_map(c).get("name") == cds.POD_CLAIM for c in spec.get("resourceClaims") or ()):
        raise Refusal(f"the pod already has a resourceClaims entry {cds.POD_CLAIM}; gangslice adds it")
    adopted = pod.annotations.get(names.COMPUTE_DOMAIN)
    if adopted:
        try:
            await api.get(COMPUTE_DOMAINS, adopted, namespace)
        except NotFound:
            raise Refusal(
                f"ComputeDomain {namespace}/{adopted} ({names.COMPUTE_DOMAIN}) does not exist"
            ) from None
        except KubeError as exc:
            raise Refusal(f"ComputeDomain {namespace}/{adopted}: {exc}") from None
    name = cds.channel_claim_name(reservation_name, node)
    ops: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": "/spec/resourceClaims/-",
            "value": {"name": cds.POD_CLAIM, "resourceClaimName": name},
        }
    ]
    for i, container in enumerate(spec.get("containers") or ()):
        if not uses_gpus(as_map(container)):
            continue
        claims = as_map(as_map(container).get("resources")).get("claims")
        path = f"/spec/containers/{i}/resources/claims"
        op: dict[str, Any] = {"op": "add", "path": f"{path}/-", "value": {"name": cds.POD_CLAIM}}
        if not isinstance(claims, list):
            op = {"op": "add", "path": path, "value": [{"name": cds.POD_CLAIM}]}
        ops.append(op)
    return ops


def _claims_entry(name: str) -> Callable[[Mapping[str, Any]], bool]:
    """A container that uses the pod's claim entry ``name``."""

    def uses(container: Mapping[str, Any]) -> bool:
        claims = as_map(container.get("resources")).get("claims")
        return any(as_map(c).get("name") == name for c in claims or ())

    return uses


def _asks_device_plugin_gpus(container: Mapping[str, Any]) -> bool:
    """A container that asks the device plugin for GPUs (``nvidia.com/gpu``)."""
    resources = as_map(container.get("resources"))
    return any(names.GPU_RESOURCE in as_map(resources.get(k)) for k in ("limits", "requests"))


async def _pin_device_plugin(
    app: web.Application,
    namespace: str,
    obj: Mapping[str, Any],
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    authenticated: bool,
) -> list[dict[str, Any]] | None:
    """A gang pod that asks the device plugin for GPUs and will use multi-node NVLink: a plain
    gang's pod that requires a clique (``gangslice.io/required-level`` a fabric level; its gang
    is reserved now if it is real), or a Kueue Workload's pod whose reservation (made at its
    admission) uses NVLink channels. The pod is handed a slot (``gangslice.io/slot``; the
    extender then offers only that slot's node) and, on a node whose NVLink channel the slice
    uses, pointed at that node's channel claim of the gang's ComputeDomain: a pod's claims are
    fixed at creation, and a node has one channel, which the gang's pods there share. Any other
    pod passes unchanged (a Kueue pod created before its Workload was admitted, as the pod-group
    integration does, included: its claims can no longer be added when the slice is known)."""
    api, cache = app[API], app[CACHE]
    pod = PodInfo.from_obj({**obj, "metadata": {**meta, "namespace": namespace}})
    if api is None or pod.gpus <= 0 or pod.problems:
        return None
    if pod.reservation_name is not None:
        held = cache.book.reservation_of(pod)
        if held is None or not held.slice.mnnvl_nodes:
            return None
    elif pod.gang is None or not _on_fabric(cache, pod):
        return None
    if not leads(app) or not cache.ready:
        raise Refusal("this replica is not ready or not the leader; retry")
    await _real(api, cache, pod, obj, authenticated)

    def hand_out() -> tuple[Reservation, PodSlot]:
        r = cache.book.reservation_of(pod) or _reserve(cache, pod)
        try:
            slot = pick_slot(r, pod, cache.book.handed(r.gang))
        except SlotError as exc:
            raise Refusal(f"gang {r.gang}: {exc}") from None
        cache.book.hand(r.gang, slot.key, pod.name or GENERATED_NAME)
        return r, slot

    r, slot = await cache.book.deciding(hand_out)
    gang = r.gang
    try:
        ops = _annotated(meta, {names.SLOT: slot.key})
        on_channel = slot.node in r.slice.mnnvl_nodes
        if on_channel:
            res_name = cache.book.ref_of(r).key[1]
            if not isinstance(spec.get("resourceClaims"), list):
                ops.append({"op": "add", "path": "/spec/resourceClaims", "value": []})
            ops += await _join_domain(
                api, namespace, res_name, slot.node, pod, spec, _asks_device_plugin_gpus
            )
        log.info(
            "pod %s of gang %s: slot %s on %s (device plugin)%s",
            pod.name or meta.get("generateName"),
            gang,
            slot.key,
            slot.node,
            ", with its node's NVLink channel" if on_channel else "",
            extra=fields(gang=gang),
        )
        return ops
    except Refusal:
        cache.book.unhand(gang, slot.key)
        raise


#: The controllers whose pods may start a plain gang's reservation at admission, by
#: ``ownerReferences`` (apiVersion, kind): read back by name and UID, so a review cannot
#: make one up.
OWNER_KINDS: Mapping[tuple[str, str], Resource] = {
    ("apps/v1", "ReplicaSet"): REPLICA_SETS,
    ("apps/v1", "StatefulSet"): STATEFUL_SETS,
    ("batch/v1", "Job"): JOBS,
}


async def _real(
    api: KubeClient, cache: ClusterCache, pod: PodInfo, obj: Mapping[str, Any], authenticated: bool
) -> None:
    """Refusal unless the gang the pod would start a reservation for is real. A gang held
    already, or reviewed by an authenticated kube-apiserver, is. A Volcano member's PodGroup
    must exist (it is remembered for the PodGroup controller to count). A plain gang's pod
    must be owned by a controller that exists (:data:`OWNER_KINDS`, its UID matching) and be
    what that controller's pod template makes of it (:func:`_unlike`), or join an upstream
    PodGroup that exists: nothing is reserved for a pod nobody will create, nor sized by one."""
    if authenticated or pod.reservation_name or cache.book.reservation_of(pod) is not None:
        return
    if pod.gang is None:
        group = pod.volcano_group
        if group is None:
            return
        namespace, name = group.split("/", 1)
        try:
            await api.get(PODGROUPS, name, namespace)
        except NotFound:
            raise Refusal(f"PodGroup {group} does not exist") from None
        except KubeError as exc:
            raise Refusal(f"reading PodGroup {group}: {exc}; retry") from None
        return
    if pod.joins_pod_group and cache.owners.group(pod.gang, pod) is not None:
        return
    ref = pod.controller
    if ref is None:
        raise Refusal(
            f"gang {pod.gang}: the pod has no controller, and gangslice reserves a gang at a pod's "
            "admission only for a pod a ReplicaSet, StatefulSet or Job owns (or one joining a PodGroup), "
            "unless kube-apiserver authenticates to the webhook (serve --admission-client-names, "
            "docs/install.md)"
        )
    api_version, kind, name, uid = ref
    if (api_version, kind) not in OWNER_KINDS:
        known = ", ".join(k for _, k in OWNER_KINDS)
        raise Refusal(
            f"gang {pod.gang}: the pod's controller is a {kind}; gangslice knows owners of kind {known}"
        )
    try:
        owner = await api.get(OWNER_KINDS[api_version, kind], name, pod.namespace)
    except NotFound:
        raise Refusal(f"gang {pod.gang}: the pod's {kind} {pod.namespace}/{name} does not exist") from None
    except KubeError as exc:
        raise Refusal(
            f"gang {pod.gang}: reading the pod's {kind} {pod.namespace}/{name}: {exc}; retry"
        ) from None
    if str(as_map(owner.get("metadata")).get("uid") or "") != uid:
        raise Refusal(f"gang {pod.gang}: the pod's {kind} {pod.namespace}/{name} has another UID")
    unlike = _unlike(obj, as_map(as_map(owner.get("spec")).get("template")))
    if unlike:
        raise Refusal(
            f"gang {pod.gang}: the pod's {unlike} differ from the pod template of its {kind} "
            f"{pod.namespace}/{name}: gangslice reserves a gang only for a pod its owner makes"
        )


def _unlike(pod: Mapping[str, Any], template: Mapping[str, Any]) -> str | None:
    """What gangslice reads to size and place a gang, where ``pod`` differs from the pod
    ``template`` of its owner (None: nowhere): its ``gangslice.io/`` labels and annotations,
    its ``resourceClaims`` and its containers' resources. Workload controllers copy those
    from the template and add only keys of their own."""

    def read(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
        ours = {
            part: {k: v for k, v in as_map(meta.get(part)).items() if str(k).startswith(f"{names.GROUP}/")}
            for part in ("labels", "annotations")
        }
        containers = [
            (as_map(c).get("name"), as_map(c).get("resources") or {}) for c in spec.get("containers") or ()
        ]
        return {**ours, "resourceClaims": spec.get("resourceClaims") or [], "container resources": containers}

    have, want = read(pod), read(template)
    differing = [part for part in have if have[part] != want[part]]
    return " and ".join(differing) or None


def _annotated(meta: Mapping[str, Any], wanted: Mapping[str, str]) -> list[dict[str, Any]]:
    """The JSONPatch ops that set ``wanted`` among the pod's annotations."""
    ops: list[dict[str, Any]] = []
    if not isinstance(meta.get("annotations"), Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in wanted.items():
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        ops.append({"op": "add", "path": path, "value": value})
    return ops


def _pinned_before(cache: ClusterCache, pod: PodInfo) -> bool:
    """Whether this is the webhook called again for a pod it pinned moments ago (a later webhook
    changed the pod: reinvocationPolicy IfNeeded): its slot annotation names a slot the book
    handed to this very pod. A slot annotation written by anyone else changes nothing."""
    slot = pod.annotations.get(names.SLOT)
    r = cache.book.reservation_of(pod) if slot else None
    return r is not None and cache.book.handed(r.gang).get(str(slot)) == (pod.name or GENERATED_NAME)


def _on_fabric(cache: ClusterCache, pod: PodInfo) -> bool:
    """Whether the pod's required level is a multi-node NVLink (fabric) level."""
    level = pod.required_level
    index = cache.hierarchy.index_of(level) if level else None
    return index is not None and cache.hierarchy.levels[index].fabric


def _grown(cache: ClusterCache, pod: PodInfo, gang: str, why: str) -> Reservation:
    """The gang grown for ``pod`` (:meth:`ReservationBook.grow`); Refusal, saying ``why`` it
    needed to, when it cannot or may not grow."""
    try:
        grown = cache.book.grow(pod)
    except (PodError, LevelError) as exc:
        raise Refusal(f"gang {gang}: {exc}") from None
    if isinstance(grown, Unplaceable):
        raise Refusal(f"gang {gang}: {why}; {grown.reason}")
    if grown is None:
        raise Refusal(f"gang {gang}: {why}")
    return grown


def _reserve(cache: ClusterCache, pod: PodInfo) -> Reservation:
    """Reserve a plain gang on its first pod; a Kueue or Volcano gang is its controller's to
    reserve, so a pod of one that has no reservation yet is refused (its creator retries)."""
    if pod.reservation_name:
        raise Refusal(
            f"SliceReservation {pod.namespace}/{pod.reservation_name} ({names.RESERVATION}, written by "
            "gangslice's Kueue admission check) does not exist; retry"
        )
    gang = pod.gang
    if gang is None:
        group = pod.volcano_group
        if pod.name:
            cache.remember(pod)  # a member seen: the PodGroup controller counts it for the gang
        raise Refusal(
            f"PodGroup {group} has no slice reserved yet (gangslice reserves it once its minMember "
            "pods were seen, this one included); retry"
        )
    try:
        placed = reserve_pinned_gang(cache.book, pod, cache.pods_of_gang(gang), cache.owners)
    except (PodError, LevelError) as exc:
        raise Refusal(f"gang {gang}: {exc}") from None
    if placed is None:
        raise Refusal(f"gang {gang}: the pod carries no {names.GANG_SIZE} annotation")
    if isinstance(placed, Incomplete):
        cache.remember(pod)  # its pod set counts for the gang's next pod; its controller retries
        raise Refusal(f"gang {gang}: {placed.reason}; retry once a pod of every pod set was created")
    if isinstance(placed, Unplaceable):
        raise Refusal(f"gang {gang}: {placed.reason}")
    return placed


def add_routes(app: web.Application) -> None:
    add_verb(app, PATH, mutate_pods)
