"""``gangslice serve`` (the scheduler extender service) and ``gangslice bench extender``."""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extender.bench.extender import TARGET_RPS
from extender.bench.placement import bench_subparsers
from extender.commands.exits import EXIT_OK, UsageError
from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.migration.reporter import Migration
from extender.controllers.mismatch.reporter import OnMismatch
from extender.controllers.podgroups.controller import PodGroupConfig
from extender.httpapi.checks import DEFAULT_SCHEDULERS, DEFAULT_VOLCANO_SCHEDULERS, Schedulers
from extender.httpapi.limits import Limits
from extender.kube.names import WEBHOOK_CONFIGURATION
from extender.logs import FORMATS, configure
from extender.placement.ledger import DEFAULT_TTL_S
from extender.placement.migration import AFTER_S as MIGRATE_AFTER_S
from extender.placement.waiting import KeepCliques


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the scheduler extender (kube-scheduler extender v1 and Volcano extender plugin)"
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--cluster", metavar="FILE", help="serve a cluster file (YAML); no API server")
    source.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig of the cluster (default: in-cluster, then ~/.kube/config)",
    )
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8888, help="port (default 8888)")
    p.add_argument("--prefix", default="/gangslice", help="URL prefix of the verbs (default /gangslice)")
    p.add_argument(
        "--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (reloaded on change)"
    )
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="also serve /metrics on this port for tokens the API server grants get /metrics "
        "(TokenReview + SubjectAccessReview; HTTPS with --tls-cert; default 0: off)",
    )
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="mutual TLS: the verbs need a client certificate chained to this CA (health stays open)",
    )
    p.add_argument(
        "--tls-client-names",
        metavar="NAME,...",
        help="with --tls-client-ca: the client certificate must name one of these (subject CN or DNS SAN)",
    )
    p.add_argument(
        "--admission-client-names",
        metavar="NAME,...",
        help="with --tls-client-ca: the admission webhook (/admission/pods) needs a client certificate "
        "chained to that CA naming one of these: the one kube-apiserver presents when its "
        "AdmissionConfiguration's kubeConfigFile gives it one (docs/install.md)",
    )
    p.add_argument(
        "--webhook-ca-bundle",
        metavar="FILE",
        help="with --kubeconfig: keep the caBundle of --webhook-configuration's entries that call "
        "gangslice equal to this CA (the one that signed --tls-cert; not needed with cert-manager's "
        "CA injector)",
    )
    p.add_argument(
        "--webhook-configuration",
        default=WEBHOOK_CONFIGURATION,
        metavar="NAME",
        help=f"the MutatingWebhookConfiguration of the DRA pinning webhook (default {WEBHOOK_CONFIGURATION})",
    )
    p.add_argument(
        "--volcano-port",
        type=int,
        metavar="PORT",
        help="serve the Volcano verbs on this port only (no client certificate asked: restrict it "
        "with a NetworkPolicy); default: on --port",
    )
    p.add_argument(
        "--scheduler-name",
        dest="scheduler_names",
        action="append",
        metavar="NAME",
        help="decide for and bind only pods naming this scheduler (repeatable; default gangslice-scheduler)",
    )
    p.add_argument(
        "--volcano-scheduler-name",
        dest="volcano_scheduler_names",
        action="append",
        metavar="NAME",
        help="the Volcano verbs allocate only pods naming this scheduler (repeatable; default volcano)",
    )
    p.add_argument(
        "--reservation-ttl",
        type=float,
        default=DEFAULT_TTL_S,
        metavar="SECONDS",
        help=f"how long a slice is held for pods that have not bound (default {DEFAULT_TTL_S:g})",
    )
    p.add_argument(
        "--on-mismatch",
        choices=[o.value for o in OnMismatch],
        default=OnMismatch.EVICT_INCOHERENT.value,
        help="a pod the kubelet gave other GPUs than promised: report it (Event, DevicesMismatch "
        "condition, metric; its slot follows the kubelet), and evict it to be placed again "
        "(pods/eviction, which honours its PodDisruptionBudget) never, only when its GPUs break "
        "its pod set's in-node rule (default: such a pod would crash-loop on its preflight "
        "holding them), or always",
    )
    p.add_argument(
        "--migration",
        choices=[m.value for m in Migration],
        default=Migration.REPORT.value,
        help="for a gang of 8 or more GPUs that waited --migrate-after seconds: find the domain "
        "cheapest to drain by moving running pods labelled gangslice.io/movable=true (owned by a "
        "ReplicaSet or other controller, at most 4 GPUs each) to hardware at least as fast, and "
        "report the plan (Event MigrationPlanned on the gang's Workload, PodGroup or pod, log, "
        "metrics; default), carry "
        "it out (on: hold the gang's slice and the new slots, then evict through pods/eviction, "
        "PodDisruptionBudgets honoured), or do nothing (off)",
    )
    p.add_argument(
        "--migrate-after",
        type=float,
        default=MIGRATE_AFTER_S,
        metavar="SECONDS",
        help=f"how long a gang waits before a migration plan is looked for (default {MIGRATE_AFTER_S:g})",
    )
    p.add_argument(
        "--imex-daemon-requests",
        metavar="cpu=Q,memory=Q",
        help="what NVIDIA's IMEX daemon pod requests on each node of a ComputeDomain (the DRA "
        "driver's controller.containers.computeDomain.resources; default none): placement keeps "
        "room for it, and its pod slot, next to a gang's pods on multi-node NVLink nodes",
    )
    p.add_argument(
        "--keep-cliques",
        choices=[k.value for k in KeepCliques],
        default=KeepCliques.WHILE_WAITING.value,
        help="when to keep whole multi-node NVLink cliques (GB200 NVL72 racks) for gangs that ask "
        "for one: while such a gang waits (default: the whole rack with the most free GPUs, one at "
        "a time; with none waiting, small replicas may use a rack like any other GPUs), or always "
        "(every rack stays whole for the next such gang, idle until one comes unless nothing else "
        "fits)",
    )
    p.add_argument(
        "--no-controller",
        action="store_true",
        help="with --kubeconfig: run only the extender, without the admission controller and leader lease",
    )
    add_wait_flags(p)
    add_limit_flags(p)
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="how much to log (default info)",
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text (default) or json: one object per line with the gang and reservation as fields",
    )
    p.set_defaults(func=run_serve)

    b: argparse.ArgumentParser = bench_subparsers(sub).add_parser(
        "extender", help="latency and throughput of the extender's filter and prioritize over loopback"
    )
    b.add_argument("--nodes", type=int, default=5000, help="node names per request (default 5000)")
    b.add_argument("--full-nodes", type=int, default=500, help="full Node objects per request (default 500)")
    b.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    b.add_argument("--requests", type=int, default=2000, help="timed requests per case (default 2000)")
    b.add_argument("--gpus", type=int, default=4, help="GPUs the benchmark pod asks for (default 4)")
    b.add_argument(
        "--rate",
        type=float,
        default=TARGET_RPS,
        help=f"requests per second of the open-loop case (default {TARGET_RPS:g})",
    )
    b.add_argument(
        "--same-process",
        action="store_true",
        help="run the load generator on the server's event loop instead of in a separate process",
    )
    b.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    b.add_argument(
        "--hostile",
        action="store_true",
        help="instead: a bounded hostile load on `gangslice serve` processes (RSS, /healthz, "
        "replies, idle clients locking the scheduler out, a body flood, forged calls per listener)",
    )
    b.add_argument(
        "--bin-dir",
        metavar="DIR",
        help="with --hostile: also load the metrics port and the OpenShift install's verbs, which "
        "ask a real kube-apiserver: etcd and kube-apiserver from DIR (hack/e2e/build.sh builds them)",
    )
    b.set_defaults(func=run_bench)


