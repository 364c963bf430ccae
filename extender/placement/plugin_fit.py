"""Judging a node by the GPUs its device plugin will hand out, not the ones gangslice would pick.

On a node whose GPUs the NVIDIA device plugin allocates, the kubelet asks the plugin for each
pod in turn and takes its preferred set (:mod:`extender.topology.device_plugin`). A pod set's
coherence rule (its tier) is then kept only if *every* answer the plugin may give, for every
pod that lands there, meets it: the kubelet lists the free devices in a Go map's order, so a
tie can go either way. :func:`plugin_pick` is the device-plugin counterpart of
:meth:`NodeFit.pick`: the same arguments (a free mask in the node shape's positions, GPUs per
pod, tier, pods) and the same answer (one mask per pod, in the order the kubelet allocates
them) or None when the node is not a fit for those pods. :func:`plugin_capacity` is the
counterpart of :meth:`NodeFit.capacity`, and :func:`plugin_reason` says in words why a node
is no fit.

A node is not a fit when some order of some pod's request gets a set looser than the tier,
when the policy's answer is the padded group (no usable preference; see the policy notes),
or when there were too many tied partitions to look at all of them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from extender.topology.device_plugin import PluginView, plugin_view, preferred_allocation
from extender.topology.model import GpuGraph, Tier

__all__ = [
    "PluginFit",
    "plugin_capacity",
    "plugin_fit_for",
    "plugin_kind",
    "plugin_pick",
    "plugin_reason",
]


@dataclass
class PluginFit:
    """Memo tables for one node type under the device plugin."""

    graph: GpuGraph
    view: PluginView
    _chain: dict[tuple[int, int, Tier, int], tuple[int, ...] | None] = field(default_factory=dict)
    _sound: dict[tuple[int, int, Tier, int], bool] = field(default_factory=dict)
    _capacity: dict[tuple[int, int, Tier], int] = field(default_factory=dict)

    def answers(self, free: int, gpus: int) -> tuple[tuple[int, ...], frozenset[int], bool]:
        """The plugin's answer for one pod (ascending order), every possible answer (as
        masks), and whether the answer is usable and all answers were seen."""
        shape = self.graph.shape
        got = preferred_allocation(self.view, shape.gpus_of(free), gpus)
        usable = bool(got.gpus) and not got.padded and got.exhaustive
        masks = frozenset(shape.mask_of(s) for s in got.possible if s)
        return got.gpus, masks, usable

    def sound(self, free: int, gpus: int, tier: Tier, pods: int) -> bool:
        """Every way the plugin can serve ``pods`` pods in turn from ``free`` meets ``tier``."""
        if pods == 0:
            return True
        key = (free, gpus, tier, pods)
        got = self._sound.get(key)
        if got is None:
            _, masks, usable = self.answers(free, gpus)
            shape = self.graph.shape
            got = (
                usable
                and bool(masks)
                and all(
                    shape.tier_of(m) <= tier and self.sound(free & ~m, gpus, tier, pods - 1) for m in masks
                )
            )
            self._sound[key] = got
        return got

    def reason(self, free: int, gpus: int, tier: Tier, pods: int) -> str | None:
        """Why ``pods`` pods cannot be served in turn within ``tier``: the first answer (or
        the first unusable request) that breaks it; None when they can."""
        shape = self.graph.shape
        for pod in range(1, pods + 1):
            if self.sound(free, gpus, tier, pods - pod + 1):
                return None
            _, masks, usable = self.answers(free, gpus)
            ask = f"for pod {pod} of {pods} ({gpus} GPUs from free {_gpus(shape.gpus_of(free))})"
            if not usable or not masks:
                return f"the device plugin gives no usable answer {ask}"
            for m in sorted(masks):
                if shape.tier_of(m) > tier:
                    words = shape.tier_of(m).words or "spread over the node"
                    return (
                        f"the device plugin may answer GPUs {_gpus(shape.gpus_of(m))} {ask}: {words}, "
                        f"looser than {tier.words or 'the node'}"
                    )
            # every answer meets the tier but some leaves the next pods short: follow one
            m = next(m for m in sorted(masks) if not self.sound(free & ~m, gpus, tier, pods - pod))
            free &= ~m
        return None

    def chain(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
        key = (free, gpus, tier, pods)
        if key in self._chain:
            return self._chain[key]
        result: tuple[int, ...] | None = None
        if self.sound(free, gpus, tier, pods):
            masks: list[int] = []
            left = free
            for _ in range(pods):
                chosen, _, _ = self.answers(left, gpus)
                mask = self.graph.shape.mask_of(chosen)
                masks.append(mask)
                left &= ~mask
            result = tuple(masks)
        self._chain[key] = result
        return result

    def pick(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
        """:func:`plugin_pick` on this node type (the counterpart of :meth:`NodeFit.pick`)."""
        if gpus <= 0 or pods <= 0:
            return ()
        return self.chain(free, gpus, tier, pods)

    def capacity(self, free: int, gpus: int, tier: Tier) -> int:
        """:func:`plugin_capacity` on this node type (the counterpart of :meth:`NodeFit.capacity`)."""
        if gpus <= 0:
            return 0
        key = (free, gpus, tier)
        got = self._capacity.get(key)
        if got is None:
            got = 0
            while (got + 1) * gpus <= free.bit_count() and self.sound(free, gpus, tier, got + 1):
                got += 1
            self._capacity[key] = got
        return got


_FITS: dict[str, PluginFit] = {}
_KINDS: dict[str, str] = {}
#: The kind of each live graph object, by id (nodes of one type usually share one graph).
_OF_GRAPH: dict[int, tuple[weakref.ref[GpuGraph], str]] = {}


def plugin_kind(graph: GpuGraph) -> str:
    """The node type of ``graph`` under the device plugin: its shape and what the plugin sees
    of it (two boards of one shape can differ in the PCIe levels under their NVLinks, which
    the plugin scores). One shared string per kind, computed once per graph object."""
    ident = id(graph)
    known = _OF_GRAPH.get(ident)
    if known is not None and known[0]() is graph:
        return known[1]
    view = plugin_view(graph)
    key = repr((graph.shape.key, "devicePlugin", sorted(view.pcie.items()), sorted(view.nvlinks.items())))
    got = _KINDS.get(key)
    if got is None:
        got = _KINDS[key] = key
        _FITS[key] = PluginFit(graph, view)
    _OF_GRAPH[ident] = (weakref.ref(graph, lambda _: _OF_GRAPH.pop(ident, None)), got)
    return got


def plugin_fit_for(graph: GpuGraph, kind: str | None = None) -> PluginFit:
    """The memo tables of this graph's node type (``kind``: its :func:`plugin_kind`, when known)."""
    return _FITS[kind if kind is not None else plugin_kind(graph)]


def plugin_pick(graph: GpuGraph, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
    """The masks the plugin hands ``pods`` pods of ``gpus`` GPUs in turn from ``free`` (for the
    free devices listed in ascending order), or None when some order of some request would
    give a pod GPUs looser than ``tier``."""
    return plugin_fit_for(graph).pick(free, gpus, tier, pods)


def plugin_reason(graph: GpuGraph, free: int, gpus: int, tier: Tier, pods: int) -> str | None:
    """Why :func:`plugin_pick` says no, in words for a pod's unschedulable reason; None when it
    says yes."""
    if gpus <= 0 or pods <= 0:
        return None
    return plugin_fit_for(graph).reason(free, gpus, tier, pods)


def _gpus(indices: tuple[int, ...]) -> str:
    return ",".join(map(str, indices)) or "none"


def plugin_capacity(graph: GpuGraph, free: int, gpus: int, tier: Tier) -> int:
    """How many pods of ``gpus`` GPUs the plugin serves from ``free`` in turn, all within ``tier``."""
    return plugin_fit_for(graph).capacity(free, gpus, tier)
