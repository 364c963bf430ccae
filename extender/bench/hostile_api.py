"""Hostile loads that need a real kube-apiserver: the metrics port, and the OpenShift install.

etcd and kube-apiserver (built by ``hack/e2e/build.sh``) start on loopback, with gangslice's
CRDs and one fake GPU node, and ``gangslice serve`` runs against them twice.

**The metrics port.** ``/metrics`` on its own port answers a bearer token that the API server
says may ``get /metrics`` (TokenReview, then SubjectAccessReview:
:mod:`extender.httpapi.secure_metrics`). serve runs with the default install's listeners (TLS,
mutual TLS on the verbs, ``--metrics-port``), and a scraper's ServiceAccount is bound to the
shipped ClusterRole ``gangslice-metrics-reader`` (manifests/monitoring), as a Prometheus's is.
Then:

1. the control: the scraper's token scrapes;
2. idle keep-alive clients: 256 TLS connections from eight other loopback addresses each send
   one ``GET /metrics`` without a token and sit idle; then the scraper scrapes, each time on a
   new connection;
3. invented tokens: 512 scrapes from those addresses, each with a bearer token never seen (so
   each is a review the server may ask the API server for), 32 at a time, while the scraper
   scrapes and ``/healthz`` of the verbs' port is asked. The replies by status say what the
   server did: 401, the API server was asked and said no; 503, the reviews in flight were at
   their bound and the API server was not asked.

**The Volcano port and the OpenShift install.** Volcano's extender client presents no
certificate, so the Volcano install's port asks for none; the serve above runs it too
(``--volcano-port``), and forged allocate, deallocate and predicate calls are made to it. The
operator-run secondary scheduler presents no client certificate, so serve runs with the
OpenShift chart's listener (TLS, no ``--tls-client-ca``), and what guards the verbs is the
shipped NetworkPolicy (no CNI enforces it here) and the per-request checks: the pod must exist,
by name and UID, be unbound and name one of gangslice's schedulers. Forged calls that need none
of the scheduler's knowledge (an invented pod, a real pod of another scheduler, a real pod
under a wrong UID) are made to bind and filter, and what they changed is read back from the API
server: pods bound, SliceReservations made. Last, a forged bind of a pending gangslice pod
under its real UID: the per-request checks cannot tell it from the scheduler's, and the figure
says so.

``gangslice bench extender --hostile --bin-dir DIR`` prints the figures after the other
phases; tests/e2e/test_hostile_api.py checks them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extender.bench.controlplane import REPO_ROOT, ControlPlane, ManagedProcess, free_ports
from extender.bench.fake_nodes import FakeGpuNode, create_nodes
from extender.bench.hostile import HOG_SOURCES, _rss_mib
from extender.bench.scheduler import CRDS
from extender.kube import names as keys

#: The scraper's ServiceAccount, and the shipped ClusterRole it is bound to.
SCRAPER, SCRAPER_NS = "bench-scraper", "default"
METRICS_READER = REPO_ROOT / "manifests" / "monitoring" / "metrics-reader.yaml"
IDLE_PER_SOURCE = 32
INVENTED_TOKENS, AT_ONCE = 512, 32
SCRAPES = 20


@dataclass
class ForgedFigures:
    """Forged calls on one listener that needs the API server's word, and what they changed."""

    listener: str
    #: (forged call, the reply's gist) for each call made without the scheduler's knowledge.
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: What those calls changed, read back from the API server (should stay empty).
    changed: list[str] = field(default_factory=list)
    #: A forged bind of a pending gangslice pod under its real UID: whether it bound it (None:
    #: not tried on this listener).
    known_uid_bound: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def render(self) -> str:
        lines = [
            f"{self.listener}: {len(self.changed)} changes made by {len(self.calls)} forged calls that "
            "need none of the scheduler's knowledge"
            + (f" ({'; '.join(self.changed)})" if self.changed else ""),
            *(f"  {label}: {gist}" for label, gist in self.calls),
        ]
        if self.known_uid_bound is not None:
            lines.append(
                "  a forged bind of a pending gangslice pod under its real UID: "
                + ("bound it" if self.known_uid_bound else "refused")
                + " (the per-request checks cannot tell it from the scheduler's; "
                "the NetworkPolicy is the guard)"
            )
        return "\n".join(lines)


