"""Fault injection on every write gangslice makes, for every gang source.

A *point* names one API call of the bind, reserve, save, release or leader hand-over path
(a :attr:`~extender.testing.kube.Call.label` and the phase it is made in); a *mode* says what
happens at it:

- ``fail``: the call raises :class:`~extender.kube.api.Unavailable` (503) and changes
  nothing; the process lives on and its next rounds (resyncs, the scheduler's retries) must
  repair what the failure left.
- ``die``: the process dies as it is about to make the call (the write never lands);
  then as for ``kill``.
- ``kill``: the call takes effect, then the process dies (:class:`Killed`, a BaseException
  nothing in the product catches). The cache, the ledger and the controllers are dropped;
  a fresh :class:`Process` starts over the same :class:`~extender.testing.kube.FakeKube`
  state and runs the restart path (relist, :func:`~extender.controllers.runner.take_lead`,
  which rebuilds the ledger once).

:class:`FaultyKube` wraps the fake API server and arms one point. :class:`World` runs one
gang source (a :class:`Source`: plain gangs, Volcano PodGroups, Kueue Workloads, joint
gangs) through arrival, binds and finish in rounds, injecting the fault at its point, and
:func:`check` states the invariants after it: no GPU booked twice (no two reservations, no
two bound pods, share a node GPU), no reservation leaked (each SliceReservation belongs to a
live gang), every gang placed or waiting with a reason.

The extender's verbs are called as kube-scheduler and Volcano call them (filter then bind;
predicate then allocate, after which Volcano itself binds the pod), through the routes of
:mod:`extender.httpapi` on a mocked request, so their error handling is what is tested.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp.test_utils import make_mocked_request

from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.podgroups.controller import PodGroupConfig, PodGroupController
from extender.controllers.runner import take_lead
from extender.httpapi import kube_routes, volcano_routes
from extender.httpapi.app import build_app
from extender.httpapi.volcano_wire import EventHandlerRequest, PredicateRequest
from extender.httpapi.wire import ExtenderArgs, ExtenderBindingArgs
from extender.kube import names
from extender.kube.api import PODS, Kind, KubeError, Resource, Unavailable
from extender.kube.crd_models import reservation_from_object
from extender.kube.pods import PodInfo
from extender.placement.snapshot import ClusterSnapshot
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.kube import FakeKube

#: The phases of a gang's life in which points are armed.
ARRIVE, BIND, FINISH, LEAD = "arrive", "bind", "finish", "lead"


class Killed(BaseException):
    """The process dies here (kill -9): nothing in the product catches a BaseException."""


@dataclass(frozen=True, slots=True)
class Point:
    """One write (or the one read of the hand-over) that a fault is injected at: the first
    call matching ``label`` (a :attr:`~extender.testing.kube.Call.label`; ``|`` separates
    alternatives, one per gang source) made in ``phase``."""

    name: str
    label: str
    phase: str

    def matches(self, label: str) -> bool:
        return label in self.label.split("|")


@dataclass(frozen=True, slots=True)
class Fault:
    point: Point
    mode: str  # "fail" | "die" | "kill"

    @property
    def id(self) -> str:
        return f"{self.point.name}-{self.mode}"


class FaultyKube:
    """A :class:`FakeKube` with one armed fault: every call is passed on; the first one
    matching the armed label, in the armed phase, fails before or dies after it."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner = inner
        self.phase = ""
        self.armed: Fault | None = None
        self.fired: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _hit(self, verb: str, res: Resource, subresource: str = "") -> Fault | None:
        fault = self.armed
        if fault is None or self.fired is not None or fault.point.phase != self.phase:
            return None
        label = f"{verb} {res.plural}" + (f"/{subresource}" if subresource else "")
        if not fault.point.matches(label):
            return None
        self.fired = f"{fault.mode} at {label} ({self.phase})"
        return fault

    async def _call(self, verb: str, res: Resource, sub: str, go: Callable[[], Awaitable[Any]]) -> Any:
        fault = self._hit(verb, res, sub)
        label = f"{verb} {res.plural}" + (f"/{sub}" if sub else "")
        if fault is not None and fault.mode == "fail":
            raise Unavailable(503, f"injected: {label} failed")
        if fault is not None and fault.mode == "die":
            raise Killed(fault.id)
        got = await go()
        if fault is not None:
            raise Killed(fault.id)
        return got

    async def get(self, res: Resource, name: str, namespace: str = "") -> dict[str, Any]:
        got: dict[str, Any] = await self._call("get", res, "", lambda: self.inner.get(res, name, namespace))
        return got

    async def list(self, res: Resource, namespace: str = "") -> Any:
        return await self._call("list", res, "", lambda: self.inner.list(res, namespace))

    def watch(self, res: Resource, resource_version: str, timeout_s: float) -> Any:
        return self.inner.watch(res, resource_version, timeout_s)

    async def create(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> Any:
        return await self._call(
            "create", res, subresource, lambda: self.inner.create(res, obj, subresource=subresource)
        )

    async def replace(self, res: Resource, obj: Mapping[str, Any]) -> Any:
        return await self._call("replace", res, "", lambda: self.inner.replace(res, obj))

    async def patch(self, res: Resource, name: str, body: Any, **kw: Any) -> Any:
        sub = str(kw.get("subresource", ""))
        return await self._call("patch", res, sub, lambda: self.inner.patch(res, name, body, **kw))

    async def apply(self, res: Resource, obj: Mapping[str, Any], *, subresource: str = "") -> Any:
        return await self._call(
            "apply", res, subresource, lambda: self.inner.apply(res, obj, subresource=subresource)
        )

    async def delete(self, res: Resource, name: str, namespace: str = "") -> None:
        await self._call("delete", res, "", lambda: self.inner.delete(res, name, namespace))

    async def evict(self, namespace: str, name: str, uid: str = "", *, dry_run: bool = False) -> None:
        await self._call(
            "create", PODS, "eviction", lambda: self.inner.evict(namespace, name, uid, dry_run=dry_run)
        )

    async def serves(self, res: Resource) -> bool:
        return await self.inner.serves(res)


class Process:
    """One gangslice process (extender and controllers over one cluster cache), started
    the way ``gangslice serve`` starts: list, then lead (the ledger rebuilt once)."""

    def __init__(self, world: World) -> None:
        self.world = world
        api = world.api
        self.cache = ClusterCache.from_snapshot(
            world.snapshot,
            clock=world.clock,
            store=KubeReservationStore(api, world.clock),
            awaiting=(Kind.PODS,),
            ttl_s=world.ttl_s,
        )
        self.kueue = AdmissionController(api, self.cache, CheckConfig(member_wait_s=60), clock=world.clock)
        self.podgroups = PodGroupController(
            api, self.cache, PodGroupConfig(member_wait_s=60), clock=world.clock
        )
        self.app = build_app(self.cache, api=api)  # type: ignore[arg-type]
        self.led = False

    def relist(self) -> None:
        self.cache.replace(Kind.PODS, self.world.kube.objects("pods"))

    async def lead(self) -> None:
        self.relist()
        await take_lead(self.cache, self.kueue, self.podgroups)
        self.led = True

    async def controllers(self) -> None:
        """What kopf's watches and the resync loops hand the controllers in one round."""
        kube = self.world.kube
        for ac in kube.objects("admissionchecks"):
            await self.kueue.on_admission_check(None, ac)
        for wl in kube.objects("workloads"):
            await self.kueue.on_workload(None, wl)
        await self.kueue.resync()
        for pg in kube.objects("podgroups"):
            await self.podgroups.on_podgroup(None, pg)
        for pod in kube.objects("pods"):
            await self.podgroups.on_pod(None, pod)
        await self.podgroups.resync()

    def _request(self) -> Any:
        return make_mocked_request("POST", "/", app=self.app)

    async def schedule(self, pod: Mapping[str, Any]) -> str:
        """One scheduling cycle of a pending pod; what the verbs answered (for the record)."""
        nodes = self.cache.node_names()
        if pod["spec"].get("schedulerName") == "volcano":
            return await self._volcano(pod, nodes)
        args = ExtenderArgs.model_validate({"Pod": pod, "NodeNames": nodes})
        got = await kube_routes.filter_nodes(self._request(), args)
        reply = json.loads(bytes(got)) if isinstance(got, bytes) else got
        passed = reply.get("NodeNames") or []
        if not passed:
            return f"filter: {next(iter((reply.get('FailedNodes') or {}).values()), reply.get('Error'))}"
        self.world.promised(pod, "filter")
        if self.world.write_behind_first:
            # The background writer's turn comes before kube-scheduler's bind (a race in
            # the real service: the bind usually comes first).
            await self.cache.flush()
        meta = pod["metadata"]
        bind = ExtenderBindingArgs.model_validate(
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": passed[0],
            }
        )
        self.world.enter(BIND)
        out = await kube_routes.bind(self._request(), bind)
        return f"bind {passed[0]}: {out.get('Error') or 'ok'}"

    async def _volcano(self, pod: Mapping[str, Any], nodes: list[str]) -> str:
        """Volcano's session: predicate on each node, allocate on the first that passes,
        then Volcano binds the pod itself (its own Binding, not gangslice's)."""
        meta = pod["metadata"]
        group = (meta.get("annotations") or {}).get(names.VOLCANO_GROUP, "")
        task = {
            "UID": meta["uid"],
            "Name": meta["name"],
            "Namespace": meta["namespace"],
            "Job": f"{meta['namespace']}/{group}",
            "Pod": pod,
        }
        why = "no node"
        for node in nodes:
            asked = PredicateRequest.model_validate({"task": task, "node": {"Name": node}})
            got = await volcano_routes.predicate(self._request(), asked)
            if got.get("status"):
                why = str(got["status"])
                continue
            self.world.promised(pod, "predicate", task["Job"])
            self.world.enter(BIND)
            event = EventHandlerRequest.model_validate({"task": {**task, "NodeName": node}})
            out = await volcano_routes.allocate(self._request(), event)
            if out.get("errorMessage"):
                return f"allocate {node}: {out['errorMessage']}"
            self.world.kube.put("pods", dict(pod, spec={**pod["spec"], "nodeName": node}))
            return f"allocate {node}: ok"
        return f"predicate: {why}"


