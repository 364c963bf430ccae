"""Kueue's manager (v0.19.2) with a ClusterQueue whose admission check is gangslice's.

Kueue runs out of cluster with the admin kubeconfig: internal cert management off, no webhook
configurations registered (Workloads are created directly, the path that needs no webhook; its webhook
server still starts on loopback with a certificate from the cluster CA). Kueue v0.19 reads its metrics
certificate from the hard-coded ``/etc/kueue/metrics/certs``, so it runs in a private mount namespace
(``unshare -m``) with a tmpfs on ``/etc`` holding that certificate; nothing on the machine changes.

gangslice runs with the controller (Lease in gangslice-system) under the shipped RBAC.

Nodes (pool ``kq``): spine s1, leaves a and b of two HGX H100 nodes each.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from cluster import POOL as POOL_LABEL
from cluster import (
    FakeNode,
    Gangslice,
    clean_namespace,
    create,
    delete,
    double_booked,
    events_for,
    extender_stack,
    get,
    gpu_pod,
    gpus_of,
    items,
    new_namespace,
    node_of,
    remove_crds,
    reserved_nodes,
    wait_for,
)
from controlplane import ControlPlane, ControlPlaneError, free_ports

pytestmark = pytest.mark.e2e

POOL = "kq"
NODES = [FakeNode(f"kq-{leaf}{i}", "hgx-h100", "s1", f"kq-leaf-{leaf}") for leaf in "ab" for i in range(2)]
LEAF_OF = {n.name: n.leaf for n in NODES}
CHECK = "gangslice-e2e"
FLAVOR = "kq-gpu"
CLUSTER_QUEUE = "kq-gpu"
LOCAL_QUEUE = "gpu"


def start_kueue(cp: ControlPlane) -> list[str]:
    """Install Kueue's CRDs, start its manager, wait for /readyz; returns the CRD names."""
    if shutil.which("unshare") is None:
        raise ControlPlaneError("unshare (util-linux) is needed to give Kueue its metrics certificate")
    assert cp.workdir is not None and cp.kubeconfig is not None
    crds = cp.install_crds(cp.crd_dir / "kueue")
    create(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}, exist_ok=True)
    home = cp.workdir / "kueue"
    certs = home / "webhook-certs"
    certs.mkdir(parents=True, exist_ok=True)
    crt, key = cp.issue_cert("kueue-serving", ["127.0.0.1", "localhost"])
    shutil.copy(crt, certs / "tls.crt")
    shutil.copy(key, certs / "tls.key")
    webhook_port, health_port, metrics_port = free_ports(3)
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    config_file = home / "config.yaml"
    config_file.write_text(json.dumps(config, indent=2))
    script = " && ".join(
        [
            "mount -t tmpfs tmpfs /etc",
            "mkdir -p /etc/kueue/metrics/certs",
            f"cp {shlex.quote(str(crt))} /etc/kueue/metrics/certs/tls.crt",
            f"cp {shlex.quote(str(key))} /etc/kueue/metrics/certs/tls.key",
            f"exec {shlex.quote(str(cp.bin_dir / 'kueue'))} --config={shlex.quote(str(config_file))}"
            f" --kubeconfig={shlex.quote(str(cp.kubeconfig))} --zap-log-level=2",
        ]
    )
    # Not root: a user namespace (-r) owns the new mount namespace, so the tmpfs mount is allowed too.
    unshare = ["unshare", "-m", "--propagation", "private"] + (["-r"] if os.geteuid() != 0 else [])
    probe = subprocess.run([*unshare, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise ControlPlaneError(
            f"`{' '.join(unshare)} true` failed ({probe.stderr.strip()}): Kueue v0.19 reads its metrics "
            "certificate from /etc/kueue/metrics/certs, which the e2e tier provides in a private mount "
            "namespace; run as root or enable unprivileged user namespaces"
        )
    cp.start_process("kueue", [*unshare, "sh", "-c", script])
    cp._wait_ready("kueue", f"http://127.0.0.1:{health_port}/readyz", lambda body: True)
    return crds


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    crds = start_kueue(cp)
    try:
        with extender_stack(cp, POOL, NODES, controller=True, name="gangslice-kueue") as server:
            create(
                cp,
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ResourceFlavor",
                    "metadata": {"name": FLAVOR},
                    "spec": {"nodeLabels": {POOL_LABEL: POOL}},
                },
            )
            create(
                cp,
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "AdmissionCheck",
                    "metadata": {"name": CHECK},
                    "spec": {"controllerName": "gangslice.io/topology"},
                },
            )
            create(
                cp,
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ClusterQueue",
                    "metadata": {"name": CLUSTER_QUEUE},
                    "spec": {
                        "namespaceSelector": {},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu", "nvidia.com/gpu"],
                                "flavors": [
                                    {
                                        "name": FLAVOR,
                                        "resources": [
                                            {"name": "cpu", "nominalQuota": "1000"},
                                            {"name": "nvidia.com/gpu", "nominalQuota": "64"},
                                        ],
                                    }
                                ],
                            }
                        ],
                        "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
                    },
                },
            )

            def check_active() -> bool:
                ac = get(cp, "AdmissionCheck", CHECK) or {}
                conds = (ac.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

            wait_for("our AdmissionCheck Active (set by gangslice)", check_active, 60)

            def cq_active() -> bool:
                cq = get(cp, "ClusterQueue", CLUSTER_QUEUE) or {}
                conds = (cq.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

            wait_for("the ClusterQueue Active (set by Kueue)", cq_active, 60)
            try:
                yield server
            finally:
                for kind, name in (
                    ("ClusterQueue", CLUSTER_QUEUE),
                    ("AdmissionCheck", CHECK),
                    ("ResourceFlavor", FLAVOR),
                ):
                    cp.request("DELETE", f"/apis/kueue.x-k8s.io/v1beta2/{kind.lower()}s/{name}")
    finally:
        cp.stop_process("kueue")
        # Leave the cluster as this module found it: later modules run without Kueue installed.
        remove_crds(cp, crds)


@pytest.fixture
def ns(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[str]:
    name = new_namespace(control_plane, f"kq-{uuid.uuid4().hex[:6]}")
    create(
        control_plane,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": name},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    try:
        yield name
    finally:
        clean_namespace(control_plane, name)


def workload(ns: str, name: str, count: int, required_level: str | None = "leaf") -> dict[str, Any]:
    template = gpu_pod("worker", 8, POOL)
    if required_level:
        template["metadata"]["annotations"]["gangslice.io/required-level"] = required_level
    template.pop("apiVersion")
    template.pop("kind")
    template["metadata"].pop("name")
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "queueName": LOCAL_QUEUE,
            "podSets": [{"name": "workers", "count": count, "template": template}],
        },
    }


def our_check(wl: dict[str, Any] | None) -> dict[str, Any] | None:
    for entry in ((wl or {}).get("status") or {}).get("admissionChecks") or []:
        if entry["name"] == CHECK:
            return dict(entry)
    return None


def condition(wl: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((wl or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def is_true(wl: dict[str, Any] | None, kind: str) -> bool:
    c = condition(wl, kind)
    return bool(c and c["status"] == "True")


def pending_with_message(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    wl = get(cp, "Workload", name, ns)
    check = our_check(wl)
    if is_true(wl, "QuotaReserved") and check and check["state"] == "Pending" and check.get("message"):
        return check
    return None


def test_workload_held_until_its_slice_is_reserved_then_admitted_and_pods_land_on_it(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    # One 8-GPU pod on a node of each leaf: no leaf has two free nodes, so no slice exists yet.
    for node in ("kq-a0", "kq-b0"):
        blocker = gpu_pod(f"blocker-{node}", 8, POOL)
        blocker["metadata"]["namespace"] = ns
        blocker["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
        create(cp, blocker)
        name = str(blocker["metadata"]["name"])
        wait_for(f"{name} bound", partial(node_of, cp, ns, name), 60)

    create(cp, workload(ns, "llm", 2))
    check = wait_for(
        "Workload quota-reserved with our check Pending and a message",
        lambda: pending_with_message(cp, ns, "llm"),
        60,
    )
    assert "waiting for a slice" in check["message"], check
    wl = get(cp, "Workload", "llm", ns)
    assert not is_true(wl, "Admitted"), wl
    assert not items(cp, "SliceReservation", ns)

    for node in ("kq-a0", "kq-b0"):
        delete(cp, "Pod", f"blocker-{node}", ns)

    def admitted() -> dict[str, Any] | None:
        wl = get(cp, "Workload", "llm", ns)
        return wl if is_true(wl, "Admitted") else None

    admitted_wl = wait_for("Kueue to admit the Workload once our check is Ready", admitted, 60)
    ready = our_check(admitted_wl)
    assert ready and ready["state"] == "Ready", ready
    (reservation,) = items(cp, "SliceReservation", ns)
    slot_nodes = reserved_nodes(reservation)
    assert len(set(slot_nodes)) == 2 and len({LEAF_OF[n] for n in slot_nodes}) == 1, slot_nodes
    updates = {u["name"]: u for u in ready.get("podSetUpdates") or []}
    annotations = (updates.get("workers") or {}).get("annotations") or {}
    assert annotations.get("gangslice.io/reservation") == reservation["metadata"]["name"], updates

    # Play the job controller: create the pods with what the check's podSetUpdates say.
    update = updates["workers"]
    for i in range(2):
        pod = gpu_pod(f"llm-{i}", 8, POOL, labels=update.get("labels"), annotations=annotations)
        pod["metadata"]["namespace"] = ns
        pod["spec"]["nodeSelector"].update(update.get("nodeSelector") or {})
        create(cp, pod)
    nodes = [wait_for(f"{name} bound", partial(node_of, cp, ns, name), 60) for name in ("llm-0", "llm-1")]
    assert sorted(nodes) == sorted(slot_nodes), (nodes, slot_nodes)
    for i in range(2):
        assert sorted(gpus_of(get(cp, "Pod", f"llm-{i}", ns) or {})) == list(range(8))
    assert not double_booked(cp, LEAF_OF)


def test_gang_that_cannot_fit_stays_pending_with_our_message(control_plane: ControlPlane, ns: str) -> None:
    cp = control_plane
    # Three 8-GPU pods within one leaf: no leaf has three nodes. Kueue's quota (64 GPUs) is not the limit.
    create(cp, workload(ns, "huge", 3))
    check = wait_for(
        "Workload quota-reserved with our check Pending and a message",
        lambda: pending_with_message(cp, ns, "huge"),
        60,
    )
    assert "waiting for a slice" in check["message"], check
    wl = get(cp, "Workload", "huge", ns)
    assert not is_true(wl, "Admitted"), wl
    assert not items(cp, "SliceReservation", ns)
    reasons = {e["reason"] for e in events_for(cp, ns, "huge")}
    assert "WaitingForSlice" in reasons, reasons
    # Retry (quota released) comes only after CheckConfig.widen_after_s + retry_after_s (120 s + 600 s),
    # which `gangslice serve` does not let a caller shorten; see the e2e report.