@dataclass
class MetricsFigures:
    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0
    control_calls: int = 0
    control_ok: int = 0
    idle_clients: int = 0
    idle_scrapes: int = 0
    idle_scrapes_ok: int = 0
    tokens_sent: int = 0
    token_statuses: Counter[str] = field(default_factory=Counter)
    token_scrapes: int = 0
    token_scrapes_ok: int = 0
    #: ``/healthz`` of the verbs' port (the scheduler's listener) during the invented tokens.
    verbs_healthz_checks: int = 0
    verbs_healthz_ok: int = 0
    verbs_healthz_slowest_ms: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["token_statuses"] = dict(sorted(self.token_statuses.items()))
        return out

    def render(self) -> str:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.token_statuses.items()))
        return "\n".join(
            [
                f"metrics port on a real kube-apiserver ({self.seconds:.0f} s): server RSS "
                f"{self.rss_before_mib:.0f} MiB before, {self.rss_peak_mib:.0f} MiB peak; "
                f"control: {self.control_ok} of {self.control_calls} scrapes with the scraper's token "
                "answered 200",
                f"  idle keep-alive: {self.idle_clients} TLS connections from {len(HOG_SOURCES)} other "
                f"addresses without a token; {self.idle_scrapes_ok} of {self.idle_scrapes} scrapes on new "
                "connections answered 200 after",
                f"  invented tokens: {self.tokens_sent} scrapes, {AT_ONCE} at a time, replies {statuses} "
                "(401: reviewed and refused; 503: reviews at their bound, the API server not asked); "
                f"meanwhile {self.token_scrapes_ok} of {self.token_scrapes} scrapes answered 200, and "
                f"{self.verbs_healthz_ok} of {self.verbs_healthz_checks} /healthz of the verbs' port, "
                f"slowest {self.verbs_healthz_slowest_ms:.0f} ms",
            ]
        )


async def _get(
    port: int, ctx: ssl.SSLContext, path: str, token: str | None = None, source: str | None = None
) -> tuple[str, asyncio.StreamWriter | None]:
    """The status of ``GET path`` on a new TLS connection (kept open when the reply says so:
    the caller closes the writer), or what ended the attempt."""
    local = (source, 0) if source else None
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1", local_addr=local
            )
    except (OSError, ssl.SSLError, TimeoutError):
        return "connect", None
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    try:
        async with asyncio.timeout(10):
            line = await reader.readline()
    except (OSError, ssl.SSLError, TimeoutError):
        writer.close()
        return "closed", None
    parts = line.split()
    return (parts[1].decode() if len(parts) > 1 else "closed"), writer


async def _scrape(port: int, ctx: ssl.SSLContext, token: str) -> bool:
    status, writer = await _get(port, ctx, "/metrics", token)
    if writer is not None:
        writer.close()
    return status == "200"


def _grant_scraper(cp: ControlPlane) -> str:
    """A ServiceAccount bound to the shipped ClusterRole that may ``get /metrics``
    (manifests/monitoring), as a Prometheus is; a token of it."""
    reader = yaml.safe_load(METRICS_READER.read_text())
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    cp.request("POST", f"{rbac}/clusterroles", reader)
    cp.request(
        "POST",
        f"/api/v1/namespaces/{SCRAPER_NS}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SCRAPER}},
    )
    role = reader["metadata"]["name"]
    cp.request(
        "POST",
        f"{rbac}/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": SCRAPER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": SCRAPER_NS}],
        },
    )
    return cp.token(SCRAPER_NS, SCRAPER)


SERVE = (sys.executable, "-m", "extender.cli", "serve")


