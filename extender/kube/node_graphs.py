"""GPU graphs for Kubernetes nodes: from a NodeTopology, or a documented fallback.

A node that advertises ``nvidia.com/gpu`` but has no ``NodeTopology`` (the node agent has
not reported yet, or does not run there) gets a preset chosen from its GPU count
(``status.capacity``) and the GPU Feature Discovery product label
``nvidia.com/gpu.product`` (upper-cased for matching):

=========  =============================================  ======================
GPU count  product label contains                          preset
=========  =============================================  ======================
4          ``GB200`` or ``GB300``                          ``gb200-tray``
4          ``L40``                                         ``l40s-4gpu``
8          ``PCIE``, ``L40``, ``L4-`` or ``RTX``           ``pcie-8gpu-2socket``
8          ``A100``                                        ``dgx-a100``
8          ``H100``, ``H200``, ``H800``, ``H20``, ``B200``  ``hgx-h100``
any other  (anything)                                      uniform graph
=========  =============================================  ======================

The uniform graph treats every pair of GPUs alike (PCIe across host bridges, one NUMA
node), so no set of GPUs is preferred over another: gangslice claims nothing about a
topology it has not seen. A NodeTopology always wins over the fallback.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.kube import names
from extender.kube.api import as_map
from extender.kube.pods import PodError, quantity
from extender.placement import quantities
from extender.placement.feasibility import NO_FACTS, NodeFacts, Resources, Taint
from extender.topology.hierarchy import HOSTNAME_LABEL
from extender.topology.model import Gpu, GpuGraph, Link, PcieLevel

log = logging.getLogger(__name__)

UNIFORM = "uniform"

_RULES: tuple[tuple[int, tuple[str, ...], str], ...] = (
    (4, ("GB200", "GB300"), "gb200-tray"),
    (4, ("L40",), "l40s-4gpu"),
    (8, ("PCIE", "L40", "L4-", "RTX"), "pcie-8gpu-2socket"),
    (8, ("A100",), "dgx-a100"),
    (8, ("H100", "H200", "H800", "H20", "B200"), "hgx-h100"),
)


def fallback_preset(gpu_count: int, product: str | None) -> str:
    """The preset name for a node without a NodeTopology, or :data:`UNIFORM`."""
    text = (product or "").upper()
    for count, needles, preset in _RULES:
        if gpu_count == count and any(n in text for n in needles):
            return preset
    return UNIFORM


@functools.cache
def uniform_graph(gpu_count: int) -> GpuGraph:
    gpus = tuple(Gpu(index=i, numa_node=0) for i in range(gpu_count))
    links = {(a, b): Link(pcie=PcieLevel.NODE) for a, b in itertools.combinations(range(gpu_count), 2)}
    return GpuGraph(gpus=gpus, links=links, model=f"uniform-{gpu_count}")


@functools.cache
def fallback_graph(gpu_count: int, product: str | None) -> GpuGraph:
    preset = fallback_preset(gpu_count, product)
    if preset != UNIFORM:
        from extender.topology.presets import preset_graph

        graph = preset_graph(preset)
        if len(graph.gpus) == gpu_count:
            return graph
    return uniform_graph(gpu_count)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What the cache keeps of a Node object."""

    name: str
    labels: Mapping[str, str]
    gpu_count: int
    #: The Ready condition is not False-or-Unknown (a NotReady node is left out altogether).
    ready: bool
    #: ``spec.unschedulable``, ``spec.taints`` and ``status.allocatable``: what
    #: kube-scheduler's filters read (:mod:`extender.placement.feasibility`).
    facts: NodeFacts = NO_FACTS

    @property
    def product(self) -> str | None:
        return self.labels.get(names.GPU_PRODUCT_LABEL)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> NodeRecord:
        meta = as_map(obj.get("metadata"))
        spec = as_map(obj.get("spec"))
        status = as_map(obj.get("status"))
        raw_labels = meta.get("labels")
        labels = (
            {str(k): v for k, v in raw_labels.items() if isinstance(v, str)}
            if isinstance(raw_labels, Mapping)
            else {}
        )
        name = meta.get("name") if isinstance(meta.get("name"), str) else ""
        assert isinstance(name, str)
        labels.setdefault(HOSTNAME_LABEL, name)
        capacity = as_map(status.get("capacity"))
        try:
            gpus = quantity(capacity.get(names.GPU_RESOURCE, 0))
        except PodError:
            gpus = 0
        facts = NodeFacts(
            _taints(spec.get("taints"), name),
            spec.get("unschedulable") is True,
            _allocatable(status.get("allocatable"), name),
        )
        return cls(name=name, labels=labels, gpu_count=gpus, ready=_ready(status), facts=facts)


def _taints(raw: Any, node: str) -> tuple[Taint, ...]:
    """``spec.taints``; one that cannot be read is logged and kept as a NoSchedule taint
    (refusing pods that do not tolerate its key is the safe reading)."""
    out = []
    for t in raw if isinstance(raw, list) else ():
        if not isinstance(t, Mapping):
            continue
        key, value, effect = t.get("key"), t.get("value") or "", t.get("effect")
        if not isinstance(key, str) or not key:
            continue
        try:
            out.append(Taint(key, str(value), str(effect)))
        except ValueError as exc:
            log.warning("node %s: spec.taints: %s; treated as NoSchedule", node, exc)
            out.append(Taint(key, str(value), "NoSchedule"))
    return tuple(out)


def _allocatable(raw: Any, node: str) -> Resources:
    """``status.allocatable`` cpu, memory, ephemeral-storage and pods; a resource the node
    does not report (or that cannot be read) limits nothing."""
    if not isinstance(raw, Mapping):
        return Resources()
    got: list[int | None] = []
    for name, read in (
        ("cpu", quantities.milli),
        ("memory", quantities.whole),
        ("ephemeral-storage", quantities.whole),
        ("pods", quantities.whole),
    ):
        value = raw.get(name)
        try:
            got.append(None if value is None else read(value))
        except quantities.QuantityError as exc:
            log.warning("node %s: status.allocatable[%s]: %s; not limited", node, name, exc)
            got.append(None)
    return Resources(*got)


def _ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for c in conditions:
            if isinstance(c, Mapping) and c.get("type") == "Ready":
                return c.get("status") == "True"
    return True
