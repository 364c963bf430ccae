"""``gangslice bench scheduler``: pods per second through a real kube-scheduler, with and
without the gangslice extender, in one run.

A real control plane on loopback (etcd, kube-apiserver and kube-scheduler built by
``hack/e2e/build.sh``; see :mod:`extender.bench.controlplane`) with fake HGX H100 nodes,
each with its NodeTopology object, under leaf and spine switches (topograph's tier labels).
Each case:

1. starts ``gangslice serve`` (extender cases; ``--no-controller``: the extender alone),
2. creates its pods while no scheduler runs,
3. starts kube-scheduler and times from its start to the last pod bound (each bind is seen
   on a watch of the case's namespace),
4. checks what was bound: GPUs handed out twice on a node (annotations overlapping, or more
   GPUs than the node has), gangs whose pods sit under more than one leaf switch,
5. stops the scheduler (and the extender) and deletes the pods and reservations.

The cases: the default scheduler alone (the shipped scheduler configuration without its
extender), then the shipped configuration with the extender for pods outside gangs and for
plain gangs (``gangslice.io/gang`` + ``gangslice.io/gang-size``) of each size. Every case
places the same number of pods asking the same GPUs, so their pods/s compare directly.

Besides the figures, each case reports where the time went: kube-scheduler's scheduling
attempts per pod by result (from its ``/metrics``), the extender's requests per pod and
their mean time by verb (from its ``/metrics``), and the writes the API server took per
pod by resource (``apiserver_request_total`` before and after).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from extender.bench.controlplane import REPO_ROOT, ControlPlane, ControlPlaneError, free_ports
from extender.bench.fake_nodes import FakeGpuNode, create_nodes, parallel, post
from extender.kube import names as keys
from extender.kube.pods import gpu_request

SCHEDULER_CONFIG = REPO_ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
CRDS = REPO_ROOT / "manifests" / "crds"
SPINE_LABEL = "fabric.topograph.run/tier-1"
LEAF_LABEL = "fabric.topograph.run/tier-0"
PROFILE = "gangslice-scheduler"
NEEDED = ("etcd", "kube-apiserver", "kube-scheduler")
#: The most one case may take (pods created to last bind) before the benchmark gives up.
CASE_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class SchedulerBenchOptions:
    nodes: int = 1000
    pods: int = 2000
    gpus: int = 2
    #: Sizes of the plain-gang cases; each case has ``pods // size`` gangs.
    gang_sizes: tuple[int, ...] = (4, 16)
    nodes_per_leaf: int = 32
    leaves_per_spine: int = 8
    #: Run the default-scheduler case and the extender case for pods outside gangs.
    baseline: bool = True
    plain: bool = True
    bin_dir: Path | None = None
    timeout_s: float = CASE_TIMEOUT_S
    #: Log level of ``gangslice serve`` (``debug`` logs every API call).
    log_level: str = "warning"
    #: Keep the control plane's folder (logs of every component) and say where it is.
    keep: bool = False


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    #: None: the default scheduler alone; 0: extender, pods outside gangs; n: gangs of n.
    gang_size: int | None

    @property
    def extender(self) -> bool:
        return self.gang_size is not None


@dataclass(slots=True)
class CaseResult:
    case: str
    pods: int
    gangs: int
    bound: int
    #: Scheduler start to the last bind, and to the first.
    seconds: float
    first_bind_s: float
    pods_per_s: float
    double_booked_gpus: int
    split_gangs: int
    #: kube-scheduler's scheduling attempts by result, per pod.
    attempts_per_pod: dict[str, float] = field(default_factory=dict)
    #: Mean milliseconds of one scheduling attempt (from the start of its scheduling cycle,
    #: run one pod at a time, to the end of its bind) and of its algorithm (filter and score,
    #: the extender's included), from kube-scheduler's own histograms.
    attempt_ms: float = 0.0
    algorithm_ms: float = 0.0
    #: The extender's requests per pod and their mean milliseconds, by verb.
    extender_calls_per_pod: dict[str, float] = field(default_factory=dict)
    extender_ms: dict[str, float] = field(default_factory=dict)
    #: The extender's decisions by outcome, per pod.
    decisions_per_pod: dict[str, float] = field(default_factory=dict)
    #: API server requests during the case that are writes, per pod, by "VERB resource".
    api_writes_per_pod: dict[str, float] = field(default_factory=dict)
    #: Seconds between a gang's first and last member bound: median and max.
    gang_spread_s: tuple[float, float] | None = None


def cases(options: SchedulerBenchOptions) -> list[Case]:
    out = []
    if options.baseline:
        out.append(Case("default scheduler", None))
    if options.plain:
        out.append(Case("extender, pods", 0))
    out += [Case(f"extender, gangs of {n}", n) for n in options.gang_sizes]
    return out


def check_prerequisites(bin_dir: Path) -> None:
    """Fail naming what to install when a binary or openssl is missing."""
    missing = [exe for exe in NEEDED if not os.access(bin_dir / exe, os.X_OK)]
    if missing:
        raise ControlPlaneError(
            f"{', '.join(NEEDED)} built from the pinned upstream sources are needed; missing in "
            f"{bin_dir}: {', '.join(missing)}. Install Go >= 1.26 "
            "(https://go.dev/dl/), then run `hack/e2e/build.sh etcd kube-apiserver kube-scheduler` "
            "from the repository (it prints the folder as GANGSLICE_E2E_BIN=...), or pass "
            "--bin-dir / set $GANGSLICE_E2E_BIN to a folder that has them."
        )
    if shutil.which("openssl") is None:
        raise ControlPlaneError("openssl is needed on PATH (the 'openssl' package)")
    for path in (SCHEDULER_CONFIG, CRDS):
        if not path.exists():
            raise ControlPlaneError(f"{path} is missing: run the benchmark from a clone of the repository")


# ---------------------------------------------------------------------------------------------- objects
@dataclass(frozen=True, slots=True)
class BenchNode:
    name: str
    leaf: str
    spine: str


def fabric(options: SchedulerBenchOptions) -> list[BenchNode]:
    """``options.nodes`` nodes, ``nodes_per_leaf`` to a leaf, ``leaves_per_spine`` to a spine."""
    out = []
    for i in range(options.nodes):
        leaf = i // options.nodes_per_leaf
        out.append(
            BenchNode(f"hgx-{i:05d}", f"leaf-{leaf:03d}", f"spine-{leaf // options.leaves_per_spine:02d}")
        )
    return out


def bench_pods(case: Case, options: SchedulerBenchOptions, namespace: str) -> list[dict[str, Any]]:
    """The case's pods: ``options.pods`` pods of ``options.gpus`` GPUs (whole gangs only)."""
    size = case.gang_size or 1
    out = []
    for g in range(options.pods // size):
        for m in range(size):
            labels: dict[str, str] = {}
            annotations: dict[str, str] = {}
            name = f"pod-{g:05d}"
            if case.gang_size:
                name = f"gang-{g:05d}-{m:02d}"
                labels[keys.GANG] = f"gang-{g:05d}"
                annotations[keys.GANG_SIZE] = str(size)
            gpus = {keys.GPU_RESOURCE: str(options.gpus)}
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": labels,
                        "annotations": annotations,
                    },
                    "spec": {
                        "schedulerName": PROFILE,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "server",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": gpus, "requests": {"cpu": "100m", **gpus}},
                            }
                        ],
                    },
                }
            )
    return out


