"""Parsing and rendering ``nvidia-smi topo -m`` text."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.topology.model import Gpu, GpuGraph, Link, Nic, PcieLevel, TopologyError
from extender.topology.nvidia_smi import parse_topo, render_topo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi-topo"

PIX, PXB, PHB, NODE, SYS = (PcieLevel.PIX, PcieLevel.PXB, PcieLevel.PHB, PcieLevel.NODE, PcieLevel.SYS)


def fixture_text(name: str) -> str:
    path = FIXTURES / name
    assert path.is_file(), f"{path}: the fixture is missing from tests/fixtures/nvidia-smi-topo"
    return path.read_text()


def cpus(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(c for low, high in ranges for c in range(low, high + 1))


# --- every shipped fixture, against what the file says (read by hand) --------------------


@dataclass(frozen=True)
class Expected:
    file: str
    gpus: int
    islands: tuple[frozenset[int], ...]
    numa: tuple[int | None, ...]
    cpu: dict[int, frozenset[int]]
    links: dict[tuple[int, int], Link]
    nic_names: tuple[str, ...] = ()
    nic_links: dict[str, dict[int, PcieLevel]] = field(default_factory=dict)
    nic_numa: dict[str, int | None] = field(default_factory=dict)


ALL8 = (frozenset(range(8)),)
NV12, NV18 = Link(nvlinks=12), Link(nvlinks=18)

EXPECTED = [
    Expected(
        file="a10-4gpu-pcie-sys-2nic.txt",
        gpus=4,
        islands=(),
        numa=(0, 0, 0, 0),
        cpu={0: cpus((0, 127)), 3: cpus((0, 127))},
        links={(0, 1): Link(pcie=SYS), (2, 3): Link(pcie=SYS)},
        nic_names=("mlx5_0", "mlx5_1"),
        nic_links={"mlx5_0": {0: SYS, 1: SYS, 2: SYS, 3: SYS}},
        nic_numa={"mlx5_0": None, "mlx5_1": None},
    ),
    Expected(
        file="a100-8gpu-nv12-17nic-nic-legend.txt",
        gpus=8,
        islands=ALL8,
        numa=(0,) * 8,
        cpu={0: cpus((0, 103)), 7: cpus((0, 103))},
        links={(0, 1): NV12, (3, 4): NV12, (0, 7): NV12},
        nic_names=(*(f"mlx5_{m}" for m in range(2, 18)), "mlx5_bond_0"),
        nic_links={
            "mlx5_2": {0: PXB, 1: PXB, 2: SYS, 3: SYS, 4: SYS, 5: SYS, 6: SYS, 7: SYS},
            "mlx5_6": {0: SYS, 1: SYS, 2: PXB, 3: PXB, 4: SYS, 5: SYS, 6: SYS, 7: SYS},
            "mlx5_17": {0: SYS, 1: SYS, 2: SYS, 3: SYS, 4: SYS, 5: SYS, 6: PXB, 7: PXB},
            "mlx5_bond_0": dict.fromkeys(range(8), SYS),
        },
        nic_numa={"mlx5_2": 0, "mlx5_bond_0": None},
    ),
    Expected(
        file="a100-8gpu-nv12-2numa-compact.txt",
        gpus=8,
        islands=ALL8,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpu={0: cpus((0, 23)), 4: cpus((24, 47))},
        links={(0, 1): NV12, (3, 4): NV12, (6, 7): NV12},
    ),
    Expected(
        file="desktop-2x-gtx1080ti-phb.txt",
        gpus=2,
        islands=(),
        numa=(None, None),
        cpu={0: cpus((0, 11)), 1: cpus((0, 11))},
        links={(0, 1): Link(pcie=PHB)},
    ),
    Expected(
        file="h100-8gpu-nv18-2numa-compact.txt",
        gpus=8,
        islands=ALL8,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpu={3: cpus((0, 51)), 4: cpus((52, 103))},
        links={(0, 1): NV18, (3, 4): NV18},
    ),
    Expected(
        file="h100-8gpu-nv18-2numa-ht-affinity.txt",
        gpus=8,
        islands=ALL8,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpu={0: cpus((0, 51), (104, 155)), 7: cpus((52, 103), (156, 207))},
        links={(2, 5): NV18},
    ),
    Expected(
        file="h100-8gpu-nv18-gpu-numa-id.txt",
        gpus=8,
        islands=ALL8,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpu={0: cpus((0, 47), (96, 143)), 5: cpus((48, 95), (144, 191))},
        links={(0, 7): NV18},
    ),
    Expected(
        file="rtx4090-8gpu-2socket-sys-2nic-tabs.txt",
        gpus=8,
        islands=(),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        cpu={0: cpus((0, 55), (112, 167)), 6: cpus((56, 111), (168, 223))},
        links={(0, 1): Link(pcie=SYS), (4, 6): Link(pcie=SYS)},
        nic_names=("NIC0", "NIC1"),
        nic_links={"NIC0": {0: SYS, 1: SYS, 2: SYS, 3: SYS, 4: SYS, 5: SYS, 6: PHB, 7: SYS}},
        nic_numa={"NIC0": 1, "NIC1": 1},
    ),
    Expected(
        file="rtx6000ada-2gpu-threadripper-phb-2nic.txt",
        gpus=2,
        islands=(),
        numa=(0, 0),
        cpu={0: cpus((0, 23))},
        links={(0, 1): Link(pcie=PHB)},
        nic_names=("mlx5_0", "mlx5_1"),
        nic_links={"mlx5_1": {0: NODE, 1: NODE}},
        nic_numa={"mlx5_0": 0, "mlx5_1": 0},
    ),
]


@pytest.mark.parametrize("want", EXPECTED, ids=[e.file for e in EXPECTED])
def test_fixture(want: Expected) -> None:
    graph = parse_topo(fixture_text(want.file), source=want.file)

    assert graph.indices == tuple(range(want.gpus))
    assert graph.shape.nvlink_islands == want.islands
    assert tuple(g.numa_node for g in graph.gpus) == want.numa
    for index, cpu_set in want.cpu.items():
        assert graph.gpu(index).cpu_affinity == cpu_set
    for (a, b), link in want.links.items():
        assert graph.link(a, b) == link
    nics = {nic.name: nic for nic in graph.nics}
    assert tuple(nic.name for nic in graph.nics) == want.nic_names
    for name, levels in want.nic_links.items():
        assert dict(nics[name].gpu_links) == levels
    for name, numa in want.nic_numa.items():
        assert nics[name].numa_node == numa


def test_every_shipped_fixture_is_covered() -> None:
    assert FIXTURES.is_dir(), f"{FIXTURES}: the fixtures folder is missing from the checkout"
    assert {p.name for p in FIXTURES.glob("*.txt")} == {e.file for e in EXPECTED}


def test_same_machine_tabs_or_spaces() -> None:
    tabs = parse_topo(fixture_text("rtx4090-8gpu-2socket-sys-2nic-tabs.txt"))
    spaced = parse_topo(fixture_text("rtx4090-8gpu-2socket-sys-2nic-tabs.txt").replace("\t", "    "))
    assert (spaced.gpus, dict(spaced.links), spaced.nics) == (tabs.gpus, dict(tabs.links), tabs.nics)


# --- quirks seen in real outputs --------------------------------------------------------

GLUED = """\
        GPU0    GPU1    NIC0    NIC1NIC2    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV18    PIXPXB  NODE    0-55,112-167    0               N/A
