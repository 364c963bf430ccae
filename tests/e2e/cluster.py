"""Helpers for the e2e tests that run gangslice itself: objects over plain REST, the shipped RBAC, fake
GPU nodes with NodeTopology objects, and the ``gangslice serve`` process.

Everything talks JSON through :meth:`ControlPlane.request` (admin), except gangslice, which runs under
the ServiceAccount and ClusterRole from ``manifests/controller/rbac.yaml``. The kustomize base
``manifests/`` is applied as shipped with the built kubectl (:func:`install_gangslice`). Its log level is
``$GANGSLICE_E2E_LOG_LEVEL`` (default ``info``; ``debug`` logs every API call it makes).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from extender.bench.controlplane import ControlPlane, ManagedProcess, free_ports
from extender.topology.presets import preset_graph
from extender.topology.serialize import graph_to_dict

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
SYSTEM_NS = "gangslice-system"
SERVICE_ACCOUNT = "gangslice-controller"
GPU = "nvidia.com/gpu"
SPINE = "fabric.topograph.run/tier-1"
LEAF = "fabric.topograph.run/tier-0"
#: Every node a test module creates carries this label with the module's pool name; its pods select it,
#: so modules (and the smoke test's bare node) never see each other's nodes.
POOL = "e2e.gangslice.io/pool"

T = TypeVar("T")

#: kind -> (API path prefix, plural, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "NodeTopology": ("/apis/gangslice.io/v1alpha1", "nodetopologies", False),
    "SliceReservation": ("/apis/gangslice.io/v1alpha1", "slicereservations", True),
    "ResourceFlavor": ("/apis/kueue.x-k8s.io/v1beta2", "resourceflavors", False),
    "ClusterQueue": ("/apis/kueue.x-k8s.io/v1beta2", "clusterqueues", False),
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta2", "localqueues", True),
    "AdmissionCheck": ("/apis/kueue.x-k8s.io/v1beta2", "admissionchecks", False),
    "Workload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads", True),
    "PodGroup": ("/apis/scheduling.volcano.sh/v1beta1", "podgroups", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "Queue": ("/apis/scheduling.volcano.sh/v1beta1", "queues", False),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "Job": ("/apis/batch/v1", "jobs", True),
    "LeaderWorkerSet": ("/apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets", True),
    "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2", "jobsets", True),
}


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.25) -> T:
    """Poll ``fn`` until it returns something truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------- REST
def path_of(kind: str, name: str | None = None, namespace: str | None = None, sub: str | None = None) -> str:
    prefix, plural, namespaced = _KINDS[kind]
    path = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def create(cp: ControlPlane, obj: Mapping[str, Any], *, exist_ok: bool = False) -> dict[str, Any]:
    meta = obj["metadata"]
    try:
        created: dict[str, Any] = cp.request(
            "POST", path_of(obj["kind"], namespace=meta.get("namespace")), obj
        )
        return created
    except urllib.error.HTTPError as e:
        if e.code == 409 and exist_ok:
            return get(cp, obj["kind"], meta["name"], meta.get("namespace")) or {}
        raise AssertionError(
            f"creating {obj['kind']} {meta['name']}: HTTP {e.code} {e.read()[:400]!r}"
        ) from e


