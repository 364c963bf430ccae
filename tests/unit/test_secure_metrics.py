"""The metrics port: bearer tokens reviewed by a reviewer (the API server's TokenReview and
SubjectAccessReview in production, tests/e2e/test_install.py), answers kept per token; and the
gauges for alerts (certificate expiry, gang waits)."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from extender.httpapi.health_metrics import HealthCollector, certificate_files, not_after
from extender.httpapi.metrics import Metrics
from extender.httpapi.secure_metrics import (
    ALLOWED_TTL_S,
    DENIED_TTL_S,
    MAX_REVIEWS,
    CachedReviewer,
    Verdict,
    build_metrics_app,
)
from extender.kube.pods import PodInfo
from extender.reservations import ClusterCache

BODY = b"# HELP x a metric\n# TYPE x gauge\nx 1.0\n"


class Reviewer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def review(self, token: str) -> Verdict:
        self.calls.append(token)
        if token == "broken":
            raise ConnectionError("API server unreachable")
        if token == "prometheus":
            return Verdict(True, "system:serviceaccount:monitoring:prometheus")
        if token == "stranger":
            return Verdict(False, "system:serviceaccount:default:x may not get /metrics")
        return Verdict(False, "token review: invalid bearer token", authenticated=False)


def scrape(reviewer: Any, *headers: dict[str, str]) -> list[tuple[int, str]]:
    async def go() -> list[tuple[int, str]]:
        client = TestClient(TestServer(build_metrics_app(lambda: BODY, reviewer)))
        await client.start_server()
        try:
            out = []
            for h in headers:
                resp = await client.get("/metrics", headers=h)
                out.append((resp.status, await resp.text()))
            health = await client.get("/healthz")
            assert health.status == 200
            return out
        finally:
            await client.close()

    return asyncio.run(go())


def test_a_scrape_needs_a_token_the_reviewer_grants() -> None:
    got = scrape(
        Reviewer(),
        {},
        {"Authorization": "Basic dXNlcjpwdw=="},
        {"Authorization": "Bearer nonsense"},
        {"Authorization": "Bearer stranger"},
        {"Authorization": "Bearer broken"},
        {"Authorization": "Bearer prometheus"},
    )
    assert [status for status, _ in got] == [401, 401, 401, 403, 503, 200]
    assert "may not get /metrics" in got[3][1]
    assert got[5][1] == BODY.decode()


def test_answers_are_kept_per_token_for_a_while() -> None:
    now = [0.0]
    inner = Reviewer()
    cached = CachedReviewer(inner, clock=lambda: now[0])
    for _ in range(3):
        assert (
            asyncio.run(cached.review("prometheus")).allowed
            and not asyncio.run(cached.review("stranger")).allowed
        )
    assert inner.calls == ["prometheus", "stranger"]
    now[0] = DENIED_TTL_S + 1  # a refusal is asked again soon, a grant later
    asyncio.run(cached.review("prometheus")), asyncio.run(cached.review("stranger"))
    assert inner.calls == ["prometheus", "stranger", "stranger"]
    now[0] = ALLOWED_TTL_S + 1
    asyncio.run(cached.review("prometheus"))
    assert inner.calls[-1] == "prometheus" and len(inner.calls) == 4


def _self_signed(tmp_path: Path, days: int) -> Path:
    cert = tmp_path / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", str(tmp_path / "tls.key"), "-out", str(cert), "-days", str(days), "-subj", "/CN=t"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert


def _samples(metrics: Metrics) -> dict[str, list[Any]]:
    families = text_string_to_metric_families(metrics.render().decode())
    return {f.name: f.samples for f in families}


def test_certificate_expiry_is_read_from_the_files(tmp_path: Path) -> None:
    cert = _self_signed(tmp_path, days=10)
    (tmp_path / "ca.crt").write_bytes(cert.read_bytes())
    expected = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=10)).timestamp()
    at = not_after(str(cert))
    assert at is not None and abs(at - expected) < 120
    assert not_after(str(tmp_path / "missing.crt")) is None
    metrics = Metrics(ClusterCache())
    metrics.health.certificates.update(certificate_files(str(cert)))
    samples = _samples(metrics)["gangslice_certificate_expiry_timestamp_seconds"]
    got = {s.labels["certificate"]: s.value for s in samples}
    assert got == {"serving": at, "ca": at}


def test_waiting_gangs_are_counted_from_when_they_are_first_seen() -> None:
    now = [1000.0]
    cache = ClusterCache()
    health = HealthCollector(cache, clock=lambda: now[0])

    def pod(name: str, gang: str, node: str | None = None, gpus: int = 8) -> PodInfo:
        return PodInfo("serving", name, node=node, gpus=gpus, labels={"gangslice.io/gang": gang})

    pods = [pod("a-0", "a"), pod("a-1", "a", node="n1"), pod("cpu", "c", gpus=0)]
    cache.pods = lambda: pods  # type: ignore[method-assign]

    def gauges() -> dict[str, float]:
        return {f.name: f.samples[0].value for f in health.collect() if f.samples and not f.samples[0].labels}

    assert gauges() == {"gangslice_gangs_waiting": 1, "gangslice_gang_longest_wait_seconds": 0}
    now[0] += 600
    pods.append(pod("b-0", "b"))
    assert gauges() == {"gangslice_gangs_waiting": 2, "gangslice_gang_longest_wait_seconds": 600}
    pods[:] = [pod("a-0", "a", node="n2"), pod("b-0", "b")]  # a is placed: b's wait is the longest
    now[0] += 60
    assert gauges() == {"gangslice_gangs_waiting": 1, "gangslice_gang_longest_wait_seconds": 60}


def test_a_flood_of_invented_tokens_gets_503s_not_a_queue_of_reviews() -> None:
    """Reviews of unknown tokens share the API client with the scheduler's Bindings: beyond
    MAX_REVIEWS in flight a scrape is answered 503 at once; a known token is still served."""

    class Slow(Reviewer):
        async def review(self, token: str) -> Verdict:
            await asyncio.sleep(0.2)
            return await super().review(token)

    inner = Slow()
    cached = CachedReviewer(inner)

    async def go() -> list[int]:
        client = TestClient(TestServer(build_metrics_app(lambda: BODY, cached)))
        await client.start_server()
        try:
            first = await client.get("/metrics", headers={"Authorization": "Bearer prometheus"})
            assert first.status == 200
            flood = [
                client.get("/metrics", headers={"Authorization": f"Bearer invented-{i}"}) for i in range(20)
            ]
            known = client.get("/metrics", headers={"Authorization": "Bearer prometheus"})
            replies = await asyncio.gather(*flood, known)
            return [r.status for r in replies]
        finally:
            await client.close()

    statuses = asyncio.run(go())
    assert statuses[-1] == 200
    assert statuses[:-1].count(401) == MAX_REVIEWS and statuses[:-1].count(503) == 20 - MAX_REVIEWS
    assert len(inner.calls) == 1 + MAX_REVIEWS


def test_metrics_leave_the_verbs_port_when_they_have_their_own(tmp_path: Path) -> None:
    from extender.httpapi.access import Access
    from extender.httpapi.app import build_app
    from extender.testing.extender import client_for, write_cluster

    async def go() -> tuple[int, str]:
        cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
        app = build_app(cache, access=Access(metrics_port=9443))
        async with client_for(app) as client:
            got = await client.get("/metrics")
            return got.status, await got.text()

    assert asyncio.run(go()) == (404, "/metrics is served on port 9443, to a bearer token\n")