class Source(Protocol):
    """One way gangs reach gangslice."""

    name: str

    def setup(self, kube: FakeKube) -> None:
        """Put the gangs' objects (and any pods that exist from the start)."""

    def arrived(self, kube: FakeKube) -> None:
        """What the gang's other controllers do in a round (Kueue's job controller creates
        the pods of an admitted Workload)."""

    def gangs(self, kube: FakeKube) -> dict[str, str]:
        """The live gangs: gang key -> why it is waiting ("" once placed)."""
        ...

    def finish(self, kube: FakeKube) -> None:
        """The gangs end (their pods and owner objects go, as their owners delete them)."""


@dataclass
class World:
    """One gang source through its life with one fault armed; ``log`` records each round."""

    source: Source
    snapshot: ClusterSnapshot
    ttl_s: float = 300.0
    clock: FakeClock = field(default_factory=lambda: FakeClock(1_000_000.0))
    kube: FakeKube = field(default_factory=FakeKube)
    log: list[str] = field(default_factory=list)
    restarts: int = 0
    #: Verbs that let a pod on while its reservation was not saved.
    broken: list[str] = field(default_factory=list)
    #: Run the extender's background writes (write-behind: a new reservation's status, the
    #: binds' updates) between a filter's reply and the bind, not only at the round's end.
    write_behind_first: bool = False

    def promised(self, pod: Mapping[str, Any], verb: str, job: str | None = None) -> None:
        """A verb let ``pod`` onto a node: its gang's reservation must be saved by now (else
        a restart forgets what the pod was promised)."""
        meta = pod["metadata"]
        ns = meta["namespace"]
        stored = self.kube.objects("slicereservations")
        gang = (meta.get("labels") or {}).get(names.GANG)
        wanted = (meta.get("annotations") or {}).get(names.RESERVATION)
        keys = {str(o["spec"]["gang"]) for o in stored}
        refs = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in stored}
        ok = (
            (job is None or job in keys)
            and (not gang or f"{ns}/{gang}" in keys or job is not None or wanted is not None)
            and (wanted is None or (ns, wanted) in refs)
        )
        if not ok:
            self.broken.append(f"{verb} passed {meta['name']} with no saved reservation")

    def enter(self, phase: str) -> None:
        """The path moves on to ``phase`` (the binds of a round); a finish round stays one."""
        if self.api.phase != FINISH:
            self.api.phase = phase

    def __post_init__(self) -> None:
        self.api = FaultyKube(self.kube)
        self.proc = Process(self)

    async def guarded(self, phase: str, step: Callable[[], Awaitable[Any]]) -> None:
        """Run ``step`` in ``phase``; a kill drops the process and starts a fresh one, which
        leads at once (the dead leader's lease is taken over)."""
        self.api.phase = phase
        try:
            await step()
        except Killed as k:
            self.log.append(f"killed at {k} in {phase}")
            self.restarts += 1
            self.proc = Process(self)
            self.api.phase = LEAD
            await self.proc.lead()
        except KubeError as exc:
            self.log.append(f"{phase}: {exc}")
        finally:
            self.api.phase = ""

    async def round(self, phase: str) -> None:
        async def step() -> None:
            self.proc.relist()
            await self.proc.controllers()
            self.source.arrived(self.kube)
            self.proc.relist()
            for pod in self.kube.objects("pods"):
                if not pod["spec"].get("nodeName") and PodInfo.from_obj(pod).gpus > 0:
                    self.enter(phase)
                    self.log.append(f"{pod['metadata']['name']}: {await self.proc.schedule(pod)}")
                    self.proc.relist()
            await self.proc.cache.flush()

        await self.guarded(phase, step)

    async def run(self, fault: Fault | None, rounds: int = 6) -> Verdict:
        self.api.armed = fault
        self.source.setup(self.kube)
        await self.guarded(LEAD, self.proc.lead)
        if not self.proc.led:
            await self.guarded("", self.proc.lead)
        for _ in range(rounds):
            await self.round(ARRIVE)
            self.clock.now += 5
        placed = check(self)
        self.source.finish(self.kube)
        for _ in range(3):
            await self.round(FINISH)
            self.clock.now += 5
        finished = check(self)
        return Verdict(
            fault.id if fault else "none", self.api.fired, placed, finished, list(self.log), list(self.broken)
        )


