"""``gangslice topo`` (parse / presets) and ``gangslice cost``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from extender import cost
from extender.commands.exits import EXIT_BAD_INPUT, EXIT_OK
from extender.topology.model import GpuGraph, TopologyError
from extender.topology.serialize import index_ranges


def register(sub: Any) -> None:
    topo = sub.add_parser("topo", help="parse or list GPU topologies")
    tsub = topo.add_subparsers(dest="topo_command", metavar="ACTION", required=True)
    parse = tsub.add_parser("parse", help="parse `nvidia-smi topo -m` output (a file, or - for stdin)")
    parse.add_argument("file", metavar="FILE", help="a file of `nvidia-smi topo -m` output, or - for stdin")
    parse.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    parse.set_defaults(func=run_parse)
    presets = tsub.add_parser("presets", help="list the built-in node presets")
    presets.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    presets.set_defaults(func=run_presets)

    c = sub.add_parser("cost", help="per-layer tensor-parallel communication time for one link class")
    c.add_argument("--hidden", type=int, default=8192, help="hidden size (default 8192)")
    c.add_argument("--tokens", type=int, default=128, help="tokens per step (default 128)")
    c.add_argument("--bytes", type=int, default=2, help="bytes per element (default 2, bf16)")
    c.add_argument("--tp", type=int, required=True, help="tensor-parallel degree (GPUs in the ring)")
    c.add_argument("--link", default="nvlink", help=f"link class: {', '.join(cost.LINK_CLASSES)}")
    c.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    c.set_defaults(func=run_cost)


def graph_json(g: GpuGraph) -> dict[str, Any]:
    shape = g.shape
    idx = g.indices
    return {
        "gpus": [
            {
                "index": x.index,
                "numaNode": x.numa_node,
                "uuid": x.uuid,
                "pciBusId": x.pci_bus_id,
                "cpuAffinity": index_ranges(x.cpu_affinity),
                "nic": shape.best_nic.get(x.index),
            }
            for x in g.gpus
        ],
        "pairs": [
            {"a": a, "b": b, "link": g.link(a, b).cell, "tier": g.pair_tier(a, b).name.lower()}
            for i, a in enumerate(idx)
            for b in idx[i + 1 :]
        ],
        "nvlinkIslands": [sorted(s) for s in shape.nvlink_islands],
        "pcieSwitchGroups": [sorted(s) for s in shape.pcie_switch_groups],
        "pcieTreeGroups": [sorted(s) for s in shape.pcie_tree_groups],
        "numaGroups": {str(k): sorted(v) for k, v in shape.numa_groups.items()},
        "nics": [{"name": n.name, "numaNode": n.numa_node} for n in g.nics],
        "clique": g.clique.label if g.clique else None,
    }


def render_graph(g: GpuGraph) -> str:
    d = graph_json(g)
    lines = [f"{len(d['gpus'])} GPUs" + (f", {g.model}" if g.model else "")]
    for x in d["gpus"]:
        numa = x["numaNode"] if x["numaNode"] is not None else "-"
        lines.append(
            f"  GPU{x['index']}: NUMA {numa}, CPUs {x['cpuAffinity'] or '-'}, nearest NIC {x['nic'] or '-'}"
        )
    lines.append(f"NVLink islands: {d['nvlinkIslands'] or 'none'}")
    lines.append(f"PCIe switch groups (PIX): {d['pcieSwitchGroups'] or 'none'}")
    lines.append(f"PCIe tree groups (PXB): {d['pcieTreeGroups'] or 'none'}")
    lines.append(f"NUMA groups: {d['numaGroups'] or 'unknown'}")
    lines.append(f"NICs: {', '.join(n['name'] for n in d['nics']) or 'none'}")
    return "\n".join(lines)


def run_parse(args: argparse.Namespace) -> int:
    from extender.placement.reading import FileError, read_stream, read_text
    from extender.topology.nvidia_smi import parse_topo

    source = "<stdin>" if args.file == "-" else args.file
    try:
        text = read_stream(sys.stdin, source) if args.file == "-" else read_text(args.file)
        try:
            graph = parse_topo(text, source=source)
        except TopologyError as exc:
            raise FileError(str(exc)) from None  # one line, whatever the file's name holds
    except FileError as exc:
        print(f"gangslice topo parse: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(graph_json(graph), indent=2) if args.json else render_graph(graph))
    return EXIT_OK


def run_presets(args: argparse.Namespace) -> int:
    from extender.topology.presets import PRESETS, preset_graph

    rows = []
    for name, p in sorted(PRESETS.items()):
        g = preset_graph(name)
        rows.append(
            {
                "name": name,
                "gpus": len(g.gpus),
                "nvlinkIslands": [sorted(s) for s in g.shape.nvlink_islands],
                "description": p.description,
                "source": p.source,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['name']:<20} {r['gpus']} GPUs  {r['description']}")
    return EXIT_OK


def run_cost(args: argparse.Namespace) -> int:
    try:
        gbps = cost.link_class_gbps(args.link)
    except ValueError as exc:
        print(f"gangslice cost: --link: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.tp < 1 or args.hidden < 1 or args.tokens < 1 or args.bytes < 1:
        print("gangslice cost: --tp, --hidden, --tokens and --bytes must be positive", file=sys.stderr)
        return EXIT_BAD_INPUT
    dims = cost.ModelDims(hidden_size=args.hidden, bytes_per_element=args.bytes, tokens=args.tokens)
    alpha = cost.alpha_for_gbps(gbps, crosses_nodes=args.link == "ib")
    micros = cost.tp_layer_us(args.tp, dims, gbps, alpha)
    out = {
        "link": args.link,
        "bottleneckGbps": gbps,
        "tp": args.tp,
        "perLayerMicros": round(micros, 3),
        "messageBytes": dims.activation_bytes,
        "alphaMicros": alpha,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"TP={args.tp} over {args.link} ({gbps:g} GB/s bottleneck): {micros:.2f} us/layer "
            f"(2 all-reduces of {dims.activation_bytes / 1e6:.2f} MB, alpha {alpha:g} us each)"
        )
    return EXIT_OK
