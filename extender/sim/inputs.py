"""The cluster and the trace a simulation runs on: the built-in defaults or the user's files."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import yaml

from extender.placement import feasibility
from extender.placement.files import cluster_from_data, load_cluster
from extender.placement.request import GangRequest
from extender.placement.scoring import LevelError, resolve_level, resolve_need
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.generate import (
    DEFAULT_LOAD,
    MAX_SCALE,
    TraceShape,
    demand_gpu_hours,
    deployment_demand,
    generate_trace,
)
from extender.sim.templates import read_data_file
from extender.sim.trace import Trace, TraceError, load_trace

DEFAULT_CLUSTER = "default-cluster.yaml"
#: Days drawn at most when sizing a generated day to a fleet (:func:`fitted_day`), and how far
#: above the target its demand may come before deployments are dropped.
FIT_ROUNDS = 16
OVERSHOOT = 1.1


def default_cluster() -> ClusterSnapshot:
    """The built-in mixed fleet (``extender/sim/data/default-cluster.yaml``)."""
    return cluster_from_data(yaml.safe_load(read_data_file(DEFAULT_CLUSTER)), Path("."), DEFAULT_CLUSTER)


def load_sim_cluster(path: str | None) -> ClusterSnapshot:
    return default_cluster() if path is None else load_cluster(path)


def load_sim_trace(path: str | None, seed: int) -> Trace:
    return generate_trace(seed) if path is None else load_trace(path)


def misfit(gang: GangRequest, cluster: ClusterSnapshot) -> str | None:
    """Why a gang can never run on this cluster's kind of fleet (a level it names that the
    hierarchy lacks, or node requirements no node meets), or None."""
    h = cluster.hierarchy
    for ps in gang.pod_sets:
        try:
            resolve_need(ps, h)
            if ps.colocate_with is not None:
                resolve_level(ps.colocate_with.level, h)
        except LevelError as exc:
            return f"pod set {ps.name}: {exc}"
        admitted = cluster.admitted(ps.node_needs) if ps.gpus_per_pod else None
        if admitted is not None and not admitted:
            refused = feasibility.summarize(cluster.refusals(ps.node_needs))
            return f"pod set {ps.name}: kube-scheduler's filters refuse every node: {refused}"
    return None


def fit_generated(trace: Trace, cluster: ClusterSnapshot) -> tuple[Trace, list[str]]:
    """The generated trace without the deployments of templates this fleet cannot run (a
    template for NVL72 racks on a fleet without cliques), and one line per template left out."""
    why: dict[str, str] = {}
    keep = []
    for d in trace.deployments:
        key = d.template or d.name
        if key not in why:
            why[key] = misfit(d.gang, cluster) or ""
        if not why[key]:
            keep.append(d)
    if len(keep) == len(trace.deployments):
        return trace, []
    names = {d.name for d in keep}
    fitted = dataclasses.replace(
        trace,
        deployments=tuple(keep),
        scales=tuple(s for s in trace.scales if s.deployment in names),
        rollouts=tuple(r for r in trace.rollouts if r.deployment in names),
    )
    lines = [f"template {key} left out of the trace: {reason}" for key, reason in why.items() if reason]
    return fitted, lines


def check_levels(trace: Trace, cluster: ClusterSnapshot) -> None:
    """Every level a gang of the trace names must exist in the cluster's hierarchy."""
    h = cluster.hierarchy
    for d in trace.deployments:
        for ps in d.gang.pod_sets:
            try:
                resolve_need(ps, h)
                if ps.colocate_with is not None:
                    resolve_level(ps.colocate_with.level, h)
            except LevelError as exc:
                origin = d.origin or f"{trace.source}: deployment {d.name}: "
                field = f"template: {d.template}" if d.template else "gang.podSets"
                raise TraceError(f"{origin}{field}: pod set {ps.name}: {exc}") from None


def schedulable_gpus(fleet: ClusterSnapshot) -> int:
    """GPUs the simulated gangs can have: healthy, and not taken in the cluster file."""
    return sum(m.bit_count() for m in fleet.free_masks())


def fitted_day(
    seed: int, fleet: ClusterSnapshot, load: float = DEFAULT_LOAD, shape: TraceShape | None = None
) -> tuple[Trace, list[str]]:
    """The generated day for ``fleet``: without the templates it cannot run (one line each,
    returned), with demand ``load`` times the fleet's GPU-hours. The arrivals and the base are
    scaled until the day asks for a little more than that, then deployments are dropped, in an
    order drawn from the seed (those that arrived during the day first; of the base, all but
    one at most), while that brings demand closer to the target."""
    shape = shape or TraceShape()
    capacity = schedulable_gpus(fleet) * shape.duration_s / 3600
    target = load * capacity

    def draw(factor: float) -> tuple[float, Trace, list[str]]:
        trace, left_out = fit_generated(generate_trace(seed, shape.scaled(factor), fleet=fleet), fleet)
        return demand_gpu_hours(trace), trace, left_out

    # Demand grows with the scale (generate_trace): the least scale that reaches the target,
    # by doubling, then halving the interval.
    low, high = 0.0, 1.0
    chosen = draw(high)
    rounds = 0
    while chosen[0] < target and high < MAX_SCALE and rounds < FIT_ROUNDS:
        low, high, rounds = high, high * 2, rounds + 1
        chosen = draw(high)
    while rounds < FIT_ROUNDS and chosen[0] > target * OVERSHOOT:
        mid = (low + high) / 2 if low else high / 2
        got = draw(mid)
        if got[0] >= target:
            high, chosen = mid, got
        else:
            low = mid
        rounds += 1
    _, trace, left_out = chosen
    each = deployment_demand(trace)
    demand = sum(each.values())
    arrived = [d.name for d in trace.deployments if d.at > 0]
    base = [d.name for d in trace.deployments if d.at == 0]
    rnd = random.Random(seed)
    rnd.shuffle(arrived)
    rnd.shuffle(base)
    dropped = set()
    for name in [*arrived, *base[1:]]:  # the base only as a last resort, and never all of it
        if demand <= target:
            break
        if abs(demand - each[name] - target) < abs(demand - target):
            dropped.add(name)
            demand -= each[name]
    if dropped:
        trace = dataclasses.replace(
            trace,
            deployments=tuple(d for d in trace.deployments if d.name not in dropped),
            scales=tuple(s for s in trace.scales if s.deployment not in dropped),
            rollouts=tuple(r for r in trace.rollouts if r.deployment not in dropped),
        )
    return trace, left_out
