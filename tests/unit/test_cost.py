"""The communication-cost model: the seed formula, its siblings, and the ratios they imply."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import cost
from extender.cost import ModelDims
from extender.topology.model import Link, PcieLevel, Tier, link_gbps

#: A bandwidth-bound message: a 405B-class model (hidden 16384, bf16) prefilling a 32k-token chunk.
BIG = ModelDims(hidden_size=16384, bytes_per_element=2, tokens=32768)


def test_seed_formula_by_hand() -> None:
    # T = 2 * (2 * (K-1)/K * L*H*b / B + alpha), K=8, L=128, H=8192, b=2, B=900 GB/s, alpha=8 us.
    k, tokens, hidden, b, gbps, alpha = 8, 128, 8192, 2, 900.0, 8.0
    nbytes = tokens * hidden * b  # 2 MiB
    beta_us = nbytes / (gbps * 1e9) * 1e6
    by_hand = 2 * (2 * (k - 1) / k * beta_us + alpha)
    assert by_hand == pytest.approx(24.15559, abs=1e-5)  # 2 * (1.75 * 2.33017 + 8)
    assert cost.tp_layer_us(k, ModelDims(hidden, b, tokens), gbps, alpha) == pytest.approx(by_hand)


def test_one_gpu_or_one_rank_costs_nothing() -> None:
    dims = ModelDims()
    assert cost.tp_layer_us(1, dims, 32.0, 12.0) == 0.0
    assert cost.ep_layer_us(1, dims, 32.0, 12.0) == 0.0
    assert cost.allreduce_us(1, 1e6, 32.0, 12.0) == 0.0
    assert cost.alltoall_us(0, 1e6, 32.0, 12.0) == 0.0
    assert cost.pipeline_layer_us(1, dims, 32.0, 12.0) == 0.0


def _tp_over(link_class: str, dims: ModelDims, k: int = 8) -> float:
    gbps = cost.link_class_gbps(link_class)
    return cost.tp_layer_us(k, dims, gbps, cost.alpha_for_gbps(gbps, crosses_nodes=False))


@pytest.mark.parametrize("slow", ["pcie", "sys"])
def test_tp_across_a_pcie_or_upi_hop_costs_14_to_28x_nvlink(slow: str) -> None:
    """The ratio is derived from the model: a bandwidth-bound all-reduce over a 32-64 GB/s
    hop against one inside a 900 GB/s NVLink domain."""
    assert 32 <= cost.link_class_gbps(slow) <= 64
    assert cost.link_class_gbps("nvlink") == 900
    ratio = _tp_over(slow, BIG) / _tp_over("nvlink", BIG)
    assert 14 <= ratio <= 28.5, ratio
    # It approaches the bandwidth ratio from below as the message grows (alpha fades) ...
    assert ratio <= cost.link_class_gbps("nvlink") / cost.link_class_gbps(slow)
    small = ModelDims(tokens=1)
    # ... and a latency-bound decode step sees far less of it.
    assert _tp_over(slow, small) / _tp_over("nvlink", small) < ratio / 2


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    k=st.integers(2, 64),
    tokens=st.integers(1, 1 << 16),
    gbps=st.floats(1.0, 2000.0),
    alpha=st.floats(0.0, 50.0),
)
def test_monotone_in_group_size_and_bandwidth(k: int, tokens: int, gbps: float, alpha: float) -> None:
    dims = ModelDims(tokens=tokens)
    t = cost.tp_layer_us(k, dims, gbps, alpha)
    assert cost.tp_layer_us(k + 1, dims, gbps, alpha) > t  # more ranks: more of the buffer moves
    assert cost.tp_layer_us(k, dims, gbps * 2, alpha) < t  # more bandwidth: faster
    assert cost.tp_layer_us(k, dims, gbps, alpha + 1) > t
    assert cost.ep_layer_us(k + 1, dims, gbps, alpha) > cost.ep_layer_us(k, dims, gbps, alpha)
    assert cost.ep_layer_us(k, dims, gbps * 2, alpha) < cost.ep_layer_us(k, dims, gbps, alpha)
    # The ring never moves more than twice the buffer.
    assert t <= 2 * (2 * dims.activation_bytes / (gbps * 1e3) + alpha) + 1e-9


def test_all_to_all_by_hand() -> None:
    dims = ModelDims(hidden_size=7168, bytes_per_element=1, tokens=256, experts_per_token=8)
    k, gbps, alpha = 16, 100.0, 25.0
    nbytes = 256 * 7168 * 1 * 8
    one = (k - 1) / k * nbytes / (gbps * 1e3) + alpha
    assert cost.alltoall_us(k, nbytes, gbps, alpha) == pytest.approx(one)
    assert cost.ep_layer_us(k, dims, gbps, alpha) == pytest.approx(2 * one)  # dispatch + combine


def test_pipeline_by_hand() -> None:
    dims = ModelDims(tokens=128, layers=80)
    stages, gbps, alpha = 4, 50.0, 25.0
    send = dims.activation_bytes / (gbps * 1e3) + alpha
    assert cost.p2p_us(dims.activation_bytes, gbps, alpha) == pytest.approx(send)
    assert cost.pipeline_layer_us(stages, dims, gbps, alpha) == pytest.approx(3 * send / 80)


def test_kv_transfer_by_hand() -> None:
    dims = ModelDims(tokens=4096, kv_heads=8, head_dim=128, bytes_per_element=2)
    assert dims.kv_bytes_per_layer == 2 * 4096 * 8 * 128 * 2  # K and V
    nvlink = cost.kv_layer_us(dims, 900.0, cost.ALPHA_NVLINK_US)
    network = cost.kv_layer_us(dims, 100.0, cost.ALPHA_NETWORK_US)
    assert nvlink == pytest.approx(dims.kv_bytes_per_layer / 900e3 + 8.0)
    assert network == pytest.approx(dims.kv_bytes_per_layer / 100e3 + 25.0)
    assert network > nvlink
    assert cost.kv_layer_us(dims, float("inf"), 0.0) == 0.0


def test_link_bandwidths() -> None:
    assert link_gbps(Link(nvlinks=18), 50.0, 128.0, Tier.NVLINK) == 900.0
    assert link_gbps(Link(nvlinks=18), 100.0, 128.0, Tier.NVLINK) == 1800.0
    assert link_gbps(Link(pcie=PcieLevel.PIX), 50.0, 64.0, Tier.PIX) == 64.0
    assert link_gbps(Link(pcie=PcieLevel.PXB), 50.0, 64.0, Tier.PXB) == 64.0
    assert link_gbps(Link(pcie=PcieLevel.NODE), 50.0, 64.0, Tier.NUMA) == 32.0
    assert link_gbps(Link(pcie=PcieLevel.SYS), 50.0, 128.0, Tier.NODE) == cost.SYS_GBPS
    # Reported SYS on one NUMA node (a flattened VM board): no faster than a host bridge.
    assert link_gbps(Link(pcie=PcieLevel.SYS), 50.0, 128.0, Tier.NUMA) == 32.0


def test_link_classes() -> None:
    assert cost.link_class_gbps("NVLink") == 900.0
    assert cost.link_class_gbps("nvlink5") == 1800.0
    assert cost.link_class_gbps("ib") == cost.IB_NDR_GBPS
    # RoCE on 400 GbE runs at NDR's line rate, far below a node's NVLink.
    assert cost.link_class_gbps("roce") == cost.ROCE_400GBE_GBPS == cost.IB_NDR_GBPS
    assert "roce" in cost.LINK_CLASSES
    assert all(cost.link_class_gbps(c) > 0 for c in cost.LINK_CLASSES)
    with pytest.raises(ValueError, match="unknown link class 'token-ring'"):
        cost.link_class_gbps("token-ring")


def test_alpha_by_path() -> None:
    assert cost.alpha_for_gbps(900.0, crosses_nodes=False) == cost.ALPHA_NVLINK_US
    assert cost.alpha_for_gbps(64.0, crosses_nodes=False) == cost.ALPHA_PCIE_US
    assert cost.alpha_for_gbps(900.0, crosses_nodes=True) == cost.ALPHA_NETWORK_US
