"""Per-slot ResourceClaims on DRA nodes: the claim builder, slot matching at pod creation, and
the mutating admission webhook that points a gang pod at its slot's claim."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.controllers.claims.make import PodClaims
from extender.httpapi.access import Access
from extender.httpapi.app import build_app
from extender.kube import dra, names
from extender.kube.api import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, SLICE_RESERVATIONS, Kind
from extender.kube.crd_models import claim_name
from extender.kube.pods import PodInfo
from extender.kube.slot_claims import (
    GpuRequest,
    SlotError,
    build_claim,
    gpu_request_of,
    handed_out,
    pick_slot,
    uuid_selector,
)
from extender.placement.ledger import Phase, Reservation
from extender.placement.slice import PodSlot, Slice
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.dra import (
    device_classes,
    gpu_slice,
    gpu_uuid,
    nic_class,
    nic_slice,
    pcie_root,
    with_identities,
)
from extender.testing.extender import node_obj
from extender.testing.kube import FakeKube
from extender.testing.objects import make_node_topology, make_pod, make_replica_set
from extender.topology.presets import preset_graph

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream" / "nvidia-dra"


def slot(pod_set: str, index: int, gpus: tuple[int, ...], node: str = "p0") -> PodSlot:
    return PodSlot(pod_set=pod_set, index=index, node=node, gpus=gpus)


def reservation(*slots: PodSlot) -> Reservation:
    return Reservation(
        "llm/tp4", Slice("llm/tp4", tuple(slots), {}), 1e12, {}, Phase.RESERVED, {"name": "tp4"}
    )


def template(count: int = 4, cls: str = dra.GPU_DEVICE_CLASS, mode: str = "ExactCount") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpus", "namespace": "llm"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": cls, "allocationMode": mode, "count": count},
                        }
                    ],
                    "config": [{"requests": ["gpu"], "opaque": {"driver": dra.GPU_DRIVER, "parameters": {}}}],
                }
            }
        },
    }


def devices(node: str, gpus: tuple[int, ...]) -> list[dra.Device]:
    graph = with_identities(node, preset_graph("pcie-8gpu-2socket"))
    info = dra.parse_slice(gpu_slice(node, graph))
    assert info is not None
    by_name = {d.name: d for d in info.devices}
    return [by_name[f"gpu-{g}"] for g in gpus]


# -- the claim ---------------------------------------------------------------------------------
def test_the_claim_pins_the_slot_uuids_with_count_and_keeps_the_template_config() -> None:
    s = slot("worker", 1, (4, 5, 6, 7))
    devs = devices("p0", s.gpus)
    claim = build_claim(
        namespace="llm",
        name=claim_name("tp4", s),
        template=template(),
        request=GpuRequest("gpu", dra.GPU_DEVICE_CLASS, 4),
        slot=s,
        devices=devs,
        reservation={"name": "tp4", "uid": "u-1", "gang": "tp4"},
    )
    assert claim["metadata"]["name"] == "tp4-worker-1"
    (req,) = claim["spec"]["devices"]["requests"]
    assert req["exactly"]["count"] == 4 and req["exactly"]["allocationMode"] == "ExactCount"
    (sel,) = req["exactly"]["selectors"]
    expr = sel["cel"]["expression"]
    assert expr == uuid_selector([gpu_uuid("p0", g) for g in (4, 5, 6, 7)])
    assert all(gpu_uuid("p0", g) in expr for g in (4, 5, 6, 7)) and gpu_uuid("p0", 3) not in expr
    # GPUs 4-7 sit under one socket's root complex: the safety net holds and is added.
    assert claim["spec"]["devices"]["constraints"] == [{"requests": ["gpu"], "matchAttribute": dra.PCIE_ROOT}]
    assert claim["spec"]["devices"]["config"] == template()["spec"]["spec"]["devices"]["config"]
    (owner,) = claim["metadata"]["ownerReferences"]
    assert owner["kind"] == "SliceReservation" and owner["uid"] == "u-1"
    assert claim["metadata"]["labels"][names.SLOT] == "worker-1"


def claim_of_slot(s: PodSlot) -> dict[str, Any]:
    """The claim of ``s`` on node p0 for a request of 4 GPUs of NVIDIA's class."""
    return build_claim(
        namespace="llm",
        name="x",
        template=template(),
        request=GpuRequest("gpu", dra.GPU_DEVICE_CLASS, 4),
        slot=s,
        devices=devices("p0", s.gpus),
        reservation={"name": "tp4", "uid": "u"},
    )


def test_no_pcie_root_constraint_where_the_slot_spans_two_roots() -> None:
    claim = claim_of_slot(slot("tp", 0, (2, 3, 4, 5)))
    assert "constraints" not in claim["spec"]["devices"]


def test_a_nic_request_prefers_the_gpus_pcie_root_where_the_node_has_enough_nics_there() -> None:
    """A template that asks for GPUs and RDMA NICs gets the NICs beside the slot's GPUs where
    they are free: the NIC request becomes two alternatives (``firstAvailable``), the first
    joining the GPUs' matchAttribute on the PCIe root, the second the request as written, so
    a root whose NICs are taken still leaves a NIC elsewhere. Where the node has too few NICs
    of the class on that root, the request is left as written."""
    s = slot("worker", 0, (4, 5, 6, 7))
    devs = devices("p0", s.gpus)
    asked: list[tuple[str, str]] = []

    def claim(nics_on_root: int, **nic: Any) -> dict[str, Any]:
        t = template()
        t["spec"]["spec"]["devices"]["requests"].append({"name": "nic", "exactly": nic})

        def at_root(cls: str, root: str) -> int:
            asked.append((cls, root))
            return nics_on_root

        got = build_claim(
            namespace="llm",
            name="x",
            template=t,
            request=GpuRequest("gpu", dra.GPU_DEVICE_CLASS, 4),
            slot=s,
            devices=devs,
            reservation={"name": "tp4", "uid": "u"},
            at_root=at_root,
        )
        return dict(got["spec"]["devices"])

    nic = {"deviceClassName": "rdma-nic", "count": 1, "selectors": [{"cel": {"expression": "true"}}]}
    joined = [{"requests": ["gpu", "nic/beside"], "matchAttribute": dra.PCIE_ROOT}]
    alone = [{"requests": ["gpu"], "matchAttribute": dra.PCIE_ROOT}]
    got = claim(1, **nic)
    assert got["constraints"] == joined
    assert got["requests"][1] == {
        "name": "nic",
        "firstAvailable": [{"name": "beside", **nic}, {"name": "anywhere", **nic}],
    }
    assert asked == [("rdma-nic", devs[0].pcie_root)]
    assert claim(2, **{**nic, "count": 2})["constraints"] == joined
    for written, nics_on_root in (
        (nic, 0),
        ({**nic, "count": 2}, 1),  # one NIC there, two asked
        ({**nic, "allocationMode": "All"}, 4),
        ({**nic, "adminAccess": True}, 4),  # a subrequest cannot carry admin access
    ):
        got = claim(nics_on_root, **written)
        assert got["constraints"] == alone and got["requests"][1] == {"name": "nic", "exactly": written}


def test_the_cache_counts_a_device_classs_devices_on_a_pcie_root() -> None:
    api = FakeKube()
    cache = pcie_cache(api)
    graph = with_identities(NODE, preset_graph("pcie-8gpu-2socket"))
    assert cache.at_root(NODE, "rdma-nic", pcie_root(1)) == 0  # no NIC published yet
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", nic_slice(NODE, graph))
    cache.apply(Kind.DEVICE_CLASSES, "ADDED", nic_class("rdma-nic"))
    assert cache.at_root(NODE, "rdma-nic", pcie_root(0)) == cache.at_root(NODE, "rdma-nic", pcie_root(1)) == 1
    assert cache.at_root(NODE, "rdma-nic", "pci0000:40") == 0
    assert cache.at_root("p1", "rdma-nic", pcie_root(1)) == 0
    assert cache.at_root(NODE, dra.GPU_DEVICE_CLASS, pcie_root(1)) == 0  # the GPUs themselves do not count
    assert cache.at_root(NODE, "no-such-class", pcie_root(1)) == 0
    # A newer generation of the pool without the socket-1 NIC: only the newest counts.
    one = nic_slice(NODE, graph, generation=2)
    one["spec"]["devices"] = one["spec"]["devices"][:1]
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", one)
    assert (
        cache.at_root(NODE, "rdma-nic", pcie_root(0)) == 1
        and cache.at_root(NODE, "rdma-nic", pcie_root(1)) == 0
    )


