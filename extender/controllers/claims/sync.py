"""Slots whose pinned devices someone else took: re-plan the gang, replace the stale claims.

Between the admission of a gang pod (its slot's claim created, pinned by UUID) and the
allocation of that claim by kube-scheduler, another claim may be allocated one of the same
devices (a pod outside gangslice that asked for "any GPU"). kube-scheduler then never
allocates ours (its selector admits only the taken device) and the pod stays Pending with
``cannot allocate all claims``. :class:`SlotClaimSync`, run by the leader's housekeeping,
finds such slots (a slot not bound, its claim not allocated, one of its devices held by an
allocated claim), tells the slot's pod why with a Warning Event naming the device and the
claim that holds it, re-plans the gang on the cluster as it is now, and replaces each slot's
claim whose devices changed (same name: the pods keep pointing at it; a claim's spec is
immutable, so the stale one is deleted and created again). kube-scheduler retries the pod
when its claim changes.

A gang none of whose slots is bound is re-planned whole. Where some pod is bound already
(its slot cannot move), each slot whose device was taken moves to other free GPUs of its own
node, as coherent as the planned set, so the gang keeps the nodes its placement chose; where
its node has no such set the Event says so and the pod waits for the device.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from extender.kube import dra, names
from extender.kube.api import RESOURCE_CLAIMS, KubeClient, KubeError, as_map
from extender.kube.crd_models import claim_name
from extender.kube.events import Teller
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodError, PodInfo
from extender.kube.slot_claims import GpuRequest, SlotClaims, SlotError, build_claim
from extender.logs import fields
from extender.placement import numa_fit
from extender.placement.ledger import Reservation
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot, Unplaceable
from extender.reservations.cluster import ClusterCache

log = logging.getLogger(__name__)

DEVICE_TAKEN = "DeviceTaken"
_UUID_SELECTOR = f'device.attributes["{dra.GPU_DRIVER}"].uuid in ['


def template_of(claim: Mapping[str, Any]) -> tuple[dict[str, Any], GpuRequest] | None:
    """The claim's spec as the template it came from (gangslice's UUID selector and pcieRoot
    constraint taken out) and its pinned GPU request; None when gangslice did not pin it."""
    spec = dict(as_map(claim.get("spec")))
    devices = dict(as_map(spec.get("devices")))
    requests = []
    pinned: GpuRequest | None = None
    for req in devices.get("requests") or ():
        req = dict(req)
        exactly = dict(as_map(req.get("exactly")))
        selectors = list(exactly.get("selectors") or ())
        kept = [
            s
            for s in selectors
            if not str(as_map(as_map(s).get("cel")).get("expression", "")).startswith(_UUID_SELECTOR)
        ]
        if len(kept) != len(selectors):
            pinned = GpuRequest(
                str(req.get("name")), str(exactly.get("deviceClassName")), int(exactly.get("count", 1))
            )
            exactly["selectors"] = kept
            if not kept:
                exactly.pop("selectors")
            req["exactly"] = exactly
        requests.append(req)
    if pinned is None:
        return None
    devices["requests"] = requests
    constraints = [
        c
        for c in devices.get("constraints") or ()
        if not (
            as_map(c).get("matchAttribute") == dra.PCIE_ROOT and as_map(c).get("requests") == [pinned.name]
        )
    ]
    if constraints:
        devices["constraints"] = constraints
    else:
        devices.pop("constraints", None)
    spec["devices"] = devices
    return {"spec": {"spec": spec}}, pinned  # the shape of a ResourceClaimTemplate


class SlotClaimSync:
    def __init__(self, api: KubeClient, clock: Callable[[], float]) -> None:
        self.api = api
        self.clock = clock
        self._teller = Teller(api, clock, DEVICE_TAKEN)

    def conflicts(self, cache: ClusterCache) -> dict[str, list[tuple[PodSlot, list[str], list[str]]]]:
        """Gang -> (slot, its devices held by someone else, the claims that hold them)."""
        out: dict[str, list[tuple[PodSlot, list[str], list[str]]]] = {}
        for r in cache.ledger.reservations():
            ns, res_name = cache.book.ref_of(r).key
            for slot in r.free_slots():
                device_map = cache.device_map(slot.node)
                if device_map is None:
                    continue
                name = claim_name(res_name, slot)
                if cache.claim_devices(ns, name):
                    continue  # ours is allocated
                held = cache.allocated_devices(slot.node)
                taken = [device_map.device(g).name for g in slot.gpus if device_map.device(g).name in held]
                if taken:
                    holders = cache.claims_holding(slot.node, taken)
                    out.setdefault(r.gang, []).append((slot, taken, holders))
        return out

    async def sync(self, cache: ClusterCache) -> int:
        """Re-plan every gang with a slot whose device was taken; returns how many were re-planned.
        Also deletes the claims of slots a gang no longer has (a rollout's or a scale-down's)."""
        await self.delete_dropped(cache)
        replanned = 0
        for gang, found in self.conflicts(cache).items():
            r = cache.reservation(gang)
            if r is None:
                continue
            try:
                if await self._replan(cache, r, found):
                    replanned += 1
            except Exception:
                log.exception("re-planning gang %s failed; next housekeeping retries", gang)
        return replanned

    async def delete_dropped(self, cache: ClusterCache) -> int:
        """Delete the claims of slots taken out of their gangs (the book's
        ``take_dropped_slots``) that no pod holds and no slot of the same key took back; a claim
        still allocated, or one the API server could not delete, is tried again next time.
        Returns how many were deleted."""
        deleted = 0
        claims = SlotClaims(self.api)
        for (ns, res_name), dropped in cache.book.take_dropped_slots().items():
            r = cache.book.reservation_named(ns, res_name)
            again: set[PodSlot] = set()
            for slot in dropped:
                if r is not None and any(s.key == slot.key for s in r.slice.slots):
                    continue  # the key came back: its claim is the new slot's
                name = claim_name(res_name, slot)
                if cache.claim_devices(ns, name):
                    again.add(slot)  # still allocated: its pod is going
                    continue
                try:
                    await claims.delete(ns, name)
                except KubeError as exc:
                    log.info("deleting ResourceClaim %s/%s of a dropped slot: %s; retried", ns, name, exc)
                    again.add(slot)
                    continue
                deleted += 1
            if again:
                cache.book.return_dropped_slots((ns, res_name), again)
        return deleted

    async def _replan(
        self, cache: ClusterCache, r: Reservation, found: list[tuple[PodSlot, list[str], list[str]]]
    ) -> bool:
        gang = r.gang
        ns, res_name = cache.book.ref_of(r).key
        pods = {p.annotations.get(names.SLOT): p for p in cache.pods_of_gang(gang) if not p.terminal}
        why = {
            slot.key: f"GPU {', '.join(taken)} of slot {slot.key} on node {slot.node} was allocated to "
            f"ResourceClaim {', '.join(holders) or 'of another pod'} before this pod's claim "
            f"{ns}/{claim_name(res_name, slot)}"
            for slot, taken, holders in found
        }
        if r.bound or cache.book.ref_of(r).owner_managed:
            # Bound pods stay where they are; a Workload's or PodGroup's reservation is what its
            # controller released the gang to (Kueue's podSetUpdates name its nodes): move only
            # the taken slots, each on its own node.
            return await self._move_on_node(cache, r, found, why, pods)
        members = list(pods.values())
        try:
            request = plain_gang_request(members[0], members, cache.owners) if members else None
        except PodError as exc:
            request, problem = None, str(exc)
        else:
            problem = "its pods are not all seen"
        if not isinstance(request, GangRequest):
            for key, text in why.items():
                await self._teller.tell(pods.get(key), f"{text}; cannot re-plan: {problem}")
            return False
        old_claims = await self._claims(ns, res_name, r)
        placed = await cache.book.replan(r, request)
        if isinstance(placed, Unplaceable):
            for key, text in why.items():
                await self._teller.tell(pods.get(key), f"{text}; no other plan fits now: {placed.reason}")
            return False
        if not await cache.persist(gang):
            log.warning(
                "gang %s: re-planned, but the reservation could not be saved", gang, extra=fields(gang=gang)
            )
            return False
        await self._replace_claims(cache, placed, placed.slice.slots, old_claims, why, pods)
        log.info("gang %s re-planned after a device of its slots was taken", gang, extra=fields(gang=gang))
        return True

    async def _move_on_node(
        self,
        cache: ClusterCache,
        r: Reservation,
        found: list[tuple[PodSlot, list[str], list[str]]],
        why: Mapping[str, str],
        pods: Mapping[str | None, PodInfo],
    ) -> bool:
        """Move each slot of ``found`` to other free GPUs of its node (a gang with bound pods)."""
        ns, res_name = cache.book.ref_of(r).key
        moved: list[PodSlot] = []
        stuck: list[PodSlot] = []

        def move(r: Reservation) -> Reservation:
            for slot, _, _ in found:
                other = _other_set(cache, r, slot)
                if other is None:
                    stuck.append(slot)
                    continue
                r = cache.book.move_slot(r.gang, slot.key, *other)
                moved.append(r.slice.slot(slot.key))
            return r

        r = await cache.book.deciding(lambda: move(r))
        for slot in stuck:
            await self._teller.tell(
                pods.get(slot.key),
                f"{why[slot.key]}; the gang has bound pods and node {slot.node} has no other free set "
                f"of {len(slot.gpus)} GPUs as coherent: the slot waits for the device",
            )
        if not moved:
            return False
        if not await cache.persist(r.gang):
            # The cache keeps the write queued; the claims follow now all the same, or the
            # moved slot would look free of conflicts while its claim still pins the taken GPU.
            log.warning("gang %s: slots moved; saving the reservation is retried", r.gang)
        await self._replace_claims(cache, r, moved, await self._claims(ns, res_name, r), why, pods)
        log.info(
            "gang %s: slots %s moved on their nodes after a device was taken",
            r.gang,
            ",".join(s.key for s in moved),
            extra=fields(gang=r.gang),
        )
        return True

    async def _replace_claims(
        self,
        cache: ClusterCache,
        r: Reservation,
        slots: Sequence[PodSlot],
        old_claims: Mapping[str, dict[str, Any]],
        why: Mapping[str, str],
        pods: Mapping[str | None, PodInfo],
    ) -> None:
        """Pin each of ``slots``' claims (same name, the template of the old one) to its devices now."""
        gang = r.gang
        ns, res_name = cache.book.ref_of(r).key
        writer = SlotClaims(self.api)
        owner = await writer.owner(ns, res_name)
        for slot in slots:
            old = old_claims.get(slot.key)
            device_map = cache.device_map(slot.node)
            if old is None or device_map is None:
                continue
            got = template_of(old)
            if got is None:
                continue
            template, gpu = got
            claim = build_claim(
                namespace=ns,
                name=claim_name(res_name, slot),
                template=template,
                request=gpu,
                slot=slot,
                devices=[device_map.device(g) for g in slot.gpus],
                reservation=owner,
                at_root=functools.partial(cache.at_root, slot.node),
            )
            try:
                await writer.ensure(claim)
            except (SlotError, KubeError) as exc:
                log.warning(
                    "gang %s: replacing the claim of slot %s: %s",
                    gang,
                    slot.key,
                    exc,
                    extra=fields(gang=gang),
                )
                continue
            if slot.key in why:
                pinned = ",".join(device_map.device(g).name for g in slot.gpus)
                await self._teller.tell(
                    pods.get(slot.key),
                    f"{why[slot.key]}; re-planned: the claim now pins {pinned} on {slot.node}",
                )

    async def _claims(self, ns: str, res_name: str, r: Reservation) -> dict[str, dict[str, Any]]:
        out = {}
        for slot in r.slice.slots:
            try:
                out[slot.key] = await self.api.get(RESOURCE_CLAIMS, claim_name(res_name, slot), ns)
            except KubeError:
                continue
        return out


def _other_set(
    cache: ClusterCache, r: Reservation, slot: PodSlot
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Free GPUs of the slot's node (and their NUMA nodes), besides the other slots of its gang
    there, as the node hands them out, within the tier of the set planned (None: no such set)."""
    view = cache.view([r.gang])
    if not view.has_node(slot.node):
        return None
    i = view.index(slot.node)
    node = view.nodes[i]
    shape = node.shape
    free = view.free_mask(i)
    for other in r.slice.slots:
        if other.node == slot.node and other.key != slot.key:
            free &= ~shape.mask_of(other.gpus)
    tier = shape.tier_of(shape.mask_of(slot.gpus))
    # The rules the solver holds the slot's pod to: the node's GPU sets within what its
    # kubelet's Topology Manager admits for the pod's requests.
    pod = PodSet(slot.pod_set, 1, len(slot.gpus), requests=slot.requests)
    picked = numa_fit.fit_on(node, numa_fit.rule_for(node, pod)).pick(free, len(slot.gpus), tier, 1)
    if not picked:
        return None
    return shape.gpus_of(picked[0]), shape.numa_of(picked[0])
