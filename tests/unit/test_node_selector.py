"""Node requirements (a pod's nodeSelector and required node affinity, by GPU Feature
Discovery's labels): every policy honours them, files read them, and a simulation leaves out
templates a fleet cannot run."""

from __future__ import annotations

import pytest

from extender.peers import POLICIES
from extender.placement import scoring
from extender.placement.files import FileError, gang_from_data
from extender.placement.request import GangRequest, NodeRequirement, PodSet
from extender.placement.slice import Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.generate import generate_trace
from extender.sim.inputs import default_cluster, fit_generated
from extender.sim.templates import builtin_templates, gang_to_data
from extender.testing.builders import make_cluster, make_node

PRODUCT, MEMORY = "nvidia.com/gpu.product", "nvidia.com/gpu.memory"
H100 = {PRODUCT: "NVIDIA-H100-80GB-HBM3", MEMORY: "81559"}
L40S = {PRODUCT: "NVIDIA-L40S", MEMORY: "46068"}


def l40s_then_h100() -> ClusterSnapshot:
    """Two L40S boxes under leaf l1, then two HGX H100 nodes under leaf l2, with GPU Feature
    Discovery's product and memory labels. The L40S boxes come first in file order and in
    name order, so a policy that ignored the requirement would take them."""
    l40s = make_node().pcie_8gpu_2socket().leaf("l1").labels(L40S)
    h100 = make_node().hgx_h100().leaf("l2").labels(H100)
    nodes = [*(l40s.named(f"a-l40s-{i}") for i in range(2)), *(h100.named(f"b-h100-{i}") for i in range(2))]
    return make_cluster(*nodes).levels("leaf").obj()


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize(
    "requirement",
    [
        NodeRequirement(MEMORY, "Gt", ("80000",)),
        NodeRequirement(PRODUCT, "In", ("NVIDIA-H100-80GB-HBM3",)),
        NodeRequirement(PRODUCT, "NotIn", ("NVIDIA-L40S",)),
    ],
)
def test_every_policy_honours_node_requirements(policy: str, requirement: NodeRequirement) -> None:
    snap = l40s_then_h100()
    g = GangRequest("g", (PodSet("s", 2, 4, node_selector=(requirement,)),))
    got = POLICIES[policy](snap, g)
    assert isinstance(got, Slice), got
    assert {s.node[:6] for s in got.slots} == {"b-h100"}
    assert not scoring.violations(snap, g, got.slots)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_no_node_meets_it_unplaceable_for_ever(policy: str) -> None:
    g = GangRequest(
        "g", (PodSet("s", 1, 1, node_selector=(NodeRequirement(PRODUCT, "In", ("NVIDIA-GB200",)),)),)
    )
    got = POLICIES[policy](l40s_then_h100(), g)
    assert isinstance(got, Unplaceable) and not got.feasible_when_empty


def test_violations_name_the_unmet_requirement() -> None:
    snap = l40s_then_h100()
    g = GangRequest("g", (PodSet("s", 1, 8, node_selector=(NodeRequirement(MEMORY, "Gt", ("80000",)),)),))
    slot = POLICIES["spread"](snap, GangRequest("g", (PodSet("s", 1, 8),)))
    assert isinstance(slot, Slice) and slot.slots[0].node.startswith("a-l40s")
    assert any(
        "does not meet nvidia.com/gpu.memory Gt 80000" in v for v in scoring.violations(snap, g, slot.slots)
    )


def test_gang_file_reads_node_selector_and_affinity() -> None:
    data = {
        "name": "g",
        "podSets": [
            {
                "name": "s",
                "count": 1,
                "gpusPerPod": 8,
                "nodeSelector": {PRODUCT: "NVIDIA-H100-80GB-HBM3"},
                "nodeAffinity": [{"key": MEMORY, "operator": "Gt", "values": [80000]}],
            }
        ],
    }
    g = gang_from_data(data)
    assert g.pod_sets[0].node_selector == (
        NodeRequirement(PRODUCT, "In", ("NVIDIA-H100-80GB-HBM3",)),
        NodeRequirement(MEMORY, "Gt", ("80000",)),
    )
    assert gang_from_data(gang_to_data(g)) == g


@pytest.mark.parametrize(
    ("requirement", "words"),
    [
        ({"key": MEMORY, "operator": "Gt", "values": ["lots"]}, "needs exactly one integer value"),
        ({"key": MEMORY, "operator": "Near", "values": ["1"]}, "operator 'Near'"),
        ({"key": MEMORY, "operator": "In"}, "needs at least one value"),
    ],
)
def test_bad_requirements_are_named(requirement: dict[str, object], words: str) -> None:
    data = {
        "name": "g",
        "podSets": [{"name": "s", "count": 1, "gpusPerPod": 1, "nodeAffinity": [requirement]}],
    }
    with pytest.raises(FileError, match=words):
        gang_from_data(data)


def test_builtin_templates_pin_hardware_and_some_accept_several_products() -> None:
    snap = default_cluster()
    products = {n.labels[PRODUCT] for n in snap.nodes}
    assert products == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S", "NVIDIA-GB200"}
    accepts = {}
    for name, g in builtin_templates().items():
        admitted = [snap.admitted(ps.node_selector) for ps in g.pod_sets]
        accepts[name] = {
            snap.nodes[i].labels[PRODUCT]
            for a in admitted
            for i in (range(len(snap.nodes)) if a is None else a)
        }
    assert accepts["llama-405b-tp8-pp2"] <= {"NVIDIA-H100-80GB-HBM3", "NVIDIA-GB200"}
    assert accepts["deepseek-v3-wideep-8"] == {"NVIDIA-H100-80GB-HBM3"}
    assert {"NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"} <= accepts["llama-70b-pd"]
    assert sum(len(a) > 1 for a in accepts.values()) >= 4


def test_generated_trace_leaves_out_what_the_fleet_cannot_run() -> None:
    h100 = make_node().hgx_h100().leaf("l1").labels(H100)
    snap = make_cluster(*(h100.named(f"h-{i}") for i in range(4))).levels("leaf").obj()
    trace = generate_trace(1)
    fitted, lines = fit_generated(trace, snap)
    assert {d.template for d in fitted.deployments}.isdisjoint(
        {"deepseek-v3-wideep-nvl72-8", "deepseek-v3-pd-nvl72"}
    )
    assert any("deepseek-v3-pd-nvl72" in line and "unknown level 'clique'" in line for line in lines)
    assert len(lines) == len({line.split()[1] for line in lines})  # one line per template
    kept = {d.name for d in fitted.deployments}
    assert all(s.deployment in kept for s in fitted.scales)
    assert fitted.deployments and len(fitted.deployments) < len(trace.deployments)


@pytest.mark.parametrize("name", ["gb200-nvl72-pair.yaml", "hgx-h100-4leaf.yaml", "mixed-pcie-h100.yaml"])
def test_a_generated_day_runs_on_every_shipped_cluster(name: str) -> None:
    from pathlib import Path

    from extender.placement.files import load_cluster
    from extender.sim.generate import TraceShape
    from extender.sim.inputs import check_levels
    from extender.sim.policies import choose
    from extender.sim.runner import run_simulation

    snap = load_cluster(Path(__file__).resolve().parents[2] / "examples" / "clusters" / name)
    trace, _ = fit_generated(generate_trace(2, TraceShape(base_deployments=4, arrivals=12)), snap)
    check_levels(trace, snap)
    outcome = run_simulation(snap, trace, choose("gangslice,kueue-tas"), seed=2)
    assert outcome.results["policies"]["gangslice"]["gangs"]["placed"] > 0
