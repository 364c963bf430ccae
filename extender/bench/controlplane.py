"""A real, throwaway Kubernetes control plane on loopback, for the end-to-end tier and
``gangslice bench scheduler``.

Starts etcd, kube-apiserver and (optionally) kube-scheduler from the binaries that ``hack/e2e/build.sh``
builds, each in its own process group, on free loopback ports picked at run time. Everything it writes
(certificates, keys, kubeconfigs, etcd data, logs) lives in one temporary folder that
:meth:`ControlPlane.stop` removes. Only the standard library is needed (plus ``pyyaml`` when a scheduler
config is given as YAML); ``openssl`` must be on PATH to generate the keys and certificates.

Typical use::

    cp = ControlPlane(bin_dir).start()          # or: with ControlPlane(bin_dir) as cp:
    cp.kubeconfig                               # Path of an admin kubeconfig (token auth, CA-verified)
    cp.server, cp.admin_token, cp.ca_file       # https://127.0.0.1:<port>, bearer token, CA bundle
    cp.start_process("kueue", [...])            # run more components under the same bookkeeping
    print(cp.dump_logs())                       # tail of every component's log
    cp.stop()
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = [
    "REPO_ROOT",
    "ControlPlane",
    "ControlPlaneError",
    "ManagedProcess",
    "build_binaries",
    "default_bin_dir",
    "free_ports",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "e2e" / "build.sh"
VERSIONS_FILE = REPO_ROOT / "hack" / "e2e" / "tools" / "versions.env"

StrPath = str | os.PathLike[str]


class ControlPlaneError(RuntimeError):
    """A component failed to start or become ready (the message carries the tail of its log)."""


def build_binaries(components: Sequence[str] = (), *, stream: TextIO | None = None) -> Path:
    """Run ``hack/e2e/build.sh`` (idempotent) and return the bin dir it prints as ``GANGSLICE_E2E_BIN=...``.

    Raises :class:`ControlPlaneError` with the build output when the build fails (e.g. Go is missing).
    Build progress (stderr of the script) is forwarded to ``stream`` (default: ``sys.stderr``).
    """
    stream = stream if stream is not None else sys.stderr
    proc = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT), *components],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate()
    if err:
        stream.write(err)
        stream.flush()
    if proc.returncode != 0:
        raise ControlPlaneError(
            f"hack/e2e/build.sh failed with exit code {proc.returncode}:\n{err[-4000:]}\n{out[-2000:]}"
        )
    for line in reversed(out.splitlines()):
        if line.startswith("GANGSLICE_E2E_BIN="):
            return Path(line.split("=", 1)[1].strip())
    raise ControlPlaneError(f"hack/e2e/build.sh printed no GANGSLICE_E2E_BIN= line:\n{out[-2000:]}")


def default_bin_dir() -> Path:
    """Where ``hack/e2e/build.sh`` puts the binaries: ``$GANGSLICE_E2E_BIN`` if set, else
    ``${GANGSLICE_CACHE:-~/.cache/gangslice}/e2e/<versions key>/bin`` (the key from the
    pinned versions, as the script computes it). Nothing is built or checked here."""
    prebuilt = os.environ.get("GANGSLICE_E2E_BIN")
    if prebuilt:
        return Path(prebuilt)
    try:
        text = VERSIONS_FILE.read_text()
    except OSError as exc:
        raise ControlPlaneError(
            f"cannot read {VERSIONS_FILE} ({exc}): run from a clone of the repository, or set "
            "$GANGSLICE_E2E_BIN to a folder with etcd, kube-apiserver and kube-scheduler"
        ) from None
    pins = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#")
    )
    try:
        key = (
            f"k8s-{pins['KUBERNETES_VERSION']}_kueue-{pins['KUEUE_VERSION']}"
            f"_volcano-{pins['VOLCANO_VERSION']}_etcd-{pins['ETCD_VERSION']}"
        )
    except KeyError as exc:
        raise ControlPlaneError(f"{VERSIONS_FILE} pins no {exc.args[0]}") from None
    cache = Path(os.environ.get("GANGSLICE_CACHE") or Path.home() / ".cache" / "gangslice")
    return cache / "e2e" / key / "bin"


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct free TCP ports on 127.0.0.1 (bound to port 0 together, read back, closed)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class ManagedProcess:
    """One component started by :class:`ControlPlane` (its own process group; ``pid`` == process group id)."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group this process leads, then SIGKILL it after ``timeout`` seconds."""
        if self.popen.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.popen.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler, + kube-controller-manager on request) on loopback, for tests.

    Constructor arguments:
      bin_dir: folder with ``etcd``, ``kube-apiserver``, ``kube-scheduler`` (default: ``$GANGSLICE_E2E_BIN``).
      scheduler: start kube-scheduler too (default True).
      scheduler_config: kube-scheduler configuration as a path to a YAML file, YAML text, or a mapping. Its
        ``clientConnection.kubeconfig`` is set to the admin kubeconfig and ``leaderElection.leaderElect`` to
        false unless given. ``None`` gives a minimal config (``percentageOfNodesToScore: 100``).
      workdir_parent: where to create the temporary folder (default: system temp dir).
      workdir: use this folder (created if missing) instead of a new temporary one; :meth:`stop`
        leaves it in place (``gangslice playground`` keeps its logs there).
      keep_workdir: do not delete the temporary folder on stop (for debugging).
      extra_apiserver_args: extra ``--flag=value`` arguments for kube-apiserver (they win over defaults
        with the same flag name).
      feature_gates: Kubernetes feature gates (name -> on) for kube-apiserver, kube-scheduler and
        kube-controller-manager alike (``--feature-gates``).
      startup_timeout: seconds to wait for each component to become ready.
      webhook_client: kube-apiserver presents a client certificate with this CN (signed by the
        control plane's CA) to every admission webhook it calls (an AdmissionConfiguration whose
        ``kubeConfigFile`` names it for any webhook, ``*``), as a self-managed control plane can
        be told to.

    Attributes: ``bin_dir``, ``crd_dir`` (``<bin_dir>/../crds``); valid after :meth:`start`: ``workdir``,
    ``server`` (``https://127.0.0.1:<port>``), ``apiserver_port``, ``etcd_url``, ``admin_token``,
    ``admin_user``, ``ca_file``, ``ca_key_file``, ``kubeconfig`` (admin kubeconfig Path),
    ``scheduler_config_file``, ``scheduler_port``, ``processes`` (name -> :class:`ManagedProcess`).
    """

    ADMIN_USER = "gangslice-e2e-admin"
    SERVICE_CIDR = "10.96.0.0/24"
    SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

    def __init__(
        self,
        bin_dir: StrPath | None = None,
        *,
        scheduler: bool = True,
        scheduler_config: StrPath | Mapping[str, Any] | None = None,
        workdir_parent: StrPath | None = None,
        workdir: StrPath | None = None,
        keep_workdir: bool = False,
        extra_apiserver_args: Iterable[str] = (),
        feature_gates: Mapping[str, bool] | None = None,
        startup_timeout: float = 90.0,
        webhook_client: str | None = None,
    ) -> None:
        if bin_dir is None:
            bin_dir = os.environ.get("GANGSLICE_E2E_BIN")
            if not bin_dir:
                raise ControlPlaneError(
                    "no bin_dir given and $GANGSLICE_E2E_BIN unset: run hack/e2e/build.sh first"
                )
        self.bin_dir = Path(bin_dir)
        # hack/e2e/build.sh exports the pinned releases' CRDs next to bin/: crds/kueue, crds/volcano,
        # crds/lws, crds/jobset
        self.crd_dir = self.bin_dir.parent / "crds"
        self.with_scheduler = scheduler
        self._scheduler_config_src = scheduler_config
        self._workdir_parent = workdir_parent
        self._fixed_workdir = Path(workdir) if workdir is not None else None
        self.keep_workdir = keep_workdir or workdir is not None
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.feature_gates = dict(feature_gates or {})
        self.startup_timeout = startup_timeout
        self.webhook_client = webhook_client

        self.workdir: Path | None = None
        self.processes: dict[str, ManagedProcess] = {}
        self.admin_user = self.ADMIN_USER
        self.admin_token = secrets.token_hex(24)
        self.server = ""
        self.apiserver_port = 0
        self.etcd_url = ""
        self.ca_file: Path | None = None
        self.ca_key_file: Path | None = None
        self.kubeconfig: Path | None = None
        self.scheduler_config_file: Path | None = None
        self.scheduler_port = 0
        self._atexit_registered = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start etcd, kube-apiserver (wait for /readyz) and, if enabled, kube-scheduler (/healthz)."""
        if self.workdir is not None:
            raise ControlPlaneError("control plane already started")
        for exe in ["etcd", "kube-apiserver"] + (["kube-scheduler"] if self.with_scheduler else []):
            if not os.access(self.bin_dir / exe, os.X_OK):
                raise ControlPlaneError(
                    f"{self.bin_dir / exe} missing or not executable: run hack/e2e/build.sh"
                )
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl not found on PATH (install the 'openssl' package)")
        if self._fixed_workdir is not None:
            self._fixed_workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.workdir = self._fixed_workdir
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="gangslice-e2e-", dir=self._workdir_parent))
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._make_pki()
            self._start_etcd()
            self._start_apiserver()
            self.kubeconfig = self.write_kubeconfig(self.workdir / "admin.kubeconfig")
            if self.with_scheduler:
                self.start_scheduler(self._scheduler_config_src)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process this object started (reverse start order) and remove the temp folder."""
        for proc in reversed(list(self.processes.values())):
            proc.stop()
        self.processes.clear()
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

    # ------------------------------------------------------------------ processes and logs
    def start_process(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: StrPath | None = None,
    ) -> ManagedProcess:
        """Start ``argv`` in its own process group, logging stdout+stderr to ``<workdir>/logs/<name>.log``.

        It is stopped by :meth:`stop` (or :meth:`stop_process`); its log shows in :meth:`dump_logs`.
        """
        assert self.workdir is not None, "start() the control plane first"
        if name in self.processes and self.processes[name].alive():
            raise ControlPlaneError(f"process {name!r} already running")
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        log_path = log_dir / f"{name}.log"
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [str(a) for a in argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,  # own session => own process group, pgid == pid
            )
        proc = ManagedProcess(name=name, argv=[str(a) for a in argv], log_path=log_path, popen=popen)
        self.processes[name] = proc
        return proc

    def stop_process(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def logs(self) -> dict[str, str]:
        """Full log text of every component started so far (including stopped ones still on disk)."""
        out: dict[str, str] = {}
        if self.workdir is None:
            return out
        for path in sorted((self.workdir / "logs").glob("*.log")):
            out[path.stem] = path.read_text(errors="replace")
        return out

    def dump_logs(self, tail_lines: int = 200, stream: TextIO | None = None) -> str:
        """Return (and write to ``stream`` if given) the last ``tail_lines`` lines of every component log."""
        parts = []
        for name, text in self.logs().items():
            lines = text.splitlines()[-tail_lines:]
            parts.append(f"===== {name} (last {len(lines)} lines) =====\n" + "\n".join(lines))
        text = "\n".join(parts)
        if stream is not None:
            stream.write(text + "\n")
            stream.flush()
        return text

    # ------------------------------------------------------------------ PKI
    def _openssl(self, *args: str) -> None:
        res = subprocess.run(
            ["openssl", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )
        if res.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed: {res.stderr}")

    def _make_pki(self) -> None:
        assert self.workdir is not None
        pki = self.workdir / "pki"
        pki.mkdir()
        self.ca_file, self.ca_key_file = pki / "ca.crt", pki / "ca.key"
        self._openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            "2",
            "-keyout",
            str(self.ca_key_file),
            "-out",
            str(self.ca_file),
            "-subj",
            "/CN=gangslice-e2e-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        self.issue_cert(
            "apiserver",
            [
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "10.96.0.1",
            ],
        )
        self.issue_cert("front-proxy-client", [], client=True)
        # service-account token signing key pair
        self._openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        self._openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        (pki / "tokens.csv").write_text(
            f'{self.admin_token},{self.admin_user},{self.admin_user},"system:masters"\n'
        )

    def issue_cert(self, name: str, hosts: Sequence[str], *, client: bool = False) -> tuple[Path, Path]:
        """Issue a certificate signed by the control plane's CA (for webhooks / extenders serving TLS).

        ``hosts`` become subjectAltNames (IPs detected). Returns ``(cert, key)`` paths in ``<workdir>/pki``.
        With ``client=True`` the certificate is for client auth, with CN=``name`` (the user name).
        """
        assert self.workdir is not None and self.ca_file is not None and self.ca_key_file is not None
        pki = self.workdir / "pki"
        crt, key, csr, ext = (pki / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
        sans = ",".join((f"IP:{h}" if _is_ip(h) else f"DNS:{h}") for h in hosts)
        ext_lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
        ext_lines.append("extendedKeyUsage=" + ("clientAuth" if client else "serverAuth"))
        if sans:
            ext_lines.append(f"subjectAltName={sans}")
        ext.write_text("\n".join(ext_lines) + "\n")
        self._openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={name}",
        )
        self._openssl(
            "x509",
            "-req",
            "-sha256",
            "-days",
            "2",
            "-in",
            str(csr),
            "-CA",
            str(self.ca_file),
            "-CAkey",
            str(self.ca_key_file),
            "-CAcreateserial",
            "-out",
            str(crt),
            "-extfile",
            str(ext),
        )
        return crt, key

    # ------------------------------------------------------------------ components
    def _start_etcd(self) -> None:
        assert self.workdir is not None
        client_port, peer_port = free_ports(2)
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.start_process(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=e2e={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self.wait_ready("etcd", f"{self.etcd_url}/health", lambda body: b'"health":"true"' in body)

    def _start_apiserver(self) -> None:
        assert self.workdir is not None
        pki = self.workdir / "pki"
        (self.apiserver_port,) = free_ports(1)
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        args = {
            "--etcd-servers": self.etcd_url,
            "--bind-address": "127.0.0.1",
            "--advertise-address": "127.0.0.1",
            "--secure-port": str(self.apiserver_port),
            "--cert-dir": str(self.workdir / "apiserver"),
            "--tls-cert-file": str(pki / "apiserver.crt"),
            "--tls-private-key-file": str(pki / "apiserver.key"),
            "--client-ca-file": str(pki / "ca.crt"),
            "--token-auth-file": str(pki / "tokens.csv"),
            "--authorization-mode": "RBAC",
            "--service-cluster-ip-range": self.SERVICE_CIDR,
            "--service-account-issuer": self.SA_ISSUER,
            "--service-account-key-file": str(pki / "sa.pub"),
            "--service-account-signing-key-file": str(pki / "sa.key"),
            "--allow-privileged": "true",
            # No controller-manager runs: nothing creates the "default" ServiceAccount per namespace (the
            # ServiceAccount admission plugin would reject every pod; TokenRequest still works), and nothing
            # removes the node.kubernetes.io/not-ready taint that TaintNodesByCondition puts on new Nodes.
            "--disable-admission-plugins": "ServiceAccount,TaintNodesByCondition",
            # The "kubernetes" Service endpoint may not be a loopback address; do not reconcile it.
            "--endpoint-reconciler-type": "none",
            # Front-proxy (request-header) auth, so kube-system/extension-apiserver-authentication is complete
            # for components that delegate authentication (kube-scheduler, Kueue, aggregated APIs).
            "--requestheader-client-ca-file": str(pki / "ca.crt"),
            "--requestheader-allowed-names": "front-proxy-client",
            "--requestheader-username-headers": "X-Remote-User",
            "--requestheader-group-headers": "X-Remote-Group",
            "--requestheader-extra-headers-prefix": "X-Remote-Extra-",
            "--proxy-client-cert-file": str(pki / "front-proxy-client.crt"),
            "--proxy-client-key-file": str(pki / "front-proxy-client.key"),
            "--profiling": "false",
        }
        args.update(dict(a.split("=", 1) for a in self._gate_args()))
        if self.webhook_client:
            args["--admission-control-config-file"] = str(self._webhook_admission_config(self.webhook_client))
        for extra in self.extra_apiserver_args:
            k, _, v = extra.partition("=")
            args[k] = v
        argv = [str(self.bin_dir / "kube-apiserver")] + [f"{k}={v}" for k, v in args.items()]
        self.start_process("kube-apiserver", argv)
        self.wait_ready(
            "kube-apiserver",
            f"{self.server}/readyz",
            lambda body: body.strip() == b"ok",
            ssl_context=ssl.create_default_context(cafile=str(pki / "ca.crt")),
            token=self.admin_token,
        )

    def _webhook_admission_config(self, cn: str) -> Path:
        """An AdmissionConfiguration that makes kube-apiserver present a client certificate
        ``cn`` to every mutating and validating webhook (kubeconfig user ``*``)."""
        assert self.workdir is not None
        crt, key = self.issue_cert(cn, [], client=True)
        kubeconfig = self.workdir / "webhook-client.kubeconfig"
        user = {"client-certificate": str(crt), "client-key": str(key)}
        kubeconfig.write_text(
            json.dumps({"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]})
        )
        plugin = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        config = self.workdir / "admission-config.json"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": [
                        {"name": name, "configuration": plugin}
                        for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
                    ],
                }
            )
        )
        return config

    def _gate_args(self) -> list[str]:
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"] if gates else []

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM), stay down ``down_s`` seconds, start it again with the same
        flags on the same port, and wait for ``/readyz``. etcd keeps the data."""
        proc = self.processes.get("kube-apiserver")
        if proc is None:
            raise ControlPlaneError("kube-apiserver is not running")
        argv = proc.argv
        self.stop_process("kube-apiserver")
        if down_s > 0:
            time.sleep(down_s)
        self.start_process("kube-apiserver", argv)
        assert self.ca_file is not None
        self.wait_ready(
            "kube-apiserver",
            f"{self.server}/readyz",
            lambda body: body.strip() == b"ok",
            ssl_context=ssl.create_default_context(cafile=str(self.ca_file)),
            token=self.admin_token,
        )

    #: The controllers :meth:`start_controller_manager` runs by default: claims generated from a pod's
    #: ResourceClaimTemplate (and their deallocation), and owner-reference garbage collection. No
    #: node-lifecycle controller, so fake nodes (no kubelet) stay Ready and untainted.
    CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller")

    def start_controller_manager(self, controllers: Sequence[str] = CONTROLLERS) -> ManagedProcess:
        """(Re)start kube-controller-manager with only ``controllers``; waits for its /healthz."""
        assert self.workdir is not None and self.kubeconfig is not None
        exe = self.bin_dir / "kube-controller-manager"
        if not os.access(exe, os.X_OK):
            raise ControlPlaneError(
                f"{exe} missing or not executable: run hack/e2e/build.sh kube-controller-manager"
            )
        self.stop_process("kube-controller-manager")
        (port,) = free_ports(1)
        proc = self.start_process(
            "kube-controller-manager",
            [
                str(exe),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(controllers)}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'kube-controller-manager'}",
                *self._gate_args(),
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certificate
        self.wait_ready(
            "kube-controller-manager",
            f"https://127.0.0.1:{port}/healthz",
            lambda body: body.strip() == b"ok",
            ssl_context=insecure,
        )
        return proc

    def start_scheduler(
        self,
        config: StrPath | Mapping[str, Any] | None = None,
        *,
        name: str = "kube-scheduler",
        kubeconfig: StrPath | None = None,
    ) -> ManagedProcess:
        """(Re)start kube-scheduler with ``config`` (see the class doc); waits for its /healthz.

        ``name``: another scheduler next to the first, in a process, config file and port of its own
        (``scheduler_config_file`` and ``scheduler_port`` stay those of ``kube-scheduler``).
        ``kubeconfig``: whose credentials it runs under (default: the admin kubeconfig); a config's own
        ``clientConnection.kubeconfig`` wins."""
        assert self.workdir is not None and self.kubeconfig is not None
        self.stop_process(name)
        credentials = str(kubeconfig or self.kubeconfig)
        cfg = _load_yaml_or_mapping(config) if config is not None else {}
        cfg.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        cfg.setdefault("kind", "KubeSchedulerConfiguration")
        cfg.setdefault("clientConnection", {}).setdefault("kubeconfig", credentials)
        cfg.setdefault("leaderElection", {}).setdefault("leaderElect", False)
        cfg.setdefault("percentageOfNodesToScore", 100)
        config_file = self.workdir / f"{name}.yaml"
        # JSON is valid YAML; avoids needing pyyaml for the default config.
        config_file.write_text(json.dumps(cfg, indent=2))
        (port,) = free_ports(1)
        if name == "kube-scheduler":
            self.scheduler_config_file, self.scheduler_port = config_file, port
        proc = self.start_process(
            name,
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={config_file}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / name}",
                f"--authentication-kubeconfig={credentials}",
                f"--authorization-kubeconfig={credentials}",
                *self._gate_args(),
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # the scheduler self-signs its serving cert
        self.wait_ready(
            name,
            f"https://127.0.0.1:{port}/healthz",
            lambda body: body.strip() == b"ok",
            ssl_context=insecure,
        )
        return proc

    # ------------------------------------------------------------------ clients
    def token(
        self, namespace: str, account: str, *, seconds: int = 3600, bound_to: Mapping[str, str] | None = None
    ) -> str:
        """A token of ServiceAccount ``namespace/account`` (the TokenRequest API), valid for
        ``seconds``; ``bound_to``: the object it is bound to (``boundObjectRef``), as a
        kubelet's projected token is to its pod."""
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if bound_to is not None:
            spec["boundObjectRef"] = dict(bound_to)
        review = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(review["status"]["token"])

    def write_kubeconfig(
        self,
        path: StrPath,
        *,
        token: str | None = None,
        user: str | None = None,
        namespace: str = "default",
    ) -> Path:
        """Write a kubeconfig for ``token`` (default: the admin token), CA embedded; returns its Path."""
        assert self.ca_file is not None
        user = user or (self.admin_user if token is None else "e2e-user")
        token = token or self.admin_token
        ca_data = base64.b64encode(self.ca_file.read_bytes()).decode()
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gangslice-e2e",
                    "cluster": {"server": self.server, "certificate-authority-data": ca_data},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "gangslice-e2e",
                    "context": {"cluster": "gangslice-e2e", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "gangslice-e2e",
            "preferences": {},
        }
        path = Path(path)
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)
        return path

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | None = None,
        timeout: float = 30.0,
    ) -> Any:
        """Minimal stdlib API call (JSON in/out) as admin; raises urllib.error.HTTPError on non-2xx."""
        assert self.ca_file is not None
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        # 429 "storage is (re)initializing" comes briefly after a CRD is created or the apiserver restarts.
        for attempt in range(20):
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
                    raw = resp.read()
                break
            except urllib.error.HTTPError as e:
                if e.code != 429 or attempt == 19:
                    raise
                time.sleep(0.5)
        return json.loads(raw) if raw else None

    def install_crds(self, *paths: StrPath, timeout: float = 30.0) -> list[str]:
        """Create the CRDs in the given YAML files/folders (existing ones are left as they are) and wait
        until each is Established. Returns the CRD names. E.g. ``cp.install_crds(cp.crd_dir / "volcano")``.
        """
        import yaml

        files: list[Path] = []
        for p in map(Path, paths):
            files.extend(sorted(p.glob("*.yaml")) if p.is_dir() else [p])
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for f in files:
            for doc in yaml.safe_load_all(f.read_text()):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                names.append(doc["metadata"]["name"])
                try:
                    self.request("POST", base, doc)
                except urllib.error.HTTPError as e:
                    if e.code != 409:
                        raise ControlPlaneError(
                            f"creating CRD from {f}: HTTP {e.code} {e.read()[:500]!r}"
                        ) from e
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                conds = (self.request("GET", f"{base}/{name}").get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    break
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"CRD {name} not Established after {timeout}s: {conds}")
                time.sleep(0.1)
        return names

    def api_client(self) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` for the admin kubeconfig (imports ``kubernetes`` lazily)."""
        from kubernetes import config as k8s_config

        client: ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )
        return client

    # ------------------------------------------------------------------ helpers
    def wait_ready(
        self,
        name: str,
        url: str,
        ok: Callable[[bytes], bool],
        *,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        """Poll ``url`` until ``ok(body)``; fail early with the log tail if process ``name`` exits."""
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            proc = self.processes[name]
            if not proc.alive():
                raise ControlPlaneError(
                    f"{name} exited with code {proc.popen.returncode} before becoming ready; "
                    f"log {proc.log_path}:\n{proc.log_tail()}"
                )
            req = urllib.request.Request(url)
            if token:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, context=ssl_context, timeout=5) as resp:
                    body = resp.read()
                if ok(body):
                    return
                last = f"HTTP {resp.status}: {body[:200]!r}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300]!r}"
            except (urllib.error.URLError, OSError) as e:
                last = repr(e)
            time.sleep(0.2)
        proc = self.processes[name]
        raise ControlPlaneError(
            f"{name} not ready at {url} after {self.startup_timeout}s (last: {last}); log {proc.log_path}:\n"
            f"{proc.log_tail()}"
        )


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


def _load_yaml_or_mapping(config: StrPath | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        copied: dict[str, Any] = json.loads(json.dumps(config))  # deep copy
        return copied
    import yaml  # only needed for config given as text or file

    text = str(config)
    if isinstance(config, os.PathLike) or ("\n" not in text and Path(text).is_file()):
        text = Path(config).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ControlPlaneError("scheduler config must be a YAML mapping")
    return data
