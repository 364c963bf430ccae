"""The admission check's rules as plain functions: is a Workload ours and what to do, the gang
its pod sets ask for, the wait, Kueue's node constraints, pod set updates, status bodies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.controllers.kueue import assignment, workload_gang
from extender.controllers.kueue import contract as kueue
from extender.controllers.kueue.contract import Action, CheckConfig, Stage
from extender.cost import Comm
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.slice import Slice, Unplaceable
from extender.placement.solver import place
from extender.testing.fixtures import load_cluster_fixture, load_fixture
from extender.topology.hierarchy import Hierarchy, parse_levels

OURS = {"gangslice"}
LEAF = "fabric.topograph.run/tier-0"
SPINE = "fabric.topograph.run/tier-1"


def hierarchy() -> Hierarchy:
    return Hierarchy(parse_levels([SPINE, LEAF]))


def with_condition(wl: dict[str, Any], kind: str, status: str) -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    wl["status"]["conditions"] = [c for c in wl["status"]["conditions"] if c["type"] != kind] + [
        {
            "type": kind,
            "status": status,
            "reason": kind,
            "message": "",
            "lastTransitionTime": "2026-08-25T11:00:00Z",
        }
    ]
    return wl


def with_state(wl: dict[str, Any], state: str) -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    wl["status"]["admissionChecks"][0]["state"] = state
    return wl


# -- decide ------------------------------------------------------------------------------------


def test_a_quota_reserved_workload_with_our_pending_check_is_placed() -> None:
    action, why = kueue.decide(load_fixture("kueue/workload-lws.yaml"), OURS, holds=False)
    assert action is Action.PLACE
    assert "Pending" in why


def test_a_workload_without_our_check_is_not_ours() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    assert kueue.decide(wl, {"provision-2"}, holds=False)[0] is Action.IGNORE
    # "provision" is on the Workload but belongs to another controller: still not ours.
    assert kueue.decide(wl, set(), holds=True)[0] is Action.RELEASE


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda wl: with_condition(wl, "Finished", "True"), "finished"),
        (lambda wl: with_condition(wl, "Evicted", "True"), "evicted"),
        (lambda wl: with_condition(wl, "QuotaReserved", "False"), "no quota"),
        (lambda wl: {**wl, "spec": {**wl["spec"], "active": False}}, "deactivated"),
        (lambda wl: with_state(wl, "Retry"), "Retry"),
        (lambda wl: with_state(wl, "Rejected"), "Rejected"),
    ],
)
def test_finished_evicted_deactivated_or_bounced_workloads_release(change: Any, why: str) -> None:
    wl = change(load_fixture("kueue/workload-lws.yaml"))
    action, reason = kueue.decide(wl, OURS, holds=True)
    assert action is Action.RELEASE
    assert why in reason
    assert kueue.decide(wl, OURS, holds=False)[0] is Action.IGNORE


def test_ready_is_kept_and_a_requeued_workload_is_placed_again() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    assert kueue.decide(with_state(wl, "Ready"), OURS, holds=True)[0] is Action.KEEP
    requeued = with_condition(wl, "Evicted", "False")
    assert kueue.decide(requeued, OURS, holds=False)[0] is Action.PLACE


def test_a_delayed_topology_request_is_left_alone() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["status"]["admission"]["podSetAssignments"][0]["delayedTopologyRequest"] = "Pending"
    assert kueue.decide(wl, OURS, holds=False)[0] is Action.IGNORE


# -- the gang a Workload asks for --------------------------------------------------------------


def test_gang_from_the_leader_worker_workload() -> None:
    wg = workload_gang.gang_from_workload(load_fixture("kueue/workload-lws.yaml"), hierarchy())
    g = wg.request
    assert g.name == "serving/leaderworkerset-vllm-0-3f2a1"
    leader, worker = g.pod_set("leader"), g.pod_set("worker")
    assert (leader.count, leader.gpus_per_pod, worker.count, worker.gpus_per_pod) == (1, 8, 3, 8)
    assert leader.comm is Comm.ALLREDUCE
    # Kueue's label key becomes our level name; the group becomes a colocation at that level.
    assert worker.preferred_level == "leaf" and worker.required_level is None
    assert leader.colocate_with == Colocation("worker", "leaf")
    assert worker.colocate_with is None
    assert wg.notes == ()


def test_partial_admission_count_and_gangslice_annotations_win() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["status"]["admission"]["podSetAssignments"][1]["count"] = 2
    tmpl = wl["spec"]["podSets"][1]["template"]["metadata"]["annotations"]
    tmpl["gangslice.io/required-level"] = "spine"
    tmpl["gangslice.io/preferred-level"] = "nvlink"
    worker = workload_gang.gang_from_workload(wl, hierarchy()).request.pod_set("worker")
    assert worker.count == 2
    assert (worker.required_level, worker.preferred_level) == ("spine", "nvlink")


def test_kueue_levels_gangslice_does_not_model_are_left_to_kueue() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    for ps in wl["spec"]["podSets"]:
        ps["topologyRequest"] = {"required": "cloud.example.com/block"}
        del ps["template"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"]
    wg = workload_gang.gang_from_workload(wl, hierarchy())
    assert all(ps.required_level is None for ps in wg.request.pod_sets)
    assert any("cloud.example.com/block" in n for n in wg.notes)


@pytest.mark.parametrize(
    ("annotation", "value", "message"),
    [
        ("gangslice.io/required-level", "rack", "unknown level 'rack'"),
        ("gangslice.io/comm", "ring", "is not one of"),
        ("gangslice.io/colocate-with", "leader@galaxy", "unknown level 'galaxy'"),
    ],
)
def test_bad_gangslice_annotations_are_errors(annotation: str, value: str, message: str) -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["spec"]["podSets"][1]["template"]["metadata"]["annotations"][annotation] = value
    with pytest.raises(workload_gang.WorkloadError, match=message):
        workload_gang.gang_from_workload(wl, hierarchy())


def test_an_unreadable_gpu_quantity_is_an_error() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = (
        "1.5"
    )
    with pytest.raises(workload_gang.WorkloadError, match="pod set leader"):
        workload_gang.gang_from_workload(wl, hierarchy())


def test_strict_gang_makes_combinable_preferences_required() -> None:
    h = hierarchy()

    def gang(required: str | None, preferred: str | None) -> GangRequest:
        return GangRequest("ns/g", (PodSet("p", 2, 4, required_level=required, preferred_level=preferred),))

    tightened = workload_gang.strict_gang(gang(None, "leaf"), h)
    assert tightened is not None and tightened.pod_set("p").required_level == "leaf"
    tightened = workload_gang.strict_gang(gang("spine", "leaf"), h)
    assert tightened is not None and tightened.pod_set("p").required_level == "leaf"
    tightened = workload_gang.strict_gang(gang("numa", "nvlink"), h)
    assert tightened is not None and tightened.pod_set("p").required_level == "nvlink"
    assert workload_gang.strict_gang(gang("node", "nvlink"), h) is None  # one level cannot say both
    assert workload_gang.strict_gang(gang("leaf", "spine"), h) is None  # not tighter
    assert workload_gang.strict_gang(gang("leaf", None), h) is None


# -- the wait ----------------------------------------------------------------------------------


def test_wait_stages() -> None:
    cfg = CheckConfig(widen_after_s=100, retry_after_s=50)
    assert kueue.wait_stage(0, cfg) is Stage.STRICT
    assert kueue.wait_stage(99.9, cfg) is Stage.STRICT
    assert kueue.wait_stage(100, cfg) is Stage.WIDENED
    assert kueue.wait_stage(149.9, cfg) is Stage.WIDENED
    assert kueue.wait_stage(150, cfg) is Stage.RETRY
    assert kueue.wait_started(load_fixture("kueue/workload-lws.yaml")) == "2026-08-25T10:00:00Z"


# -- Kueue's node constraints ------------------------------------------------------------------


def test_topology_assignment_decoding() -> None:
    ta = {
        "levels": [LEAF, "kubernetes.io/hostname"],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "leaf-b"},
                    {"individual": {"prefix": "b-", "roots": ["1", "3"]}},
                ],
                "podCounts": {"individual": [2, 1]},
            },
            {
                "domainCount": 1,
                "valuesPerLevel": [{"universal": "leaf-a"}, {"universal": "a-0"}],
                "podCounts": {"universal": 4},
            },
        ],
    }
    assert list(assignment.iter_topology_domains(ta)) == [
        ({LEAF: "leaf-b", "kubernetes.io/hostname": "b-1"}, 2),
        ({LEAF: "leaf-b", "kubernetes.io/hostname": "b-3"}, 1),
        ({LEAF: "leaf-a", "kubernetes.io/hostname": "a-0"}, 4),
    ]


def test_flavor_labels_and_template_selector_restrict_the_nodes() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    wl = load_fixture("kueue/workload-lws.yaml")
    wl["spec"]["podSets"][1]["template"]["spec"]["nodeSelector"] = {LEAF: "leaf-b"}
    allowed = assignment.pod_set_nodes(wl, {"h100": {"gangslice.io/pool": "h100"}})
    assert allowed["worker"].selector == {LEAF: "leaf-b", "gangslice.io/pool": "h100"}
    assert allowed["leader"].selector == {"gangslice.io/pool": "h100"}
    assert len(assignment.restrict(snap, allowed).nodes) == 8  # the leader may go anywhere in the pool
    every, some = assignment.candidate_views(snap, allowed)
    assert {n.name[0] for n in every.nodes} == {"b"} and len(some.nodes) == 8
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    got = assignment.solve(snap, gang, Stage.WIDENED, allowed, "")
    assert isinstance(got, Slice)
    assert {s.node[0] for s in got.slots if s.pod_set == "worker"} == {"b"}


def test_a_slice_outside_the_flavor_is_refused() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    wl = load_fixture("kueue/workload-lws.yaml")
    allowed = assignment.pod_set_nodes(wl, {"h100": {"gangslice.io/pool": "a100"}})
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    got = assignment.solve(snap, gang, Stage.WIDENED, allowed, "")
    assert isinstance(got, Unplaceable)


def test_tas_assignment_is_placed_domain_by_domain() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    wl = load_fixture("kueue/workload-job-tas.yaml")
    allowed = assignment.pod_set_nodes(wl, {"h100": {"gangslice.io/pool": "h100"}})
    assert [c for _, c in allowed["main"].domains] == [1, 1]
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    got = assignment.solve(snap, gang, Stage.STRICT, allowed, "")
    assert isinstance(got, Slice)
    assert sorted(s.node for s in got.slots) == ["b-1", "b-2"]
    assert all(len(s.gpus) == 4 for s in got.slots)
    assert [s.index for s in got.slots] == [0, 1]
    assert assignment.assignment_problem(got, snap, allowed) is None


def test_tas_assignment_on_a_full_node_says_which_domain() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    busy = [
        n if n.name != "b-2" else type(n)(n.name, n.labels, n.graph, frozenset(range(6))) for n in snap.nodes
    ]
    snap = type(snap)(busy, snap.hierarchy)
    wl = load_fixture("kueue/workload-job-tas.yaml")
    allowed = assignment.pod_set_nodes(wl, {})
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    got = assignment.solve(snap, gang, Stage.WIDENED, allowed, "")
    assert isinstance(got, Unplaceable)
    assert "kubernetes.io/hostname=b-2" in got.reason


def test_assignment_problem_names_a_count_mismatch() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    wl = load_fixture("kueue/workload-job-tas.yaml")
    allowed = assignment.pod_set_nodes(wl, {})
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    view = assignment.restrict(snap, allowed)
    assert sorted(n.name for n in view.nodes) == ["b-1", "b-2"]
    packed = place(view, gang)  # the solver alone packs both pods on one node
    assert isinstance(packed, Slice)
    problem = assignment.assignment_problem(packed, view, allowed)
    assert problem is not None and "Kueue's topology assignment puts 1 pod(s)" in problem


# -- pod set updates ---------------------------------------------------------------------------


def test_shared_domain_selector() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    assert assignment.shared_domain_selector(snap, ["a-1", "a-1"]) == {"kubernetes.io/hostname": "a-1"}
    assert assignment.shared_domain_selector(snap, ["a-0", "a-2"]) == {SPINE: "spine-1", LEAF: "leaf-a"}
    assert assignment.shared_domain_selector(snap, ["a-0", "b-0"]) == {SPINE: "spine-1"}
    assert assignment.shared_domain_selector(snap, []) == {}


def test_pod_set_updates_carry_only_our_keys() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    wl = load_fixture("kueue/workload-lws.yaml")
    allowed = assignment.pod_set_nodes(wl, {"h100": {"gangslice.io/pool": "h100"}})
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    sl = assignment.solve(snap, gang, Stage.STRICT, allowed, "")
    assert isinstance(sl, Slice)
    updates = assignment.pod_set_updates(wl, sl, snap, "vllm-0", allowed)
    assert [u["name"] for u in updates] == ["leader", "worker"]
    for u in updates:
        assert set(u) <= {"name", "annotations", "nodeSelector"}
        assert u["annotations"] == {"gangslice.io/reservation": "vllm-0"}
    leader_node = next(s.node for s in sl.slots if s.pod_set == "leader")
    assert updates[0]["nodeSelector"] == {"kubernetes.io/hostname": leader_node}
    assert updates[1]["nodeSelector"] == {SPINE: "spine-1", LEAF: "leaf-a"}


def test_pod_set_updates_leave_tas_levels_to_kueue() -> None:
    snap = load_cluster_fixture("kueue/cluster.yaml")
    wl = load_fixture("kueue/workload-job-tas.yaml")
    allowed = assignment.pod_set_nodes(wl, {})
    gang = workload_gang.gang_from_workload(wl, snap.hierarchy).request
    sl = assignment.solve(snap, gang, Stage.WIDENED, allowed, "")
    assert isinstance(sl, Slice)
    (update,) = assignment.pod_set_updates(wl, sl, snap, "job", allowed)
    assert "kubernetes.io/hostname" not in update.get("nodeSelector", {})
    assert update["nodeSelector"] == {SPINE: "spine-1", LEAF: "leaf-b"}


# -- status bodies -----------------------------------------------------------------------------


def test_check_entry_moves_the_transition_time_only_with_the_state() -> None:
    current = load_fixture("kueue/workload-lws.yaml")["status"]["admissionChecks"][0]
    same = kueue.check_entry(current, "Pending", "waiting", "2026-08-25T10:01:00Z")
    assert same["lastTransitionTime"] == "2026-08-25T10:00:00Z"
    assert same["podSetUpdates"] == []
    moved = kueue.check_entry(current, "Ready", "ok", "2026-08-25T10:01:00Z")
    assert moved["lastTransitionTime"] == "2026-08-25T10:01:00Z"
    long = kueue.check_entry(current, "Pending", "x" * 40000, "2026-08-25T10:01:00Z")
    assert len(long["message"]) == kueue.MESSAGE_LIMIT
    assert kueue.entry_unchanged(current, kueue.check_entry(current, "Pending", "", "now"))
    assert not kueue.entry_unchanged(current, same)


def test_workload_apply_body_holds_only_the_entries_given() -> None:
    wl = load_fixture("kueue/workload-lws.yaml")
    entry = kueue.check_entry(wl["status"]["admissionChecks"][0], "Pending", "m", "2026-08-25T10:01:00Z")
    body = kueue.workload_apply_body(wl, [entry])
    assert body["metadata"] == {
        "name": "leaderworkerset-vllm-0-3f2a1",
        "namespace": "serving",
        "resourceVersion": "8812731",
    }
    assert body["status"] == {"admissionChecks": [entry]}
    assert set(body) == {"apiVersion", "kind", "metadata", "status"}


def test_admission_check_active_condition() -> None:
    ac = load_fixture("kueue/admissioncheck.yaml")
    body = kueue.admission_check_apply_body(ac, "2026-08-25T10:00:00Z")
    assert body is not None
    (cond,) = body["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["observedGeneration"]) == (
        "Active",
        "True",
        "Active",
        1,
    )
    ac["status"] = {"conditions": [cond]}
    assert kueue.admission_check_apply_body(ac, "2026-08-25T11:00:00Z") is None

    bad = load_fixture("kueue/admissioncheck-bad-params.yaml")
    body = kueue.admission_check_apply_body(bad, "2026-08-25T10:00:00Z")
    assert body is not None
    (cond,) = body["status"]["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "BadParametersRef")
    assert "SliceCheckConfig" in cond["message"]
    assert not kueue.is_our_check(load_fixture("kueue/admissioncheck-provisioning.yaml"))