GPU1    NV18     X      SYSSYS  SYS     56-111,168-223  1               N/A
NIC0    PIX     SYS      X      PXB     NODE
NIC1    PXB     SYS     PXB      X      NODE
NIC2    NODE    SYS     NODENODE         X
"""


def test_glued_tokens_are_split() -> None:
    graph = parse_topo(GLUED)
    assert [nic.name for nic in graph.nics] == ["NIC0", "NIC1", "NIC2"]
    links = [dict(nic.gpu_links) for nic in graph.nics]
    assert links == [{0: PIX, 1: SYS}, {0: PXB, 1: SYS}, {0: NODE, 1: SYS}]
    assert graph.link(0, 1) == NV18


def test_legacy_soc_means_sys() -> None:
    text = "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\nGPU0\t X \tSOC\tSOC\t0-13\nGPU1\tSOC\t X \tPHB\t14-27\n"
    text += "mlx5_0\tSYS\tPHB\t X \t\n"
    graph = parse_topo(text)
    assert graph.link(0, 1) == Link(pcie=SYS)
    assert dict(graph.nics[0].gpu_links) == {0: SYS, 1: PHB}
    assert graph.nics[0].name == "mlx5_0"
    assert graph.gpu(1).cpu_affinity == cpus((14, 27))
    assert graph.gpu(0).numa_node is None


def test_ansi_crlf_prompt_and_trailing_whitespace() -> None:
    plain = fixture_text("desktop-2x-gtx1080ti-phb.txt")
    lines = plain.splitlines()
    lines[0] = f"\x1b[4m{lines[0]}\x1b[0m"
    noisy = "\r\n".join(["", "$ nvidia-smi topo -m", "", *(line + "  \t" for line in lines)]) + "\r\n"
    assert parse_topo(noisy) == parse_topo(plain)


def test_missing_legend() -> None:
    text = fixture_text("a10-4gpu-pcie-sys-2nic.txt")
    cut = text.split("\n\nLegend:")[0]
    graph = parse_topo(cut)
    assert [nic.name for nic in graph.nics] == ["NIC0", "NIC1"]
    assert graph.gpus == parse_topo(text).gpus


def test_truncated_nic_legend_keeps_what_it_has() -> None:
    text = fixture_text("a100-8gpu-nv12-17nic-nic-legend.txt")
    cut = text[: text.index("  NIC6: mlx5_8")] + "  NIC6:"
    names = [nic.name for nic in parse_topo(cut).nics]
    assert names[:6] == [f"mlx5_{m}" for m in range(2, 8)]
    assert names[6:] == [f"NIC{k}" for k in range(6, 17)]


def test_legend_cut_mid_line() -> None:
    text = fixture_text("h100-8gpu-nv18-gpu-numa-id.txt")
    assert parse_topo(text + "  PXB  = Connection trav").gpus == parse_topo(text).gpus


def test_numa_affinity_list_takes_the_first_node() -> None:
    text = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV18    0-71    0,3-9,11-17             2
GPU1    NV18     X      72-143  1,19-25,27-33           18
"""
    graph = parse_topo(text)
    assert [g.numa_node for g in graph.gpus] == [0, 1]
    assert graph.gpu(1).cpu_affinity == cpus((72, 143))


