"""``gangslice preflight``: inside a workload pod, did this process get the GPUs it was promised?

The scheduler writes the GPU indices it chose into the pod's ``gangslice.io/gpus`` annotation
and their NUMA node(s) into ``gangslice.io/numa-node``; under the device-plugin model the
kubelet may still hand out other GPUs (it picks them, not us). The pre-flight compares what
the process can see with that promise, and checks what operators otherwise check by hand:

- ``gpus``: the visible GPUs are the promised ones;
- ``gpu-uuids``: the visible GPUs' UUIDs are the ones promised in ``gangslice.io/gpu-uuids``
  (a swap for another GPU of the same NUMA node passes every other check).

  As many GPUs as promised but other ones pass these two checks, saying so, unless
  ``--strict-gpus``: the kubelet's choice stands, gangslice moves the reservation onto them,
  and whether they serve the pod is what the checks below judge (the promised NUMA node is
  then not required, only one shared with the process). A set that breaks the in-node rule
  fails ``tp-links``, and the controller evicts such a pod (``serve --on-mismatch``) rather
  than leave it crash-looping on the GPUs it holds;
- ``tp-size``: ``--expect-tp N`` GPUs are visible;
- ``tp-links``: every pair of visible GPUs is NVLink (``NV#``), or with ``--allow-pcie``
  within the PCIe level promised by ``gangslice.io/required-level`` (PXB when not an
  in-node level);
- ``numa``: the GPUs are on the promised NUMA node and share one with the process's CPUs;
- ``nic``: each GPU's nearest NIC is on the GPU's NUMA node.

Which GPUs are visible: ``NVIDIA_VISIBLE_DEVICES`` (host indices or UUIDs, as the NVIDIA
runtime takes them; ``all``; ``none``), narrowed by ``CUDA_VISIBLE_DEVICES`` (ordinals into
that list, assumed in PCI order as with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or UUIDs and UUID
prefixes). NVML inside a container sees only the container's GPUs and numbers them from 0,
so host indices are known only when ``NVIDIA_VISIBLE_DEVICES`` lists indices or NVML sees
more GPUs than were listed (``all``, a host, or a fake); otherwise the ``gpus`` check can
compare only how many GPUs there are, and says so.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from extender.kube.names import GPU_UUIDS, GPUS, NUMA_NODE, REQUIRED_LEVEL
from extender.topology.model import IN_NODE_LEVELS, GpuGraph, Tier
from extender.topology.serialize import index_ranges

DEFAULT_ANNOTATIONS = Path("/etc/podinfo/annotations")
#: Said of a ``gpus`` / ``gpu-uuids`` difference that passes (without ``--strict-gpus``).
FOLLOWED = (
    "the kubelet's choice stands: gangslice moves the reservation onto these GPUs (--strict-gpus fails here)"
)


class PreflightError(RuntimeError):
    """The pre-flight cannot check at all (no NVML, unreadable input); not a mismatch."""


# --- the promise -----------------------------------------------------------------------


def parse_annotations(text: str) -> dict[str, str]:
    """The downward-API annotations file: one ``key="value"`` per line, values Go-quoted."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, raw = line.partition("=")
        if not sep:
            raise PreflightError(f'annotations line {number}: expected key="value", got {line!r}')
        raw = raw.strip()
        try:
            value = ast.literal_eval(raw) if raw.startswith('"') else raw
        except (ValueError, SyntaxError):
            raise PreflightError(f"annotations line {number}: cannot read the value {raw!r}") from None
        if not isinstance(value, str):
            raise PreflightError(f"annotations line {number}: the value of {key} is not a string")
        out[key.strip()] = value
    return out


def _int_list(raw: str, what: str) -> tuple[int, ...]:
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise PreflightError(f"annotation {what}={raw!r} is not a comma-separated list of numbers")
    return tuple(sorted({int(p) for p in parts}))


def _uuid_list(raw: str) -> frozenset[str]:
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts:
        raise PreflightError(f"annotation {GPU_UUIDS}={raw!r} names no GPU UUID")
    for part in parts:
        if not part.upper().startswith("GPU-") or len(part) <= 4:
            raise PreflightError(
                f"annotation {GPU_UUIDS}={raw!r}: {part!r} is not a GPU UUID (GPU-<uuid>, as NVML names GPUs)"
            )
    return frozenset(p.lower() for p in parts)


