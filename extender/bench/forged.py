"""Forged calls against ``gangslice serve`` as the default install runs it: HTTPS, mutual TLS
on the verbs (``--tls-client-ca``, ``--tls-client-names=gangslice-scheduler``) and the Volcano
verbs on a port of their own; then the admission webhook again with kube-apiserver's
certificate required (``--admission-client-names=kube-apiserver``, which the default install
cannot set: where the API server presents a certificate is the platform's choice).

Every state-changing path is called by every forged identity: no certificate, a certificate
from the right CA naming someone else, one naming the scheduler in a URI SAN only, and one
from another CA (its handshake fails). A call *reaches* a handler when its reply is neither a
403 nor a 404 nor a failed handshake. The scheduler's own certificate is the control: it must
reach every verb. The Volcano port asks for no certificate (Volcano's client has none to
present): its calls reach their handlers by design, and only the shipped NetworkPolicy keeps
other pods away; the figure says so rather than counting them as refused.

The certificates are made here with ``cryptography`` (a dependency already, for the
certificate-expiry gauge), in a temporary folder.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: The paths that change state on the scheduler's port: the verbs, and the admission webhook.
VERB_PATHS = (
    "/gangslice/filter",
    "/gangslice/prioritize",
    "/gangslice/bind",
    "/gangslice/preempt",
    "/gangslice/volcano/allocate",
)
ADMISSION_PATHS = ("/admission/pods",)
VOLCANO_PATHS = (
    "/gangslice/volcano/allocate",
    "/gangslice/volcano/deallocate",
    "/gangslice/volcano/predicate",
)
FORGED = ("no certificate", "the CA's, another name", "the scheduler's name as a URI SAN", "another CA's")
#: The groups the figures are given for, and what to say of each.
VERBS, ADMISSION, ADMISSION_CERT, VOLCANO = (
    "scheduler port, verbs",
    "scheduler port, admission webhook",
    "admission webhook with --admission-client-names",
    "volcano port",
)
WHERE = {
    VERBS: "",
    ADMISSION: (
        " (no certificate asked by default: the API server presents none unless configured;"
        " the webhook writes nothing, and reserves a gang only for a pod whose owner exists)"
    ),
    ADMISSION_CERT: "",
    VOLCANO: " (by design: no certificate asked there; the NetworkPolicy is the guard)",
}


@dataclass
class ForgedFigures:
    #: (listener, identity) -> calls made, and how many reached a handler.
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    reached: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: The scheduler's own certificate: calls made and answered by a handler (the control).
    control_sent: int = 0
    control_reached: int = 0

    def render(self) -> list[str]:
        lines = []
        for group, why in WHERE.items():
            rows = [(who, self.sent[(group, who)], self.reached[(group, who)]) for who in FORGED]
            rows = [r for r in rows if r[1]]
            total_sent, total_reached = sum(r[1] for r in rows), sum(r[2] for r in rows)
            detail = "; ".join(f"{who}: {reached}/{sent}" for who, sent, reached in rows)
            lines.append(
                f"forged calls, {group}: {total_reached} of {total_sent} reached a handler{why} ({detail})"
            )
        control = f"{self.control_reached} of {self.control_sent}"
        lines.append(f"control, the scheduler's certificate: {control} reached a handler")
        return lines


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _certificate(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    """A certificate for ``cn`` and ``key``, valid for a day, signed by ``signer``."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


class _Ca:
    def __init__(self, cn: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        ca = x509.BasicConstraints(ca=True, path_length=None)
        self.cert = _certificate(cn, self.key, _name(cn), self.key, [(ca, True)])

    def issue(self, folder: Path, stem: str, cn: str, sans: list[x509.GeneralName], *, server: bool) -> Path:
        """Write ``<stem>.crt`` and ``<stem>.key`` signed by this CA; returns the folder."""
        key = ec.generate_private_key(ec.SECP256R1())
        usage = (
            x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        )
        extensions: list[tuple[x509.ExtensionType, bool]] = [(x509.ExtendedKeyUsage([usage]), False)]
        if sans:
            extensions.append((x509.SubjectAlternativeName(sans), False))
        cert = _certificate(cn, key, self.cert.subject, self.key, extensions)
        (folder / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return folder

    def write(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def serve_flags(self) -> tuple[str, ...]:
        """The default install's TLS flags (the controller Deployment's)."""
        return (
            f"--tls-cert={self.folder / 'serving.crt'}",
            f"--tls-key={self.folder / 'serving.key'}",
            f"--tls-client-ca={self.ca}",
            "--tls-client-names=gangslice-scheduler",
        )

    def client(self, stem: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if stem is not None:
            ctx.load_cert_chain(str(self.folder / f"{stem}.crt"), str(self.folder / f"{stem}.key"))
        return ctx


def make_pki(folder: Path) -> Pki:
    """A CA, the serving certificate for 127.0.0.1, the scheduler's and the forged identities'."""
    ca, rogue = _Ca("gangslice-ca"), _Ca("rogue-ca")
    ca.write(folder / "ca.crt")
    ca.issue(
        folder,
        "serving",
        "gangslice-controller",
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        server=True,
    )
    ca.issue(folder, "scheduler", "gangslice-scheduler", [], server=False)
    ca.issue(folder, "intruder", "intruder", [], server=False)
    uri = x509.UniformResourceIdentifier("spiffe://cluster.local/gangslice-scheduler")
    ca.issue(folder, "uri", "workload", [uri], server=False)
    rogue.issue(folder, "rogue", "gangslice-scheduler", [], server=False)
    return Pki(folder)


#: Identity label -> the client certificate's stem (None: no certificate).
IDENTITIES: dict[str, str | None] = {
    FORGED[0]: None,
    FORGED[1]: "intruder",
    FORGED[2]: "uri",
    FORGED[3]: "rogue",
}


async def _status(port: int, ctx: ssl.SSLContext, path: str, body: bytes) -> str:
    """The reply's status, or "handshake" when TLS failed."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    except (ssl.SSLError, ConnectionError):
        return "handshake"
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + body)
        async with asyncio.timeout(10):
            line = await reader.readline()
    except (ssl.SSLError, ConnectionError):
        return "handshake"  # TLS 1.3: a refused client certificate shows after the handshake
    finally:
        writer.close()
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


def _reached(status: str) -> bool:
    return status not in ("403", "404", "handshake", "closed")


async def forged_calls(
    pki: Pki, port: int, volcano_port: int | None, body: bytes, figures: ForgedFigures, rounds: int = 4
) -> None:
    """``rounds`` calls of every forged identity on every path; with ``volcano_port``, on the
    default install's listeners (and the scheduler's certificate as the control), else on the
    admission webhook of a server run with ``--admission-client-names``."""
    groups = (
        [
            (VERBS, port, VERB_PATHS),
            (ADMISSION, port, ADMISSION_PATHS),
            (VOLCANO, volcano_port, VOLCANO_PATHS),
        ]
        if volcano_port is not None
        else [(ADMISSION_CERT, port, ADMISSION_PATHS)]
    )
    for _ in range(rounds):
        for who, stem in IDENTITIES.items():
            ctx = pki.client(stem)
            for group, at, paths in groups:
                if group == VOLCANO and stem not in (None, "intruder"):
                    continue  # Volcano's port asks for no certificate: the others add nothing
                for path in paths:
                    figures.sent[(group, who)] += 1
                    figures.reached[(group, who)] += _reached(await _status(at, ctx, path, body))
        if volcano_port is not None:
            control = pki.client("scheduler")
            for path in VERB_PATHS[:4]:
                figures.control_sent += 1
                figures.control_reached += _reached(await _status(port, control, path, body))
