"""The claims a pinned gang pod names, made once the pod exists.

The admission webhook (:mod:`extender.httpapi.admission`) writes nothing to the API: it names,
in the pod it admits, the slot's ResourceClaim (``<reservation>-<pod set>-<index>``) and, on a
node whose NVLink channel the slice uses, that node's channel claim of the gang's
ComputeDomain. :class:`PodClaims` makes them, for pods the API server holds (seen on the pod
watch), so an AdmissionReview nobody sent for a real pod creates nothing. kube-scheduler's
DynamicResources plugin keeps a pod whose claim does not exist yet out of its queue and
retries it when the claim appears.

For each live, unbound pod of a held gang that carries the slot it was given
(``gangslice.io/slot``) and names that slot's claim:

1. the gang's SliceReservation is saved (the claims are owned by it, and a restart must know
   the slot the pod was given);
2. the slot's claim is made from the ResourceClaimTemplate the pod asked for
   (``gangslice.io/claim-template``), pinned to the slot's devices as the reservation holds
   them now;
3. on an NVLink-channel node, the gang's ComputeDomain (or the one the pod adopts, named in
   ``gangslice.io/compute-domain``) and the node's channel claim, which every pod of the gang
   there shares.

A pinned pod of a plain gang that holds no reservation (the leader went after the webhook
answered and before the reservation was saved) is real, since it exists: its gang is
reserved again through the one reserve path, and the pod's claim is made for its slot of the
new plan (the claims sync's rule for a re-planned slot: the claim says which devices, the
pod's ``gangslice.io/gpus`` what was first planned).

It runs on the leader, on each such pod's events and in every housekeeping pass (a failed
write is tried again there). A claim made is not made again while its pins stand; the claims
sync (:mod:`.sync`) replaces one whose devices someone else took.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.kube import compute_domains as cds
from extender.kube import names
from extender.kube.api import COMPUTE_DOMAINS, KubeClient, KubeError, as_map
from extender.kube.crd_models import claim_name
from extender.kube.dra import Device
from extender.kube.events import Teller
from extender.kube.gangs import Incomplete
from extender.kube.pods import PodError, PodInfo
from extender.kube.slot_claims import SlotClaims, SlotError, build_claim, gpu_claim
from extender.logs import fields
from extender.placement.ledger import Reservation
from extender.placement.scoring import LevelError
from extender.placement.slice import PodSlot, Unplaceable
from extender.reservations.cluster import ClusterCache
from extender.reservations.reserve import reserve_pinned_gang

log = logging.getLogger(__name__)

#: The reason of the Warning Event that tells a pod why its claim is not made yet.
CLAIM_NOT_MADE = "ClaimNotMade"


@dataclass(frozen=True, slots=True)
class Due:
    """A pod whose claims are to be made: its gang's reservation and the slot it was given."""

    pod: PodInfo
    reservation: Reservation
    slot: PodSlot
    #: The SliceReservation's namespace and name (the claims' owner and name prefix).
    namespace: str
    name: str

    @property
    def slot_claim(self) -> str | None:
        """The slot's claim, when the pod names it and says which template it comes from."""
        name = claim_name(self.name, self.slot)
        if name in self.pod.claim_names and self.pod.annotations.get(names.CLAIM_TEMPLATE):
            return name
        return None

    @property
    def channel_claim(self) -> str | None:
        """The node's channel claim, when the slot is on an NVLink-channel node and the pod names it."""
        if self.slot.node not in self.reservation.slice.mnnvl_nodes:
            return None
        name = cds.channel_claim_name(self.name, self.slot.node)
        return name if name in self.pod.claim_names else None


def _pinned(pod: PodInfo) -> bool:
    """Live, unbound, given a slot at admission, and naming claims."""
    return bool(
        pod.annotations.get(names.SLOT) and pod.claim_names and not (pod.node or pod.terminal or pod.deleting)
    )


def unreserved(cache: ClusterCache, pod: PodInfo) -> bool:
    """A pinned pod of a plain gang whose reservation is gone (or never saved)."""
    gang = pod.gang
    return (
        _pinned(pod)
        and gang is not None
        and pod.gang_key == gang
        and bool(pod.annotations.get(names.CLAIM_TEMPLATE))
        and cache.book.reservation_of(pod) is None
    )


def due(cache: ClusterCache, pod: PodInfo) -> Due | None:
    """The claims ``pod`` is owed, or None: it is not live and unbound, its gang holds no
    reservation, the slot it carries is not one of it, or it names none of the slot's claims."""
    if not _pinned(pod):
        return None
    r = cache.book.reservation_of(pod)
    key = pod.annotations.get(names.SLOT)
    slot = next((s for s in r.slice.slots if s.key == key), None) if r is not None else None
    if r is None or slot is None:
        return None
    namespace, name = cache.book.ref_of(r).key
    if namespace != pod.namespace:
        return None
    got = Due(pod, r, slot, namespace, name)
    return got if got.slot_claim or got.channel_claim else None