@dataclass(frozen=True)
class Promise:
    """What the scheduler promised this pod (None: not promised / not known)."""

    gpus: tuple[int, ...] | None = None
    numa_nodes: tuple[int, ...] | None = None
    level: str | None = None
    uuids: frozenset[str] | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> Promise:
        gpus = annotations.get(GPUS)
        numa = annotations.get(NUMA_NODE)
        uuids = annotations.get(GPU_UUIDS)
        return cls(
            gpus=_int_list(gpus, GPUS) if gpus is not None else None,
            numa_nodes=_int_list(numa, NUMA_NODE) if numa is not None else None,
            level=annotations.get(REQUIRED_LEVEL),
            uuids=_uuid_list(uuids) if uuids is not None else None,
        )

    def allowed_tier(self, allow_pcie: bool) -> Tier:
        """The loosest link a tensor-parallel pair may have."""
        if not allow_pcie:
            return Tier.NVLINK
        tier = IN_NODE_LEVELS.get((self.level or "").strip().lower())
        return tier if tier is not None else Tier.PXB


# --- the visible GPUs ------------------------------------------------------------------


@dataclass(frozen=True)
class Visible:
    """The GPUs this process may use: NVML indices, and host indices when they can be known."""

    gpus: tuple[int, ...]
    host: tuple[int, ...] | None
    source: str

    def name(self, gpu: int) -> str:
        """``GPU4`` by host index when known, else by NVML index."""
        if self.host is None:
            return f"GPU{gpu}"
        return f"GPU{self.host[self.gpus.index(gpu)]}"


def _tokens(raw: str) -> list[str]:
    return [t.strip() for t in raw.split(",") if t.strip()]


def _by_uuid(token: str, uuids: Mapping[str, int], where: str) -> int:
    if token.upper().startswith("MIG-"):
        raise PreflightError(f"{where} names MIG device {token}; the pre-flight checks whole GPUs only")
    if token in uuids:
        return uuids[token]
    matches = {i for u, i in uuids.items() if u.startswith(token) or u.startswith(f"GPU-{token}")}
    if len(matches) != 1:
        raise PreflightError(f"{where} entry {token!r} matches {len(matches) or 'no'} visible GPUs")
    return matches.pop()


def _from_nvidia_visible(graph: GpuGraph, raw: str | None) -> Visible:
    all_gpus = graph.indices
    n = len(all_gpus)
    value = (raw or "").strip()
    if value.lower() == "all":
        return Visible(all_gpus, all_gpus, "NVIDIA_VISIBLE_DEVICES=all")
    if value.lower() in ("", "void"):
        return Visible(all_gpus, None, "all GPUs NVML sees")
    if value.lower() == "none":
        return Visible((), (), "NVIDIA_VISIBLE_DEVICES=none")
    tokens = _tokens(value)
    where = "NVIDIA_VISIBLE_DEVICES"
    if all(t.isdigit() for t in tokens):
        hosts = [int(t) for t in tokens]
        if n > len(tokens):  # NVML sees the whole node: its indices are host indices
            missing = [h for h in hosts if h not in all_gpus]
            if missing:
                raise PreflightError(f"{where} lists GPU {missing[0]}, which NVML does not see")
            return Visible(tuple(hosts), tuple(hosts), where)
        if n == len(tokens):  # NVML sees only these, numbered 0.. in PCI (= host index) order
            return Visible(all_gpus, tuple(sorted(hosts)), where)
        raise PreflightError(f"{where} lists {len(tokens)} GPUs but NVML sees only {n}")
    uuids = {g.uuid: g.index for g in graph.gpus if g.uuid}
    if any(t.isdigit() for t in tokens):
        raise PreflightError(f"{where}={value!r} mixes indices and UUIDs")
    chosen = tuple(_by_uuid(t, uuids, where) for t in tokens)
    return Visible(chosen, chosen if n > len(tokens) else None, where)


def visible_gpus(graph: GpuGraph, env: Mapping[str, str]) -> Visible:
    """The GPUs visible to this process, from the environment and what NVML sees."""
    base = _from_nvidia_visible(graph, env.get("NVIDIA_VISIBLE_DEVICES"))
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return base
    uuids = {g.uuid: pos for pos, g in enumerate(graph.gpus) if g.uuid and g.index in base.gpus}
    picked: list[int] = []  # positions into base.gpus
    for token in _tokens(raw):
        if token.isdigit():
            if int(token) >= len(base.gpus):
                raise PreflightError(
                    f"CUDA_VISIBLE_DEVICES ordinal {token} is past the {len(base.gpus)} GPUs visible"
                )
            picked.append(int(token))
        else:
            index = graph.gpus[_by_uuid(token, uuids, "CUDA_VISIBLE_DEVICES")].index
            picked.append(base.gpus.index(index))
    gpus = tuple(base.gpus[p] for p in picked)
    host = tuple(base.host[p] for p in picked) if base.host is not None else None
    return Visible(gpus, host, f"{base.source} + CUDA_VISIBLE_DEVICES")


