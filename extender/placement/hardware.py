"""Hardware by what it does to goodput: a pod set's speed on each GPU model, and what a GPU of
each model is worth to the gangs in demand.

Goodput counts each GPU-hour at the speed its workload gets there: its best step on the fleet
over its step on these GPUs (:mod:`extender.compute`). A pod set's **speed** on a GPU model is
its step on the fastest model among the nodes its pods may use (nodeSelector, node affinity,
tolerations; nodes with room for one pod) over its step on that model, where the step is the
compute plus the tensor-parallel communication inside one pod on the best GPUs of such a node
(:func:`pod_comm_us`: NVLink or PCIe is the node type's, not the placement's): an 8B replica
whose best is a GB200 runs at 0.40 on an H100 and 0.14 on an L40S; a TP=8 replica that no
GB200 tray can hold runs at 1 on an H100 and 0.17 on an L40S, whose all-reduces cross PCIe
(0.37 by compute alone). What a placement's own GPUs and spans add beyond that is the
objective's next term (per-layer cost).

What a GPU of a model is **worth** to the gangs in demand (:class:`Worth`; the gangs waiting,
and those asked for within the last hour, :data:`~extender.placement.waiting.DEMAND_MEMORY_S`)
is the best speed one of their pod sets whose pods fit the node's free GPUs would get on it:
1 for a whole H100 node while an H100-only wide-EP gang is in demand, less for the half-used
node beside it. A placement's **hardware loss** is, over its GPUs, that worth less the placed
pod set's own speed there: what the fleet forgoes by putting this pod set on these GPUs
rather than leaving them to a gang in demand. With nothing in demand it is minus the speed, so a replica
takes the fastest hardware it may use; while a gang that runs only on H100 is in demand, an 8B
replica loses 1 - 0.40 = 0.60 per GPU on an H100 and 0 - 0.14 on an L40S, so it takes the
L40S: comparative advantage, not a fixed order of models.

A pod set that may land on a node whose GPU model the datasheet table does not know has no
speeds: its hardware loss is 0 everywhere, and the objective's other terms decide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from extender import cost
from extender.compute import compute_us, work_gpus
from extender.placement.node_fit import NodeFit, fit_for
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import PodSlot
from extender.topology.gpus import KNOWN, GpuSpec, node_gpu

if TYPE_CHECKING:
    from extender.placement.snapshot import ClusterSnapshot, NodeState

#: Losses this close are ties (a hundredth of a GPU at full speed).
LOSS_DIGITS = 2


@dataclass(frozen=True, slots=True)
class Worth:
    """What a GPU of each model is worth to the gangs that wait: per (GPU model name, GPUs per
    pod), the best speed one of their pod sets with pods of that size gets on that model. A
    node's GPUs are worth what the waiting pods that fit its free GPUs get there
    (:meth:`of`): a whole free H100 node is worth 1 to a waiting TP=8 or wide-EP gang, the
    half-used node next to it only what waiting small replicas get on an H100."""

    by_pod: tuple[tuple[tuple[str, int], float], ...] = ()

    def of(self, model: str, free: int) -> float:
        """A GPU's worth on a node of ``model`` with ``free`` free GPUs (0: nobody waiting fits)."""
        best = 0.0
        for (name, gpus), value in self.by_pod:
            if name == model and gpus <= free and value > best:
                best = value
        return best

    def __bool__(self) -> bool:
        return bool(self.by_pod)

    def __str__(self) -> str:
        return (
            ", ".join(f"{name} ({gpus}-GPU pods) {value:.2f}" for (name, gpus), value in self.by_pod)
            or "nothing waits"
        )


#: Nothing waits: every GPU is worth its own speed to whoever takes it.
NOTHING_WAITS = Worth()


def node_models(snap: ClusterSnapshot) -> list[GpuSpec | None]:
    """Every node's GPU model by node index (None: not in the datasheet table)."""
    return snap.per_node(("gpu-model",), lambda n: node_gpu(n.labels, n.graph.model))