def scheduler_config(extender_url: str | None) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration, without leader election; pointed at
    ``extender_url``, or without its extender for the default scheduler alone."""
    import yaml

    cfg: dict[str, Any] = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    cfg["leaderElection"] = {"leaderElect": False}
    if extender_url is None:
        cfg.pop("extenders", None)
    else:
        (ext,) = cfg["extenders"]
        ext["urlPrefix"] = f"{extender_url}/gangslice"
    return cfg


# ---------------------------------------------------------------------------------------------- API


def make_nodes(cp: ControlPlane, nodes: Sequence[BenchNode]) -> None:
    create_nodes(
        cp,
        [
            FakeGpuNode(
                n.name,
                "hgx-h100",
                {LEAF_LABEL: n.leaf, SPINE_LABEL: n.spine},
                {"cpu": "192", "memory": "2Ti"},
            )
            for n in nodes
        ],
    )


def list_pods(cp: ControlPlane, namespace: str) -> tuple[list[dict[str, Any]], str]:
    listing = cp.request("GET", f"/api/v1/namespaces/{namespace}/pods", timeout=120)
    return list(listing["items"]), str(listing["metadata"]["resourceVersion"])


class BindWatch:
    """A watch of a namespace's pods in a thread: when each pod was first seen bound."""

    def __init__(self, cp: ControlPlane, namespace: str, resource_version: str, expected: int) -> None:
        self.cp, self.namespace, self.expected = cp, namespace, expected
        self.resource_version = resource_version
        self.bound_at: dict[str, float] = {}
        self.error: str | None = None
        self.done = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.cp.ca_file is not None
        ctx = ssl.create_default_context(cafile=str(self.cp.ca_file))
        while not self._stop and not self.done.is_set():
            query = urllib.parse.urlencode(
                {"watch": "true", "resourceVersion": self.resource_version, "timeoutSeconds": "300"}
            )
            req = urllib.request.Request(f"{self.cp.server}/api/v1/namespaces/{self.namespace}/pods?{query}")
            req.add_header("Authorization", f"Bearer {self.cp.admin_token}")
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=330) as resp:
                    for line in resp:
                        if self._stop:
                            return
                        self._event(json.loads(line))
                        if len(self.bound_at) >= self.expected:
                            self.done.set()
                            return
            except (OSError, ValueError) as exc:  # reconnect from the last version seen
                if self._stop:
                    return
                self.error = repr(exc)
                time.sleep(0.2)

    def _event(self, event: Mapping[str, Any]) -> None:
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            raise ValueError(f"watch error: {obj.get('message')}")
        meta = obj.get("metadata") or {}
        self.resource_version = str(meta.get("resourceVersion") or self.resource_version)
        if (obj.get("spec") or {}).get("nodeName") and meta.get("name") not in self.bound_at:
            self.bound_at[str(meta["name"])] = time.monotonic()

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def stop(self) -> None:
        self._stop = True


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text to {(sample name, sorted labels): value}."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _get_metrics(url: str, token: str | None, ctx: ssl.SSLContext | None) -> Samples:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
        return metric_samples(resp.read().decode())


