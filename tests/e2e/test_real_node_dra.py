"""A real DRA node: a gang pod's per-slot claim, pinned by gangslice's admission webhook to the
slot's GPUs, is allocated by kube-scheduler, prepared by the kubelet through a DRA driver's
kubelet plugin and applied by containerd: the container sees exactly the planned GPUs, and the
RDMA NIC the claim also asks for is the one on their PCIe root.

The node (tests/e2e/node.py) is the one of test_real_node.py with the device plugin replaced by
the fake GPU DRA driver (``gpu.nvidia.com``: its ResourceSlice as NVIDIA's driver publishes it,
claims prepared into a CDI spec) and a fake network driver (``dra.net``, the board's NICs as
dranet publishes them, each under its socket's PCIe root). A control plane of its own, as test_dra.py has: the
resourceclaim controller makes the pod's claim from its template and the garbage collector
takes it with the pod; NVIDIA's DeviceClasses; ``gangslice serve`` over HTTPS with the shipped
MutatingWebhookConfiguration.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    AUTHENTICATED_ADMISSION,
    LEAF,
    SPINE,
    WEBHOOK_CLIENT,
    Gangslice,
    delete,
    dra_webhook,
    extender_stack,
    get,
    gpus_of,
    running_control_plane,
    wait_for,
)
from cluster import POOL as POOL_LABEL
from node import PAUSE_IMAGE, RealNode, build_workload_image, workload_pod

from extender.bench.controlplane import ControlPlane
from extender.kube import dra
from extender.testing.dra import NIC_DRIVER, device_classes, nic_class

pytestmark = pytest.mark.e2e

POOL = "rnd"
NODE = f"{POOL}-a0"
FAKE = "hgx-h100"
REPO = Path(__file__).resolve().parents[2]
RESOURCE = "/apis/resource.k8s.io/v1"
NIC_CLASS = "rdma-nic"


@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    with running_control_plane(e2e_bin_dir, ControlPlane.CONTROLLERS, webhook_client=WEBHOOK_CLIENT) as cp:
        yield cp


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    for cls in [
        *device_classes(REPO / "tests" / "fixtures" / "upstream" / "nvidia-dra"),
        nic_class(NIC_CLASS),
    ]:
        cp.request("POST", f"{RESOURCE}/deviceclasses", cls)
    args = [f"--webhook-ca-bundle={cp.ca_file}", AUTHENTICATED_ADMISSION]
    with extender_stack(cp, POOL, [], name="gangslice-rnd", tls=True, extra_args=args) as server:
        dra_webhook(cp, server)
        yield server


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[RealNode]:
    labels = {SPINE: "s1", LEAF: f"{POOL}-leaf-a", POOL_LABEL: POOL}
    real = RealNode(control_plane, NODE, labels, images=(build_workload_image(),), allocation="dra")
    with real.running() as running, running.agent(FAKE):
        yield running


def claim_template(ns: str, name: str, count: int) -> dict[str, Any]:
    """GPUs of NVIDIA's class and one RDMA NIC, as a vLLM pod with GPUDirect RDMA asks."""
    requests = [
        {"name": "gpu", "exactly": {"deviceClassName": dra.GPU_DEVICE_CLASS, "count": count}},
        {"name": "nic", "exactly": {"deviceClassName": NIC_CLASS, "count": 1}},
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def test_a_gang_pods_pinned_claim_runs_with_exactly_the_planned_gpus(
    control_plane: ControlPlane, node: RealNode, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cp = control_plane
    cp.request(
        "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", claim_template(ns, "tp2-gpus", 2)
    )
    pod = workload_pod("tp2-0", 2, POOL, FAKE, strict=True, claim_template="tp2-gpus")
    pod["metadata"]["labels"]["gangslice.io/gang"] = "tp2"
    pod["metadata"]["annotations"]["gangslice.io/gang-size"] = "1"
    created = node.submit(ns, pod)
    # The webhook pointed the pod at its slot's claim.
    (entry,) = created["spec"]["resourceClaims"]
    assert "resourceClaimName" in entry, created["spec"]
    running = node.wait_running(ns, "tp2-0")
    planned = gpus_of(running)
    claim = get(cp, "ResourceClaim", entry["resourceClaimName"], ns)
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    gpus = [r["device"] for r in results if r["driver"] == dra.GPU_DRIVER]
    assert sorted(gpus) == sorted(f"gpu-{g}" for g in planned)
    # The NIC is the one on the GPUs' PCIe root: gangslice's claim joined the NIC's first
    # alternative to the GPUs' matchAttribute (the network driver lists the other socket's
    # NICs first).
    joined = {"requests": ["gpu", "nic/beside"], "matchAttribute": dra.PCIE_ROOT}
    assert joined in claim["spec"]["devices"]["constraints"], claim["spec"]["devices"]
    (nic,) = [r["device"] for r in results if r["driver"] == NIC_DRIVER]
    assert [r["request"] for r in results if r["driver"] == NIC_DRIVER] == ["nic/beside"]
    assert node.pcie_root(nic) == node.pcie_root(gpus[0]), (nic, gpus)
    assert node.printed(ns, "tp2-0", "nics") == node.nics.values[nic]
    # The kubelet asked the driver to prepare exactly that claim, and the container sees its GPUs.
    assert sorted(node.driver.prepared[claim["metadata"]["uid"]]) == sorted(f"gpu-{g}" for g in planned)
    assert node.nics.prepared[claim["metadata"]["uid"]] == [nic]
    uuids = [node.driver.values[f"gpu-{g}"] for g in planned]
    assert sorted(node.printed(ns, "tp2-0", "visible").split(",")) == sorted(uuids)
    assert "ok    gpus" in node.log(ns, "tp2-0", "preflight")
    assert running["metadata"]["annotations"]["gangslice.io/gpu-uuids"].split(",") == uuids
    with capsys.disabled():
        print(
            f"\nreal DRA node: planned GPUs {planned}; "
            f"claim {entry['resourceClaimName']} prepared with {uuids} and NIC {node.nics.values[nic]}"
        )
    delete(cp, "Pod", "tp2-0", ns)
    uid = claim["metadata"]["uid"]
    wait_for("the claim unprepared once the pod is gone", lambda: uid not in node.driver.prepared or None, 90)


def test_a_prefill_decode_pairs_claims_get_gpus_and_nics_on_one_pcie_root(
    control_plane: ControlPlane, node: RealNode, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35's proof on the real node: a P/D pair, each pod with one GPU and one RDMA NIC in
    its claim, kept on one node with its KV hand-off: every device of both claims under one
    PCIe root, and each container told its NIC."""
    cp = control_plane
    cp.request("POST", f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", claim_template(ns, "pd-gpu", 1))
    pods = {}
    for role in ("prefill", "decode"):
        pod = workload_pod(f"pd-{role}", 1, POOL, FAKE, claim_template="pd-gpu")
        pod["metadata"]["labels"] |= {"gangslice.io/gang": "pd", "gangslice.io/pod-set": role}
        pod["metadata"]["annotations"] |= {"gangslice.io/gang-size": "2", "gangslice.io/pod-set-size": "1"}
        if role == "decode":
            pod["metadata"]["annotations"] |= {
                "gangslice.io/colocate-with": "prefill@node",
                "gangslice.io/comm": "kv-transfer",
            }
        pods[role] = pod
    # The first pod is refused until a pod of the other pod set was seen (a Job would retry).
    with pytest.raises(AssertionError, match="retry once a pod of every pod set was created"):
        node.submit(ns, pods["prefill"])
    made = {role: node.submit(ns, pods[role]) for role in ("decode", "prefill")}
    roots, told = set(), {}
    for role, created in made.items():
        node.wait_running(ns, f"pd-{role}")
        (entry,) = created["spec"]["resourceClaims"]
        claim = get(cp, "ResourceClaim", entry["resourceClaimName"], ns)
        assert claim is not None
        results = claim["status"]["allocation"]["devices"]["results"]
        assert {r["driver"] for r in results} == {dra.GPU_DRIVER, NIC_DRIVER}, results
        roots |= {node.pcie_root(r["device"]) for r in results}
        (nic,) = [r["device"] for r in results if r["driver"] == NIC_DRIVER]
        told[role] = node.printed(ns, f"pd-{role}", "nics")
        assert told[role] == node.nics.values[nic]
    assert len(roots) == 1 and None not in roots, roots
    assert told["prefill"] != told["decode"]  # a NIC each
    with capsys.disabled():
        print(f"\nreal DRA node: P/D pair on PCIe root {roots.pop()}, NICs {told}")
    for role in made:
        delete(cp, "Pod", f"pd-{role}", ns)


def test_a_pod_whose_gpus_root_has_no_free_nic_gets_one_elsewhere_and_runs(
    control_plane: ControlPlane, node: RealNode, ns: str
) -> None:
    """Every NIC on socket 0's root is taken by another pod's claim: the TP=2 pod on socket 0's
    GPUs gets its NIC through the claim's second alternative, from the other root, rather than
    waiting for one beside its GPUs."""
    cp = control_plane
    root = node.pcie_root("gpu-0")
    nics = [name for name in node.nics.values if node.pcie_root(name) == root]
    selector = f'device.attributes["resource.kubernetes.io"].pcieRoot == "{root}"'
    hog_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "nic-hog", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "nics",
                        "exactly": {
                            "deviceClassName": NIC_CLASS,
                            "count": len(nics),
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }
    cp.request("POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", hog_claim)
    hog = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "nic-hog", "namespace": ns},
        "spec": {
            "schedulerName": "gangslice-scheduler",
            "nodeSelector": {POOL_LABEL: POOL},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "nics", "resourceClaimName": "nic-hog"}],
            "containers": [
                {
                    "name": "main",
                    "image": PAUSE_IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "nics"}], "requests": {"cpu": "10m"}},
                }
            ],
        },
    }
    cp.request("POST", f"/api/v1/namespaces/{ns}/pods", hog)
    node.wait_running(ns, "nic-hog")
    cp.request(
        "POST", f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", claim_template(ns, "tp2-gpus", 2)
    )
    pod = workload_pod("tp2-1", 2, POOL, FAKE, claim_template="tp2-gpus")
    pod["metadata"]["labels"]["gangslice.io/gang"] = "tp2b"
    pod["metadata"]["annotations"]["gangslice.io/gang-size"] = "1"
    created = node.submit(ns, pod)
    running = node.wait_running(ns, "tp2-1")
    (entry,) = created["spec"]["resourceClaims"]
    claim = get(cp, "ResourceClaim", entry["resourceClaimName"], ns)
    assert claim is not None
    results = claim["status"]["allocation"]["devices"]["results"]
    gpus = [r["device"] for r in results if r["driver"] == dra.GPU_DRIVER]
    assert {node.pcie_root(g) for g in gpus} == {root}, (gpus, root)  # the case this test is about
    (got,) = [r for r in results if r["driver"] == NIC_DRIVER]
    assert got["request"] == "nic/anywhere" and node.pcie_root(got["device"]) != root, results
    assert node.printed(ns, "tp2-1", "nics") == node.nics.values[got["device"]]
    assert sorted(f"gpu-{g}" for g in gpus_of(running)) == sorted(gpus)
    for name in ("tp2-1", "nic-hog"):
        delete(cp, "Pod", name, ns)
