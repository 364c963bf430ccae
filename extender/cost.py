"""Communication-cost model: predicted per-layer time of a placement's collectives.

All bandwidths are *bidirectional per GPU* in GB/s, the convention NVIDIA quotes
("900 GB/s NVLink 4"), so the figures below compare like with like. Times are microseconds.

The seed formula for tensor parallelism (two all-reduces per transformer layer, ring):

    T_comm = 2 * (2 * (K - 1) / K * L * H * b / B + alpha)

K GPUs in the ring, L tokens in the step, H hidden size, b bytes per element, B the
bottleneck bandwidth of the ring (its slowest hop), alpha the launch latency of one
collective. All-to-all (expert parallel), point-to-point (pipeline stage boundary) and the
KV-cache hand-off (prefill to decode) use the same alpha-beta model with their own factors
(nccl-tests PERFORMANCE.md: all-reduce 2(n-1)/n, all-to-all (n-1)/n, send/recv 1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from extender.topology.bandwidth import (
    HOST_BRIDGE_FACTOR,
    IB_NDR_GBPS,
    NVLINK4_PER_LINK_GBPS,
    NVLINK5_PER_LINK_GBPS,
    PCIE_GEN4_X16_GBPS,
    PCIE_GEN5_X16_GBPS,
    ROCE_400GBE_GBPS,
    SYS_GBPS,
)

# --- Launch latency (alpha) per collective, microseconds -------------------------------
#: Small all-reduces on 8xB200 take ~48-51 us at 32 KiB..1 MiB through torch (stas00);
#: that includes framework overhead; NCCL alone is lower. We use these as a floor.
ALPHA_NVLINK_US = 8.0
ALPHA_PCIE_US = 12.0
ALPHA_NETWORK_US = 25.0
#: Ring bandwidth (GB/s) from which traffic inside a node is taken to run over NVLink, for
#: its launch latency: well above any PCIe slot (PCIE_GEN5_X16_GBPS).
NVLINK_RING_MIN_GBPS = 300.0


class Comm(enum.StrEnum):
    """How the pods of a pod set talk to each other."""

    ALLREDUCE = "allreduce"  # tensor parallel across pods
    ALLTOALL = "alltoall"  # expert parallel (DeepEP dispatch + combine)
    PIPELINE = "pipeline"  # pipeline stages, one per pod
    KV_TRANSFER = "kv-transfer"  # this pod set hands its KV cache to its colocateWith set
    NONE = "none"  # independent replicas


@dataclass(frozen=True, slots=True)
class ModelDims:
    """The model dimensions the cost model needs; defaults are a 70B-class dense model
    (Llama-3-70B: hidden 8192, 80 layers, 8 KV heads x 128, bf16) at a 128-token step."""

    hidden_size: int = 8192
    bytes_per_element: int = 2
    tokens: int = 128
    layers: int = 80
    kv_heads: int = 8
    head_dim: int = 128
    experts_per_token: int = 8
    #: Parameters of the whole model, and those one token goes through (a mixture of experts'
    #: shared layers and active experts); 0: estimated (see :attr:`total_parameters`).
    parameters: float = 0.0
    active_parameters: float = 0.0

    @property
    def total_parameters(self) -> float:
        """The parameter count, or where none is given the transformer blocks' 12 x layers x
        hidden^2 (attention 4 H^2, MLP 8 H^2; embeddings left out: Llama-3-70B gives 64e9)."""
        return self.parameters or 12.0 * self.layers * self.hidden_size**2

    @property
    def active(self) -> float:
        """Parameters each token goes through (all of them in a dense model)."""
        return self.active_parameters or self.total_parameters

    @property
    def weight_bytes(self) -> float:
        return self.total_parameters * self.bytes_per_element

    @property
    def activation_bytes(self) -> float:
        """Bytes one all-reduce moves: L x H x b."""
        return float(self.tokens * self.hidden_size * self.bytes_per_element)

    @property
    def kv_bytes_per_layer(self) -> float:
        """KV cache produced per layer for the step's tokens: K and V, each kv_heads x head_dim."""
        return float(2 * self.tokens * self.kv_heads * self.head_dim * self.bytes_per_element)


