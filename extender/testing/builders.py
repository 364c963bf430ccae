"""Builders of the placement engine's plain data for tests, in the manner of Kueue's
``pkg/util/testing`` wrappers (``MakeWorkload(...).Obj()``)::

    HGX = make_node("n1").hgx_h100().spine("spine-1").leaf("leaf-1")
    snap = make_cluster(HGX, HGX.named("n2").allocated(0, 1).dra()).levels("spine", "leaf").obj()
    gang = make_gang("g").pod_set("server", count=2, gpus=4, comm=Comm.ALLREDUCE).obj()

Every builder is immutable: each setter returns a new builder, so a module may keep a
template (``HGX`` above) and derive its nodes from it. ``obj()`` builds the object; a
cluster builder takes node builders as they are.

Defaults: a node is an HGX H100 with no labels, nothing allocated, under the device plugin;
a cluster has the default hierarchy (:data:`extender.topology.hierarchy.DEFAULT_LEVELS`);
a pod set has one pod of one GPU and no communication.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Self

from extender.cost import Comm
from extender.placement.feasibility import NO_FACTS, NodeFacts
from extender.placement.request import Colocation, GangRequest, PodSet
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.testing.hardware import CLIQUE, CORE, LEAF, SPINE, level
from extender.topology.allocation import Allocation
from extender.topology.hierarchy import HOSTNAME_LABEL, Hierarchy, Level
from extender.topology.kubelet import KubeletAlignment
from extender.topology.model import GpuGraph
from extender.topology.presets import preset_graph

__all__ = [
    "ClusterBuilder",
    "GangBuilder",
    "NamedHardware",
    "NodeBuilder",
    "make_cluster",
    "make_gang",
    "make_node",
    "make_node_like",
]


class NamedHardware:
    """Setters for a builder's GPU graph by machine type (the topology presets), shared by
    the node builders here and in :mod:`extender.testing.objects`."""

    def graph(self, graph: GpuGraph) -> Self:
        raise NotImplementedError

    def preset(self, name: str) -> Self:
        """The GPU graph of the topology preset ``name``."""
        return self.graph(preset_graph(name))

    def hgx_h100(self) -> Self:
        return self.preset("hgx-h100")

    def dgx_a100(self) -> Self:
        return self.preset("dgx-a100")

    def h100_nv18(self) -> Self:
        return self.preset("h100-nv18")

    def pcie_8gpu_2socket(self) -> Self:
        return self.preset("pcie-8gpu-2socket")

    def l40s_4gpu(self) -> Self:
        return self.preset("l40s-4gpu")

    def gb200_tray(self) -> Self:
        return self.preset("gb200-tray")


def _gpus(gpus: Iterable[int | Iterable[int]]) -> frozenset[int]:
    """``allocated(0, 1)``, ``allocated(range(4))`` and ``allocated([0, 1], 5)`` alike."""
    out: set[int] = set()
    for g in gpus:
        if isinstance(g, int):
            out.add(g)
        else:
            out.update(g)
    return frozenset(out)


@dataclass(frozen=True)
class NodeBuilder(NamedHardware):
    """A :class:`NodeState`; see :func:`make_node`."""

    _name: str
    _graph: GpuGraph | None = None
    _labels: tuple[tuple[str, str | None], ...] = ()
    #: What is taken: ("gpus", set) the GPUs named, ("first", n) the first n indices,
    #: ("free", set) every GPU but those, ("last", n) every GPU but the last n.
    _taken: tuple[str, Any] = ("gpus", frozenset())
    _unhealthy: frozenset[int] = frozenset()
    _allocation: Allocation = Allocation.DEVICE_PLUGIN
    _facts: NodeFacts = NO_FACTS
    _kubelet: KubeletAlignment | None = None
    _mnnvl_gang: str | None = None
    _foreign_domain: str | None = None
    _hostname: bool = False

    def named(self, name: str) -> NodeBuilder:
        """The same node under another name (a template's copy)."""
        return replace(self, _name=name)

    def graph(self, graph: GpuGraph) -> Self:
        return replace(self, _graph=graph)

    # -- labels ---------------------------------------------------------------------------

    def label(self, key: str, value: str | None) -> NodeBuilder:
        """Set label ``key``; None removes it (a node of a template without that level)."""
        return replace(self, _labels=(*self._labels, (key, value)))

    def labels(self, labels: Mapping[str, str]) -> NodeBuilder:
        return replace(self, _labels=(*self._labels, *labels.items()))

    def hostname(self) -> NodeBuilder:
        """Label ``kubernetes.io/hostname`` with the node's name, as a real node and a node of
        a cluster file carry it (unless a label of its own says otherwise)."""
        return replace(self, _hostname=True)

    def core(self, value: str | None) -> NodeBuilder:
        return self.label(CORE, value)

    def spine(self, value: str | None) -> NodeBuilder:
        return self.label(SPINE, value)

    def leaf(self, value: str | None) -> NodeBuilder:
        return self.label(LEAF, value)

    def clique(self, value: str | None) -> NodeBuilder:
        """The GB200 NVL72 clique (GPU Feature Discovery's ``nvidia.com/gpu.clique``)."""
        return self.label(CLIQUE, value)

    # -- GPUs in use ------------------------------------------------------------------------

    def allocated(self, *gpus: int | Iterable[int]) -> NodeBuilder:
        """These GPU indices are in use (by pods outside any reservation)."""
        return replace(self, _taken=("gpus", _gpus(gpus)))

    def busy(self, count: int) -> NodeBuilder:
        """The first ``count`` GPU indices are in use."""
        return replace(self, _taken=("first", count))

    def free(self, *gpus: int | Iterable[int]) -> NodeBuilder:
        """Only these GPU indices are free; every other one is in use."""
        return replace(self, _taken=("free", _gpus(gpus)))

    def free_count(self, count: int) -> NodeBuilder:
        """Only the last ``count`` GPU indices are free (a node with that many GPUs left)."""
        return replace(self, _taken=("last", count))

    def unhealthy(self, *gpus: int | Iterable[int]) -> NodeBuilder:
        return replace(self, _unhealthy=_gpus(gpus))

    # -- who picks the GPUs, what kube-scheduler sees ------------------------------------------

    def dra(self) -> NodeBuilder:
        """GPUs picked by gangslice through DRA ResourceClaims."""
        return replace(self, _allocation=Allocation.DRA)

    def device_plugin(self) -> NodeBuilder:
        """GPUs picked by the device plugin (the default)."""
        return replace(self, _allocation=Allocation.DEVICE_PLUGIN)

    def allocation(self, allocation: Allocation) -> NodeBuilder:
        return replace(self, _allocation=allocation)

    def facts(self, facts: NodeFacts | None) -> NodeBuilder:
        """Taints, allocatable and other pods' requests (None: none, the default)."""
        return replace(self, _facts=NO_FACTS if facts is None else facts)

    def kubelet(self, kubelet: KubeletAlignment | None) -> NodeBuilder:
        return replace(self, _kubelet=kubelet)

    def mnnvl_gang(self, gang: str | None) -> NodeBuilder:
        return replace(self, _mnnvl_gang=gang)

    def foreign_domain(self, domain: str | None) -> NodeBuilder:
        return replace(self, _foreign_domain=domain)

    def obj(self) -> NodeState:
        graph = self._graph if self._graph is not None else preset_graph("hgx-h100")
        labels: dict[str, str] = {}
        for key, value in self._labels:
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        if self._hostname:
            labels.setdefault(HOSTNAME_LABEL, self._name)
        how, what = self._taken
        if how == "first":
            taken = frozenset(range(what))
        elif how == "free":
            taken = frozenset(graph.indices) - what
        elif how == "last":
            indices = sorted(graph.indices)
            if not 0 <= what <= len(indices):
                raise ValueError(f"node {self._name}: {what} free GPUs of {len(indices)}")
            taken = frozenset(indices[: len(indices) - what])
        else:
            taken = what
        return NodeState(
            self._name,
            labels,
            graph,
            taken,
            self._unhealthy,
            mnnvl_gang=self._mnnvl_gang,
            foreign_domain=self._foreign_domain,
            allocation=self._allocation,
            facts=self._facts,
            kubelet=self._kubelet,
        )


def make_node_like(node: NodeState) -> NodeBuilder:
    """A builder of ``node`` as it is (its name, labels, graph, GPUs in use and the rest), to
    change what differs: ``make_node_like(n).busy(4).obj()``."""
    return NodeBuilder(
        node.name,
        node.graph,
        tuple(node.labels.items()),
        ("gpus", node.allocated),
        node.unhealthy,
        node.allocation,
        node.facts,
        node.kubelet,
        node.mnnvl_gang,
        node.foreign_domain,
    )


def make_node(name: str = "node") -> NodeBuilder:
    """A node: ``make_node("n1").hgx_h100().leaf("leaf-1").allocated(0, 1).dra().obj()``."""
    return NodeBuilder(name)


@dataclass(frozen=True)
class ClusterBuilder:
    """A :class:`ClusterSnapshot`; see :func:`make_cluster`."""

    _nodes: tuple[NodeBuilder | NodeState, ...] = ()
    _hierarchy: Hierarchy = field(default_factory=Hierarchy)
    _reserved: tuple[tuple[str, frozenset[int]], ...] = ()
    _clique_demand: bool | None = None

    def nodes(self, *nodes: NodeBuilder | NodeState) -> ClusterBuilder:
        """These nodes after the ones already there."""
        return replace(self, _nodes=(*self._nodes, *nodes))

    def levels(self, *levels: str | Level) -> ClusterBuilder:
        """The hierarchy's levels, coarse to fine: a default level by name (``"spine"``,
        ``"leaf"``, ``"clique"``...) or a :class:`Level` of its own."""
        got = tuple(lv if isinstance(lv, Level) else level(lv) for lv in levels)
        return replace(self, _hierarchy=Hierarchy(got, self._hierarchy.network))

    def hierarchy(self, hierarchy: Hierarchy) -> ClusterBuilder:
        return replace(self, _hierarchy=hierarchy)

    def reserved(self, node: str, *gpus: int | Iterable[int]) -> ClusterBuilder:
        """GPUs of ``node`` held by reservations."""
        return replace(self, _reserved=(*self._reserved, (node, _gpus(gpus))))

    def clique_demand(self, waiting: bool | None) -> ClusterBuilder:
        return replace(self, _clique_demand=waiting)

    def obj(self) -> ClusterSnapshot:
        nodes = [n.obj() if isinstance(n, NodeBuilder) else n for n in self._nodes]
        return ClusterSnapshot(
            nodes, self._hierarchy, reserved=dict(self._reserved), clique_demand=self._clique_demand
        )


def make_cluster(*nodes: NodeBuilder | NodeState) -> ClusterBuilder:
    """A cluster of ``nodes`` (builders or states), in that order:
    ``make_cluster(make_node("a"), make_node("b")).levels("leaf").obj()``."""
    return ClusterBuilder(tuple(nodes))


@dataclass(frozen=True)
class GangBuilder:
    """A :class:`GangRequest`; see :func:`make_gang`."""

    _name: str
    _pod_sets: tuple[PodSet, ...] = ()

    def named(self, name: str) -> GangBuilder:
        return replace(self, _name=name)

    def pod_set(
        self,
        name: str,
        count: int = 1,
        gpus: int = 1,
        comm: Comm = Comm.NONE,
        *,
        colocate_with: Colocation | str | None = None,
        **kw: Any,
    ) -> GangBuilder:
        """One more pod set: ``count`` pods of ``gpus`` GPUs each. ``colocate_with`` is a
        :class:`Colocation` or its ``"<pod set>@<level>"`` text; the other keywords are
        :class:`PodSet`'s (``required_level``, ``preferred_level``, ``node_selector``,
        ``requests``, ``model``...)."""
        if isinstance(colocate_with, str):
            target, _, at = colocate_with.partition("@")
            colocate_with = Colocation(target, at)
        ps = PodSet(name, count, gpus, comm, colocate_with=colocate_with, **kw)
        return self.pod_sets(ps)

    def pod_sets(self, *pod_sets: PodSet) -> GangBuilder:
        return replace(self, _pod_sets=(*self._pod_sets, *pod_sets))

    def obj(self) -> GangRequest:
        return GangRequest(self._name, self._pod_sets)


def make_gang(name: str = "g") -> GangBuilder:
    """A gang: ``make_gang("g").pod_set("server", count=2, gpus=4, comm=Comm.ALLREDUCE).obj()``."""
    return GangBuilder(name)
