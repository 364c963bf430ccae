"""Gangs of the upstream Workload API (``scheduling.k8s.io/v1beta1`` PodGroups, Kubernetes 1.37) through
kube-scheduler's own gang scheduling and gangslice's extender, on the real control plane.

A control plane of its own, with the ``GenericWorkload`` and ``TopologyAwareWorkloadScheduling`` feature
gates on in kube-apiserver and kube-scheduler and the beta API served
(``--runtime-config=scheduling.k8s.io/v1beta1=true``): kube-scheduler then holds a PodGroup's pods back until
``minCount`` of them exist, schedules them in one gang cycle (one candidate placement per value of the
PodGroup's topology key) and binds none until all found a node. Without the second gate the API server
drops ``schedulingConstraints`` from the PodGroups it stores. gangslice (``serve`` under the shipped RBAC,
the shipped extender config) reads the PodGroup as the gang: it places the whole slice on the first
member's filter, under the level the PodGroup's topology key names, and each member is offered its slot
alone. No kubelet runs:
:class:`KubeletStandIn` marks bound pods Running.

Tests: a gang of 4 binds whole under one leaf, kube-scheduler records the group scheduled, and the extender is
asked about each pod about once (no double work); a gang short
of ``minCount`` is held by kube-scheduler with nothing reserved (no double work, no early hold), then binds
once its last pod comes; a pod added to a running gang (a scale-up) gets a slot beside it; a topology key
no level carries leaves the pods Pending with the reason on their PodScheduled condition.

Nodes (pool ``wl``): spine s1 with leaves a and b of two HGX H100 nodes (8 GPUs) each.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import (
    LEAF,
    REPO,
    Gangslice,
    KubeletStandIn,
    clean_namespace,
    create,
    double_booked,
    extender_stack,
    get,
    gpu_pod,
    hgx_leaves,
    items,
    new_namespace,
    placed,
    reservations_of,
    running_control_plane,
    scheduled_condition,
    slot_places,
    wait_for,
    wait_for_or_false,
)
from cluster import POOL as POOL_LABEL

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

POOL = "wl"
NODES = hgx_leaves(POOL, 2)
LEAF_OF = {n.name: n.leaf for n in NODES}
GROUPS = "/apis/scheduling.k8s.io/v1beta1"
#: Seconds for every pod of a gang to bind.
BIND_S = 60.0
#: Seconds a gang short of minCount is watched to stay unbound and unreserved.
HELD_S = 6.0


@pytest.fixture(scope="module")
def control_plane(e2e_bin_dir: Path) -> Iterator[ControlPlane]:
    with running_control_plane(
        e2e_bin_dir,
        feature_gates={"GenericWorkload": True, "TopologyAwareWorkloadScheduling": True},
        extra_apiserver_args=["--runtime-config=scheduling.k8s.io/v1beta1=true"],
    ) as cp:
        yield cp


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    with extender_stack(control_plane, POOL, NODES, name="gangslice-workload") as server:
        yield server


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[KubeletStandIn]:
    stand_in = KubeletStandIn(control_plane, LEAF_OF).start()
    try:
        yield stand_in
    finally:
        stand_in.stop()


@pytest.fixture
def ns(control_plane: ControlPlane, gangslice: Gangslice, kubelet: KubeletStandIn) -> Iterator[str]:
    cp = control_plane
    name = new_namespace(cp, f"{POOL}-{uuid.uuid4().hex[:6]}")
    try:
        yield name
    finally:
        for group in cp.request("GET", f"{GROUPS}/namespaces/{name}/podgroups")["items"]:
            cp.request("DELETE", f"{GROUPS}/namespaces/{name}/podgroups/{group['metadata']['name']}")
        clean_namespace(cp, name)


# ---------------------------------------------------------------------------------------------- objects
def install_guide_recipe() -> tuple[dict[str, Any], dict[str, Any]]:
    """The PodGroup and the pod fields of docs/install.md's "Upstream gangs" recipe."""
    text = (REPO / "docs" / "install.md").read_text()
    block = next(b for b in text.split("```yaml")[1:] if "kind: PodGroup" in b).split("```")[0]
    group, pod = yaml.safe_load_all(block)
    return group, pod


def pod_group(cp: ControlPlane, ns: str, name: str, min_count: int, topology: str | None = LEAF) -> None:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    obj = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }
    cp.request("POST", f"{GROUPS}/namespaces/{ns}/podgroups", obj)


def member(ns: str, group: str, index: int, gpus: int = 4) -> dict[str, Any]:
    """A bare pod that joins PodGroup ``group``: no gangslice label or size annotation at all."""
    pod = gpu_pod(f"{group}-{index}", gpus, POOL)
    pod["metadata"]["namespace"] = ns
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def members(cp: ControlPlane, ns: str, group: str) -> list[dict[str, Any]]:
    pods = [
        p
        for p in items(cp, "Pod", ns)
        if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == group
    ]
    return sorted(pods, key=lambda p: str(p["metadata"]["name"]))


def bound(cp: ControlPlane, ns: str, group: str, count: int) -> list[dict[str, Any]] | None:
    pods = members(cp, ns, group)
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None


def reservation(cp: ControlPlane, ns: str, group: str) -> dict[str, Any] | None:
    found = reservations_of(cp, ns, group)
    return found[0] if len(found) == 1 else None


