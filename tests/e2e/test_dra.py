"""DRA on the real control plane: per-slot ResourceClaims pinned to the slice's GPUs, allocated by
kube-scheduler's DynamicResources plugin.

A control plane of its own (etcd, kube-apiserver, kube-scheduler with the shipped extender config, and
kube-controller-manager with only the resourceclaim and garbage-collector controllers), NVIDIA's
DeviceClasses (rendered from the chart templates in tests/fixtures/upstream/nvidia-dra), and a fake
dual-socket PCIe node that publishes a ResourceSlice shaped like NVIDIA's driver plus its NodeTopology
(same UUIDs and PCI bus IDs). ``gangslice serve`` runs under the shipped RBAC with the shipped
MutatingWebhookConfiguration (manifests/dra) pointed at it over HTTPS. kube-apiserver presents a client
certificate to it and gangslice requires it (``--admission-client-names``), as docs/install.md tells a
self-managed cluster to: the gangs of bare pods here are then reserved at their pods' reviews
(tests/e2e/test_dra_default_install.py runs the default install, where only owned pods' gangs are).

Tests: a TP=4 pod set on a fragmented PCIe node gets exactly the planned devices and loses its claim with
the gang; what kube-scheduler does with a claim pinned to a taken device; a foreign claim grabbing a planned
device makes gangslice re-plan; a prefill/decode pair gets disjoint, NUMA-aligned halves of one HGX node; a
wide-EP gang on GB200 trays gets one ComputeDomain, a second gang never shares its nodes, and a tray the
driver labels with a ComputeDomain gangslice did not create is not given to a gang; a Kueue-admitted gang
(Kueue's manager started for that test, as tests/e2e/test_kueue.py starts it) gets its slots' claims and
exactly their devices; a Volcano gang's members, refused while its PodGroup has no slice, are pinned each
to its own slot when re-created (the test plays Volcano's job controller; no Volcano scheduler runs, so
nothing allocates those claims); with gangslice down, gang pods and pods labelled
``gangslice.io/managed`` are refused naming the webhook and other pods pass.

No kubelet runs: a bound pod stays Pending (nothing prepares its claim or starts it); that is expected.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import (
    AUTHENTICATED_ADMISSION,
    WEBHOOK_CLIENT,
    Gangslice,
    create,
    delete,
    dra_webhook,
    events_for,
    extender_stack,
    get,
    gpu_pod,
    items,
    merge_patch,
    pod_name,
    remove_crds,
    remove_node,
    running_control_plane,
    scheduled_condition,
    wait_for,
)
from cluster import POOL as POOL_LABEL
from managers import start_kueue, stop_kueue
from test_kueue import CHECK, leading, our_check
from test_kueue import is_true as kueue_is_true

from extender.bench.controlplane import ControlPlane
from extender.kube import dra
from extender.testing.dra import compute_domain_slice, device_classes, gpu_slice, gpu_uuid, with_identities
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph
from extender.topology.serialize import graph_to_dict

pytestmark = pytest.mark.e2e

#: The namespace prefix (the ``ns`` fixture reads it) and the pool label value of this module's node.
POOL = POOL_NAME = "dra"
NODE = "dra-p0"
PRESET = "pcie-8gpu-2socket"
REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "nvidia-dra"
RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    """This module's own control plane: the garbage collector and the resourceclaim controller must
    run, and NVIDIA's DeviceClasses must not leak into the other modules' cluster."""
    # The workload controllers' gangs (Deployment, JobSet, LeaderWorkerSet) run in
    # test_dra_default_install.py.
    with running_control_plane(e2e_bin_dir, ControlPlane.CONTROLLERS, webhook_client=WEBHOOK_CLIENT) as cp:
        yield cp


def post(cp: ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST as admin; a refusal fails naming the object and the API server's reason."""
    try:
        created: dict[str, Any] = cp.request("POST", path, body)
        return created
    except urllib.error.HTTPError as e:
        what = f"{body.get('kind')} {body.get('metadata', {}).get('name')}"
        raise AssertionError(f"creating {what}: HTTP {e.code} {e.read()[:800]!r}") from e


