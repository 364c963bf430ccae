"""The Kueue AdmissionCheck controller: holds each Workload until its slice is reserved.

Watch events (from kopf, see :mod:`extender.controllers.handlers`) land in
:meth:`AdmissionController.on_workload` / :meth:`on_admission_check`; a periodic
:meth:`resync` looks again at Workloads still waiting, so the widening and the Retry happen
on time without an event. The rules are :mod:`extender.controllers.kueue.contract`'s; this class does
the I/O in the order that keeps a restart safe:

1. place on the cluster cache's view and hold the slice in its ledger (no ``await`` in
   between, so no other decision on the loop sees the capacity free);
2. create the ``SliceReservation`` (owned by the Workload);
3. only then apply our check ``Ready`` with the pod set updates.

A controller that stops between 2 and 3 finds the object when it starts again (the ledger
is rebuilt from the objects before anything is decided), sees the Workload still Pending
for the same admission, and sets Ready for the same slice.

Only the leader writes anything; a standby keeps its index of Workloads up to date.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from extender.controllers import joint, owned
from extender.controllers.api import KUEUE_API_VERSION
from extender.controllers.common import Cache, resync_until
from extender.controllers.kueue import assignment, workload_gang
from extender.controllers.kueue import contract as kueue
from extender.controllers.kueue.contract import Action, CheckConfig, Stage
from extender.controllers.kueue.workload_gang import WorkloadError
from extender.controllers.objects import (
    META_ATTEMPT,
    META_OWNER_UID,
    object_ref,
    parse_rfc3339,
    reservation_from_object,
    rfc3339,
)
from extender.kube import names, pod_needs, slot_claims
from extender.kube.api import (
    ADMISSION_CHECKS,
    RESOURCE_FLAVORS,
    SLICE_RESERVATIONS,
    WORKLOADS,
    Conflict,
    KubeClient,
    KubeError,
    NotFound,
    as_map,
)
from extender.kube.crd_models import CrdError, object_name
from extender.logs import fields
from extender.placement.ledger import Reservation
from extender.placement.request import Toleration
from extender.placement.slice import Unplaceable
from extender.reservations.reserve import Claim
from extender.reservations.store import ReservationRef

log = logging.getLogger(__name__)

WORKLOAD_KIND = "Workload"


class AdmissionController:
    def __init__(
        self,
        api: KubeClient,
        cache: Cache,
        config: CheckConfig | None = None,
        clock: Callable[[], float] = time.time,
        identity: str = "gangslice",
        kueue: bool = True,
    ) -> None:
        #: False on a cluster without Kueue: nothing of Kueue is read.
        self.kueue = kueue
        self.api = api
        self.cache = cache
        self.config = config or CheckConfig()
        self.clock = clock
        self.identity = identity
        self.leader = False
        #: Our AdmissionChecks by name (those whose controllerName is ours).
        self.checks: dict[str, dict[str, Any]] = {}
        #: The latest Workload object seen, by gang key.
        self.workloads: dict[str, dict[str, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: When each joint gang began waiting for missing members (joint key -> time).
        self._member_wait = joint.MemberWait()

    # -- events ------------------------------------------------------------------------------
    async def on_admission_check(self, event_type: str | None, ac: Mapping[str, Any]) -> None:
        name = str((ac.get("metadata") or {}).get("name") or "")
        if event_type == "DELETED" or not kueue.is_our_check(ac):
            was_ours = self.checks.pop(name, None) is not None
            if was_ours:
                await self._reconcile_referencing(name)
            return
        is_new = name not in self.checks
        self.checks[name] = dict(ac)
        await self.reconcile_check(ac)
        if is_new:
            await self._reconcile_referencing(name)

    async def on_workload(self, event_type: str | None, wl: Mapping[str, Any]) -> None:
        key = kueue.gang_key(wl)
        if event_type == "DELETED":
            self.workloads.pop(key, None)
            async with self._lock(key):
                if self.leader and self.cache.reservation(key) is not None:
                    await self._release(key, None, "workload deleted")
            return
        self.workloads[key] = dict(wl)
        await self.reconcile(key)

    # -- leadership --------------------------------------------------------------------------
    async def become_leader(self) -> None:
        """Read what this controller decides from: our AdmissionChecks, and the ledger (rebuilt
        from the SliceReservation objects just before, see runner.take_lead) less the holds of
        Workloads that are gone; only then start deciding."""
        self.checks = (
            {
                str(ac["metadata"]["name"]): ac
                for ac in (await self.api.list(ADMISSION_CHECKS)).items
                if kueue.is_our_check(ac)
            }
            if self.kueue
            else {}
        )
        await self.release_orphans()
        self.leader = True
        for ac in list(self.checks.values()):
            await self.reconcile_check(ac)
        for key in list(self.workloads):
            await self.reconcile(key)

    def lose_leadership(self) -> None:
        self.leader = False

    async def release_orphans(self) -> int:
        """Release the reservations (rebuilt into the ledger) whose Workload is gone or is a
        later one of the same name; returns how many."""
        released = 0
        for r in self.cache.ledger.reservations():
            ref = ReservationRef.of(r)
            if ref.owner_kind != WORKLOAD_KIND:
                continue
            ns, name = ref.namespace, ref.owner_name
            try:
                wl = await self.api.get(WORKLOADS, name, ns)
            except NotFound:
                wl = None
            if not owned.owned_by(r, wl):
                await self._release(r.gang, None, "its Workload is gone")
                released += 1
        await self.cache.flush()
        return released

    # -- periodic ----------------------------------------------------------------------------
    async def resync(self) -> None:
        """Look again at every Workload waiting for a slice (time moves the stage on, freed
        capacity may now fit it) or holding one it should not (a release that failed)."""
        if not self.leader:
            return
        for key, wl in list(self.workloads.items()):
            action, _ = kueue.decide(wl, self.checks, self.cache.reservation(key) is not None)
            if action in (Action.PLACE, Action.RELEASE):
                await self.reconcile(key)

    async def run_resync(self, stop: asyncio.Event) -> None:
        await resync_until(stop, self.config.resync_s, self.resync, "resync")

    # -- AdmissionChecks -----------------------------------------------------------------------
    async def reconcile_check(self, ac: Mapping[str, Any]) -> None:
        if not self.leader or not kueue.is_our_check(ac):
            return
        body = kueue.admission_check_apply_body(ac, rfc3339(self.clock()))
        if body is None:
            return
        name = str(body["metadata"]["name"])
        try:
            self.checks[name] = await self.api.apply(ADMISSION_CHECKS, body, subresource="status")
        except KubeError as exc:
            log.warning("setting AdmissionCheck %s Active failed: %s", name, exc)

    async def _reconcile_referencing(self, check: str) -> None:
        for key, wl in list(self.workloads.items()):
            if any(e.get("name") == check for e in (wl.get("status") or {}).get("admissionChecks") or ()):
                await self.reconcile(key)

    # -- Workloads -------------------------------------------------------------------------------
    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def reconcile(self, key: str) -> None:
        if not self.leader or not self.cache.ready:
            return
        async with self._lock(key):
            wl = self.workloads.get(key)
            if wl is None:
                return
            try:
                await self._reconcile(key, wl)
            except Conflict:
                # Someone (Kueue) wrote the Workload after we read it: read it again, once.
                ns, name = object_ref(wl)
                try:
                    fresh = await self.api.get(WORKLOADS, name, ns)
                except NotFound:
                    return
                self.workloads[key] = fresh
                try:
                    await self._reconcile(key, fresh)
                except KubeError as exc:
                    log.warning("workload %s: %s", key, exc, extra=fields(gang=key, workload=key))
            except KubeError as exc:
                log.warning("workload %s: %s (will retry)", key, exc, extra=fields(gang=key, workload=key))

    async def _reconcile(self, key: str, wl: dict[str, Any]) -> None:
        held = self.cache.reservation(key)
        action, why = kueue.decide(wl, self.checks, held is not None)
        if action is Action.RELEASE:
            await self._release(key, wl, why)
        elif action is Action.PLACE:
            await self._place(key, wl)
        elif action is Action.KEEP:
            await self._keep(key, wl)

    async def _place(self, key: str, wl: dict[str, Any]) -> None:
        try:
            member = _membership(wl)
        except joint.JointError as exc:
            await self._write(wl, "Rejected", str(exc), event=("Warning", "InvalidGang", str(exc)))
            return
        if member is not None:
            await self._reconcile_joint(wl, member)
            return
        now = self.clock()
        held = self.cache.reservation(key)
        if held is not None:
            stale = self._stale(held, wl)
            if stale:
                await self._release(key, wl, f"stale reservation ({stale})")
                held = None
        try:
            claim_gpus = await self._claim_gpus(wl)
            gang = workload_gang.gang_from_workload(wl, self.cache.snapshot().hierarchy, claim_gpus)
            flavors = await self._flavors(wl)
        except WorkloadError as exc:
            await self._write(wl, "Rejected", str(exc), event=("Warning", "InvalidGang", str(exc)))
            return
        request = assignment.with_flavor_tolerations(
            gang.request, wl, {f: t for f, (_, t) in flavors.items()}
        )
        allowed = assignment.pod_set_nodes(wl, {f: labels for f, (labels, _) in flavors.items()})
        if held is None:
            started = parse_rfc3339(kueue.wait_started(wl)) or now
            stage = kueue.wait_stage(now - started, self.config)
            solve = assignment.solver(stage, allowed, rfc3339(started + self.config.widen_after_s))
            got = await self.cache.book.hold(
                request, self._claim(key, wl, now, bool(claim_gpus)), solve=solve
            )
            if isinstance(got, Unplaceable):
                await self._wait(wl, got, stage)
                return
            held = got
            if not await self._persist(held, wl, now):
                return
            nodes = ", ".join(held.slice.nodes)
            await self._event(wl, "Normal", "SliceReserved", f"reserved {object_name(key)} on {nodes}")
        elif not await self._persist(held, wl, now):
            return
        updates = assignment.pod_set_updates(
            wl, held.slice, self.cache.snapshot(), object_name(key), allowed, pinned=claim_gpus
        )
        message = self._ready_message(held)
        await self._write(wl, "Ready", message, pod_set_updates=updates)

    # -- joint gangs ---------------------------------------------------------------------------
    async def _reconcile_joint(self, wl: Mapping[str, Any], member: joint.Membership) -> None:
        """Place every Workload of ``member``'s joint gang as one request once all of them
        have quota, hold one reservation per Workload (all or none), then set every one's
        check Ready in one pass. Members with quota wait for the others up to
        ``member_wait_s``, then give their quota back naming the missing ones."""
        ns, _ = object_ref(wl)
        jkey = f"{ns}/{member.gang}"
        wls: dict[str, dict[str, Any]] = {}
        declared: dict[str, joint.Membership] = {}
        same_namespace = (w for w in self.workloads.values() if object_ref(w)[0] == ns)
        for w, m in joint.members(same_namespace, member.gang, _membership):
            action, _ = kueue.decide(w, self.checks, self.cache.reservation(kueue.gang_key(w)) is not None)
            if action in (Action.PLACE, Action.KEEP):
                wname = object_ref(w)[1]
                wls[wname], declared[wname] = w, m
        try:
            expected = joint.expected_members(list(declared.values()))
        except joint.JointError as exc:
            for w in wls.values():
                await self._write(w, "Rejected", f"joint gang {jkey}: {exc}")
            return
        now = self.clock()
        keys = {name: kueue.gang_key(w) for name, w in wls.items()}
        held = {n: self.cache.reservation(k) for n, k in keys.items()}
        short = self._member_wait.short(jkey, declared, expected, now, self.config.member_wait_s)
        if short is not None:
            absent = short.absent
            if not short.timed_out:
                message = (
                    f"joint gang {jkey}: waiting for member(s) {absent} ({len(wls)} of {expected} have quota)"
                )
                for w in wls.values():
                    await self._write(w, "Pending", message)
                return
            self._member_wait.forget(jkey)
            message = (
                f"joint gang {jkey}: member(s) {absent} did not get quota within "
                f"{int(self.config.member_wait_s)}s; giving the quota back"
            )
            for name, w in wls.items():
                await self._release(keys[name], w, message)
                await self._write(
                    w,
                    "Retry",
                    message,
                    requeue_after_s=self.config.requeue_after_s,
                    event=("Warning", "MemberMissing", message),
                )
            return
        if any(r is None for r in held.values()):
            for name, r in held.items():
                if r is not None:
                    await self._release(keys[name], None, f"re-placing joint gang {jkey}")
            if not await self._hold_joint(jkey, wls, declared, now):
                return
        for name, w in wls.items():
            r = self.cache.reservation(keys[name])
            if r is None or not await self._persist(r, w, now):
                for k in keys.values():
                    await self._release(k, None, f"persisting joint gang {jkey} failed")
                return
        snap = self.cache.snapshot()
        ready = []
        for name in sorted(wls):
            w = self.workloads.get(keys[name], wls[name])
            r = self.cache.reservation(keys[name])
            assert r is not None
            allowed = assignment.pod_set_nodes(w, await self._flavor_labels(w))
            try:
                claim_gpus = await self._claim_gpus(w)
            except WorkloadError as exc:
                # Read fine when the slice was held a moment ago: every member waits again
                # (before any is Ready), rather than one Rejected while its slice stays held.
                for k in keys.values():
                    await self._release(k, None, f"joint gang {jkey}: {exc}")
                return
            updates = assignment.pod_set_updates(
                w, r.slice, snap, object_name(keys[name]), allowed, pinned=claim_gpus
            )
            ready.append((w, r, updates))
        for w, r, updates in ready:
            await self._write(
                w, "Ready", self._ready_message(r) + f" (joint gang {jkey})", pod_set_updates=updates
            )

    async def _hold_joint(
        self,
        jkey: str,
        wls: Mapping[str, dict[str, Any]],
        declared: Mapping[str, joint.Membership],
        now: float,
    ) -> bool:
        h = self.cache.snapshot().hierarchy
        requests = {}
        allowed: dict[str, assignment.PodSetNodes] = {}
        started = now
        pinned: dict[str, bool] = {}
        for name, w in wls.items():
            try:
                flavors = await self._flavors(w)
                claim_gpus = await self._claim_gpus(w)
                pinned[name] = bool(claim_gpus)
                gang = workload_gang.gang_from_workload(w, h, claim_gpus)
                requests[name] = assignment.with_flavor_tolerations(
                    gang.request, w, {f: t for f, (_, t) in flavors.items()}
                )
            except WorkloadError as exc:
                await self._write(w, "Rejected", str(exc), event=("Warning", "InvalidGang", str(exc)))
                return False
            labels = {f: lb for f, (lb, _) in flavors.items()}
            for ps, rule in assignment.pod_set_nodes(w, labels).items():
                allowed[f"{name}{joint.SEP}{ps}"] = rule
            started = min(started, parse_rfc3339(kueue.wait_started(w)) or now)
        colocate = {n: m.colocate_with for n, m in declared.items() if m.colocate_with}
        try:
            request = joint.joint_request(jkey, requests, colocate, h)
        except joint.JointError as exc:
            for w in wls.values():
                await self._write(w, "Rejected", str(exc), event=("Warning", "InvalidGang", str(exc)))
            return False
        stage = kueue.wait_stage(now - started, self.config)
        keys = {name: kueue.gang_key(w) for name, w in wls.items()}
        solve = assignment.solver(stage, allowed, rfc3339(started + self.config.widen_after_s))
        claims = [self._claim(keys[name], w, now, pinned[name]) for name, w in wls.items()]
        result = await self.cache.book.hold_joint(request, claims, split=joint.splitter(keys), solve=solve)
        if isinstance(result, Unplaceable):
            for w in wls.values():
                await self._wait(w, result, stage)
            return False
        return True

    def _claim(self, key: str, wl: Mapping[str, Any], now: float, pinned: bool = False) -> Claim:
        meta = {META_ATTEMPT: kueue.wait_started(wl) or ""}
        if pinned:
            meta[names.META_SLOT_CLAIMS] = "true"  # its pods' GPU claims are pinned per slot
        return owned.owner_claim(key, _owner(wl), now + self.config.hold_ttl_s, **meta)

    async def _claim_gpus(self, wl: Mapping[str, Any]) -> dict[str, int]:
        """GPUs per pod that each pod set asks for through a ``gpu.nvidia.com`` ResourceClaimTemplate
        (DRA nodes); the admission webhook pins each pod's claim to its slot at creation."""
        ns, name = object_ref(wl)
        out: dict[str, int] = {}
        for raw in kueue.pod_sets(wl):
            spec = as_map(as_map(raw.get("template")).get("spec"))
            if not spec.get("resourceClaims"):
                continue
            pod_set = str(raw.get("name") or "main")
            try:
                got = await slot_claims.gpu_claim(self.api, ns, spec, self.cache.device_class_drivers)
            except slot_claims.SlotError as exc:
                raise WorkloadError(f"workload {ns}/{name}: pod set {pod_set}: {exc}") from None
            if got is not None:
                out[pod_set] = got.request.count
        return out

    def _stale(self, r: Reservation, wl: Mapping[str, Any]) -> str | None:
        uid = str((wl.get("metadata") or {}).get("uid") or "")
        if r.meta.get(META_OWNER_UID, uid) != uid:
            return "made for an earlier Workload of the same name"
        attempt = kueue.wait_started(wl) or ""
        if r.meta.get(META_ATTEMPT, attempt) != attempt:
            return "made for an earlier admission of this Workload"
        snap = self.cache.snapshot()
        gone = [n for n in r.slice.nodes if not snap.has_node(n)]
        if gone:
            return f"node(s) {', '.join(gone)} are gone"
        return None

    async def _persist(self, r: Reservation, wl: Mapping[str, Any], now: float) -> bool:
        """Make sure the SliceReservation object exists (owned by the Workload) with its
        status; False when it could not be written (the hold is dropped, so nothing leaks; a
        resync retries)."""
        if not await self.cache.persist(r.gang):
            self.cache.drop(r.gang)
            await self.cache.flush()
            return False
        return True

    async def _keep(self, key: str, wl: Mapping[str, Any]) -> None:
        """Our check is Ready: the reservation should be in the ledger. After a restart it is
        (rebuilt from its object); if the object is gone too, the pods keep their pod set
        updates and the extender places them as they come."""
        if self.cache.reservation(key) is not None:
            return
        ns, _ = object_ref(wl)
        try:
            r = reservation_from_object(await self.api.get(SLICE_RESERVATIONS, object_name(key), ns))
        except NotFound:
            log.warning(
                "workload %s is Ready but its SliceReservation is gone",
                key,
                extra=fields(gang=key, workload=key),
            )
            return
        except CrdError as exc:
            log.warning("workload %s: %s", key, exc, extra=fields(gang=key, workload=key))
            return
        self.cache.restore(r)

    async def _wait(self, wl: Mapping[str, Any], result: Unplaceable, stage: Stage) -> None:
        if stage is Stage.RETRY:
            waited = int(self.config.widen_after_s + self.config.retry_after_s)
            message = f"no slice after {waited}s, giving the quota back: {result.reason}"
            await self._write(
                wl,
                "Retry",
                message,
                requeue_after_s=self.config.requeue_after_s,
                event=("Warning", "SliceRetry", message),
            )
            return
        message = f"waiting for a slice: {result.reason}"
        await self._write(wl, "Pending", message, event=("Normal", "WaitingForSlice", result.reason))

    def _ready_message(self, r: Reservation) -> str:
        sl = r.slice
        gpus = sl.gpus
        where = "; ".join(f"{k} in {v}" for k, v in sl.domains.items())
        return (
            f"slice {object_name(r.gang)}: {len(sl.slots)} pods, {gpus} GPUs on {', '.join(sl.nodes)}"
            + (f" ({where})" if where else "")
            + f"; predicted {sl.per_layer_micros:.1f} us/layer"
        )

    async def _write(
        self,
        wl: Mapping[str, Any],
        state: str,
        message: str,
        pod_set_updates: list[dict[str, Any]] | None = None,
        requeue_after_s: int | None = None,
        event: tuple[str, str, str] | None = None,
    ) -> None:
        """Apply our entries (only ours) with ``state``; nothing when they already say so."""
        now_text = rfc3339(self.clock())
        entries = []
        changed = False
        for current in kueue.our_entries(wl, self.checks):
            entry = kueue.check_entry(current, state, message, now_text, pod_set_updates, requeue_after_s)
            changed = changed or not kueue.entry_unchanged(current, entry)
            entries.append(entry)
        if not entries or not changed:
            return
        updated = await self.api.apply(
            WORKLOADS, kueue.workload_apply_body(wl, entries), subresource="status"
        )
        self.workloads[kueue.gang_key(wl)] = updated
        if event is not None:
            await self._event(wl, *event)

    async def _release(self, key: str, wl: Mapping[str, Any] | None, why: str) -> None:
        r = self.cache.drop(key)
        if r is None:
            return
        await self.cache.flush()
        log.info("released the reservation of %s: %s", key, why, extra=fields(gang=key, workload=key))
        if wl is not None:
            await self._event(wl, "Normal", "SliceReleased", f"released {object_name(key)}: {why}")

    async def _flavor_labels(self, wl: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        return {f: labels for f, (labels, _) in (await self._flavors(wl)).items()}

    async def _flavors(
        self, wl: Mapping[str, Any]
    ) -> dict[str, tuple[dict[str, str], tuple[Toleration, ...]]]:
        """The Workload's ResourceFlavors: name -> (``spec.nodeLabels``, ``spec.tolerations``);
        Kueue adds both to the pods it starts. Raises WorkloadError for tolerations that
        cannot be read."""
        flavors: set[str] = set()
        for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or ():
            flavors.update(str(f) for f in (psa.get("flavors") or {}).values())
        out: dict[str, tuple[dict[str, str], tuple[Toleration, ...]]] = {}
        for f in sorted(flavors):
            try:
                rf = await self.api.get(RESOURCE_FLAVORS, f)
            except NotFound:
                continue
            spec = rf.get("spec") or {}
            labels = spec.get("nodeLabels") or {}
            try:
                tolerations = pod_needs.tolerations(spec.get("tolerations"), "spec.tolerations")
            except pod_needs.NeedsError as exc:
                raise WorkloadError(f"ResourceFlavor {f}: {exc}") from None
            out[f] = ({str(k): str(v) for k, v in labels.items()}, tolerations)
        return out

    async def _event(self, wl: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        now, component = self.clock(), names.CHECK_CONTROLLER
        await owned.post_event(self.api, _owner(wl), kind, reason, message, now, self.identity, component)


def _membership(wl: Mapping[str, Any]) -> joint.Membership | None:
    """The joint gang a Workload belongs to (its own labels and annotations), or None."""
    meta = wl.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    return joint.membership(labels, annotations)


def _owner(wl: Mapping[str, Any]) -> dict[str, Any]:
    """The Workload with its apiVersion and kind filled in (a watch object may lack them)."""
    return {**wl, "apiVersion": wl.get("apiVersion") or KUEUE_API_VERSION, "kind": WORKLOAD_KIND}
