"""``gangslice playground``: gangslice on a real control plane on loopback, in one command,
without a container engine or kind.

The steps (:meth:`Playground.up`):

1. the binaries: ``hack/e2e/build.sh`` builds etcd, kube-apiserver, kube-scheduler,
   kube-controller-manager, kubectl and helm from the pinned sources (nothing when they are
   current); without Go, binaries built before are used, and with none it says what to install;
2. etcd, kube-apiserver and kube-scheduler (:class:`~extender.bench.controlplane.ControlPlane`)
   in the working folder, which keeps the admin kubeconfig, the certificates and every log;
3. ``helm install`` of ``charts/gangslice`` with the second scheduler. No kubelet runs, so no
   container ever starts: the chart's two Deployments are scaled to 0 before
   kube-controller-manager starts (deployment, replicaset, statefulset, garbage-collector and
   namespace controllers; no node-lifecycle controller, so the fake nodes stay Ready), and
   their programs run here as local processes under the chart's ServiceAccounts instead:
   ``gangslice serve`` with the arguments of the chart's controller Deployment, and
   kube-scheduler with the chart's gangslice-scheduler configuration, both over mutual TLS
   with certificates from the control plane's CA, as shipped;
4. fake GPU nodes with their NodeTopology objects (:func:`~extender.bench.fake_nodes.playground_fleet`);
5. ``kubectl apply`` of the example (the prefill/decode pair of ``examples/k8s/plain``),
   then a wait until every pod of it is bound and each gang's SliceReservation says Bound.

:func:`render` prints what was bound and the commands to look at it. :meth:`Playground.down`
stops every process in the reverse order of their start; the folder stays (logs) until the
next playground in it empties it.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from extender.bench.controlplane import (
    REPO_ROOT,
    ControlPlane,
    ManagedProcess,
    build_binaries,
    default_bin_dir,
    free_ports,
)
from extender.bench.fake_nodes import CLIQUE_LABEL, LEAF_LABEL, create_nodes, playground_fleet
from extender.kube import names as keys

__all__ = [
    "DEFAULT_EXAMPLE",
    "BoundPod",
    "Playground",
    "PlaygroundError",
    "PlaygroundOptions",
    "Reserved",
    "Summary",
    "default_folder",
    "find_binaries",
    "render",
    "scheduler_config",
    "serve_argv",
]

CHART = REPO_ROOT / "charts" / "gangslice"
DEFAULT_EXAMPLE = REPO_ROOT / "examples" / "k8s" / "plain" / "prefill-decode.yaml"
NEEDED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "helm")
#: kube-controller-manager's controllers here: what turns the examples' workloads into pods, and
#: cleans up after them. No node-lifecycle controller: it would taint nodes that no kubelet updates.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "garbage-collector-controller",
    "namespace-controller",
)
#: Workload kinds whose pods the playground waits for: kind -> pods of one object.
POD_MAKERS: Mapping[str, Callable[[Mapping[str, Any]], int]] = {
    "Deployment": lambda o: int((o.get("spec") or {}).get("replicas", 1)),
    "ReplicaSet": lambda o: int((o.get("spec") or {}).get("replicas", 1)),
    "StatefulSet": lambda o: int((o.get("spec") or {}).get("replicas", 1)),
    "Pod": lambda o: 1,
}
SYSTEM_NS = "gangslice-system"
RELEASE = "gangslice"
CONTROLLER = "gangslice-controller"
SCHEDULER = "gangslice-scheduler"
#: The controller Deployment's files (its Secret gangslice-tls) -> which local file stands in.
TLS_MOUNT = "/etc/gangslice/tls/"
#: A token lasts as long as the control plane's certificates (two days).
TOKEN_TTL_S = 2 * 86400
#: Marks a folder as a playground's, so a later run may empty it.
MARKER = ".gangslice-playground"
LOCK = ".lock"

Say = Callable[[str], None]


class PlaygroundError(Exception):
    """A step failed; the message says which and why (one line where it can)."""


@dataclass(frozen=True, slots=True)
class PlaygroundOptions:
    folder: Path
    bin_dir: Path | None = None
    examples: tuple[Path, ...] = (DEFAULT_EXAMPLE,)
    #: How long the example's pods may take to bind.
    timeout_s: float = 180.0
    log_level: str = "info"


@dataclass(frozen=True, slots=True)
class BoundPod:
    namespace: str
    name: str
    node: str
    gpus: str
    numa: str
    gang: str | None


@dataclass(frozen=True, slots=True)
class Reserved:
    """A gang's SliceReservation as its status tells it."""

    namespace: str
    name: str
    gang: str
    nodes: str
    #: One line per slot: ``podSet/index on NODE, GPUs G``.
    slots: tuple[str, ...]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Reserved:
        status = obj.get("status") or {}
        slots = tuple(
            f"{s.get('name')} on {s.get('node')}, GPUs {s.get('gpus')}" for s in status.get("slots") or []
        )
        meta = obj["metadata"]
        return cls(
            meta["namespace"], meta["name"], obj["spec"]["gang"], str(status.get("nodes") or ""), slots
        )


