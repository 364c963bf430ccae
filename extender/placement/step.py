"""Step time of a placed gang: compute (:mod:`extender.compute`) plus communication
(:func:`~extender.placement.scoring.gang_micros`), per pod set, on the GPUs a slice gives it.

A pod set's step is its compute on the GPU models its pods got plus its per-layer
communication times its layers. Pods that work in lock step (tensor or expert ranks,
pipeline stages) go at the pace of the slowest GPU model among them; independent replicas
each go at their own, and the pod set's step is their mean. The gang's step is the sum of
its pod sets' steps (a prefill/decode pair: one prefill step, then one decode step). A node
whose GPU model the table does not know computes in no time: the step is its communication.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.compute import compute_us, work_gpus
from extender.cost import Comm
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import gang_micros
from extender.placement.slice import PodSlot
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.gpus import GpuSpec, node_gpu

_LOCK_STEP = (Comm.ALLREDUCE, Comm.ALLTOALL, Comm.PIPELINE)


@dataclass(frozen=True, slots=True)
class PodSetStep:
    """One pod set's step on its slots, microseconds, and the GPUs it got."""

    compute_us: float
    comm_us: float
    #: GPU model -> GPUs of the pod set on it (``unknown`` for models the table lacks).
    gpus: Mapping[str, int]

    @property
    def total_us(self) -> float:
        return self.compute_us + self.comm_us


@dataclass(frozen=True, slots=True)
class StepTime:
    by_pod_set: Mapping[str, PodSetStep]

    @property
    def total_us(self) -> float:
        return sum(s.total_us for s in self.by_pod_set.values())

    @property
    def compute_us(self) -> float:
        return sum(s.compute_us for s in self.by_pod_set.values())

    @property
    def comm_us(self) -> float:
        return sum(s.comm_us for s in self.by_pod_set.values())


UNKNOWN = "unknown"


def pod_set_compute_us(ps: PodSet, specs: Sequence[GpuSpec | None]) -> float:
    """Compute time of one step of ``ps`` whose pods run on GPUs of ``specs`` (one per pod)."""
    if not specs or ps.gpus_per_pod == 0:
        return 0.0
    split = work_gpus(ps.comm, len(specs), ps.gpus_per_pod)
    times = [compute_us(ps.model, split, s) if s is not None else 0.0 for s in specs]
    if ps.comm == Comm.PIPELINE:
        return sum(times) / len(times)  # each stage does 1/S of the step, one after the other
    if ps.comm in _LOCK_STEP:
        return max(times)
    return sum(times) / len(times)


def slice_step(snap: ClusterSnapshot, gang: GangRequest, slots: Sequence[PodSlot]) -> StepTime:
    micros = gang_micros(snap, gang, slots)
    by_set: dict[str, list[PodSlot]] = {ps.name: [] for ps in gang.pod_sets}
    for s in slots:
        by_set[s.pod_set].append(s)
    out = {}
    for ps in gang.pod_sets:
        specs = [node_spec(snap, s.node) for s in by_set[ps.name]]
        gpus: dict[str, int] = {}
        for spec in specs:
            key = spec.name if spec is not None else UNKNOWN
            gpus[key] = gpus.get(key, 0) + ps.gpus_per_pod
        out[ps.name] = PodSetStep(
            pod_set_compute_us(ps, specs),
            micros.get(ps.name, 0.0) * ps.model.layers,
            dict(sorted(gpus.items())),
        )
    return StepTime(out)


def node_spec(snap: ClusterSnapshot, name: str) -> GpuSpec | None:
    node = snap.node(name)
    return node_gpu(node.labels, node.graph.model)
