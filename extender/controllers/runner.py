"""``run_controller``: the one runner of every reconcile loop, as tasks on the caller's asyncio loop.

``gangslice serve`` runs it next to the extender HTTP server, on the same loop and over the
same :class:`~extender.reservations.cluster.ClusterCache`, so the extender and the admission check
read and change one ledger and no two decisions race::

    cache = ClusterCache(store=...)                  # fed by the kube watches
    stop = asyncio.Event()
    leading = {"now": False}
    controller = asyncio.create_task(run_controller(
        cache, kubeconfig=args.kubeconfig, stop=stop,
        on_leadership=lambda yes: leading.update(now=yes)))   # /readyz reads leading["now"]
    ...                                               # start the aiohttp site
    await stop.wait()  # or: await controller (it returns when kopf sees SIGINT/SIGTERM)

Its tasks: the Lease election (only the leader decides; becoming leader first rebuilds the
ledger from the SliceReservation objects), the periodic resync of waiting Workloads (and of
PodGroups where Volcano is served), kopf's watches of AdmissionChecks, Workloads and
PodGroups, the pod events of the cluster cache's own watch (:mod:`extender.controllers.pods`:
pods naming a PodGroup, pods of plain gangs), and the leader's housekeeping
(:mod:`extender.controllers.housekeeping`). It returns when ``stop`` is set or when kopf
stops (kopf installs SIGINT/SIGTERM handlers on the main thread); on the way out it gives
the Lease up.

A replica that decides alone (``serve --cluster`` or ``--no-controller``) runs it with
``elect=False``: no Lease and no gang controllers, only the housekeeping, always.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from extender.controllers.common import Cache
from extender.controllers.housekeeping import Housekeeping
from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.leader import LeaderElector, LeaseConfig, default_identity
from extender.controllers.plain_gangs.reporter import PlainGangReporter
from extender.controllers.podgroups.controller import PodGroupConfig, PodGroupController
from extender.controllers.pods import PodFeed
from extender.kube.api import ADMISSION_CHECKS, PODGROUPS, KubeClient, Resource
from extender.kube.client import ApiServerClient, load_api_client

log = logging.getLogger(__name__)


async def run_controller(
    cache: Cache,
    *,
    kubeconfig: str | None = None,
    api: KubeClient | None = None,
    api_client: Any | None = None,
    config: CheckConfig | None = None,
    lease: LeaseConfig | None = None,
    identity: str | None = None,
    on_leadership: Callable[[bool], None] | None = None,
    stop: asyncio.Event | None = None,
    watch: bool = True,
    kueue: bool | None = None,
    volcano: bool | None = None,
    podgroup_config: PodGroupConfig | None = None,
    housekeeping: Housekeeping | None = None,
    pods: PodFeed | None = None,
    elect: bool = True,
) -> None:
    """Run the controllers (Kueue admission check, PodGroups, plain gangs, housekeeping) until
    ``stop`` is set.

    ``cache``: the cluster cache the extender uses (its ledger is the one reservations go
    to). The API is ``api`` if given, else a client for ``api_client`` or ``kubeconfig``
    (None: in-cluster service account, then the default kubeconfig). ``watch=False`` leaves
    kopf out (events are then fed to the controller by the caller, as tests do).
    ``on_leadership(True/False)`` is called as leadership comes and goes (for ``/readyz``).
    ``kueue``: run the Kueue admission check (None: when the API serves AdmissionChecks).
    ``volcano``: also run the PodGroup controller (None: when the API serves PodGroups).
    ``housekeeping``: its pass runs on the leader. ``pods``: the pod events of the cluster
    cache's watch, handed to the PodGroup controller and the plain-gang reporter.
    ``elect=False``: this replica decides alone; only ``housekeeping`` runs (no API needed), and
    its claims controller on ``pods``.
    """
    stop = stop if stop is not None else asyncio.Event()
    if not elect:
        alone = []
        if housekeeping is not None:
            alone.append(asyncio.create_task(housekeeping.run(stop, lambda: True)))
            if pods is not None and housekeeping.pod_claims is not None:
                alone.append(asyncio.create_task(pods.run(stop, None, None, housekeeping.pod_claims)))
        if alone:
            await _until_done(alone, stop)
        else:
            await stop.wait()
        return
    if api is None:
        api_client = api_client if api_client is not None else load_api_client(kubeconfig)
        api = ApiServerClient(api_client)
    ident = identity or default_identity()
    if kueue is None:
        kueue = await _served(api, ADMISSION_CHECKS, "Kueue")
    if volcano is None:
        volcano = await _served(api, PODGROUPS, "Volcano")
    controller = AdmissionController(api, cache, config, identity=ident, kueue=kueue)
    podgroups = PodGroupController(api, cache, podgroup_config, identity=ident) if volcano else None
    plain = PlainGangReporter(api, cache, identity=ident)
    leading = False

    async def started() -> None:
        nonlocal leading
        await take_lead(cache, controller, *([podgroups] if podgroups is not None else []))
        plain.leader = leading = True
        if on_leadership is not None:
            on_leadership(True)

    def stopped() -> None:
        nonlocal leading
        controller.lose_leadership()
        if podgroups is not None:
            podgroups.lose_leadership()
        plain.leader = leading = False
        if on_leadership is not None:
            on_leadership(False)

    fence = cache.book.fence
    elector = LeaderElector(api, lease or LeaseConfig(), ident, started, stopped, fence=fence)
    tasks = [
        asyncio.create_task(elector.run(stop), name="gangslice-lease"),
        asyncio.create_task(controller.run_resync(stop), name="gangslice-resync"),
    ]
    if podgroups is not None:
        tasks.append(asyncio.create_task(podgroups.run_resync(stop), name="gangslice-podgroup-resync"))
    if pods is not None:
        claims = housekeeping.pod_claims if housekeeping is not None else None
        tasks.append(asyncio.create_task(pods.run(stop, podgroups, plain, claims), name="gangslice-pods"))
    if housekeeping is not None:
        tasks.append(
            asyncio.create_task(housekeeping.run(stop, fence.decides), name="gangslice-housekeeping")
        )
    if watch:
        tasks.append(
            asyncio.create_task(_run_kopf(controller, api_client, stop, podgroups), name="gangslice-kopf")
        )
    await _until_done(tasks, stop)


async def _until_done(tasks: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait for the first task to end (or fail), then stop the others."""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t.exception() is not None:
                log.error("controller task %s failed: %s", t.get_name(), t.exception())
    finally:
        stop.set()
        for t in tasks:
            if not t.done():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(t), 10)
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t