@dataclass(slots=True)
class Summary:
    """What :meth:`Playground.up` brought up, for :func:`render`."""

    folder: Path
    kubeconfig: Path
    server: str
    kubectl: Path
    ca_file: Path
    extender_url: str
    nodes: int
    pods: list[BoundPod] = field(default_factory=list)
    #: The SliceReservations of the example's gangs.
    reservations: list[Reserved] = field(default_factory=list)
    seconds: float = 0.0


def default_folder() -> Path:
    """``${GANGSLICE_CACHE:-~/.cache/gangslice}/playground``."""
    return Path(os.environ.get("GANGSLICE_CACHE") or Path.home() / ".cache" / "gangslice") / "playground"


def find_binaries(bin_dir: Path | None, say: Say) -> Path:
    """The folder with :data:`NEEDED`: ``bin_dir`` (or ``$GANGSLICE_E2E_BIN``) as given, else what
    ``hack/e2e/build.sh`` builds (only the missing or outdated ones). Without Go, binaries built
    before are used; with none, the error names what to install."""
    given = bin_dir or (
        Path(os.environ["GANGSLICE_E2E_BIN"]) if os.environ.get("GANGSLICE_E2E_BIN") else None
    )
    if given is not None:
        missing = _missing(given)
        if missing:
            raise PlaygroundError(
                f"{given} lacks {', '.join(missing)}: run hack/e2e/build.sh {' '.join(NEEDED)}"
            )
        return given
    folder = default_bin_dir()
    missing = _missing(folder)
    if shutil.which("go") is None:
        if not missing:
            say(f"binaries: {folder} (Go is not on PATH: using those built before)")
            return folder
        raise PlaygroundError(
            f"Go >= 1.26 is needed to build {', '.join(missing)} from the pinned sources: install it from "
            "https://go.dev/dl/ and put it on PATH (or set GANGSLICE_E2E_BIN to a folder with "
            f"{', '.join(NEEDED)})"
        )
    if missing:
        say(
            f"building {', '.join(missing)} with hack/e2e/build.sh (the first time: about 15 minutes "
            "on 2 cores)"
        )
        built = build_binaries(NEEDED)
    else:
        built = build_binaries(NEEDED, stream=io.StringIO())  # its "up to date" lines
    say(f"binaries: {built}")
    return built


def _missing(folder: Path) -> list[str]:
    return [exe for exe in NEEDED if not os.access(folder / exe, os.X_OK)]


# ---------------------------------------------------------------------------------------------- pure parts
def serve_argv(chart_args: Sequence[str], files: Mapping[str, Path], log_level: str) -> list[str]:
    """``gangslice serve``'s arguments for a local process, from the chart's controller Deployment's
    ``args``: each file under :data:`TLS_MOUNT` becomes ``files[<its name>]`` (``tls.crt``,
    ``tls.key``, ``ca.crt``), each port a free loopback port, the log level ``log_level``. The
    metrics port is left out: with it ``/metrics`` answers only bearer tokens granted
    ``get /metrics``, and the playground has no scraper; without it ``/metrics`` is served on
    the verbs' port, where the printed ``curl`` reads it."""
    out: list[str] = []
    chart_args = [a for a in chart_args if a.split("=", 1)[0] != "--metrics-port"]
    ports = iter(free_ports(sum(1 for a in chart_args if a.split("=", 1)[0].endswith("-port"))))
    for arg in chart_args:
        flag, eq, value = arg.partition("=")
        if eq and value.startswith(TLS_MOUNT):
            name = value.removeprefix(TLS_MOUNT)
            if name not in files:
                raise PlaygroundError(
                    f"the chart's controller reads {value}, which the playground has no file for"
                )
            value = str(files[name])
        elif eq and flag.endswith("-port"):
            value = str(next(ports))
        elif flag == "--log-level":
            value = log_level
        elif eq and value.startswith("/"):
            raise PlaygroundError(
                f"the chart's controller reads {value}, which the playground has no file for"
            )
        out.append(f"{flag}{eq}{value}")
    if not out or out[0] != "serve":
        raise PlaygroundError(f"the chart's controller does not run `gangslice serve`: {chart_args}")
    return out


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    for arg in argv:
        name, eq, value = arg.partition("=")
        if name == flag and eq:
            return value
    return None