def test_the_webhook_pins_a_dra_gang_pods_nic_beside_its_gpus(world: tuple[FakeKube, ClusterCache]) -> None:
    api, cache = world
    graph = with_identities(NODE, preset_graph("pcie-8gpu-2socket"))
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", nic_slice(NODE, graph))
    cache.apply(Kind.DEVICE_CLASSES, "ADDED", nic_class("rdma-nic"))
    t = template(4)
    t["spec"]["spec"]["devices"]["requests"].append(
        {"name": "nic", "exactly": {"deviceClassName": "rdma-nic", "count": 1}}
    )
    api.put(RESOURCE_CLAIM_TEMPLATES, t)
    first, second = dra_pod("tp4-0"), dra_pod("tp4-1")
    a, b = admit(api, cache, first, second)
    assert a["allowed"] and b["allowed"], (a, b)
    claims = api.objects(RESOURCE_CLAIMS)
    assert len(claims) == 2
    for c in claims:
        assert c["spec"]["devices"]["constraints"] == [
            {"requests": ["gpu", "nic/beside"], "matchAttribute": dra.PCIE_ROOT}
        ], c["spec"]["devices"]


def test_a_device_count_that_differs_from_the_request_is_refused() -> None:
    with pytest.raises(SlotError, match="asks for 4"):
        claim_of_slot(slot("tp", 0, (0, 1)))


def test_gpu_requests_are_recognised_by_class_driver() -> None:
    drivers = {"gpu.nvidia.com": frozenset({dra.GPU_DRIVER}), "my-gpus": frozenset({dra.GPU_DRIVER})}
    assert gpu_request_of(template(2), drivers.get) == GpuRequest("gpu", "gpu.nvidia.com", 2)
    assert gpu_request_of(template(2, "my-gpus"), drivers.get) == GpuRequest("gpu", "my-gpus", 2)
    assert gpu_request_of(template(2, "nic.example.com"), drivers.get) is None
    with pytest.raises(SlotError, match="ExactCount"):
        gpu_request_of(template(2, mode="All"), drivers.get)


# -- slot matching -----------------------------------------------------------------------------
def gang_pod(name: str, **labels: str) -> PodInfo:
    return PodInfo(
        namespace="llm",
        name=name,
        gpus=4,
        labels={names.GANG: "tp4", **labels},
        annotations={names.GANG_SIZE: "2"},
    )


def test_an_indexed_pod_gets_the_slot_of_its_index_and_keeps_it_on_replacement() -> None:
    r = reservation(slot("pod", 0, (0, 1, 2, 3)), slot("pod", 1, (4, 5, 6, 7)))
    second = gang_pod("job-1-abc", **{"batch.kubernetes.io/job-completion-index": "1"})
    assert pick_slot(r, second, {}).key == "pod/1"
    # The pod of index 0 is still alive: a second pod asking for index 0 is refused.
    other = gang_pod("job-0-new", **{"batch.kubernetes.io/job-completion-index": "0"})
    with pytest.raises(SlotError, match="held by pod job-0-old"):
        pick_slot(r, other, {"pod/0": "job-0-old"})
    assert pick_slot(r, other, {}).key == "pod/0"


def test_an_unindexed_pod_takes_the_first_slot_not_handed_out() -> None:
    r = reservation(slot("pod", 0, (0, 1, 2, 3)), slot("pod", 1, (4, 5, 6, 7)))
    assert pick_slot(r, gang_pod("a"), {}).key == "pod/0"
    assert pick_slot(r, gang_pod("b"), {"pod/0": "a"}).key == "pod/1"
    assert pick_slot(r, gang_pod("a"), {"pod/0": "a"}).key == "pod/0"  # a retried admission
    with pytest.raises(SlotError, match="every slot"):
        pick_slot(r, gang_pod("c"), {"pod/0": "a", "pod/1": "b"})


def test_a_pod_set_gets_only_its_own_slots() -> None:
    r = reservation(slot("prefill", 0, (0, 1, 2, 3)), slot("decode", 0, (4, 5, 6, 7)))
    pod = PodInfo(namespace="llm", name="d", gpus=4, labels={names.GANG: "pd", names.POD_SET: "decode"})
    assert pick_slot(r, pod, {}).key == "decode/0"


def test_handed_out_slots_are_read_back_from_live_pods() -> None:
    alive = PodInfo(namespace="llm", name="a", annotations={names.SLOT: "pod/0"})
    done = PodInfo(namespace="llm", name="b", phase="Failed", annotations={names.SLOT: "pod/1"})
    assert handed_out([alive, done]) == {"pod/0": "a"}


# -- the webhook -------------------------------------------------------------------------------
NODE = "p0"


def pcie_cache(api: FakeKube) -> ClusterCache:
    """A cache over one DRA PCIe node (the pods and reservations as ``api`` holds them)."""
    cache = ClusterCache(store=KubeReservationStore(api))
    for kind in Kind:
        cache.replace(
            kind, api.objects(kind.resource) if kind in (Kind.PODS, Kind.SLICE_RESERVATIONS) else []
        )
    graph = with_identities(NODE, preset_graph("pcie-8gpu-2socket"))
    cache.apply(Kind.NODES, "ADDED", node_obj(NODE, gpus=0))
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(NODE).graph(graph).obj())
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", gpu_slice(NODE, graph))
    cache.replace(Kind.DEVICE_CLASSES, device_classes(FIXTURES))
    return cache


@pytest.fixture
def world() -> Iterator[tuple[FakeKube, ClusterCache]]:
    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, template(4))
    yield api, cache


def review(pod: dict[str, Any], uid: str = "r-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "llm",
            "object": pod,
        },
    }


def dra_pod(name: str, gang: str | None = "tp4", size: int = 2) -> dict[str, Any]:
    labels = {names.GANG: gang} if gang else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": {names.GANG_SIZE: str(size)}},
        "spec": {
            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpus"}],
        },
    }


def admit(
    api: FakeKube,
    cache: ClusterCache,
    *pods: dict[str, Any],
    create: bool = True,
    authenticated: bool = True,
) -> list[dict[str, Any]]:
    """The webhook's responses to the pods' reviews, one after the other. ``create``: each pod
    allowed is then created as the API server would (patched, seen on the watch) and the claims
    controller reacts to it. ``authenticated``: kube-apiserver presents its certificate
    (``serve --admission-client-names``), as in the e2e tier."""
    access = Access(admission_names=frozenset({"kube-apiserver"})) if authenticated else None

    async def run() -> list[dict[str, Any]]:
        app = build_app(cache, api=api, access=access)
        claims = PodClaims(api, cache)
        async with TestClient(TestServer(app)) as client:
            out = []
            for i, pod in enumerate(pods):
                resp = await client.post("/admission/pods", json=review(pod, f"r-{i}"))
                assert resp.status == 200
                response = (await resp.json())["response"]
                out.append(response)
                if create and response["allowed"]:
                    obj = patched(pod, response) if "patch" in response else json.loads(json.dumps(pod))
                    obj["metadata"].setdefault("namespace", "llm")
                    obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
                    cache.apply(Kind.PODS, "ADDED", obj)
                    await claims.on_pod("ADDED", obj)
            return out

    return asyncio.run(run())


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """Apply the JSONPatch of a response (the ops the webhook uses: add, append, replace)."""
    out = json.loads(json.dumps(pod))
    for op in json.loads(base64.b64decode(response.get("patch") or "W10=")):
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        if isinstance(target, list) and last == "-":
            target.append(op["value"])
        elif isinstance(target, list):
            target[int(last)] = op["value"]
        else:
            target[last] = op["value"]
    return out


