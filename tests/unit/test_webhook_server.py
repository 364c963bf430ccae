"""The service around the verbs: health, readiness, metrics, TLS with certificate reload,
and the ``serve`` / ``bench extender`` commands."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from pathlib import Path

import pytest

from extender.bench.extender import BenchOptions, render, run_extender_bench
from extender.cli import build_parser, main
from extender.httpapi.app import build_app
from extender.httpapi.tls import ReloadingTls
from extender.kube.api import Kind
from extender.reservations import ClusterCache
from extender.testing.extender import ServerThread, client_for, node_obj, pod_obj, write_cluster

# Two throw-away self-signed certificates (CN gangslice-test-a / -b, RSA 2048, 100 years),
# made for this test with: openssl req -x509 -newkey rsa:2048 -nodes -days 36500 -subj /CN=...
CERT_A = """\
-----BEGIN CERTIFICATE-----
MIIDGTCCAgGgAwIBAgIUALdBAPT8zaTrnXF1N88gQ0xq22EwDQYJKoZIhvcNAQEL
BQAwGzEZMBcGA1UEAwwQZ2FuZ3NsaWNlLXRlc3QtYTAgFw0yNjExMzAwMzA3NDla
GA8yMTI2MTEwNjAzMDc0OVowGzEZMBcGA1UEAwwQZ2FuZ3NsaWNlLXRlc3QtYTCC
ASIwDQYJKoZIhvcNAQEBBQADggEPADCCAQoCggEBAI1lIfFxAsOdEw+Nac3EBkrm
0z22U0ykCbj9eFHncybD4G70AwwUbWPMr444bJ46ysSyx5Rm/hbkZc3ClZHkDJ+A
qTpVcrAzcr3GVnwCcEiXGG7tk9AB3io7EvT2OZHFT+0atsOlk5pSEvH3TxJQuWre
v46keMzuFAa7jkMeiLFDSqV+xB+kELk1QSgWCqQQAZr8Hbf9s1fB5aR3aeUYzXVQ
Jz2YVMeq1L5Mpz9QqecXvRlqwMdbYNrcv4tE1xTvWjdRTxXOT9u947NwqjmgsjKD
GOP58bTQeNBPRW3isZXD79JyatNqqTIi7xEESFYUehnMDFm9Nfn6s82JA/VPaKMC
AwEAAaNTMFEwHQYDVR0OBBYEFK+7Ddo5O6sOcSZvFA7QGzEn8LU7MB8GA1UdIwQY
MBaAFK+7Ddo5O6sOcSZvFA7QGzEn8LU7MA8GA1UdEwEB/wQFMAMBAf8wDQYJKoZI
hvcNAQELBQADggEBAIQL/BMma3sBMm1hKI98ukMb6cHRAjMJNUHeiaYvrAgQtgO6
lURGsvrLyWL1UPFm2QHu8m/H1oAW3eyU2xyhxnqE0hLDNHR65Oq+TOc6ljqYzbjS
GWzDLaoz/kPsaC04DxS4GkKbmAXHLJCLWsRLpppkLs0IQfSlLSmNI+xiVGF9Yfms
hLi2S8Ax42pLK13yyKw+wU1OjQIyZlCy8lh5ZT2j9XURGaUcXGeyxFJUsI4lfoyA
IGq81NyG4LcrCYAePrm+94o+3HPy1isUTD0ZrW+MU/Scy5vg8W8nlORtzNXeRRZn
HTOprDvx+3XHtkFGl+bf5LfygeXW9QWg4ZoIqt4=
-----END CERTIFICATE-----
"""
KEY_A = """\
-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQCNZSHxcQLDnRMP
jWnNxAZK5tM9tlNMpAm4/XhR53Mmw+Bu9AMMFG1jzK+OOGyeOsrEsseUZv4W5GXN
wpWR5AyfgKk6VXKwM3K9xlZ8AnBIlxhu7ZPQAd4qOxL09jmRxU/tGrbDpZOaUhLx
908SULlq3r+OpHjM7hQGu45DHoixQ0qlfsQfpBC5NUEoFgqkEAGa/B23/bNXweWk
d2nlGM11UCc9mFTHqtS+TKc/UKnnF70ZasDHW2Da3L+LRNcU71o3UU8Vzk/bveOz
cKo5oLIygxjj+fG00HjQT0Vt4rGVw+/ScmrTaqkyIu8RBEhWFHoZzAxZvTX5+rPN
iQP1T2ijAgMBAAECggEAAddcu8tNzsSYlhb5oFCfLFsZJbBMIWXwUDAahUsYSsk5
o0Fj7DJZC3fxdwWDXbr7aGqcuZW4DDKNyNRx21HtyUupn1mzyzTATp6huRxCcqHV
E1XeZFLB5029D3VIz8clJU4lwEcMkCh3vPnDMY2UIR63K+E2tO2cwSZC9pHvgcGz
nhu5FNMpuhjt1QSxdWneMwmWnr2z73pCVGSGDdKq7GvURq4LAjIeept8vtBPlqVT
TCzwu6L4GUpti1GN0IKmVSabASOT2AFM1Pg/eA6iQdZSsi8ep2FaX5OEZU9MGgO5
6DEVLzhiE+uwLSkmdhWKO4l2QV2BQ9FeyeP3A+FhwQKBgQDCAycPXT7ceDP3UMY7
KvDvEHPOtxiOa1U8z5+/esnllx7+TxGNOCEJBZg40JL6sx11jKaQqth6MMTLzLZ0
1hunMXZNhDp8zNTTrTwDogNnEFh1OsuSs7/nDR3787Tpr5e0Tonwbnx7s7ohb7S0
YBsMtbORw5Fl5TOBzqaUQUt3sQKBgQC6kkGqe1vIUQGnBJPjaQoa7PwyyyWl+8r+
FWEWeH16ArvK2L9aNy5nUJVt0/v079NNA2ViE1g2uGtvaBfxWl7NZOCzp23Rz+rI
YT40K65tBFaz9syWef31rCu5gJzx7fAXX1uuU32Z0bLooSuGIopYPeCTczCYO8Ev
eY8d5s4OkwKBgQCv+9oXdraJl8NTiAJ4MyhfQeY6UR1GOpgT1CWMs92lk6H6flBm
b86Pd3KvvopEO+rx8MY6Ha7Fj61DTAsJChoFW7l68QF4qPg4lkAE75X0jAAhPlbg
WIovFFfpbhPhkXSjikZXQHFMaCfjIoegwjhnG/6pruMZsYE6MvApNN020QKBgHJ7
SFvp8fnK6y6m+nAyhgbboC0yxllBVd/vEnINYUE66CyiL1iWP50Zr3eC+jnj5058
ZPt3T0vUgegMgZSRlVaHLfJPLG3wHOrz8I1muFMgtGsdZ5B2LsVO7k2Xg7ZYAFj3
JHSluo5mRFfGfcSC8U0QOvt/VTQ0hmgxOQZqF8qNAoGBAKHApjCOIYmRqstRFWBk
lnAXYDbUPH0byGeXT8A0Cysi5EuhML8/rv7jAe3aVoGIW9tgNE/BHrcJm4EUkrs9
CEBA9UPMnJkGaoZGGwoH41dhvWPtX/PfwxOKnMZ7vrg6jh+Uzh1rPF25aP6cWk/Q
894He3GI8QS32jZxf73GJ4Jb
-----END PRIVATE KEY-----
"""
CERT_B = """\
-----BEGIN CERTIFICATE-----
MIIDGTCCAgGgAwIBAgIUO9rQqAhqCbZUjK5LxNwKFOaRr2owDQYJKoZIhvcNAQEL
BQAwGzEZMBcGA1UEAwwQZ2FuZ3NsaWNlLXRlc3QtYjAgFw0yNjExMzAwMzA3NDla
GA8yMTI2MTEwNjAzMDc0OVowGzEZMBcGA1UEAwwQZ2FuZ3NsaWNlLXRlc3QtYjCC
ASIwDQYJKoZIhvcNAQEBBQADggEPADCCAQoCggEBAJ4rJSZYAJdMGOUdc5bJy76i
VA/j9n22pgFecEuHmxGj/FmIt3TkvUWVV9Kk/RhBk9OfmxxNiA+9h4zmOUNw25iB
g/ZCXLXKXvW4912uDqcpwb/OFZuDAX/FFtX5C95egldK54FoguDWyctj281uC5aO
kQpuJ7ZzuuRGi3rbECpoUqQXZklfKInFYKrf6tnsIULKAftWotVuxoGFcnJuQfEw
dBcRBKr8R5OpOhQbGrA4CVj2MS6KbhnY0yBTQIYb7hNEJpoKDxMDzkK9e1wJ8enH
wXIVgSL7GTD7qXWJ6qHsLm1s3wtOWXKHwr0M8F6SKgs0Obg/GgmKIKmaHaczC3sC
AwEAAaNTMFEwHQYDVR0OBBYEFGa9g/SOSNcs4Z4AU5Olc/1o6Si1MB8GA1UdIwQY
MBaAFGa9g/SOSNcs4Z4AU5Olc/1o6Si1MA8GA1UdEwEB/wQFMAMBAf8wDQYJKoZI
hvcNAQELBQADggEBADhKiVB9G53HqXZR8t+ptKcyh3DCqDWPocKV1ylKB5D2vJcq
zHDz8RSmkfM8GyS3xzKuN396LWXPCaKKUwdiFt3A/t15zGvcOe47d9Fz1/Dcj62/
39jWcOVqCDgfLuwlrmFE5hmBaKxUCRkT1A/KYr3RQIIzR3tz30UYhqZUVTNfz7tZ
f5ydFbzviW1UM4h0hD1mfBTehiEYZZq+07FxzSrY6Hii1I9ttZhnj+caOX07ULvx
y68cylFA+97/FhlCHE/90cFSwogVRnovH20sXfNqsUPrUtB/lOXjFPd/8FQN+Xoh
tGcfkqT/1aLaQt+RqDin7+fDZ4bJ+xGomcTp7Ig=
-----END CERTIFICATE-----
"""
KEY_B = """\
-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQCeKyUmWACXTBjl
HXOWycu+olQP4/Z9tqYBXnBLh5sRo/xZiLd05L1FlVfSpP0YQZPTn5scTYgPvYeM
5jlDcNuYgYP2Qly1yl71uPddrg6nKcG/zhWbgwF/xRbV+QveXoJXSueBaILg1snL
Y9vNbguWjpEKbie2c7rkRot62xAqaFKkF2ZJXyiJxWCq3+rZ7CFCygH7VqLVbsaB
hXJybkHxMHQXEQSq/EeTqToUGxqwOAlY9jEuim4Z2NMgU0CGG+4TRCaaCg8TA85C
vXtcCfHpx8FyFYEi+xkw+6l1ieqh7C5tbN8LTllyh8K9DPBekioLNDm4PxoJiiCp
mh2nMwt7AgMBAAECggEAHKIC36YetUT5XMCwJCPz1lbckOPbw3ZFJwpJmeK6l77v
9+VgELE38ljOxTtI9hMpB65lDgKbFv5gg4lJ5IORvVH06aep0N8JwcHyRes0i95r
TKWqE7TrmI29TI8BLwg84ECXGD4rMziu3zr8l3vMbTzx1MmMNuNMefarWVo+2u4u
33LFkyc4Mx2HPalfi5FpKga0yYMHeVcCYIynNfDvzKhB48auKCU5F0LO+PhiXM0E
E0CEPHVaGmlqoAMG3rXV1unLkrZ7bhz1UXYbIb681FtqsCV0tHdrjIxv2sdlBmdi
gKtYI4xIEGdLR/cF1cjw2de9uifaego0tZpqQFC8QQKBgQDQ9/UmYfysGPBHSFT6
rYehLSoxJxzw01h7F3VVioN0WrZYeiIjIchhFt7sFRgywWiRBDD2SFa2Ejhl9100
FbSrJ+YfqggJZ5Ig4zVE28strSjNk2m10fWVhjeabF0MsUK+of9ziTbe9VakxU/z
OOw5oUYwJ7gq+G0N7nJAgmUf1QKBgQDBxEP5sOetwrRsLNf9A3XVST3KnCB4ml+U
RVCt2nMNKj24nOu7aV3+YqPZDH1lfZVG9IUyrbhTDObrqXF/iopg2nVHDlhfrgZn
frP1xUEKmajQD1kAycTHxHyrnzNuTOuIIiFyyEEAsE1ZBVNkGWsapXjV6MooKgr5
iEA08zJ2DwKBgBxmhsf3q0qMfSOC/iGvse5C4CgcA7/rSWw5TPYaRDFtHrk5qCgU
MFKZtCRr3YUQajDDXBAs1rQaF9Yr31vz00ErxAfrqPn2PJMBrjy0jpGfphsCfOx8
I591xVrUfXT7JnIYPEqsjGuS9nqgYnRQ+TH/7DUhQNN+PfwVuytvTWUdAoGASzN7
2j1RPTvSwCULUpP0OGnrhGXhqEzpiWb5b+/XNSXOvIaSarLzGtZ3lrZlOG1r8RTX
WRrY7cqVGKMzfHdtSzedyo0DuWaV77bZ6ym6G34VaWJ7fXXRXGKirAzmbgmGY9gz
ORQFPlouOr15ZuECk13jLsnhI4NlrQC3QpWcYPsCgYEAvBn8MuCJRaHvuqcbsGzM
fTzAkqsQx59nH7L/uduw+C6OLSdUGcIG5iJe15r5RNV+tFiB+ZUMnsm/p1IToi+x
oRAUW+DgJh5cE5tp6KIW0Uy0NOJm5Yr8GWmitZjXMEJAhuWbc9r0hPiizvMNS+f/
2XfjzcD2jytS9NTtXu2UJao=
-----END PRIVATE KEY-----
"""


def test_health_readiness_and_metrics() -> None:
    cache = ClusterCache()

    async def go() -> None:
        async with client_for(build_app(cache)) as client:
            assert (await client.get("/healthz")).status == 200
            waiting = await client.get("/readyz")
            assert waiting.status == 503 and "nodes" in await waiting.text()
            for kind in Kind:
                objs = {Kind.NODES: [node_obj("a")], Kind.PODS: [pod_obj("x", gpus=1)]}.get(kind, [])
                cache.replace(kind, objs)
            assert (await client.get("/readyz")).status == 200
            await client.post("/gangslice/filter", json={"Pod": pod_obj("x", gpus=1), "NodeNames": ["a"]})
            await client.post("/gangslice/filter", data=b"nope")
            text = await (await client.get("/metrics")).text()
            for name in (
                'gangslice_extender_request_duration_seconds_bucket{le="0.005",verb="filter"}',
                'gangslice_extender_requests_total{code="200",verb="filter"} 1.0',
                'gangslice_extender_requests_total{code="400",verb="filter"} 1.0',
                'gangslice_decisions_total{outcome="fit"} 1.0',
                'gangslice_reservations{phase="Reserved"} 0.0',
                "gangslice_cache_ready 1.0",
                "gangslice_cache_nodes 1.0",
            ):
                assert name in text, name

    asyncio.run(go())


def _served_cert(port: int) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_tls_certificate_is_reloaded_when_its_files_change(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text(CERT_A)
    key.write_text(KEY_A)
    tls = ReloadingTls(str(cert), str(key))
    app = build_app(ClusterCache.from_cluster_file(write_cluster(tmp_path)))
    with ServerThread(app, ssl_context=tls.context) as server:
        assert _served_cert(server.port) == ssl.PEM_cert_to_DER_cert(CERT_A)
        assert not tls.reload_if_changed()
        cert.write_text(CERT_B)  # half-way through a rotation: the key does not match yet
        os.utime(cert, ns=(1, 1))
        assert not tls.reload_if_changed()
        assert _served_cert(server.port) == ssl.PEM_cert_to_DER_cert(CERT_A)
        key.write_text(KEY_B)
        os.utime(key, ns=(2, 2))
        assert tls.reload_if_changed()
        assert _served_cert(server.port) == ssl.PEM_cert_to_DER_cert(CERT_B)
    assert tls.reloads == 1


def test_serve_and_bench_extender_are_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["serve", "--cluster", "c.yaml", "--port", "9000", "--tls-cert", "a", "--tls-key", "b"]
    )
    assert (args.cluster, args.port, args.prefix, args.host) == ("c.yaml", 9000, "/gangslice", "0.0.0.0")
    bench = parser.parse_args(["bench", "extender", "--requests", "10"])
    assert bench.requests == 10 and bench.concurrency == 16 and bench.nodes == 5000
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--cluster", "c.yaml", "--kubeconfig", "k"])


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["serve", "--cluster", "c.yaml", "--tls-cert", "a"], "go together"),
        (["serve", "--cluster", "missing.yaml", "--port", "0"], "not a port"),
        (["serve", "--cluster", "missing.yaml"], "cannot read"),
    ],
)
def test_serve_refuses_bad_options(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_bench_extender_runs_a_small_load() -> None:
    options = BenchOptions(nodes=64, full_nodes=8, concurrency=4, requests=20, gpus=4)
    results = asyncio.run(run_extender_bench(options))
    assert [(r.case, r.concurrency, r.offered_rps, r.verb) for r in results] == [
        (case, inflight, rate, verb)
        for case, inflight, rate in (
            ("names", 4, None),
            ("names", 4, options.rate),
            ("names", 1, None),
            ("full", 1, None),
            ("full", 16, None),
        )
        for verb in ("filter", "prioritize")
    ]
    assert all(r.errors == 0 and r.passed_nodes > 0 and r.handler_ms > 0 for r in results)
    assert [r.requests for r in results] == [20] * 6 + [4] * 4
    table = render(options, results)
    assert "64 node names" in table and "1000/s open" in table


def test_bench_open_loop_keeps_to_its_schedule() -> None:
    """20 requests on a schedule of 200/s take about 0.1 s however fast the server is: the
    open loop sends on the clock, not as replies come back."""
    options = BenchOptions(nodes=16, full_nodes=4, concurrency=2, requests=20, rate=200.0, same_process=True)
    results = asyncio.run(run_extender_bench(options))
    (open_loop, _) = [r for r in results if r.offered_rps is not None]
    assert open_loop.rps <= 200.0 * 1.05, open_loop
    closed = next(r for r in results if r.offered_rps is None and r.concurrency == 2)
    assert closed.errors == open_loop.errors == 0
