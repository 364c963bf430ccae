"""NVML discovery against the fake backend, and the pynvml backend without a driver."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
from pathlib import Path
from typing import Any

import pytest

from extender.topology.fake_nvml import SYS, FakeGpu, FakeLink, FakeNvml
from extender.topology.model import FabricClique, Gpu, GpuGraph, Link, PcieLevel, Tier, TopologyError
from extender.topology.nvidia_smi import parse_topo
from extender.topology.nvml import (
    NVML_SUCCESS,
    FabricInfo,
    FabricState,
    HealthCounters,
    HealthThresholds,
    NvmlBackend,
    NvmlError,
    NvmlInvalidArgument,
    NvmlNotSupported,
    NvmlUnavailable,
    PynvmlBackend,
    RemoteDevice,
    discover,
    fabric_clique,
    health_counters,
    health_from_rates,
    normalize_bus_id,
    pcie_level,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi-topo"
CLUSTER = bytes.fromhex("7b968a6dc8aa45e19e07e1e51be99c31")
PAIRS_8 = list(itertools.combinations(range(8), 2))


def _parse_fixture(name: str) -> GpuGraph:
    path = FIXTURES / name
    assert path.exists(), f"fixture {name} missing: it belongs in tests/fixtures/nvidia-smi-topo"
    return parse_topo(path.read_text(), source=name)


def _naive_nvlink_pairs(backend: NvmlBackend) -> int:
    """go-gpuallocator's rule: a link counts only if its remote bus id is the peer GPU's."""
    n = backend.device_count()
    buses = [normalize_bus_id(backend.pci_bus_id(i)) for i in range(n)]
    remotes: list[list[str]] = []
    for i in range(n):
        seen = []
        for link in itertools.count():
            try:
                backend.nvlink_state(i, link)
            except (NvmlNotSupported, NvmlInvalidArgument):
                break
            seen.append(normalize_bus_id(backend.nvlink_remote_pci_bus_id(i, link)))
        remotes.append(seen)
    return sum(1 for a, b in itertools.combinations(range(n), 2) if buses[b] in remotes[a])


# --- NVSwitch boxes --------------------------------------------------------------------


def test_hgx_h100_every_pair_is_nv18() -> None:
    graph = discover(FakeNvml.hgx_h100())
    assert {graph.link(a, b).cell for a, b in PAIRS_8} == {"NV18"}
    assert graph.shape.nvlink_islands == (frozenset(range(8)),)
    assert graph.model == "NVIDIA H100 80GB HBM3"
    assert graph.nvlink_gbps == 50.0


def test_hgx_h100_numa_cpus_and_pcie_levels() -> None:
    graph = discover(FakeNvml.hgx_h100())
    assert [g.numa_node for g in graph.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert graph.gpu(0).cpu_affinity == frozenset(range(52))
    assert graph.gpu(7).cpu_affinity == frozenset(range(52, 104))
    assert graph.link(0, 3).pcie is PcieLevel.NODE
    assert graph.link(3, 4).pcie is PcieLevel.SYS
    assert graph.gpu(0).pci_bus_id == "0000:18:00.0"
    assert (graph.gpu(0).uuid or "").startswith("GPU-")


def test_naive_bus_id_matching_finds_no_nvlink_but_we_find_28_pairs() -> None:
    fake = FakeNvml.hgx_h100()
    assert _naive_nvlink_pairs(fake) == 0
    graph = discover(fake)
    assert sum(1 for a, b in PAIRS_8 if graph.link(a, b).nvlinks) == 28


def test_hgx_h100_matches_the_nvidia_smi_fixture() -> None:
    parsed = _parse_fixture("h100-8gpu-nv18-2numa-compact.txt")
    graph = discover(FakeNvml.hgx_h100())
    assert [graph.link(a, b).cell for a, b in PAIRS_8] == [parsed.link(a, b).cell for a, b in PAIRS_8]
    assert [g.numa_node for g in graph.gpus] == [g.numa_node for g in parsed.gpus]
    assert [g.cpu_affinity for g in graph.gpus] == [g.cpu_affinity for g in parsed.gpus]
    assert graph.shape.nvlink_islands == parsed.shape.nvlink_islands


def test_dgx_a100_is_nv12_and_matches_the_fixture() -> None:
    graph = discover(FakeNvml.dgx_a100())
    assert {graph.link(a, b).cell for a, b in PAIRS_8} == {"NV12"}
    assert graph.link(0, 1).pcie is PcieLevel.PXB
    parsed = _parse_fixture("a100-8gpu-nv12-2numa-compact.txt")
    assert [graph.link(a, b).cell for a, b in PAIRS_8] == [parsed.link(a, b).cell for a, b in PAIRS_8]
    assert [g.numa_node for g in graph.gpus] == [g.numa_node for g in parsed.gpus]
    assert [g.cpu_affinity for g in graph.gpus] == [g.cpu_affinity for g in parsed.gpus]


def _gpu(index: int, bus: int, links: list[FakeLink]) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-{index}", bus_id=f"00000000:{bus:02X}:00.0", name="test", links=links)


def test_switch_links_count_only_within_one_switch_fabric() -> None:
    board_a = [FakeLink(RemoteDevice.SWITCH, "00000000:05:00.0")] * 6
    board_b = [FakeLink(RemoteDevice.SWITCH, "00000000:06:00.0")] * 4
    gpus = [_gpu(0, 0x10, board_a), _gpu(1, 0x11, board_a), _gpu(2, 0x12, board_b), _gpu(3, 0x13, board_b)]
    graph = discover(FakeNvml(gpus, {p: SYS for p in itertools.combinations(range(4), 2)}))
    assert graph.link(0, 1).nvlinks == 6
    assert graph.link(2, 3).nvlinks == 4
    assert graph.link(0, 2).nvlinks == 0


def test_direct_links_disabled_links_and_min_of_switch_links() -> None:
    to_1 = FakeLink(RemoteDevice.GPU, "00000000:11:00.0")
    to_0 = FakeLink(RemoteDevice.GPU, "00000000:10:00.0")
    switch = FakeLink(RemoteDevice.SWITCH, "00000000:05:00.0")
    down = FakeLink(RemoteDevice.SWITCH, "00000000:05:00.0", enabled=False)
    gpus = [_gpu(0, 0x10, [to_1, to_1, switch, switch, switch]), _gpu(1, 0x11, [to_0, to_0, switch, down])]
    graph = discover(FakeNvml(gpus, {(0, 1): 30}))
    assert graph.link(0, 1) == Link(nvlinks=2 + 1, pcie=PcieLevel.PHB)


# --- PCIe-only -------------------------------------------------------------------------


def test_pcie_2socket_levels() -> None:
    graph = discover(FakeNvml.pcie_2socket())
    assert all(graph.link(a, b).nvlinks == 0 for a, b in PAIRS_8)
    assert [graph.link(a, a + 1).pcie for a in (0, 2, 4, 6)] == [PcieLevel.PIX] * 4
    assert graph.link(0, 2).pcie is PcieLevel.NODE
    assert graph.link(5, 7).pcie is PcieLevel.NODE
    assert graph.link(1, 4).pcie is PcieLevel.SYS
    assert graph.shape.nvlink_islands == ()
    assert graph.shape.pcie_switch_groups == tuple(frozenset({a, a + 1}) for a in (0, 2, 4, 6))
    assert graph.pair_tier(0, 3) is Tier.NUMA


# --- sysfs: NUMA and NICs --------------------------------------------------------------


def test_numa_comes_from_sysfs_and_minus_one_means_none(tmp_path: Path) -> None:
    fake = FakeNvml.hgx_h100()
    fake.write_sysfs(tmp_path)
    devices = tmp_path / "bus" / "pci" / "devices"
    (devices / "0000:18:00.0" / "numa_node").write_text("1\n")  # NVML memory affinity says 0
    (devices / "0000:2a:00.0" / "numa_node").write_text("-1\n")
    (devices / "0000:3a:00.0" / "numa_node").unlink()  # falls back to memory affinity
    graph = discover(fake, sysfs_root=tmp_path)
    assert [g.numa_node for g in graph.gpus] == [1, None, 0, 0, 1, 1, 1, 1]


def test_no_sysfs_tree_means_memory_affinity_and_no_nics(tmp_path: Path) -> None:
    graph = discover(FakeNvml.hgx_h100(), sysfs_root=tmp_path / "absent")
    assert [g.numa_node for g in graph.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert graph.nics == ()


def test_nics_hgx_h100_one_pix_nic_per_gpu(tmp_path: Path) -> None:
    graph = discover(FakeNvml.hgx_h100(), sysfs_root=FakeNvml.hgx_h100().write_sysfs(tmp_path))
    assert [n.name for n in graph.nics] == [f"mlx5_{i}" for i in range(8)]
    nic0 = graph.nics[0]
    assert nic0.numa_node == 0
    assert nic0.gpu_links[0] is PcieLevel.PIX
    assert nic0.gpu_links[1] is PcieLevel.NODE
    assert nic0.gpu_links[4] is PcieLevel.SYS
    assert graph.shape.best_nic == {i: f"mlx5_{i}" for i in range(8)}


def test_nics_dgx_a100_pxb_to_their_gpu_pair(tmp_path: Path) -> None:
    graph = discover(FakeNvml.dgx_a100(), sysfs_root=FakeNvml.dgx_a100().write_sysfs(tmp_path))
    links = {n.name: n.gpu_links for n in graph.nics}
    assert links["mlx5_0"][0] is PcieLevel.PXB and links["mlx5_1"][1] is PcieLevel.PXB
    assert links["mlx5_0"][2] is PcieLevel.NODE
    assert links["mlx5_7"][0] is PcieLevel.SYS


def test_nics_sort_naturally_and_software_devices_are_skipped(tmp_path: Path) -> None:
    fake = FakeNvml.pcie_2socket()
    fake.write_sysfs(tmp_path)
    (tmp_path / "class" / "infiniband" / "rxe0").mkdir()  # no PCI device behind it
    graph = discover(fake, sysfs_root=tmp_path)
    assert [n.name for n in graph.nics] == ["mlx5_0", "mlx5_1"]
    assert graph.nics[0].gpu_links[0] is PcieLevel.NODE
    assert graph.nics[0].gpu_links[7] is PcieLevel.SYS


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        (
            ("pci0000:15", "0000:15:01.0", "0000:16:00.0"),
            ("pci0000:15", "0000:15:02.0", "0000:17:00.0"),
            "PHB",
        ),
        (
            ("pci0000:15", "0000:15:01.0", "0000:16:00.0"),
            ("pci0000:15", "0000:15:01.0", "0000:16:00.1"),
            "PIX",
        ),
        (
            ("pci0000:15", "0000:15:01.0", "0000:16:00.0"),
            ("pci0000:95", "0000:95:01.0", "0000:96:00.0"),
            "NODE",
        ),
    ],
)
def test_pcie_level_of_two_paths(a: tuple[str, ...], b: tuple[str, ...], level: str) -> None:
    assert pcie_level(a, b, 0, 0) is PcieLevel[level]


def test_bus_ids_normalise_to_sysfs_form() -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("00000009:01:00.0") == "0009:01:00.0"
    assert normalize_bus_id("0000:18:00.1\x00") == "0000:18:00.1"
    with pytest.raises(TopologyError, match="unrecognised PCI bus id"):
        normalize_bus_id("GPU-0")


# --- fabric clique ---------------------------------------------------------------------


def test_gb200_tray_has_its_clique() -> None:
    graph = discover(FakeNvml.gb200_tray(CLUSTER, 3))
    assert graph.clique == FabricClique("7b968a6d-c8aa-45e1-9e07-e1e51be99c31", 3)
    assert graph.clique.label == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.3"
    assert {graph.link(a, b).cell for a, b in itertools.combinations(range(4), 2)} == {"NV18"}
    assert graph.nvlink_gbps == 100.0


def test_clique_uuid_with_nul_bytes_is_kept_whole() -> None:
    raw = bytes([0x00, 0x11]) + bytes(13) + b"\x01"
    graph = discover(FakeNvml.gb200_tray(raw, 0))
    assert graph.clique is not None and graph.clique.cluster_uuid == "00110000-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    "change",
    [
        {"cluster_uuid": bytes.fromhex("11" * 16)},
        {"clique_id": 4},
        {"state": FabricState.IN_PROGRESS},
        {"status": 3},
    ],
    ids=["other-uuid", "other-clique", "in-progress", "failed-status"],
)
def test_one_disagreeing_or_unfinished_gpu_means_no_clique(change: dict[str, Any]) -> None:
    fake = FakeNvml.gb200_tray(CLUSTER, 3)
    base = fake.gpus[2].fabric
    assert base is not None
    fake.gpus[2].fabric = FabricInfo(**{**_fields(base), **change})
    assert discover(fake).clique is None


def _fields(info: FabricInfo) -> dict[str, Any]:
    return {k: getattr(info, k) for k in ("cluster_uuid", "clique_id", "state", "status", "health_mask")}


def test_zero_uuid_or_unsupported_fabric_means_no_clique() -> None:
    assert discover(FakeNvml.gb200_tray(bytes(16), 3)).clique is None
    assert discover(FakeNvml.gb200_tray(CLUSTER, 3, state=FabricState.NOT_STARTED)).clique is None
    assert discover(FakeNvml.hgx_h100()).clique is None
    assert fabric_clique([]) is None


def test_fabric_not_supported_degrades_to_no_clique() -> None:
    fake = FakeNvml.gb200_tray(CLUSTER, 3)
    fake.fail["fabric_info"] = NvmlNotSupported
    graph = discover(fake)
    assert graph.clique is None
    assert graph.link(0, 1).nvlinks == 18


def test_fabric_uuid_of_wrong_length_is_an_error() -> None:
    fake = FakeNvml.gb200_tray(CLUSTER, 3)
    fake.gpus[0].fabric = FabricInfo(bytes(80), 3, FabricState.COMPLETED, NVML_SUCCESS)
    with pytest.raises(TopologyError, match="80-byte cluster UUID"):
        discover(fake)


# --- injected errors -------------------------------------------------------------------


def test_optional_calls_not_supported_degrade_gracefully() -> None:
    fake = FakeNvml.hgx_h100()
    fake.fail.update(
        {
            "name": NvmlNotSupported,
            "cpu_affinity": NvmlNotSupported,
            "memory_affinity": NvmlNotSupported,
            "nvlink_remote_device_type": NvmlNotSupported,
            ("topology_common_ancestor", 5): NvmlNotSupported,
        }
    )
    graph = discover(fake)
    assert graph.gpu(0).name is None and graph.model is None
    assert graph.gpu(0).cpu_affinity == frozenset()
    assert graph.gpu(0).numa_node is None
    assert graph.link(0, 5) == Link(nvlinks=0, pcie=None)
    assert graph.link(0, 1).pcie is PcieLevel.NODE
    # Without the remote type, links into switches cannot be told from links to GPUs.
    assert graph.link(0, 1).nvlinks == 0


def test_nvlink_not_supported_means_no_nvlink() -> None:
    fake = FakeNvml.hgx_h100()
    fake.fail["nvlink_state"] = NvmlNotSupported
    graph = discover(fake)
    assert graph.link(0, 1) == Link(nvlinks=0, pcie=PcieLevel.NODE)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("device_count", r"NVML device_count\(\) failed: NvmlError"),
        ("uuid", r"NVML uuid\(GPU2\) failed: GPU is lost"),
        ("pci_bus_id", r"NVML pci_bus_id\(GPU2\) failed"),
        ("nvlink_state", r"NVML nvlink_state\(GPU2, link 0\) failed"),
        ("nvlink_remote_pci_bus_id", r"nvlink_remote_pci_bus_id\(GPU2, link 0\)"),
        ("topology_common_ancestor", r"topology_common_ancestor\(GPU\d, GPU\d\)"),
        ("fabric_info", r"fabric_info\(GPU2\)"),
    ],
)
def test_other_errors_raise_topology_error_naming_the_call(call: str, message: str) -> None:
    fake = FakeNvml.hgx_h100()
    fake.fail[call if call == "device_count" else (call, 2)] = (
        NvmlError if call == "device_count" else NvmlError("GPU is lost")
    )
    with pytest.raises(TopologyError, match=message):
        discover(fake)


def test_nvml_unavailable_passes_through() -> None:
    fake = FakeNvml.hgx_h100()
    fake.fail["device_count"] = NvmlUnavailable("driver not loaded")
    with pytest.raises(NvmlUnavailable, match="driver not loaded"):
        discover(fake)


def test_fail_rejects_unknown_call_names() -> None:
    with pytest.raises(ValueError, match="unknown NVML call 'fabric'"):
        FakeNvml([], {}, fail={"fabric": NvmlNotSupported})


def test_link_iteration_stops_where_nvml_says_so() -> None:
    """Links are counted until INVALID_ARGUMENT, not up to a hard-coded 18."""
    links = [FakeLink(RemoteDevice.SWITCH, "00000000:05:00.0")] * 36
    gpus = [_gpu(0, 0x10, links), _gpu(1, 0x11, links)]
    assert discover(FakeNvml(gpus, {(0, 1): SYS})).link(0, 1).nvlinks == 36


# --- from_graph ------------------------------------------------------------------------


def test_from_graph_round_trips() -> None:
    gpus = tuple(Gpu(index=i, numa_node=i // 2, cpu_affinity=frozenset({i})) for i in range(4))
    links = {
        (0, 1): Link(nvlinks=2, pcie=PcieLevel.PIX),
        (0, 2): Link(nvlinks=1, pcie=PcieLevel.NODE),
        (0, 3): Link(pcie=PcieLevel.SYS),
        (1, 2): Link(pcie=PcieLevel.SYS),
        (1, 3): Link(nvlinks=1, pcie=PcieLevel.SYS),
        (2, 3): Link(nvlinks=2, pcie=PcieLevel.PIX),
    }
    graph = GpuGraph(gpus=gpus, links=links, clique=FabricClique("7b968a6d-c8aa-45e1-9e07-e1e51be99c31", 7))
    found = discover(FakeNvml.from_graph(graph))
    assert dict(found.links) == links
    assert [(g.numa_node, g.cpu_affinity) for g in found.gpus] == [
        (g.numa_node, g.cpu_affinity) for g in gpus
    ]
    assert found.clique == graph.clique


def test_from_graph_of_a_parsed_fixture() -> None:
    parsed = _parse_fixture("h100-8gpu-nv18-2numa-ht-affinity.txt")
    found = discover(FakeNvml.from_graph(parsed))
    pairs = list(itertools.combinations(parsed.indices, 2))
    assert [found.link(a, b).cell for a, b in pairs] == [parsed.link(a, b).cell for a, b in pairs]
    assert [g.cpu_affinity for g in found.gpus] == [g.cpu_affinity for g in parsed.gpus]


# --- health ----------------------------------------------------------------------------


def test_health_counters_sum_links_and_split_by_kind() -> None:
    fake = FakeNvml.hgx_h100()
    fake.add_errors(1, crc=5, replay=2, recovery=1, pcie_replays=9, link=0)
    fake.add_errors(1, crc=3, link=17)
    sample = health_counters(fake)
    assert sample[1] == HealthCounters(
        nvlink_crc_flit_errors=8,
        nvlink_replay_errors=2,
        nvlink_recovery_errors=1,
        pcie_replays=9,
        links=((0, 5, 0, 2, 1), (17, 3, 0, 0, 0)),  # (link, CRC flit, CRC data, replay, recovery)
    )
    assert sample[0] == HealthCounters()


def test_health_rates_mark_a_gpu_over_threshold_unhealthy() -> None:
    fake = FakeNvml.hgx_h100()
    fake.add_errors(3, crc=1_000, pcie_replays=1_000)  # history before the first sample
    before = health_counters(fake)
    fake.add_errors(3, crc=50)  # 5/s over 10 s
    fake.add_errors(4, crc=5, pcie_replays=90)  # 0.5/s and 9/s: below both thresholds
    fake.add_errors(5, pcie_replays=200)  # 20/s
    health = health_from_rates(before, health_counters(fake), 10.0)
    assert not health[3].healthy
    assert health[3].reason == "nvlink_crc_errors at 5.0/s (threshold 1/s); most on NVLink 0"
    assert health[3].nvlink_errors_per_s == pytest.approx(5.0)
    assert health[4].healthy and health[4].reason is None
    assert health[4].pcie_replays_per_s == pytest.approx(9.0)
    assert not health[5].healthy
    assert health[5].reason is not None and "pcie_replays at 20.0/s" in health[5].reason
    assert health[0].healthy


def test_health_thresholds_are_configurable() -> None:
    fake = FakeNvml.pcie_2socket()
    before = health_counters(fake)
    fake.add_errors(0, pcie_replays=30)
    after = health_counters(fake)
    assert health_from_rates(before, after, 10.0)[0].healthy
    strict = health_from_rates(before, after, 10.0, HealthThresholds(pcie_replays_per_s=1.0))
    assert not strict[0].healthy


def test_health_counter_reset_and_missing_baseline() -> None:
    prev = {0: HealthCounters(nvlink_replay_errors=500)}
    curr = {0: HealthCounters(nvlink_replay_errors=20), 1: HealthCounters(nvlink_replay_errors=10**6)}
    health = health_from_rates(prev, curr, 10.0)
    assert not health[0].healthy and "nvlink_replay_errors at 2.0/s" in (health[0].reason or "")
    assert health[1].healthy
    with pytest.raises(ValueError, match="apart in time"):
        health_from_rates(prev, curr, 0.0)


def test_unreadable_counters_make_the_gpu_unhealthy() -> None:
    fake = FakeNvml.hgx_h100()
    before = health_counters(fake)
    fake.fail[("pcie_replay_counter", 6)] = NvmlError("GPU is lost")
    fake.fail[("nvlink_error_counter", 2)] = NvmlNotSupported
    after = health_counters(fake)
    assert after[2] == HealthCounters()
    health = health_from_rates(before, after, 1.0)
    assert not health[6].healthy
    assert health[6].reason == "NVML pcie_replay_counter(GPU6) failed: GPU is lost"


# --- the real backend ------------------------------------------------------------------


def test_pynvml_backend_without_a_driver_raises_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with pytest.raises(NvmlUnavailable, match="NVIDIA driver") as info:
        PynvmlBackend()
    assert isinstance(info.value, RuntimeError)


@pytest.fixture
def pynvml_stubbed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """pynvml with init and a few calls replaced, so the backend runs without a driver."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: ("handle", index))
    return pynvml