def test_gpu_numa_id_is_used_only_without_numa_affinity() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\tGPU NUMA ID\nGPU0\t X \tNV18\t0-71\t2\nGPU1\tNV18\t X \t0-71\t10\n"
    assert [g.numa_node for g in parse_topo(text).gpus] == [2, 10]
    with_affinity = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-71\tN/A\t\t2\n"
    assert parse_topo(with_affinity).gpu(0).numa_node is None


def test_numa_glued_to_na_and_empty_affinity_cells() -> None:
    glued = "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
    glued += "GPU0     X      NV18    0-55,112-167 0N/A\nGPU1    NV18     X      0-55,112-167 0N/A\n"
    assert [g.numa_node for g in parse_topo(glued).gpus] == [0, 0]
    empty = "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
    empty += "GPU0     X      NV12                            N/A\n"
    empty += "GPU1    NV12     X                              N/A\n"
    assert parse_topo(empty).gpus == (Gpu(0), Gpu(1))


def test_nic_rows_may_end_in_tabs() -> None:
    text = "\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tPIX\t0-3\t0\t\tN/A\n"
    text += "NIC0\tPIX\t X \t\t\t\t\n"
    assert parse_topo(text).nics == (Nic("NIC0", 0, {0: PIX}),)


# --- bad input --------------------------------------------------------------------------


def matrix(cells: list[list[str]]) -> str:
    n = len(cells)
    header = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity\n"
    return header + "".join(f"GPU{i}\t" + "\t".join(row) + "\t0-7\t0\n" for i, row in enumerate(cells))


def square(n: int, cell: str = "NV4") -> list[list[str]]:
    return [["X" if i == j else cell for j in range(n)] for i in range(n)]


def test_unknown_cell_names_line_row_and_column() -> None:
    cells = square(6)
    cells[2][5] = "FOO"
    with pytest.raises(TopologyError) as err:
        parse_topo(matrix(cells), source="topo.txt")
    assert str(err.value) == (
        "topo.txt line 4: expected a link cell (X, NV#, PIX, PXB, PHB, NODE, SYS) "
        "for GPU2 column GPU5, got 'FOO'"
    )


