"""What the kubelet aligns to NUMA nodes on this node, for the ``kubelet`` field of NodeTopology.

Three read-only sources, nothing written:

- the kubelet's configuration file (``KubeletConfiguration``, ``kubelet.config.k8s.io/v1beta1``;
  default ``/var/lib/kubelet/config.yaml``, the path kubeadm writes, mounted read-only):
  ``topologyManagerPolicy``, ``topologyManagerScope``, ``cpuManagerPolicy``,
  ``memoryManagerPolicy``, with the kubelet's defaults for fields it leaves out. The file,
  not the node's ``configz`` through the API server: reading ``configz`` needs ``get`` on
  ``nodes/proxy``, which also lets the agent exec into every pod of every node through the
  kubelet API, a far larger privilege than one read-only file of its own node. (A kubelet
  started with the deprecated command-line flags of the same settings overrides its file;
  such nodes are not read correctly.)
- sysfs ``devices/system/node/node*/cpulist``: which CPUs each NUMA node has;
- the kubelet's PodResources API: the CPUs it may hand out exclusively
  (``GetAllocatableResources`` ``cpu_ids``), those containers hold (``List``), and, with the
  Static memory manager, memory per NUMA node.

Anything that cannot be read or makes no sense becomes a :class:`KubeletProblem` naming the
field; the agent turns it into the ``KubeletTopologyRead`` condition and keeps publishing
what it could read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from extender.agent.podresources import CpuUse, MemoryUse, PodResourcesUnavailable
from extender.placement.reading import FileError, parse_yaml, read_text
from extender.topology.kubelet import CpuPolicy, MemoryPolicy, TopologyPolicy, TopologyScope
from extender.topology.serialize import index_ranges, parse_cpu_ranges

DEFAULT_CONFIG = Path("/var/lib/kubelet/config.yaml")
CONDITION = "KubeletTopologyRead"
KIND = "KubeletConfiguration"

#: field -> (enum, default), as the kubelet reads and defaults them.
_FIELDS: dict[str, tuple[type[Any], Any]] = {
    "topologyManagerPolicy": (TopologyPolicy, TopologyPolicy.NONE),
    "topologyManagerScope": (TopologyScope, TopologyScope.CONTAINER),
    "cpuManagerPolicy": (CpuPolicy, CpuPolicy.NONE),
    "memoryManagerPolicy": (MemoryPolicy, MemoryPolicy.NONE),
}


class KubeletProblem(ValueError):
    """Something of the kubelet's setup the agent cannot use; ``reason`` is CamelCase for the
    condition, the message names the file or API field."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class KubeletSettings:
    topology_manager_policy: TopologyPolicy = TopologyPolicy.NONE
    topology_manager_scope: TopologyScope = TopologyScope.CONTAINER
    cpu_manager_policy: CpuPolicy = CpuPolicy.NONE
    memory_manager_policy: MemoryPolicy = MemoryPolicy.NONE


def parse_config(text: str, where: str) -> KubeletSettings:
    """The alignment settings of a ``KubeletConfiguration`` (YAML or JSON), read within the
    bounds every file is read in (:mod:`extender.placement.reading`)."""
    try:
        data = parse_yaml(text, where)
    except FileError as exc:
        raise KubeletProblem("ConfigInvalid", str(exc)) from None
    if not isinstance(data, dict):
        raise KubeletProblem("ConfigInvalid", f"{where}: expected a KubeletConfiguration mapping")
    if data.get("kind") != KIND:
        raise KubeletProblem("ConfigInvalid", f"{where}: kind: expected {KIND}, got {data.get('kind')!r}")
    values: dict[str, Any] = {}
    for name, (enum_type, default) in _FIELDS.items():
        raw = data.get(name)
        if raw is None or raw == "":
            values[name] = default
            continue
        try:
            values[name] = enum_type(raw)
        except ValueError:
            known = ", ".join(str(v) for v in enum_type)
            raise KubeletProblem("ConfigInvalid", f"{where}: {name}: {raw!r} is not one of {known}") from None
    return KubeletSettings(
        values["topologyManagerPolicy"],
        values["topologyManagerScope"],
        values["cpuManagerPolicy"],
        values["memoryManagerPolicy"],
    )


def read_config(path: Path) -> KubeletSettings:
    try:
        text = read_text(path)
    except FileError as exc:
        raise KubeletProblem(
            "ConfigUnreadable", f"kubelet configuration {exc} (mount it read-only, or set --kubelet-config)"
        ) from None
    return parse_config(text, f"kubelet configuration {path}")


