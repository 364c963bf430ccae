"""Mutual TLS with real certificates over loopback: hack/gen-certs.sh issues the serving and
the scheduler's client certificate from one CA; `gangslice serve --tls-client-ca` then
refuses the verbs to a client without a certificate (403, health stays open), fails the
handshake of one from another CA, refuses a certificate naming no allowed name, picks up a
rotated CA file, and serves the Volcano verbs on their own port without a certificate."""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest

from extender.httpapi.server import ServeOptions, serve
from extender.reservations import ClusterCache
from extender.testing.extender import pod_obj, write_cluster

REPO = Path(__file__).resolve().parents[2]
HOST = "gangslice-controller.gangslice-system.svc"


def gen_certs(out: Path, *extra: str) -> Path:
    subprocess.run(
        ["bash", str(REPO / "hack/gen-certs.sh"), "--out", str(out), *extra], check=True, capture_output=True
    )
    return out


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    main = gen_certs(tmp_path_factory.mktemp("ca"))
    rogue = gen_certs(tmp_path_factory.mktemp("rogue"))
    other_name = tmp_path_factory.mktemp("other-name")
    shutil.copy(main / "ca.crt", other_name / "ca.crt")
    shutil.copy(main / "ca.key", other_name / "ca.key")
    gen_certs(other_name, "--client-name", "intruder")
    return {"main": main, "rogue": rogue, "other": other_name}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def call(
    port: int, ca: Path, client: Path | None, method: str, path: str, body: Any = None
) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client / "client.crt"), str(client / "client.key"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    conn.server_hostname = HOST  # type: ignore[attr-defined]
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sock = ctx.wrap_socket(sock, server_hostname=HOST)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    text = reply.read().decode()
    conn.close()
    return reply.status, text


FILTER = {"Pod": pod_obj("p", gpus=1), "NodeNames": ["h-0"]}


def run_against(tmp_path: Path, certs: dict[str, Path], check: Any, **kw: Any) -> None:
    """Serve on a loop of this thread while ``check(port, volcano_port)`` runs in another."""
    main = certs["main"]
    ca = tmp_path / "client-ca.crt"
    shutil.copy(main / "ca.crt", ca)
    port, volcano = free_port(), free_port()
    options = ServeOptions(
        host="127.0.0.1",
        port=port,
        tls_cert=str(main / "tls.crt"),
        tls_key=str(main / "tls.key"),
        tls_client_ca=str(ca),
        volcano_port=volcano,
        **kw,
    )

    async def go() -> None:
        cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
        task = asyncio.create_task(serve(cache, options))
        await asyncio.sleep(0.5)
        try:
            await asyncio.to_thread(check, port, volcano)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())


def test_verbs_need_a_client_certificate_from_the_ca_and_health_stays_open(
    tmp_path: Path, certs: dict[str, Path]
) -> None:
    main, rogue = certs["main"], certs["rogue"]

    def check(port: int, volcano: int) -> None:
        assert call(port, main / "ca.crt", None, "GET", "/healthz") == (200, "ok\n")
        status, text = call(port, main / "ca.crt", None, "POST", "/gangslice/filter", FILTER)
        assert status == 403 and "client certificate signed by the extender's client CA is required" in text
        status, text = call(port, main / "ca.crt", main, "POST", "/gangslice/filter", FILTER)
        assert status == 200 and json.loads(text)["NodeNames"] == ["h-0"]
        with pytest.raises((ssl.SSLError, ConnectionError)):  # TLS 1.3: the alert may come as a reset
            call(port, main / "ca.crt", rogue, "POST", "/gangslice/filter", FILTER)
        # The Volcano verbs: on their own port, no certificate asked; not on the scheduler's.
        task = {"task": {"Name": "t", "Namespace": "llm", "UID": "u"}, "node": {"Name": "h-0"}}
        status, text = call(volcano, main / "ca.crt", None, "POST", "/gangslice/volcano/predicate", task)
        assert status == 200 and json.loads(text)["code"] == 0
        status, text = call(port, main / "ca.crt", main, "POST", "/gangslice/volcano/predicate", task)
        assert status == 404 and f"served on port {volcano}" in text
        status, _ = call(volcano, main / "ca.crt", None, "POST", "/gangslice/filter", FILTER)
        assert status == 404

    run_against(tmp_path, certs, check)


def test_allowed_names_are_checked(tmp_path: Path, certs: dict[str, Path]) -> None:
    main, other = certs["main"], certs["other"]

    def check(port: int, volcano: int) -> None:
        assert call(port, main / "ca.crt", main, "POST", "/gangslice/filter", FILTER)[0] == 200
        status, text = call(port, main / "ca.crt", other, "POST", "/gangslice/filter", FILTER)
        assert status == 403 and "client certificate names intruder, not one of gangslice-scheduler" in text

    run_against(tmp_path, certs, check, tls_client_names=frozenset({"gangslice-scheduler"}))