def apiserver_metrics(cp: ControlPlane) -> Samples:
    assert cp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    return _get_metrics(f"{cp.server}/metrics", cp.admin_token, ctx)


def scheduler_metrics(cp: ControlPlane) -> Samples:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # kube-scheduler self-signs its serving certificate
    return _get_metrics(f"https://127.0.0.1:{cp.scheduler_port}/metrics", cp.admin_token, insecure)


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for (n, labels), v in samples.items():
        if n == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


def _mean_ms(samples: Samples, histogram: str) -> float:
    total = sum(_by(samples, f"{histogram}_sum", "").values())
    count = sum(_by(samples, f"{histogram}_count", "").values())
    return total / count * 1e3 if count else 0.0


WRITE_VERBS = ("POST", "PATCH", "PUT", "DELETE", "APPLY")


def api_writes(before: Samples, after: Samples) -> dict[str, float]:
    """Writes the API server served between two scrapes, by "VERB resource[/subresource]"."""
    out: dict[str, float] = {}
    for (name, labels), v in after.items():
        if name != "apiserver_request_total":
            continue
        lab = dict(labels)
        if lab.get("verb") not in WRITE_VERBS:
            continue
        sub = f"/{lab['subresource']}" if lab.get("subresource") else ""
        key = f"{lab['verb']} {lab.get('resource', '')}{sub}"
        d = v - before.get((name, labels), 0.0)
        if d > 0:
            out[key] = out.get(key, 0.0) + d
    return out


