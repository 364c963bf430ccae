"""Who picks a pod's GPUs on a node: the device plugin, or the scheduler through DRA.

Under ``devicePlugin`` (the stock NVIDIA k8s-device-plugin) the kubelet asks the plugin for
each container's devices, so the in-node choice is the plugin's
(:mod:`extender.topology.device_plugin` predicts it); the scheduler only chooses the node.
Under ``dra`` (NVIDIA's DRA driver, ``resource.k8s.io/v1``) a ResourceClaim can name the
exact devices, so the choice gangslice makes is the one the node delivers.
"""

from __future__ import annotations

import enum

__all__ = ["Allocation"]


class Allocation(enum.StrEnum):
    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"

    @property
    def words(self) -> str:
        """The mode's name in reports: ``device plugin`` or ``DRA``."""
        return "device plugin" if self is Allocation.DEVICE_PLUGIN else "DRA"
