"""The worked examples (examples/k8s) read by the code that reads them in a cluster: every
pod template of a plain example through the extender's pod parsing and plain-gang rule,
every Kueue example through the Workload it becomes and the admission check's gang builder;
then each gang is placed by the solver on the example cluster of its GPU type."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from test_manifests import EXAMPLES, K8S_EXAMPLES, load_all, pod_templates, yaml_files

from extender.controllers.kueue.workload_gang import gang_from_workload
from extender.kube import names
from extender.kube.gangs import plain_gang_request
from extender.kube.names import DESIRED_REPLICAS, MAX_REPLICAS
from extender.kube.owners import OwnerTable
from extender.kube.pods import PodInfo
from extender.placement.files import load_cluster
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import resolve_level
from extender.placement.slice import Slice
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import place

PLAIN = yaml_files(K8S_EXAMPLES / "plain")
KUEUE = yaml_files(K8S_EXAMPLES / "kueue")
#: llm-d's prefill and decode Deployments as one gang of gangslice's labels (docs/llm-d.md).
LLM_D = yaml_files(K8S_EXAMPLES / "llm-d")
LEVEL_KEYS = (names.REQUIRED_LEVEL, names.PREFERRED_LEVEL)


@cache
def cluster_for(product: str | None) -> ClusterSnapshot:
    name = "gb200-nvl72-pair.yaml" if product == "NVIDIA-GB200" else "hgx-h100-4leaf.yaml"
    return load_cluster(EXAMPLES / "clusters" / name)


def _product(template: Mapping[str, Any]) -> str | None:
    got = template["spec"].get("nodeSelector", {}).get("nvidia.com/gpu.product")
    return str(got) if got else None


def pod_object(obj: Mapping[str, Any], which: str, template: Mapping[str, Any]) -> dict[str, Any]:
    """A pod of ``template`` as its controller makes it (a LeaderWorkerSet's carries its group
    index and size)."""
    meta = template.get("metadata", {})
    labels, annotations = dict(meta.get("labels", {})), dict(meta.get("annotations", {}))
    if obj["kind"] == "LeaderWorkerSet":
        labels[names.LWS_GROUP_INDEX] = "0"
        annotations[names.LWS_SIZE] = str(obj["spec"]["leaderWorkerTemplate"].get("size", 1))
    return {
        "metadata": {
            "namespace": obj["metadata"]["namespace"],
            "name": f"{obj['metadata']['name']}-{which}-0",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": template["spec"],
    }


def assert_places(gang: GangRequest, snap: ClusterSnapshot, where: str) -> Slice:
    for ps in gang.pod_sets:
        for level in (ps.required_level, ps.preferred_level):
            if level:
                resolve_level(level, snap.hierarchy)
    got = place(snap, gang)
    assert isinstance(got, Slice), f"{where}: {got.reason}"
    assert len(got.slots) == gang.pods
    return got


def test_there_are_four_shapes_in_each_flavour() -> None:
    assert [p.name for p in PLAIN] == [p.name for p in KUEUE]
    assert len(PLAIN) == 4


# -- plain labels ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [*PLAIN, *LLM_D], ids=lambda p: p.stem)
def test_plain_examples_become_the_gangs_they_describe(path: Path) -> None:
    members: dict[str, list[tuple[PodInfo, str | None]]] = defaultdict(list)
    pods = 0
    owners = OwnerTable()
    for obj in load_all(path):
        made = owned_by(obj)
        if made is not None:
            owners.put(*made)
    for obj in load_all(path):
        for which, template in pod_templates(obj):
            pod = PodInfo.from_obj(pod_object(obj, which, template))
            assert not pod.problems and pod.gpus > 0, f"{path.name}: {pod.problems}"
            assert pod.reservation_name is None and pod.volcano_group is None
            count = obj["spec"].get("leaderWorkerTemplate", {}).get("size", 1) - 1 if which == "worker" else 1
            replicas = obj["spec"].get("replicas", 1) if obj["kind"] != "Pod" else 1
            pods += count * replicas if obj["kind"] == "LeaderWorkerSet" else replicas
            if pod.gang is None:
                # A pod outside any gang: placed as a gang of one with its own levels.
                alone = GangRequest(pod.key, (PodSet("pod", 1, pod.gpus, required_level=pod.required_level),))
                assert_places(alone, cluster_for(_product(template)), path.name)
                continue
            if owners.sizes(pod.gang) is None:
                assert pod.gang_size is not None, f"{path.name}: a gang pod needs {names.GANG_SIZE}"
            members[pod.gang].append((pod, _product(template)))
    for key, seen in members.items():
        # Whichever member is seen first, once every pod template has been seen the gang's
        # request is the same (but for the name of a lone pod set, the role a pod names).
        peers = [p for p, _ in seen]
        requests = [plain_gang_request(p, peers, owners) for p in peers]
        assert all(isinstance(r, GangRequest) for r in requests), f"{path.name}: {requests}"
        shapes = {
            tuple(replace(ps, name="pods") if len(r.pod_sets) == 1 else ps for ps in r.pod_sets)
            for r in requests
            if isinstance(r, GangRequest)
        }
        assert len(shapes) == 1, f"{path.name}: pods of {key} disagree"
        request = requests[0]
        assert isinstance(request, GangRequest)
        assert request.pods == pods, (
            f"{path.name}: {names.GANG_SIZE} is {request.pods}, the objects make {pods}"
        )
        assert_places(request, cluster_for(seen[0][1]), path.name)


def owned_by(obj: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The owner of an example's pods as the cluster makes it: a Deployment's ReplicaSet (the
    deployment controller writes the Deployment's replicas on it), a StatefulSet as it is."""
    if obj["kind"] == "StatefulSet":
        return "StatefulSet", dict(obj)
    if obj["kind"] != "Deployment":
        return None
    meta, replicas = obj["metadata"], obj["spec"].get("replicas", 1)
    rs_meta = {
        "name": f"{meta['name']}-1",
        "namespace": meta.get("namespace", "default"),
        "ownerReferences": [{"kind": "Deployment", "name": meta["name"], "controller": True}],
        "annotations": {DESIRED_REPLICAS: str(replicas), MAX_REPLICAS: str(replicas)},
    }
    return "ReplicaSet", {
        "metadata": rs_meta,
        "spec": {"replicas": replicas, "template": obj["spec"]["template"]},
    }