# ---------------------------------------------------------------------------------------------- checks
def double_booked(pods: Sequence[Mapping[str, Any]], gpus_per_node: int = 8) -> int:
    """GPUs handed out twice: a GPU index in two bound pods' ``gangslice.io/gpus`` on one
    node, plus GPUs requested beyond what a node has."""
    claimed: dict[str, list[int]] = {}
    asked: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.GPUS, "")
        claimed.setdefault(node, []).extend(int(x) for x in raw.split(",") if x.strip())
        asked[node] = asked.get(node, 0) + gpu_request(pod["spec"])
    twice = sum(len(g) - len(set(g)) for g in claimed.values())
    over = sum(max(0, n - gpus_per_node) for n in asked.values())
    return twice + over


def split_gangs(pods: Sequence[Mapping[str, Any]], leaf_of: Mapping[str, str]) -> int:
    """Gangs whose bound pods sit under more than one leaf switch."""
    leaves: dict[str, set[str]] = {}
    for pod in pods:
        gang = ((pod.get("metadata") or {}).get("labels") or {}).get(keys.GANG)
        node = (pod.get("spec") or {}).get("nodeName")
        if gang and node:
            leaves.setdefault(gang, set()).add(leaf_of.get(node, "?"))
    return sum(1 for s in leaves.values() if len(s) > 1)


def _gang_spread(bound_at: Mapping[str, float]) -> tuple[float, float] | None:
    by_gang: dict[str, list[float]] = {}
    for name, t in bound_at.items():
        if name.startswith("gang-"):
            by_gang.setdefault(name.rsplit("-", 1)[0], []).append(t)
    spreads = sorted(max(ts) - min(ts) for ts in by_gang.values())
    if not spreads:
        return None
    return spreads[len(spreads) // 2], spreads[-1]


# ---------------------------------------------------------------------------------------------- serve
class Extender:
    """``gangslice serve --no-controller`` as a process of the control plane."""

    def __init__(self, cp: ControlPlane, log_level: str) -> None:
        self.cp = cp
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).parent / "gangslice"
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "extender.cli"]
        self.process = cp.start_process(
            "gangslice",
            [
                *argv,
                "serve",
                f"--kubeconfig={cp.kubeconfig}",
                "--host=127.0.0.1",
                f"--port={self.port}",
                f"--log-level={log_level}",
                "--no-controller",
            ],
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise ControlPlaneError(f"gangslice serve exited:\n{self.process.log_tail(60)}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/readyz", timeout=3) as resp,
            ):
                if resp.status == 200:
                    return
            time.sleep(0.3)
        raise ControlPlaneError(f"gangslice serve not ready after {timeout}s:\n{self.process.log_tail(60)}")

    def metrics(self) -> Samples:
        return _get_metrics(self.url + "/metrics", None, None)

    def stop(self) -> None:
        self.cp.stop_process("gangslice")


# ---------------------------------------------------------------------------------------------- run
@contextlib.contextmanager
def bench_cluster(options: SchedulerBenchOptions, bin_dir: Path) -> Iterator[ControlPlane]:
    """The control plane (no scheduler yet) with the CRDs and the bench's nodes."""
    check_prerequisites(bin_dir)
    cp = ControlPlane(bin_dir, scheduler=False, keep_workdir=options.keep)
    cp.start()
    try:
        cp.install_crds(CRDS)
        make_nodes(cp, fabric(options))
        yield cp
    finally:
        if options.keep and cp.workdir is not None:
            print(f"control plane folder (logs of every component): {cp.workdir}", file=sys.stderr)
        cp.stop()


