"""Pod feasibility: kube-scheduler's NodeUnschedulable, TaintToleration, NodeAffinity and
NodeResourcesFit filters as plain rules (extender/placement/feasibility.py), kept by every
policy, read from files and pod specs, and named in the reasons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extender.kube.pod_needs import NeedsError, pod_needs, pod_requests
from extender.peers import POLICIES
from extender.placement import feasibility, quantities, scoring
from extender.placement.feasibility import NOTHING, NodeFacts, Resources, Taint
from extender.placement.files import FileError, cluster_from_data, gang_from_data
from extender.placement.request import (
    GangRequest,
    NodeNeeds,
    NodeRequirement,
    NodeTerm,
    PodRequests,
    PodSet,
    PreferredTerm,
    Toleration,
)
from extender.placement.slice import Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import Solver
from extender.topology.presets import preset_graph

GI = 2**30
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


# -- TaintToleration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("nvidia.com/gpu", "Exists"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "present"), GPU_TAINT, True),
        (Toleration("nvidia.com/gpu", "Equal", "absent"), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"), GPU_TAINT, False),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), GPU_TAINT, True),
        (Toleration("other", "Exists"), GPU_TAINT, False),
        (Toleration("", "Exists"), GPU_TAINT, True),  # empty key + Exists: every taint
        (Toleration("", "Exists", effect="NoExecute"), Taint("x", "", "NoExecute"), True),
    ],
    ids=lambda v: str(v),
)
def test_a_toleration_tolerates_a_taint_as_core_v1_says(
    toleration: Toleration, taint: Taint, tolerated: bool
) -> None:
    assert feasibility.tolerates(toleration, taint) is tolerated


def test_no_schedule_and_no_execute_taints_refuse_prefer_no_schedule_does_not() -> None:
    soft = NodeFacts(taints=(Taint("maintenance", "", "PreferNoSchedule"),))
    assert feasibility.refusal(NodeNeeds(), "n", {}, soft) is None
    for effect in ("NoSchedule", "NoExecute"):
        hard = NodeFacts(taints=(Taint("dedicated", "llm", effect),))
        got = feasibility.refusal(NodeNeeds(), "n", {}, hard)
        assert got is not None and got.filter == "TaintToleration"
        assert f"dedicated=llm:{effect}" in got.reason and "spec.tolerations" in got.reason
        tolerant = NodeNeeds(tolerations=(Toleration("dedicated", "Equal", "llm"),))
        assert feasibility.refusal(tolerant, "n", {}, hard) is None


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"operator": "Gt"}, "operator 'Gt'"),
        ({"effect": "NoRun"}, "effect 'NoRun'"),
        ({"operator": "Exists", "value": "x"}, "takes no value"),
        ({"key": "", "operator": "Equal"}, "empty key"),
    ],
)
def test_a_toleration_core_v1_would_not_take_is_refused(fields: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Toleration(**{"key": "k", **fields})


# -- NodeUnschedulable --------------------------------------------------------------------------


def test_a_cordoned_node_admits_only_pods_that_tolerate_the_unschedulable_taint() -> None:
    cordoned = NodeFacts(unschedulable=True)
    got = feasibility.refusal(NodeNeeds(), "n", {}, cordoned)
    assert got is not None and got.filter == "NodeUnschedulable" and "spec.unschedulable" in got.reason
    for t in (Toleration(feasibility.UNSCHEDULABLE_TAINT, "Exists"), Toleration("", "Exists")):
        assert feasibility.refusal(NodeNeeds(tolerations=(t,)), "n", {}, cordoned) is None
    wrong_effect = Toleration(feasibility.UNSCHEDULABLE_TAINT, "Exists", effect="NoExecute")
    assert feasibility.refusal(NodeNeeds(tolerations=(wrong_effect,)), "n", {}, cordoned) is not None


# -- NodeAffinity -------------------------------------------------------------------------------


def test_node_selector_entries_are_anded_and_required_terms_ored() -> None:
    labels = {"zone": "a", "disk": "nvme"}
    both = NodeNeeds((NodeRequirement("zone", "In", ("a",)), NodeRequirement("disk", "In", ("nvme",))))
    assert feasibility.refusal(both, "n1", labels, NodeFacts()) is None
    wrong = NodeNeeds((NodeRequirement("zone", "In", ("a",)), NodeRequirement("disk", "In", ("hdd",))))
    got = feasibility.refusal(wrong, "n1", labels, NodeFacts())
    assert got is not None and got.filter == "NodeAffinity" and "disk=hdd" in got.reason
    terms = (
        NodeTerm((NodeRequirement("zone", "In", ("b",)),)),
        NodeTerm((NodeRequirement("disk", "Exists"),)),
    )
    assert feasibility.refusal(NodeNeeds(affinity=terms), "n1", labels, NodeFacts()) is None
    assert feasibility.refusal(NodeNeeds(affinity=terms[:1]), "n1", labels, NodeFacts()) is not None


def test_match_fields_select_by_node_name_and_an_empty_term_selects_nothing() -> None:
    only_n1 = NodeTerm(fields=(NodeRequirement("metadata.name", "In", ("n1",)),))
    assert only_n1.matches("n1", {}) and not only_n1.matches("n2", {})
    not_n1 = NodeTerm(fields=(NodeRequirement("metadata.name", "NotIn", ("n1",)),))
    assert not not_n1.matches("n1", {}) and not_n1.matches("n2", {})
    assert not NodeTerm().matches("n1", {"a": "b"})
    with pytest.raises(ValueError, match=r"only metadata\.name"):
        NodeTerm(fields=(NodeRequirement("metadata.namespace", "In", ("x",)),))


def test_preferred_terms_sum_their_weights() -> None:
    prefs = (
        PreferredTerm(10, NodeTerm((NodeRequirement("disk", "In", ("nvme",)),))),
        PreferredTerm(5, NodeTerm(fields=(NodeRequirement("metadata.name", "In", ("n1",)),))),
    )
    assert feasibility.preference(prefs, "n1", {"disk": "nvme"}) == 15
    assert feasibility.preference(prefs, "n2", {"disk": "nvme"}) == 10
    assert feasibility.preference(prefs, "n2", {}) == 0


# -- NodeResourcesFit ---------------------------------------------------------------------------


def test_room_counts_allocatable_less_what_pods_on_the_node_and_the_gang_request() -> None:
    facts = NodeFacts(
        allocatable=Resources(cpu_millis=64_000, memory_bytes=512 * GI, ephemeral_bytes=100 * GI, pods=10),
        requested=Resources(16_000, 128 * GI, 0, 4),
    )
    ask = PodRequests(cpu_millis=8_000, memory_bytes=100 * GI)
    assert feasibility.room(ask, facts) == 3  # memory: 384Gi left / 100Gi
    assert feasibility.room(ask, facts, feasibility.usage(ask, 2)) == 1
    assert feasibility.room(ask, facts, feasibility.usage(ask, 3)) == 0
    assert feasibility.room(PodRequests(), facts) == 6  # no requests: only the pod count
    disk = PodRequests(ephemeral_bytes=60 * GI)
    assert feasibility.room(disk, facts) == 1


def test_a_resource_the_node_does_not_report_limits_nothing() -> None:
    facts = NodeFacts(allocatable=Resources(cpu_millis=1000))
    assert feasibility.room(PodRequests(memory_bytes=10**15), facts) == feasibility.UNLIMITED
    assert feasibility.room(PodRequests(cpu_millis=400), facts) == 2


@pytest.mark.parametrize(
    ("taken", "words"),
    [
        (Resources(0, 0, 0, 10), "too many pods (10 of allocatable pods 10)"),
        (Resources(60_000, 0, 0, 1), "insufficient cpu: requests.cpu 8000m, allocatable 64000m"),
        (Resources(0, 500 * GI, 0, 1), "insufficient memory"),
    ],
)
def test_the_resources_fit_refusal_names_the_resource(taken: Resources, words: str) -> None:
    facts = NodeFacts(allocatable=Resources(64_000, 512 * GI, None, 10))
    got = feasibility.room_refusal(PodRequests(8_000, 100 * GI), facts, taken)
    assert got is not None and got.filter == "NodeResourcesFit" and words in got.reason


# -- quantities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "milli", "whole"),
    [
        ("500m", 500, 1),
        ("2", 2000, 2),
        ("1.5", 1500, 2),
        ("64Gi", 64 * GI * 1000, 64 * GI),
        ("1G", 10**12, 10**9),
        ("2e3", 2_000_000, 2000),
        (".5", 500, 1),
        ("0.1m", 1, 1),  # MilliValue rounds up
        (8, 8000, 8),
    ],
)
def test_quantities_read_as_resource_quantity_does(text: Any, milli: int, whole: int) -> None:
    assert quantities.milli(text) == milli and quantities.whole(text) == whole


@pytest.mark.parametrize("bad", ["1Gx", "abc", "", " 1", "1.2.3", "-1", True])
def test_a_quantity_that_does_not_parse_says_so(bad: Any) -> None:
    with pytest.raises(quantities.QuantityError):
        quantities.whole(bad)


# -- pod specs ----------------------------------------------------------------------------------


def _container(
    name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


def test_pod_requests_sum_containers_take_the_init_peak_add_sidecars_and_overhead() -> None:
    spec = {
        "containers": [
            _container("main", limits={"cpu": "2", "memory": "4Gi"}),  # limits stand in for requests
            _container("side", requests={"cpu": "500m", "ephemeral-storage": "10Gi"}),
        ],
        "initContainers": [
            _container("fetch", requests={"cpu": "8"}),
            _container("proxy", requests={"memory": "1Gi"}, restartPolicy="Always"),
        ],
        "overhead": {"memory": "128Mi"},
    }
    got = pod_requests(spec)
    assert got.cpu_millis == 8000  # the init container's 8 beats the containers' 2.5
    assert got.memory_bytes == 5 * GI + 128 * 2**20  # 4Gi + the 1Gi sidecar + overhead
    assert got.ephemeral_bytes == 10 * GI
    assert not got.guaranteed


def test_guaranteed_when_every_container_sets_cpu_and_memory_limits_equal_to_requests() -> None:
    same = {"cpu": "16", "memory": "256Gi"}
    assert pod_requests({"containers": [_container("m", same, same)]}).guaranteed
    assert pod_requests({"containers": [_container("m", limits=same)]}).guaranteed
    assert not pod_requests(
        {"containers": [_container("m", {"cpu": "8", "memory": "256Gi"}, same)]}
    ).guaranteed
    assert not pod_requests({"containers": [_container("m", {"cpu": "16"}, {"cpu": "16"})]}).guaranteed


def test_a_pod_spec_gives_selector_affinity_preferences_and_tolerations() -> None:
    term = {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]}]}
    spec = {
        "nodeSelector": {"pool": "gpu"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 7, "preference": term}],
            }
        },
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "a"},
        ],
    }
    got = pod_needs(spec)
    assert got.node_selector == (NodeRequirement("pool", "In", ("gpu",)),)
    assert got.affinity == (NodeTerm((NodeRequirement("disk", "In", ("nvme",)),)),)
    assert got.preferred[0].weight == 7
    assert got.tolerations == (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), Toleration("a"))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"tolerations": [{"key": "a", "operator": "Gt", "value": "1"}]}, "spec.tolerations[0].operator"),
        ({"tolerations": [{"key": "a", "effect": "Sometimes"}]}, "spec.tolerations[0].effect"),
        (
            {"containers": [_container("m", {"memory": "1Gx"})]},
            "spec.containers[m].resources.requests[memory]",
        ),
        ({"containers": [_container("m", limits={"cpu": "-1"})]}, "spec.containers[m].resources.limits[cpu]"),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "k", "operator": "Near", "values": ["x"]}]}
                            ]
                        }
                    }
                }
            },
            "nodeSelectorTerms[0].matchExpressions[0]",
        ),
    ],
)
def test_a_pod_spec_field_that_cannot_be_read_is_named(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(NeedsError, match=field.replace("[", r"\[").replace("]", r"\]")):
        pod_needs(spec)


# -- every policy keeps the filters -------------------------------------------------------------

CLUSTER = {
    "levels": ["fabric.topograph.run/tier-0"],
    "nodes": [
        # Each of a..d is refused by one filter; a policy that ignored it would take the node
        # (they come first in every order).
        {
            "name": "a-tainted",
            "gpuTopology": "hgx-h100",
            "labels": {"leaf": "1", "disk": "nvme"},
            "taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}],
            "allocatable": {"memory": "1Ti", "pods": 110},
        },
        {
            "name": "b-cordoned",
            "gpuTopology": "hgx-h100",
            "labels": {"leaf": "1", "disk": "nvme"},
            "unschedulable": True,
            "allocatable": {"memory": "1Ti", "pods": 110},
        },
        {
            "name": "c-full",
            "gpuTopology": "hgx-h100",
            "labels": {"leaf": "1", "disk": "nvme"},
            "allocatable": {"memory": "100Gi", "pods": 110},
            "requested": {"memory": "50Gi", "pods": 1},
        },
        {
            "name": "d-hdd",
            "gpuTopology": "hgx-h100",
            "labels": {"leaf": "1", "disk": "hdd"},
            "allocatable": {"memory": "1Ti", "pods": 110},
        },
        {
            "name": "e-good",
            "gpuTopology": "hgx-h100",
            "labels": {"leaf": "1", "disk": "nvme"},
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "allocatable": {"memory": "1Ti", "pods": 110},
        },
    ],
}
for _n in CLUSTER["nodes"]:
    _n["labels"]["fabric.topograph.run/tier-0"] = _n["labels"].pop("leaf")

GANG = {
    "name": "llm",
    "podSets": [
        {
            "name": "server",
            "count": 1,
            "gpusPerPod": 8,
            "comm": "allreduce",
            "nodeSelector": {"disk": "nvme"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "requests": {"cpu": "16", "memory": "64Gi"},
        }
    ],
}


def snap() -> ClusterSnapshot:
    return cluster_from_data(CLUSTER, base=Path("."))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_places_only_where_the_filters_admit(policy: str) -> None:
    s, g = snap(), gang_from_data(GANG)
    got = POLICIES[policy](s, g)
    assert isinstance(got, Slice), got
    assert {slot.node for slot in got.slots} == {"e-good"}
    assert not scoring.violations(s, g, got.slots)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_second_pod_finds_no_room_counting_the_first_on_the_same_node(policy: str) -> None:
    # e-good takes 8 GPUs; two 4-GPU pods fit its GPUs but its pods allocatable is 1 more.
    data = {**CLUSTER, "nodes": [{**CLUSTER["nodes"][4], "allocatable": {"pods": 1}}]}
    s = cluster_from_data(data, base=Path("."))
    two = {**GANG, "podSets": [{**GANG["podSets"][0], "count": 2, "gpusPerPod": 4}]}
    got = POLICIES[policy](s, gang_from_data(two))
    assert isinstance(got, Unplaceable), got
    one = {**GANG, "podSets": [{**GANG["podSets"][0], "count": 1, "gpusPerPod": 4}]}
    assert isinstance(POLICIES[policy](s, gang_from_data(one)), Slice)


def test_pods_without_gpus_go_only_where_the_filters_admit_and_there_is_room() -> None:
    data = {**CLUSTER, "nodes": [*CLUSTER["nodes"][:4], {**CLUSTER["nodes"][4], "allocatable": {"pods": 2}}]}
    s = cluster_from_data(data, base=Path("."))
    router = {
        "name": "router",
        "count": 2,
        "gpusPerPod": 0,
        "colocateWith": "server",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    g = gang_from_data({**GANG, "podSets": [GANG["podSets"][0], router]})
    got = Solver(s).place(g)
    assert isinstance(got, Slice), got
    routers = [slot.node for slot in got.slots if slot.pod_set == "router"]
    # One router next to the server (the node's last pod slot), the other wherever admitted.
    assert routers[0] == "e-good" and routers[1] in {"c-full", "d-hdd"}
    assert not scoring.violations(s, g, got.slots)


def test_tolerating_the_taint_and_the_cordon_opens_those_nodes() -> None:
    s = snap()
    ps = gang_from_data(GANG).pod_sets[0]
    everything = PodSet(ps.name, 4, 8, ps.comm, tolerations=(Toleration("", "Exists"),), requests=ps.requests)
    got = Solver(s).place(GangRequest("all", (everything,)))
    assert isinstance(got, Slice), got
    assert {slot.node for slot in got.slots} == {"a-tainted", "b-cordoned", "d-hdd", "e-good"}


def test_an_unplaceable_gang_names_the_filters_that_refused_nodes() -> None:
    s = snap()
    two = {**GANG, "podSets": [{**GANG["podSets"][0], "count": 2}]}
    got = Solver(s).place(gang_from_data(two))
    assert isinstance(got, Unplaceable)
    for words in (
        "TaintToleration",
        "dedicated=training:NoSchedule",
        "NodeUnschedulable",
        "spec.unschedulable",
        "NodeAffinity",
        "disk=nvme",
        "NodeResourcesFit",
        "insufficient memory",
    ):
        assert words in got.reason, (words, got.reason)


def test_violations_name_the_filter_a_slot_breaks() -> None:
    s, g = snap(), gang_from_data(GANG)
    from extender.placement.slice import PodSlot

    for node, filt in (
        ("a-tainted", "TaintToleration"),
        ("b-cordoned", "NodeUnschedulable"),
        ("c-full", "NodeResourcesFit"),
        ("d-hdd", "NodeAffinity"),
    ):
        problems = scoring.violations(s, g, [PodSlot("server", 0, node, tuple(range(8)))])
        assert any(f"{node} refused by {filt}" in p for p in problems), problems


def test_preferred_node_affinity_breaks_a_tie() -> None:
    nodes = [
        NodeState(f"n{i}", {"fabric.topograph.run/tier-0": "1", "rack": str(i)}, preset_graph("hgx-h100"))
        for i in range(3)
    ]
    s = ClusterSnapshot(nodes, snap().hierarchy)
    wish = PreferredTerm(20, NodeTerm((NodeRequirement("rack", "In", ("2",)),)))
    g = GangRequest("g", (PodSet("s", 1, 8, preferred=(wish,)),))
    got = Solver(s).place(g)
    assert isinstance(got, Slice) and got.slots[0].node == "n2"
    plain = Solver(s).place(GangRequest("g", (PodSet("s", 1, 8),)))
    assert isinstance(plain, Slice) and plain.slots[0].node == "n0"


def test_file_fields_that_cannot_be_read_are_named() -> None:
    bad_gang = {**GANG, "podSets": [{**GANG["podSets"][0], "requests": {"memory": "lots"}}]}
    with pytest.raises(FileError, match=r"podSets\.0\.requests\.memory"):
        gang_from_data(bad_gang)
    bad_tol = {**GANG, "podSets": [{**GANG["podSets"][0], "tolerations": [{"key": "k", "operator": "Lt"}]}]}
    with pytest.raises(FileError, match=r"podSets\.0\.tolerations\.0.*operator 'Lt'"):
        gang_from_data(bad_tol)
    bad_taint = {**CLUSTER, "nodes": [{**CLUSTER["nodes"][0], "taints": [{"key": "k", "effect": "Never"}]}]}
    with pytest.raises(FileError, match=r"nodes\.0\.taints\.0.*effect 'Never'"):
        cluster_from_data(bad_taint, base=Path("."))


def test_nodes_and_gangs_without_the_new_fields_constrain_nothing() -> None:
    s = cluster_from_data({"nodes": [{"name": "n", "gpuTopology": "hgx-h100"}]}, base=Path("."))
    assert s.nodes[0].facts == NodeFacts() and s.nodes[0].facts.requested == NOTHING
    assert s.admitted(NodeNeeds()) is None and not s.limits_resources


def test_explain_says_what_a_pod_set_asks_of_its_node_and_which_filters_refuse() -> None:
    from extender.controllers.explain import Facts, render

    s, g = snap(), gang_from_data({**GANG, "podSets": [{**GANG["podSets"][0], "count": 2}]})
    text = render(Facts("workload llm/llm", gang=g, dry_run=Solver(s).place(g)))
    assert "of its node: nodeSelector disk=nvme; tolerates nvidia.com/gpu:NoSchedule" in text, text
    assert "requests cpu 16000m, memory 64Gi" in text, text
    assert "NodeUnschedulable" in text and "TaintToleration" in text, text


def test_room_tables_follow_a_node_whose_pods_changed() -> None:
    from dataclasses import replace

    s = snap()
    ask = PodRequests(memory_bytes=30 * GI)
    c = s.index("c-full")
    assert s.room(c, ask) == 1  # 50Gi of 100Gi left
    busier = replace(s.nodes[c], facts=replace(s.nodes[c].facts, requested=Resources(0, 90 * GI, 0, 2)))
    after = s.updated({"c-full": busier})
    assert after.room(c, ask) == 0 and s.room(c, ask) == 1
    fresh = ClusterSnapshot(list(after.nodes), after.hierarchy)
    assert [after.room(i, ask) for i in range(len(after.nodes))] == [
        fresh.room(i, ask) for i in range(len(fresh.nodes))
    ]


def test_admitted_tables_follow_a_node_tainted_or_cordoned_later() -> None:
    from dataclasses import replace

    s = snap()
    plain, tolerant = NodeNeeds(), NodeNeeds(tolerations=(Toleration("dedicated", "Exists"),))
    before = {needs: s.admitted(needs) for needs in (plain, tolerant)}
    e = s.index("e-good")
    assert e not in (before[plain] or ())  # its GPU taint is not tolerated by a bare pod
    d = s.index("d-hdd")
    cordoned = replace(s.nodes[d], facts=replace(s.nodes[d].facts, unschedulable=True))
    after = s.updated({"d-hdd": cordoned})
    fresh = ClusterSnapshot(list(after.nodes), after.hierarchy)
    for needs in (plain, tolerant):
        assert after.admitted(needs) == fresh.admitted(needs)
        assert d not in (after.admitted(needs) or ())
    assert s.admitted(plain) == before[plain]  # the old snapshot is unchanged


def test_two_required_affinities_at_once_need_a_term_of_each() -> None:
    from extender.placement.request import both_terms

    a = (
        NodeTerm((NodeRequirement("zone", "In", ("a",)),)),
        NodeTerm((NodeRequirement("zone", "In", ("b",)),)),
    )
    b = (NodeTerm((NodeRequirement("disk", "In", ("nvme",)),)),)
    both = both_terms(a, b)
    assert both_terms((), b) == b and both_terms(a, ()) == a
    assert any(t.matches("n", {"zone": "b", "disk": "nvme"}) for t in both)
    assert not any(t.matches("n", {"zone": "b", "disk": "hdd"}) for t in both)
    assert not any(t.matches("n", {"zone": "c", "disk": "nvme"}) for t in both)
    assert not any(t.matches("n", {"zone": "a"}) for t in both_terms((NodeTerm(),), b))  # empty: none


def test_the_imex_daemon_takes_one_pod_slot_and_by_default_nothing_else() -> None:
    """NVIDIA's driver runs one IMEX daemon pod per node of a ComputeDomain; its chart gives
    the container no requests unless the operator sets some."""
    assert Resources(0, 0, 0, 1) == feasibility.IMEX_DAEMON
    facts = NodeFacts(allocatable=Resources(cpu_millis=8_000, pods=4), requested=Resources(0, 0, 0, 2))
    pod = PodRequests(cpu_millis=1_000)
    assert feasibility.room(pod, facts) == 2
    assert feasibility.room(pod, facts, feasibility.with_imex_daemon(None, facts)) == 1
    taken = feasibility.usage(pod)
    assert feasibility.with_imex_daemon(taken, facts) == Resources(1_000, 0, 0, 2)
    heavy = NodeFacts(allocatable=Resources(cpu_millis=8_000), imex_daemon=Resources(7_500, 0, 0, 1))
    assert feasibility.room(pod, heavy, feasibility.with_imex_daemon(None, heavy)) == 0
    # The daemon is part of the node's static facts: an emptied node keeps it.
    assert heavy.emptied().imex_daemon == heavy.imex_daemon
    assert heavy.static() != NodeFacts(allocatable=heavy.allocatable).static()