def _beta_us(nbytes: float, gbps: float) -> float:
    if gbps == float("inf"):
        return 0.0
    return nbytes / (gbps * 1e3)  # bytes / (GB/s) in microseconds


def allreduce_us(k: int, nbytes: float, gbps: float, alpha_us: float) -> float:
    """One ring all-reduce of ``nbytes`` over ``k`` ranks at bottleneck ``gbps``."""
    if k <= 1:
        return 0.0
    return 2.0 * (k - 1) / k * _beta_us(nbytes, gbps) + alpha_us


def alltoall_us(k: int, nbytes: float, gbps: float, alpha_us: float) -> float:
    """One all-to-all where every rank holds ``nbytes`` and keeps 1/k of it."""
    if k <= 1:
        return 0.0
    return (k - 1) / k * _beta_us(nbytes, gbps) + alpha_us


def p2p_us(nbytes: float, gbps: float, alpha_us: float) -> float:
    return _beta_us(nbytes, gbps) + alpha_us


def tp_layer_us(k: int, dims: ModelDims, gbps: float, alpha_us: float) -> float:
    """The seed formula: two all-reduces per transformer layer over a K-GPU TP group."""
    if k <= 1:
        return 0.0
    return 2.0 * allreduce_us(k, dims.activation_bytes, gbps, alpha_us)


def ep_layer_us(k: int, dims: ModelDims, gbps: float, alpha_us: float) -> float:
    """Expert parallel: dispatch and combine all-to-all per MoE layer; each token's hidden
    state goes to ``experts_per_token`` experts."""
    if k <= 1:
        return 0.0
    nbytes = dims.activation_bytes * dims.experts_per_token
    return 2.0 * alltoall_us(k, nbytes, gbps, alpha_us)


def pipeline_layer_us(stages: int, dims: ModelDims, gbps: float, alpha_us: float) -> float:
    """Stage-boundary sends, amortised over the layers: (stages-1) activations per step."""
    if stages <= 1:
        return 0.0
    return (stages - 1) * p2p_us(dims.activation_bytes, gbps, alpha_us) / dims.layers


def kv_layer_us(dims: ModelDims, gbps: float, alpha_us: float) -> float:
    """Moving one layer's KV cache for the step's tokens from a prefill pod to a decode pod."""
    return p2p_us(dims.kv_bytes_per_layer, gbps, alpha_us)


def alpha_for_gbps(gbps: float, crosses_nodes: bool) -> float:
    if crosses_nodes:
        return ALPHA_NETWORK_US
    return ALPHA_NVLINK_US if gbps >= NVLINK_RING_MIN_GBPS else ALPHA_PCIE_US


#: Named link classes for the ``gangslice cost`` command (GB/s, as above).
_LINK_CLASS_GBPS = {
    "nvlink3": 12 * NVLINK4_PER_LINK_GBPS,
    "nvlink": 18 * NVLINK4_PER_LINK_GBPS,
    "nvlink4": 18 * NVLINK4_PER_LINK_GBPS,
    "nvlink5": 18 * NVLINK5_PER_LINK_GBPS,
    "pcie": PCIE_GEN4_X16_GBPS,
    "pcie4": PCIE_GEN4_X16_GBPS,
    "pcie5": PCIE_GEN5_X16_GBPS,
    "phb": PCIE_GEN4_X16_GBPS * HOST_BRIDGE_FACTOR,
    "sys": SYS_GBPS,
    "ib": IB_NDR_GBPS,
    "roce": ROCE_400GBE_GBPS,
}
LINK_CLASSES = tuple(_LINK_CLASS_GBPS)


def link_class_gbps(name: str) -> float:
    """The bandwidth of a named link class (see :data:`LINK_CLASSES`)."""
    try:
        return _LINK_CLASS_GBPS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(_LINK_CLASS_GBPS))
        raise ValueError(f"unknown link class {name!r}; known: {known}") from None