class PodClaims:
    def __init__(
        self, api: KubeClient, cache: ClusterCache, leads: Callable[[], bool] = lambda: True
    ) -> None:
        self.api = api
        self.cache = cache
        #: Whether this replica decides (the leader): a standby makes nothing.
        self.leads = leads
        #: (namespace, claim name) -> what it pins, for the claims made: not made again.
        self._made: dict[tuple[str, str], tuple[str, ...]] = {}
        self._teller = Teller(api, cache.clock, CLAIM_NOT_MADE)

    async def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """A :class:`~extender.controllers.pods.ReactsToPods`: make the claims of a pod just seen."""
        if event_type == "DELETED" or not self.leads():
            return
        meta = as_map(obj.get("metadata"))
        pod = self.cache.pod(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        if pod is None:
            return
        if unreserved(self.cache, pod):
            await self.reserve_again(self.cache, pod)
        got = due(self.cache, pod)
        if got is not None:
            await self.make(self.cache, got)

    async def sync(self, cache: ClusterCache) -> int:
        """Make what every pod is owed (the housekeeping pass); returns how many pods got claims."""
        live = {(p.namespace, n) for p in cache.pods() for n in p.claim_names}
        self._made = {k: v for k, v in self._made.items() if k in live}
        made = 0
        for pod in cache.pods():
            if unreserved(cache, pod):
                await self.reserve_again(cache, pod)
            got = due(cache, pod)
            if got is not None and await self.make(cache, got):
                made += 1
        return made

    async def reserve_again(self, cache: ClusterCache, pod: PodInfo) -> bool:
        """Reserve the gang of a pinned pod that holds none (:func:`unreserved`); False when it
        cannot be now (the next pass tries again)."""
        gang = pod.gang
        assert gang is not None

        def again() -> Reservation | Unplaceable | Incomplete | None:
            return reserve_pinned_gang(cache.book, pod, cache.pods_of_gang(gang), cache.owners)

        try:
            placed = await cache.book.deciding(again)
        except (PodError, LevelError) as exc:
            placed, why = None, str(exc)
        else:
            why = getattr(placed, "reason", "its pods carry no size")
        if not isinstance(placed, Reservation):
            await self._teller.tell(pod, f"gang {gang} holds no reservation and cannot get one now: {why}")
            return False
        log.info(
            "gang %s of pinned pod %s held no reservation: reserved again",
            gang,
            pod.key,
            extra=fields(gang=gang),
        )
        return True

    async def make(self, cache: ClusterCache, d: Due) -> bool:
        """Make the claims of ``d``; False when nothing was to be made or a write failed (the
        next pass tries again)."""
        slot, gang = d.slot, d.reservation.gang
        device_map = cache.device_map(slot.node)
        devices = [device_map.device(g) for g in slot.gpus] if device_map is not None else []
        pins = tuple(dev.name for dev in devices)
        todo_slot = d.slot_claim is not None and self._made.get((d.namespace, d.slot_claim)) != pins
        todo_channel = d.channel_claim is not None and (d.namespace, d.channel_claim) not in self._made
        if not todo_slot and not todo_channel:
            return False
        if not await cache.book.persist(gang):
            why = cache.book.save_error(gang)
            await self._teller.tell(
                d.pod, f"its claims wait for gang {gang}'s SliceReservation to be saved: {why}"
            )
            return False
        writer = SlotClaims(self.api)
        try:
            owner = await writer.owner(d.namespace, d.name, d.pod.labels.get(names.GANG))
            if todo_slot and d.slot_claim is not None:
                if device_map is None:
                    raise SlotError(
                        f"node {slot.node} of slot {slot.key} publishes no GPUs of gpu.nvidia.com"
                    )
                await writer.ensure(await self._slot_claim(cache, d, d.slot_claim, devices, owner))
                log.info(
                    "pod %s of gang %s: claim %s pins %s on %s",
                    d.pod.key,
                    gang,
                    d.slot_claim,
                    ",".join(pins),
                    slot.node,
                    extra=fields(gang=gang),
                )
                self._made[(d.namespace, d.slot_claim)] = pins
            if todo_channel and d.channel_claim is not None:
                await writer.ensure(await self._channel_claim(d, owner))
                self._made[(d.namespace, d.channel_claim)] = ()
        except (KubeError, SlotError) as exc:
            await self._teller.tell(d.pod, f"making its claims: {exc}; retried")
            return False
        return True

    async def _slot_claim(
        self, cache: ClusterCache, d: Due, name: str, devices: Sequence[Device], owner: Mapping[str, str]
    ) -> dict[str, Any]:
        """The slot's claim: the pod's ResourceClaimTemplate pinned to ``devices``."""
        template_name = d.pod.annotations[names.CLAIM_TEMPLATE]
        spec = {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template_name}]}
        found = await gpu_claim(self.api, d.namespace, spec, cache.device_class_drivers)
        if found is None:
            raise SlotError(f"ResourceClaimTemplate {d.namespace}/{template_name} asks for no whole GPUs")
        return build_claim(
            namespace=d.namespace,
            name=name,
            template=found.template,
            request=found.request,
            slot=d.slot,
            devices=devices,
            reservation=owner,
            at_root=functools.partial(cache.at_root, d.slot.node),
        )

    async def _channel_claim(self, d: Due, owner: Mapping[str, str]) -> dict[str, Any]:
        """The node's channel claim of the gang's ComputeDomain (made here unless the pod adopts one)."""
        adopted = d.pod.annotations.get(names.COMPUTE_DOMAIN)
        if adopted:
            domain = await self.api.get(COMPUTE_DOMAINS, adopted, d.namespace)
        else:
            domain = await cds.ComputeDomains(self.api).ensure(cds.build_domain(d.namespace, owner))
        uid = str(as_map(domain.get("metadata")).get("uid") or "")
        return cds.build_channel_claim(d.namespace, d.slot.node, uid, owner)