def test_the_webhook_reserves_the_gang_creates_one_claim_per_slot_and_points_each_pod_at_its_own(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    api, cache = world
    first, second = dra_pod("tp4-0"), dra_pod("tp4-1")
    a, b = admit(api, cache, first, second)
    assert a["allowed"] and b["allowed"], (a, b)
    pods = [patched(first, a), patched(second, b)]
    claims = {c["metadata"]["name"]: c for c in api.objects(RESOURCE_CLAIMS)}
    assert set(claims) == {p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in pods}
    assert len(claims) == 2
    assert all("resourceClaimTemplateName" not in p["spec"]["resourceClaims"][0] for p in pods)
    r = cache.reservation("llm/tp4")
    assert r is not None
    for p in pods:
        ann = p["metadata"]["annotations"]
        got = r.slice.slot(ann[names.SLOT])
        assert ann[names.GPUS] == ",".join(map(str, got.gpus))
        assert ann[names.CLAIM_GPUS] == "4"
        claim = claims[p["spec"]["resourceClaims"][0]["resourceClaimName"]]
        expr = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        assert expr == uuid_selector([gpu_uuid(NODE, g) for g in got.gpus])
        assert claim["metadata"]["ownerReferences"][0]["name"] == r.meta["name"]
    # Disjoint slots, each coherent (TP=4 stays under one socket on the PCIe box).
    sets = [set(map(int, p["metadata"]["annotations"][names.GPUS].split(","))) for p in pods]
    assert not sets[0] & sets[1]
    assert PodInfo.from_obj({**pods[0], "metadata": {**pods[0]["metadata"], "namespace": "llm"}}).gpus == 4
    # The SliceReservation's status names each slot's claim (kubectl get -o yaml shows it).
    (saved,) = api.objects("slicereservations")
    assert {x["name"]: x.get("claim") for x in saved["status"]["slots"]} == {
        p["metadata"]["annotations"][names.SLOT]: p["spec"]["resourceClaims"][0]["resourceClaimName"]
        for p in pods
    }


def test_pods_outside_gangs_and_without_gpu_claims_pass_unchanged(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    api, cache = world
    plain = dra_pod("solo", gang=None)
    cpu_only = {**dra_pod("cpu"), "spec": {"containers": [{"name": "m", "image": "x"}]}}
    got = admit(api, cache, plain, cpu_only)
    assert all(r["allowed"] and "patch" not in r for r in got)
    assert api.objects(RESOURCE_CLAIMS) == []


def test_a_gang_that_cannot_fit_is_refused_naming_gangslice(world: tuple[FakeKube, ClusterCache]) -> None:
    api, cache = world
    (r,) = admit(api, cache, dra_pod("big-0", size=3))
    assert not r["allowed"]
    assert r["status"]["message"].startswith("gangslice: gang llm/tp4")
    assert api.objects(RESOURCE_CLAIMS) == []


def test_a_missing_template_is_refused_with_its_name(world: tuple[FakeKube, ClusterCache]) -> None:
    api, cache = world
    pod = dra_pod("tp4-0")
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "nope"
    (r,) = admit(api, cache, pod)
    assert not r["allowed"] and "ResourceClaimTemplate llm/nope does not exist" in r["status"]["message"]


# -- the examples -------------------------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s" / "dra"


def example_world(preset: str, node: str, files: str) -> tuple[FakeKube, ClusterCache, list[dict[str, Any]]]:
    """A DRA node of ``preset`` and the example's templates; returns its Jobs' first pods (index 0)."""
    import yaml

    api = FakeKube()
    cache = ClusterCache(store=KubeReservationStore(api))
    for kind in Kind:
        cache.replace(kind, [])
    graph = with_identities(node, preset_graph(preset))
    cache.apply(Kind.NODES, "ADDED", node_obj(node, gpus=0))
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(node).graph(graph).obj())
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", gpu_slice(node, graph))
    cache.replace(Kind.DEVICE_CLASSES, device_classes(FIXTURES))
    pods = []
    for doc in yaml.safe_load_all((EXAMPLES / files).read_text()):
        if doc["kind"] == "ResourceClaimTemplate":
            api.put(RESOURCE_CLAIM_TEMPLATES, {**doc, "metadata": {**doc["metadata"], "namespace": "llm"}})
        elif doc["kind"] == "Job":
            for index in range(doc["spec"]["completions"]):
                tpl = json.loads(json.dumps(doc["spec"]["template"]))
                tpl["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
                pods.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {**tpl["metadata"], "name": f"{doc['metadata']['name']}-{index}"},
                        "spec": tpl["spec"],
                    }
                )
    return api, cache, pods


def pinned(pod: dict[str, Any]) -> set[int]:
    return {int(g) for g in pod["metadata"]["annotations"][names.GPUS].split(",")}


def test_the_tp4_pair_example_gets_one_socket_per_replica_on_the_pcie_box() -> None:
    api, cache, pods = example_world("pcie-8gpu-2socket", "p0", "tp4-pair-pcie.yaml")
    got = admit(api, cache, *pods)
    assert all(r["allowed"] for r in got), got
    admitted = [patched(p, r) for p, r in zip(pods, got, strict=True)]
    numa = {g.index: g.numa_node for g in preset_graph("pcie-8gpu-2socket").gpus}
    halves = [pinned(p) for p in admitted]
    assert not halves[0] & halves[1]
    assert all(len({numa[g] for g in h}) == 1 for h in halves), halves
    claims = sorted(c["metadata"]["name"] for c in api.objects(RESOURCE_CLAIMS))
    assert claims == ["tp4-pods-0", "tp4-pods-1"]
    # The completion index picks the slot: index 1 gets slot pods/1.
    assert admitted[1]["metadata"]["annotations"][names.SLOT] == "pods/1"


def test_the_prefill_decode_example_gets_disjoint_numa_aligned_halves_of_one_hgx_node() -> None:
    api, cache, pods = example_world("hgx-h100", "h0", "prefill-decode-hgx.yaml")
    prefill, decode = pods
    first, second, again = admit(api, cache, prefill, decode, prefill)
    # Until a pod of each pod set was seen, the gang cannot be planned: the first is refused and
    # its Job creates it again.
    assert not first["allowed"] and "retry" in first["status"]["message"], first
    assert second["allowed"] and again["allowed"], (second, again)
    halves = {
        p["metadata"]["labels"][names.POD_SET]: pinned(patched(p, r))
        for p, r in ((decode, second), (prefill, again))
    }
    assert not halves["prefill"] & halves["decode"]
    numa = {g.index: g.numa_node for g in preset_graph("hgx-h100").gpus}
    for h in halves.values():
        assert len(h) == 4 and len({numa[g] for g in h}) == 1, halves
    assert sorted(c["metadata"]["name"] for c in api.objects(RESOURCE_CLAIMS)) == [
        "pd-decode-0",
        "pd-prefill-0",
    ]