def read_numa_cpus(root: Path) -> dict[int, frozenset[int]]:
    """Each NUMA node's CPUs from ``<root>/node<N>/cpulist`` (root: ``/sys/devices/system/node``)."""
    out: dict[int, frozenset[int]] = {}
    try:
        entries = sorted(root.glob("node[0-9]*"))
    except OSError as exc:
        raise KubeletProblem("SysfsUnreadable", f"{root}: {exc}") from None
    for entry in entries:
        suffix = entry.name.removeprefix("node")
        if not suffix.isdigit():
            continue
        try:
            text = (entry / "cpulist").read_text().strip()
            out[int(suffix)] = parse_cpu_ranges(text)
        except OSError as exc:
            raise KubeletProblem("SysfsUnreadable", f"{entry / 'cpulist'}: {exc.strerror or exc}") from None
        except ValueError:
            bad = f"{entry / 'cpulist'}: not a CPU list: {text!r}"
            raise KubeletProblem("SysfsUnreadable", bad) from None
    if not out:
        raise KubeletProblem("SysfsUnreadable", f"{root}: no node*/cpulist (is /sys mounted?)")
    return out


def numa_nodes(
    settings: KubeletSettings,
    numa_cpus: Mapping[int, frozenset[int]],
    allocatable: Sequence[int],
    in_use: Sequence[CpuUse],
    memory: MemoryUse | None,
) -> tuple[list[dict[str, Any]], list[KubeletProblem]]:
    """The ``numaNodes`` entries, and what was wrong in the kubelet's answers (left out of
    them): a CPU id on no NUMA node of this machine."""
    problems: list[KubeletProblem] = []
    owner = {c: n for n, cpus in numa_cpus.items() for c in cpus}
    everything = index_ranges(owner)
    outside = sorted({c for c in allocatable if c not in owner})
    if outside:
        problems.append(
            KubeletProblem(
                "CpuOutsideNode",
                f"PodResources GetAllocatableResources cpu_ids: CPUs {index_ranges(outside)} are on no "
                f"NUMA node of this machine (its CPUs: {everything}); left out",
            )
        )
    for use in in_use:
        bad = sorted(c for c in use.cpu_ids if c not in owner)
        if bad:
            problems.append(
                KubeletProblem(
                    "CpuOutsideNode",
                    f"PodResources List cpu_ids of {use.namespace}/{use.pod} container {use.container}: "
                    f"CPUs {index_ranges(bad)} are on no NUMA node of this machine (its CPUs: {everything}); "
                    f"left out",
                )
            )
    mine = {c for c in allocatable if c in owner}
    held = {c for use in in_use for c in use.cpu_ids if c in mine}
    out = []
    static_memory = settings.memory_manager_policy is MemoryPolicy.STATIC and memory is not None
    for n, cpus in sorted(numa_cpus.items()):
        entry: dict[str, Any] = {
            "id": n,
            "cpus": index_ranges(cpus),
            "allocatableCpus": index_ranges(mine & cpus),
            "cpusInUse": index_ranges(held & cpus),
        }
        if static_memory and memory is not None:
            entry["memory"] = memory.allocatable.get(n, 0)
            entry["memoryInUse"] = memory.in_use.get(n, 0)
        out.append(entry)
    return out, problems


class NumaResources(Protocol):
    """The PodResources questions asked here (:class:`~extender.agent.podresources.PodResourcesClient`)."""

    def cpus(self) -> tuple[list[int], list[CpuUse]]: ...

    def memory(self) -> MemoryUse: ...


@dataclass
class KubeletReader:
    """Reads the ``kubelet`` field each agent cycle (the file is small; read every time, so a
    changed kubelet configuration shows after one agent period)."""

    config: Path
    numa_root: Path
    pod_resources: NumaResources

    def observe(self) -> tuple[dict[str, Any] | None, tuple[bool, str, str]]:
        """(the ``kubelet`` entry or None, the condition as (status, reason, message))."""
        try:
            settings = read_config(self.config)
        except KubeletProblem as exc:
            return None, (False, exc.reason, str(exc))
        entry: dict[str, Any] = {
            "topologyManagerPolicy": str(settings.topology_manager_policy),
            "topologyManagerScope": str(settings.topology_manager_scope),
            "cpuManagerPolicy": str(settings.cpu_manager_policy),
            "memoryManagerPolicy": str(settings.memory_manager_policy),
        }
        try:
            numa_cpus = read_numa_cpus(self.numa_root)
            allocatable, in_use = self.pod_resources.cpus()
            memory = (
                self.pod_resources.memory() if settings.memory_manager_policy is MemoryPolicy.STATIC else None
            )
        except KubeletProblem as exc:
            return entry, (False, exc.reason, f"{exc}; NUMA nodes left out")
        except PodResourcesUnavailable as exc:
            return entry, (False, "PodResourcesUnavailable", f"{exc}; NUMA nodes left out")
        nodes, problems = numa_nodes(settings, numa_cpus, allocatable, in_use, memory)
        entry["numaNodes"] = nodes
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return entry, (False, first.reason, f"{first}{more}")
        policy = settings.topology_manager_policy
        return entry, (
            True,
            "Read",
            f"topologyManagerPolicy {policy}, cpuManagerPolicy {settings.cpu_manager_policy}, "
            f"{len(nodes)} NUMA nodes",
        )