def run_case(
    cp: ControlPlane, case: Case, options: SchedulerBenchOptions, leaf_of: Mapping[str, str]
) -> CaseResult:
    namespace = "bench-" + "".join(c if c.isalnum() else "-" for c in case.name).strip("-")
    namespace = "-".join(filter(None, namespace.split("-")))
    post(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    extender = Extender(cp, options.log_level) if case.extender else None
    try:
        if extender is not None:
            extender.wait_ready()
        pods = bench_pods(case, options, namespace)
        parallel(lambda p: post(cp, f"/api/v1/namespaces/{namespace}/pods", p), pods)
        _, rv = list_pods(cp, namespace)
        watch = BindWatch(cp, namespace, rv, len(pods))
        if extender is not None:
            time.sleep(1.0)  # the extender's pod watch has the pods (not timed)
        before = apiserver_metrics(cp)
        began = time.monotonic()
        cp.start_scheduler(scheduler_config(extender.url if extender else None))
        finished = watch.wait(options.timeout_s)
        watch.stop()
        sched = scheduler_metrics(cp)
        after = apiserver_metrics(cp)
        ext = extender.metrics() if extender is not None else {}
        cp.stop_process("kube-scheduler")
        listed, _ = list_pods(cp, namespace)
        bound_at = dict(watch.bound_at)
        if not finished:
            raise ControlPlaneError(
                f"{case.name}: {len(bound_at)} of {len(pods)} pods bound after {options.timeout_s:g}s"
                + (f" (last watch error: {watch.error})" if watch.error else "")
                + "\n"
                + cp.dump_logs(tail_lines=30)
            )
        last = max(bound_at.values())
        n = len(pods)
        result = CaseResult(
            case=case.name,
            pods=n,
            gangs=n // case.gang_size if case.gang_size else 0,
            bound=sum(1 for p in listed if (p.get("spec") or {}).get("nodeName")),
            seconds=last - began,
            first_bind_s=min(bound_at.values()) - began,
            pods_per_s=n / (last - began),
            double_booked_gpus=double_booked(listed),
            split_gangs=split_gangs(listed, leaf_of),
            gang_spread_s=_gang_spread(bound_at),
        )
        attempts = _by(sched, "scheduler_schedule_attempts_total", "result")
        result.attempts_per_pod = {k: v / n for k, v in sorted(attempts.items()) if v}
        result.attempt_ms = _mean_ms(sched, "scheduler_scheduling_attempt_duration_seconds")
        result.algorithm_ms = _mean_ms(sched, "scheduler_scheduling_algorithm_duration_seconds")
        result.api_writes_per_pod = {k: v / n for k, v in sorted(api_writes(before, after).items())}
        if ext:
            counts = _by(ext, "gangslice_extender_request_duration_seconds_count", "verb")
            sums = _by(ext, "gangslice_extender_request_duration_seconds_sum", "verb")
            result.extender_calls_per_pod = {k: v / n for k, v in sorted(counts.items()) if v}
            result.extender_ms = {k: sums.get(k, 0.0) / v * 1e3 for k, v in sorted(counts.items()) if v}
            decisions = _by(ext, "gangslice_decisions_total", "outcome")
            result.decisions_per_pod = {k: v / n for k, v in sorted(decisions.items()) if v}
        return result
    finally:
        cp.stop_process("kube-scheduler")
        if extender is not None:
            extender.stop()
        _clean(cp, namespace)


def _clean(cp: ControlPlane, namespace: str) -> None:
    """Delete the case's pods (at once: no kubelet runs) and reservations, so the next case
    finds every GPU free."""
    with contextlib.suppress(urllib.error.HTTPError):
        cp.request("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0", timeout=120)
    with contextlib.suppress(urllib.error.HTTPError):
        cp.request(
            "DELETE",
            f"/apis/{keys.GROUP}/{keys.VERSION}/namespaces/{namespace}/{keys.SLICE_RESERVATIONS}",
            timeout=120,
        )
    deadline = time.monotonic() + 120
    while list_pods(cp, namespace)[0]:
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"pods of namespace {namespace} still there after 120 s")
        time.sleep(0.5)


