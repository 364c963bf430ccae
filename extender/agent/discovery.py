"""This node's GPU graph and GPU health, from the best source that works right now.

1. NVML (``PynvmlBackend``, or any :class:`~extender.topology.nvml.NvmlBackend`) with sysfs
   for NUMA nodes and NICs; each observation also samples the error counters and turns them
   into per-second rates since the previous sample (``health_from_rates``).
2. ``nvidia-smi topo -m`` when NVML cannot be opened or fails (no health, UUIDs from
   ``nvidia-smi --query-gpu=index,uuid``).
3. Nothing: an empty graph, and a ``Discovered=False`` condition saying why both failed.

An observation never raises: every failure becomes the condition, so the agent keeps
running and retries at the next interval (a driver loaded late, a GPU that came back).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from extender.agent.publish import DISCOVERED, Condition
from extender.topology.model import GpuGraph
from extender.topology.nvidia_smi import parse_topo
from extender.topology.nvml import (
    HealthCounters,
    HealthThresholds,
    NvmlBackend,
    NvmlUnavailable,
    discover,
    health_counters,
    health_from_rates,
)

log = logging.getLogger(__name__)

#: Runs a command, returns its stdout; raises :class:`CommandFailed`.
Runner = Callable[[Sequence[str]], str]

TOPO_COMMAND = ("nvidia-smi", "topo", "-m")
UUID_COMMAND = ("nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader")
COMMAND_TIMEOUT_S = 30.0

EMPTY_GRAPH = GpuGraph(gpus=(), links={})


class CommandFailed(RuntimeError):
    """An external command could not run or exited non-zero; the message says which and why."""


def run_command(args: Sequence[str]) -> str:
    what = " ".join(args)
    try:
        done = subprocess.run(
            list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise CommandFailed(f"{args[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise CommandFailed(f"{what} did not finish in {COMMAND_TIMEOUT_S:g} s") from None
    except OSError as exc:
        raise CommandFailed(f"{what}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise CommandFailed(f"{what} exited {done.returncode}" + (f": {tail[-1]}" if tail else ""))
    return done.stdout


@dataclass(frozen=True)
class Observation:
    graph: GpuGraph
    source: str  # nvml | nvidia-smi | none
    condition: Condition  # Discovered
    #: Sources that failed during this observation (``nvml``, ``nvidia-smi``), for metrics.
    failed: tuple[str, ...] = ()
    #: Each GPU's cumulative error counters (NVML only), for metrics.
    counters: Mapping[int, HealthCounters] = dataclasses.field(default_factory=dict)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def parse_uuids(text: str) -> dict[int, str]:
    """``0, GPU-…`` lines (``nvidia-smi --query-gpu=index,uuid --format=csv,noheader``) -> {index: uuid}."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        index, _, uuid = (part.strip() for part in line.partition(","))
        if index.isdigit() and uuid:
            out[int(index)] = uuid
    return out


class Discovery:
    """Observes the node once per call of :meth:`observe`; holds NVML open between calls.

    ``open_nvml`` opens a backend (``PynvmlBackend`` in production) and may raise
    :class:`NvmlUnavailable`; it is called again at the next observation after any failure.
    ``run`` runs ``nvidia-smi`` for the fallback (None: no fallback).
    """

    def __init__(
        self,
        open_nvml: Callable[[], NvmlBackend],
        *,
        sysfs_root: Path | None,
        run: Runner | None = run_command,
        thresholds: HealthThresholds | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_nvml = open_nvml
        self._sysfs_root = sysfs_root
        self._run = run
        self.thresholds = thresholds or HealthThresholds()
        self._clock = clock
        self._backend: NvmlBackend | None = None
        self._counters: Mapping[int, HealthCounters] = {}
        self._sampled_at: float | None = None

    @property
    def sysfs_root(self) -> Path | None:
        """Where sysfs is read (None: not at all)."""
        return self._sysfs_root

    def close(self) -> None:
        backend, self._backend = self._backend, None
        close = getattr(backend, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:
                log.debug("closing NVML: %s", exc)

    def observe(self) -> Observation:
        try:
            return self._from_nvml()
        except Exception as exc:  # NvmlUnavailable, TopologyError, or a backend's own surprise
            self.close()
            nvml_error = _one_line(exc)
            if not isinstance(exc, NvmlUnavailable):
                log.warning("NVML discovery failed: %s", nvml_error)
        if self._run is None:
            return self._nothing(nvml_error, "no fallback configured", ("nvml",))
        try:
            return self._from_nvidia_smi(nvml_error)
        except Exception as exc:
            return self._nothing(nvml_error, _one_line(exc), ("nvml", "nvidia-smi"))

    def _from_nvml(self) -> Observation:
        if self._backend is None:
            self._backend = self._open_nvml()
        backend = self._backend
        graph = discover(backend, sysfs_root=self._sysfs_root)
        counters = health_counters(backend)
        now = self._clock()
        if self._sampled_at is None or now <= self._sampled_at:
            health = health_from_rates({}, counters, 1.0, self.thresholds)  # no baseline yet
        else:
            health = health_from_rates(self._counters, counters, now - self._sampled_at, self.thresholds)
        self._counters, self._sampled_at = counters, now
        graph = dataclasses.replace(graph, health=health)
        unhealthy = sorted(i for i, h in health.items() if not h.healthy)
        message = f"{len(graph.gpus)} GPUs discovered through NVML"
        if unhealthy:
            message += f"; unhealthy: {', '.join(f'GPU{i}' for i in unhealthy)}"
        return Observation(graph, "nvml", Condition(DISCOVERED, True, "Nvml", message), counters=counters)

    def _from_nvidia_smi(self, nvml_error: str) -> Observation:
        assert self._run is not None
        graph = parse_topo(self._run(TOPO_COMMAND), source=" ".join(TOPO_COMMAND))
        try:
            uuids = parse_uuids(self._run(UUID_COMMAND))
        except CommandFailed as exc:
            log.warning("no GPU UUIDs from nvidia-smi: %s", exc)
            uuids = {}
        if uuids:
            gpus = tuple(dataclasses.replace(g, uuid=uuids.get(g.index, g.uuid)) for g in graph.gpus)
            graph = dataclasses.replace(graph, gpus=gpus)
        message = (
            f"{len(graph.gpus)} GPUs read from nvidia-smi topo -m (no health counters); NVML: {nvml_error}"
        )
        condition = Condition(DISCOVERED, True, "NvidiaSmiFallback", message)
        return Observation(graph, "nvidia-smi", condition, failed=("nvml",))

    @staticmethod
    def _nothing(nvml_error: str, smi_error: str, failed: tuple[str, ...]) -> Observation:
        message = f"no GPU topology: NVML: {nvml_error}; nvidia-smi: {smi_error}"
        condition = Condition(DISCOVERED, False, "NoTopologySource", message)
        return Observation(EMPTY_GRAPH, "none", condition, failed=failed)