# --- checks ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Report:
    visible: Visible
    checks: tuple[Check, ...]
    numa_nodes: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def reason(self) -> str | None:
        """The first failed check's detail: the one-line reason for a non-zero exit."""
        return next((f"{c.name}: {c.detail}" for c in self.checks if not c.ok), None)

    @property
    def numactl(self) -> str | None:
        """``numactl --cpunodebind=N --membind=N`` for the GPUs' NUMA node(s)."""
        if not self.numa_nodes:
            return None
        nodes = ",".join(str(n) for n in self.numa_nodes)
        return f"numactl --cpunodebind={nodes} --membind={nodes}"


def _names(visible: Visible, gpus: Sequence[int]) -> str:
    return ", ".join(visible.name(g) for g in gpus)


def _check_gpus(visible: Visible, promise: Promise) -> Check:
    if promise.gpus is None:
        return Check("gpus", True, f"no {GPUS} annotation; not compared")
    promised = ",".join(map(str, promise.gpus))
    if visible.host is None:
        if len(visible.gpus) != len(promise.gpus):
            return Check(
                "gpus", False, f"{len(visible.gpus)} GPUs visible, {len(promise.gpus)} promised ({promised})"
            )
        return Check("gpus", True, f"{len(visible.gpus)} GPUs as promised (host indices not visible here)")
    got = ",".join(map(str, sorted(visible.host)))
    if tuple(sorted(visible.host)) != promise.gpus:
        return Check("gpus", False, f"visible GPUs {got or 'none'} differ from the promised {promised}")
    return Check("gpus", True, f"GPUs {got} as promised")


def _check_uuids(graph: GpuGraph, visible: Visible, promise: Promise) -> Check:
    if promise.uuids is None:
        return Check("gpu-uuids", True, f"no {GPU_UUIDS} annotation; not compared")
    seen = graph.uuids(visible.gpus)
    if seen is None:
        return Check("gpu-uuids", True, "NVML gave no UUID for a visible GPU; not compared")
    got = frozenset(u.lower() for u in seen)
    if got != promise.uuids:
        return Check(
            "gpu-uuids",
            False,
            f"visible GPUs {', '.join(sorted(got)) or 'none'} differ from the promised "
            f"{', '.join(sorted(promise.uuids))} ({GPU_UUIDS})",
        )
    return Check("gpu-uuids", True, f"{len(got)} GPU UUIDs as promised")


def _check_tp_size(visible: Visible, expect_tp: int) -> Check:
    n = len(visible.gpus)
    if n != expect_tp:
        return Check("tp-size", False, f"{n} GPUs visible, --expect-tp {expect_tp}")
    return Check("tp-size", True, f"{n} GPUs for tensor parallelism {expect_tp}")


def _check_tp_links(graph: GpuGraph, visible: Visible, allowed: Tier) -> Check:
    pairs = list(itertools.combinations(visible.gpus, 2))
    if not pairs:
        return Check("tp-links", True, "fewer than two GPUs; no pairs")
    needs = "NVLink (NV#)" if allowed is Tier.NVLINK else f"{allowed.words or 'any'} or tighter"
    bad = [(a, b) for a, b in pairs if graph.pair_tier(a, b) > allowed]
    if bad:
        worst = max(bad, key=lambda p: graph.pair_tier(*p))
        a, b = worst
        more = f" (and {len(bad) - 1} more pairs)" if len(bad) > 1 else ""
        return Check(
            "tp-links",
            False,
            f"tensor-parallel pair {visible.name(a)}-{visible.name(b)} is {graph.link(a, b).cell}, "
            f"needs {needs}{more}",
        )
    cells = sorted({graph.link(a, b).cell for a, b in pairs})
    return Check("tp-links", True, f"all {len(pairs)} pairs {'/'.join(cells)}, needs {needs}")