def scheduler_config(
    chart_config: Mapping[str, Any],
    extender_url: str,
    ca_file: Path,
    client: tuple[Path, Path],
    kubeconfig: Path,
) -> dict[str, Any]:
    """The chart's gangslice-scheduler configuration, pointed at the local ``gangslice serve``:
    its one extender's URL and TLS files, and the client credentials."""
    cfg: dict[str, Any] = json.loads(json.dumps(chart_config))
    extenders = cfg.get("extenders") or []
    if len(extenders) != 1 or not extenders[0].get("enableHTTPS"):
        raise PlaygroundError("the chart's gangslice-scheduler configuration has no single HTTPS extender")
    (ext,) = extenders
    ext["urlPrefix"] = f"{extender_url}/gangslice"
    ext["tlsConfig"] = {"caFile": str(ca_file), "certFile": str(client[0]), "keyFile": str(client[1])}
    cfg["clientConnection"] = {**(cfg.get("clientConnection") or {}), "kubeconfig": str(kubeconfig)}
    return cfg


def expected_pods(docs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Pods the objects make, by namespace (kinds in :data:`POD_MAKERS`)."""
    out: dict[str, int] = {}
    for doc in docs:
        count = POD_MAKERS.get(str(doc.get("kind")))
        if count is not None:
            ns = str((doc.get("metadata") or {}).get("namespace") or "default")
            out[ns] = out.get(ns, 0) + count(doc)
    return out


def commands(s: Summary) -> list[str]:
    """The commands :func:`render` prints, one per line (shell-quoted)."""
    kc = shlex.quote(str(s.kubeconfig))
    columns = (
        "POD:.metadata.name,NODE:.spec.nodeName,"
        f"GPUS:.metadata.annotations.{_escaped(keys.GPUS)},NUMA:.metadata.annotations.{_escaped(keys.NUMA_NODE)}"
    )
    labels = ",".join((keys.GPU_PRODUCT_LABEL, LEAF_LABEL, CLIQUE_LABEL))
    namespaces = sorted({p.namespace for p in s.pods}) or ["default"]
    out = [
        f"kubectl --kubeconfig {kc} get nodes -L {labels}",
        f"kubectl --kubeconfig {kc} get nodetopologies",
    ]
    for ns in namespaces:
        out.append(f"kubectl --kubeconfig {kc} get slicereservations -n {ns}")
        out.append(f"kubectl --kubeconfig {kc} get pods -n {ns} -o custom-columns={shlex.quote(columns)}")
    for r in s.reservations:
        out.append(f"kubectl --kubeconfig {kc} get slicereservation {r.name} -n {r.namespace} -o yaml")
    for gang in sorted({(p.namespace, p.gang) for p in s.pods if p.gang}):
        out.append(f"gangslice explain gang/{gang[0]}/{gang[1]} --kubeconfig {kc}")
    metrics = "^gangslice_(gpus|reservations|decisions_total)"
    out.append(
        f"curl -s --cacert {shlex.quote(str(s.ca_file))} {s.extender_url}/metrics | grep -E '{metrics}'"
    )
    return out


def _escaped(key: str) -> str:
    """A label or annotation key as one name in kubectl's JSONPath (dots escaped)."""
    return key.replace(".", "\\.")


def render(s: Summary) -> str:
    lines = [f"Ready in {s.seconds:.1f} s: {s.nodes} fake GPU nodes, the example's pods bound:", ""]
    widths = [max([len(h)] + [len(getattr(p, a)) for p in s.pods]) for h, a in _COLUMNS]
    lines.append("  " + "  ".join(h.ljust(w) for (h, _), w in zip(_COLUMNS, widths, strict=True)).rstrip())
    for p in s.pods:
        cells = (getattr(p, a).ljust(w) for (_, a), w in zip(_COLUMNS, widths, strict=True))
        lines.append("  " + "  ".join(cells).rstrip())
    for r in s.reservations:
        lines.append(f"  SliceReservation {r.namespace}/{r.name} (gang {r.gang}): Bound, nodes {r.nodes}")
        lines += [f"    slot {slot}" for slot in r.slots]
    lines += [
        "",
        f"Look at it (kubectl v1.35 to v1.37; the one built here: {s.kubectl}):",
        "",
        *(f"  {c}" for c in commands(s)),
        "",
        f"  API server {s.server}; logs in {s.folder / 'logs'}/",
    ]
    return "\n".join(lines)


_COLUMNS = (("NAMESPACE", "namespace"), ("POD", "name"), ("NODE", "node"), ("GPUS", "gpus"), ("NUMA", "numa"))


# ---------------------------------------------------------------------------------------------- the run
class Playground:
    """The control plane, the chart, the fake nodes, gangslice and the example: :meth:`up`, then
    :meth:`down` (also when ``up`` failed half-way)."""

    def __init__(self, options: PlaygroundOptions, say: Say) -> None:
        self.options = options
        self._say = say
        self.cp: ControlPlane | None = None
        self._lock: IO[str] | None = None
        self._started = 0.0

    def say(self, text: str) -> None:
        self._say(f"[{time.monotonic() - self._started:6.1f}s] {text}")

    # ------------------------------------------------------------------ up
    def up(self) -> Summary:
        self._started = time.monotonic()
        docs = self._read_examples()
        self._lock = claim_folder(self.options.folder)
        bin_dir = find_binaries(self.options.bin_dir, self.say)
        if not CHART.is_dir():
            raise PlaygroundError(f"{CHART} is missing: run the playground from a clone of the repository")
        cp = self.cp = ControlPlane(bin_dir, scheduler=True, workdir=self.options.folder)
        cp.start()
        assert cp.kubeconfig is not None and cp.ca_file is not None
        self.say(
            f"control plane: etcd, kube-apiserver {cp.server}, kube-scheduler; kubeconfig {cp.kubeconfig}"
        )
        self._install_chart()
        cp.start_controller_manager(CONTROLLERS)
        self.say(f"kube-controller-manager: {', '.join(c.removesuffix('-controller') for c in CONTROLLERS)}")
        fleet = playground_fleet()
        create_nodes(cp, fleet)
        self.say(
            "nodes: 4 HGX H100 (8 GPUs on NVSwitch) under two leaves, 2 L40S PCIe boxes (8 GPUs), "
            "18 GB200 trays of one NVL72 rack (4 GPUs, one NVLink clique); each with its NodeTopology"
        )
        self.say(
            "no kubelet runs here, so no container starts: the chart's Deployments stay at 0 replicas "
            "and their programs run as local processes under the chart's ServiceAccounts"
        )
        url = self._start_gangslice()
        self._start_scheduler(url)
        self._apply(docs)
        pods = self._wait_bound(expected_pods(docs))
        summary = Summary(
            folder=self.options.folder,
            kubeconfig=cp.kubeconfig,
            server=cp.server,
            kubectl=cp.bin_dir / "kubectl",
            ca_file=cp.ca_file,
            extender_url=url,
            nodes=len(fleet),
            pods=pods,
            reservations=self._wait_reservations(pods),
        )
        summary.seconds = time.monotonic() - self._started
        return summary

    def _read_examples(self) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = []
        for path in self.options.examples:
            try:
                docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
            except (OSError, yaml.YAMLError) as exc:
                raise PlaygroundError(f"{path}: {exc}") from None
        if not expected_pods(docs):
            raise PlaygroundError(
                f"{', '.join(map(str, self.options.examples))}: no {', '.join(POD_MAKERS)} to place"
            )
        return docs

    def _install_chart(self) -> None:
        cp = self._cp()
        values = ("scheduler.enabled=true", "controller.replicas=0")
        argv = ["install", RELEASE, str(CHART), "--namespace", "default"]
        argv += [a for v in values for a in ("--set", v)]
        self._helm(*argv)
        # The scheduler's replica count is no value of the chart; 0 before any controller runs, so
        # no pod of it is ever made.
        self._kubectl("scale", "deployment", SCHEDULER, "-n", SYSTEM_NS, "--replicas=0")
        self.say(
            f"helm install {RELEASE} charts/gangslice {' '.join('--set ' + v for v in values)}; "
            f"then kubectl scale deployment {SCHEDULER} --replicas=0 (release in {cp.workdir}/helm)"
        )

    def _start_gangslice(self) -> str:
        cp = self._cp()
        assert cp.workdir is not None and cp.ca_file is not None
        deployment = cp.request("GET", f"/apis/apps/v1/namespaces/{SYSTEM_NS}/deployments/{CONTROLLER}")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        crt, key = cp.issue_cert("gangslice", ["127.0.0.1", "localhost"])
        files = {"tls.crt": crt, "tls.key": key, "ca.crt": cp.ca_file}
        args = serve_argv(container.get("args") or [], files, self.options.log_level)
        kubeconfig = self._token_kubeconfig(CONTROLLER)
        argv = [sys.executable, "-m", "extender.cli", *args, f"--kubeconfig={kubeconfig}", "--host=127.0.0.1"]
        proc = cp.start_process("gangslice", argv)
        url = f"https://127.0.0.1:{flag_value(args, '--port')}"
        context = ssl.create_default_context(cafile=str(cp.ca_file))
        deadline = time.monotonic() + 90
        while not _answers(url + "/readyz", context):
            if not proc.alive():
                raise PlaygroundError(f"gangslice serve exited:\n{proc.log_tail(40)}")
            if time.monotonic() > deadline:
                raise PlaygroundError(
                    f"gangslice serve not ready at {url}/readyz after 90 s:\n{proc.log_tail(40)}"
                )
            time.sleep(0.3)
        self.say(
            f"gangslice serve (the chart's controller arguments) on {url}, under ServiceAccount "
            f"{SYSTEM_NS}/{CONTROLLER}; log {proc.log_path}"
        )
        return url

    def _start_scheduler(self, extender_url: str) -> None:
        cp = self._cp()
        assert cp.ca_file is not None
        deployment = cp.request("GET", f"/apis/apps/v1/namespaces/{SYSTEM_NS}/deployments/{SCHEDULER}")
        volumes = deployment["spec"]["template"]["spec"].get("volumes") or []
        names = [v["configMap"]["name"] for v in volumes if "configMap" in v]
        if len(names) != 1:
            raise PlaygroundError(
                f"the chart's {SCHEDULER} Deployment mounts {len(names)} ConfigMaps, not one"
            )
        configmap = cp.request("GET", f"/api/v1/namespaces/{SYSTEM_NS}/configmaps/{names[0]}")
        (text,) = (configmap.get("data") or {}).values()
        client = cp.issue_cert(SCHEDULER, [SCHEDULER], client=True)
        kubeconfig = self._token_kubeconfig(SCHEDULER)
        cfg = scheduler_config(yaml.safe_load(text), extender_url, cp.ca_file, client, kubeconfig)
        proc = cp.start_scheduler(cfg, name=SCHEDULER, kubeconfig=kubeconfig)
        self.say(
            f"{SCHEDULER}: kube-scheduler with the chart's configuration (ConfigMap {names[0]}), extender "
            f"{extender_url}/gangslice, under ServiceAccount {SYSTEM_NS}/{SCHEDULER}; log {proc.log_path}"
        )

    def _apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        cp = self._cp()
        for ns in sorted({str((d.get("metadata") or {}).get("namespace") or "default") for d in docs}):
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            try:
                cp.request("POST", "/api/v1/namespaces", namespace)
            except urllib.error.HTTPError as e:
                if e.code != 409:  # 409: "default", or the example makes it too
                    raise PlaygroundError(f"creating namespace {ns}: HTTP {e.code}") from e
        files = [a for p in self.options.examples for a in ("-f", str(p))]
        self._kubectl("apply", *files)
        shown = " ".join(f"-f {_shown(p)}" for p in self.options.examples)
        self.say(f"kubectl apply {shown}")

    def _wait_bound(self, expected: Mapping[str, int]) -> list[BoundPod]:
        cp = self._cp()
        deadline = time.monotonic() + self.options.timeout_s
        while True:
            pods = [p for ns in expected for p in cp.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]]
            bound = [p for p in pods if p["spec"].get("nodeName")]
            if len(bound) >= sum(expected.values()) and len(bound) == len(pods):
                break
            if time.monotonic() > deadline:
                raise PlaygroundError(
                    f"{len(bound)} of {sum(expected.values())} pods bound after "
                    f"{self.options.timeout_s:g} s:\n"
                    + "\n".join(_why(p) for p in pods if not p["spec"].get("nodeName"))
                    + "\n"
                    + cp.dump_logs(tail_lines=20)
                )
            time.sleep(0.5)
        out = []
        for p in sorted(bound, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
            meta = p["metadata"]
            notes = meta.get("annotations") or {}
            out.append(
                BoundPod(
                    meta["namespace"],
                    meta["name"],
                    p["spec"]["nodeName"],
                    notes.get(keys.GPUS, ""),
                    notes.get(keys.NUMA_NODE, ""),
                    (meta.get("labels") or {}).get(keys.GANG),
                )
            )
        self.say(f"bound: {len(out)} pods on {', '.join(sorted({p.node for p in out}))}")
        return out

    def _wait_reservations(self, pods: Sequence[BoundPod]) -> list[Reserved]:
        """Each gang's SliceReservation once its status says Bound."""
        cp = self._cp()
        gangs = sorted({f"{p.namespace}/{p.gang}" for p in pods if p.gang})
        deadline = time.monotonic() + 30
        while True:
            found = {}
            for ns in sorted({g.split("/", 1)[0] for g in gangs}):
                path = f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{ns}/{keys.SLICE_RESERVATIONS}"
                for r in cp.request("GET", path)["items"]:
                    status = r.get("status") or {}
                    if r["spec"].get("gang") in gangs and status.get("phase") == "Bound":
                        found[r["spec"]["gang"]] = Reserved.from_object(r)
            if len(found) == len(gangs):
                return [found[g] for g in gangs]
            if time.monotonic() > deadline:
                raise PlaygroundError(
                    f"no Bound SliceReservation after 30 s for {sorted(set(gangs) - set(found))}"
                )
            time.sleep(0.5)

    # ------------------------------------------------------------------ processes
    def dead(self) -> ManagedProcess | None:
        """A process of the playground that has exited, if any."""
        procs = self.cp.processes.values() if self.cp is not None else ()
        return next((p for p in procs if not p.alive()), None)

    def down(self) -> None:
        """Stop every process started (the newest first); the folder stays, unlocked."""
        if self.cp is not None:
            self.cp.stop()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ helpers
    def _cp(self) -> ControlPlane:
        assert self.cp is not None
        return self.cp

    def _token_kubeconfig(self, account: str) -> Path:
        cp = self._cp()
        assert cp.workdir is not None
        return cp.write_kubeconfig(
            cp.workdir / f"{account}.kubeconfig",
            token=cp.token(SYSTEM_NS, account, seconds=TOKEN_TTL_S),
            user=account,
            namespace=SYSTEM_NS,
        )

    def _kubectl(self, *args: str) -> str:
        cp = self._cp()
        return _run([str(cp.bin_dir / "kubectl"), f"--kubeconfig={cp.kubeconfig}", *args])

    def _helm(self, *args: str) -> str:
        cp = self._cp()
        assert cp.workdir is not None
        home = cp.workdir / "helm"
        env = {f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}
        return _run([str(cp.bin_dir / "helm"), *args], env={**env, "KUBECONFIG": str(cp.kubeconfig)})


def claim_folder(folder: Path) -> IO[str]:
    """Lock ``folder`` for this run and empty what a playground left in it; a folder with other
    files is refused (nothing there is touched)."""
    if folder.exists():
        if not folder.is_dir():
            raise PlaygroundError(f"{folder} is not a folder")
        left = [p for p in folder.iterdir() if p.name != LOCK]
        if left and not (folder / MARKER).exists():
            raise PlaygroundError(f"{folder} holds files of something else: give an empty or new --dir")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = open(folder / LOCK, "a")  # noqa: SIM115 (held until down())
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise PlaygroundError(
            f"another gangslice playground runs in {folder}: stop it or give another --dir"
        ) from None
    for path in folder.iterdir():
        if path.name == LOCK:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    folder.chmod(0o700)  # it holds the admin token
    (folder / MARKER).write_text("A gangslice playground's folder: the next playground here empties it.\n")
    return lock


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        shown = " ".join([Path(argv[0]).name, *argv[1:]])
        raise PlaygroundError(
            f"{shown} exited {proc.returncode}: {proc.stderr.strip()}\n{proc.stdout[-2000:]}"
        )
    return proc.stdout


def _answers(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _why(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    conditions = (pod.get("status") or {}).get("conditions") or []
    said = next(
        (c.get("message", "") for c in conditions if c.get("type") == "PodScheduled"), "not tried yet"
    )
    return f"  {meta['namespace']}/{meta['name']}: {said}"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
