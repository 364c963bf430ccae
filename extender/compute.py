"""Compute-time model: how long a pod set's GPUs take for one step of its model, by roofline.

A step runs ``tokens`` tokens through the model. It is bound either by arithmetic or by
reading the weights from GPU memory, whichever takes longer::

    T_compute = max(2 * A * L / (G * P * MFU),  W * b / (G * M * MBU))

A active parameters (every parameter of a dense model; a mixture of experts' shared layers
and active experts), L tokens, G the GPUs that split the work, P the GPU's dense tensor peak
for the model's element size (FP8 for 1 byte, else BF16; :mod:`extender.topology.gpus`), W
the parameter count and b bytes per element, M the GPU's memory bandwidth. MFU and MBU are the
shares of the peaks a serving step reaches: the same for every GPU model, so the ratio
between two models is their datasheets' ratio. A 2,048-token prefill of an 8B model is
arithmetic-bound (H100 / L40S = 989 / 362 = 2.7x); a decode of a few tokens reads every
weight once (3.35 / 0.864 = 3.9x).

Which GPUs split the work (:func:`work_gpus`): tensor-parallel and expert-parallel ranks
divide it (``allreduce``, ``alltoall``: every GPU of the pod set); pipeline stages add (each
of S stages does 1/S of the layers on its own GPUs, one after the other, so a stage's GPUs
count); independent replicas (``none``, ``kv-transfer``) each run the whole model on their
own GPUs.
"""

from __future__ import annotations

from extender.cost import Comm, ModelDims
from extender.topology.gpus import GpuSpec

#: Share of the dense tensor peak a large serving step sustains (prefill GEMMs).
MFU = 0.5
#: Share of the memory bandwidth a step that streams the weights sustains (decode).
MBU = 0.8


def compute_us(dims: ModelDims, gpus: int, spec: GpuSpec) -> float:
    """One step of ``dims.tokens`` tokens through the whole model on ``gpus`` GPUs of ``spec``
    that split it evenly, microseconds."""
    if gpus <= 0:
        return 0.0
    arithmetic = 2.0 * dims.active * dims.tokens / (gpus * spec.tflops(dims.bytes_per_element) * 1e12 * MFU)
    memory = dims.weight_bytes / (gpus * spec.memory_tbps * 1e12 * MBU)
    return max(arithmetic, memory) * 1e6


def work_gpus(comm: Comm, pods: int, gpus_per_pod: int) -> int:
    """How many GPUs split one step of the model (see the module's docstring)."""
    if comm in (Comm.ALLREDUCE, Comm.ALLTOALL):
        return pods * gpus_per_pod
    return gpus_per_pod
