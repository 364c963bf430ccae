"""Read and write the ``nvidia-smi topo -m`` matrix.

The node agent discovers topology through NVML; this text format is the fallback for hosts
where only ``nvidia-smi`` output is at hand, and the format the built-in presets are stored
in. Published copies of the matrix are often damaged (tabs re-rendered as spaces, columns
compacted by hand, separators lost between cells, ANSI codes, cut-off legends), so the
parser reads cells by their grammar rather than by column position, and it reports
anything it cannot read as a :class:`TopologyError` naming the source and line.

Bounds, far above any real host, so that a garbage matrix is refused at once rather than
read for minutes: at most :data:`MAX_DEVICES` (256) device columns, GPUs and NICs together; a
GPU index at most :data:`MAX_GPU_INDEX` (1023); at most :data:`MAX_NVLINKS` (64) NVLinks
between two GPUs (Hopper and Blackwell have 18); a CPU id at most :data:`MAX_CPU_ID` (65535)
and a NUMA node at most :data:`MAX_NUMA_NODE` (1023). A file is read as every file is
(:mod:`extender.placement.reading`: at most 16 MiB of UTF-8 text).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from extender.topology.model import Gpu, GpuGraph, Link, Nic, PcieLevel, TopologyError
from extender.topology.serialize import index_ranges

__all__ = ["parse_topo", "render_topo"]

_log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

# One link cell, and a run of cells that lost the separators between them ("NODENODE").
_LINK_CELL = re.compile(r"NV[0-9]+|PIX|PXB|PHB|NODE|SYS|SOC|X", re.IGNORECASE | re.ASCII)
_LINK_RUN = re.compile(r"(?:NV[0-9]+|PIX|PXB|PHB|NODE|SYS|SOC|X)+", re.IGNORECASE | re.ASCII)
_LINK_WORDS = "X, NV#, PIX, PXB, PHB, NODE, SYS"

_GPU_NAME = re.compile(r"GPU([0-9]+)")
_GLUED_NAMES = re.compile(r"(?:GPU[0-9]+|NIC[0-9]+|mlx[0-9]+_(?:bond_)?[0-9]+)+")
_ONE_NAME = re.compile(r"GPU[0-9]+|NIC[0-9]+|mlx[0-9]+_(?:bond_)?[0-9]+")
_DEVICE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*")

# Header columns after the device columns; older drivers print fewer of them.
_TRAILER_COLUMN = re.compile(
    r"\s*(CPU\s*Affinity|NUMA\s*Affinity|GPU\s*NUMA\s*ID|NUMA)", re.IGNORECASE | re.ASCII
)
_TRAILER_WORDS = frozenset({"CPU", "NUMA", "GPU", "AFFINITY"})
_CPU, _NUMA, _GPU_NUMA = "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"

_CPU_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_NUMA_LIST = re.compile(r"([0-9]+)(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*")
_NUMBER = re.compile(r"[0-9]+")
_LEGEND_ENTRY = re.compile(r"\s*(NIC[0-9]+)\s*:\s*(\S+)\s*")
_NOT_AVAILABLE = "N/A"

#: Larger CPU ids than any Linux kernel supports (NR_CPUS tops out at 8192) mean garbage.
MAX_CPU_ID = 65535
#: Linux's MAX_NUMNODES tops out at 1024.
MAX_NUMA_NODE = 1023
#: Device columns (GPUs and NICs) of one matrix: a host has 8 or 16 GPUs and a few NICs.
MAX_DEVICES = 256
MAX_GPU_INDEX = 1023
#: NVLinks between two GPUs: 18 on Hopper and Blackwell.
MAX_NVLINKS = 64
#: An error message quotes at most this much of the input.
_QUOTED = 300


@dataclass(frozen=True, slots=True)
class _Line:
    number: int
    text: str


@dataclass(frozen=True, slots=True)
class _Header:
    line: int
    devices: tuple[str, ...]
    trailer: tuple[str, ...]

    @property
    def gpu_positions(self) -> tuple[int, ...]:
        return tuple(p for p, name in enumerate(self.devices) if _GPU_NAME.fullmatch(name))


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    name: str
    cells: tuple[str, ...]
    trailer: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Source:
    name: str

    def error(self, line: int, message: str) -> TopologyError:
        if len(message) > _QUOTED:
            message = f"{message[:_QUOTED]}..."
        return TopologyError(f"{self.name} line {line}: {message}")


def _bounded(digits: str, limit: int) -> int | None:
    """The number ``digits`` spell, or None above ``limit`` (told by the length first: Python
    refuses to read more than 4,300 digits into a number)."""
    if len(digits.lstrip("0")) > len(str(limit)):
        return None
    value = int(digits)
    return value if value <= limit else None


# --- parsing ----------------------------------------------------------------------------


def parse_topo(text: str, *, source: str = "<input>") -> GpuGraph:
    """Parse ``nvidia-smi topo -m`` output into a :class:`GpuGraph`.

    Host NUMA comes from ``NUMA Affinity`` (the first node when a list is printed); the
    ``GPU NUMA ID`` column is used only when there is no affinity cell, because on Grace
    systems it names the GPU's own memory node, not the CPU socket. A NIC's NUMA node is
    that of the closest GPU it reaches without crossing sockets (PIX, PXB, PHB or NODE; NODE
    still means "within one NUMA node" in nvidia-smi's legend), else None.

    A matrix that stops after the GPU rows (bug reports and forum posts often carry only the
    header and those) is read: the GPU rows hold every GPU-GPU and GPU-NIC relation, and only
    the NIC-NIC relations, which placement does not use, are unknown (logged as a warning).
    """
    src = _Source(source)
    lines = _split_lines(text)
    start = _find_header(lines, src)
    header = _parse_header(lines[start], src)
    rows, end = _parse_rows(lines, start + 1, header, src)
    _check_symmetric(rows, src)
    return _build_graph(header, rows, _nic_legend(lines[end:]), src)


def _split_lines(text: str) -> list[_Line]:
    return [_Line(n, _ANSI.sub("", raw)) for n, raw in enumerate(_LINE_BREAK.split(text), start=1)]


def _find_header(lines: Sequence[_Line], src: _Source) -> int:
    for i, line in enumerate(lines):
        tokens = line.text.split()
        if tokens and _GPU_NAME.match(tokens[0]):
            return i
    raise src.error(len(lines), "expected a header row naming the GPU columns (GPU0 ...), found none")


def _parse_header(line: _Line, src: _Source) -> _Header:
    tokens = line.text.split()
    devices: list[str] = []
    at = 0
    while at < len(tokens) and tokens[at].upper() not in _TRAILER_WORDS:
        devices.extend(_column_names(tokens[at], line, src))
        at += 1
    trailer = _trailer_columns(" ".join(tokens[at:]), line, src)
    _check_devices(devices, line, src)
    return _Header(line.number, tuple(devices), trailer)


def _column_names(token: str, line: _Line, src: _Source) -> list[str]:
    if _GLUED_NAMES.fullmatch(token):
        return _ONE_NAME.findall(token)
    if _DEVICE_NAME.fullmatch(token) and not _LINK_RUN.fullmatch(token):
        return [token]
    raise src.error(
        line.number,
        f"expected a column name (GPU#, NIC#, a NIC device, CPU Affinity, NUMA Affinity, GPU NUMA ID), "
        f"got {token!r}",
    )


def _trailer_columns(text: str, line: _Line, src: _Source) -> tuple[str, ...]:
    columns: list[str] = []
    at = 0
    while text[at:].strip():
        match = _TRAILER_COLUMN.match(text, at)
        if match is None:
            raise src.error(
                line.number, f"expected CPU Affinity, NUMA Affinity or GPU NUMA ID, got {text[at:].strip()!r}"
            )
        column = _trailer_key(match.group(1))
        if column in columns:
            raise src.error(line.number, f"column {column!r} appears twice in the header")
        columns.append(column)
        at = match.end()
    return tuple(columns)


def _trailer_key(words: str) -> str:
    squashed = "".join(words.split()).upper()
    if squashed.startswith("CPU"):
        return _CPU
    if squashed.startswith("GPU"):
        return _GPU_NUMA
    return _NUMA


def _check_devices(devices: Sequence[str], line: _Line, src: _Source) -> None:
    if len(devices) > MAX_DEVICES:
        raise src.error(line.number, f"{len(devices)} device columns; a matrix has at most {MAX_DEVICES}")
    if len(set(devices)) != len(devices):
        raise src.error(line.number, f"a device column appears twice in the header: {' '.join(devices)}")
    indices = [_bounded(m.group(1), MAX_GPU_INDEX) for d in devices if (m := _GPU_NAME.fullmatch(d))]
    if None in indices:
        raise src.error(line.number, f"a GPU index above {MAX_GPU_INDEX} in the header")
    if not indices:
        raise src.error(line.number, "expected at least one GPU column (GPU0 ...) in the header")
    if len(set(indices)) != len(indices):
        raise src.error(line.number, f"a GPU index appears twice in the header: {' '.join(devices)}")


def _parse_rows(lines: Sequence[_Line], start: int, header: _Header, src: _Source) -> tuple[list[_Row], int]:
    rows: list[_Row] = []
    at = start
    for position, name in enumerate(header.devices):
        if _only_nics_left(lines, at, position, header):
            missing = header.devices[position:]
            _log.warning(
                "%s: the matrix has the GPU rows only (no row for %s); NIC-NIC relations are unknown",
                src.name,
                ", ".join(missing),
            )
            return rows, at
        if at >= len(lines) or not lines[at].text.strip():
            got = "the end of the input" if at >= len(lines) else "a blank line"
            number = lines[at].number if at < len(lines) else lines[-1].number
            raise src.error(
                number,
                f"expected the row for {name} (the header names {len(header.devices)} devices, "
                f"so the matrix needs {len(header.devices)} rows), got {got}",
            )
        rows.append(_parse_row(lines[at], position, header, src))
        at += 1
    if at < len(lines) and _looks_like_row(lines[at].text, header):
        raise src.error(
            lines[at].number,
            f"expected the end of the matrix after {len(header.devices)} rows, got another row",
        )
    return rows, at


def _only_nics_left(lines: Sequence[_Line], at: int, position: int, header: _Header) -> bool:
    """Whether the matrix ends here, after every GPU row, before the NIC rows: the input
    ends, a blank line, or a line that is no row (a legend) where a NIC row would be."""
    if position == 0 or any(p >= position for p in header.gpu_positions):
        return False
    return at >= len(lines) or not _looks_like_row(lines[at].text, header)


def _looks_like_row(text: str, header: _Header) -> bool:
    tokens = text.split()
    return bool(tokens) and (tokens[0] in header.devices or _GLUED_NAMES.fullmatch(tokens[0]) is not None)


def _parse_row(line: _Line, position: int, header: _Header, src: _Source) -> _Row:
    name = header.devices[position]
    tokens = line.text.split()
    label = tokens[0]
    if label != name:
        rest = label[len(name) :]
        if not (label.startswith(name) and _LINK_RUN.fullmatch(rest)):
            raise src.error(line.number, f"expected the row for {name}, got {label!r}")
        tokens = [name, rest, *tokens[1:]]
    cells, leftover = _link_cells(tokens[1:], line, position, header, src)
    if name in _gpu_names(header):
        return _Row(line.number, name, cells, _gpu_trailer(leftover, header, line, src))
    if leftover:
        raise src.error(line.number, f"expected no cells after the {name} row's links, got {leftover[0]!r}")
    return _Row(line.number, name, cells)


def _gpu_names(header: _Header) -> set[str]:
    return {header.devices[p] for p in header.gpu_positions}


def _link_cells(
    tokens: Sequence[str], line: _Line, position: int, header: _Header, src: _Source
) -> tuple[tuple[str, ...], list[str]]:
    """Take one link cell per device column, splitting runs that lost their separators."""
    pending = list(reversed(tokens))
    cells: list[str] = []
    while len(cells) < len(header.devices):
        column = header.devices[len(cells)]
        if not pending:
            raise src.error(
                line.number,
                f"expected a link cell ({_LINK_WORDS}) for {header.devices[position]} column {column}, "
                f"got the end of the row",
            )
        token = pending.pop()
        run = _LINK_RUN.match(token)
        if run is None:
            raise src.error(
                line.number,
                f"expected a link cell ({_LINK_WORDS}) for {header.devices[position]} column {column}, "
                f"got {token!r}",
            )
        if run.end() < len(token):
            pending.append(token[run.end() :])
        cells.extend(cell.upper() for cell in _LINK_CELL.findall(run.group()))
    overflow = cells[len(header.devices) :]
    cells = cells[: len(header.devices)]
    for at, cell in enumerate(cells):
        _check_cell(cell, position, at, header, line, src)
    return tuple(cells), overflow + list(reversed(pending))


def _check_cell(cell: str, row: int, column: int, header: _Header, line: _Line, src: _Source) -> None:
    where = f"{header.devices[row]} column {header.devices[column]}"
    if (row == column) != (cell == "X"):
        expected = "X on the diagonal" if row == column else f"a link cell ({_LINK_WORDS})"
        raise src.error(line.number, f"expected {expected} for {where}, got {cell!r}")
    if not cell.startswith("NV"):
        return
    gpus = header.gpu_positions
    if row not in gpus or column not in gpus:
        raise src.error(
            line.number, f"expected a PCIe cell (PIX, PXB, PHB, NODE, SYS) for {where}, got {cell!r}"
        )
    count = _bounded(cell[2:], MAX_NVLINKS)
    if count == 0:
        raise src.error(line.number, f"expected at least one NVLink in {where}, got {cell!r}")
    if count is None:
        raise src.error(line.number, f"expected at most {MAX_NVLINKS} NVLinks in {where}, got {cell!r}")


def _gpu_trailer(tokens: Sequence[str], header: _Header, line: _Line, src: _Source) -> dict[str, str]:
    cells = [part for token in tokens for part in re.split(f"({_NOT_AVAILABLE})", token) if part]
    columns = list(header.trailer)
    if len(cells) > len(columns):
        raise src.error(
            line.number,
            f"expected at most {len(columns)} cells after the links ({', '.join(columns) or 'none'}), "
            f"got {' '.join(cells)!r}",
        )
    trailer: dict[str, str] = {}
    # A VM may print nothing but the GPU NUMA ID; "N/A" alone then belongs to that column.
    if len(cells) < len(columns) and _GPU_NUMA in columns and cells and cells[-1] == _NOT_AVAILABLE:
        trailer[_GPU_NUMA] = cells.pop()
        columns.remove(_GPU_NUMA)
    trailer.update(zip(columns, cells, strict=False))
    return trailer


def _check_symmetric(rows: Sequence[_Row], src: _Source) -> None:
    for i, row in enumerate(rows):
        for j in range(i + 1, len(rows)):
            upper, lower = _same_level(row.cells[j]), _same_level(rows[j].cells[i])
            if upper != lower:
                raise src.error(
                    rows[j].line,
                    f"expected a symmetric matrix: {rows[j].name} column {row.name} is {rows[j].cells[i]!r} "
                    f"but {row.name} column {rows[j].name} (line {row.line}) is {row.cells[j]!r}",
                )


def _same_level(cell: str) -> str:
    return "SYS" if cell == "SOC" else cell


def _nic_legend(lines: Sequence[_Line]) -> dict[str, str]:
    legend: dict[str, str] = {}
    inside = False
    for line in lines:
        if line.text.strip().upper().startswith("NIC LEGEND"):
            inside = True
        elif inside and (match := _LEGEND_ENTRY.fullmatch(line.text)):
            legend[match.group(1)] = match.group(2)
    return legend


# --- building the graph -----------------------------------------------------------------


def _build_graph(header: _Header, rows: Sequence[_Row], legend: Mapping[str, str], src: _Source) -> GpuGraph:
    gpu_positions = header.gpu_positions
    index = {p: int(header.devices[p][3:]) for p in gpu_positions}
    gpus = tuple(_gpu(index[p], rows[p], src) for p in gpu_positions)
    links = {
        (min(index[a], index[b]), max(index[a], index[b])): _link(rows[a].cells[b])
        for n, a in enumerate(gpu_positions)
        for b in gpu_positions[n + 1 :]
    }
    numa = {g.index: g.numa_node for g in gpus}
    # Each NIC's relation to each GPU, from the GPU rows (the matrix is symmetric, and the
    # NIC rows may be missing).
    nics = tuple(
        _nic(legend.get(name, name), {index[g]: rows[g].cells[p] for g in gpu_positions}, numa)
        for p, name in enumerate(header.devices)
        if p not in index
    )
    return GpuGraph(gpus=gpus, links=links, nics=nics)


def _gpu(index: int, row: _Row, src: _Source) -> Gpu:
    cpus = _cpu_set(row.trailer.get(_CPU, _NOT_AVAILABLE), row, src)
    if _NUMA in row.trailer:
        numa = _numa_node(row.trailer[_NUMA], row, src)
    else:
        numa = _gpu_numa_id(row.trailer.get(_GPU_NUMA, _NOT_AVAILABLE), row, src)
    return Gpu(index=index, numa_node=numa, cpu_affinity=cpus)


def _link(cell: str) -> Link:
    if cell.startswith("NV"):
        return Link(nvlinks=int(cell[2:]))
    return Link(pcie=PcieLevel.parse(cell))


def _nic(name: str, cells: Mapping[int, str], numa: Mapping[int, int | None]) -> Nic:
    levels = {gpu: PcieLevel.parse(cell) for gpu, cell in cells.items()}
    near = sorted(
        (level, gpu) for gpu, level in levels.items() if level <= PcieLevel.NODE and numa[gpu] is not None
    )
    return Nic(name=name, numa_node=numa[near[0][1]] if near else None, gpu_links=levels)


def _cpu_set(cell: str, row: _Row, src: _Source) -> frozenset[int]:
    if cell.upper() == _NOT_AVAILABLE:
        return frozenset()
    cpus: set[int] = set()
    for part in cell.split(","):
        match = _CPU_PART.fullmatch(part)
        low = _bounded(match.group(1), MAX_CPU_ID) if match else None
        high = _bounded(match.group(2), MAX_CPU_ID) if match and match.group(2) else low
        if low is None or high is None or high < low:
            raise src.error(row.line, f"expected a CPU list like 0-47,96-143 for {row.name}, got {cell!r}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def _numa_node(cell: str, row: _Row, src: _Source) -> int | None:
    if cell.upper() == _NOT_AVAILABLE:
        return None
    match = _NUMA_LIST.fullmatch(cell)
    node = _bounded(match.group(1), MAX_NUMA_NODE) if match else None
    if node is None:
        raise src.error(
            row.line,
            f"expected a NUMA node (a number up to {MAX_NUMA_NODE}, a list, or N/A) for {row.name}, "
            f"got {cell!r}",
        )
    return node


def _gpu_numa_id(cell: str, row: _Row, src: _Source) -> int | None:
    if cell.upper() == _NOT_AVAILABLE:
        return None
    node = _bounded(cell, MAX_NUMA_NODE) if _NUMBER.fullmatch(cell) else None
    if node is None:
        raise src.error(
            row.line,
            f"expected a GPU NUMA ID (a number up to {MAX_NUMA_NODE} or N/A) for {row.name}, got {cell!r}",
        )
    return node


# --- rendering --------------------------------------------------------------------------

_LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


def render_topo(graph: GpuGraph, *, sep: str = "\t") -> str:
    """Render a graph as ``nvidia-smi topo -m`` text that :func:`parse_topo` reads back.

    NIC-to-NIC cells are not part of the model; they are rendered as the closest level the
    two NICs can share through a common GPU (SYS when none). A NIC without a relation to
    some GPU is rendered SYS to it.
    """
    if not sep or not sep.isspace() or "\n" in sep or "\r" in sep:
        raise ValueError(f"separator must be spaces or tabs, got {sep!r}")
    if not graph.gpus:
        raise TopologyError("a GPU graph without GPUs cannot be rendered as nvidia-smi topo -m")
    for nic in graph.nics:
        if not nic.name or any(ch.isspace() for ch in nic.name):
            raise TopologyError(f"NIC name {nic.name!r} cannot be rendered: it must be one word")
    nic_headers = [f"NIC{k}" for k in range(len(graph.nics))]
    names = [f"GPU{g.index}" for g in graph.gpus] + nic_headers
    diagonal = " X " if sep == "\t" else "X"
    lines = [sep.join(["", *names, _CPU, _NUMA])]
    lines += [sep.join(_gpu_row(graph, g, diagonal)) for g in graph.gpus]
    lines += [sep.join(_nic_row(graph, k, diagonal)) for k in range(len(graph.nics))]
    lines += ["", _LEGEND]
    if any(nic.name != header for nic, header in zip(graph.nics, nic_headers, strict=True)):
        lines += ["", "NIC Legend:", ""]
        lines += [f"  {header}: {nic.name}" for nic, header in zip(graph.nics, nic_headers, strict=True)]
    return "\n".join(lines) + "\n"


def _gpu_row(graph: GpuGraph, gpu: Gpu, diagonal: str) -> list[str]:
    links = [diagonal if g.index == gpu.index else graph.link(gpu.index, g.index).cell for g in graph.gpus]
    nics = [nic.gpu_links.get(gpu.index, PcieLevel.SYS).name for nic in graph.nics]
    numa = _NOT_AVAILABLE if gpu.numa_node is None else str(gpu.numa_node)
    return [f"GPU{gpu.index}", *links, *nics, _cpu_text(gpu.cpu_affinity), numa]


def _nic_row(graph: GpuGraph, k: int, diagonal: str) -> list[str]:
    nic = graph.nics[k]
    gpus = [nic.gpu_links.get(g.index, PcieLevel.SYS).name for g in graph.gpus]
    nics = [diagonal if j == k else _nic_pair(nic, other).name for j, other in enumerate(graph.nics)]
    return [f"NIC{k}", *gpus, *nics]


def _nic_pair(a: Nic, b: Nic) -> PcieLevel:
    # Two NICs' common ancestor is no higher than the higher of their ancestors with any one GPU.
    shared = [max(level, b.gpu_links[g]) for g, level in a.gpu_links.items() if g in b.gpu_links]
    return min(shared, default=PcieLevel.SYS)


def _cpu_text(cpus: Iterable[int]) -> str:
    return index_ranges(cpus) or _NOT_AVAILABLE
