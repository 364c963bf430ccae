"""The PodGroup controller: reserves a slice for every Volcano PodGroup (alone, or jointly
with the other members of a joint gang) once its member pods exist.

Watch events (kopf, see :mod:`extender.controllers.handlers`) land in :meth:`on_podgroup`
and :meth:`on_pod`; :meth:`resync` looks again at groups still waiting. The order keeps a
restart safe, as for Workloads: hold in the cache's ledger (no ``await`` between placing and
holding), create the SliceReservation owned by the PodGroup, then say so on the PodGroup.
The Volcano extender endpoints then let the job in (``jobEnqueueable``) and pin each task to
its slot (``predicate``/``allocate``), keyed ``<namespace>/<podgroup>``.

PodGroup has no status subresource, so the controller writes only its own annotations
(``gangslice.io/reservation``, ``gangslice.io/status``) with a replace guarded by
``metadata.resourceVersion``, reading the object again and retrying on 409.

A hold whose pods do not start binding within the TTL expires in the ledger (the cache's
housekeeping); the next resync finds the group without a reservation and places it again.
The reservation is released when the PodGroup is deleted or reaches phase Completed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.controllers import joint, owned
from extender.controllers.common import Cache, resync_until
from extender.controllers.objects import object_ref
from extender.controllers.podgroups.groups import (
    PODGROUP_KIND,
    VOLCANO_SCHEDULER,
    PodGroup,
    PodGroupError,
    annotation_patch,
    gang_request,
    member_of,
    missing_pods,
)
from extender.kube import names
from extender.kube.api import PODGROUPS, Conflict, KubeClient, KubeError, NotFound
from extender.kube.crd_models import object_name
from extender.kube.pods import PodInfo
from extender.logs import fields
from extender.placement.request import GangRequest
from extender.placement.scoring import resolve_need
from extender.placement.slice import Unplaceable
from extender.reservations.store import ReservationRef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodGroupConfig:
    #: How long a new reservation is held before its pods must start binding.
    hold_ttl_s: float = 600.0
    #: How long the members of a joint gang wait for the missing ones before giving up.
    member_wait_s: float = 300.0
    resync_s: float = 10.0
    #: Attempts at an annotation write that keeps meeting a newer resourceVersion.
    write_attempts: int = 5


class PodGroupController:
    def __init__(
        self,
        api: KubeClient,
        cache: Cache,
        config: PodGroupConfig | None = None,
        clock: Callable[[], float] = time.time,
        identity: str = "gangslice",
    ) -> None:
        self.api = api
        self.cache = cache
        self.config = config or PodGroupConfig()
        self.clock = clock
        self.identity = identity
        self.leader = False
        #: The latest PodGroup object seen, by gang key.
        self.groups: dict[str, dict[str, Any]] = {}
        #: Member pods seen, by PodGroup key then pod name.
        self.pods: dict[str, dict[str, PodInfo]] = {}
        #: When a joint gang was first seen short of members.
        self.member_wait = joint.MemberWait()
        self._lock = asyncio.Lock()

    # -- events --------------------------------------------------------------------------------
    async def on_podgroup(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        ns, name = object_ref(obj)
        key = f"{ns}/{name}"
        if event_type == "DELETED":
            self.groups.pop(key, None)
            self.pods.pop(key, None)
            self.cache.forget_gang(key)  # members only the webhook saw must not count for a new group
            async with self._lock:
                if self.leader:
                    await self._release(key, None, "its PodGroup was deleted")
            return
        self.groups[key] = dict(obj)
        await self.reconcile(key)

    async def on_pod(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = member_of(obj)
        if key is None:
            return
        pod = PodInfo.from_obj(obj)
        members = self.pods.setdefault(key, {})
        if event_type == "DELETED":
            members.pop(pod.name, None)
        else:
            members[pod.name] = pod
        await self.reconcile(key)

    # -- leadership and resync -----------------------------------------------------------------
    async def become_leader(self) -> None:
        """Release reservations whose PodGroup is gone (the ledger is already rebuilt from the
        SliceReservation objects), then decide for every known group."""
        self.leader = True
        for r in list(self.cache.ledger.reservations()):
            ref = ReservationRef.of(r)
            if ref.owner_kind != PODGROUP_KIND:
                continue
            ns, name = ref.namespace, ref.owner_name
            try:
                pg = await self.api.get(PODGROUPS, name, ns)
            except NotFound:
                pg = None
            except KubeError as exc:
                log.warning(
                    "PodGroup %s/%s: %s", ns, name, exc, extra=fields(gang=r.gang, podgroup=f"{ns}/{name}")
                )
                continue
            if not owned.owned_by(r, pg):
                async with self._lock:
                    await self._release(r.gang, None, "its PodGroup is gone")
        await self.resync()

    def lose_leadership(self) -> None:
        self.leader = False

    async def resync(self) -> None:
        for key in list(self.groups):
            await self.reconcile(key)

    async def run_resync(self, stop: asyncio.Event) -> None:
        await resync_until(stop, self.config.resync_s, self.resync, "PodGroup resync")

    # -- deciding ------------------------------------------------------------------------------
    async def reconcile(self, key: str) -> None:
        if not self.leader or not self.cache.ready:
            return
        async with self._lock:
            obj = self.groups.get(key)
            if obj is None:
                return
            try:
                await self._reconcile(key, obj)
            except KubeError as exc:
                log.warning("PodGroup %s: %s (will retry)", key, exc, extra=fields(gang=key, podgroup=key))

    async def _reconcile(self, key: str, obj: dict[str, Any]) -> None:
        try:
            pg = PodGroup.from_obj(obj)
            member = joint.membership(pg.labels, pg.annotations)
        except (PodGroupError, joint.JointError) as exc:
            await self._status(key, "Invalid", str(exc), event=("Warning", "InvalidGang"))
            return
        if pg.completed or pg.deleting:
            await self._release(
                key, obj, f"its PodGroup is {'Completed' if pg.completed else 'being deleted'}"
            )
            return
        if member is not None:
            await self._reconcile_joint(pg.namespace, member.gang)
            return
        held = self.cache.reservation(key)
        if held is not None:
            await self._reserved([key])
            return
        request = await self._request(key, pg)
        if request is None:
            return
        claim = owned.owner_claim(key, obj, self.clock() + self.config.hold_ttl_s, **self._pinned(key))
        result = await self.cache.book.hold(request, claim)
        if isinstance(result, Unplaceable):
            await self._unplaceable([key], result)
            return
        if not await self.cache.persist(key):
            self.cache.drop(key)
            await self.cache.flush()
            return
        await self._reserved([key], announce=True)

    def _members(self, key: str) -> list[PodInfo]:
        """The group's member pods: watched, and those the cache knows only from the admission
        webhook, which refused them for want of this slice (DRA: a pod's claim is pinned at its
        creation); without them the group would wait for its members forever."""
        members = {
            p.name: p for p in self.cache.pods_of_gang(key) if p.name and p.scheduler == VOLCANO_SCHEDULER
        }
        members.update(self.pods.get(key, {}))
        return list(members.values())

    def _pinned(self, key: str) -> dict[str, str]:
        """Reservation meta for a group whose pods ask for GPUs through a DRA claim: its slots
        are pinned by per-slot ResourceClaims (the SliceReservation's status names them)."""
        if any(names.CLAIM_GPUS in p.annotations for p in self._members(key)):
            return {names.META_SLOT_CLAIMS: "true"}
        return {}

    async def _request(self, key: str, pg: PodGroup) -> GangRequest | None:
        """The group's request, or None after saying why it waits or is invalid."""
        pods = self._members(key)
        short = missing_pods(pg, pods)
        if short:
            await self._status(key, "Waiting", f"waiting for {short} more member pod(s) of {pg.min_member}")
            return None
        try:
            snap = self.cache.snapshot()
            request = gang_request(pg, pods, snap)
            for ps in request.pod_sets:
                resolve_need(ps, snap.hierarchy)  # an unknown level name is the user's to fix
            return request
        except (PodGroupError, ValueError) as exc:
            await self._status(key, "Invalid", str(exc), event=("Warning", "InvalidGang"))
            return None

    # -- joint gangs ---------------------------------------------------------------------------
    async def _reconcile_joint(self, namespace: str, gang: str) -> None:
        jkey = f"{namespace}/{gang}"
        declared: dict[str, joint.Membership] = {}
        keys: dict[str, str] = {}
        groups = []
        for key, obj in sorted(self.groups.items()):
            try:
                pg = PodGroup.from_obj(obj)
            except PodGroupError:
                continue  # said on that group by its own reconcile
            if pg.namespace == namespace and not pg.completed:
                groups.append((key, pg))
        for (key, pg), m in joint.members(groups, gang, _declared):
            declared[pg.name] = m
            keys[pg.name] = key
        try:
            expected = joint.expected_members(list(declared.values()))
        except joint.JointError as exc:
            await self._status_all(
                keys.values(), "Invalid", f"joint gang {jkey}: {exc}", ("Warning", "InvalidGang")
            )
            return
        held = [k for k in keys.values() if self.cache.reservation(k) is not None]
        short = self.member_wait.short(jkey, declared, expected, self.clock(), self.config.member_wait_s)
        if held and short is None and len(held) == len(keys) == expected:
            await self._reserved(list(keys.values()))
            return
        if short is not None:
            absent = short.absent
            if short.timed_out:
                for k in held:
                    await self._release(
                        k, self.groups.get(k), f"member(s) {absent} of joint gang {jkey} missing"
                    )
                message = (
                    f"joint gang {jkey}: member(s) {absent} did not arrive within "
                    f"{int(self.config.member_wait_s)}s; nothing is held"
                )
                await self._status_all(keys.values(), "MemberMissing", message, ("Warning", "MemberMissing"))
            else:
                message = f"joint gang {jkey}: waiting for member(s) {absent} ({len(declared)} of {expected})"
                await self._status_all(keys.values(), "Waiting", message)
            return
        requests: dict[str, GangRequest] = {}
        for name, key in keys.items():
            got = await self._request(key, PodGroup.from_obj(self.groups[key]))
            if got is None:
                return
            requests[name] = got
        colocate = {n: m.colocate_with for n, m in declared.items() if m.colocate_with}
        try:
            request = joint.joint_request(jkey, requests, colocate, self.cache.snapshot().hierarchy)
        except joint.JointError as exc:
            await self._status_all(keys.values(), "Invalid", str(exc), ("Warning", "InvalidGang"))
            return
        now = self.clock()
        for k in held:  # a partial set from an earlier attempt: place all afresh
            await self._release(k, None, f"re-placing joint gang {jkey}")
        result = await self._hold_joint(jkey, request, keys, now)
        if isinstance(result, Unplaceable):
            await self._unplaceable(list(keys.values()), result)
            return
        for key in keys.values():
            r = self.cache.reservation(key)
            if r is None or not await self.cache.persist(key):
                for k in keys.values():
                    await self._release(k, None, f"persisting joint gang {jkey} failed")
                return
        await self._reserved(list(keys.values()), announce=True)

    async def _hold_joint(
        self, jkey: str, request: GangRequest, keys: Mapping[str, str], now: float
    ) -> Unplaceable | None:
        """Place the joint request and hold one reservation per member, all or none."""
        expires = now + self.config.hold_ttl_s
        claims = [
            owned.owner_claim(k, self.groups[k], expires, jointGang=jkey, **self._pinned(k))
            for k in keys.values()
        ]
        got = await self.cache.book.hold_joint(request, claims, split=joint.splitter(keys))
        return got if isinstance(got, Unplaceable) else None

    # -- writing -------------------------------------------------------------------------------
    async def _reserved(self, keys: list[str], announce: bool = False) -> None:
        for key in keys:
            r = self.cache.reservation(key)
            if r is None:
                continue
            sl = r.slice
            gpus = sl.gpus
            message = (
                f"slice {object_name(key)}: {len(sl.slots)} pods, {gpus} GPUs on {', '.join(sl.nodes)}; "
                f"predicted {sl.per_layer_micros:.1f} us/layer"
            )
            event = ("Normal", "SliceReserved") if announce else None
            await self._status(key, "Reserved", message, event=event, reservation=object_name(key))

    async def _unplaceable(self, keys: list[str], result: Unplaceable) -> None:
        if result.feasible_when_empty:
            await self._status_all(
                keys, "Waiting", f"waiting for a slice: {result.reason}", ("Normal", "WaitingForSlice")
            )
        else:
            await self._status_all(
                keys,
                "NeverFits",
                f"the gang can never fit this cluster: {result.reason}",
                ("Warning", "NeverFits"),
            )

    async def _status_all(
        self, keys: Any, state: str, message: str, event: tuple[str, str] | None = None
    ) -> None:
        for key in list(keys):
            await self._status(key, state, message, event=event)

    async def _status(
        self,
        key: str,
        state: str,
        message: str,
        event: tuple[str, str] | None = None,
        reservation: str | None = None,
    ) -> None:
        """Set our annotations on the PodGroup (resourceVersion-guarded, retried on 409); an
        Event goes out only when the status text changes, so a resync does not repeat it."""
        wanted: dict[str, str | None] = {
            names.STATUS: f"{state}: {message}"[:1024],
            names.RESERVATION: reservation,
        }
        obj = self.groups.get(key)
        if obj is None:
            return
        ns, name = object_ref(obj)
        for _ in range(self.config.write_attempts):
            body = annotation_patch(obj, wanted)
            if body is None:
                return
            try:
                obj = self.groups[key] = await self.api.replace(PODGROUPS, body)
                break
            except Conflict:
                try:
                    obj = self.groups[key] = await self.api.get(PODGROUPS, name, ns)
                except NotFound:
                    return
            except NotFound:
                return
        else:
            log.warning(
                "PodGroup %s: annotations not written after %d conflicts",
                key,
                self.config.write_attempts,
                extra=fields(gang=key, podgroup=key),
            )
            return
        if event is not None:
            await owned.post_event(self.api, obj, event[0], event[1], message, self.clock(), self.identity)

    async def _release(self, key: str, obj: Mapping[str, Any] | None, why: str) -> None:
        r = self.cache.drop(key)
        if r is None:
            return
        await self.cache.flush()
        log.info(
            "released the reservation of PodGroup %s: %s", key, why, extra=fields(gang=key, podgroup=key)
        )
        if obj is not None:
            await owned.post_event(
                self.api, obj, "Normal", "SliceReleased", f"released: {why}", self.clock(), self.identity
            )


def _declared(group: tuple[str, PodGroup]) -> joint.Membership | None:
    """The joint gang a PodGroup (key, group) declares, or None."""
    return joint.membership(group[1].labels, group[1].annotations)
