"""`gangslice preflight` with the fake NVML backend, environment variables and an annotations file."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from extender.agent.fakes import FAKE_ENV, fake_node
from extender.agent.preflight import (
    FOLLOWED,
    PreflightError,
    Promise,
    Visible,
    parse_annotations,
    run_checks,
    visible_gpus,
)
from extender.cli import main
from extender.topology.model import Gpu, GpuGraph, Link, Tier
from extender.topology.nvml import discover

SOCKET0_H100 = frozenset(range(0, 52))
SOCKET1_H100 = frozenset(range(52, 104))
SOCKET0_L40S = frozenset(range(0, 32))


def _graph(name: str) -> GpuGraph:
    with fake_node(name) as (fake, sysfs):
        return discover(fake, sysfs_root=sysfs)


@pytest.fixture(scope="module")
def hgx() -> GpuGraph:
    return _graph("hgx-h100")


@pytest.fixture(scope="module")
def pcie() -> GpuGraph:
    return _graph("pcie-2socket")


def _annotations(tmp_path: Path, **values: str) -> Path:
    keys = {
        "gpus": "gangslice.io/gpus",
        "numa": "gangslice.io/numa-node",
        "level": "gangslice.io/required-level",
        "uuids": "gangslice.io/gpu-uuids",
    }
    lines = [f'{keys[k]}="{v}"' for k, v in values.items()]
    lines.append('kubernetes.io/config.seen="2026-08-01T12:00:00.000000000Z"')
    path = tmp_path / "annotations"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", FAKE_ENV):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _affinity(monkeypatch: pytest.MonkeyPatch, cpus: frozenset[int]) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))


# --- the command end to end --------------------------------------------------------------


def test_passes_on_a_good_hgx_assignment(
    cli: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], hgx: GpuGraph
) -> None:
    uuids = ",".join(hgx.gpu(i).uuid or "" for i in (4, 5, 6, 7))
    cli.setenv("NVIDIA_VISIBLE_DEVICES", uuids)
    cli.setenv(FAKE_ENV, "hgx-h100")
    _affinity(cli, frozenset(range(60, 68)))
    ann = _annotations(tmp_path, gpus="4,5,6,7", numa="1")

    assert main(["preflight", "--annotations", str(ann), "--expect-tp", "4"]) == 0
    out = capsys.readouterr()
    assert "GPUs 4,5,6,7 as promised" in out.out
    assert "all 6 pairs NV18" in out.out
    assert "process CPUs 60-67 on it" in out.out
    assert "nearest NICs mlx5_4, mlx5_5, mlx5_6, mlx5_7" in out.out
    assert "numactl prefix: numactl --cpunodebind=1 --membind=1" in out.out
    assert out.out.rstrip().endswith("PASS")
    assert out.err == ""


def test_fails_when_a_tp_pair_crosses_sys_on_the_pcie_box(
    cli: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.setenv("NVIDIA_VISIBLE_DEVICES", "2,3,4,5")
    _affinity(cli, SOCKET0_L40S)
    ann = _annotations(tmp_path, gpus="2,3,4,5")

    code = main(["preflight", "--nvml-fake", "pcie-2socket", "--annotations", str(ann), "--allow-pcie"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0] == (
        "gangslice preflight: FAIL: tp-links: tensor-parallel pair GPU2-GPU4 is SYS, "
        "needs PCIe-tree-local or tighter (and 3 more pairs)"
    )


@pytest.mark.parametrize(
    ("visible", "cpus", "promised", "check", "reason"),
    [
        pytest.param(
            "0,1,2,3",
            SOCKET1_H100,
            {"gpus": "0,1,2,3", "numa": "0"},
            "numa",
            "process CPUs 52-103 share no NUMA node with the GPUs (NUMA node 0, CPUs 0-51)",
            id="numa-vs-process-cpus",
        ),
        pytest.param(
            "0,1",
            SOCKET0_H100,
            {"gpus": "0,1", "numa": "1"},
            "numa",
            "GPUs are on NUMA node 0, promised NUMA node 1 (gangslice.io/numa-node)",
            id="numa-vs-promise",
        ),
        pytest.param(
            "0,1,2,4",
            SOCKET0_H100,
            {"gpus": "0,1,2,3", "numa": "0"},
            "gpus",
            "visible GPUs 0,1,2,4 differ from the promised 0,1,2,3",
            id="visible-vs-promise",
        ),
    ],
)
def test_fails_on_a_broken_promise_on_hgx(
    cli: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    visible: str,
    cpus: frozenset[int],
    promised: dict[str, str],
    check: str,
    reason: str,
) -> None:
    cli.setenv("NVIDIA_VISIBLE_DEVICES", visible)
    cli.setenv(FAKE_ENV, "hgx-h100")
    _affinity(cli, cpus)
    ann = _annotations(tmp_path, **promised)

    assert main(["preflight", "--annotations", str(ann), "--strict-gpus"]) == 1
    out = capsys.readouterr()
    assert f"FAIL  {check}" in out.out
    assert out.err.strip() == f"gangslice preflight: FAIL: {check}: {reason}"
    # Without --strict-gpus, other GPUs than promised (as many, meeting the rule) pass, saying so.
    code = main(["preflight", "--annotations", str(ann)])
    out = capsys.readouterr()
    assert code == (0 if check == "gpus" else 1), out
    if check == "gpus":
        assert f"{reason}; {FOLLOWED}" in out.out


def test_fails_when_expect_tp_does_not_match(
    cli: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.setenv("NVIDIA_VISIBLE_DEVICES", "0,1")
    cli.setenv(FAKE_ENV, "dgx-a100")
    _affinity(cli, frozenset(range(24)))
    assert main(["preflight", "--annotations", str(tmp_path / "none"), "--expect-tp", "4"]) == 1
    out = capsys.readouterr()
    assert "note: " in out.out and "not found" in out.out
    assert "tp-size: 2 GPUs visible, --expect-tp 4" in out.err


def test_quiet_prints_only_the_numactl_prefix(
    cli: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli.setenv("NVIDIA_VISIBLE_DEVICES", "0,1")
    cli.setenv(FAKE_ENV, "pcie-2socket")
    _affinity(cli, SOCKET0_L40S)
    ann = _annotations(tmp_path, gpus="0,1", level="pcie-switch")
    assert main(["preflight", "--annotations", str(ann), "--allow-pcie", "--quiet"]) == 0
    assert capsys.readouterr().out == "numactl --cpunodebind=0 --membind=0\n"


def test_cannot_check_without_nvml_is_exit_2(
    cli: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import extender.commands.agent as commands
    from extender.topology.nvml import NvmlUnavailable

    def no_nvml() -> None:
        raise NvmlUnavailable("NVML Shared Library Not Found")

    cli.setattr(commands, "PynvmlBackend", no_nvml)
    assert main(["preflight", "--annotations", "missing"]) == 2
    assert (
        "cannot check: cannot read the GPUs through NVML: NVML Shared Library Not Found"
        in capsys.readouterr().err
    )


def test_an_unknown_fake_is_refused(cli: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cli.setenv(FAKE_ENV, "dgx-z900")
    assert main(["preflight", "--annotations", "missing"]) == 2
    assert "unknown NVML fake 'dgx-z900'" in capsys.readouterr().err


# --- the pieces ------------------------------------------------------------------------


def test_parse_annotations_reads_go_quoted_values() -> None:
    text = 'gangslice.io/gpus="0,1"\nnote="say \\"hi\\"\\n"\nempty=""\n\n'
    assert parse_annotations(text) == {"gangslice.io/gpus": "0,1", "note": 'say "hi"\n', "empty": ""}
    with pytest.raises(PreflightError, match="line 1"):
        parse_annotations("no equals sign here")


def test_promise_rejects_an_unreadable_gpu_list() -> None:
    with pytest.raises(PreflightError, match=r"gangslice\.io/gpus"):
        Promise.from_annotations({"gangslice.io/gpus": "0,one"})
    assert Promise.from_annotations({"gangslice.io/gpus": " 3, 1 ,2"}).gpus == (1, 2, 3)


@pytest.mark.parametrize(
    ("allow", "level", "tier"),
    [
        (False, "pcie", Tier.NVLINK),
        (True, None, Tier.PXB),
        (True, "pcie-switch", Tier.PIX),
        (True, "rack", Tier.PXB),
    ],
)
def test_the_allowed_pair_tier(allow: bool, level: str | None, tier: Tier) -> None:
    assert Promise(level=level).allowed_tier(allow) is tier


def test_visible_by_host_indices_when_nvml_sees_the_node(hgx: GpuGraph) -> None:
    v = visible_gpus(hgx, {"NVIDIA_VISIBLE_DEVICES": "6,7"})
    assert (v.gpus, v.host) == ((6, 7), (6, 7))


def test_visible_in_a_container_view_maps_nvml_order_to_host_indices(hgx: GpuGraph) -> None:
    two = GpuGraph(gpus=hgx.gpus[:2], links={(0, 1): hgx.link(0, 1)})  # NVML sees only 2 GPUs
    v = visible_gpus(two, {"NVIDIA_VISIBLE_DEVICES": "7,5"})
    assert (v.gpus, v.host) == ((0, 1), (5, 7))
    assert v.name(1) == "GPU7"


def test_visible_by_uuid_and_narrowed_by_cuda_visible_devices(hgx: GpuGraph) -> None:
    uuids = [hgx.gpu(i).uuid or "" for i in range(8)]
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids[2:6]), "CUDA_VISIBLE_DEVICES": f"1,{uuids[5][4:]}"}
    v = visible_gpus(hgx, env)
    assert (v.gpus, v.host) == ((3, 5), (3, 5))


def test_uuids_in_a_container_view_leave_host_indices_unknown(hgx: GpuGraph) -> None:
    uuids = ",".join(hgx.gpu(i).uuid or "" for i in range(8))
    v = visible_gpus(hgx, {"NVIDIA_VISIBLE_DEVICES": uuids})
    assert v.host is None
    report = run_checks(hgx, v, Promise(gpus=tuple(range(8))), cpus=SOCKET0_H100)
    assert report.checks[0].ok and "host indices not visible here" in report.checks[0].detail
    short = run_checks(hgx, v, Promise(gpus=(0, 1)), cpus=SOCKET0_H100)
    assert not short.ok and short.reason == "gpus: 8 GPUs visible, 2 promised (0,1)"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NVIDIA_VISIBLE_DEVICES": "9"}, "lists GPU 9, which NVML does not see"),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-nope"}, "matches no visible GPUs"),
        ({"NVIDIA_VISIBLE_DEVICES": "0,GPU-nope"}, "mixes indices and UUIDs"),
        ({"NVIDIA_VISIBLE_DEVICES": "MIG-1234"}, "MIG device"),
        ({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2"}, "ordinal 2 is past the 2 GPUs"),
    ],
)
def test_unreadable_visibility_is_an_error(hgx: GpuGraph, env: dict[str, str], message: str) -> None:
    with pytest.raises(PreflightError, match=message):
        visible_gpus(hgx, env)


def test_no_visible_gpus_fails(hgx: GpuGraph) -> None:
    v = visible_gpus(hgx, {"NVIDIA_VISIBLE_DEVICES": "none"})
    report = run_checks(hgx, v, Promise(), cpus=SOCKET0_H100)
    assert not report.ok and report.reason == "gpus: no GPUs visible to this process"


def test_cpus_spilling_over_to_another_node_pass_with_a_hint(hgx: GpuGraph) -> None:
    report = run_checks(hgx, Visible((0, 1), (0, 1), "test"), Promise(), cpus=frozenset(range(104)))
    assert report.ok
    numa = next(c for c in report.checks if c.name == "numa")
    assert "may also run on CPUs 52-103" in numa.detail


def test_a_nic_on_another_numa_node_fails(pcie: GpuGraph) -> None:
    from dataclasses import replace

    nics = tuple(replace(n, numa_node=1 - (n.numa_node or 0)) for n in pcie.nics)  # swap the NICs' sockets
    swapped = replace(pcie, nics=nics)
    report = run_checks(
        swapped, Visible((0, 1), (0, 1), "test"), Promise(), cpus=SOCKET0_L40S, allow_pcie=True
    )
    assert not report.ok
    assert report.reason == "nic: nearest NIC mlx5_0 of GPU0 is on NUMA node 1, the GPU on 0"


def test_a_pair_of_pix_gpus_passes_with_allow_pcie_and_fails_without(pcie: GpuGraph) -> None:
    v = Visible((0, 1), (0, 1), "test")
    assert run_checks(pcie, v, Promise(), cpus=SOCKET0_L40S, allow_pcie=True).ok
    strict = run_checks(pcie, v, Promise(), cpus=SOCKET0_L40S)
    assert strict.reason == "tp-links: tensor-parallel pair GPU0-GPU1 is PIX, needs NVLink (NV#)"


# --- promised UUIDs ------------------------------------------------------------------------


def _container_view(graph: GpuGraph, host: tuple[int, ...]) -> GpuGraph:
    """What NVML shows inside a container given these host GPUs: only them, numbered from 0."""
    return GpuGraph(
        gpus=tuple(dataclasses.replace(graph.gpu(h), index=i) for i, h in enumerate(host)),
        links={
            (i, j): graph.link(host[i], host[j]) for i in range(len(host)) for j in range(i + 1, len(host))
        },
    )


def test_a_swap_within_one_numa_node_is_caught_by_uuid(hgx: GpuGraph) -> None:
    """Promised GPUs 0,1 of NUMA node 0, the kubelet gave 2,3 of the same node: the count, the
    links and the NUMA node all match, only the UUIDs tell."""
    inside = _container_view(hgx, (2, 3))
    visible = visible_gpus(inside, {})
    assert visible.host is None
    promised = hgx.uuids((0, 1))
    assert promised is not None
    ann = {
        "gangslice.io/gpus": "0,1",
        "gangslice.io/numa-node": "0",
        "gangslice.io/gpu-uuids": ",".join(promised),
    }
    followed = run_checks(inside, visible, Promise.from_annotations(ann), cpus=SOCKET0_H100)
    assert followed.ok and FOLLOWED in next(c for c in followed.checks if c.name == "gpu-uuids").detail
    report = run_checks(inside, visible, Promise.from_annotations(ann), cpus=SOCKET0_H100, strict_gpus=True)
    failed = [c for c in report.checks if not c.ok]
    assert [c.name for c in failed] == ["gpu-uuids"]
    given = hgx.uuids((2, 3))
    assert given is not None
    assert report.reason == (
        f"gpu-uuids: visible GPUs {', '.join(sorted(u.lower() for u in given))} differ from the promised "
        f"{', '.join(sorted(u.lower() for u in promised))} (gangslice.io/gpu-uuids)"
    )


def test_the_promised_uuids_pass_in_any_order_and_case(hgx: GpuGraph) -> None:
    inside = _container_view(hgx, (4, 5))
    uuids = hgx.uuids((5, 4))
    assert uuids is not None
    promise = Promise.from_annotations({"gangslice.io/gpu-uuids": ",".join(u.upper() for u in uuids)})
    report = run_checks(inside, visible_gpus(inside, {}), promise, cpus=SOCKET1_H100)
    check = next(c for c in report.checks if c.name == "gpu-uuids")
    assert check.ok and check.detail == "2 GPU UUIDs as promised"


def test_the_command_exits_1_naming_both_uuid_sets(
    cli: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], hgx: GpuGraph
) -> None:
    given, promised = hgx.uuids((4, 5, 6, 7)), hgx.uuids((4, 5, 6, 3))
    assert given is not None and promised is not None
    cli.setenv("NVIDIA_VISIBLE_DEVICES", ",".join(given))
    cli.setenv(FAKE_ENV, "hgx-h100")
    _affinity(cli, frozenset(range(60, 68)))
    ann = _annotations(tmp_path, uuids=",".join(promised))

    assert main(["preflight", "--annotations", str(ann), "--strict-gpus"]) == 1
    err = capsys.readouterr().err
    assert "FAIL: gpu-uuids: visible GPUs" in err
    assert all(u.lower() in err for u in {*given, *promised})


def test_a_graph_without_uuids_has_none_to_give() -> None:
    graph = GpuGraph(gpus=(Gpu(index=0, uuid="GPU-a"), Gpu(index=1)), links={(0, 1): Link(nvlinks=4)})
    assert graph.uuids([0]) == ("GPU-a",)
    assert graph.uuids([0, 1]) is None


@pytest.mark.parametrize("raw", ["", "0,1", "GPU-", "MIG-1234"])
def test_an_unreadable_uuid_annotation_is_bad_input(raw: str) -> None:
    with pytest.raises(PreflightError, match=re.escape("gangslice.io/gpu-uuids")):
        Promise.from_annotations({"gangslice.io/gpu-uuids": raw})
