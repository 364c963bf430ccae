"""Named fake GPU nodes for ``--nvml-fake`` (demos and tests, never production).

Each name builds a :class:`~extender.topology.fake_nvml.FakeNvml` and writes its sysfs tree
(NUMA nodes, PCI paths, NICs) into a temporary directory, so discovery sees the same node
it would see on real hardware of that kind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from uuid import UUID

from extender.agent.kubelet_config import read_numa_cpus
from extender.topology.fake_nvml import FakeNvml

#: Environment variable that selects a fake for ``gangslice preflight`` (tests, demos).
FAKE_ENV = "GANGSLICE_NVML_FAKE"

#: The clique a fake GB200 tray reports (any 16 non-zero bytes would do).
DEMO_CLUSTER_UUID = UUID("6a1f0c55-7d3e-4b8a-9c2d-1e0f5a6b7c8d").bytes
DEMO_CLIQUE_ID = 1

FAKES: dict[str, Callable[[], FakeNvml]] = {
    "hgx-h100": FakeNvml.hgx_h100,
    "dgx-a100": FakeNvml.dgx_a100,
    "pcie-2socket": FakeNvml.pcie_2socket,
    "gb200-tray": lambda: FakeNvml.gb200_tray(DEMO_CLUSTER_UUID, DEMO_CLIQUE_ID),
}


def fake_name(flag: str | None) -> str | None:
    """The fake chosen by a flag, else by ``$GANGSLICE_NVML_FAKE``; None for real NVML."""
    name = flag or os.environ.get(FAKE_ENV) or None
    if name is not None and name not in FAKES:
        raise ValueError(f"unknown NVML fake {name!r}; choose one of {', '.join(FAKES)}")
    return name


@contextmanager
def fake_node(name: str, machine: Path | None = None) -> Iterator[tuple[FakeNvml, Path]]:
    """(backend, sysfs root) of a named fake node; the sysfs tree is removed on exit.

    With ``machine`` (a sysfs root), the fake's GPUs keep their NUMA nodes but take that
    machine's CPUs of each node (``devices/system/node/node<N>/cpulist``): a fake board on a
    real machine, whose kubelet and processes see that machine's CPUs. A GPU on a NUMA node the
    machine lacks keeps none."""
    backend = FAKES[name]()
    if machine is not None:
        numa = read_numa_cpus(machine / "devices" / "system" / "node")
        backend.gpus[:] = [
            replace(g, cpus=numa.get(g.numa_node, frozenset()) if g.numa_node is not None else frozenset())
            for g in backend.gpus
        ]
    with tempfile.TemporaryDirectory(prefix="gangslice-sysfs-") as root:
        yield backend, backend.write_sysfs(Path(root))