def _model_fits(snap: ClusterSnapshot) -> list[tuple[str | None, NodeFit]]:
    """Every node's (GPU model name, node type's memo tables) by node index: a string and an
    object hashed by identity (one per node type), which a set hashes in C."""

    def derive(n: NodeState) -> tuple[str | None, NodeFit]:
        spec = node_gpu(n.labels, n.graph.model)
        return (spec.name if spec is not None else None, fit_for(n.shape))

    return snap.per_node(("gpu-model-fit",), derive)


def node_types_for(snap: ClusterSnapshot, ps: PodSet) -> frozenset[tuple[str | None, NodeFit]]:
    """The (GPU model name, node type) of the nodes a pod of ``ps`` may use (its node needs,
    room for its GPUs on an empty node; None: a model the table does not know). The per-node
    table and the admitted nodes are kept up to date by the snapshot across allocation
    changes, and the distinct pairs are taken in C: a decision pays O(nodes) of C work, not of
    Python."""
    pairs = _model_fits(snap)
    admitted = snap.admitted(ps.node_needs)
    distinct = set(pairs) if admitted is None else set(map(pairs.__getitem__, admitted))
    return frozenset(p for p in distinct if p[1].shape.size >= ps.gpus_per_pod)


def pod_comm_us(ps: PodSet, fit: NodeFit) -> float:
    """One step's tensor-parallel communication inside one pod of ``ps`` on the best GPUs of a
    node of type ``fit``: the part of a pod's communication the node type decides (PCIe or
    NVLink), which a speed by compute alone would miss."""
    if ps.gpus_per_pod <= 1:
        return 0.0
    gbps = fit.best_gbps(ps.gpus_per_pod)
    if gbps <= 0:
        return 0.0
    layer = cost.tp_layer_us(ps.gpus_per_pod, ps.model, gbps, cost.alpha_for_gbps(gbps, crosses_nodes=False))
    return layer * ps.model.layers


def speeds(snap: ClusterSnapshot, ps: PodSet) -> Mapping[str, float] | None:
    """``ps``'s speed on each GPU model its pods may use, by model name (module docstring);
    None when it has no GPUs, may use no node, or may use a model the table does not know.
    A model's step is its compute plus the least in-pod communication among its node types."""
    if ps.gpus_per_pod == 0:
        return None
    split = work_gpus(ps.comm, ps.count, ps.gpus_per_pod)
    comm: dict[str, float] = {}
    for name, fit in node_types_for(snap, ps):
        if name is None:
            return None
        us = pod_comm_us(ps, fit)
        comm[name] = min(us, comm.get(name, us))
    if not comm:
        return None
    times = {name: compute_us(ps.model, split, KNOWN[name]) + us for name, us in comm.items()}
    best = min(times.values())
    return {name: (best / t if t > 0 else 1.0) for name, t in times.items()}


def gang_worth(snap: ClusterSnapshot, gang: GangRequest) -> Worth:
    """What a GPU of each model is worth to ``gang`` alone: the best speed of its pod sets on
    it, per size of pod (its entry in a :class:`WorthBook`)."""
    best: dict[tuple[str, int], float] = {}
    for ps in gang.pod_sets:
        for name, s in (speeds(snap, ps) or {}).items():
            key = (name, ps.gpus_per_pod)
            best[key] = max(best.get(key, 0.0), round(s, 3))
    return Worth(tuple(sorted(best.items())))


def merged(worths: Iterable[Worth]) -> Worth:
    """What a GPU of each model is worth to all the gangs of ``worths``: the best of them."""
    best: dict[tuple[str, int], float] = {}
    for w in worths:
        for key, value in w.by_pod:
            if value > best.get(key, 0.0):
                best[key] = value
    return Worth(tuple(sorted(best.items())))


