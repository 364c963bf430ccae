"""The serving-certificate story: hack/gen-certs.sh writes the Secret the controller mounts,
its certificate names the controller's Service, `gangslice serve`'s TLS context loads it, and
a client holding only ca.crt completes a handshake for the Service's name (and no other).
The cert-manager component issues a certificate for the same names into the same Secret."""

from __future__ import annotations

import base64
import re
import ssl
import subprocess
from pathlib import Path

import pytest
from test_manifests import REPO, build, load_all

from extender.httpapi.tls import ReloadingTls

SCRIPT = REPO / "hack" / "gen-certs.sh"
SECRET = "gangslice-tls"
CLIENT_SECRET = "gangslice-scheduler-client"


def service_names() -> set[str]:
    svc = build("").find("Service", "gangslice-controller", "gangslice-system")
    assert svc is not None
    name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
    return {name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"}


def run_script(out: Path, *extra: str) -> list[Path]:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out), *extra], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [Path(line) for line in done.stdout.split()]


def unpack_secret(manifest: Path, into: Path) -> dict[str, Path]:
    (secret,) = load_all(manifest)
    assert (secret["kind"], secret["type"]) == ("Secret", "kubernetes.io/tls")
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"]) == (SECRET, "gangslice-system")
    into.mkdir()
    files = {}
    for key, value in secret["data"].items():
        files[key] = into / key
        files[key].write_bytes(base64.b64decode(value))
    assert set(files) == {"tls.crt", "tls.key", "ca.crt"}
    return files


def handshake(server: ssl.SSLContext, ca_file: Path, hostname: str) -> None:
    """One TLS handshake over memory buffers (no sockets); raises on a verification error."""
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end in (("client", client), ("server", srv)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


def subject_alt_names(cert: Path) -> set[str]:
    text = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(re.findall(r"DNS:([^,\s]+)", text))


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("certs")
    return out, run_script(out, "--volcano-namespace", "volcano-system")


def test_the_generated_secret_serves_https_for_the_service_name(
    generated: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    _, manifests = generated
    assert [m.name for m in manifests] == [
        f"{SECRET}.yaml",
        f"{CLIENT_SECRET}.yaml",
        "gangslice-ca-volcano.yaml",
    ]
    files = unpack_secret(manifests[0], tmp_path / "secret")
    assert subject_alt_names(files["tls.crt"]) == service_names()
    tls = ReloadingTls(str(files["tls.crt"]), str(files["tls.key"]))
    for host in service_names():
        handshake(tls.context, files["ca.crt"], host)
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls.context, files["ca.crt"], "gangslice-controller.elsewhere.svc")


def test_the_volcano_configmap_carries_the_same_ca(generated: tuple[Path, list[Path]]) -> None:
    out, manifests = generated
    (cm,) = load_all(manifests[2])
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == (
        "ConfigMap",
        "gangslice-ca",
        "volcano-system",
    )
    assert cm["data"]["ca.crt"] == (out / "ca.crt").read_text()


def test_running_again_renews_the_certificate_under_the_same_ca(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    run_script(out)
    ca, cert = (out / "ca.crt").read_bytes(), (out / "tls.crt").read_bytes()
    manifest, _ = run_script(out)
    assert (out / "ca.crt").read_bytes() == ca and (out / "tls.crt").read_bytes() != cert
    files = unpack_secret(manifest, tmp_path / "secret")
    handshake(
        ReloadingTls(str(files["tls.crt"]), str(files["tls.key"])).context,
        out / "ca.crt",
        min(service_names()),
    )


def test_bad_options_are_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--days", "soon", "--out", str(tmp_path)], capture_output=True, check=False
    )
    assert done.returncode == 2 and not (tmp_path / "ca.key").exists()


def test_cert_manager_issues_the_same_names_into_the_mounted_secret() -> None:
    b = build("components/cert-manager")
    serving = [c for c in b.of_kind("Certificate") if "server auth" in c["spec"].get("usages", ())]
    (cert,) = serving
    assert cert["spec"]["secretName"] == SECRET
    assert set(cert["spec"]["dnsNames"]) == service_names()
    assert "server auth" in cert["spec"]["usages"]
    deploy = build("").find("Deployment", "gangslice-controller", "gangslice-system")
    assert deploy is not None
    secrets = [
        v["secret"]["secretName"] for v in deploy["spec"]["template"]["spec"]["volumes"] if "secret" in v
    ]
    assert secrets == [SECRET]
    default = re.search(r"^SECRET=(\S+)$", SCRIPT.read_text(), re.MULTILINE)
    assert default is not None and default.group(1) == SECRET


def test_the_scheduler_client_certificate_comes_from_the_same_ca(generated: tuple[Path, list[Path]]) -> None:
    out, manifests = generated
    (secret,) = load_all(manifests[1])
    assert (secret["metadata"]["name"], secret["type"]) == (CLIENT_SECRET, "kubernetes.io/tls")
    assert base64.b64decode(secret["data"]["ca.crt"]) == (out / "ca.crt").read_bytes()
    crt = out / "client.crt"
    subprocess.run(
        ["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(crt)], check=True, capture_output=True
    )
    text = subprocess.run(
        ["openssl", "x509", "-in", str(crt), "-noout", "-subject", "-ext", "extendedKeyUsage"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "CN = gangslice-scheduler" in text and "TLS Web Client Authentication" in text
    clients = [
        c
        for c in build("components/cert-manager").of_kind("Certificate")
        if "client auth" in c["spec"].get("usages", ())
    ]
    (client,) = clients
    assert (
        client["spec"]["secretName"] == CLIENT_SECRET
        and client["spec"]["commonName"] == "gangslice-scheduler"
    )
    assert client["spec"]["issuerRef"]["name"] == "gangslice-ca"
