"""What a GPU model computes and moves per second: the datasheet figures the step-time model
(:mod:`extender.compute`) reads, keyed by GPU Feature Discovery's ``nvidia.com/gpu.product``.

GPU Feature Discovery writes the NVML device name with spaces turned into dashes
(``NVIDIA-H100-80GB-HBM3``, ``NVIDIA-GB200``, ``NVIDIA-L40S``), with ``-SHARED`` appended under
time-slicing and ``-MIG-<profile>`` under MIG; presets and NVML discovery name the model in
the GPU graph (``H100-SXM``, ``NVIDIA H100 80GB HBM3``). :func:`gpu_spec` reads any of them.

All peaks are **dense** (no 2:4 sparsity), per GPU, from NVIDIA's datasheets:

- H100 SXM5: BF16 989 TFLOPS, FP8 1,979, HBM3 3.35 TB/s; H100 PCIe: 756 / 1,513, 2.0 TB/s
  (NVIDIA H100 Tensor Core GPU datasheet; the sheet quotes sparse figures, twice these);
- H200 SXM: 989 / 1,979, HBM3e 4.8 TB/s (NVIDIA H200 Tensor Core GPU datasheet);
- B200 (HGX B200): 2,250 / 4,500, 8 TB/s (NVIDIA DGX B200 datasheet: 72 PFLOPS FP8 sparse
  and 64 TB/s for 8 GPUs);
- GB200 (one Blackwell GPU of a GB200 NVL72): 2,500 / 5,000, 8 TB/s (NVIDIA GB200 NVL72
  datasheet: 360 PFLOPS BF16 and 720 PFLOPS FP8 sparse, 576 TB/s, for 72 GPUs);
- A100 SXM4 80 GB: BF16 312, no FP8 unit (FP8 weights run at the BF16 rate), 2.039 TB/s;
  40 GB: 1.555 TB/s (NVIDIA A100 Tensor Core GPU datasheet);
- L40S: 362 / 733, GDDR6 0.864 TB/s (NVIDIA L40S datasheet);
- L4: 121 / 242, 0.3 TB/s (NVIDIA L4 Tensor Core GPU datasheet).

``price_order`` is the order an administrator lists the models' ResourceFlavors in, cheapest
first (list prices rise with the generation and the memory: L4, L40S, A100, H100, H200, B200,
GB200); only the order is used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

#: GPU Feature Discovery's label for the GPU model.
PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model: dense tensor-core peaks (TFLOPS) and memory bandwidth (TB/s)."""

    name: str
    bf16_tflops: float
    fp8_tflops: float
    memory_tbps: float
    price_order: int

    def tflops(self, bytes_per_element: int) -> float:
        """The dense peak for a model of this many bytes per element (1: FP8, else BF16)."""
        return self.fp8_tflops if bytes_per_element <= 1 else self.bf16_tflops


H100_SXM = GpuSpec("H100 SXM", 989.0, 1979.0, 3.35, 3)
H100_PCIE = GpuSpec("H100 PCIe", 756.0, 1513.0, 2.0, 3)
H200 = GpuSpec("H200", 989.0, 1979.0, 4.8, 4)
B200 = GpuSpec("B200", 2250.0, 4500.0, 8.0, 5)
GB200 = GpuSpec("GB200", 2500.0, 5000.0, 8.0, 6)
A100_80GB = GpuSpec("A100 80GB", 312.0, 312.0, 2.039, 2)
A100_40GB = GpuSpec("A100 40GB", 312.0, 312.0, 1.555, 2)
L40S = GpuSpec("L40S", 362.0, 733.0, 0.864, 1)
L4 = GpuSpec("L4", 121.0, 242.0, 0.3, 0)

#: Every model :func:`gpu_spec` knows, by the name it reports.
KNOWN: Mapping[str, GpuSpec] = {
    s.name: s for s in (H100_SXM, H100_PCIE, H200, B200, GB200, A100_80GB, A100_40GB, L40S, L4)
}

_NOT_MODEL = re.compile(r"-(SHARED|MIG-.*)$")


def _words(product: str) -> list[str]:
    """``NVIDIA-H100-80GB-HBM3`` / ``NVIDIA H100 80GB HBM3`` / ``H100-SXM`` -> ``[H100, 80GB, HBM3]``."""
    text = re.sub(r"[\s_]+", "-", product.strip().upper())
    text = _NOT_MODEL.sub("", text)
    words = [w for w in text.split("-") if w]
    if words and words[0] == "NVIDIA":
        words = words[1:]
    return words


def gpu_spec(product: str | None) -> GpuSpec | None:
    """The spec of a GPU model named as GPU Feature Discovery, NVML or a preset names it,
    or None for a model this table does not know."""
    if not product:
        return None
    words = _words(product)
    if not words:
        return None
    family, rest = words[0], words[1:]
    if family == "H100":
        return H100_PCIE if "PCIE" in rest else H100_SXM
    if family == "A100":
        return A100_40GB if any(w.startswith("40GB") for w in rest) else A100_80GB
    by_family = {"H200": H200, "B200": B200, "GB200": GB200, "L40S": L40S, "L4": L4}
    return by_family.get(family)


def node_gpu(labels: Mapping[str, str], graph_model: str | None) -> GpuSpec | None:
    """A node's GPU model: its ``nvidia.com/gpu.product`` label, else its GPU graph's model."""
    return gpu_spec(labels.get(PRODUCT_LABEL)) or gpu_spec(graph_model)
