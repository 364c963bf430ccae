"""The one client on the wire (a stand-in API server on loopback): paths of built-in and
custom resources, server-side apply as one field manager, the Binding subresource, typed
errors with the cause chained, a watch stream with its 410, and discovery."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from extender.kube.api import (
    FIELD_MANAGER,
    NODES,
    PODGROUPS,
    PODS,
    SLICE_RESERVATIONS,
    WORKLOADS,
    Conflict,
    Forbidden,
    Gone,
    KubeError,
    NotFound,
    Throttled,
    Unavailable,
)
from extender.kube.client import ApiServerClient


class _Server(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str, Any]]
    replies: dict[tuple[str, str], tuple[int, Any]]

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        self.seen.append((self.command, self.path, self.headers.get("Content-Type", ""), body))
        path = self.path.split("?")[0]
        if "watch=true" in self.path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for event in (
                {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
                {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}},
            ):
                self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
            return
        status, reply = self.replies.get((self.command, path), (200, {"metadata": {"name": "x"}}))
        out = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[ApiServerClient, _Server]]:
    from kubernetes import client

    handler: Any = type("Handler", (_Server,), {"seen": [], "replies": {}})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{httpd.server_port}"
    try:
        yield ApiServerClient(client.ApiClient(cfg), timeout_s=5), handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def status(code: int, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"kind": "Status", "code": code, "message": message}


def test_paths_apply_and_binding(server: tuple[ApiServerClient, Any]) -> None:
    api, handler = server

    async def go() -> None:
        await api.get(PODS, "p", "llm")
        await api.get(NODES, "n")
        await api.list(SLICE_RESERVATIONS)
        obj = {"apiVersion": "gangslice.io/v1alpha1", "kind": "SliceReservation"}
        await api.apply(SLICE_RESERVATIONS, {**obj, "metadata": {"name": "g", "namespace": "llm"}})
        await api.apply(
            WORKLOADS,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {"name": "w", "namespace": "s"},
            },
            subresource="status",
        )
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "namespace": "llm"}}
        await api.create(PODS, binding, subresource="binding")
        await api.replace(PODGROUPS, {"metadata": {"name": "pg", "namespace": "llm", "resourceVersion": "3"}})
        await api.delete(SLICE_RESERVATIONS, "g", "llm")

    asyncio.run(go())
    got = [(m, p) for m, p, _, _ in handler.seen]
    apply_query = f"?fieldManager={FIELD_MANAGER}&force=true"
    assert got == [
        ("GET", "/api/v1/namespaces/llm/pods/p"),
        ("GET", "/api/v1/nodes/n"),
        ("GET", "/apis/gangslice.io/v1alpha1/slicereservations"),
        ("PATCH", "/apis/gangslice.io/v1alpha1/namespaces/llm/slicereservations/g" + apply_query),
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/namespaces/s/workloads/w/status" + apply_query),
        ("POST", "/api/v1/namespaces/llm/pods/p/binding"),
        ("PUT", "/apis/scheduling.volcano.sh/v1beta1/namespaces/llm/podgroups/pg"),
        ("DELETE", "/apis/gangslice.io/v1alpha1/namespaces/llm/slicereservations/g"),
    ]
    assert handler.seen[3][2] == "application/apply-patch+yaml"


@pytest.mark.parametrize(
    ("code", "error"),
    [(404, NotFound), (409, Conflict), (403, Forbidden), (401, Forbidden), (410, Gone), (503, Unavailable),
     (429, Throttled), (422, KubeError)],
)  # fmt: skip
def test_errors_are_typed_with_the_cause_chained(
    server: tuple[ApiServerClient, Any], code: int, error: type[KubeError]
) -> None:
    api, handler = server
    said = f"pods p: {code} said the server"
    handler.replies[("GET", "/api/v1/namespaces/llm/pods/p")] = status(code, said)
    with pytest.raises(error) as got:
        asyncio.run(api.get(PODS, "p", "llm"))
    assert type(got.value) is error
    assert isinstance(got.value, Unavailable) is (code in (429, 503))  # worth retrying later
    assert got.value.status == code and got.value.message == said
    assert got.value.__cause__ is not None


def test_no_answer_is_unavailable() -> None:
    from kubernetes import client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.retries = 0
    api = ApiServerClient(client.ApiClient(cfg), timeout_s=2)
    with pytest.raises(Unavailable) as got:
        asyncio.run(api.get(NODES, "n"))
    assert got.value.status == 0 and got.value.__cause__ is not None


def test_a_watch_streams_events_then_raises_gone(server: tuple[ApiServerClient, Any]) -> None:
    api, handler = server
    seen: list[tuple[str, str | None]] = []

    async def go() -> None:
        async for ev in api.watch(NODES, "4", timeout_s=5):
            seen.append((ev.type, ev.resource_version))

    with pytest.raises(Gone):
        asyncio.run(go())
    assert seen == [("ADDED", "5"), ("BOOKMARK", "6")]
    method, path, _, _ = handler.seen[0]
    assert method == "GET" and path.startswith("/api/v1/nodes?")
    assert "watch=true" in path and "resourceVersion=4" in path and "allowWatchBookmarks=true" in path


def test_serves_reads_discovery(server: tuple[ApiServerClient, Any]) -> None:
    api, handler = server
    handler.replies[("GET", "/apis/scheduling.volcano.sh/v1beta1")] = (
        200,
        {"resources": [{"name": "podgroups"}]},
    )
    handler.replies[("GET", "/apis/kueue.x-k8s.io/v1beta2")] = status(404, "not found")
    assert asyncio.run(api.serves(PODGROUPS)) is True
    assert asyncio.run(api.serves(WORKLOADS)) is False


def test_evict_posts_a_policy_v1_eviction_and_a_budget_429_is_throttled(
    server: tuple[ApiServerClient, Any],
) -> None:
    api, handler = server
    asyncio.run(api.evict("llm", "p", "uid-1"))
    method, path, _, body = handler.seen[-1]
    assert (method, path) == ("POST", "/api/v1/namespaces/llm/pods/p/eviction")
    assert body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p", "namespace": "llm"},
        "deleteOptions": {"preconditions": {"uid": "uid-1"}},
    }
    said = "Cannot evict pod as it would violate the pod's disruption budget."
    handler.replies[("POST", "/api/v1/namespaces/llm/pods/p/eviction")] = status(429, said)
    with pytest.raises(Throttled) as got:
        asyncio.run(api.evict("llm", "p"))
    assert got.value.message == said


class _Stalling(BaseHTTPRequestHandler):
    """A watch as the API server streams it (chunked), quiet after its first event."""

    protocol_version = "HTTP/1.1"
    release: threading.Event

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        line = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}})
        data = line.encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        self.release.wait(30)  # no event until the watch's timeout
        with contextlib.suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


def test_leaving_a_quiet_watch_does_not_wait_for_its_next_event() -> None:
    """The stream's reader thread sits in recv until the next event; closing the response alone
    waited for that thread (up to the watch's timeout, minutes), and so did `gangslice serve`'s exit."""
    from kubernetes import client

    release = threading.Event()
    handler: Any = type("Handler", (_Stalling,), {"release": release})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{httpd.server_port}"
    api = ApiServerClient(client.ApiClient(cfg), timeout_s=5)

    async def go() -> float:
        events: Any = api.watch(NODES, "4", timeout_s=60)
        first = await events.__anext__()
        assert first.type == "ADDED"
        await asyncio.sleep(0.5)  # the reader thread is back in recv
        began = time.monotonic()
        await events.aclose()
        return time.monotonic() - began

    try:
        took = asyncio.run(go())
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
    assert took < 2.0, f"closing the watch took {took:.1f} s"
