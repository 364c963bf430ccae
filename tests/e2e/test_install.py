"""The shipped manifests against the real API server, and two commands under their shipped RBAC.

- The kustomize base ``manifests/`` is applied with the built kubectl (``install_gangslice``): every object of
  it must exist afterwards.
- The overlays ``manifests/scheduler``, ``manifests/kueue``, ``manifests/volcano`` and the examples under
  ``examples/k8s`` pass ``kubectl apply --server-side --dry-run=server`` (schema validation of the CRDs of
  Kueue v0.19 and Volcano v1.14, and admission). Left out, because this control plane does not serve
  ``leaderworkerset.x-k8s.io/v1`` (no LeaderWorkerSet CRDs are installed): ``plain/llama-405b-tp8-pp2.yaml``,
  ``plain/deepseek-wideep.yaml``, ``kueue/llama-405b-tp8-pp2.yaml``, ``kueue/deepseek-wideep.yaml``; each
  holds nothing but a LeaderWorkerSet (checked below, so a new example cannot be skipped unnoticed).
- ``gangslice agent --once`` (fake NVML) under a token of the ServiceAccount ``gangslice-agent`` (bound to a
  pod on the node, as the kubelet mounts it) publishes the NodeTopology of a fake node: a verb missing from
  its ClusterRole fails the command or leaves out the owner reference (``get`` on nodes) or the status
  (``nodetopologies/status``).
- The ValidatingAdmissionPolicy ``gangslice-agent-own-node``: the agent's token, bound to a pod on one node,
  cannot publish another node's NodeTopology; a token bound to no pod publishes none.
- ``gangslice explain gang/...`` under a ServiceAccount bound to the ClusterRole ``gangslice-explain``.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
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
    Gangslice,
    clean_namespace,
    create,
    delete,
    gang_pods,
    get,
    install_gangslice,
    kubectl,
    make_node,
    new_namespace,
    pod_token_kubeconfig,
    remove_node,
    service_account_kubeconfig,
    wait_for,
)

from extender.bench.controlplane import ControlPlane, free_ports

pytestmark = pytest.mark.e2e

POOL = "inst"
EXAMPLES = REPO / "examples" / "k8s"
KUBELET_CONFIG = REPO / "tests" / "fixtures" / "kubelet" / "single-numa-node.yaml"
OVERLAYS = ("scheduler", "kueue", "volcano", "dra")
CHECKED_EXAMPLES = (
    "namespace.yaml",
    "plain/llama-70b-tp8.yaml",
    "plain/prefill-decode.yaml",
    "kueue/llama-70b-tp8.yaml",
    "kueue/prefill-decode.yaml",
    "kueue-queues.yaml",
    "llm-d/llama-70b-pd.yaml",
    "dra/tp4-pair-pcie.yaml",
    "dra/prefill-decode-hgx.yaml",
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


def test_kubectl_runs_gangslice_as_a_plugin(control_plane: ControlPlane) -> None:
    """The built kubectl finds the installed ``kubectl-gangslice`` on PATH and runs it."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    kubectl_exe = str(control_plane.bin_dir / "kubectl")
    listed = subprocess.run(
        [kubectl_exe, "plugin", "list"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert "kubectl-gangslice" in listed.stdout, listed.stdout + listed.stderr
    clusters, gangs = REPO / "examples" / "clusters", REPO / "examples" / "gangs"
    argv = [kubectl_exe, "gangslice", "place", "--json", "--cluster", str(clusters / "hgx-h100-4leaf.yaml")]
    run = subprocess.run(
        [*argv, "--gang", str(gangs / "llama-70b-tp8.yaml")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout)["placed"] is True, run.stdout


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
        # As the DaemonSet's pod gets it: a token bound to a pod on the node (own-node-policy.yaml).
        kubeconfig = pod_token_kubeconfig(cp, tmp_path / "agent.kubeconfig", "gangslice-agent", node.name)
        run = run_gangslice(
            "agent",
            "--once",
            f"--node={node.name}",
            "--nvml-fake=hgx-h100",
            f"--kubeconfig={kubeconfig}",
            f"--pod-resources-socket={tmp_path / 'no-kubelet.sock'}",  # no kubelet on a fake node
            f"--kubelet-config={KUBELET_CONFIG}",
        )
        assert run.returncode == 0, f"gangslice agent exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
        topology = get(cp, "NodeTopology", node.name)
        assert topology is not None, f"no NodeTopology {node.name}:\n{run.stderr}"
        assert len(topology["spec"]["gpus"]) == node.gpus and topology["spec"]["source"] == "nvml"
        node_uid = (get(cp, "Node", node.name) or {})["metadata"]["uid"]
        owners = [o.get("uid") for o in topology["metadata"].get("ownerReferences") or []]
        assert owners == [node_uid], f"owner reference missing (get nodes denied?):\n{run.stderr}"
        conditions = {c["type"]: c["status"] for c in (topology.get("status") or {}).get("conditions") or []}
        assert conditions == {
            "Discovered": "True",
            "PodResourcesAvailable": "False",
            "KubeletTopologyRead": "False",  # the policies are read, the CPUs not (no kubelet here)
        }, conditions
        # The API server's CRD schema takes what the agent read of the kubelet.
        assert topology["spec"]["kubelet"]["topologyManagerPolicy"] == "single-numa-node"
        assert topology["spec"]["kubelet"]["cpuManagerPolicy"] == "static"
    finally:
        delete(cp, "Pod", f"gangslice-agent-{node.name}", SYSTEM_NS)
        remove_node(cp, node.name)


def _agent_once(kubeconfig: Path, node: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_gangslice(
        "agent",
        "--once",
        f"--node={node}",
        "--nvml-fake=hgx-h100",
        f"--kubeconfig={kubeconfig}",
        f"--pod-resources-socket={tmp_path / 'no-kubelet.sock'}",
    )


def test_the_agent_writes_only_its_own_nodes_topology(installed: ControlPlane, tmp_path: Path) -> None:
    """own-node-policy.yaml on the real API server: the agent's token bound to a pod on node A
    may not publish node B's NodeTopology (the policy's message names both), and a token bound to
    no pod publishes nothing; A's own is covered by the test above."""
    cp = installed
    nodes = [FakeNode(f"{POOL}-own{i}", "hgx-h100", "s1", f"{POOL}-leaf-a") for i in range(2)]
    for n in nodes:
        make_node(cp, n, POOL, topology=False)
    mine, other = nodes[0].name, nodes[1].name
    try:
        token_a = pod_token_kubeconfig(cp, tmp_path / "a.kubeconfig", "gangslice-agent", mine)
        unbound = service_account_kubeconfig(cp, tmp_path / "plain.kubeconfig", "gangslice-agent")
        said = f"on node {mine} may write only NodeTopology {mine}, not {other}"

        def refused() -> bool:  # the policy reaches the admission chain within seconds of its creation
            run = _agent_once(token_a, other, tmp_path)
            if run.returncode == 0:
                delete(cp, "NodeTopology", other)
            return run.returncode != 0 and said in run.stdout + run.stderr

        wait_for("the own-node policy to refuse another node's NodeTopology", refused, 60, 1.0)
        assert get(cp, "NodeTopology", other) is None
        run = _agent_once(unbound, mine, tmp_path)
        assert run.returncode != 0, run.stdout
        assert "only with a token bound to a pod on a node" in run.stdout + run.stderr, run.stderr[-2000:]
        assert get(cp, "NodeTopology", mine) is None
    finally:
        delete(cp, "Pod", f"gangslice-agent-{mine}", SYSTEM_NS)
        for n in nodes:
            remove_node(cp, n.name)


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


def _token(cp: ControlPlane, account: str) -> str:
    return cp.token(SYSTEM_NS, account)


def _scrape(url: str, context: ssl.SSLContext, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10, context=context
        ) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_the_metrics_port_serves_only_tokens_granted_get_metrics(
    installed: ControlPlane, tmp_path: Path
) -> None:
    """``serve --metrics-port`` under the controller's shipped RBAC (tokenreviews, subjectaccessreviews) asks
    the real API server about each scraper's token: a ServiceAccount bound to the shipped ClusterRole
    gangslice-metrics-reader reads the metrics; an unbound one gets 403, no token 401, a bad token 401."""
    cp = installed
    kubectl(cp, "apply", "--server-side", "-f", str(MANIFESTS / "monitoring" / "metrics-reader.yaml"))
    reader, stranger = "e2e-prometheus", "e2e-stranger"
    binding = {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": reader},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "gangslice-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": reader, "namespace": SYSTEM_NS}],
    }
    for account in (reader, stranger):
        sa = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": SYSTEM_NS},
        }
        create(cp, sa, exist_ok=True)
    create(cp, binding, exist_ok=True)
    (metrics_port,) = free_ports(1)
    server = Gangslice(
        cp,
        service_account_kubeconfig(cp, tmp_path / "controller.kubeconfig", "gangslice-controller"),
        name="gangslice-metrics-port",
        tls=True,
        extra_args=(f"--metrics-port={metrics_port}",),
    )
    try:
        server.start()
        assert cp.ca_file is not None
        context = ssl.create_default_context(cafile=str(cp.ca_file))
        url = f"https://127.0.0.1:{metrics_port}/metrics"
        status, body = _scrape(url, context, _token(cp, reader))
        assert status == 200 and "gangslice_gpus" in body, (status, body[:500])
        assert 'gangslice_certificate_expiry_timestamp_seconds{certificate="serving"}' in body, body
        status, body = _scrape(url, context, _token(cp, stranger))
        assert status == 403 and f"system:serviceaccount:{SYSTEM_NS}:{stranger}" in body, (status, body)
        assert _scrape(url, context, None)[0] == 401
        assert _scrape(url, context, "not-a-token")[0] == 401
    finally:
        server.stop()
        delete(cp, "ClusterRoleBinding", reader)
        delete(cp, "ClusterRole", "gangslice-metrics-reader")
        for account in (reader, stranger):
            delete(cp, "ServiceAccount", account, SYSTEM_NS)