@dataclass(frozen=True)
class State:
    """What :func:`check` found: each list is a violation; ``waiting`` is gang -> reason."""

    double_booked: list[str]
    leaked: list[str]
    unexplained: list[str]
    waiting: dict[str, str]
    placed: list[str]

    @property
    def ok(self) -> bool:
        return not (self.double_booked or self.leaked or self.unexplained)


@dataclass(frozen=True)
class Verdict:
    fault: str
    fired: str | None
    placed: State
    finished: State

    log: list[str]
    broken: list[str]

    @property
    def ok(self) -> bool:
        return (
            not self.broken
            and self.fired is not None
            and self.placed.ok
            and self.finished.ok
            and not self.finished.placed
        )


def check(world: World) -> State:
    """The invariants over the API's state (what survives any process)."""
    kube = world.kube
    taken: dict[tuple[str, int], str] = {}
    double: list[str] = []
    objects = kube.objects("slicereservations")
    by_gang = {}
    by_ref = {}
    for obj in objects:
        r = reservation_from_object(obj)
        by_gang[r.gang] = r
        by_ref[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = r.gang
        for slot in r.slice.slots:
            for g in slot.gpus:
                other = taken.setdefault((slot.node, g), r.gang)
                if other != r.gang:
                    double.append(f"{slot.node} GPU {g}: reservations of {other} and {r.gang}")
    pod_gpus: dict[tuple[str, int], str] = {}
    for pod in kube.objects("pods"):
        meta = pod["metadata"]
        node = pod["spec"].get("nodeName")
        annotations = meta.get("annotations") or {}
        text = annotations.get(names.GPUS)
        if not node or not text:
            continue
        gang_label = (meta.get("labels") or {}).get(names.GANG)
        mine = by_ref.get((meta["namespace"], annotations.get(names.RESERVATION, ""))) or (
            f"{meta['namespace']}/{gang_label}" if gang_label else None
        )
        for g in (int(x) for x in str(text).split(",") if x.strip()):
            who = pod_gpus.setdefault((node, g), meta["name"])
            if who != meta["name"]:
                double.append(f"{node} GPU {g}: pods {who} and {meta['name']}")
            held = taken.get((node, g))
            if held is not None and held != mine:
                double.append(f"{node} GPU {g}: pod {meta['name']} and the reservation of {held}")
    live = world.source.gangs(kube)
    leaked = [f"SliceReservation of {g}" for g in by_gang if g not in live]
    waiting = {g: why for g, why in live.items() if why}
    unexplained = [g for g, why in waiting.items() if why == "?"]
    placed = [g for g, why in live.items() if not why]
    return State(double, leaked, unexplained, waiting, placed)


def matrix_line(source: str, fault: str, verdict: Verdict) -> str:
    p = verdict.placed
    state = "placed" if not p.waiting else "waiting: " + "; ".join(f"{g}: {w}" for g, w in p.waiting.items())
    return (
        f"{source:10} {fault:16} {'ok ' if verdict.ok else 'BAD'} fired={verdict.fired} "
        f"double={len(p.double_booked) + len(verdict.finished.double_booked)} "
        f"leaked={len(p.leaked) + len(verdict.finished.leaked)} "
        f"unsaved-promises={len(verdict.broken)} {state}"
    )


__all__ = [
    "ARRIVE",
    "BIND",
    "FINISH",
    "LEAD",
    "Fault",
    "FaultyKube",
    "Killed",
    "Point",
    "Process",
    "Source",
    "State",
    "Verdict",
    "World",
    "check",
    "matrix_line",
]