def test_pynvml_driver_not_loaded_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        PynvmlBackend()


def test_pynvml_errors_translate(pynvml_stubbed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    nv = pynvml_stubbed

    def raises(code: int) -> Any:
        def call(*_: Any) -> None:
            raise nv.NVMLError(code)

        return call

    monkeypatch.setattr(nv, "nvmlDeviceGetNvLinkState", raises(nv.NVML_ERROR_INVALID_ARGUMENT))
    monkeypatch.setattr(nv, "nvmlDeviceGetPcieReplayCounter", raises(nv.NVML_ERROR_NOT_SUPPORTED))
    monkeypatch.setattr(nv, "nvmlDeviceGetCpuAffinity", raises(nv.NVML_ERROR_FUNCTION_NOT_FOUND))
    monkeypatch.setattr(nv, "nvmlDeviceGetUUID", raises(nv.NVML_ERROR_GPU_IS_LOST))
    with PynvmlBackend() as backend:
        with pytest.raises(NvmlInvalidArgument):
            backend.nvlink_state(0, 40)
        with pytest.raises(NvmlNotSupported):
            backend.pcie_replay_counter(0)
        with pytest.raises(NvmlNotSupported):
            backend.cpu_affinity(0)
        with pytest.raises(NvmlError, match="GPU is lost") as lost:
            backend.uuid(0)
        assert type(lost.value) is NvmlError


def test_pynvml_fabric_info_reads_the_raw_uuid(pynvml_stubbed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = b"\x00\xab" + bytes(13) + b"\x01"

    def fill(handle: Any, ref: Any) -> int:
        info = ref._obj
        ctypes.memmove(ctypes.addressof(info) + type(info).clusterUuid.offset, raw, 16)
        info.cliqueId, info.state, info.status = 5, FabricState.COMPLETED, NVML_SUCCESS
        return 0

    monkeypatch.setattr(pynvml_stubbed, "nvmlDeviceGetGpuFabricInfoV", fill)
    with PynvmlBackend() as backend:
        info = backend.fabric_info(0)
    assert info.cluster_uuid == raw
    assert (info.clique_id, info.state, info.status) == (5, FabricState.COMPLETED, NVML_SUCCESS)


def test_a_backend_that_never_ends_its_links_is_an_error() -> None:
    links = [FakeLink(RemoteDevice.SWITCH, "00000000:05:00.0")] * 2000
    with pytest.raises(TopologyError, match="never reported the last"):
        discover(FakeNvml([_gpu(0, 0x10, links)], {}))


def test_the_reason_names_the_link_whose_errors_grew_most() -> None:
    fake = FakeNvml.hgx_h100()
    before = health_counters(fake)
    fake.add_errors(2, crc=20, link=3)
    fake.add_errors(2, crc=40, link=11)
    health = health_from_rates(before, health_counters(fake), 10.0)
    assert health[2].reason == "nvlink_crc_errors at 6.0/s (threshold 1/s); most on NVLink 11"