def run_scheduler_bench(
    options: SchedulerBenchOptions, bin_dir: Path, progress: Callable[[str], None] = lambda _: None
) -> list[CaseResult]:
    results = []
    leaf_of = {n.name: n.leaf for n in fabric(options)}
    check_prerequisites(bin_dir)
    progress(f"starting etcd and kube-apiserver, creating {options.nodes} nodes with NodeTopology")
    with bench_cluster(options, bin_dir) as cp:
        for case in cases(options):
            progress(f"{case.name}: {options.pods} pods")
            results.append(run_case(cp, case, options, leaf_of))
            r = results[-1]
            progress(f"{case.name}: {r.pods_per_s:.1f} pods/s ({r.seconds:.1f} s)")
    return results


# ---------------------------------------------------------------------------------------------- output
def _baseline(results: Sequence[CaseResult]) -> CaseResult | None:
    return next((r for r in results if r.case == "default scheduler"), None)


def _fmt(d: Mapping[str, float], digits: int = 2) -> str:
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in d.items()) or "-"


def render(options: SchedulerBenchOptions, results: Sequence[CaseResult]) -> str:
    base = _baseline(results)
    lines = [
        f"gangslice bench scheduler: {options.nodes} fake HGX H100 nodes "
        f"({options.nodes_per_leaf} per leaf), "
        f"{options.pods} pods of {options.gpus} GPUs per case, real etcd + kube-apiserver + kube-scheduler",
        "clock: kube-scheduler start to the last pod bound; pods created before the scheduler starts",
        f"{'case':<24} {'gangs':>6} {'bound':>6} {'seconds':>8} {'1st bind s':>10} {'pods/s':>8} "
        f"{'vs default':>10} {'double-booked':>13} {'split gangs':>11}",
    ]
    for r in results:
        ratio = f"{r.pods_per_s / base.pods_per_s:.2f}x" if base and base.pods_per_s else "-"
        lines.append(
            f"{r.case:<24} {r.gangs or '-':>6} {r.bound:>6} {r.seconds:>8.1f} {r.first_bind_s:>10.1f} "
            f"{r.pods_per_s:>8.1f} {ratio:>10} {r.double_booked_gpus:>13} {r.split_gangs:>11}"
        )
    lines.append("where the time goes, per pod:")
    for r in results:
        lines.append(f"  {r.case}:")
        lines.append(
            f"    scheduling attempts: {_fmt(r.attempts_per_pod)}; mean attempt to bound "
            f"{r.attempt_ms:.1f} ms (filter and score of it {r.algorithm_ms:.1f} ms)"
        )
        if r.extender_calls_per_pod:
            calls = ", ".join(
                f"{k} {v:.2f} x {r.extender_ms.get(k, 0.0):.1f} ms"
                for k, v in r.extender_calls_per_pod.items()
            )
            lines.append(f"    extender requests: {calls}")
            lines.append(f"    extender decisions: {_fmt(r.decisions_per_pod)}")
        lines.append(f"    API writes: {_fmt(r.api_writes_per_pod)}")
        if r.gang_spread_s is not None:
            median, worst = r.gang_spread_s
            lines.append(
                f"    first to last member of a gang bound: median {median:.2f} s, max {worst:.2f} s"
            )
    lines.append(
        "targets: gangs (of 4 and of 16) and pods >= 1.0x the default scheduler; 0 double-booked; 0 split"
    )
    return "\n".join(lines)


def to_json(options: SchedulerBenchOptions, results: Sequence[CaseResult]) -> dict[str, Any]:
    base = _baseline(results)
    opts = asdict(options)
    opts["bin_dir"] = str(opts["bin_dir"]) if opts["bin_dir"] else None
    return {
        "options": opts,
        "results": [
            {
                **asdict(r),
                "vsDefault": r.pods_per_s / base.pods_per_s if base and base.pods_per_s else None,
            }
            for r in results
        ],
    }