def worth(snap: ClusterSnapshot, waiting: Iterable[GangRequest]) -> Worth:
    """What a GPU of each model is worth to ``waiting``."""
    return merged(gang_worth(snap, g) for g in waiting)


def node_loss(
    snap: ClusterSnapshot, i: int, gpus: int, own: Mapping[str, float] | None, spec: GpuSpec | None
) -> float:
    """The hardware loss of ``gpus`` GPUs of a pod set whose speeds are ``own`` on node ``i``
    (its GPU model ``spec``): the worth of the node's GPUs to the waiting pods that fit its
    free GPUs, less the pod set's speed there."""
    if not own or spec is None:
        return 0.0
    free = snap.free_mask(i).bit_count()
    return gpus * (snap.worth.of(spec.name, free) - own.get(spec.name, 0.0))


def loss(snap: ClusterSnapshot, ps: PodSet, slots: Sequence[PodSlot]) -> float:
    """The hardware loss of ``ps`` on ``slots``, GPUs at full speed (lower is better; negative
    when the pod set gains more than the waiting gangs would)."""
    return loss_with(snap, slots, speeds(snap, ps))


def loss_with(snap: ClusterSnapshot, slots: Sequence[PodSlot], own: Mapping[str, float] | None) -> float:
    """:func:`loss` of a pod set whose speeds (:func:`speeds`) are known: ``own``."""
    if not own:
        return 0.0
    per_node: dict[int, int] = {}
    for s in slots:
        i = snap.index(s.node)
        per_node[i] = per_node.get(i, 0) + len(s.gpus)
    models = node_models(snap)
    return round(sum(node_loss(snap, i, g, own, models[i]) for i, g in per_node.items()), LOSS_DIGITS)


def gang_loss(
    snap: ClusterSnapshot,
    gang: GangRequest,
    slots: Sequence[PodSlot],
    speeds_of: Callable[[PodSet], Mapping[str, float] | None] | None = None,
) -> float:
    """:func:`loss` summed over the gang's pod sets; ``speeds_of`` gives a pod set's speeds
    when the caller has them (:func:`speeds` otherwise)."""
    by_set: dict[str, list[PodSlot]] = {}
    for s in slots:
        by_set.setdefault(s.pod_set, []).append(s)
    own = speeds_of or (lambda ps: speeds(snap, ps))
    return round(sum(loss_with(snap, by_set.get(ps.name, ()), own(ps)) for ps in gang.pod_sets), LOSS_DIGITS)


def floor(snap: ClusterSnapshot, ps: PodSet, own: Mapping[str, float] | None) -> float:
    """The least hardware loss any placement of ``ps`` (speeds ``own``) can have: every GPU
    on the model where it loses least, on a node with just room for one pod (a GPU's worth
    only grows with its node's free GPUs: more waiting pods fit)."""
    if not own:
        return 0.0
    least = min(snap.worth.of(name, ps.gpus_per_pod) - s for name, s in own.items())
    return round(ps.gpus * least, LOSS_DIGITS)


@dataclass
class WorthBook:
    """The waiting gangs' worths, counted: a decision reads what a GPU is worth to every
    waiting gang but the ones being placed in O(distinct worths), not O(gangs waiting)."""

    _counts: dict[Worth, int] = field(default_factory=dict)

    def add(self, w: Worth) -> None:
        self._counts[w] = self._counts.get(w, 0) + 1

    def remove(self, w: Worth) -> None:
        left = self._counts.get(w, 0) - 1
        if left > 0:
            self._counts[w] = left
        else:
            self._counts.pop(w, None)

    def worth(self, exclude: Iterable[Worth] = ()) -> Worth:
        """What a GPU of each model is worth to the waiting gangs less those in ``exclude``."""
        less: dict[Worth, int] = {}
        for w in exclude:
            less[w] = less.get(w, 0) + 1
        return merged(w for w, n in self._counts.items() if n > less.get(w, 0))