#: The admission controller's waits: flag, CheckConfig field, help. Every one is in seconds.
_WAITS = (
    (
        "--widen-after",
        "widen_after_s",
        "Kueue: how long a pod set waits for its preferred level before it is placed within its "
        "required level, counted from the quota reservation",
    ),
    (
        "--retry-after",
        "retry_after_s",
        "Kueue: how much longer a Workload waits for a slice before the check goes to Retry "
        "and Kueue releases its quota",
    ),
    ("--requeue-after", "requeue_after_s", "Kueue: the Retry's requeueAfterSeconds (whole seconds)"),
    ("--resync", "resync_s", "how often Workloads and PodGroups still waiting are looked at again"),
    ("--hold-ttl", "hold_ttl_s", "how long a slice the controller reserves is held before its pods bind"),
    ("--member-wait", "member_wait_s", "how long the members of a joint gang wait for the missing ones"),
)


def add_wait_flags(p: argparse.ArgumentParser) -> None:
    defaults = CheckConfig()
    group = p.add_argument_group("admission controller waits (with --kubeconfig, without --no-controller)")
    for flag, field, help_text in _WAITS:
        default = getattr(defaults, field)
        group.add_argument(
            flag,
            dest=field,
            type=int if isinstance(default, int) else float,
            default=default,
            metavar="SECONDS",
            help=f"{help_text} (default {default:g})",
        )