def _ready(cp: ControlPlane, proc: ManagedProcess, port: int) -> None:
    """Wait until ``proc`` (gangslice serve) answers ``/readyz`` on ``port``."""
    assert cp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    deadline = time.monotonic() + 120
    while True:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", timeout=3, context=ctx) as resp,
        ):
            if resp.status == 200:
                return
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"gangslice serve did not get ready:\n{proc.log_tail(40)}")
        time.sleep(0.3)


def _serve(cp: ControlPlane, name: str, port: int, *flags: str) -> ManagedProcess:
    """``gangslice serve`` on ``port`` over TLS (a certificate from the cluster CA) with ``flags``,
    the extender alone (``--no-controller``), once it is ready."""
    assert cp.kubeconfig is not None
    crt, key = cp.issue_cert(name, ["127.0.0.1"])
    argv = [
        *SERVE,
        f"--kubeconfig={cp.kubeconfig}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--tls-cert={crt}",
        f"--tls-key={key}",
        *flags,
        "--no-controller",
        "--log-level=warning",
    ]
    proc = cp.start_process(name, argv)
    _ready(cp, proc, port)
    return proc


def _start_serve(cp: ControlPlane) -> tuple[int, int, int, int]:
    """``gangslice serve`` with the default install's listeners and the Volcano install's port;
    (verbs' port, metrics port, Volcano port, pid)."""
    assert cp.ca_file is not None
    port, metrics_port, volcano_port = free_ports(3)
    flags = (
        f"--metrics-port={metrics_port}",
        f"--volcano-port={volcano_port}",
        f"--tls-client-ca={cp.ca_file}",
        "--tls-client-names=gangslice-scheduler",
    )
    proc = _serve(cp, "gangslice", port, *flags)
    return port, metrics_port, volcano_port, proc.pid


async def _phases(port: int, metrics_port: int, pid: int, ca_file: Path, token: str) -> MetricsFigures:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    figures = MetricsFigures(rss_before_mib=_rss_mib(pid))
    for _ in range(SCRAPES):
        figures.control_calls += 1
        figures.control_ok += await _scrape(metrics_port, ctx, token)
    idle: list[asyncio.StreamWriter] = []
    for source in HOG_SOURCES:
        for _ in range(IDLE_PER_SOURCE):
            _, writer = await _get(metrics_port, ctx, "/metrics", None, source)
            if writer is not None:
                idle.append(writer)
    figures.idle_clients = len(HOG_SOURCES) * IDLE_PER_SOURCE
    await asyncio.sleep(1.5)  # idle: their connections may now give way to new ones
    for _ in range(SCRAPES):
        figures.idle_scrapes += 1
        figures.idle_scrapes_ok += await _scrape(metrics_port, ctx, token)
    for writer in idle:
        writer.close()

    async def invented(i: int) -> None:
        token, source = f"invented-{i}-{time.monotonic_ns()}", HOG_SOURCES[i % len(HOG_SOURCES)]
        status, writer = await _get(metrics_port, ctx, "/metrics", token, source)
        if writer is not None:
            writer.close()
        figures.token_statuses[status] += 1

    async def meanwhile(done: asyncio.Event) -> None:
        while not done.is_set():
            figures.token_scrapes += 1
            figures.token_scrapes_ok += await _scrape(metrics_port, ctx, token)
            started = time.monotonic()
            status, writer = await _get(port, ctx, "/healthz")
            if writer is not None:
                writer.close()
            figures.verbs_healthz_checks += 1
            figures.verbs_healthz_ok += status == "200"
            elapsed = (time.monotonic() - started) * 1000
            figures.verbs_healthz_slowest_ms = max(figures.verbs_healthz_slowest_ms, elapsed)
            figures.rss_peak_mib = max(figures.rss_peak_mib, _rss_mib(pid))

    done = asyncio.Event()
    watcher = asyncio.create_task(meanwhile(done))
    for start in range(0, INVENTED_TOKENS, AT_ONCE):
        await asyncio.gather(*(invented(i) for i in range(start, start + AT_ONCE)))
    figures.tokens_sent = INVENTED_TOKENS
    done.set()
    await watcher
    figures.rss_peak_mib = max(figures.rss_peak_mib, _rss_mib(pid, "VmHWM"))
    return figures