def test_asymmetric_cells_name_both() -> None:
    cells = square(3)
    cells[2][0] = "SYS"
    with pytest.raises(TopologyError) as err:
        parse_topo(matrix(cells), source="topo.txt")
    assert str(err.value).startswith("topo.txt line 4: ")
    assert "GPU2 column GPU0 is 'SYS' but GPU0 column GPU2 (line 2) is 'NV4'" in str(err.value)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("", 1, "header row"),
        ("\n\nno matrix here\n", 4, "header row"),
        (matrix(square(3))[: matrix(square(3)).rindex("GPU2\t")], 4, "expected the row for GPU2"),
        (matrix(square(2)) + "GPU2\tNV4\tNV4\t X \n", 4, "end of the matrix"),
        (matrix([["X", "NV4"], ["NV4"]]), 3, "for GPU1 column GPU1, got '0-7'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\n", 3, "got the end of the row"),
        (matrix([["X", "NV4", "NV4"], ["NV4", "X", "NV4"]]), 2, "at most 2 cells"),
        (matrix([["X", "X"], ["X", "X"]]), 2, "for GPU0 column GPU1, got 'X'"),
        (matrix([["PIX", "PIX"], ["PIX", "X"]]), 2, "X on the diagonal"),
        (matrix([["X", "NV0"], ["NV0", "X"]]), 2, "at least one NVLink"),
        ("\tGPU0\tGPU0\nGPU0\t X \tNV1\nGPU0\tNV1\t X \n", 1, "appears twice"),
        ("\tGPU0\tGPU00\n", 1, "GPU index appears twice"),
        ("\tGPU0\tX\n", 1, "expected a column name"),
        ("\tGPU0\tCPU Affinity\tBogus\n", 1, "expected CPU Affinity"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t3-1\n", 2, "CPU list"),
        ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-99999999\n", 2, "CPU list"),
        ("\tGPU0\tNUMA Affinity\nGPU0\t X \tzero\n", 2, "NUMA node"),
        ("\tGPU0\tGPU NUMA ID\nGPU0\t X \t1-2\n", 2, "GPU NUMA ID"),
        ("\tGPU0\tNIC0\nGPU0\t X \tNV2\nNIC0\tNV2\t X \n", 2, "PCIe cell"),
        ("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \t0-3\n", 3, "no cells after"),
        ("\tGPU0\tGPU1\nGPU1\t X \tPIX\n", 2, "expected the row for GPU0"),
    ],
)
def test_bad_input_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(TopologyError) as err:
        parse_topo(text, source="bad.txt")
    assert f"bad.txt line {line}: " in str(err.value)
    assert words in str(err.value)


def test_render_rejects_what_it_cannot_write() -> None:
    graph = GpuGraph(gpus=(Gpu(0),), links={}, nics=(Nic("two words", None, {0: PIX}),))
    with pytest.raises(TopologyError):
        render_topo(graph)
    with pytest.raises(ValueError):
        render_topo(GpuGraph(gpus=(Gpu(0),), links={}), sep=",")
    with pytest.raises(TopologyError):
        render_topo(GpuGraph(gpus=(), links={}))


def test_render_looks_like_nvidia_smi() -> None:
    graph = GpuGraph(
        gpus=(Gpu(0, numa_node=0, cpu_affinity=cpus((0, 3), (8, 8))), Gpu(1)),
        links={(0, 1): Link(pcie=PIX)},
        nics=(Nic("mlx5_3", 0, {0: PIX, 1: PXB}),),
    )
    lines = render_topo(graph).splitlines()
    assert lines[0] == "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity"
    assert lines[1] == "GPU0\t X \tPIX\tPIX\t0-3,8\t0"
    assert lines[2] == "GPU1\tPIX\t X \tPXB\tN/A\tN/A"
    assert lines[3] == "NIC0\tPIX\tPXB\t X "
    assert lines[-1] == "  NIC0: mlx5_3"


# --- properties -------------------------------------------------------------------------

LEVELS = st.sampled_from(list(PcieLevel))
#: A link between two GPUs, 1 to 18 NVLinks or a PCIe level, in one draw: a 16-GPU graph has
#: 120 pairs, and a strategy per pair made drawing the graphs most of these tests' time.
LINKS = st.sampled_from([*(Link(nvlinks=k) for k in range(1, 19)), *(Link(pcie=lv) for lv in PcieLevel)])
NIC_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)