def gpu_locality(graph: GpuGraph, gpus: Iterable[int]) -> tuple[tuple[int, ...], frozenset[int]]:
    """The NUMA nodes of these GPUs, and the CPUs close to them (NVML's CPU affinity)."""
    gpus = tuple(gpus)
    nodes = tuple(sorted({n for g in gpus if (n := graph.gpu(g).numa_node) is not None}))
    return nodes, frozenset().union(*(graph.gpu(g).cpu_affinity for g in gpus))


def _check_numa(graph: GpuGraph, visible: Visible, promise: Promise, cpus: frozenset[int]) -> Check:
    nodes, local = gpu_locality(graph, visible.gpus)
    where = "NUMA node " + ",".join(map(str, nodes)) if nodes else "unknown NUMA nodes"
    if promise.numa_nodes is not None and nodes and nodes != promise.numa_nodes:
        promised = ",".join(map(str, promise.numa_nodes))
        return Check("numa", False, f"GPUs are on {where}, promised NUMA node {promised} ({NUMA_NODE})")
    if not local or not cpus:
        return Check("numa", True, f"GPUs on {where}; CPU affinity unknown, not compared")
    if not cpus & local:
        return Check(
            "numa",
            False,
            f"process CPUs {index_ranges(cpus)} share no NUMA node with the GPUs "
            f"({where}, CPUs {index_ranges(local)})",
        )
    if cpus <= local:
        return Check("numa", True, f"GPUs on {where}; process CPUs {index_ranges(cpus)} on it")
    return Check(
        "numa",
        True,
        f"GPUs on {where}; process may also run on CPUs {index_ranges(cpus - local)} of other nodes "
        "(pin with the numactl prefix)",
    )


def _check_nics(graph: GpuGraph, visible: Visible) -> Check:
    if not graph.nics:
        return Check("nic", True, "no NICs found; not compared")
    nics = {n.name: n for n in graph.nics}
    used = []
    for g in visible.gpus:
        name = graph.shape.best_nic.get(g)
        gpu_numa = graph.gpu(g).numa_node
        if name is None:
            continue
        nic_numa = nics[name].numa_node
        if gpu_numa is not None and nic_numa is not None and nic_numa != gpu_numa:
            return Check(
                "nic",
                False,
                f"nearest NIC {name} of {visible.name(g)} is on NUMA node {nic_numa}, the GPU on {gpu_numa}",
            )
        used.append(name)
    if not used:
        return Check("nic", True, "no NIC near these GPUs; not compared")
    return Check("nic", True, f"nearest NICs {', '.join(sorted(set(used)))} on the GPUs' NUMA node")


def run_checks(
    graph: GpuGraph,
    visible: Visible,
    promise: Promise,
    *,
    cpus: frozenset[int],
    expect_tp: int | None = None,
    allow_pcie: bool = False,
    strict_gpus: bool = False,
) -> Report:
    if not visible.gpus:
        return Report(visible, (Check("gpus", False, "no GPUs visible to this process"),), ())
    checks = [_check_gpus(visible, promise), _check_uuids(graph, visible, promise)]
    same_count = promise.gpus is None or len(promise.gpus) == len(visible.gpus)
    if not strict_gpus and same_count and not all(c.ok for c in checks):
        # Other GPUs than promised, as many: the kubelet's choice stands and gangslice moves the
        # reservation onto it. Whether they serve the pod is what the checks below judge (a set
        # that breaks the in-node rule fails there, and the controller evicts such a pod).
        checks = [c if c.ok else Check(c.name, True, f"{c.detail}; {FOLLOWED}") for c in checks]
        promise = replace(promise, numa_nodes=None)
    if expect_tp is not None:
        checks.append(_check_tp_size(visible, expect_tp))
    checks.append(_check_tp_links(graph, visible, promise.allowed_tier(allow_pcie)))
    checks.append(_check_numa(graph, visible, promise, cpus))
    checks.append(_check_nics(graph, visible))
    return Report(visible, tuple(checks), gpu_locality(graph, visible.gpus)[0])


def render(report: Report) -> str:
    v = report.visible
    lines = [f"{len(v.gpus)} GPUs visible ({v.source}): {_names(v, v.gpus) or 'none'}"]
    lines += [f"  {'ok  ' if c.ok else 'FAIL'}  {c.name:<8}  {c.detail}" for c in report.checks]
    lines.append(f"numactl prefix: {report.numactl or '(NUMA node unknown)'}")
    lines.append("PASS" if report.ok else "FAIL")
    return "\n".join(lines)
