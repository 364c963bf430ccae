"""The cluster and the trace a simulation runs on: the built-in defaults or the user's files."""

from __future__ import annotations

from pathlib import Path

import yaml

from extender.placement.files import cluster_from_data, load_cluster
from extender.placement.scoring import LevelError, resolve_level, resolve_need
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.generate import generate_trace
from extender.sim.templates import read_data_file
from extender.sim.trace import Trace, TraceError, load_trace

DEFAULT_CLUSTER = "default-cluster.yaml"


def default_cluster() -> ClusterSnapshot:
    """The built-in mixed fleet (``extender/sim/data/default-cluster.yaml``)."""
    return cluster_from_data(yaml.safe_load(read_data_file(DEFAULT_CLUSTER)), Path("."), DEFAULT_CLUSTER)


def load_sim_cluster(path: str | None) -> ClusterSnapshot:
    return default_cluster() if path is None else load_cluster(path)


def load_sim_trace(path: str | None, seed: int) -> Trace:
    return generate_trace(seed) if path is None else load_trace(path)


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