@st.composite
def graphs(draw: st.DrawFn) -> GpuGraph:
    n = draw(st.integers(1, 16))
    gpus = tuple(
        Gpu(
            index=i,
            numa_node=draw(st.none() | st.integers(0, 3)),
            cpu_affinity=draw(st.frozensets(st.integers(0, 255), max_size=12)),
        )
        for i in range(n)
    )
    links = {pair: draw(LINKS) for pair in itertools.combinations(range(n), 2)}
    names = draw(st.lists(NIC_NAMES, max_size=5, unique=True))
    nics = tuple(Nic(name, None, {i: draw(LEVELS) for i in range(n)}) for name in names)
    return GpuGraph(gpus=gpus, links=links, nics=nics)


def expected_nic_numa(graph: GpuGraph, nic: Nic) -> int | None:
    near = sorted((nic.gpu_links[g.index], g.index) for g in graph.gpus if g.numa_node is not None)
    return graph.gpu(near[0][1]).numa_node if near and near[0][0] <= NODE else None


@given(graph=graphs(), sep=st.sampled_from(["\t", " ", "   "]))
@settings(max_examples=150, deadline=None)
def test_render_then_parse_round_trips(graph: GpuGraph, sep: str) -> None:
    back = parse_topo(render_topo(graph, sep=sep))

    assert back.gpus == graph.gpus
    assert dict(back.links) == dict(graph.links)
    assert [n.name for n in back.nics] == [n.name for n in graph.nics]
    assert [dict(n.gpu_links) for n in back.nics] == [dict(n.gpu_links) for n in graph.nics]
    assert [n.numa_node for n in back.nics] == [expected_nic_numa(graph, n) for n in graph.nics]


def parses_or_refuses(text: str) -> None:
    try:
        graph = parse_topo(text, source="fuzz")
    except TopologyError as err:
        assert str(err).startswith("fuzz line ")
    else:
        assert isinstance(graph, GpuGraph)


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_any_text_parses_or_raises_topology_error(text: str) -> None:
    parses_or_refuses(text)


TOKENS = st.sampled_from(
    [
        *("GPU0", "GPU1", "GPU2", "NIC0", "NIC1", "mlx5_0", "X", " X ", "NV12", "NV0", "PIX", "PXB", "PHB"),
        *("NODE", "SYS", "SOC", "NODENODE", "0-3", "0-3,8-11", "3-1", "0", "1", "N/A", "0N/A", "CPU"),
        *("Affinity", "NUMA", "GPU", "ID", "NIC Legend:", "NIC0: mlx5_2", "Legend:", "\x1b[4m", "\x1b[0m"),
        *("", "٣", "İ", "-", ","),
    ]
)
LINES = st.lists(TOKENS, max_size=12).map(lambda ts: "\t".join(ts)) | st.text(max_size=20)


@given(st.lists(LINES, max_size=8), st.sampled_from(["\n", "\r\n"]))
@settings(max_examples=400, deadline=None)
def test_topo_like_token_soup_parses_or_raises_topology_error(lines: list[str], newline: str) -> None:
    parses_or_refuses(newline.join(lines))


@given(graph=graphs(), data=st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_output_parses_or_raises_topology_error(graph: GpuGraph, data: st.DataObject) -> None:
    text = render_topo(graph)
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, min(len(text), start + 12)))
    parses_or_refuses(text[:start] + data.draw(st.text(max_size=6)) + text[end:])


def test_gpu_rows_only_are_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from extender.topology.presets import preset_graph

    graph = preset_graph("hgx-h100")
    full = render_topo(graph)
    lines = full.splitlines()
    cut = "\n".join(lines[: 1 + len(graph.gpus)]) + "\n\n" + full[full.index("Legend:") :]
    with caplog.at_level("WARNING"):
        got = parse_topo(cut, source="forum.txt")
    assert got.links == graph.links
    assert [(n.numa_node, n.gpu_links) for n in got.nics] == [(n.numa_node, n.gpu_links) for n in graph.nics]
    assert "NIC-NIC relations are unknown" in caplog.text and "forum.txt" in caplog.text
    # Header and GPU rows and nothing else: the same.
    assert parse_topo("\n".join(lines[: 1 + len(graph.gpus)])).links == graph.links


def test_a_missing_gpu_row_is_still_refused() -> None:
    text = "\tGPU0\tGPU1\tNIC0\nGPU0\t X \tNV4\tPIX\n\n"
    with pytest.raises(TopologyError, match="line 3: expected the row for GPU1"):
        parse_topo(text)
