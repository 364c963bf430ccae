"""``gangslice pin -- CMD ...``: run a server on its GPUs' CPUs, the numactl line made automatic.

A pod that is not Guaranteed QoS (or runs where the kubelet's static CPU manager is off) may run
on any CPU of its cpuset, on either socket, far from its GPUs. ``pin`` reads which GPUs the
process sees (:func:`~extender.agent.preflight.visible_gpus`), takes the CPUs of their NUMA
node(s) (NVML's CPU affinity) that the container may use (its current affinity), sets its own
CPU affinity to those, asks the kernel to prefer their NUMA nodes' memory, and execs the
command: the command's threads inherit both.

Nothing here stops a server from starting: GPUs whose NUMA CPUs the container may not use, or
no NUMA information at all, leave the affinity as it is and say why on stderr. Memory is a
preference (``MPOL_PREFERRED_MANY``, else ``MPOL_PREFERRED`` of the first node), never a bind:
a bound server whose node runs out of memory would be killed, a preferring one spills over.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass

from extender.agent.preflight import Visible, gpu_locality
from extender.topology.model import GpuGraph
from extender.topology.serialize import index_ranges

#: ``set_mempolicy`` modes (linux/mempolicy.h).
MPOL_PREFERRED = 1
MPOL_PREFERRED_MANY = 5
#: ``SYS_set_mempolicy`` by machine (asm-generic on arm64).
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "arm64": 237}


@dataclass(frozen=True)
class PinPlan:
    """Where the command runs: ``cpus`` (None: leave the affinity as it is) and the NUMA nodes
    whose memory it prefers, with a line saying what and why."""

    cpus: frozenset[int] | None
    numa_nodes: tuple[int, ...]
    note: str


def plan(graph: GpuGraph, visible: Visible, allowed: Iterable[int]) -> PinPlan:
    """The CPUs of the visible GPUs' NUMA node(s) that ``allowed`` (the container's cpuset) holds."""
    allowed = frozenset(allowed)
    gpus = visible.gpus
    names = ",".join(visible.name(g) for g in gpus) or "none"
    if not gpus:
        return PinPlan(None, (), f"no GPU visible ({names}): CPU affinity left as it is")
    nodes, local = gpu_locality(graph, gpus)
    if not local:
        return PinPlan(None, nodes, f"GPUs {names}: NUMA CPUs unknown: CPU affinity left as it is")
    cpus = local & allowed
    where = "NUMA node " + ",".join(map(str, nodes)) if nodes else "their NUMA node"
    if not cpus:
        return PinPlan(
            None,
            nodes,
            f"GPUs {names} are on {where} (CPUs {index_ranges(local)}), none of which the container may "
            f"use (CPUs {index_ranges(allowed)}): CPU affinity left as it is",
        )
    return PinPlan(cpus, nodes, f"GPUs {names} on {where}: running on CPUs {index_ranges(cpus)}")


def prefer_memory(nodes: Iterable[int]) -> str | None:
    """Ask the kernel to prefer these NUMA nodes' memory for this process and what it execs;
    why not, when it cannot."""
    nodes = sorted(nodes)
    number = _SET_MEMPOLICY.get(platform.machine())
    if not nodes or number is None:
        return "memory policy left as it is" + ("" if nodes else " (NUMA node unknown)")
    words = max(nodes) // 64 + 1
    libc = ctypes.CDLL(None, use_errno=True)
    for mode, chosen in ((MPOL_PREFERRED_MANY, nodes), (MPOL_PREFERRED, nodes[:1])):
        mask = (ctypes.c_ulong * words)()
        for n in chosen:
            mask[n // 64] |= 1 << (n % 64)
        if libc.syscall(number, mode, mask, ctypes.c_ulong(words * 64 + 1)) == 0:
            return None
    return f"memory policy left as it is: set_mempolicy failed ({os.strerror(ctypes.get_errno())})"