#: The flags of :class:`~extender.httpapi.limits.Limits`: (flag, field, unit, what it bounds).
_LIMITS = (
    ("--max-body-bytes", "max_body_bytes", "BYTES", "largest request body of a node-list verb"),
    ("--small-body-bytes", "small_body_bytes", "BYTES", "largest request body of any other path"),
    ("--header-timeout", "header_timeout_s", "SECONDS", "from a request's first byte to its whole head"),
    ("--body-timeout", "body_timeout_s", "SECONDS", "from a request's head to the end of its body"),
    ("--idle-timeout", "idle_timeout_s", "SECONDS", "before an idle connection is closed"),
    (
        "--handshake-timeout",
        "handshake_timeout_s",
        "SECONDS",
        "from a connection's start to the end of its TLS handshake",
    ),
    (
        "--unauthenticated-idle-timeout",
        "unauthenticated_idle_timeout_s",
        "SECONDS",
        "before an idle connection without a client certificate is closed",
    ),
    ("--max-connections", "max_connections", "N", "open connections at most; beyond, a new one gets 429"),
    (
        "--reserved-connections",
        "reserved_connections",
        "N",
        "of --max-connections, those kept for peers with a client certificate",
    ),
    (
        "--max-connections-per-peer",
        "max_connections_per_peer",
        "N",
        "open connections at most from one address without a client certificate",
    ),
)


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    d = Limits()
    group = p.add_argument_group("bounds on what one client can make the extender hold")
    for flag, field, unit, what in _LIMITS:
        default = getattr(d, field)
        shown = "a quarter" if default is None else f"{default:g}" if unit == "SECONDS" else str(default)
        group.add_argument(
            flag,
            dest=field,
            type=float if unit == "SECONDS" else int,
            default=default,
            metavar=unit,
            help=f"{what} (default {shown})",
        )


def serve_limits(args: argparse.Namespace) -> Limits:
    limits = Limits(**{field: getattr(args, field) for _, field, _, _ in _LIMITS})
    problems = limits.problems()
    if problems:
        raise UsageError("; ".join(problems))
    return limits


def controller_configs(args: argparse.Namespace) -> tuple[CheckConfig, PodGroupConfig]:
    """The Kueue check's and the PodGroup controller's configuration from the ``serve`` flags."""

    for flag, field, _ in _WAITS:
        value = getattr(args, field)
        if not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} {value:g}: must be a positive number of seconds")
    check = CheckConfig(
        widen_after_s=args.widen_after_s,
        retry_after_s=args.retry_after_s,
        requeue_after_s=args.requeue_after_s,
        resync_s=args.resync_s,
        hold_ttl_s=args.hold_ttl_s,
        member_wait_s=args.member_wait_s,
    )
    podgroups = PodGroupConfig(
        hold_ttl_s=args.hold_ttl_s, member_wait_s=args.member_wait_s, resync_s=args.resync_s
    )
    return check, podgroups