def get(cp: ControlPlane, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = cp.request("GET", path_of(kind, name, namespace))
        return found
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def items(
    cp: ControlPlane, kind: str, namespace: str | None = None, label_selector: str | None = None
) -> list[dict[str, Any]]:
    path = path_of(kind, namespace=namespace)
    if label_selector:
        path += "?labelSelector=" + urllib.parse.quote(label_selector)
    listed: list[dict[str, Any]] = cp.request("GET", path)["items"]
    return listed


def merge_patch(
    cp: ControlPlane, kind: str, name: str, patch: Any, namespace: str | None = None, sub: str | None = None
) -> dict[str, Any]:
    patched: dict[str, Any] = cp.request(
        "PATCH", path_of(kind, name, namespace, sub), patch, content_type="application/merge-patch+json"
    )
    return patched


def delete(cp: ControlPlane, kind: str, name: str, namespace: str | None = None) -> None:
    # No kubelet runs: a bound pod deleted with a grace period would stay Terminating forever.
    try:
        cp.request("DELETE", path_of(kind, name, namespace), {"gracePeriodSeconds": 0})
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise


def events_for(cp: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in items(cp, "Event", namespace) if e["involvedObject"].get("name") == name]


# ---------------------------------------------------------------------------------------------- RBAC
def kubectl(cp: ControlPlane, *args: str, kubeconfig: Path | None = None, timeout: float = 120.0) -> str:
    """Run the built kubectl (as admin unless ``kubeconfig``) from the repository root; its stdout.

    A non-zero exit fails with kubectl's own message (e.g. which object the API server rejected and why)."""
    assert cp.kubeconfig is not None
    argv = [str(cp.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or cp.kubeconfig}", *args]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        said = f"{proc.stderr.strip()}\n{proc.stdout[-2000:]}"
        raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{said}")
    return proc.stdout


def install_gangslice(cp: ControlPlane) -> None:
    """The kustomize base ``manifests/`` exactly as shipped: ``kubectl apply -k manifests/ --server-side``.

    Every object of the base must be accepted by the API server. No controller-manager runs, so the
    Deployment and the DaemonSet start no pods. Safe to call again (server-side apply)."""
    kubectl(cp, "apply", "--server-side", "--force-conflicts", "-k", str(MANIFESTS))
    kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(MANIFESTS / "crds"))


def service_account_kubeconfig(cp: ControlPlane, path: Path, account: str = SERVICE_ACCOUNT) -> Path:
    """A kubeconfig with a token minted for gangslice-system/``account`` (TokenRequest API)."""
    token = cp.token(SYSTEM_NS, account, seconds=7200)
    return cp.write_kubeconfig(path, token=token, namespace=SYSTEM_NS)


def pod_token_kubeconfig(
    cp: ControlPlane, path: Path, account: str, node: str, image: str = "registry.k8s.io/pause:3.10"
) -> Path:
    """A kubeconfig with a token of gangslice-system/``account`` bound to a pod on ``node``, as
    the kubelet mounts it: the API server adds the pod's node to the user's extra
    (``authentication.kubernetes.io/node-name``). The pod (of ``image``: on a fake node no kubelet
    runs it) is named ``<account>-<node>`` and must stay while the token is used."""
    name = f"{account}-{node}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": SYSTEM_NS},
        "spec": {
            "serviceAccountName": account,
            "nodeName": node,
            "containers": [{"name": "agent", "image": image, "imagePullPolicy": "IfNotPresent"}],
        },
    }
    uid = create(cp, pod, exist_ok=True)["metadata"]["uid"]
    bound = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
    token = cp.token(SYSTEM_NS, account, seconds=7200, bound_to=bound)
    return cp.write_kubeconfig(path, token=token, namespace=SYSTEM_NS)


# ---------------------------------------------------------------------------------------------- nodes
@dataclass(frozen=True)
class FakeNode:
    name: str
    preset: str
    spine: str
    leaf: str
    gpus: int = 8


def hgx_leaves(pool: str, per_leaf: int) -> list[FakeNode]:
    """Spine s1 with leaves ``<pool>-leaf-a`` and ``<pool>-leaf-b`` of ``per_leaf`` HGX H100 nodes each."""
    return [
        FakeNode(f"{pool}-{leaf}{i}", "hgx-h100", "s1", f"{pool}-leaf-{leaf}")
        for leaf in "ab"
        for i in range(per_leaf)
    ]


