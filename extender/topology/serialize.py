"""A GPU graph as plain data (camelCase keys): the ``spec`` of a ``NodeTopology`` object.

Shape::

    gpus:    [{index, uuid?, pciBusId?, numaNode?, cpuAffinity? ("0-47,96-143"), name?}]
    links:   [{a, b, link}]          # link is the nvidia-smi cell text: NV18, PIX, PXB, PHB, NODE, SYS
    nics:    [{name, numaNode?, gpuLinks: {"<gpu index>": "PIX"}}]
    clique:  {clusterUuid, cliqueId}  # optional, multi-node NVLink
    health:  [{index, healthy, reason?, nvlinkErrorsPerSecond?, pcieReplaysPerSecond?}]
    nvlinkGbps, pcieGbps, model       # optional
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from extender.topology.model import (
    FabricClique,
    Gpu,
    GpuGraph,
    GpuHealth,
    Link,
    Nic,
    PcieLevel,
    TopologyError,
)


def index_ranges(indices: Iterable[int]) -> str:
    """CPU or GPU indices as runs: ``{0,1,2,5}`` -> ``"0-2,5"``; ``""`` for none."""
    out: list[list[int]] = []
    for c in sorted(indices):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in out)


def parse_cpu_ranges(text: str) -> frozenset[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise TopologyError(f"cpuAffinity: expected ranges like 0-47,96-143, got {text!r}")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def graph_to_dict(g: GpuGraph) -> dict[str, Any]:
    d: dict[str, Any] = {
        "gpus": [
            {
                k: v
                for k, v in {
                    "index": x.index,
                    "uuid": x.uuid,
                    "pciBusId": x.pci_bus_id,
                    "numaNode": x.numa_node,
                    "cpuAffinity": index_ranges(x.cpu_affinity) or None,
                    "name": x.name,
                }.items()
                if v is not None
            }
            for x in g.gpus
        ],
        "links": [{"a": a, "b": b, "link": lk.cell} for (a, b), lk in sorted(g.links.items())],
        "nics": [
            {
                "name": n.name,
                **({"numaNode": n.numa_node} if n.numa_node is not None else {}),
                "gpuLinks": {str(i): lvl.name for i, lvl in sorted(n.gpu_links.items())},
            }
            for n in g.nics
        ],
        "health": [
            {
                "index": i,
                "healthy": h.healthy,
                "nvlinkErrorsPerSecond": h.nvlink_errors_per_s,
                "pcieReplaysPerSecond": h.pcie_replays_per_s,
                **({"reason": h.reason} if h.reason else {}),
            }
            for i, h in sorted(g.health.items())
        ],
        "nvlinkGbps": g.nvlink_gbps,
        "pcieGbps": g.pcie_gbps,
    }
    if g.clique is not None:
        d["clique"] = {"clusterUuid": g.clique.cluster_uuid, "cliqueId": g.clique.clique_id}
    if g.model:
        d["model"] = g.model
    return d


def _field(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise TopologyError(f"{where}: missing field {key}")
    return d[key]


def graph_from_dict(d: Mapping[str, Any], where: str = "gpu graph") -> GpuGraph:
    """The inverse of :func:`graph_to_dict`; any malformed field raises TopologyError naming it."""
    try:
        gpus = tuple(
            Gpu(
                index=int(_field(x, "index", f"{where}: gpus[{i}]")),
                uuid=x.get("uuid"),
                pci_bus_id=x.get("pciBusId"),
                numa_node=None if x.get("numaNode") is None else int(x["numaNode"]),
                cpu_affinity=parse_cpu_ranges(str(x.get("cpuAffinity") or "")),
                name=x.get("name"),
            )
            for i, x in enumerate(_field(d, "gpus", where))
        )
        links: dict[tuple[int, int], Link] = {}
        for i, lk in enumerate(d.get("links") or ()):
            a, b = int(_field(lk, "a", f"{where}: links[{i}]")), int(_field(lk, "b", f"{where}: links[{i}]"))
            try:
                links[(min(a, b), max(a, b))] = Link.parse(str(_field(lk, "link", f"{where}: links[{i}]")))
            except KeyError:
                raise TopologyError(f"{where}: links[{i}].link: unknown link {lk.get('link')!r}") from None
        nics = tuple(
            Nic(
                name=str(_field(n, "name", f"{where}: nics[{i}]")),
                numa_node=None if n.get("numaNode") is None else int(n["numaNode"]),
                gpu_links={int(k): PcieLevel.parse(str(v)) for k, v in (n.get("gpuLinks") or {}).items()},
            )
            for i, n in enumerate(d.get("nics") or ())
        )
        health = {
            int(h["index"]): GpuHealth(
                nvlink_errors_per_s=float(h.get("nvlinkErrorsPerSecond", 0.0)),
                pcie_replays_per_s=float(h.get("pcieReplaysPerSecond", 0.0)),
                healthy=bool(h.get("healthy", True)),
                reason=h.get("reason"),
            )
            for h in d.get("health") or ()
        }
        clique = None
        if d.get("clique"):
            c = d["clique"]
            clique = FabricClique(str(c["clusterUuid"]), int(c["cliqueId"]))
        return GpuGraph(
            gpus=gpus,
            links=links,
            nics=nics,
            clique=clique,
            health=health,
            nvlink_gbps=float(d.get("nvlinkGbps", 50.0)),
            pcie_gbps=float(d.get("pcieGbps", 64.0)),
            model=d.get("model"),
        )
    except TopologyError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise TopologyError(f"{where}: malformed: {exc}") from None