def _fake_node(
    cp: ControlPlane, name: str, preset: str, labels: dict[str, str] | None, *, device_plugin_gpus: int = 0
) -> tuple[dict[str, Any], GpuGraph]:
    """A Ready Node of this module's pool and its NodeTopology (source NVML): GPUs through DRA, or,
    with ``device_plugin_gpus``, through the device plugin (``nvidia.com/gpu``)."""
    labels = {"kubernetes.io/hostname": name, POOL_LABEL: POOL_NAME, **(labels or {})}
    node = create(cp, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    resources = {"cpu": "128", "memory": "1Ti", "pods": "110"}
    if device_plugin_gpus:
        # The examples' pods also ask for the RDMA shared device plugin's resource.
        resources.update({"nvidia.com/gpu": str(device_plugin_gpus), "rdma/rdma_shared_device_a": "1k"})
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node for e2e"}
    merge_patch(
        cp,
        "Node",
        name,
        {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        sub="status",
    )
    graph = with_identities(name, preset_graph(preset))
    spec = graph_to_dict(graph)
    spec["source"] = "nvml"
    if not device_plugin_gpus:
        spec["allocation"] = "dra"
    create(
        cp,
        {
            "apiVersion": "gangslice.io/v1alpha1",
            "kind": "NodeTopology",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    return node, graph


def _dra_node(
    cp: ControlPlane, name: str = NODE, preset: str = PRESET, labels: dict[str, str] | None = None
) -> None:
    """A node whose GPUs NVIDIA's DRA driver publishes (no ``nvidia.com/gpu``)."""
    node, graph = _fake_node(cp, name, preset, labels)
    post(cp, f"{RESOURCE}/resourceslices", gpu_slice(name, graph, uid=node["metadata"]["uid"]))


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    cp = control_plane
    for cls in device_classes(UPSTREAM):
        post(cp, f"{RESOURCE}/deviceclasses", cls)
    args = [f"--webhook-ca-bundle={cp.ca_file}", AUTHENTICATED_ADMISSION]
    with extender_stack(cp, POOL_NAME, [], name="gangslice-dra", tls=True, extra_args=args) as server:
        _dra_node(cp)  # after the stack installed the CRDs; the cache takes it from its watches
        dra_webhook(cp, server)
        yield server


def template(ns: str, name: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": dra.GPU_DEVICE_CLASS, "count": count}}
                    ]
                }
            }
        },
    }


def dra_pod(
    ns: str, name: str, *, claim: dict[str, str], labels: dict[str, str] | None = None, **ann: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}, "annotations": dict(ann)},
        "spec": {
            "schedulerName": "gangslice-scheduler",
            "nodeSelector": {POOL_LABEL: POOL_NAME},
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "10m"}, "claims": [{"name": "gpus"}]},
                }
            ],
            "resourceClaims": [{"name": "gpus", **claim}],
        },
    }