def make_node(cp: ControlPlane, node: FakeNode, pool: str, *, topology: bool = True) -> None:
    """A Ready Node with ``nvidia.com/gpu`` and topograph labels, plus (unless ``topology`` is false, for
    the node agent to publish) its NodeTopology from a preset."""
    labels = {"kubernetes.io/hostname": node.name, SPINE: node.spine, LEAF: node.leaf, POOL: pool}
    create(cp, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": labels}})
    resources = {"cpu": "128", "memory": "1Ti", "pods": "110", GPU: str(node.gpus)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "fake node for e2e",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    merge_patch(
        cp,
        "Node",
        node.name,
        {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        sub="status",
    )
    if not topology:
        return
    spec = graph_to_dict(preset_graph(node.preset))
    spec["source"] = "nvml"
    create(
        cp,
        {
            "apiVersion": "gangslice.io/v1alpha1",
            "kind": "NodeTopology",
            "metadata": {"name": node.name},
            "spec": spec,
        },
    )


def remove_node(cp: ControlPlane, name: str) -> None:
    delete(cp, "NodeTopology", name)
    delete(cp, "Node", name)


# ---------------------------------------------------------------------------------------------- pods
def gpu_pod(
    name: str,
    gpus: int,
    pool: str,
    *,
    scheduler: str = "gangslice-scheduler",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    limits = {GPU: str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {POOL: pool},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": limits, "requests": {"cpu": "10m", **limits}},
                }
            ],
        },
    }


def gang_pods(
    gang: str, size: int, gpus: int, pool: str, *, extra: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    annotations = {"gangslice.io/gang-size": str(size), **(extra or {})}
    return [
        gpu_pod(f"{gang}-{i}", gpus, pool, labels={"gangslice.io/gang": gang}, annotations=annotations)
        for i in range(size)
    ]


def movable_replica(
    cp: ControlPlane,
    ns: str,
    name: str,
    gpus: int,
    pool: str,
    *,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod labelled ``gangslice.io/movable`` in ``ns``, owned by a ReplicaSet ``<name>-rs``
    created here (not created yet itself). No controller need run the ReplicaSet: gangslice
    moves only pods a controller would bring back, so a bare pod is no mover."""
    owner = create(
        cp,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": f"{name}-rs", "namespace": ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        },
    )
    pod = gpu_pod(name, gpus, pool, labels={"gangslice.io/movable": "true"}, annotations=annotations)
    pod["metadata"]["namespace"] = ns
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": f"{name}-rs",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    return pod


def node_of(cp: ControlPlane, namespace: str, name: str) -> str | None:
    pod = get(cp, "Pod", name, namespace)
    node = (pod or {}).get("spec", {}).get("nodeName")
    return str(node) if node else None


def gpus_of(pod: Mapping[str, Any]) -> list[int]:
    raw = (pod["metadata"].get("annotations") or {}).get("gangslice.io/gpus", "")
    return [int(x) for x in raw.split(",") if x.strip()]


def pod_name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


@contextlib.contextmanager
def running_control_plane(
    bin_dir: Path, controllers: Sequence[str] | None = None, **kw: Any
) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver and kube-scheduler (``kw``: more of :class:`ControlPlane`'s
    options), and with ``controllers`` kube-controller-manager running those. Stopped at the
    end; ``GANGSLICE_E2E_KEEP=1`` keeps its folder, ``GANGSLICE_E2E_DUMP_LOGS=1`` prints its logs."""
    cp = ControlPlane(bin_dir, scheduler=True, keep_workdir=bool(os.environ.get("GANGSLICE_E2E_KEEP")), **kw)
    cp.start()
    try:
        if controllers is not None:
            cp.start_controller_manager(controllers)
        yield cp
    finally:
        if os.environ.get("GANGSLICE_E2E_DUMP_LOGS"):
            cp.dump_logs(stream=sys.stderr)
        cp.stop()


def placed(pods: Iterable[dict[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    """(node, GPU indices) of each pod, sorted."""
    return sorted((str(p["spec"].get("nodeName")), tuple(sorted(gpus_of(p)))) for p in pods)


def reservations_of(cp: ControlPlane, ns: str, gang: str) -> list[dict[str, Any]]:
    return [r for r in items(cp, "SliceReservation", ns) if r["spec"]["gang"] == f"{ns}/{gang}"]


def slots(reservation: dict[str, Any] | None) -> list[dict[str, Any]]:
    return list(reservation["spec"]["slice"]["pods"]) if reservation else []


def slot_places(reservation: dict[str, Any] | None) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((str(s["node"]), tuple(sorted(s["gpus"]))) for s in slots(reservation))


def scheduled_condition(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled":
            return dict(c)
    return None


def double_booked(cp: ControlPlane, nodes: Iterable[str]) -> dict[str, list[int]]:
    """GPU indices claimed by more than one bound pod, per node (empty when none)."""
    wanted = set(nodes)
    claimed: dict[str, list[int]] = {}
    for pod in items(cp, "Pod"):
        node = pod["spec"].get("nodeName")
        if node in wanted:
            claimed.setdefault(node, []).extend(gpus_of(pod))
    return {n: g for n, g in claimed.items() if len(g) != len(set(g))}


def new_namespace(cp: ControlPlane, name: str) -> str:
    create(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def delete_owners(cp: ControlPlane, namespace: str, plurals: Iterable[str]) -> None:
    """Delete the namespace's apps/v1 objects of ``plurals`` (Deployments, ReplicaSets,
    StatefulSets), their pods in the background: before :func:`clean_namespace`, else their
    controllers would make the pods it deletes again."""
    for plural in plurals:
        for obj in cp.request("GET", f"/apis/apps/v1/namespaces/{namespace}/{plural}")["items"]:
            try:
                path = f"/apis/apps/v1/namespaces/{namespace}/{plural}/{obj['metadata']['name']}"
                cp.request("DELETE", path, {"propagationPolicy": "Background"})
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise


def clean_namespace(cp: ControlPlane, namespace: str) -> None:
    """Delete the namespace's pods (immediately: no kubelet), reservations, then the namespace itself.

    No controller-manager runs, so the namespace stays Terminating; nothing in it is left behind.
    """
    for pod in items(cp, "Pod", namespace):
        delete(cp, "Pod", pod["metadata"]["name"], namespace)
    for kind in ("Workload", "LocalQueue", "PodGroup", "SliceReservation"):
        try:
            for obj in items(cp, kind, namespace):
                delete(cp, kind, obj["metadata"]["name"], namespace)
        except urllib.error.HTTPError as e:
            if e.code != 404:  # that API is not installed in this run
                raise
    delete(cp, "Namespace", namespace)


# ---------------------------------------------------------------------------------------------- serve
@dataclass
class Gangslice:
    """``gangslice serve`` run under the shipped ServiceAccount, on a fixed loopback port."""

    cp: ControlPlane
    kubeconfig: Path
    controller: bool = False
    port: int = field(default_factory=lambda: free_ports(1)[0])
    name: str = "gangslice"
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    #: Serve HTTPS with a certificate for 127.0.0.1 from the cluster CA.
    tls: bool = False

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        assert self.cp.ca_file is not None
        return ssl.create_default_context(cafile=str(self.cp.ca_file))

    @property
    def process(self) -> ManagedProcess:
        return self.cp.processes[self.name]

    def start(self, timeout: float = 60.0) -> None:
        exe = Path(sys.executable).parent / "gangslice"
        argv = [
            str(exe),
            "serve",
            f"--kubeconfig={self.kubeconfig}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--log-level={os.environ.get('GANGSLICE_E2E_LOG_LEVEL', 'info')}",
            *self.extra_args,
        ]
        if self.tls:
            crt, key = self.cp.issue_cert(self.name, ["127.0.0.1"])
            # Mutual TLS as shipped: only kube-scheduler's client certificate may call the verbs.
            argv += [f"--tls-cert={crt}", f"--tls-key={key}", f"--tls-client-ca={self.cp.ca_file}"]
            argv.append(f"--tls-client-names={SCHEDULER_CLIENT}")
        if not self.controller:
            argv.append("--no-controller")
        self.cp.start_process(self.name, argv, env=dict(self.env))
        self.wait_ready(timeout)

    def readyz(self) -> int:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=3, context=self._ssl()) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError):
            return 0

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if not self.process.alive():
                raise AssertionError(f"gangslice serve exited:\n{self.process.log_tail(60)}")
            return self.readyz() == 200

        wait_for(f"gangslice /readyz on {self.url}", ready, timeout, 0.3)

    def kill9(self) -> None:
        proc = self.process
        os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait(10)

    def stop(self) -> None:
        self.cp.stop_process(self.name)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=3, context=self._ssl()) as resp:
            return str(resp.read().decode())


#: The common name of kube-scheduler's client certificate for the extender (mutual TLS).
SCHEDULER_CLIENT = "gangslice-scheduler"


def extender_scheduler_config(
    extender_url: str, ca_file: Path | None = None, client_cert: tuple[Path, Path] | None = None
) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration, pointed at ``extender_url`` on loopback; with ``ca_file`` the
    shipped HTTPS variant (``kube-scheduler-config-tls.yaml``) trusting that CA."""
    name = "kube-scheduler-config-tls.yaml" if ca_file else "kube-scheduler-config.yaml"
    cfg: dict[str, Any] = yaml.safe_load((MANIFESTS / "scheduler" / name).read_text())
    cfg["leaderElection"] = {"leaderElect": False}
    # Short back-off so a pod retried after an extender outage comes back within seconds, not 10 s.
    cfg["podInitialBackoffSeconds"] = 1
    cfg["podMaxBackoffSeconds"] = 2
    (ext,) = cfg["extenders"]
    ext["urlPrefix"] = f"{extender_url}/gangslice"
    assert ext["enableHTTPS"] is bool(ca_file)
    if ca_file:
        ext["tlsConfig"]["caFile"] = str(ca_file)
        assert client_cert is not None, "the shipped HTTPS configuration presents a client certificate"
        ext["tlsConfig"]["certFile"], ext["tlsConfig"]["keyFile"] = map(str, client_cert)
    return cfg


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)[:3000]


@contextlib.contextmanager
def extender_stack(
    cp: ControlPlane,
    pool: str,
    nodes: Sequence[FakeNode],
    *,
    controller: bool = False,
    name: str = "gangslice",
    tls: bool = False,
    extra_args: Sequence[str] = (),
) -> Iterator[Gangslice]:
    """Fake nodes of ``pool`` + ``gangslice serve`` under the shipped RBAC + kube-scheduler with the shipped
    extender config. On exit: gangslice stopped, kube-scheduler back to its default config, nodes removed."""
    install_gangslice(cp)
    assert cp.workdir is not None
    kubeconfig = service_account_kubeconfig(cp, cp.workdir / f"{name}.kubeconfig")
    for node in nodes:
        make_node(cp, node, pool)
    server = Gangslice(cp, kubeconfig, controller=controller, name=name, tls=tls, extra_args=extra_args)
    try:
        server.start()
        client = cp.issue_cert(SCHEDULER_CLIENT, [SCHEDULER_CLIENT], client=True) if tls else None
        cp.start_scheduler(extender_scheduler_config(server.url, cp.ca_file if tls else None, client))
        yield server
    finally:
        server.stop()
        cp.start_scheduler(None)
        for node in nodes:
            remove_node(cp, node.name)


def reserved_nodes(reservation: Mapping[str, Any]) -> list[str]:
    """The nodes of a SliceReservation's slots."""
    return [str(slot["node"]) for slot in reservation["spec"]["slice"]["pods"]]


def remove_crds(cp: ControlPlane, names: Iterable[str], timeout: float = 180.0) -> None:
    """Delete CRDs (and so every object of them) and wait until they are gone (the API
    server's CRD finalizer took over 60 s under the full suite's load)."""
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names = list(names)
    # The CRD finalizer lists a CRD's objects before it lets the CRD go; deleted while the API
    # server still (re)initializes a CRD's storage (a list answers 429 "storage is
    # (re)initializing"), it was seen to fail that list for minutes. Let the storage settle first.
    for name in names:
        wait_for(
            f"CRD {name}'s storage serving lists", functools.partial(_lists, cp, f"{base}/{name}"), 60, 0.5
        )
    for name in names:
        try:
            cp.request("DELETE", f"{base}/{name}")
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise

    def gone() -> bool:
        for name in names:
            try:
                cp.request("GET", f"{base}/{name}")
                return False
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
        return True

    wait_for(f"CRDs {names} deleted", gone, timeout, 0.5)


def _lists(cp: ControlPlane, crd_path: str) -> bool:
    """Whether the objects of a CRD can be listed now (True also when the CRD is gone)."""
    try:
        crd = cp.request("GET", crd_path)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return True
        raise
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served"))
    try:
        cp.request("GET", f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?limit=1")
    except urllib.error.HTTPError as e:
        if e.code in (404, 429, 503):
            return False
        raise
    return True


def wait_for_or_false(fn: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    """Poll ``fn`` until it is true (True) or ``timeout`` passes (False): for a message of its own."""
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


# ---------------------------------------------------------------------------------------------- kubelet
#: How often the kubelet stand-in looks at the pods.
KUBELET_PERIOD_S = 0.2


def is_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class KubeletStandIn:
    """Stands in for the kubelet of a test module's fake nodes, none of which runs one (for modules that
    run kube-controller-manager, whose workload controllers wait for pods to be Ready).

    A background thread: every pod bound to one of ``nodes`` (``spec.nodeName`` set) that is not Ready yet
    is made Running and Ready through the pod's status subresource, as a kubelet reports a pod whose
    containers started (phase Running, conditions Initialized, ContainersReady and Ready True, each
    container ready, started and running). A pod deleted there (``deletionTimestamp`` set) is deleted
    with ``gracePeriodSeconds: 0``, as a kubelet confirms that a pod's containers stopped: the e2e pods
    have ``terminationGracePeriodSeconds: 0`` and go at once, but a pod deleted with a grace period
    would otherwise stay Terminating and block a rollout.
    """

    def __init__(self, cp: ControlPlane, nodes: Iterable[str], period: float = KUBELET_PERIOD_S) -> None:
        self.cp = cp
        self.nodes = frozenset(nodes)
        self.period = period
        self.started = 0
        self.finished = 0
        #: Unexpected errors (not a pod gone or changed meanwhile), newest last.
        self.errors: collections.deque[str] = collections.deque(maxlen=20)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-stand-in", daemon=True)

    def start(self) -> KubeletStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # the API server restarting, a timeout: try again next period
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.period)

    def sync(self) -> None:
        """One pass over the pods of the nodes."""
        for pod in items(self.cp, "Pod"):
            meta, spec = pod["metadata"], pod["spec"]
            if spec.get("nodeName") not in self.nodes:
                continue
            try:
                if meta.get("deletionTimestamp"):
                    delete(self.cp, "Pod", meta["name"], meta["namespace"])
                    self.finished += 1
                elif not is_ready(pod):
                    self._start(pod)
                    self.started += 1
            except urllib.error.HTTPError as e:
                if e.code not in (404, 409):  # gone, or changed meanwhile: the next pass sees it again
                    self.errors.append(
                        f"pod {meta['namespace']}/{meta['name']}: HTTP {e.code} {e.read()[:300]!r}"
                    )

    def _start(self, pod: dict[str, Any]) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
        ]
        containers = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod["spec"]["containers"]
        ]
        status = {
            "phase": "Running",
            "startTime": now,
            "conditions": conditions,
            "containerStatuses": containers,
        }
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        # Strategic merge: the conditions merge by type, so the scheduler's PodScheduled stays.
        self.cp.request(
            "PATCH",
            path,
            {"metadata": {"uid": meta["uid"]}, "status": status},
            content_type="application/strategic-merge-patch+json",
        )


# ---------------------------------------------------------------------------------------------- DRA
#: The name kube-apiserver's client certificate gives it toward webhooks where a module's control
#: plane is started with ``webhook_client=WEBHOOK_CLIENT``; gangslice then requires it
#: (:data:`AUTHENTICATED_ADMISSION`), as docs/install.md tells a self-managed cluster to.
WEBHOOK_CLIENT = "kube-apiserver"
AUTHENTICATED_ADMISSION = f"--admission-client-names={WEBHOOK_CLIENT}"


def dra_webhook(cp: ControlPlane, server: Gangslice) -> None:
    """The shipped MutatingWebhookConfiguration, its service reference replaced by the loopback
    URL and no caBundle: gangslice (``--webhook-ca-bundle``, under the shipped RBAC) sets it."""
    assert cp.ca_file is not None

    cfg = yaml.safe_load((MANIFESTS / "dra" / "webhook.yaml").read_text())
    bundle = base64.b64encode(cp.ca_file.read_bytes()).decode()
    for hook in cfg["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"{server.url}{path}"}
    cp.request("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", cfg)

    def set_by_gangslice() -> bool:
        got = get(cp, "MutatingWebhookConfiguration", cfg["metadata"]["name"]) or {}
        return all(h["clientConfig"].get("caBundle") == bundle for h in got.get("webhooks") or [{}])

    wait_for("gangslice to set the webhook's caBundle", set_by_gangslice, timeout=30)