def _check_tls_files(cert: str, key: str, client_ca: str | None) -> None:
    """The certificate, its key and the client CA load, or a one-line usage error says which
    does not (OpenSSL's own words are terse: "PEM lib")."""
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError:
        raise UsageError(
            f"--tls-cert {cert}, --tls-key {key}: not a PEM certificate and its private key"
        ) from None
    except OSError as exc:
        raise UsageError(f"--tls-cert {cert}, --tls-key {key}: cannot read: {exc.strerror or exc}") from None
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except ssl.SSLError:
            raise UsageError(f"--tls-client-ca {client_ca}: not PEM certificates") from None
        except OSError as exc:
            raise UsageError(f"--tls-client-ca {client_ca}: cannot read: {exc.strerror or exc}") from None


def run_serve(args: argparse.Namespace) -> int:
    from extender.httpapi.server import ServeOptions, serve
    from extender.kube import compute_domains as cds
    from extender.placement.files import FileError
    from extender.reservations import ClusterCache
    from extender.reservations.store import KubeReservationStore

    configure(args.log_level, args.log_format)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: not a port number")
    if args.volcano_port is not None and (
        not 0 < args.volcano_port < 65536 or args.volcano_port == args.port
    ):
        raise UsageError(f"--volcano-port {args.volcano_port}: not a port number other than --port")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    if args.tls_client_names and not args.tls_client_ca:
        raise UsageError("--tls-client-names needs --tls-client-ca")
    if args.admission_client_names and not args.tls_client_ca:
        raise UsageError("--admission-client-names needs --tls-client-ca")
    if args.webhook_ca_bundle:
        from extender.controllers.webhook_ca.sync import CaBundleError, read_ca

        if args.cluster or not args.tls_cert:
            raise UsageError("--webhook-ca-bundle needs --tls-cert and an API server (not --cluster)")
        try:
            read_ca(args.webhook_ca_bundle)
        except CaBundleError as exc:
            raise UsageError(f"--webhook-ca-bundle {exc}") from None
    if args.tls_cert:
        _check_tls_files(args.tls_cert, args.tls_key, args.tls_client_ca)
    client_names = frozenset(n.strip() for n in (args.tls_client_names or "").split(",") if n.strip())
    admission_names = frozenset(
        n.strip() for n in (args.admission_client_names or "").split(",") if n.strip()
    )
    if args.reservation_ttl <= 0:
        raise UsageError("--reservation-ttl must be positive")
    if not (args.migrate_after >= 0 and math.isfinite(args.migrate_after)):
        raise UsageError(f"--migrate-after {args.migrate_after:g}: not a number of seconds")
    if args.metrics_port and not (0 < args.metrics_port < 65536 and args.metrics_port != args.port):
        raise UsageError(f"--metrics-port {args.metrics_port}: not a port number other than --port")
    if args.metrics_port and args.cluster:
        raise UsageError("--metrics-port reviews tokens with the API server: not with --cluster")
    try:
        daemon = cds.daemon_requests(args.imex_daemon_requests or "")
    except ValueError as exc:
        raise UsageError(f"--imex-daemon-requests: {exc}") from None
    check_config, podgroup_config = controller_configs(args)
    options = ServeOptions(
        args.host,
        args.port,
        args.prefix,
        args.tls_cert,
        args.tls_key,
        limits=serve_limits(args),
        schedulers=Schedulers.of(
            args.scheduler_names or DEFAULT_SCHEDULERS,
            args.volcano_scheduler_names or DEFAULT_VOLCANO_SCHEDULERS,
        ),
        tls_client_ca=args.tls_client_ca,
        tls_client_names=client_names,
        admission_client_names=admission_names,
        volcano_port=args.volcano_port,
        metrics_port=args.metrics_port,
    )
    from extender.controllers.housekeeping import Housekeeping
    from extender.controllers.runner import run_controller

    if args.cluster:
        try:
            cache = ClusterCache.from_cluster_file(
                args.cluster, ttl_s=args.reservation_ttl, keep_cliques=KeepCliques(args.keep_cliques)
            )
        except FileError as exc:
            raise UsageError(str(exc)) from None
        alone = Housekeeping(cache)

        async def housekeeping_only(stop: asyncio.Event, on_leadership: Callable[[bool], None]) -> None:
            await run_controller(cache, stop=stop, housekeeping=alone, elect=False)

        asyncio.run(serve(cache, options, controller=housekeeping_only, elects=False))
        return EXIT_OK
    from extender.controllers.claims.make import PodClaims
    from extender.controllers.claims.sync import SlotClaimSync
    from extender.controllers.migration.reporter import MigrationReporter
    from extender.controllers.mismatch.reporter import MismatchReporter
    from extender.controllers.pods import PodFeed
    from extender.controllers.topology_status.reporter import KubeTopologyStatusApi, TopologyStatusReporter
    from extender.kube.api import Kind
    from extender.kube.client import ApiServerClient
    from extender.kube.watch import Watcher

    try:
        api = ApiServerClient.connect(args.kubeconfig)
    except Exception as exc:
        raise UsageError(f"cannot load Kubernetes configuration: {exc}") from None
    cache = ClusterCache(
        ttl_s=args.reservation_ttl,
        store=KubeReservationStore(api),
        imex_daemon=daemon,
        keep_cliques=KeepCliques(args.keep_cliques),
    )
    webhook_ca = None
    if args.webhook_ca_bundle:
        from extender.controllers.webhook_ca.sync import WebhookCa

        webhook_ca = WebhookCa(api, args.webhook_configuration, args.webhook_ca_bundle)
    housekeeping = Housekeeping(
        cache,
        topology_status=TopologyStatusReporter(KubeTopologyStatusApi(api)),
        mismatches=MismatchReporter(api, OnMismatch(args.on_mismatch)),
        claims=SlotClaimSync(api, cache.clock),
        pod_claims=PodClaims(api, cache, cache.book.fence.decides),
        webhook_ca=webhook_ca,
        migration=MigrationReporter(api, Migration(args.migration), args.migrate_after),
    )
    reviewer = None
    if args.metrics_port:
        from extender.httpapi.secure_metrics import ApiReviewer

        reviewer = ApiReviewer(api)
    elects = not args.no_controller
    watcher = Watcher(api, cache)
    # The controllers react to pods through the cache's own watch; registered before the
    # watch starts, so the first list reaches them too.
    pods = PodFeed()
    watcher.listen(Kind.PODS, pods.tell)

    async def controller(stop: asyncio.Event, on_leadership: Callable[[bool], None]) -> None:
        await run_controller(
            cache,
            api=api,
            api_client=api.api_client,
            stop=stop,
            on_leadership=on_leadership,
            config=check_config,
            podgroup_config=podgroup_config,
            housekeeping=housekeeping,
            pods=pods,
            elect=elects,
        )

    asyncio.run(serve(cache, options, api, controller, reviewer, elects=elects, watcher=watcher))
    return EXIT_OK