OS_NODE = "bench-os-0"
GANGSLICE_SCHEDULER = "gangslice-scheduler"


def _pod(name: str, scheduler: str, gang: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": SCRAPER_NS}
    if gang:
        meta |= {"labels": {keys.GANG: gang}, "annotations": {keys.GANG_SIZE: "2"}}
    resources = {"limits": {keys.GPU_RESOURCE: "1"}}
    container = {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"schedulerName": scheduler, "containers": [container]},
    }


def _start_openshift_serve(cp: ControlPlane) -> int:
    """``gangslice serve`` with the OpenShift chart's listener: TLS, no client certificate asked."""
    (port,) = free_ports(1)
    _serve(cp, "gangslice-openshift", port)
    return port


async def _post(port: int, ctx: ssl.SSLContext, path: str, body: Mapping[str, Any]) -> str:
    """``POST path`` on a new TLS connection without a client certificate: the reply's gist."""
    raw = json.dumps(body).encode()
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
            )
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            writer.write(f"{head}Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
            reply = await reader.read()
            writer.close()
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        return f"no reply ({type(exc).__name__})"
    status_line, _, rest = reply.partition(b"\r\n")
    parts = status_line.split()
    text = rest.partition(b"\r\n\r\n")[2].decode(errors="replace")
    gist = text.strip()
    with contextlib.suppress(ValueError, AttributeError):
        got = json.loads(text)
        failed = got.get("FailedNodes") or got.get("failedNodes") or {}
        why = [got.get(k) for k in ("Error", "error", "errorMessage")] + list(failed.values())
        gist = next((str(w) for w in why if w), json.dumps(got, separators=(",", ":")))
    return f"{parts[1].decode() if len(parts) > 1 else '?'} {str(gist)[:140]}"


@dataclass(frozen=True)
class Targets:
    """The pods forged calls name: a pending gangslice pod, a pod of another scheduler (both
    real), and one invented."""

    victim: dict[str, Any]
    other: dict[str, Any]
    ghost: dict[str, Any]


def _targets(cp: ControlPlane) -> Targets:
    pods = f"/api/v1/namespaces/{SCRAPER_NS}/pods"
    victim = cp.request("POST", pods, _pod("victim", GANGSLICE_SCHEDULER))
    other = cp.request("POST", pods, _pod("other", "default-scheduler"))
    ghost = _pod("ghost", GANGSLICE_SCHEDULER, gang="forged")
    ghost["metadata"]["uid"] = "00000000-0000-0000-0000-00000000ghost"
    return Targets(victim, other, ghost)


def _changed(cp: ControlPlane, t: Targets) -> list[str]:
    """What forged calls changed on the API server: the real pods bound, SliceReservations made."""
    out = []
    for pod in (t.victim, t.other):
        name = pod["metadata"]["name"]
        if cp.request("GET", f"/api/v1/namespaces/{SCRAPER_NS}/pods/{name}")["spec"].get("nodeName"):
            out.append(f"pod {name} bound")
    reservations = cp.request("GET", f"/apis/{keys.GROUP}/{keys.VERSION}/slicereservations")["items"]
    return out + [f"SliceReservation {r['metadata']['name']} made" for r in reservations]


def _bind(pod: Mapping[str, Any], uid: str) -> dict[str, Any]:
    name = pod["metadata"]["name"]
    return {"PodName": name, "PodNamespace": SCRAPER_NS, "PodUID": uid, "Node": OS_NODE}


def _task(pod: Mapping[str, Any], uid: str) -> dict[str, Any]:
    meta = pod["metadata"]
    gpus = {"ScalarResources": {keys.GPU_RESOURCE: 1000}}
    task = {"UID": uid, "Name": meta["name"], "Namespace": SCRAPER_NS, "NodeName": OS_NODE, "Resreq": gpus}
    return {**task, "Job": f"{SCRAPER_NS}/forged", "Pod": dict(pod)}


async def _volcano(cp: ControlPlane, port: int, t: Targets) -> ForgedFigures:
    """Forged Volcano calls on the Volcano port (which asks for no certificate)."""
    assert cp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ghost_uid, other_uid = t.ghost["metadata"]["uid"], t.other["metadata"]["uid"]
    calls = [
        ("allocate an invented pod", "allocate", {"task": _task(t.ghost, ghost_uid)}),
        ("allocate a real pod of another scheduler", "allocate", {"task": _task(t.other, other_uid)}),
        (
            "allocate a pending gangslice pod under a wrong UID",
            "allocate",
            {"task": _task(t.victim, "0000-wrong")},
        ),
        ("deallocate an invented pod", "deallocate", {"task": _task(t.ghost, ghost_uid)}),
        (
            "predicate an invented pod",
            "predicate",
            {"task": _task(t.ghost, ghost_uid), "node": {"Name": OS_NODE}},
        ),
    ]
    figures = ForgedFigures("Volcano port (no client certificate)")
    for label, verb, body in calls:
        figures.calls.append((label, await _post(port, ctx, f"/gangslice/volcano/{verb}", body)))
    figures.changed = _changed(cp, t)
    return figures


async def _openshift(cp: ControlPlane, port: int, t: Targets) -> ForgedFigures:
    assert cp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    victim, other, ghost = t.victim, t.other, t.ghost
    calls = [
        ("bind an invented pod", "/gangslice/bind", _bind(ghost, ghost["metadata"]["uid"])),
        ("bind a real pod of another scheduler", "/gangslice/bind", _bind(other, other["metadata"]["uid"])),
        ("bind a pending gangslice pod under a wrong UID", "/gangslice/bind", _bind(victim, "0000-wrong")),
        ("filter an invented gang pod", "/gangslice/filter", {"Pod": ghost, "NodeNames": [OS_NODE]}),
        (
            "filter a real pod of another scheduler",
            "/gangslice/filter",
            {"Pod": other, "NodeNames": [OS_NODE]},
        ),
        ("prioritize an invented gang pod", "/gangslice/prioritize", {"Pod": ghost, "NodeNames": [OS_NODE]}),
    ]
    figures = ForgedFigures("OpenShift install (no client certificate on the verbs)")
    for label, path, body in calls:
        figures.calls.append((label, await _post(port, ctx, path, body)))
    figures.changed = _changed(cp, t)
    await _post(port, ctx, "/gangslice/bind", _bind(victim, victim["metadata"]["uid"]))
    name = victim["metadata"]["name"]
    got = cp.request("GET", f"/api/v1/namespaces/{SCRAPER_NS}/pods/{name}")
    figures.known_uid_bound = bool(got["spec"].get("nodeName"))
    return figures


def run_hostile_api(bin_dir: Path) -> tuple[MetricsFigures, ForgedFigures, ForgedFigures]:
    """The loads on a control plane of their own, stopped at the end: the metrics port's
    figures, then the forged calls' on the Volcano port and on the OpenShift listener."""
    started = time.monotonic()
    cp = ControlPlane(bin_dir, scheduler=False)
    cp.start()
    try:
        assert cp.ca_file is not None
        cp.install_crds(CRDS)
        create_nodes(cp, [FakeGpuNode(OS_NODE, "hgx-h100")])
        token = _grant_scraper(cp)
        port, metrics_port, volcano_port, pid = _start_serve(cp)
        metrics = asyncio.run(_phases(port, metrics_port, pid, cp.ca_file, token))
        metrics.seconds = time.monotonic() - started
        targets = _targets(cp)
        volcano = asyncio.run(_volcano(cp, volcano_port, targets))
        cp.stop_process("gangslice")
        openshift = asyncio.run(_openshift(cp, _start_openshift_serve(cp), targets))
    finally:
        with contextlib.suppress(Exception):
            cp.stop()
    return metrics, volcano, openshift
