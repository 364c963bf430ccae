"""``gangslice agent`` (the node agent) and ``gangslice preflight`` (inside a workload pod)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import start_http_server

from extender.agent.agent import Agent, AgentConfig, Outcome
from extender.agent.discovery import Discovery, run_command
from extender.agent.fakes import FAKES, fake_name, fake_node
from extender.agent.kubelet_config import DEFAULT_CONFIG as DEFAULT_KUBELET_CONFIG
from extender.agent.kubelet_config import KubeletReader
from extender.agent.podresources import DEFAULT_SOCKET, PodResourcesClient
from extender.agent.preflight import (
    DEFAULT_ANNOTATIONS,
    PreflightError,
    Promise,
    parse_annotations,
    render,
    run_checks,
    visible_gpus,
)
from extender.agent.publish import KubeWriter
from extender.commands.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, UsageError
from extender.kube.names import GPU_RESOURCE, GPUS, NUMA_NODE
from extender.logs import FORMATS, configure
from extender.topology.allocation import Allocation
from extender.topology.model import GpuGraph
from extender.topology.nvml import SYSFS, HealthThresholds, NvmlBackend, PynvmlBackend, discover

_LIMITS = HealthThresholds()

_FAKE_HELP = (
    "FOR DEMOS AND TESTS ONLY: use a built-in fake NVML node instead of the real GPUs "
    f"({', '.join(FAKES)}); its sysfs tree is written to a temporary directory"
)


def register(sub: Any) -> None:
    a = sub.add_parser(
        "agent",
        help="node agent: publish this node's GPU topology, health and GPU use as a NodeTopology",
        description="Discover the GPU graph (NVML, else nvidia-smi topo -m), sample link health, ask the "
        "kubelet PodResources API which GPUs pods hold, and server-side-apply a NodeTopology object "
        "named after the node whenever that changes.",
    )
    a.add_argument("--node", default=os.environ.get("NODE_NAME"), help="node name (default $NODE_NAME)")
    a.add_argument("--interval", type=float, default=30.0, help="seconds between observations (default 30)")
    a.add_argument(
        "--jitter", type=float, default=0.2, help="random +- fraction of each interval (default 0.2)"
    )
    a.add_argument(
        "--resync",
        type=float,
        default=1800.0,
        help="rewrite an unchanged object after this many seconds (1800)",
    )
    a.add_argument(
        "--backoff-cap", type=float, default=300.0, help="longest retry delay after API errors (300)"
    )
    a.add_argument(
        "--allocation",
        default=str(Allocation.DEVICE_PLUGIN),
        choices=[str(a) for a in Allocation],
        help="who picks each pod's GPUs on this node, published as spec.allocation: devicePlugin "
        "(default: the NVIDIA device plugin; gangslice places by the plugin's predicted answer) "
        "or dra (a DRA driver; the ResourceClaim names the GPUs gangslice chose)",
    )
    a.add_argument("--once", action="store_true", help="observe and publish once, then exit")
    a.add_argument("--dry-run", action="store_true", help="print the object as YAML instead of publishing it")
    a.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster credentials)")
    a.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=DEFAULT_SOCKET,
        help=f"kubelet PodResources socket (default {DEFAULT_SOCKET})",
    )
    a.add_argument(
        "--resource", default=GPU_RESOURCE, help=f"extended resource of GPUs (default {GPU_RESOURCE})"
    )
    a.add_argument(
        "--sysfs-root",
        type=Path,
        help=f"where sysfs is mounted (default {SYSFS}); with --nvml-fake, given explicitly, the fake's GPUs "
        "take this machine's CPUs of their NUMA node",
    )
    a.add_argument(
        "--kubelet-config",
        default=str(DEFAULT_KUBELET_CONFIG),
        help="the kubelet's KubeletConfiguration file, mounted read-only, for its Topology Manager, "
        f"CPU and memory manager policies (default {DEFAULT_KUBELET_CONFIG}; empty: do not publish them)",
    )
    a.add_argument(
        "--nvlink-errors-per-s",
        type=float,
        default=_LIMITS.nvlink_errors_per_s,
        help="NVLink CRC/replay/recovery errors per second above which a GPU is unhealthy "
        f"(default {_LIMITS.nvlink_errors_per_s:g})",
    )
    a.add_argument(
        "--pcie-replays-per-s",
        type=float,
        default=_LIMITS.pcie_replays_per_s,
        help=f"PCIe replays per second above which a GPU is unhealthy "
        f"(default {_LIMITS.pcie_replays_per_s:g})",
    )
    a.add_argument("--nvml-fake", choices=sorted(FAKES), help=_FAKE_HELP)
    a.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics (gangslice_agent_publishes_total{result}, "
        "gangslice_agent_discovery_errors_total{source}) on this port, all interfaces, "
        "path /metrics (default 0: off)",
    )
    a.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    a.add_argument(
        "--log-format", default="text", choices=FORMATS, help="text (default) or json: one object per line"
    )
    a.set_defaults(func=run_agent)

    p = sub.add_parser(
        "preflight",
        help="inside a pod: check the visible GPUs against the placement promise; exit 1 on a mismatch",
        description=f"Compare the GPUs this process sees with the pod's {GPUS} and "
        f"{NUMA_NODE} annotations, check tensor-parallel links, NUMA and NIC locality, and "
        "print the numactl prefix that pins a server to its GPUs' NUMA node.",
    )
    p.add_argument(
        "--annotations",
        type=Path,
        default=DEFAULT_ANNOTATIONS,
        help=f"downward-API annotations file (default {DEFAULT_ANNOTATIONS})",
    )
    p.add_argument("--expect-tp", type=int, metavar="N", help="fail unless exactly N GPUs are visible")
    p.add_argument(
        "--allow-pcie",
        action="store_true",
        help="accept PCIe pairs within the promised level (gangslice.io/required-level, default pcie = PXB)",
    )
    p.add_argument(
        "--strict-gpus",
        action="store_true",
        help="fail when the GPUs are not the promised ones, even as many that meet the in-node rule "
        "(default: pass, saying so; gangslice moves the reservation onto them)",
    )
    p.add_argument("--sysfs-root", type=Path, help=argparse.SUPPRESS)
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print only the numactl prefix on success (for $(...) in scripts)",
    )
    p.add_argument(
        "--nvml-fake", choices=sorted(FAKES), help=argparse.SUPPRESS
    )  # tests; or $GANGSLICE_NVML_FAKE
    p.set_defaults(func=run_preflight)

    n = sub.add_parser(
        "pin",
        help="inside a pod: run a command on its GPUs' NUMA CPUs (the numactl line, automatic)",
        description="Set this process's CPU affinity to the CPUs of the visible GPUs' NUMA node(s) "
        "that the container may use, prefer their memory, then exec COMMAND. Where that cannot be "
        "done (no NUMA information, or none of those CPUs in the container's cpuset) COMMAND runs "
        "unpinned, with the reason on stderr.",
    )
    n.add_argument("--sysfs-root", type=Path, help=argparse.SUPPRESS)
    n.add_argument("--nvml-fake", choices=sorted(FAKES), help=argparse.SUPPRESS)  # tests
    n.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    n.set_defaults(func=run_pin)


# --- agent -----------------------------------------------------------------------------


@contextlib.contextmanager
def _discovery(args: argparse.Namespace) -> Iterator[Discovery]:
    thresholds = HealthThresholds(args.nvlink_errors_per_s, args.pcie_replays_per_s)
    if args.nvml_fake:
        with fake_node(args.nvml_fake, machine=args.sysfs_root) as (backend, sysfs):
            yield Discovery(lambda: backend, sysfs_root=sysfs, run=None, thresholds=thresholds)
        return
    discovery = Discovery(
        PynvmlBackend, sysfs_root=args.sysfs_root or SYSFS, run=run_command, thresholds=thresholds
    )
    try:
        yield discovery
    finally:
        discovery.close()


class _PrintWriter:
    """--dry-run without --once: print each object the agent would publish."""

    def node_uid(self, node: str) -> str | None:
        return None

    def publish(self, obj: Mapping[str, Any]) -> None:
        sys.stdout.write("---\n" + _yaml(obj))
        sys.stdout.flush()


def _yaml(obj: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(obj), sort_keys=False, default_flow_style=False)


def run_agent(args: argparse.Namespace) -> int:

    level = str(args.log_level).upper()
    configure(level if level in logging.getLevelNamesMapping() else "INFO", args.log_format)
    try:
        config = AgentConfig(
            node=args.node or "",
            interval_s=args.interval,
            jitter=args.jitter,
            resync_s=args.resync,
            backoff_cap_s=args.backoff_cap,
            allocation=Allocation(args.allocation),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be 0 (off) or a TCP port, got {args.metrics_port}")
    try:
        writer = _PrintWriter() if args.dry_run else KubeWriter.connect(args.kubeconfig)
    except Exception as exc:  # kubernetes.config.ConfigException, unreadable kubeconfig
        print(f"gangslice agent: no Kubernetes credentials: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with (
        _discovery(args) as discovery,
        PodResourcesClient(args.pod_resources_socket, resource=args.resource) as pod_resources,
    ):
        kubelet = (
            KubeletReader(
                Path(args.kubelet_config),
                (discovery.sysfs_root or args.sysfs_root or SYSFS) / "devices" / "system" / "node",
                pod_resources,
            )
            if args.kubelet_config
            else None
        )
        agent = Agent(config, discovery, pod_resources, writer, kubelet=kubelet)
        if args.metrics_port:
            start_http_server(args.metrics_port, registry=agent.metrics.registry)
        if args.once and args.dry_run:
            sys.stdout.write(_yaml(agent.build()))
            return EXIT_OK
        if args.once:
            return EXIT_OK if agent.cycle() is not Outcome.FAILED else EXIT_FAILED
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        agent.run(stop)
    return EXIT_OK


# --- preflight -------------------------------------------------------------------------


def _graph(args: argparse.Namespace) -> GpuGraph:
    name = fake_name(args.nvml_fake)
    if name is not None:
        with fake_node(name, machine=args.sysfs_root) as (fake, sysfs):
            return discover(fake, sysfs_root=sysfs)
    backend: NvmlBackend
    try:
        with PynvmlBackend() as backend:
            return discover(backend, sysfs_root=args.sysfs_root or SYSFS)
    except Exception as exc:  # NvmlUnavailable, TopologyError
        raise PreflightError(f"cannot read the GPUs through NVML: {exc}") from exc


def _promise(path: Path) -> tuple[Promise, str | None]:
    from extender.placement.reading import FileError, read_text

    if not path.exists():
        return Promise(), f"{path} not found (no downward-API annotations volume); promise not checked"
    try:
        text = read_text(path)
    except FileError as exc:
        raise PreflightError(str(exc)) from None
    return Promise.from_annotations(parse_annotations(text)), None


def run_pin(args: argparse.Namespace) -> int:
    from extender.agent.pin import plan, prefer_memory

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("gangslice pin: no command given (gangslice pin -- COMMAND [ARG ...])", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        graph = _graph(args)
        visible = visible_gpus(graph, os.environ)
    except (PreflightError, ValueError) as exc:
        print(f"gangslice pin: {exc}; running unpinned", file=sys.stderr)
    else:
        pinned = plan(graph, visible, os.sched_getaffinity(0))
        print(f"gangslice pin: {pinned.note}", file=sys.stderr)
        if pinned.cpus:
            os.sched_setaffinity(0, pinned.cpus)
            why = prefer_memory(pinned.numa_nodes)
            if why:
                print(f"gangslice pin: {why}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"gangslice pin: cannot run {command[0]}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK  # not reached: exec replaced the process


def run_preflight(args: argparse.Namespace) -> int:
    try:
        promise, note = _promise(args.annotations)
        graph = _graph(args)
        visible = visible_gpus(graph, os.environ)
    except (PreflightError, ValueError) as exc:
        print(f"gangslice preflight: cannot check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = run_checks(
        graph,
        visible,
        promise,
        cpus=frozenset(os.sched_getaffinity(0)),
        expect_tp=args.expect_tp,
        allow_pcie=args.allow_pcie,
        strict_gpus=args.strict_gpus,
    )
    if args.quiet:
        if report.ok and report.numactl:
            print(report.numactl)
    else:
        if note:
            print(f"note: {note}")
        print(render(report))
    if not report.ok:
        print(f"gangslice preflight: FAIL: {report.reason}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