def run_bench(args: argparse.Namespace) -> int:
    from extender.bench.extender import BenchOptions, render, run_extender_bench, to_json

    if args.hostile:
        from extender.bench.hostile import run_hostile

        figures = asyncio.run(run_hostile())
        on_api = None
        if args.bin_dir:
            from extender.bench.hostile_api import run_hostile_api

            on_api = run_hostile_api(Path(args.bin_dir))
        if args.json:
            import json

            out = figures.to_json() | {
                "metrics_port": on_api[0].to_json() if on_api else None,
                "volcano_port": on_api[1].to_json() if on_api else None,
                "openshift": on_api[2].to_json() if on_api else None,
            }
            print(json.dumps(out, indent=2))
        else:
            print(figures.render())
            for part in on_api or ():
                print(part.render())
            if on_api is None:
                print(
                    "metrics port and OpenShift install: not loaded (they need a kube-apiserver: "
                    "--bin-dir DIR)"
                )
        return EXIT_OK if not figures.crashed else 1

    if min(args.nodes, args.full_nodes, args.concurrency, args.requests, args.gpus, args.rate) <= 0:
        raise UsageError("--nodes, --full-nodes, --concurrency, --requests, --gpus and --rate must be > 0")
    options = BenchOptions(
        args.nodes, args.full_nodes, args.concurrency, args.requests, args.gpus, args.rate, args.same_process
    )
    results = asyncio.run(run_extender_bench(options))
    if args.json:
        import json

        print(json.dumps(to_json(options, results), indent=2))
    else:
        print(render(options, results))
    return EXIT_OK
