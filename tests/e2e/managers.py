"""The upstream managers the e2e tier runs beside the control plane (the LeaderWorkerSet and JobSet
controllers), out of cluster, one process each.

How they run: admin kubeconfig, leader election off, their internal certificate management off,
metrics off (``bindAddress: "0"``), health probes and webhook server on loopback ports, the webhook
server serving a certificate for 127.0.0.1 issued by the cluster CA (``ControlPlane.issue_cert``).
Their webhooks are needed: LeaderWorkerSet's pod webhook gives each leader pod its
``leaderworkerset.sigs.k8s.io/group-index`` label (the label that makes each replica group a gang of
its own) and the LWS_* variables, and JobSet's defaulting webhook fills in what its controller expects
(completion mode, success and startup policies). The webhook configurations are the release's own
(``config/webhook/manifests.yaml`` of lws, ``config/components/webhook/manifests.yaml`` of jobset,
exported by ``hack/e2e/build.sh``), pointed at the loopback URL with the CA bundle, with the pod
webhooks narrowed by the ``objectSelector`` that each release's kustomize patch adds (pods with the
LeaderWorkerSet or JobSet name label).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cluster import create, delete, items, wait_for

from extender.bench.controlplane import ControlPlane, ControlPlaneError, free_ports
from extender.kube import names

#: The label of every pod of a LeaderWorkerSet and of a JobSet: what their pod webhooks select.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


@dataclass(frozen=True)
class Manager:
    """One of the upstream managers: its binary in the bin dir, its folders of CRDs and webhook
    configurations next to it (``hack/e2e/build.sh`` exports them), its Configuration API, and the pod
    label the release's pod webhooks select on."""

    name: str
    config_api: str
    pod_label: str

    def binary(self, cp: ControlPlane) -> Path:
        return cp.bin_dir / self.name

    def crds(self, cp: ControlPlane) -> Path:
        return cp.crd_dir / self.name

    def webhooks(self, cp: ControlPlane) -> Path:
        return cp.crd_dir.parent / "webhooks" / self.name / "manifests.yaml"


LWS = Manager("lws", "config.lws.x-k8s.io/v1alpha1", names.LWS_NAME)
#: Kueue's pod webhooks are narrowed to the pods its job integrations gave a queue name.
KUEUE = Manager("kueue", "config.kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/queue-name")
JOBSET = Manager("jobset", "config.jobset.x-k8s.io/v1alpha1", JOBSET_NAME)


def start_manager(cp: ControlPlane, mgr: Manager) -> list[tuple[str, str]]:
    """Install the manager's CRDs, start it, wait until its webhook server answers, register its
    webhooks on loopback; returns the webhook configurations created, as (kind, name)."""
    assert cp.workdir is not None and cp.kubeconfig is not None and cp.ca_file is not None
    missing = [p for p in (mgr.binary(cp), mgr.crds(cp), mgr.webhooks(cp)) if not p.exists()]
    if missing:
        raise ControlPlaneError(
            f"{', '.join(map(str, missing))} missing: run hack/e2e/build.sh {mgr.name} (or unset "
            "$GANGSLICE_E2E_BIN, so that the e2e tier builds it)"
        )
    cp.install_crds(mgr.crds(cp))
    home = cp.workdir / mgr.name
    certs = home / "webhook-certs"
    certs.mkdir(parents=True, exist_ok=True)
    crt, key = cp.issue_cert(f"{mgr.name}-webhook", ["127.0.0.1", "localhost"])
    shutil.copy(crt, certs / "tls.crt")  # controller-runtime's webhook server reads these two names
    shutil.copy(key, certs / "tls.key")
    webhook_port, health_port = free_ports(2)
    config = {
        "apiVersion": mgr.config_api,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        # "0": controller-runtime starts no metrics server (the default binds :8443 on every address, a
        # fixed port that two runs on one machine would fight over; nothing here reads the metrics).
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
        # Off: the managers would otherwise write their own CA into a Secret and the webhook
        # configurations of their in-cluster Service; ours are registered below, by URL.
        "internalCertManagement": {"enable": False},
    }
    config_file = home / "config.yaml"
    config_file.write_text(json.dumps(config, indent=2))
    cp.start_process(
        mgr.name,
        [
            str(mgr.binary(cp)),
            f"--config={config_file}",
            f"--kubeconfig={cp.kubeconfig}",
            "--zap-log-level=2",
        ],
    )
    cp.wait_ready(mgr.name, f"http://127.0.0.1:{health_port}/readyz", lambda body: True)
    # LWS's /readyz is a plain ping that may answer before its webhook server listens: wait for any HTTP
    # answer on the webhook port, over TLS with the certificate the cluster CA issued.
    process = cp.processes[mgr.name]

    def serving() -> bool:
        if not process.alive():
            raise ControlPlaneError(f"{mgr.name} exited:\n{process.log_tail()}")
        return _answers(cp, webhook_port)

    wait_for(f"{mgr.name}'s webhook server on 127.0.0.1:{webhook_port}", serving, cp.startup_timeout, 0.2)
    return register_webhooks(cp, mgr, webhook_port)


