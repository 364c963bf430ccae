"""The kopf wiring (v1beta2 watches only, events routed to the controller, kopf's own event
posting off) and ``run_controller`` on the caller's loop (leadership, stop, lease hand-back)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kopf

from extender.controllers.handlers import connection_info, operator_settings, register
from extender.placement.files import cluster_from_data
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.kube import FakeKube
from extender.testing.leading import lead


class Recorder:
    kueue = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str]] = []

    async def on_workload(self, event_type: str | None, obj: dict[str, Any]) -> None:
        self.seen.append(("workload", event_type, obj["metadata"]["name"]))

    async def on_admission_check(self, event_type: str | None, obj: dict[str, Any]) -> None:
        self.seen.append(("admissioncheck", event_type, obj["metadata"]["name"]))


def test_handlers_watch_kueue_v1beta2_and_route_events() -> None:
    registry = kopf.OperatorRegistry()
    recorder = Recorder()
    register(registry, recorder, None)  # type: ignore[arg-type]
    handlers = registry._watching.get_all_handlers()  # kopf has no public accessor for these
    by_plural = {h.selector.any_name: h for h in handlers if h.selector is not None}
    assert set(by_plural) == {"workloads", "admissionchecks"}
    for h in by_plural.values():
        assert h.selector is not None
        assert (h.selector.group, h.selector.version) == ("kueue.x-k8s.io", "v1beta2")

    async def body() -> None:
        wl = {"metadata": {"name": "wl-1", "namespace": "ns"}}
        on_workload: Any = by_plural["workloads"].fn
        on_check: Any = by_plural["admissionchecks"].fn
        await on_workload(event={"type": "DELETED", "object": wl})
        await on_check(event={"type": None, "object": {"metadata": {"name": "ac"}}})

    asyncio.run(body())
    assert recorder.seen == [("workload", "DELETED", "wl-1"), ("admissioncheck", None, "ac")]
    # Without an API client kopf logs in its own way; with one, it reuses its credentials.
    assert registry._activities.get_all_handlers() == []


def test_kopf_posts_no_events_and_scans_nothing() -> None:
    settings = operator_settings()
    assert settings.posting.enabled is False
    assert settings.scanning.disabled is True


def test_connection_info_comes_from_the_clients_configuration() -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = "https://127.0.0.1:6443"
    cfg.api_key = {"BearerToken": "tok-123"}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    cfg.ssl_ca_cert = "/ca.crt"
    info = connection_info(client.ApiClient(cfg))
    assert (info.server, info.scheme, info.token, info.ca_path) == (
        "https://127.0.0.1:6443",
        "Bearer",
        "tok-123",
        "/ca.crt",
    )
    registry = kopf.OperatorRegistry()
    register(registry, Recorder(), client.ApiClient(cfg))  # type: ignore[arg-type]
    (login,) = registry._activities.get_all_handlers()
    fn: Any = login.fn
    assert fn().token == "tok-123"


def test_run_controller_leads_on_the_callers_loop_and_hands_the_lease_back() -> None:
    async def body() -> None:
        api = FakeKube()
        snap = cluster_from_data(
            {"nodes": [{"name": "n", "gpuTopology": "hgx-h100"}]}, base=Path(__file__).parent
        )
        cache = ClusterCache.from_snapshot(snap, store=KubeReservationStore(api))
        leading: list[bool] = []
        task, stop = await lead(cache, api, leading)
        got = api.peek("leases", "ctl", "gs")
        assert got is not None and got["spec"]["holderIdentity"] == "me"
        assert "list slicereservations" in api.labels()  # the ledger was rebuilt on becoming leader
        stop.set()
        await asyncio.wait_for(task, 10)
        assert leading == [True, False]
        got = api.peek("leases", "ctl", "gs")
        assert got is not None and got["spec"]["holderIdentity"] is None

    asyncio.run(body())