def claim_of(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    try:
        got: dict[str, Any] = cp.request("GET", f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        return got
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def uuid_claim(ns: str, name: str, gpus: list[int]) -> dict[str, Any]:
    """A claim made by hand (not gangslice's), pinned to ``gpus`` of the node by UUID."""
    uuids = ", ".join(f'"{gpu_uuid(NODE, g)}"' for g in gpus)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": dra.GPU_DEVICE_CLASS,
                            "count": len(gpus),
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f'device.attributes["gpu.nvidia.com"].uuid in [{uuids}]'
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }


def allocated(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    claim = claim_of(cp, ns, name)
    if claim and (claim.get("status") or {}).get("allocation") and (claim["status"].get("reservedFor")):
        return claim
    return None


def assert_claims_pin_their_slots(cp: ControlPlane, ns: str, pods: list[dict[str, Any]]) -> None:
    """Each pod's ``gpus`` claim is allocated exactly the devices of its slot
    (``gangslice.io/gpus``), and no device is held by two pods' claims."""
    held: dict[str, str] = {}
    for p in pods:
        (entry,) = [c for c in p["spec"]["resourceClaims"] if c["name"] == "gpus"]
        claim = wait_for(
            "its claim allocated", functools.partial(allocated, cp, ns, entry["resourceClaimName"]), 60
        )
        devices = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
        planned = [f"gpu-{g}" for g in p["metadata"]["annotations"]["gangslice.io/gpus"].split(",")]
        assert devices == sorted(planned), (pod_name(p), devices, planned)
        for d in devices:
            assert d not in held, f"{d} is held by the claims of {held[d]} and {pod_name(p)}"
            held[d] = pod_name(p)


def foreign_pod_on_gpu(cp: ControlPlane, ns: str, gpu: int) -> dict[str, Any]:
    """Someone else's pod holding one GPU through its own claim (no gang; the extender is not asked:
    the pod requests no nvidia.com/gpu)."""
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaims", uuid_claim(ns, "foreign", [gpu]))
    create(cp, dra_pod(ns, "foreign", claim={"resourceClaimName": "foreign"}))
    return wait_for("the foreign claim allocated", lambda: allocated(cp, ns, "foreign"), 60)


def test_a_tp4_pod_set_on_a_fragmented_pcie_node_gets_exactly_the_planned_devices(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    foreign = foreign_pod_on_gpu(cp, ns, 1)
    assert [r["device"] for r in foreign["status"]["allocation"]["devices"]["results"]] == ["gpu-1"]
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "tp4-gpus", 4))
    pod = dra_pod(
        ns,
        "tp4-0",
        claim={"resourceClaimTemplateName": "tp4-gpus"},
        labels={"gangslice.io/gang": "tp4"},
        **{"gangslice.io/gang-size": "1"},
    )
    created = create(cp, pod)
    # The webhook pointed the pod at its slot's claim and wrote the slot on it.
    (entry,) = created["spec"]["resourceClaims"]
    assert "resourceClaimTemplateName" not in entry, created["spec"]
    claim_name = entry["resourceClaimName"]
    ann = created["metadata"]["annotations"]
    planned = [int(g) for g in ann["gangslice.io/gpus"].split(",")]
    # GPU 1 is taken: the only coherent four left are the second socket's.
    assert planned == [4, 5, 6, 7], ann
    claim = wait_for("the slot's claim allocated", lambda: allocated(cp, ns, claim_name), 60)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == [f"gpu-{g}" for g in planned]
    assert {(r["driver"], r["pool"]) for r in results} == {(dra.GPU_DRIVER, NODE)}
    bound = wait_for(
        "tp4-0 bound", lambda: (get(cp, "Pod", "tp4-0", ns) or {}).get("spec", {}).get("nodeName"), 60
    )
    assert bound == NODE
    pod_uid = created["metadata"]["uid"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod_uid]
    owners = claim["metadata"]["ownerReferences"]
    assert [o["kind"] for o in owners] == ["SliceReservation"]
    # Deleting the gang deletes its claim: the reservation goes with the last pod, the garbage
    # collector takes the claim it owns.
    delete(cp, "Pod", "tp4-0", ns)
    wait_for("the slot's claim deleted", lambda: claim_of(cp, ns, claim_name) is None, 90)
    delete(cp, "Pod", "foreign", ns)


def test_the_allocator_leaves_a_pod_pending_when_its_pinned_device_is_taken(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """What kube-scheduler does with a claim pinned to a device another claim holds: the pod stays
    unschedulable (the allocator never picks another device: the selector admits none)."""
    cp = control_plane
    foreign_pod_on_gpu(cp, ns, 3)
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaims", uuid_claim(ns, "late", [2, 3]))
    create(cp, dra_pod(ns, "late", claim={"resourceClaimName": "late"}))

    def refused() -> dict[str, Any] | None:
        cond = scheduled_condition(get(cp, "Pod", "late", ns) or {})
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for("the pinned pod to be unschedulable", refused, 60)
    print(f"\nkube-scheduler on a pinned claim whose device is taken: {cond['reason']}: {cond['message']}")
    assert cond["reason"] == "Unschedulable"
    assert "claim" in cond["message"].lower() or "resource" in cond["message"].lower(), cond
    late = claim_of(cp, ns, "late")
    assert late is not None and not (late.get("status") or {}).get("allocation")
    assert get(cp, "Pod", "late", ns)["spec"].get("nodeName") is None  # type: ignore[index]
    delete(cp, "Pod", "late", ns)
    delete(cp, "Pod", "foreign", ns)


def test_a_foreign_claim_grabbing_a_planned_device_makes_gangslice_re_plan(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """The gang pod is held back by a scheduling gate after its admission (its claim exists, not yet
    allocated); another pod's claim takes one of its planned GPUs; gangslice re-plans and replaces the
    claim under the same name; once the gate is lifted, kube-scheduler allocates the new devices."""
    cp = control_plane
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "tp4-gpus", 4))
    pod = dra_pod(
        ns,
        "held-0",
        claim={"resourceClaimTemplateName": "tp4-gpus"},
        labels={"gangslice.io/gang": "held"},
        **{"gangslice.io/gang-size": "1"},
    )
    pod["spec"]["schedulingGates"] = [{"name": "e2e.gangslice.io/hold"}]
    created = create(cp, pod)
    claim_name = created["spec"]["resourceClaims"][0]["resourceClaimName"]
    planned = [int(g) for g in created["metadata"]["annotations"]["gangslice.io/gpus"].split(",")]
    victim = planned[1]
    foreign = foreign_pod_on_gpu(cp, ns, victim)
    assert [r["device"] for r in foreign["status"]["allocation"]["devices"]["results"]] == [f"gpu-{victim}"]

    def replaced() -> dict[str, Any] | None:
        claim = claim_of(cp, ns, claim_name)
        if claim is None:
            return None
        now = [int(g) for g in claim["metadata"]["annotations"]["gangslice.io/gpus"].split(",")]
        return claim if victim not in now else None

    claim = wait_for("the stale claim replaced by a re-plan", replaced, 60)
    now = [int(g) for g in claim["metadata"]["annotations"]["gangslice.io/gpus"].split(",")]
    told = wait_for(
        "the DeviceTaken event on the pod",
        lambda: [e for e in events_for(cp, ns, "held-0") if e["reason"] == "DeviceTaken"],
        30,
    )
    assert f"gpu-{victim}" in told[0]["message"] and f"{ns}/foreign" in told[0]["message"], told
    merge_patch(cp, "Pod", "held-0", {"spec": {"schedulingGates": None}}, ns)
    allocated_claim = wait_for("the new claim allocated", lambda: allocated(cp, ns, claim_name), 60)
    results = sorted(r["device"] for r in allocated_claim["status"]["allocation"]["devices"]["results"])
    assert results == sorted(f"gpu-{g}" for g in now) and f"gpu-{victim}" not in results
    delete(cp, "Pod", "held-0", ns)
    delete(cp, "Pod", "foreign", ns)
    wait_for("the gang's claim deleted", lambda: claim_of(cp, ns, claim_name) is None, 90)


def test_a_prefill_decode_pair_gets_disjoint_numa_aligned_halves_of_one_hgx_node(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    hgx = "dra-h0"
    merge_patch(cp, "Node", NODE, {"spec": {"unschedulable": True}})  # only the HGX node this time
    try:
        _dra_node(cp, hgx, "hgx-h100")
        post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "half", 4))
        pods = {}
        for role, other in (("prefill", "decode"), ("decode", "prefill")):
            ann = {"gangslice.io/gang-size": "2", "gangslice.io/pod-set-size": "1"}
            if role == "prefill":
                ann |= {"gangslice.io/colocate-with": f"{other}@node", "gangslice.io/comm": "kv-transfer"}
            pods[role] = dra_pod(
                ns,
                f"pd-{role}",
                claim={"resourceClaimTemplateName": "half"},
                labels={"gangslice.io/gang": "pd", "gangslice.io/pod-set": role},
                **ann,
            )
        # The first pod is refused until a pod of the other pod set was seen (a Job would retry).
        with pytest.raises(AssertionError, match="retry once a pod of every pod set was created"):
            create(cp, pods["prefill"])
        made = {"decode": create(cp, pods["decode"]), "prefill": create(cp, pods["prefill"])}
        numa = {g.index: g.numa_node for g in preset_graph("hgx-h100").gpus}
        halves = {}
        for role, pod in made.items():
            name = pod["spec"]["resourceClaims"][0]["resourceClaimName"]
            claim = wait_for(f"the {role} claim allocated", lambda n=name: allocated(cp, ns, n), 60)
            results = claim["status"]["allocation"]["devices"]["results"]
            assert {r["pool"] for r in results} == {hgx}
            halves[role] = {int(r["device"].removeprefix("gpu-")) for r in results}
            planned = {int(g) for g in pod["metadata"]["annotations"]["gangslice.io/gpus"].split(",")}
            assert halves[role] == planned
            assert len({numa[g] for g in planned}) == 1, (role, planned)
        assert not halves["prefill"] & halves["decode"] and len(halves["prefill"] | halves["decode"]) == 8
        for role in made:
            wait_for(
                f"pd-{role} bound",
                lambda r=role: (get(cp, "Pod", f"pd-{r}", ns) or {}).get("spec", {}).get("nodeName"),
                60,
            )
            delete(cp, "Pod", f"pd-{role}", ns)
    finally:
        merge_patch(cp, "Node", NODE, {"spec": {"unschedulable": False}})


