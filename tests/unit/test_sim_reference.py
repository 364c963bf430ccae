"""The best slice the judge measures every policy against: an exhaustive search of its own,
checked against a naive enumeration on small clusters, and its reductions on the default fleet."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from test_solver_exact import Instance, tiny_instances

from extender.placement import scoring
from extender.placement.request import GangRequest
from extender.placement.slice import PodSlot
from extender.placement.solver import place
from extender.placement.step import slice_step
from extender.sim.inputs import default_cluster
from extender.sim.reference import Reference, best_slice, reduced_units
from extender.sim.templates import builtin_templates


def naive(inst: Instance) -> float | None:
    """Every (node, GPU subset) for every pod, the rules of ``scoring.violations``, the fastest step."""
    snap, gang = inst.snap, inst.gang
    per_pod = []
    for ps in gang.pod_sets:
        choices = [
            (node.name, combo)
            for node in snap.nodes
            for combo in itertools.combinations(sorted(snap.free_gpus(node.name)), ps.gpus_per_pod)
        ]
        per_pod.extend([(ps.name, k, choices) for k in range(ps.count)])
    best: float | None = None
    for combo in itertools.product(*(choices for *_, choices in per_pod)):
        slots = [PodSlot(n, k, node, gpus) for (n, k, _), (node, gpus) in zip(per_pod, combo, strict=True)]
        used = [(s.node, g) for s in slots for g in s.gpus]
        if len(set(used)) != len(used) or scoring.violations(snap, gang, slots):
            continue
        step = slice_step(snap, gang, slots).total_us
        best = step if best is None else min(best, step)
    return best


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(tiny_instances())
def test_the_search_finds_the_fastest_valid_slice(inst: Instance) -> None:
    want = naive(inst)
    got = best_slice(inst.snap, inst.gang)
    if want is None:
        assert got is None, inst
    else:
        assert got is not None and got.exact, inst
        assert got.step_us == pytest.approx(want, rel=1e-9), inst
        assert not scoring.violations(inst.snap, inst.gang, list(got.slots))


def test_identical_leaves_and_nodes_are_searched_once() -> None:
    fleet = default_cluster()
    # 4 H100 leaves (two per spine, the spines differing in allocation mode), 2 L40S leaves,
    # 2 NVL72 racks: one of each kind of leaf is kept when one pod is placed, all 8 for two.
    assert len(reduced_units(fleet, 1)) == 4
    kept = reduced_units(fleet, 2)
    assert len(kept) == 8 and all(len(u.nodes) == 2 for u in kept)


def test_the_best_slice_on_the_default_fleet_is_on_the_fastest_hardware_the_gang_may_use() -> None:
    fleet = default_cluster()
    templates = builtin_templates()
    small = best_slice(fleet, templates["llama-8b-tp1"])
    assert small is not None and small.exact
    assert small.step.by_pod_set["server"].gpus == {"GB200": 1}
    wide = best_slice(fleet, templates["deepseek-v3-wideep-16"])  # pinned to H100 by its selector
    assert wide is not None and wide.exact
    assert wide.step.by_pod_set["experts"].gpus == {"H100 SXM": 128}
    leaves = {fleet.path_of(s.node)[:3] for s in wide.slots}
    assert len(leaves) == 1  # its required leaf
    # The solver's slice is never faster than the judge's best.
    for name in ("llama-70b-pd", "llama-405b-tp8-pp2", "deepseek-v3-wideep-nvl72-16"):
        got = place(fleet, templates[name])
        best = best_slice(fleet, templates[name])
        assert best is not None
        assert slice_step(fleet, templates[name], got.slots).total_us >= best.step_us * (1 - 1e-9)


def test_a_search_out_of_budget_is_marked_and_reported() -> None:
    fleet = default_cluster()
    gang = builtin_templates()["deepseek-v3-wideep-8"]
    cut = best_slice(fleet, gang, budget=3)
    assert cut is not None and not cut.exact
    ref = Reference(fleet, search=lambda snap, g: best_slice(snap, g, budget=3))
    assert ref.best(GangRequest("x", gang.pod_sets)) is not None
    assert ref.errors and "not proven" in ref.errors[0]["error"]
