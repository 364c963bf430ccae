"""Counts are read from ASCII digits only, and a negative or fractional GPU count is refused
with the field named: in a pod's resources, in a gang-size annotation, in Volcano's
milli-unit ScalarResources (the one reader of GPU requests is extender.kube.pods)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from extender.httpapi.app import build_app
from extender.kube import names as keys
from extender.kube.pods import PodError, PodInfo, gpu_request, milli_quantity, parse_gpu_list, quantity
from extender.reservations import ClusterCache
from extender.testing.extender import client_for, pod_obj, write_cluster

REPO = Path(__file__).resolve().parents[2]
NOT_ASCII = [" 8 ", "\uff18", "\u0668", "8 ", "+8", "8_0", "0x8", "\uff18000m", "-8000m", "8.0"]


@pytest.mark.parametrize("text", NOT_ASCII)
def test_quantities_are_ascii_digits_only(text: str) -> None:
    with pytest.raises(PodError, match="not a whole number in ASCII digits"):
        quantity(text)


@pytest.mark.parametrize("value", [-8, -8.0, -1])
def test_negative_numbers_are_named_negative(value: float) -> None:
    with pytest.raises(PodError, match="negative"):
        quantity(value)


def test_a_gpu_request_error_names_the_container_and_field() -> None:
    spec = {"containers": [{"name": "vllm", "resources": {"limits": {keys.GPU_RESOURCE: "\u0668"}}}]}
    with pytest.raises(PodError) as got:
        gpu_request(spec)
    assert str(got.value).startswith(f"spec.containers[vllm].resources.limits[{keys.GPU_RESOURCE}]: ")
    pod = pod_obj("x")
    pod["spec"]["containers"][0]["resources"] = {"requests": {keys.GPU_RESOURCE: " 8 "}}
    info = PodInfo.from_obj(pod)
    assert info.gpus == 0 and "spec.containers[main].resources.requests" in info.problems[0]


@pytest.mark.parametrize("raw", ["\uff18", "\u0668", " 8", "8 "])
def test_gang_sizes_and_gpu_lists_are_ascii_digits_only(raw: str) -> None:
    pod = PodInfo.from_obj(pod_obj("x", annotations={keys.GANG_SIZE: raw, keys.GPUS: f"0,{raw}"}))
    with pytest.raises(PodError, match="gang-size"):
        _ = pod.gang_size
    assert pod.assigned_gpus is None
    assert parse_gpu_list("0,1") == (0, 1)


@pytest.mark.parametrize(
    ("value", "why"),
    [(-8000, "negative"), (8500, "not a whole count"), ("8000", "not a number"), (float("inf"), "finite")],
)
def test_milli_quantities_refuse_negative_fractional_and_strings(value: Any, why: str) -> None:
    with pytest.raises(PodError, match=why) as got:
        milli_quantity(value, "task.Resreq.ScalarResources[nvidia.com/gpu]")
    assert str(got.value).startswith("task.Resreq.ScalarResources[nvidia.com/gpu]: ")
    assert milli_quantity(8000, "x") == 8 and milli_quantity(0.0, "x") == 0


def _task(milli: Any) -> dict[str, Any]:
    return {
        "Name": "w-0",
        "Namespace": "llm",
        "UID": "u-1",
        "Job": "llm/pg-1",
        "Resreq": {"ScalarResources": {keys.GPU_RESOURCE: milli}},
    }


def test_volcano_refuses_a_negative_gpu_request_naming_the_field(tmp_path: Path) -> None:
    async def go() -> None:
        cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))
        async with client_for(build_app(cache)) as client:
            r = await client.post(
                "/gangslice/volcano/predicate", json={"task": _task(-8000), "node": {"Name": "h-0"}}
            )
            reply = await r.json()
            assert reply["code"] == 3, reply
            assert "task.Resreq.ScalarResources[nvidia.com/gpu]: -8000 is negative" in reply["status"]
            job = {
                "Name": "pg-1",
                "Namespace": "llm",
                "TotalRequest": {"ScalarResources": {"nvidia.com/gpu": -8000}},
            }
            r = await client.post("/gangslice/volcano/jobEnqueueable", json={"job": job})
            assert (await r.json())["status"] == -1

    asyncio.run(go())


def test_one_reader_of_gpu_requests() -> None:
    """Every place that reads the nvidia.com/gpu value out of a resources map hands it to
    the readers of extender/kube/pods.py within the next three lines."""
    readers = ("quantity(", "milli_quantity(", "gpu_request(")
    reads = 0
    for path in sorted((REPO / "extender").rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(r"\.get\((names|keys)\.GPU_RESOURCE", line):
                reads += 1
                near = " ".join(lines[i : i + 4])
                assert any(r in near for r in readers), f"{path.relative_to(REPO)}:{i + 1}: {line.strip()}"
    assert reads >= 4