def compute_domains(cp: ControlPlane, ns: str, want: int) -> list[dict[str, Any]]:
    """The namespace's ComputeDomains once there are ``want``: the claims controller makes them
    once the gangs' pods exist (the webhook writes nothing)."""

    def listed() -> list[dict[str, Any]] | None:
        path = f"/apis/resource.nvidia.com/v1beta1/namespaces/{ns}/computedomains"
        got: list[dict[str, Any]] = cp.request("GET", path)["items"]
        return got if len(got) == want else None

    found: list[dict[str, Any]] = wait_for(f"{want} ComputeDomains in {ns}", listed, 30)
    return found


def channel_allocated(cp: ControlPlane, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's IMEX channel claim, once kube-scheduler allocated it."""
    entries = {e["name"]: e["resourceClaimName"] for e in pod["spec"]["resourceClaims"]}
    got: dict[str, Any] = wait_for(
        f"the channel claim of {pod['metadata']['name']} allocated",
        lambda: allocated(cp, ns, entries["imex-channel"]),
        60,
    )
    return got


def test_a_wide_ep_gang_on_gb200_trays_gets_one_compute_domain_and_a_second_gang_never_shares_a_node(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    cp.install_crds(UPSTREAM / "resource.nvidia.com_computedomains.yaml")
    others = [
        n["metadata"]["name"] for n in items(cp, "Node") if not n["metadata"]["name"].startswith("dra-t")
    ]
    for other in others:  # only the GB200 trays this time
        merge_patch(cp, "Node", other, {"spec": {"unschedulable": True}})
    trays = [f"dra-t{i}" for i in range(4)]
    try:
        for tray in trays:
            _dra_node(cp, tray, "gb200-tray", labels={"nvidia.com/gpu.clique": "c0.1"})
            post(cp, f"{RESOURCE}/resourceslices", compute_domain_slice(tray))
        post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "tray-gpus", 4))

        def gang(name: str) -> list[dict[str, Any]]:
            ann = {
                "gangslice.io/gang-size": "2",
                "gangslice.io/required-level": "clique",
                "gangslice.io/comm": "alltoall",
            }
            return [
                create(
                    cp,
                    dra_pod(
                        ns,
                        f"{name}-{i}",
                        claim={"resourceClaimTemplateName": "tray-gpus"},
                        labels={"gangslice.io/gang": name},
                        **ann,
                    ),
                )
                for i in range(2)
            ]

        first, second = gang("ep"), gang("ep2")
        domains = compute_domains(cp, ns, 2)
        assert sorted(d["metadata"]["name"] for d in domains) == ["ep-imex", "ep2-imex"]
        uids = {d["metadata"]["name"]: d["metadata"]["uid"] for d in domains}
        placed: dict[str, set[str]] = {}
        for name, pods in (("ep", first), ("ep2", second)):
            for pod in pods:
                entries = {e["name"]: e["resourceClaimName"] for e in pod["spec"]["resourceClaims"]}
                channel = channel_allocated(cp, ns, pod)
                params = channel["spec"]["devices"]["config"][0]["opaque"]["parameters"]
                assert params["domainID"] == uids[f"{name}-imex"]
                (result,) = channel["status"]["allocation"]["devices"]["results"]
                assert result["driver"] == dra.COMPUTE_DOMAIN_DRIVER and result["device"] == "channel-0"
                gpus = wait_for("the GPU claim allocated", lambda c=entries["gpus"]: allocated(cp, ns, c), 60)
                pools = {r["pool"] for r in gpus["status"]["allocation"]["devices"]["results"]}
                assert pools == {result["pool"]}, (pools, result)  # channel and GPUs on one node
                placed.setdefault(name, set()).add(result["pool"])
        assert len(placed["ep"]) == 2 and len(placed["ep2"]) == 2
        assert not placed["ep"] & placed["ep2"], placed
        for pod in first + second:
            delete(cp, "Pod", pod["metadata"]["name"], ns)
    finally:
        for other in others:
            merge_patch(cp, "Node", other, {"spec": {"unschedulable": False}})