# -- Kueue -------------------------------------------------------------------------------------


def workloads_of(path: Path) -> list[tuple[dict[str, Any], str | None]]:
    """The Workloads Kueue builds for the objects in ``path`` (one per Deployment pod, one
    per LeaderWorkerSet group, one per pod group with a pod set per pod shape)."""
    out: list[tuple[dict[str, Any], str | None]] = []
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for obj in load_all(path):
        labels = obj["metadata"].get("labels", {})
        assert labels.get("kueue.x-k8s.io/queue-name"), f"{path.name}: {obj['metadata']['name']} has no queue"
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        if obj["kind"] == "Pod":
            groups[labels["kueue.x-k8s.io/pod-group-name"]].append(obj)
            continue
        sets = []
        for which, template in pod_templates(obj):
            size = obj["spec"].get("leaderWorkerTemplate", {}).get("size", 1)
            count = size - 1 if which == "worker" else 1
            sets.append(
                {
                    "name": which if obj["kind"] == "LeaderWorkerSet" else "main",
                    "count": count,
                    "template": template,
                }
            )
        wl = {
            "metadata": {"namespace": ns, "name": f"{obj['kind'].lower()}-{name}"},
            "spec": {"podSets": sets},
        }
        out.append((wl, _product(sets[0]["template"])))
    for group, pods in groups.items():
        total = {int(p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"]) for p in pods}
        assert total == {len(pods)}, f"{path.name}: pod group {group} expects {total}, has {len(pods)}"
        shapes: dict[str, dict[str, Any]] = {}
        for p in pods:
            shape = repr([c.get("resources") for c in p["spec"]["containers"]])
            entry = shapes.setdefault(shape, {"name": f"role-{len(shapes)}", "count": 0, "template": p})
            entry["count"] += 1
        wl = {
            "metadata": {"namespace": pods[0]["metadata"]["namespace"], "name": group},
            "spec": {"podSets": list(shapes.values())},
        }
        out.append((wl, _product(pods[0])))
    return out


@pytest.mark.parametrize("path", KUEUE, ids=lambda p: p.stem)
def test_kueue_examples_become_the_gangs_they_describe(path: Path) -> None:
    workloads = workloads_of(path)
    assert workloads
    for wl, product in workloads:
        snap = cluster_for(product)
        wg = gang_from_workload(wl, snap.hierarchy)
        assert not wg.notes, f"{path.name}: {wg.notes}"
        assert wg.request.gpus > 0
        assert_places(wg.request, snap, path.name)


def test_the_kueue_lws_examples_keep_workers_with_their_leader() -> None:
    for path in KUEUE:
        for wl, product in workloads_of(path):
            sets = {
                ps.name: ps for ps in gang_from_workload(wl, cluster_for(product).hierarchy).request.pod_sets
            }
            if "worker" in sets and "leader" in sets:
                colo = sets["worker"].colocate_with
                assert colo is not None and colo.pod_set == "leader", path.name


def test_the_plain_and_kueue_flavours_ask_for_the_same_gpus() -> None:
    def gpus(path: Path) -> int:
        total = 0
        for obj in load_all(path):
            for which, template in pod_templates(obj):
                pod = PodInfo.from_obj(pod_object(obj, which, template))
                size = obj["spec"].get("leaderWorkerTemplate", {}).get("size", 1)
                total += pod.gpus * (size - 1 if which == "worker" else 1)
        return total

    for plain, kueue in zip(PLAIN, KUEUE, strict=True):
        assert gpus(plain) == gpus(kueue), plain.name


SERVING = [p for p in yaml_files(K8S_EXAMPLES) if "vllm" in p.read_text()]


@pytest.mark.parametrize("path", SERVING, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_vllm_example_is_guaranteed_qos_with_whole_cpus_for_vllm(path: Path) -> None:
    """Every container of a pod that serves (init containers included) has CPU and memory limits
    equal to its requests, so the pod is Guaranteed; the vLLM containers ask for whole CPUs, so
    the kubelet's static CPU manager gives them CPUs of their own on their GPUs' NUMA node."""
    templates = [(w, t) for obj in load_all(path) for w, t in pod_templates(obj)]
    served = 0
    for which, template in templates:
        spec = template["spec"]
        containers = [*spec.get("initContainers", ()), *spec["containers"]]
        if not any("vllm" in str(c.get("image", "")) for c in containers):
            continue
        served += 1
        for c in containers:
            res = c.get("resources") or {}
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            where = f"{path.name} {which} {c['name']}"
            for kind in ("cpu", "memory"):
                asked, most = requests.get(kind), limits.get(kind)
                assert asked is not None and str(asked) == str(most), (
                    f"{where}: {kind} {asked} != limit {most}"
                )
            if "vllm" in str(c.get("image", "")):
                assert str(requests["cpu"]).isdigit(), f"{where}: cpu {requests['cpu']}"
    assert served, f"{path.name}: no vLLM pod template"