def test_a_rotated_client_ca_is_picked_up(tmp_path: Path, certs: dict[str, Path]) -> None:
    from extender.httpapi.tls import ReloadingTls

    main, rogue = certs["main"], certs["rogue"]
    ca = tmp_path / "bundle.crt"
    ca.write_bytes((main / "ca.crt").read_bytes())
    tls = ReloadingTls(str(main / "tls.crt"), str(main / "tls.key"), str(ca))
    assert tls.context.verify_mode == ssl.CERT_OPTIONAL
    before = len(tls.context.get_ca_certs())
    ca.write_bytes((main / "ca.crt").read_bytes() + (rogue / "ca.crt").read_bytes())
    assert tls.reload_if_changed()
    assert len(tls.context.get_ca_certs()) == before + 1


def test_clients_without_a_certificate_cannot_lock_the_scheduler_out(
    tmp_path: Path, certs: dict[str, Path]
) -> None:
    """Clients that complete the handshake without a certificate and then sit idle fill
    their share of the connections; the scheduler, with its certificate, still gets its
    calls answered, and once they have been idle a moment a probe takes one of their places."""
    import time

    from extender.httpapi.limits import RECLAIM_AFTER_S, Limits

    main = certs["main"]
    limits = Limits(max_connections=40, reserved_connections=8, max_connections_per_peer=40)

    def check(port: int, volcano: int) -> None:
        ctx = ssl.create_default_context(cafile=str(main / "ca.crt"))
        idle = [
            ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=HOST)
            for _ in range(32)
        ]
        try:
            for _ in range(5):
                status, text = call(port, main / "ca.crt", main, "POST", "/gangslice/filter", FILTER)
                assert status == 200 and json.loads(text)["NodeNames"] == ["h-0"]
            with pytest.raises((http.client.HTTPException, ConnectionError, ssl.SSLError, AssertionError)):
                # The share is full of connections opened a moment ago: refused (429 or reset).
                assert call(port, main / "ca.crt", None, "GET", "/healthz")[0] == 200
            time.sleep(RECLAIM_AFTER_S + 0.3)
            assert call(port, main / "ca.crt", None, "GET", "/healthz") == (200, "ok\n")
        finally:
            for sock in idle:
                sock.close()

    run_against(tmp_path, certs, check, limits=limits)


def test_the_admission_webhook_takes_only_the_api_servers_certificate(
    tmp_path: Path, certs: dict[str, Path]
) -> None:
    """With --admission-client-names, /admission/pods needs the client certificate that
    kube-apiserver presents (its AdmissionConfiguration's kubeConfigFile): a forged
    AdmissionReview without it reaches no handler."""
    main = certs["main"]
    apiserver = tmp_path / "apiserver"
    apiserver.mkdir()
    shutil.copy(main / "ca.crt", apiserver / "ca.crt")
    shutil.copy(main / "ca.key", apiserver / "ca.key")
    gen_certs(apiserver, "--client-name", "kube-apiserver")
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1"}}

    def check(port: int, volcano: int) -> None:
        status, text = call(port, main / "ca.crt", None, "POST", "/admission/pods", review)
        assert status == 403 and "client certificate signed by the extender's client CA is required" in text
        status, text = call(port, main / "ca.crt", main, "POST", "/admission/pods", review)
        assert status == 403 and "names gangslice-scheduler, not one of kube-apiserver" in text
        status, text = call(port, main / "ca.crt", apiserver, "POST", "/admission/pods", review)
        assert status == 200 and json.loads(text)["response"] == {"uid": "u-1", "allowed": True}

    run_against(tmp_path, certs, check, admission_client_names=frozenset({"kube-apiserver"}))


def _healthz_from(port: int, ca: Path, source: str, client: Path | None = None) -> int:
    """GET /healthz over TLS from the loopback address ``source``."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client / "client.crt"), str(client / "client.key"))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    conn.sock = ctx.wrap_socket(sock, server_hostname=HOST)
    conn.request("GET", "/healthz")
    status = conn.getresponse().status
    conn.close()
    return status


def test_stalled_tls_handshakes_are_bounded_per_address_and_give_way_to_new_ones(
    tmp_path: Path, certs: dict[str, Path]
) -> None:
    """Connections that never send a ClientHello were held outside every cap until the
    handshake timeout. Now an address holds at most its cap of handshakes: a new one from it is
    refused while those are young, and once they have stalled a moment the oldest is closed to
    make room (so a stall never keeps the scheduler from a new connection); other addresses are
    served throughout, and every stall is closed at the timeout."""
    import time

    from extender.httpapi.limits import STALLED_AFTER_S, Limits

    main = certs["main"]
    limits = Limits(max_connections=40, max_connections_per_peer=3, handshake_timeout_s=2.5)

    def check(port: int, volcano: int) -> None:
        stalls = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
                _healthz_from(port, main / "ca.crt", "127.0.0.1")
            assert _healthz_from(port, main / "ca.crt", "127.0.0.2") == 200
            time.sleep(STALLED_AFTER_S + 0.2)
            assert _healthz_from(port, main / "ca.crt", "127.0.0.1", main) == 200  # the oldest gave way
            stalls[0].settimeout(2)
            assert stalls[0].recv(1) == b""
            time.sleep(2.5)  # past the handshake timeout: the other stalls are closed
            for sock in stalls[1:]:
                sock.settimeout(2)
                assert sock.recv(1) == b""
        finally:
            for sock in stalls:
                sock.close()

    run_against(tmp_path, certs, check, limits=limits)