def foreign_claim(node: str, gpu: int) -> dict[str, Any]:
    """A claim of a pod outside gangslice, allocated one GPU of ``node``."""
    result = {"request": "gpu", "driver": dra.GPU_DRIVER, "pool": node, "device": f"gpu-{gpu}"}
    return {
        "metadata": {"name": "foreign", "namespace": "other"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def admitted_alone(api: FakeKube, cache: ClusterCache) -> dict[str, Any]:
    """A one-pod TP=4 gang's pod as the webhook patched it, seen by the cache."""
    pod = dra_pod("tp4-0", size=1)
    (r,) = admit(api, cache, pod)
    admitted = patched(pod, r)
    admitted["metadata"].update(namespace="llm", uid="uid-tp4-0")
    cache.apply(Kind.PODS, "ADDED", admitted)
    return admitted


# -- a device taken before our claim is allocated ------------------------------------------------
def test_a_device_taken_by_a_foreign_claim_re_plans_the_gang_and_replaces_the_stale_claim(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    from extender.controllers.claims.sync import DEVICE_TAKEN, SlotClaimSync
    from extender.kube.api import EVENTS

    api, cache = world
    admitted = admitted_alone(api, cache)
    planned = pinned(admitted)
    (claim,) = api.objects(RESOURCE_CLAIMS)
    victim = min(planned)
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", foreign_claim(NODE, victim))
    sync = SlotClaimSync(api, lambda: 0.0)
    assert list(sync.conflicts(cache)) == ["llm/tp4"]
    assert asyncio.run(sync.sync(cache)) == 1
    (replaced,) = api.objects(RESOURCE_CLAIMS)
    assert replaced["metadata"]["name"] == claim["metadata"]["name"]  # the pod still points at it
    expr = replaced["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert len(expr) == 1  # the old pin is gone, not stacked
    now = {int(g) for g in replaced["metadata"]["annotations"][names.GPUS].split(",")}
    assert victim not in now and len(now) == 4
    assert gpu_uuid(NODE, victim) not in expr[0]["cel"]["expression"]
    (event,) = [e for e in api.objects(EVENTS) if e["reason"] == DEVICE_TAKEN]
    assert f"gpu-{victim}" in event["message"] and "other/foreign" in event["message"]
    assert event["involvedObject"]["name"] == "tp4-0"
    r2 = cache.reservation("llm/tp4")
    assert r2 is not None and set(r2.slice.slots[0].gpus) == now
    assert sync.conflicts(cache) == {}


def pair_one_bound(
    gang: str, gpus: int, bound: bool = True
) -> tuple[FakeKube, ClusterCache, list[dict[str, Any]]]:
    """A gang of two pods of ``gpus`` GPUs on the PCIe node, admitted; the first bound and running."""
    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, template(gpus))
    first, second = dra_pod(f"{gang}-0", gang=gang), dra_pod(f"{gang}-1", gang=gang)
    pods = [patched(p, r) for p, r in zip((first, second), admit(api, cache, first, second), strict=True)]
    for i, p in enumerate(pods):
        p["metadata"].update(namespace="llm", uid=f"uid-{gang}-{i}")
    if bound:
        pods[0]["spec"]["nodeName"] = NODE
        pods[0]["status"] = {"phase": "Running"}
    for p in pods:
        cache.apply(Kind.PODS, "ADDED", p)
    return api, cache, pods


def test_a_workloads_taken_slot_moves_on_its_node_instead_of_a_whole_re_plan() -> None:
    """A Workload's reservation is what Kueue released the gang to: no pod bound yet, still only
    the taken slot moves, on its own node."""
    import dataclasses

    from extender.controllers.claims.sync import SlotClaimSync

    api, cache, pods = pair_one_bound("tp2", 2, bound=False)
    r = cache.reservation("llm/tp2")
    assert r is not None and not r.bound
    cache.drop("llm/tp2")
    assert cache.hold_all([dataclasses.replace(r, meta={**r.meta, names.META_OWNER_KIND: "Workload"})])
    for p in pods:  # as Kueue's pods carry it: the reservation named, no plain gang label
        del p["metadata"]["labels"][names.GANG]
        p["metadata"]["annotations"][names.RESERVATION] = r.meta["name"]
        cache.apply(Kind.PODS, "MODIFIED", p)
    kept, waiting = (pinned(p) for p in pods)
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", foreign_claim(NODE, min(waiting)))
    assert asyncio.run(SlotClaimSync(api, lambda: 0.0).sync(cache)) == 1
    after = cache.reservation("llm/tp2")
    assert after is not None
    by_key = {s.key: set(s.gpus) for s in after.slice.slots}
    assert kept in by_key.values()  # the untouched slot kept its GPUs: no whole re-plan
    (moved,) = [g for g in by_key.values() if g != kept]
    assert min(waiting) not in moved and len(moved) == 2


def test_with_a_pod_bound_a_taken_slot_moves_to_other_free_gpus_of_its_node() -> None:
    from extender.controllers.claims.sync import DEVICE_TAKEN, SlotClaimSync
    from extender.kube.api import EVENTS

    api, cache, pods = pair_one_bound("tp2", 2)
    r = cache.reservation("llm/tp2")
    assert r is not None and len(r.bound) == 1
    kept, waiting = (pinned(p) for p in pods)
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", foreign_claim(NODE, min(waiting)))
    sync = SlotClaimSync(api, lambda: 0.0)
    assert asyncio.run(sync.sync(cache)) == 1
    r = cache.reservation("llm/tp2")
    assert r is not None
    slots = {s.key: s for s in r.slice.slots}
    bound_key = next(iter(r.bound))
    assert set(slots[bound_key].gpus) == kept  # the bound pod's slot stays
    (moved,) = [s for k, s in slots.items() if k != bound_key]
    graph = cache.view().node(NODE).graph
    shape = graph.shape
    now = set(moved.gpus)
    assert min(waiting) not in now and not now & kept and len(now) == 2
    assert moved.node == NODE
    assert shape.tier_of(shape.mask_of(sorted(now))) <= shape.tier_of(shape.mask_of(sorted(waiting)))
    claim = api.peek(RESOURCE_CLAIMS, pods[1]["spec"]["resourceClaims"][0]["resourceClaimName"], "llm")
    assert claim is not None
    assert {int(g) for g in claim["metadata"]["annotations"][names.GPUS].split(",")} == now
    (event,) = [e for e in api.objects(EVENTS) if e["reason"] == DEVICE_TAKEN]
    assert "re-planned: the claim now pins" in event["message"]
    assert event["involvedObject"]["name"] == "tp2-1"
    assert sync.conflicts(cache) == {}
    saved = api.peek(SLICE_RESERVATIONS, r.meta["name"], "llm")
    assert saved is not None and any(set(p["gpus"]) == now for p in saved["spec"]["slice"]["pods"]), (
        "the moved slot is persisted"
    )


def test_with_a_pod_bound_and_no_other_set_on_its_node_the_slot_waits_and_says_so() -> None:
    from extender.controllers.claims.sync import DEVICE_TAKEN, SlotClaimSync
    from extender.kube.api import EVENTS

    api, cache, pods = pair_one_bound("tp4", 4)
    waiting = pinned(pods[1])
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", foreign_claim(NODE, min(waiting)))
    sync = SlotClaimSync(api, lambda: 0.0)
    assert asyncio.run(sync.sync(cache)) == 0
    r = cache.reservation("llm/tp4")
    assert r is not None and any(set(s.gpus) == waiting for s in r.slice.slots)
    (event,) = [e for e in api.objects(EVENTS) if e["reason"] == DEVICE_TAKEN]
    assert "no other free set of 4 GPUs as coherent: the slot waits" in event["message"]


def test_explain_shows_per_slot_the_claim_its_pinned_devices_and_whether_it_is_prepared(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    from extender.commands.explain import add_slot_claims, explain_pods
    from extender.controllers.explain import render, to_json

    api, cache = world
    first, second = dra_pod("tp4-0"), dra_pod("tp4-1")
    responses = admit(api, cache, first, second)
    pods = [patched(p, r) for p, r in zip((first, second), responses, strict=True)]
    for p in pods:
        p["metadata"]["namespace"] = "llm"
        cache.apply(Kind.PODS, "ADDED", p)
    claim_names = [p["spec"]["resourceClaims"][0]["resourceClaimName"] for p in pods]
    # kube-scheduler allocated the first claim; the driver reported its devices ready.
    done = api.peek(RESOURCE_CLAIMS, claim_names[0], "llm")
    assert done is not None
    devices = [f"gpu-{g}" for g in pods[0]["metadata"]["annotations"][names.GPUS].split(",")]
    done["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": dra.GPU_DRIVER, "pool": NODE, "device": d} for d in devices
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "tp4-0", "uid": "u0"}],
        "devices": [
            {
                "driver": dra.GPU_DRIVER,
                "pool": NODE,
                "device": d,
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            for d in devices
        ],
    }
    api.put(RESOURCE_CLAIMS, done)
    facts = explain_pods(cache, "gang", "llm", "tp4", None)
    asyncio.run(add_slot_claims(api, cache, facts))
    text = render(facts)
    assert f"claim {claim_names[0]}: allocated {','.join(devices)}, reserved for tp4-0, prepared" in text, (
        text
    )
    assert f"claim {claim_names[1]}: not allocated" in text, text
    assert f"pins {','.join(devices)}" in text
    assert set(to_json(facts)["slotClaims"]) == {p["metadata"]["annotations"][names.SLOT] for p in pods}


# -- ComputeDomains on GB200 ---------------------------------------------------------------------
CLIQUE = "nvidia.com/gpu.clique"


def gb200_world(trays: int = 4, *, device_plugin: bool = False) -> tuple[FakeKube, ClusterCache]:
    """GB200 trays of one clique whose GPUs ``gpu.nvidia.com`` publishes, or (``device_plugin``)
    the device plugin hands out."""
    api = FakeKube()
    cache = ClusterCache(store=KubeReservationStore(api))
    for kind in Kind:
        cache.replace(kind, [])
    for i in range(trays):
        node = f"t{i}"
        graph = with_identities(node, preset_graph("gb200-tray"))
        gpus = 4 if device_plugin else 0
        cache.apply(
            Kind.NODES, "ADDED", node_obj(node, gpus=gpus, labels={CLIQUE: "c0.1"}, product="NVIDIA-GB200")
        )
        cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(node).graph(graph).obj())
        if not device_plugin:
            cache.apply(Kind.RESOURCE_SLICES, "ADDED", gpu_slice(node, graph))
    cache.replace(Kind.DEVICE_CLASSES, device_classes(FIXTURES))
    api.put(RESOURCE_CLAIM_TEMPLATES, template(4))
    return api, cache


def wide_ep_pod(name: str, gang: str, size: int) -> dict[str, Any]:
    pod = dra_pod(name, gang=gang, size=size)
    pod["metadata"]["annotations"] |= {names.REQUIRED_LEVEL: "clique", names.COMM: "alltoall"}
    return pod


def test_a_wide_ep_gang_on_a_clique_gets_one_compute_domain_and_a_channel_claim_per_node() -> None:
    from extender.kube import compute_domains as cds
    from extender.kube.api import COMPUTE_DOMAINS

    api, cache = gb200_world()
    pods = [wide_ep_pod(f"ep-{i}", "ep", 2) for i in range(2)]
    got = admit(api, cache, *pods)
    assert all(r["allowed"] for r in got), got
    (domain,) = api.objects(COMPUTE_DOMAINS)
    assert domain["metadata"]["ownerReferences"][0]["kind"] == "SliceReservation"
    assert domain["spec"]["numNodes"] == 0
    uid = domain["metadata"]["uid"]
    admitted = [patched(p, r) for p, r in zip(pods, got, strict=True)]
    channels = {
        c["metadata"]["name"]: c for c in api.objects(RESOURCE_CLAIMS) if "imex" in c["metadata"]["name"]
    }
    assert len(channels) == 2  # one per node
    for p in admitted:
        entries = {e["name"]: e for e in p["spec"]["resourceClaims"]}
        channel = channels[entries[cds.POD_CLAIM]["resourceClaimName"]]
        params = channel["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        assert params["domainID"] == uid and params["kind"] == "ComputeDomainChannelConfig"
        assert channel["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == cds.CHANNEL_CLASS
        assert {"name": cds.POD_CLAIM} in p["spec"]["containers"][0]["resources"]["claims"]
    # A second gang in the same clique: its own ComputeDomain, never a node of the first.
    second = [wide_ep_pod(f"ep2-{i}", "ep2", 2) for i in range(2)]
    got2 = admit(api, cache, *second)
    assert all(r["allowed"] for r in got2), got2
    r1, r2 = cache.reservation("llm/ep"), cache.reservation("llm/ep2")
    assert r1 is not None and r2 is not None
    assert set(r1.slice.mnnvl_nodes) and not set(r1.slice.nodes) & set(r2.slice.nodes)
    assert len(api.objects(COMPUTE_DOMAINS)) == 2


def test_a_gang_on_one_node_needs_no_compute_domain() -> None:
    from extender.kube.api import COMPUTE_DOMAINS

    api, cache = gb200_world()
    (r,) = admit(api, cache, dra_pod("solo-0", gang="solo", size=1))
    assert r["allowed"]
    assert api.objects(COMPUTE_DOMAINS) == []


def test_after_a_restart_the_slots_handed_out_come_back_from_the_pods_and_none_is_given_twice(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    api, cache = world
    first = dra_pod("tp4-0")
    (r0,) = admit(api, cache, first)
    admitted = patched(first, r0)
    admitted["metadata"]["namespace"] = "llm"
    api.put("pods", admitted)
    # A new replica: its cache lists what the API holds and rebuilds the ledger from the store.
    fresh = pcie_cache(api)
    assert asyncio.run(fresh.rebuild_ledger()) == 1
    second = dra_pod("tp4-1")
    (r1,) = admit(api, fresh, second)
    assert r1["allowed"], r1
    slots = [
        admitted["metadata"]["annotations"][names.SLOT],
        patched(second, r1)["metadata"]["annotations"][names.SLOT],
    ]
    assert len(set(slots)) == 2, slots
    gpus = [pinned(admitted), pinned(patched(second, r1))]
    assert not gpus[0] & gpus[1]
    assert len(api.objects(RESOURCE_CLAIMS)) == 2


def test_a_hold_pinned_by_claims_outlives_its_ttl_while_a_pod_of_the_gang_lives(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    api, _ = world
    clock = [1000.0]
    cache = ClusterCache(store=KubeReservationStore(api), clock=lambda: clock[0], ttl_s=30)
    for kind in Kind:
        cache.replace(kind, [])
    graph = with_identities(NODE, preset_graph("pcie-8gpu-2socket"))
    cache.apply(Kind.NODES, "ADDED", node_obj(NODE, gpus=0))
    cache.apply(Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(NODE).graph(graph).obj())
    cache.apply(Kind.RESOURCE_SLICES, "ADDED", gpu_slice(NODE, graph))
    cache.replace(Kind.DEVICE_CLASSES, device_classes(FIXTURES))
    pod = dra_pod("tp4-0")
    (r,) = admit(api, cache, pod)
    admitted = patched(pod, r)
    admitted["metadata"]["namespace"] = "llm"
    cache.apply(Kind.PODS, "ADDED", admitted)
    clock[0] += 31
    assert cache.expire() == [] and cache.reservation("llm/tp4") is not None
    cache.apply(Kind.PODS, "DELETED", admitted)
    assert [x.gang for x in cache.expire()] == ["llm/tp4"]


def test_a_claim_the_api_server_fails_to_create_is_made_by_the_next_pass(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    from extender.kube.api import Unavailable

    api, cache = world
    api.fail_next("create resourceclaims", Unavailable(503, "etcd is slow"))
    (allowed,) = admit(api, cache, dra_pod("tp4-0", size=1))
    assert allowed["allowed"], allowed  # the webhook writes nothing: nothing of it failed
    assert api.objects(RESOURCE_CLAIMS) == []
    from extender.controllers.claims.make import CLAIM_NOT_MADE
    from extender.kube.api import EVENTS

    (told,) = [e for e in api.objects(EVENTS) if e["reason"] == CLAIM_NOT_MADE]
    assert told["involvedObject"]["name"] == "tp4-0" and "etcd is slow" in told["message"], told
    claims = PodClaims(api, cache)
    assert asyncio.run(claims.sync(cache)) == 1
    (claim,) = api.objects(RESOURCE_CLAIMS)
    named = patched(dra_pod("tp4-0", size=1), allowed)["spec"]["resourceClaims"][0]["resourceClaimName"]
    assert claim["metadata"]["name"] == named
    assert asyncio.run(claims.sync(cache)) == 0  # made once: not made again


def test_a_re_planned_pod_the_kubelet_reports_on_its_new_devices_is_no_device_mismatch(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    """Re-planning replaces the slot's claim but not the pod's ``gangslice.io/gpus`` (set at its
    admission): the kubelet then reports the re-planned devices, which is what was promised."""
    from extender.controllers.claims.sync import SlotClaimSync

    api, cache = world
    admitted = admitted_alone(api, cache)
    victim = min(pinned(admitted))
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", foreign_claim(NODE, victim))
    assert asyncio.run(SlotClaimSync(api, lambda: 0.0).sync(cache)) == 1
    r2 = cache.reservation("llm/tp4")
    assert r2 is not None
    now = r2.slice.slots[0].gpus
    assert victim not in now
    # kube-scheduler binds the pod; the kubelet prepares the re-planned claim's devices.
    bound = json.loads(json.dumps(admitted))
    bound["spec"]["nodeName"] = NODE
    bound["status"] = {"phase": "Running"}
    cache.apply(Kind.PODS, "MODIFIED", bound)
    graph = with_identities(NODE, preset_graph("pcie-8gpu-2socket"))

    def kubelet_reports(gpus: Sequence[int]) -> None:
        topology = make_node_topology(NODE).graph(graph).in_use("tp4-0", *gpus, container="c").obj()
        cache.apply(Kind.NODE_TOPOLOGIES, "MODIFIED", topology)

    kubelet_reports(now)
    assert cache.device_mismatches() == []
    r3 = cache.reservation("llm/tp4")
    assert r3 is not None and r3.slice.slots[0].gpus == now and r3.bound
    # Devices other than the re-planned ones are a mismatch against the re-planned slot.
    other = [g for g in graph.indices if g not in now and g != victim][:4]
    kubelet_reports(other)
    (m,) = cache.device_mismatches()
    assert m.promised == tuple(sorted(now)) and m.reported == tuple(sorted(other))


def test_the_cache_reads_the_driver_s_compute_domain_label_and_keeps_foreign_domains_out() -> None:
    """A node NVIDIA's driver labels with the ComputeDomain of a gang (its channel claims name
    the domain) is that gang's; one labelled with any other domain is no fit for another
    gang's multi-node pod set, and the refusal names the domain."""
    from extender.kube import compute_domains as cds
    from extender.kube.api import COMPUTE_DOMAINS

    api, cache = gb200_world()
    pods = [wide_ep_pod(f"ep-{i}", "ep", 2) for i in range(2)]
    assert all(r["allowed"] for r in admit(api, cache, *pods))
    for claim in api.objects(RESOURCE_CLAIMS):
        cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", claim)
    (domain,) = api.objects(COMPUTE_DOMAINS)
    r1 = cache.reservation("llm/ep")
    assert r1 is not None
    mine, rest = sorted(r1.slice.nodes), sorted({"t0", "t1", "t2", "t3"} - set(r1.slice.nodes))

    def label(node: str, uid: str | None) -> None:
        labels = {CLIQUE: "c0.1"} | ({cds.NODE_LABEL: uid} if uid else {})
        cache.apply(Kind.NODES, "MODIFIED", node_obj(node, gpus=0, labels=labels, product="NVIDIA-GB200"))

    label(mine[0], domain["metadata"]["uid"])
    label(rest[0], "cd-foreign-uid")
    snap = cache.snapshot()
    assert snap.node(mine[0]).mnnvl_gang == "llm/ep" and snap.node(mine[0]).foreign_domain is None
    foreign = snap.node(rest[0]).foreign_domain
    assert foreign is not None and "cd-foreign-uid" in foreign and cds.NODE_LABEL in foreign
    assert snap.node(rest[1]).foreign_domain is None and snap.node(rest[1]).mnnvl_gang is None
    # A second wide-EP gang: two trays are the first gang's, one is in the foreign domain.
    (refused,) = admit(api, cache, wide_ep_pod("ep2-0", "ep2", 2))
    assert not refused["allowed"]
    message = refused["status"]["message"]
    assert "cd-foreign-uid" in message and rest[0] in message, message
    # The driver removes the label once the node's workloads are unprepared: the tray serves.
    label(rest[0], None)
    assert all(r["allowed"] for r in admit(api, cache, wide_ep_pod("ep2-0", "ep2", 2)))
    r2 = cache.reservation("llm/ep2")
    assert r2 is not None and set(r2.slice.nodes) == set(rest)
    # The first gang's channel claims gone (its reservation deleted): its label is someone else's.
    channels = [c for c in api.objects(RESOURCE_CLAIMS) if cds.channel_domain(c) is not None]
    assert {cds.channel_domain(c) for c in channels} == {
        (domain["metadata"]["uid"], r1.meta["name"]),
        (api.objects(COMPUTE_DOMAINS)[1]["metadata"]["uid"], r2.meta["name"]),
    }
    for claim in channels:
        if cds.channel_domain(claim) == (domain["metadata"]["uid"], r1.meta["name"]):
            cache.apply(Kind.RESOURCE_CLAIMS, "DELETED", claim)
    assert cache.snapshot().node(mine[0]).foreign_domain is not None


def created(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it after the webhook's patch."""
    out = patched(pod, response)
    out["metadata"]["namespace"] = "llm"
    return out


def test_a_surge_pod_of_an_owned_gang_grows_a_slot_with_its_own_claim_up_to_its_owners_limit() -> None:
    """On DRA nodes the slot is handed out at pod creation: a rolling update's surge pod, whose
    pod set's every slot is handed out, gets one more slot (and claim) beside the gang, as many
    as the Deployment's max-replicas allow; one more is refused, naming why."""
    from extender.controllers.claims.sync import SlotClaimSync

    api = FakeKube()
    cache = pcie_cache(api)
    api.put(RESOURCE_CLAIM_TEMPLATES, template(2))
    rs = make_replica_set("tp2-r1").template(make_pod("t").label(names.GANG, "tp2")).deployment("tp2", 2, 3)
    cache.apply(Kind.REPLICA_SETS, "ADDED", rs.obj())
    pods = [dra_pod(f"tp2-{i}", gang="tp2") for i in range(4)]
    first = admit(api, cache, *pods[:2])
    for pod, response in zip(pods[:2], first, strict=True):
        assert response["allowed"], response
        cache.apply(Kind.PODS, "ADDED", created(pod, response))
    r = cache.reservation("llm/tp2")
    assert r is not None and len(r.slice.slots) == 2
    (surge,) = admit(api, cache, pods[2])
    assert surge["allowed"], surge
    r = cache.reservation("llm/tp2")
    assert r is not None and len(r.slice.slots) == 3
    held = [g for s in r.slice.slots for g in s.gpus]
    assert len(held) == len(set(held)) == 6
    assert len(api.objects(RESOURCE_CLAIMS)) == 3
    cache.apply(Kind.PODS, "ADDED", created(pods[2], surge))
    (over,) = admit(api, cache, pods[3])
    assert not over["allowed"]
    assert "every slot is handed out (3 of 3)" in over["status"]["message"], over
    # The first old pod leaves: its slot goes (the owners want 2), and so does its claim.
    gone = created(pods[0], first[0])
    cache.apply(Kind.PODS, "DELETED", gone)
    r = cache.reservation("llm/tp2")
    assert r is not None and len(r.slice.slots) == 2
    assert gone["metadata"]["annotations"][names.SLOT] not in {s.key for s in r.slice.slots}
    assert asyncio.run(SlotClaimSync(api, lambda: 0.0).delete_dropped(cache)) == 1
    left = {c["metadata"]["name"] for c in api.objects(RESOURCE_CLAIMS)}
    assert left == {claim_name(r.meta["name"], s) for s in r.slice.slots}
    assert asyncio.run(SlotClaimSync(api, lambda: 0.0).delete_dropped(cache)) == 0


def test_a_device_plugin_wide_ep_gang_gets_its_slots_at_admission_and_a_channel_per_node() -> None:
    """NVIDIA's supported GB200 setup: GPUs through the device plugin, ComputeDomains through the
    DRA driver. A gang pod that requires the clique is handed its slot at creation and gets its
    node's channel claim of the gang's ComputeDomain; the extender then offers it that node only."""
    from extender.httpapi.decide import Decider
    from extender.kube import compute_domains as cds
    from extender.kube.api import COMPUTE_DOMAINS

    api, cache = gb200_world(device_plugin=True)
    pods = []
    for i in range(2):
        pod = (
            make_pod(f"ep-{i}")
            .gpus(4)
            .gang("ep", 2)
            .annotations({names.REQUIRED_LEVEL: "clique", names.COMM: "alltoall"})
            .obj()
        )
        pod["metadata"].pop("namespace")
        pods.append(pod)
    got = admit(api, cache, *pods)
    assert all(r["allowed"] for r in got), got
    (domain,) = api.objects(COMPUTE_DOMAINS)
    r = cache.reservation("llm/ep")
    assert r is not None and set(r.slice.mnnvl_nodes) == set(r.slice.nodes) and len(r.slice.nodes) == 2
    admitted = [created(p, resp) for p, resp in zip(pods, got, strict=True)]
    decider = Decider(cache)
    nodes = set()
    for p in admitted:
        slot = r.slice.slot(p["metadata"]["annotations"][names.SLOT])
        (channel,) = [e for e in p["spec"]["resourceClaims"] if e["name"] == cds.POD_CLAIM]
        claim = api.peek(Kind.RESOURCE_CLAIMS, channel["resourceClaimName"], "llm")
        assert claim is not None
        assert (
            claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"]
            == domain["metadata"]["uid"]
        )
        assert channel["resourceClaimName"].endswith(slot.node)
        assert {"name": cds.POD_CLAIM} in p["spec"]["containers"][0]["resources"]["claims"]
        cache.apply(Kind.PODS, "ADDED", p)
        out = decider.filter(PodInfo.from_obj(p), cache.node_names())
        assert out.passed == [slot.node], out
        nodes.add(slot.node)
    assert nodes == set(r.slice.nodes)


def test_an_lws_leader_is_pinned_once_lws_gave_it_its_group_and_a_repeat_call_changes_nothing() -> None:
    """Mutating webhooks run in the order of their configurations' names, so the API server calls
    gangslice's before LWS's pod webhook labels a leader with its group; gangslice passes it
    unchanged and pins it on the repeat call (reinvocationPolicy IfNeeded). A pod it pinned is
    passed unchanged when called again; a slot annotation it did not hand out is pinned over."""
    from extender.kube import compute_domains as cds

    api, cache = gb200_world(device_plugin=True)
    ann = {names.REQUIRED_LEVEL: "clique", names.COMM: "alltoall", names.LWS_SIZE: "2"}
    leader = (
        make_pod("ep-0").gpus(4).label(names.GANG, "ep").label(names.LWS_NAME, "ep").annotations(ann).obj()
    )
    leader["metadata"].pop("namespace")
    (first,) = admit(api, cache, leader)
    assert first["allowed"] and "patch" not in first, first
    assert cache.reservation("llm/ep") is None and cache.reservation("llm/ep-0") is None
    leader["metadata"]["labels"][names.LWS_GROUP_INDEX] = "0"  # LWS's pod webhook
    (again,) = admit(api, cache, leader)
    assert again["allowed"] and "patch" in again, again
    pinned = patched(leader, again)
    slot = pinned["metadata"]["annotations"][names.SLOT]
    assert [e["name"] for e in pinned["spec"]["resourceClaims"]] == [cds.POD_CLAIM]
    (repeat,) = admit(api, cache, pinned)  # another webhook changed it: called once more
    assert repeat["allowed"] and "patch" not in repeat, repeat
    assert list(cache.book.handed("llm/ep-0").values()) == ["ep-0"]
    forged = make_pod("ep-1").gpus(4).label(names.GANG, "ep").label(names.LWS_NAME, "ep")
    forged_obj = forged.label(names.LWS_GROUP_INDEX, "0").annotations({**ann, names.SLOT: slot}).obj()
    forged_obj["metadata"].pop("namespace")
    (other,) = admit(api, cache, forged_obj)
    assert other["allowed"] and "patch" in other, other
    assert patched(forged_obj, other)["metadata"]["annotations"][names.SLOT] != slot


def test_each_job_of_a_jobset_numbers_its_pods_from_0_and_gets_its_own_share_of_the_slots() -> None:
    """Two Jobs x parallelism 2 in one pod set of 4 slots: the second Job's pod of completion
    index 0 gets slot 2, not the first Job's slot 0 (which would refuse it as held)."""
    r = reservation(*(slot("pod", i, (2 * i, 2 * i + 1)) for i in range(4)))
    keys = {}
    for job in (0, 1):
        for index in (0, 1):
            labels = {
                "jobset.sigs.k8s.io/job-index": str(job),
                "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
                "batch.kubernetes.io/job-completion-index": str(index),
            }
            pod = PodInfo(
                namespace="llm", name=f"j{job}-{index}", gpus=2, labels={names.GANG: "js", **labels}
            )
            keys[(job, index)] = pick_slot(r, pod, {}).key
    assert keys == {(0, 0): "pod/0", (0, 1): "pod/1", (1, 0): "pod/2", (1, 1): "pod/3"}


def test_a_leaderworkerset_worker_whose_leader_is_its_own_pod_set_is_not_off_by_one() -> None:
    r = reservation(slot("leader", 0, (0, 1, 2, 3)), slot("worker", 0, (4, 5, 6, 7)))
    labels = {names.GANG: "lws", names.POD_SET: "worker", "leaderworkerset.sigs.k8s.io/worker-index": "1"}
    worker = PodInfo(namespace="llm", name="w-0-1", gpus=4, labels=labels, annotations={names.LWS_SIZE: "2"})
    assert pick_slot(r, worker, {}).key == "worker/0"
    # One pod set for leader and workers: the worker index is the position itself.
    alike = reservation(slot("pods", 0, (0, 1, 2, 3)), slot("pods", 1, (4, 5, 6, 7)))
    same = PodInfo(
        namespace="llm",
        name="w-0-1",
        gpus=4,
        labels={names.GANG: "lws", "leaderworkerset.sigs.k8s.io/worker-index": "1"},
        annotations={names.LWS_SIZE: "2"},
    )
    assert pick_slot(alike, same, {}).key == "pods/1"


def test_a_kueue_admitted_device_plugin_pod_on_channel_nodes_gets_its_slot_and_channel() -> None:
    """A Kueue Workload's pod (``gangslice.io/reservation``, written by the admission check)
    created after its slice was reserved across trays gets its slot and its node's channel
    claim too; one whose reservation uses no NVLink channel, or does not exist yet, passes
    unchanged."""
    from extender.cost import Comm
    from extender.kube import compute_domains as cds
    from extender.kube.api import COMPUTE_DOMAINS
    from extender.placement.request import GangRequest, PodSet
    from extender.placement.slice import Unplaceable
    from extender.reservations.reserve import Claim, reserve

    api, cache = gb200_world(device_plugin=True)
    request = GangRequest("llm/wl", (PodSet("main", 2, 4, Comm.ALLTOALL, required_level="clique"),))
    held = reserve(cache.book, request, Claim("llm/wl"))
    assert not isinstance(held, Unplaceable) and len(held.slice.mnnvl_nodes) == 2

    def kueue_pod(name: str, reservation: str) -> dict[str, Any]:
        pod = make_pod(name).gpus(4).label(names.KUEUE_PODSET, "main").obj()
        pod["metadata"]["annotations"][names.RESERVATION] = reservation
        pod["metadata"].pop("namespace")
        return pod

    pods = [kueue_pod(f"wl-{i}", "wl") for i in range(2)]
    got = admit(api, cache, *pods, kueue_pod("early", "not-yet"))
    assert all(r["allowed"] for r in got), got
    assert "patch" not in got[2]  # its Workload is not admitted: nothing to add
    (domain,) = api.objects(COMPUTE_DOMAINS)
    nodes = set()
    for pod, response in zip(pods, got[:2], strict=True):
        made = created(pod, response)
        slot = held.slice.slot(made["metadata"]["annotations"][names.SLOT])
        (channel,) = [e for e in made["spec"]["resourceClaims"] if e["name"] == cds.POD_CLAIM]
        claim = api.peek(Kind.RESOURCE_CLAIMS, channel["resourceClaimName"], "llm")
        assert claim is not None and channel["resourceClaimName"].endswith(slot.node)
        assert (
            claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"]
            == domain["metadata"]["uid"]
        )
        nodes.add(slot.node)
    assert nodes == set(held.slice.nodes)


# -- the webhook has no side effects ------------------------------------------------------------
def owned_pod(name: str, owner: dict[str, Any] | None, *, uid: str | None = None) -> dict[str, Any]:
    """A gang pod whose controller is ``owner`` (a ReplicaSet), or one naming a made-up one."""
    pod = dra_pod(name, size=1)
    ref = owner["metadata"] if owner is not None else {"name": "made-up", "uid": "uid-made-up"}
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": ref["name"],
            "uid": uid or ref["uid"],
            "controller": True,
        }
    ]
    return pod


def test_the_webhook_writes_nothing_and_the_claim_comes_once_the_pod_exists(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    """sideEffects: None. The review only names the slot's claim; the claims controller makes it
    (and saves the reservation that owns it) when the pod shows up on the watch."""
    api, cache = world
    pod = dra_pod("tp4-0", size=1)
    before = len(api.writes())
    (response,) = admit(api, cache, pod, create=False)
    assert response["allowed"], response
    assert api.writes()[before:] == []
    named = patched(pod, response)
    assert named["metadata"]["annotations"][names.CLAIM_TEMPLATE] == "gpus"
    assert api.objects(RESOURCE_CLAIMS) == [] and api.objects(SLICE_RESERVATIONS) == []
    # The pod exists: its claim is made, owned by the reservation saved first.
    named["metadata"].update(namespace="llm", uid="uid-tp4-0")
    cache.apply(Kind.PODS, "ADDED", named)
    assert asyncio.run(PodClaims(api, cache).sync(cache)) == 1
    (saved,) = api.objects(SLICE_RESERVATIONS)
    (claim,) = api.objects(RESOURCE_CLAIMS)
    assert claim["metadata"]["name"] == named["spec"]["resourceClaims"][0]["resourceClaimName"]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == saved["metadata"]["uid"]


def test_forged_reviews_reserve_nothing_and_create_nothing_without_a_real_owner(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    """Without kube-apiserver's certificate anyone can post a review. A bare pod's, or one naming
    an owner that does not exist (or exists with another UID), reserves nothing; a pod of a
    ReplicaSet that exists is pinned, and still nothing is written until the pod exists."""
    from extender.kube.api import COMPUTE_DOMAINS, REPLICA_SETS

    api, cache = world
    before = len(api.writes())
    forged = [dra_pod(f"bare-{i}", gang=f"g{i}") for i in range(4)]
    forged += [owned_pod("ghost-0", None)]
    made = dra_pod("template", size=1)
    template_of_rs = {
        "metadata": {k: made["metadata"][k] for k in ("labels", "annotations")},
        "spec": made["spec"],
    }
    rs = api.put(
        REPLICA_SETS,
        {
            "metadata": {"name": "tp4-rs", "namespace": "llm", "uid": "uid-rs"},
            "spec": {"template": template_of_rs},
        },
    )
    forged += [owned_pod("stale-0", rs, uid="uid-of-an-earlier-one")]
    # The real ReplicaSet named, but the pod is not what it makes: a gang of 8 sized by the forger.
    bigger = owned_pod("big-0", rs)
    bigger["metadata"]["annotations"][names.GANG_SIZE] = "8"
    forged += [bigger]
    got = admit(api, cache, *forged, create=False, authenticated=False)
    assert not any(r["allowed"] for r in got), got
    assert "has no controller" in got[0]["status"]["message"]
    assert "ReplicaSet llm/made-up does not exist" in got[4]["status"]["message"]
    assert "has another UID" in got[5]["status"]["message"]
    assert "annotations differ from the pod template of its ReplicaSet" in got[6]["status"]["message"], got[6]
    assert cache.ledger.reservations() == [] and cache.pods() == []
    assert api.writes()[before:] == []
    assert (
        api.objects(RESOURCE_CLAIMS) == api.objects(COMPUTE_DOMAINS) == api.objects(SLICE_RESERVATIONS) == []
    )
    # The ReplicaSet's own pod: pinned, the claim made once the API server created it.
    (real,) = admit(api, cache, owned_pod("tp4-0", rs), authenticated=False)
    assert real["allowed"], real
    assert len(api.objects(RESOURCE_CLAIMS)) == 1 and len(api.objects(SLICE_RESERVATIONS)) == 1


def test_a_forged_volcano_member_of_a_podgroup_that_does_not_exist_is_not_counted(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    from extender.kube.api import PODGROUPS

    api, cache = world
    pod = dra_pod("w-0", gang=None)
    pod["metadata"]["annotations"] = {names.VOLCANO_GROUP: "pg"}
    (r,) = admit(api, cache, pod, create=False, authenticated=False)
    assert not r["allowed"] and "PodGroup llm/pg does not exist" in r["status"]["message"], r
    assert cache.pods_of_gang("llm/pg") == []
    api.put(PODGROUPS, {"metadata": {"name": "pg", "namespace": "llm"}, "spec": {"minMember": 2}})
    (r,) = admit(api, cache, pod, create=False, authenticated=False)
    assert not r["allowed"] and "no slice reserved yet" in r["status"]["message"], r
    assert [p.name for p in cache.pods_of_gang("llm/pg")] == ["w-0"]  # a member of a real PodGroup


def test_a_pinned_pod_whose_reservation_was_never_saved_gets_its_gang_reserved_again_and_its_claim(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    """The leader answered the review and went before the pod showed up: its successor knows no
    reservation (none was saved). The pod exists, so its gang is real: reserved again, and the
    claim the pod names is made for its slot."""
    api, cache = world
    pod = dra_pod("tp4-0", size=1)
    (response,) = admit(api, cache, pod, create=False)
    named = patched(pod, response)
    named["metadata"].update(namespace="llm", uid="uid-tp4-0")
    assert api.objects(SLICE_RESERVATIONS) == []
    successor = pcie_cache(api)
    successor.apply(Kind.PODS, "ADDED", named)
    assert successor.reservation("llm/tp4") is None
    assert asyncio.run(PodClaims(api, successor).sync(successor)) == 1
    r = successor.reservation("llm/tp4")
    assert r is not None and [s.key for s in r.slice.slots] == [named["metadata"]["annotations"][names.SLOT]]
    (claim,) = api.objects(RESOURCE_CLAIMS)
    assert claim["metadata"]["name"] == named["spec"]["resourceClaims"][0]["resourceClaimName"]
    assert len(api.objects(SLICE_RESERVATIONS)) == 1


def test_the_claims_controller_of_a_standby_makes_nothing_and_the_pod_feed_hands_it_slotted_pods(
    world: tuple[FakeKube, ClusterCache],
) -> None:
    from extender.controllers.pods import PodFeed

    api, cache = world
    pod = dra_pod("tp4-0", size=1)
    (response,) = admit(api, cache, pod, create=False)
    named = patched(pod, response)
    named["metadata"].update(namespace="llm", uid="uid-tp4-0")
    cache.apply(Kind.PODS, "ADDED", named)
    asyncio.run(PodClaims(api, cache, leads=lambda: False).on_pod("ADDED", named))
    assert api.objects(RESOURCE_CLAIMS) == []

    async def fed() -> None:
        feed, stop = PodFeed(), asyncio.Event()
        feed.tell("ADDED", named)
        feed.tell("ADDED", dra_pod("unpinned"))  # a plain gang's pod, but given no slot
        task = asyncio.create_task(feed.run(stop, None, None, PodClaims(api, cache)))
        for _ in range(100):
            if api.objects(RESOURCE_CLAIMS):
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(fed())
    (claim,) = api.objects(RESOURCE_CLAIMS)
    assert claim["metadata"]["name"] == named["spec"]["resourceClaims"][0]["resourceClaimName"]
