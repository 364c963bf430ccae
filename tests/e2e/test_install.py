"""The shipped manifests against the real API server, and two commands under their shipped RBAC.

- The kustomize base ``manifests/`` is applied with the built kubectl (``install_gangslice``): every object of
  it must exist afterwards.
- The overlays ``manifests/scheduler``, ``manifests/kueue``, ``manifests/volcano`` and the examples under
  ``examples/k8s`` pass ``kubectl apply --server-side --dry-run=server`` (schema validation of the CRDs of
  Kueue v0.19 and Volcano v1.14, and admission). Left out, because this control plane does not serve
  ``leaderworkerset.x-k8s.io/v1`` (no LeaderWorkerSet CRDs are installed): ``plain/llama-405b-tp8-pp2.yaml``,
  ``plain/deepseek-wideep.yaml``, ``kueue/llama-405b-tp8-pp2.yaml``, ``kueue/deepseek-wideep.yaml``; each
  holds nothing but a LeaderWorkerSet (checked below, so a new example cannot be skipped unnoticed).
- ``gangslice agent --once`` (fake NVML) under a token of the ServiceAccount ``gangslice-agent`` publishes
  the NodeTopology of a fake node: a verb missing from its ClusterRole fails the command or leaves out the
  owner reference (``get`` on nodes) or the status (``nodetopologies/status``).
- ``gangslice explain gang/...`` under a ServiceAccount bound to the ClusterRole ``gangslice-explain``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import (
    MANIFESTS,
    REPO,
    SYSTEM_NS,
    FakeNode,
    clean_namespace,
    create,
    delete,
    gang_pods,
    get,
    install_gangslice,
    kubectl,
    make_node,
    new_namespace,
    remove_node,
    service_account_kubeconfig,
)

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

POOL = "inst"
EXAMPLES = REPO / "examples" / "k8s"
OVERLAYS = ("scheduler", "kueue", "volcano")
CHECKED_EXAMPLES = (
    "namespace.yaml",
    "plain/llama-70b-tp8.yaml",
    "plain/prefill-decode.yaml",
    "kueue/llama-70b-tp8.yaml",
    "kueue/prefill-decode.yaml",
)
LEADER_WORKER_SET_EXAMPLES = (
    "plain/llama-405b-tp8-pp2.yaml",
    "plain/deepseek-wideep.yaml",
    "kueue/llama-405b-tp8-pp2.yaml",
    "kueue/deepseek-wideep.yaml",
)
#: Namespaces the overlays and examples put objects in; a dry run cannot create a namespace for its objects.
TARGET_NAMESPACES = ("inference", "volcano-system")
EXPLAIN_ACCOUNT = "e2e-gangslice-explain"
RBAC_GROUP = "rbac.authorization.k8s.io"


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> ControlPlane:
    install_gangslice(control_plane)
    return control_plane


@pytest.fixture(scope="module")
def served(installed: ControlPlane) -> ControlPlane:
    """The base plus the CRDs of Kueue and Volcano and the namespaces the overlays and examples use.

    Both stay: the Kueue and Volcano modules install the same CRD sets (an existing CRD is left as it is),
    and no namespace controller runs to finish deleting a namespace. Deleting CRDs that nothing watched
    can stall for minutes on "could not list instances: storage is (re)initializing"."""
    cp = installed
    cp.install_crds(cp.crd_dir / "kueue", cp.crd_dir / "volcano")
    for name in TARGET_NAMESPACES:
        create(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, exist_ok=True)
    return cp


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def dry_run(cp: ControlPlane, source: str, objects: list[dict[str, Any]]) -> None:
    """``kubectl apply --server-side --dry-run=server`` of ``source`` (``-k DIR`` or ``-f FILE``): kubectl
    must accept every object, and report each of them as applied."""
    flag = "-k" if Path(source).is_dir() else "-f"
    out = kubectl(cp, "apply", "--server-side", "--force-conflicts", "--dry-run=server", flag, source)
    applied = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(objects), f"{len(objects)} objects in {source}, kubectl said:\n{out}"


def test_base_is_applied_whole(installed: ControlPlane) -> None:
    cp = installed
    objects = documents(kubectl(cp, "kustomize", str(MANIFESTS)))
    kinds = {doc["kind"] for doc in objects}
    assert {"CustomResourceDefinition", "Deployment", "DaemonSet", "ClusterRole"} <= kinds, kinds
    found = kubectl(cp, "get", "-k", str(MANIFESTS), "-o", "name").split()
    assert len(found) == len(objects), f"{len(objects)} objects in the base, the API server has:\n{found}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_passes_server_dry_run(served: ControlPlane, overlay: str) -> None:
    path = str(MANIFESTS / overlay)
    dry_run(served, path, documents(kubectl(served, "kustomize", path)))


@pytest.mark.parametrize("example", CHECKED_EXAMPLES)
def test_example_passes_server_dry_run(served: ControlPlane, example: str) -> None:
    path = EXAMPLES / example
    dry_run(served, str(path), documents(path.read_text()))


def test_only_leaderworkerset_examples_are_left_out() -> None:
    every = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")}
    assert every == set(CHECKED_EXAMPLES) | set(LEADER_WORKER_SET_EXAMPLES), every
    for example in LEADER_WORKER_SET_EXAMPLES:
        kinds = {(d["apiVersion"], d["kind"]) for d in documents((EXAMPLES / example).read_text())}
        assert kinds == {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")}, (example, kinds)


def run_gangslice(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "gangslice"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, check=False)


def test_agent_publishes_its_node_topology_under_the_shipped_rbac(
    installed: ControlPlane, tmp_path: Path
) -> None:
    cp = installed
    node = FakeNode(f"{POOL}-agent0", "hgx-h100", "s1", f"{POOL}-leaf-a")
    make_node(cp, node, POOL, topology=False)
    try:
        kubeconfig = service_account_kubeconfig(cp, tmp_path / "agent.kubeconfig", "gangslice-agent")
        run = run_gangslice(
            "agent",
            "--once",
            f"--node={node.name}",
            "--nvml-fake=hgx-h100",
            f"--kubeconfig={kubeconfig}",
            f"--pod-resources-socket={tmp_path / 'no-kubelet.sock'}",  # no kubelet on a fake node
        )
        assert run.returncode == 0, f"gangslice agent exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
        topology = get(cp, "NodeTopology", node.name)
        assert topology is not None, f"no NodeTopology {node.name}:\n{run.stderr}"
        assert len(topology["spec"]["gpus"]) == node.gpus and topology["spec"]["source"] == "nvml"
        node_uid = (get(cp, "Node", node.name) or {})["metadata"]["uid"]
        owners = [o.get("uid") for o in topology["metadata"].get("ownerReferences") or []]
        assert owners == [node_uid], f"owner reference missing (get nodes denied?):\n{run.stderr}"
        conditions = {c["type"]: c["status"] for c in (topology.get("status") or {}).get("conditions") or []}
        assert conditions == {"Discovered": "True", "PodResourcesAvailable": "False"}, conditions
    finally:
        remove_node(cp, node.name)


@pytest.fixture
def explain_kubeconfig(installed: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    """A ServiceAccount bound to the shipped ClusterRole gangslice-explain (which binds nobody itself)."""
    cp = installed
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": EXPLAIN_ACCOUNT, "namespace": SYSTEM_NS},
    }
    binding = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": EXPLAIN_ACCOUNT},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "gangslice-explain"},
        "subjects": [{"kind": "ServiceAccount", "name": EXPLAIN_ACCOUNT, "namespace": SYSTEM_NS}],
    }
    create(cp, account, exist_ok=True)
    create(cp, binding, exist_ok=True)
    try:
        yield service_account_kubeconfig(cp, tmp_path / "explain.kubeconfig", EXPLAIN_ACCOUNT)
    finally:
        delete(cp, "ClusterRoleBinding", EXPLAIN_ACCOUNT)
        delete(cp, "ServiceAccount", EXPLAIN_ACCOUNT, SYSTEM_NS)


def test_explain_runs_under_the_explain_role(installed: ControlPlane, explain_kubeconfig: Path) -> None:
    cp = installed
    node = FakeNode(f"{POOL}-explain0", "hgx-h100", "s1", f"{POOL}-leaf-b")
    make_node(cp, node, POOL)
    ns = new_namespace(cp, f"{POOL}-{uuid.uuid4().hex[:6]}")
    try:
        # No scheduler serves gangslice-scheduler here: the pod waits, and explain dry-runs its gang.
        (pod,) = gang_pods("explain-me", 1, 8, POOL)
        create(cp, {**pod, "metadata": {**pod["metadata"], "namespace": ns}})
        target = f"gang/{ns}/explain-me"
        run = run_gangslice("explain", target, "--json", f"--kubeconfig={explain_kubeconfig}")
        assert run.returncode == 0, f"gangslice explain exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
        facts = json.loads(run.stdout)
        assert facts["target"] == f"gang {ns}/explain-me" and facts["problems"] == [], facts
        assert facts["gang"]["pods"] == 1 and facts["gang"]["gpus"] == 8, facts["gang"]
        assert facts["dryRun"]["placed"], facts["dryRun"]
        assert [slot["node"] for slot in facts["dryRun"]["pods"]] == [node.name], facts["dryRun"]
    finally:
        clean_namespace(cp, ns)
        remove_node(cp, node.name)