def _answers(cp: ControlPlane, port: int) -> bool:
    """Whether a webhook server answers on ``port`` over TLS with the cluster CA's certificate."""
    assert cp.ca_file is not None
    ca = ssl.create_default_context(cafile=str(cp.ca_file))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/", timeout=3, context=ca):
            return True
    except urllib.error.HTTPError:
        return True  # 404: the server answers, only not on "/"
    except (urllib.error.URLError, OSError):
        return False


def register_webhooks(cp: ControlPlane, mgr: Manager, port: int) -> list[tuple[str, str]]:
    """The release's webhook configurations, each webhook called at ``https://127.0.0.1:<port><path>``
    with the cluster CA as its bundle; pod webhooks only for the manager's pods (the objectSelector the
    release's kustomize patch sets)."""
    assert cp.ca_file is not None
    bundle = base64.b64encode(cp.ca_file.read_bytes()).decode()
    created = []
    for doc in yaml.safe_load_all(mgr.webhooks(cp).read_text()):
        if not doc:
            continue
        name = f"{mgr.name}-{doc['metadata']['name']}"
        doc["metadata"] = {"name": name}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            if any("pods" in rule.get("resources", []) for rule in hook["rules"]):
                hook["objectSelector"] = {"matchExpressions": [{"key": mgr.pod_label, "operator": "Exists"}]}
        create(cp, doc)
        created.append((str(doc["kind"]), name))
    kinds = sorted(kind for kind, _ in created)
    assert kinds == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"], (
        f"{mgr.webhooks(cp)} holds {kinds}"
    )
    return created


def stop_manager(cp: ControlPlane, mgr: Manager, webhooks: Iterable[tuple[str, str]]) -> None:
    for kind, name in webhooks:
        delete(cp, kind, name)
    cp.stop_process(mgr.name)


# ---------------------------------------------------------------------------------------------- Kueue
def start_kueue(
    cp: ControlPlane,
    *,
    frameworks: Sequence[str] = ("batch/job",),
    webhooks: bool = False,
    **config_extra: Any,
) -> list[str]:
    """Install Kueue's CRDs, start its manager (``frameworks``: its integrations; ``config_extra``:
    more Configuration fields), wait for /readyz; returns the CRD names. With ``webhooks`` its
    webhook configurations are registered too (:func:`register_webhooks`, pod webhooks for pods
    with a queue name only); :func:`stop_kueue` removes them."""
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
        "integrations": {"frameworks": list(frameworks)},
        "featureGates": {"VisibilityOnDemand": False},
        **config_extra,
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
    cp.wait_ready("kueue", f"http://127.0.0.1:{health_port}/readyz", lambda body: True)
    if webhooks:
        wait_for("Kueue's webhook server", lambda: _answers(cp, webhook_port), cp.startup_timeout, 0.2)
        register_webhooks(cp, KUEUE, webhook_port)
    return crds


def stop_kueue(cp: ControlPlane) -> None:
    """Stop Kueue's manager and remove the webhook configurations :func:`start_kueue` registered."""
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for obj in items(cp, kind):
            if obj["metadata"]["name"].startswith(f"{KUEUE.name}-"):
                delete(cp, kind, obj["metadata"]["name"])
    cp.stop_process("kueue")
