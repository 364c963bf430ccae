"""Whose in-node choice a node delivers: gangslice's (DRA) or the device plugin's.

On a ``dra`` node a ResourceClaim names the exact devices, so the GPU sets are gangslice's own
(:class:`~extender.placement.node_fit.NodeFit`). On a ``devicePlugin`` node the kubelet takes
the NVIDIA device plugin's preferred allocation for each pod in turn, so the sets are the
plugin's (:class:`~extender.placement.plugin_fit.PluginFit`): a node where some answer of
the plugin would break a pod set's tier is no fit for those pods, and what fits is what the
plugin can serve. The solver, the exact search and every baseline ask here, so all of them
judge a node by the GPUs it will actually hand out.

Pods of several pod sets sharing a device-plugin node are predicted in the order they are
placed (each from what the earlier ones left); the kubelet admits them in the order they
arrive, and the agent's report of what each pod holds is the truth when that differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from extender.placement.node_fit import NodeFit, fit_for
from extender.placement.plugin_fit import PluginFit, plugin_fit_for
from extender.placement.snapshot import NodeState
from extender.topology.model import Tier

__all__ = ["PluginChoice", "capacity", "fit", "handed", "pick", "reason"]


@dataclass(frozen=True)
class PluginChoice:
    """A device-plugin node type's GPU sets: the plugin's answers, the node type's own
    bandwidth and block tables (the same shape of answer as :class:`NodeFit`)."""

    own: NodeFit
    plugin: PluginFit

    def capacity(self, free: int, gpus: int, tier: Tier) -> int:
        return self.plugin.capacity(free, gpus, tier)

    def pick(self, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
        return self.plugin.pick(free, gpus, tier, pods)

    def gbps(self, mask: int) -> float:
        return self.own.gbps(mask)

    def coherent_block(self, free: int) -> int:
        return self.own.coherent_block(free)

    def subsets(self, gpus: int, tier: Tier) -> tuple[int, ...]:
        return self.own.subsets(gpus, tier)


def fit(node: NodeState) -> NodeFit | PluginChoice:
    """The GPU sets ``node`` hands out: gangslice's own on a DRA node, the plugin's otherwise."""
    if node.plugin:
        return PluginChoice(fit_for(node.shape), plugin_fit_for(node.graph, node.kind))
    return fit_for(node.shape)


def capacity(node: NodeState, free: int, gpus: int, tier: Tier) -> int:
    """How many pods of ``gpus`` GPUs, each within ``tier``, the node serves from ``free``."""
    if node.plugin:
        return plugin_fit_for(node.graph, node.kind).capacity(free, gpus, tier)
    return fit_for(node.shape).capacity(free, gpus, tier)


def pick(node: NodeState, free: int, gpus: int, tier: Tier, pods: int) -> tuple[int, ...] | None:
    """The GPU masks ``pods`` pods get from ``free``, in the order the kubelet allocates them
    (None: the node cannot serve them all within ``tier``)."""
    if node.plugin:
        return plugin_fit_for(node.graph, node.kind).pick(free, gpus, tier, pods)
    return fit_for(node.shape).pick(free, gpus, tier, pods)


def reason(node: NodeState, free: int, gpus: int, tier: Tier, pods: int) -> str | None:
    """Why the device plugin keeps ``pods`` pods of ``gpus`` GPUs within ``tier`` off a node
    that gangslice's own choice would fit (None: a DRA node, or the plugin is no obstacle)."""
    if not node.plugin or fit_for(node.shape).pick(free, gpus, tier, pods) is None:
        return None
    return plugin_fit_for(node.graph, node.kind).reason(free, gpus, tier, pods)


def handed(node: NodeState, free: int, gpus: int) -> int | None:
    """The mask the device plugin hands one pod of ``gpus`` GPUs from ``free`` on a
    device-plugin node, whatever its coherence (None: a DRA node, or no usable answer:
    the kubelet then takes the lowest free ids)."""
    if not node.plugin or gpus <= 0:
        return None
    got = plugin_fit_for(node.graph, node.kind).pick(free, gpus, Tier.NODE, 1)
    return got[0] if got else None
