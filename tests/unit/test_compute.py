"""Step time: the roofline compute model against hand-computed figures, the GPU table, and a
slice's step (compute + communication)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from extender.compute import MBU, MFU, compute_us, work_gpus
from extender.cost import Comm, ModelDims
from extender.placement.files import FileError, cluster_from_data, gang_from_data
from extender.placement.request import PodSet
from extender.placement.slice import PodSlot
from extender.placement.step import pod_set_compute_us, slice_step
from extender.topology.gpus import A100_40GB, A100_80GB, GB200, H100_PCIE, H100_SXM, H200, L4, L40S, gpu_spec

LLAMA_8B = ModelDims(hidden_size=4096, layers=32, parameters=8.03e9)


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("NVIDIA-H100-80GB-HBM3", H100_SXM),
        ("NVIDIA-H100-80GB-HBM3-SHARED", H100_SXM),  # time-slicing
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", H100_SXM),
        ("NVIDIA H100 80GB HBM3", H100_SXM),  # NVML's name
        ("H100-SXM", H100_SXM),  # a preset's model
        ("NVIDIA-H100-PCIe", H100_PCIE),
        ("NVIDIA-H200", H200),
        ("NVIDIA-GB200", GB200),
        ("NVIDIA-A100-SXM4-80GB", A100_80GB),
        ("NVIDIA-A100-SXM4-40GB", A100_40GB),
        ("NVIDIA-L40S", L40S),
        ("NVIDIA-L4", L4),
        ("NVIDIA-T4", None),
        ("", None),
        (None, None),
    ],
)
def test_gpu_models_by_the_names_gpu_feature_discovery_nvml_and_presets_give(
    name: str | None, spec: object
) -> None:
    assert gpu_spec(name) is spec


def test_a_one_gpu_decode_is_bound_by_memory_bandwidth() -> None:
    decode = ModelDims(hidden_size=4096, layers=32, tokens=16, parameters=8.03e9)
    h100, l40s = compute_us(decode, 1, H100_SXM), compute_us(decode, 1, L40S)
    # Reading 16.06 GB of weights at 80 % of 3.35 TB/s.
    assert h100 == pytest.approx(8.03e9 * 2 / (3.35e12 * MBU) * 1e6)
    assert l40s / h100 == pytest.approx(3.35 / 0.864)


def test_a_tp8_70b_prefill_is_bound_by_arithmetic() -> None:
    prefill = ModelDims(hidden_size=8192, layers=80, tokens=2048, parameters=70.6e9)
    arithmetic = 2 * 70.6e9 * 2048 / (8 * 989e12 * MFU) * 1e6
    memory = 70.6e9 * 2 / (8 * 3.35e12 * MBU) * 1e6
    assert arithmetic > memory
    assert compute_us(prefill, 8, H100_SXM) == pytest.approx(arithmetic)
    # An 8B prefill: H100 over L40S is the ratio of their BF16 peaks.
    llama = ModelDims(hidden_size=4096, layers=32, tokens=2048, parameters=8.03e9)
    assert compute_us(llama, 1, L40S) / compute_us(llama, 1, H100_SXM) == pytest.approx(989 / 362)


def test_fp8_models_run_at_the_fp8_peak_where_the_gpu_has_one() -> None:
    fp8 = ModelDims(hidden_size=8192, layers=80, tokens=2048, bytes_per_element=1, parameters=70.6e9)
    assert compute_us(fp8, 4, H100_SXM) == pytest.approx(2 * 70.6e9 * 2048 / (4 * 1979e12 * MFU) * 1e6)
    assert compute_us(fp8, 4, A100_80GB) == pytest.approx(2 * 70.6e9 * 2048 / (4 * 312e12 * MFU) * 1e6)


def test_a_mixture_of_experts_computes_with_its_active_parameters_and_reads_all_weights() -> None:
    moe = ModelDims(tokens=2048, bytes_per_element=1, parameters=671e9, active_parameters=37e9)
    arithmetic = 2 * 37e9 * 2048 / (64 * 1979e12 * MFU) * 1e6
    memory = 671e9 / (64 * 3.35e12 * MBU) * 1e6
    assert compute_us(moe, 64, H100_SXM) == pytest.approx(max(arithmetic, memory))


def test_parameters_are_estimated_from_the_shape_when_not_given() -> None:
    assert ModelDims(hidden_size=8192, layers=80).total_parameters == 12 * 80 * 8192**2
    assert ModelDims(parameters=7e9).active == 7e9


def test_ranks_divide_the_work_and_pipeline_stages_add() -> None:
    assert work_gpus(Comm.ALLREDUCE, 2, 8) == 16
    assert work_gpus(Comm.ALLTOALL, 8, 8) == 64
    assert work_gpus(Comm.PIPELINE, 2, 8) == 8
    assert work_gpus(Comm.NONE, 4, 2) == 2
    big = ModelDims(hidden_size=16384, layers=126, tokens=2048, parameters=405e9)
    stages = PodSet("stages", 2, 8, Comm.PIPELINE, model=big)
    one = compute_us(big, 8, H100_SXM)
    # Two stages of half the layers each, one after the other: the time of one 8-GPU stage
    # doing all of it; a faster second stage takes half its own time off.
    assert pod_set_compute_us(stages, [H100_SXM, H100_SXM]) == pytest.approx(one)
    assert pod_set_compute_us(stages, [H100_SXM, GB200]) == pytest.approx(
        (one + compute_us(big, 8, GB200)) / 2
    )
    # Tensor ranks work in lock step: the slowest GPU model sets the pace.
    tp = PodSet("tp", 2, 4, Comm.ALLREDUCE, model=big)
    assert pod_set_compute_us(tp, [H100_SXM, L40S]) == pytest.approx(compute_us(big, 8, L40S))
    # Independent replicas: each at its own pace, the pod set at their mean.
    reps = PodSet("r", 2, 1, Comm.NONE, model=LLAMA_8B)
    mean = (compute_us(LLAMA_8B, 1, H100_SXM) + compute_us(LLAMA_8B, 1, L40S)) / 2
    assert pod_set_compute_us(reps, [H100_SXM, L40S]) == pytest.approx(mean)
    assert pod_set_compute_us(reps, [None, None]) == 0.0  # an unknown model computes in no time


def test_a_slice_step_is_compute_plus_communication_per_pod_set() -> None:
    snap = cluster_from_data(
        {
            "nodes": [
                {
                    "name": "h",
                    "gpuTopology": "hgx-h100",
                    "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                },
                {
                    "name": "p",
                    "gpuTopology": "pcie-8gpu-2socket",
                    "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S"},
                },
            ]
        },
        Path("."),
    )
    gang = gang_from_data(
        {
            "name": "g",
            "podSets": [
                {
                    "name": "a",
                    "count": 1,
                    "gpusPerPod": 2,
                    "comm": "allreduce",
                    "model": {"parameters": "14.8B"},
                },
                {"name": "b", "count": 1, "gpusPerPod": 1, "model": {"parameters": 8.03e9}},
            ],
        },
        "g",
    )
    step = slice_step(snap, gang, [PodSlot("a", 0, "h", (0, 1)), PodSlot("b", 0, "p", (0,))])
    a, b = step.by_pod_set["a"], step.by_pod_set["b"]
    assert a.gpus == {"H100 SXM": 2} and b.gpus == {"L40S": 1}
    assert a.compute_us == pytest.approx(compute_us(gang.pod_sets[0].model, 2, H100_SXM))
    assert a.comm_us > 0 and b.comm_us == 0  # one GPU talks to nobody
    assert step.total_us == pytest.approx(a.compute_us + a.comm_us + b.compute_us)


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ({"parameters": "a lot"}, "parameters"),
        ({"parameters": -1}, "parameters"),
        (
            {"parameters": "8B", "activeParameters": "9B"},
            "activeParameters (9e+09) exceeds parameters (8e+09)",
        ),
    ],
)
def test_bad_parameter_counts_name_the_field(model: dict[str, object], words: str) -> None:
    with pytest.raises(FileError, match=re.escape(words)):
        gang_from_data(
            {"name": "g", "podSets": [{"name": "s", "count": 1, "gpusPerPod": 1, "model": model}]}, "g"
        )


def test_parameter_counts_read_with_suffixes() -> None:
    gang = gang_from_data(
        {
            "name": "g",
            "podSets": [
                {
                    "name": "s",
                    "count": 1,
                    "gpusPerPod": 8,
                    "model": {"parameters": "671B", "activeParameters": "37e9"},
                }
            ],
        },
        "g",
    )
    assert (gang.pod_sets[0].model.parameters, gang.pod_sets[0].model.active_parameters) == (671e9, 37e9)