def leaves(pods: list[dict[str, Any]]) -> set[str]:
    return {LEAF_OF[str(p["spec"]["nodeName"])] for p in pods}


def condition(cp: ControlPlane, ns: str, group: str, kind: str) -> dict[str, Any] | None:
    got = cp.request("GET", f"{GROUPS}/namespaces/{ns}/podgroups/{group}")
    return next((c for c in (got.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def filter_calls(server: Gangslice) -> float:
    """The extender's filter calls so far (``gangslice_extender_requests_total``)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in server.metrics().splitlines()
        if line.startswith("gangslice_extender_requests_total{") and 'verb="filter"' in line
    )


# ---------------------------------------------------------------------------------------------- tests
def test_a_pod_group_binds_whole_under_its_topology_level_in_kube_schedulers_gang_cycle(
    control_plane: ControlPlane, ns: str, gangslice: Gangslice
) -> None:
    """The install guide's recipe, as written but for its namespace."""
    cp = control_plane
    group, fields = install_guide_recipe()
    group["metadata"]["namespace"] = ns
    cp.request("POST", f"{GROUPS}/namespaces/{ns}/podgroups", group)
    assert group["spec"]["schedulingConstraints"]["topology"] == [{"key": LEAF}]
    before = filter_calls(gangslice)
    start = time.monotonic()
    for i in range(group["spec"]["schedulingPolicy"]["gang"]["minCount"]):
        pod = member(ns, "ep", i)
        pod["spec"].update(fields["spec"])
        create(cp, pod)
    pods = wait_for("the 4 pods of PodGroup ep bound", lambda: bound(cp, ns, "ep", 4), BIND_S)
    took = time.monotonic() - start
    # No double work: kube-scheduler's gang cycle (one candidate placement per leaf) asks the extender
    # about each pod about once, and each answer comes from the slice held since the first.
    calls = filter_calls(gangslice) - before
    assert calls <= 2 * 4, calls
    r = reservation(cp, ns, "ep")
    assert r is not None, reservations_of(cp, ns, "ep")
    assert slot_places(r) == placed(pods), (slot_places(r), placed(pods))
    assert len(leaves(pods)) == 1, placed(pods)  # 4 x 4 GPUs fit one leaf of 2 nodes
    assert double_booked(cp, LEAF_OF) == {}
    scheduled = wait_for(
        "kube-scheduler's PodGroupInitiallyScheduled condition",
        lambda: condition(cp, ns, "ep", "PodGroupInitiallyScheduled"),
        15.0,
    )
    assert scheduled["status"] == "True", scheduled
    assert took < BIND_S


def test_kube_scheduler_holds_a_short_gang_and_gangslice_reserves_nothing_until_min_count_pods_exist(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    pod_group(cp, ns, "tp", min_count=3)
    for i in range(2):
        create(cp, member(ns, "tp", i))
    early = wait_for_or_false(
        lambda: (
            any(p["spec"].get("nodeName") for p in members(cp, ns, "tp"))
            or bool(reservations_of(cp, ns, "tp"))
        ),
        HELD_S,
    )
    assert not early, (placed(members(cp, ns, "tp")), reservations_of(cp, ns, "tp"))
    create(cp, member(ns, "tp", 2))
    pods = wait_for("the 3 pods of PodGroup tp bound", lambda: bound(cp, ns, "tp", 3), BIND_S)
    r = reservation(cp, ns, "tp")
    assert r is not None and slot_places(r) == placed(pods)
    assert len(leaves(pods)) == 1 and double_booked(cp, LEAF_OF) == {}


def test_a_pod_added_to_a_running_gang_gets_a_slot_beside_it(control_plane: ControlPlane, ns: str) -> None:
    cp = control_plane
    pod_group(cp, ns, "dp", min_count=2)
    for i in range(2):
        create(cp, member(ns, "dp", i))
    first = wait_for("the 2 pods of PodGroup dp bound", lambda: bound(cp, ns, "dp", 2), BIND_S)
    create(cp, member(ns, "dp", 2))  # a scale-up: no size to edit anywhere
    pods = wait_for("the third pod of PodGroup dp bound", lambda: bound(cp, ns, "dp", 3), BIND_S)
    assert placed(first) == placed(pods[:2])  # the running pods stay put
    r = reservation(cp, ns, "dp")
    assert r is not None and slot_places(r) == placed(pods)
    assert leaves(pods) == leaves(first) and double_booked(cp, LEAF_OF) == {}


def test_a_topology_key_that_is_no_level_leaves_the_pods_pending_saying_why(
    control_plane: ControlPlane, ns: str
) -> None:
    cp = control_plane
    pod_group(cp, ns, "row", min_count=2, topology=POOL_LABEL)
    for i in range(2):
        create(cp, member(ns, "row", i))

    def reason() -> str | None:
        pod = get(cp, "Pod", "row-0", ns) or {}
        message = str((scheduled_condition(pod) or {}).get("message", ""))
        return message if POOL_LABEL in message else None

    message = wait_for("the PodScheduled condition naming the key", reason, BIND_S)
    assert LEAF in message, message
    assert not any(p["spec"].get("nodeName") for p in members(cp, ns, "row"))
    assert not reservations_of(cp, ns, "row")