class Leads(Protocol):
    async def become_leader(self) -> None: ...


async def take_lead(cache: Cache, *controllers: Leads) -> None:
    """What a replica does when it becomes leader, in this order: rebuild the ledger from the
    SliceReservations, once, for every component (the extender, the Kueue check and the
    PodGroup controller read the one ledger), then let each controller look at what it owns."""
    restored = await cache.rebuild_ledger()
    log.info("ledger rebuilt: %d reservation(s)", restored)
    for c in controllers:
        await c.become_leader()


async def _served(api: KubeClient, res: Resource, what: str) -> bool:
    try:
        served = await api.serves(res)
    except Exception as exc:
        log.warning("could not tell whether %s (%s) is served: %s", what, res.api_version, exc)
        return False
    if not served:
        log.info("%s (%s %s) is not served: its integration is off", what, res.api_version, res.plural)
    return served


async def _run_kopf(
    controller: AdmissionController,
    api_client: Any | None,
    stop: asyncio.Event,
    podgroups: PodGroupController | None = None,
) -> None:
    import kopf

    from extender.controllers.handlers import operator_settings, register

    registry = kopf.OperatorRegistry()
    register(registry, controller, api_client, podgroups)
    await kopf.operator(
        registry=registry,
        settings=operator_settings(),
        clusterwide=True,
        standalone=True,
        stop_flag=stop,
    )