def _device_plugin_tray(cp: ControlPlane, name: str, labels: dict[str, str] | None = None) -> None:
    """A GB200 tray whose GPUs the device plugin hands out (``nvidia.com/gpu: 4``) while NVIDIA's
    DRA driver publishes only its ComputeDomain devices: NVIDIA's supported GB200 setup."""
    node, _ = _fake_node(
        cp, name, "gb200-tray", {"nvidia.com/gpu.clique": "c0.2", **(labels or {})}, device_plugin_gpus=4
    )
    slice_ = compute_domain_slice(name)
    slice_["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
    ]
    post(cp, f"{RESOURCE}/resourceslices", slice_)


def _node_of(cp: ControlPlane, ns: str, name: str) -> str | None:
    node = ((get(cp, "Pod", name, ns) or {}).get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _admitted(cp: ControlPlane, pod: dict[str, Any]) -> dict[str, Any] | None:
    """Create ``pod``; None while the webhook refuses it (gangslice's cache has not seen the
    nodes just added yet), as a controller retries."""
    try:
        return create(cp, pod)
    except AssertionError as exc:
        if "denied the request" not in str(exc):
            raise
        return None


def test_a_device_plugin_wide_ep_gang_on_gb200_trays_gets_a_compute_domain_and_a_channel_per_node(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """GPUs through the device plugin, ComputeDomains through the DRA driver: each pod of a gang
    that requires the clique is given, at its creation, its slot and that node's channel claim of
    the gang's ComputeDomain, and binds on that node with its channel allocated there."""
    cp = control_plane
    cp.install_crds(UPSTREAM / "resource.nvidia.com_computedomains.yaml")
    others = [n["metadata"]["name"] for n in items(cp, "Node")]
    for other in others:  # only these trays this time
        merge_patch(cp, "Node", other, {"spec": {"unschedulable": True}})
    # The setup NVIDIA supports runs the DRA driver with its GPU part off: no gpu.nvidia.com
    # DeviceClass (whose extendedResourceName would hand nvidia.com/gpu to DRA).
    (gpu_class,) = [c for c in device_classes(UPSTREAM) if c["metadata"]["name"] == dra.GPU_DEVICE_CLASS]
    cp.request("DELETE", f"{RESOURCE}/deviceclasses/{dra.GPU_DEVICE_CLASS}")
    trays = [f"dra-dp{i}" for i in range(3)]
    try:
        for tray in trays:
            _device_plugin_tray(cp, tray)
        ann = {
            "gangslice.io/gang-size": "2",
            "gangslice.io/required-level": "clique",
            "gangslice.io/comm": "alltoall",
        }
        pods = []
        for i in range(2):
            pod = gpu_pod(f"dp-{i}", 4, POOL_NAME, labels={"gangslice.io/gang": "dp"}, annotations=ann)
            pod["metadata"]["namespace"] = ns
            pod["spec"]["tolerations"] = [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ]
            pods.append(
                wait_for(f"{pod['metadata']['name']} admitted", functools.partial(_admitted, cp, pod), 30)
            )
        (domain,) = compute_domains(cp, ns, 1)
        used = set()
        for pod in pods:
            slot_key = pod["metadata"]["annotations"]["gangslice.io/slot"]
            channel = channel_allocated(cp, ns, pod)
            params = channel["spec"]["devices"]["config"][0]["opaque"]["parameters"]
            assert params["domainID"] == domain["metadata"]["uid"], params
            (result,) = channel["status"]["allocation"]["devices"]["results"]
            node = wait_for(
                f"{pod['metadata']['name']} bound",
                functools.partial(_node_of, cp, ns, pod["metadata"]["name"]),
                60,
            )
            assert result["pool"] == node and node in trays, (slot_key, result, node)
            used.add(node)
        assert len(used) == 2
        for pod in pods:
            delete(cp, "Pod", pod["metadata"]["name"], ns)
    finally:
        for other in others:
            merge_patch(cp, "Node", other, {"spec": {"unschedulable": False}})
        for tray in trays:
            remove_node(cp, tray)
        post(cp, f"{RESOURCE}/deviceclasses", gpu_class)


def test_a_gb200_tray_in_a_compute_domain_gangslice_did_not_create_is_not_given_to_a_gang(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    """NVIDIA's driver labels a node with the ComputeDomain it belongs to and refuses a second;
    gangslice reads the label from the Node and keeps a wide gang off that tray (which the
    tie-break order would have taken first)."""
    cp = control_plane
    cp.install_crds(UPSTREAM / "resource.nvidia.com_computedomains.yaml")
    trays = [f"dra-u{i}" for i in range(3)]
    others = [n["metadata"]["name"] for n in items(cp, "Node") if n["metadata"]["name"] not in trays]
    for other in others:
        merge_patch(cp, "Node", other, {"spec": {"unschedulable": True}})
    try:
        for tray in trays:
            labels = {"nvidia.com/gpu.clique": "c0.2"}
            if tray == trays[0]:
                labels["resource.nvidia.com/computeDomain"] = "0d1c5a4e-foreign-domain"
            _dra_node(cp, tray, "gb200-tray", labels=labels)
            post(cp, f"{RESOURCE}/resourceslices", compute_domain_slice(tray))
        post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "u-gpus", 4))
        ann = {
            "gangslice.io/gang-size": "2",
            "gangslice.io/required-level": "clique",
            "gangslice.io/comm": "alltoall",
        }
        pods = [
            create(
                cp,
                dra_pod(
                    ns,
                    f"wide-{i}",
                    claim={"resourceClaimTemplateName": "u-gpus"},
                    labels={"gangslice.io/gang": "wide"},
                    **ann,
                ),
            )
            for i in range(2)
        ]
        pools = set()
        for pod in pods:
            channel = channel_allocated(cp, ns, pod)
            (result,) = channel["status"]["allocation"]["devices"]["results"]
            pools.add(result["pool"])
        assert pools == set(trays[1:]), pools
        for pod in pods:
            delete(cp, "Pod", pod["metadata"]["name"], ns)
    finally:
        for other in others:
            merge_patch(cp, "Node", other, {"spec": {"unschedulable": False}})


# -- a Kueue-admitted gang -----------------------------------------------------------------------
KUEUE_FLAVOR = "dra-default"
KUEUE_CQ = "dra-cq"
KUEUE_LQ = "gpu"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"


@pytest.fixture
def kueue(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[Gangslice]:
    """Kueue's manager on this control plane (started as tests/e2e/test_kueue.py starts it) and the
    module's ``gangslice serve`` restarted with its controller (the Kueue admission check), a
    ClusterQueue whose check is gangslice's; the plain stack again after."""
    cp = control_plane
    # Kueue counts DRA devices in quota only through a mapping of their DeviceClass to a resource.
    mapping = {"name": "nvidia.com/gpu", "deviceClassNames": [dra.GPU_DEVICE_CLASS]}
    crds = start_kueue(cp, resources={"deviceClassMappings": [mapping]})
    gangslice.stop()
    gangslice.controller = True
    kueue_objects = [
        (
            "resourceflavors",
            {"metadata": {"name": KUEUE_FLAVOR}, "spec": {"nodeLabels": {POOL_LABEL: POOL_NAME}}},
        ),
        (
            "admissionchecks",
            {"metadata": {"name": CHECK}, "spec": {"controllerName": "gangslice.io/topology"}},
        ),
        (
            "clusterqueues",
            {
                "metadata": {"name": KUEUE_CQ},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": KUEUE_FLAVOR,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "100"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": "64"},
                                    ],
                                }
                            ],
                        }
                    ],
                    "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK}]},
                },
            },
        ),
    ]
    try:
        gangslice.start()
        wait_for("gangslice to lead", lambda: leading(gangslice), 60, 0.5)
        for plural, body in kueue_objects:
            kind = {"resourceflavors": "ResourceFlavor", "admissionchecks": "AdmissionCheck"}.get(
                plural, "ClusterQueue"
            )
            post(
                cp,
                f"/apis/kueue.x-k8s.io/v1beta2/{plural}",
                {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, **body},
            )

        def active(kind: str, name: str) -> bool:
            conds = ((get(cp, kind, name) or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

        wait_for("our AdmissionCheck Active", lambda: active("AdmissionCheck", CHECK), 60)
        wait_for("the ClusterQueue Active", lambda: active("ClusterQueue", KUEUE_CQ), 60)
        yield gangslice
    finally:
        gangslice.stop()
        gangslice.controller = False
        for plural, body in reversed(kueue_objects):
            path = f"/apis/kueue.x-k8s.io/v1beta2/{plural}/{body['metadata']['name']}"
            with contextlib.suppress(urllib.error.HTTPError):
                cp.request("DELETE", path)
            # Kueue lifts its finalizer once nothing uses the object; then its CRD can go.
            wait_for(f"{path} deleted", lambda p=path: _gone(cp, p), 60)
        stop_kueue(cp)
        remove_crds(cp, crds)
        gangslice.start()


def _gone(cp: ControlPlane, path: str) -> bool:
    try:
        cp.request("GET", path)
    except urllib.error.HTTPError as e:
        return e.code == 404
    return False


def test_a_kueue_admitted_gangs_pods_reference_their_slots_claims_and_get_exactly_the_slots_devices(
    control_plane: ControlPlane, kueue: Gangslice, ns: str
) -> None:
    """A Workload whose pods ask for 4 GPUs each through a ResourceClaimTemplate: gangslice's check
    reserves the pair (the reservation exists before any pod) and labels the pod set for the webhook;
    playing the Job controller, the test creates the pods with the check's podSetUpdates; the webhook
    (its failurePolicy Fail entry, by the label) points each at its slot's claim and kube-scheduler's
    DynamicResources plugin allocates exactly the slot's devices."""
    cp = control_plane
    post(
        cp,
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + ns + "/localqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": KUEUE_LQ, "namespace": ns},
            "spec": {"clusterQueue": KUEUE_CQ},
        },
    )
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "tp4-gpus", 4))
    pod_template = dra_pod(ns, "x", claim={"resourceClaimTemplateName": "tp4-gpus"})
    pod_template.pop("apiVersion")
    pod_template.pop("kind")
    pod_template["metadata"] = {}
    pod_template["spec"]["restartPolicy"] = "Never"
    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "job-tp4", "namespace": ns},
        "spec": {"queueName": KUEUE_LQ, "podSets": [{"name": "main", "count": 2, "template": pod_template}]},
    }
    post(cp, f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads", wl)

    def admitted() -> dict[str, Any] | None:
        got = get(cp, "Workload", "job-tp4", ns)
        return got if kueue_is_true(got, "Admitted") else None

    ready = our_check(wait_for("Kueue to admit the Workload once our check is Ready", admitted, 90))
    assert ready and ready["state"] == "Ready", ready
    (update,) = ready["podSetUpdates"]
    assert update["labels"] == {"gangslice.io/managed": "true"}, update
    (reservation,) = items(cp, "SliceReservation", ns)
    planned = {s["name"]: s for s in reservation["status"]["slots"]}
    assert sorted(planned) == ["main/0", "main/1"], planned

    pods = []
    for i in range(2):
        pod = copy.deepcopy(pod_template)
        pod["apiVersion"], pod["kind"] = "v1", "Pod"
        pod["metadata"] = {
            "name": f"tp4-{i}",
            "namespace": ns,
            "labels": {**update["labels"], "kueue.x-k8s.io/podset": "main", JOB_INDEX: str(i)},
            "annotations": dict(update["annotations"]),
        }
        pod["spec"]["nodeSelector"].update(update.get("nodeSelector") or {})
        pods.append(create(cp, pod))
    for i, created in enumerate(pods):
        ann = created["metadata"]["annotations"]
        slot = planned[f"main/{i}"]  # the completion index picks the slot
        assert ann["gangslice.io/slot"] == f"main/{i}", ann
        (entry,) = created["spec"]["resourceClaims"]
        assert entry["resourceClaimName"] == slot["claim"], (entry, slot)
        claim = wait_for(f"the claim of tp4-{i} allocated", lambda c=slot["claim"]: allocated(cp, ns, c), 60)
        results = claim["status"]["allocation"]["devices"]["results"]
        gpus = [int(g) for g in ann["gangslice.io/gpus"].split(",")]
        assert sorted(r["device"] for r in results) == sorted(f"gpu-{g}" for g in gpus), results
        assert {r["pool"] for r in results} == {slot["node"]}, (results, slot)
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [created["metadata"]["uid"]]
        assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == [reservation["metadata"]["name"]]
        bound = wait_for(
            f"tp4-{i} bound",
            lambda n=f"tp4-{i}": (get(cp, "Pod", n, ns) or {}).get("spec", {}).get("nodeName"),
            60,
        )
        assert bound == slot["node"]
    assert len(items(cp, "SliceReservation", ns)) == 1  # the webhook reserved nothing of its own
    for i in range(2):
        delete(cp, "Pod", f"tp4-{i}", ns)


# -- a Volcano gang --------------------------------------------------------------------------------
@pytest.fixture
def podgroup_controller(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[Gangslice]:
    """Volcano's CRDs and the module's ``gangslice serve`` restarted with its controller (the PodGroup
    controller, looking again every second); no Volcano component runs: the test plays its job
    controller. The plain stack again after."""
    cp = control_plane
    crds = cp.install_crds(cp.crd_dir / "volcano")
    gangslice.stop()
    plain_args = gangslice.extra_args
    gangslice.controller, gangslice.extra_args = True, (*plain_args, "--resync=1")
    try:
        gangslice.start()
        wait_for("gangslice to lead", lambda: leading(gangslice), 60, 0.5)
        yield gangslice
    finally:
        gangslice.stop()
        gangslice.controller, gangslice.extra_args = False, plain_args
        # The PodGroups first (the CRDs' deletion then has no instances to clean up), and time
        # for the API server's CRD finalizer on a loaded machine.
        for pg in cp.request("GET", "/apis/scheduling.volcano.sh/v1beta1/podgroups")["items"]:
            meta = pg["metadata"]
            with contextlib.suppress(urllib.error.HTTPError):
                delete(cp, "PodGroup", meta["name"], meta["namespace"])
        remove_crds(cp, crds)
        gangslice.start()


def test_a_volcano_gangs_members_refused_until_its_slice_is_reserved_are_pinned_on_retry(
    control_plane: ControlPlane, podgroup_controller: Gangslice, ns: str
) -> None:
    """Volcano reserves a PodGroup's slice from its member pods, which exist only once created; the
    webhook refuses a member whose group has no slice yet and counts it, the PodGroup controller
    reserves once ``minMember`` were seen, and the retried creations are pinned, each to its own slot.
    (Who allocates the claims is Volcano's scheduler, which this test does not run.)"""
    cp = control_plane
    post(cp, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", template(ns, "tp4-gpus", 4))
    create(
        cp,
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "tp4", "namespace": ns},
            "spec": {"minMember": 2},
        },
    )
    pods = []
    for i in range(2):
        pod = dra_pod(
            ns,
            f"tp4-worker-{i}",
            claim={"resourceClaimTemplateName": "tp4-gpus"},
            labels={"gangslice.io/managed": "true"},
            **{"scheduling.k8s.io/group-name": "tp4", "volcano.sh/task-spec": "worker"},
        )
        pod["spec"]["schedulerName"] = "volcano"
        pods.append(pod)
    for pod in pods:
        with pytest.raises(AssertionError) as refused:
            create(cp, pod)
        assert f"PodGroup {ns}/tp4 has no slice reserved yet" in str(refused.value), refused.value

    def admitted(pod: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return create(cp, pod)
        except AssertionError as e:
            if "has no slice reserved yet" in str(e):
                return None
            raise

    created = [wait_for(f"{p['metadata']['name']} admitted", lambda p=p: admitted(p), 60, 1.0) for p in pods]
    (reservation,) = items(cp, "SliceReservation", ns)
    assert [o["kind"] for o in reservation["metadata"]["ownerReferences"]] == ["PodGroup"]
    slots = {s["name"]: s for s in reservation["status"]["slots"]}
    given = [c["metadata"]["annotations"]["gangslice.io/slot"] for c in created]
    assert sorted(given) == sorted(slots), (given, slots)
    for obj in created:
        ann = obj["metadata"]["annotations"]
        slot = slots[ann["gangslice.io/slot"]]
        (entry,) = obj["spec"]["resourceClaims"]
        assert entry["resourceClaimName"] == slot["claim"], (entry, slot)
        claim = claim_of(cp, ns, slot["claim"])
        assert claim is not None
        gpus = [int(g) for g in ann["gangslice.io/gpus"].split(",")]
        expr = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        assert sorted(u for u in expr.split('"') if u.startswith("GPU-")) == sorted(
            gpu_uuid(slot["node"], g) for g in gpus
        ), expr
        assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == [reservation["metadata"]["name"]]
    for obj in created:
        delete(cp, "Pod", obj["metadata"]["name"], ns)


def test_with_gangslice_down_gang_pods_are_refused_naming_it_and_other_pods_pass(
    control_plane: ControlPlane, gangslice: Gangslice, ns: str
) -> None:
    cp = control_plane
    gangslice.stop()
    try:
        gang = dra_pod(ns, "g-0", claim={"resourceClaimTemplateName": "x"}, labels={"gangslice.io/gang": "g"})
        with pytest.raises(AssertionError) as refused:
            create(cp, gang)
        assert "pin-gang-pods.gangslice.io" in str(refused.value), refused.value
        # A pod gangslice's Kueue check labelled (or a Volcano task labelled by hand) is refused too.
        managed = copy.deepcopy(gang)
        managed["metadata"] = {"name": "m-0", "namespace": ns, "labels": {"gangslice.io/managed": "true"}}
        with pytest.raises(AssertionError) as refused:
            create(cp, managed)
        assert "pin-managed-pods.gangslice.io" in str(refused.value), refused.value
        other = copy.deepcopy(gang)
        other["metadata"] = {"name": "solo", "namespace": ns}
        other["spec"]["resourceClaims"] = []
        other["spec"]["containers"][0]["resources"].pop("claims")
        assert create(cp, other)["metadata"]["name"] == "solo"  # failurePolicy Ignore
    finally:
        gangslice.start()
