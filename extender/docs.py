"""The configuration reference (docs/reference.md), generated from the code so it cannot drift.

``python -m extender.docs --output docs/reference.md`` (``make reference``) writes it;
``--check`` fails when the file differs from what the code says. It covers every subcommand
and flag (walked from :func:`extender.cli.build_parser`), every label and annotation the
code reads or writes (the constants themselves, imported from the modules that define
them), the topology levels, communication patterns, API names and metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Modules whose upper-case string constants may name a label or annotation; the reference's
#: "defined in" column lists every one that defines a key.
CONSTANT_MODULES = (
    "extender.kube.names",
    "extender.topology.hierarchy",
    "extender.placement.feasibility",
)


@dataclass(frozen=True, slots=True)
class Key:
    """One label or annotation: where it lives, who reads or writes it, what it means.
    ``constant`` is ``module:NAME``; the key itself is read from there. ``literal:KEY`` is
    for a key the code spells out inline (tests/unit/test_reference.py keeps it honest)."""

    constant: str
    kind: str
    on: str
    use: str
    meaning: str

    @property
    def key(self) -> str:
        if self.constant.startswith("literal:"):
            return self.constant.removeprefix("literal:")
        module, _, name = self.constant.partition(":")
        value = getattr(importlib.import_module(module), name)
        assert isinstance(value, str), self.constant
        return value


NAMES = "extender.kube.names"

#: What users set on their pods and pod templates.
USER_KEYS = (
    Key(
        f"{NAMES}:GANG",
        "label",
        "Pod",
        "read by the extender",
        "The plain gang the pod belongs to; the gang key is `<namespace>/<value>`. Every object "
        "whose pods carry the same value forms one gang.",
    ),
    Key(
        f"{NAMES}:GANG_SIZE",
        "annotation",
        "Pod",
        "read by the extender",
        "How many pods the plain gang has (over all its objects), for pods no ReplicaSet or "
        "StatefulSet owns (bare pods, Jobs). With it, the first pod the scheduler sees makes "
        "gangslice reserve the whole gang; without it (and without an owner) the pod waits. "
        "Pods of Deployments and StatefulSets need no size: their owners' replicas give it, "
        "and this annotation is not read.",
    ),
    Key(
        f"{NAMES}:REQUIRED_LEVEL",
        "annotation (or label)",
        "Pod, pod template",
        "read by the extender, the admission check and `gangslice preflight`",
        "The level the pods (of a pod set) must share: a network level, `node`, or an "
        "in-node level (see Levels).",
    ),
    Key(
        f"{NAMES}:PREFERRED_LEVEL",
        "annotation (or label)",
        "Pod, pod template",
        "read by the extender and the admission check",
        "A tighter level to prefer; the admission check waits for it for a while, then widens.",
    ),
    Key(
        f"{NAMES}:COMM",
        "annotation (or label)",
        "Pod, pod template",
        "read by the extender and the admission check",
        "How the pods of the pod set talk (see Communication patterns); it weighs the cost model.",
    ),
    Key(
        f"{NAMES}:GANG_MEMBERS",
        "annotation",
        "Workload, PodGroup",
        "read by the controller",
        "How many objects (members) carry the same `gangslice.io/gang` label and form one joint "
        "gang (prefill + decode): nothing is placed until all are present, then all are placed "
        "as one gang. At least 2. Members are all Workloads or all PodGroups; plain gang pods "
        "with one `gangslice.io/gang` are one gang already (its pod sets: `pod-set-size`).",
    ),
    Key(
        f"{NAMES}:POD_SET",
        "label (or annotation)",
        "Pod",
        "read by the extender",
        "Which pod set of the gang the pod is; it takes a slot of that pod set.",
    ),
    Key(
        f"{NAMES}:POD_SET_SIZE",
        "annotation",
        "Pod (plain gang)",
        "read by the extender",
        "How many pods the pod's pod set has, in a plain gang of several pod sets (prefill + "
        "decode, a leader + workers); the sizes add up to `gang-size`. The gang is placed once a "
        "pod of every pod set has been seen, each pod set shaped like the first pod seen of it. "
        "Not read for pods a ReplicaSet or StatefulSet owns (their replicas size the pod set).",
    ),
    Key(
        f"{NAMES}:COLOCATE_WITH",
        "annotation",
        "pod template (Kueue), Pod (plain gang)",
        "read by the admission check and the extender",
        "`<pod set>` or `<pod set>@<level>`: keep this pod set in one domain of that level with "
        "the named pod set of the same Workload or plain gang (level defaults to `node`); on a "
        "member of a joint gang, `<member or pod set>[@level]` names another member.",
    ),
    Key(
        f"{NAMES}:MOVABLE",
        "label",
        "Pod (outside any gang)",
        "read by the controller (serve --migration)",
        "`true`: a restartable replica (at most 4 GPUs) gangslice may move to drain a domain for "
        "a gang of 8 or more GPUs that waited: the plan is reported (Event `MigrationPlanned` "
        "on the gang's Workload, PodGroup or pod; metrics); nothing is evicted.",
    ),
    Key(
        f"{NAMES}:RESTART_SECONDS",
        "annotation",
        "Pod (movable)",
        "read by the controller (serve --migration)",
        "Seconds the replica takes to serve again once moved (its model load; default 120): a "
        "plan costs its movers' GPUs x these seconds, and the cheapest domain to drain wins.",
    ),
    Key(
        f"{NAMES}:COMPUTE_DOMAIN",
        "annotation",
        "Pod (DRA, GB200)",
        "read by the admission webhook",
        "The ComputeDomain (same namespace) a gang across a multi-node NVLink clique joins, instead "
        "of the one gangslice creates for it (`<reservation>-imex`).",
    ),
)

#: What gangslice writes.
WRITTEN_KEYS = (
    Key(
        f"{NAMES}:RESERVATION",
        "annotation",
        "Pod (through Kueue's podSetUpdates), PodGroup",
        "written by the admission check and the PodGroup controller, read by the extender",
        "The SliceReservation (same namespace) that holds the pod's slot, or the gang's.",
    ),
    Key(
        f"{NAMES}:MANAGED",
        "label",
        "Pod (through Kueue's podSetUpdates; a Volcano job's task templates by hand)",
        "written by the admission check for pod sets that ask for GPUs through a DRA claim; "
        "selected by the admission webhook's `failurePolicy: Fail` entry",
        "`true`: gangslice pins this pod's GPU claim at creation, so while gangslice is down its "
        "creation is refused rather than let through unpinned.",
    ),
    Key(
        f"{NAMES}:GPUS",
        "annotation",
        "Pod",
        "written at bind, read by the cluster cache and `gangslice preflight`",
        "The GPU indices the pod was given, e.g. `0,1,2,3`.",
    ),
    Key(
        f"{NAMES}:NUMA_NODE",
        "annotation",
        "Pod",
        "written at bind, read by `gangslice preflight`",
        "The NUMA node(s) of those GPUs.",
    ),
    Key(
        f"{NAMES}:GPU_UUIDS",
        "annotation",
        "Pod",
        "written at bind (when the node's graph has UUIDs, as NVML discovery gives); read by "
        "`gangslice preflight`, which fails when the visible GPUs' UUIDs differ",
        "The UUIDs of those GPUs, comma-separated, e.g. `GPU-5c8e...,GPU-9a1f...`.",
    ),
    Key(
        f"{NAMES}:NICS",
        "annotation",
        "Pod",
        "written at bind (when the node's graph lists NICs)",
        "The RDMA NICs next to those GPUs: each GPU's nearest NIC on its NUMA node, once, e.g. "
        "`mlx5_0,mlx5_3` (docs/node-setup.md).",
    ),
    Key(
        f"{NAMES}:NCCL_IB_HCA",
        "annotation",
        "Pod",
        "written at bind with `gangslice.io/nics`; for `NCCL_IB_HCA` through the downward API",
        "Those NICs as NCCL takes exact names, e.g. `=mlx5_0,mlx5_3`.",
    ),
    Key(
        f"{NAMES}:UCX_NET_DEVICES",
        "annotation",
        "Pod",
        "written at bind with `gangslice.io/nics`; for `UCX_NET_DEVICES` through the downward API",
        "Those NICs as UCX takes them (port 1), e.g. `mlx5_0:1,mlx5_3:1`.",
    ),
    Key(
        f"{NAMES}:LEADER_LABEL",
        "label",
        "controller Pod",
        "written by `gangslice serve` as leadership comes and goes; selected by the Service",
        "`true` on the replica that holds the leader lease, `false` on the standby.",
    ),
    Key(
        f"{NAMES}:STATUS",
        "annotation",
        "PodGroup",
        "written by the PodGroup controller",
        "gangslice's state for the PodGroup (a PodGroup has no status subresource).",
    ),
    Key(
        f"{NAMES}:HYPERNODE_SOURCE_LABEL",
        "label",
        "HyperNode (from `gangslice hypernodes`)",
        "written by `gangslice hypernodes`",
        "Marks the Volcano HyperNodes gangslice rendered (value `gangslice`); Volcano's own "
        "discovery uses the same key with its source name.",
    ),
    Key(
        f"{NAMES}:HYPERNODE_LEVEL_LABEL",
        "label",
        "HyperNode (from `gangslice hypernodes`)",
        "written by `gangslice hypernodes`",
        "The gangslice level the HyperNode stands for.",
    ),
    Key(
        f"{NAMES}:OWNER_KIND_LABEL",
        "label",
        "SliceReservation",
        "written by the admission check",
        "The kind of the object the reservation is for (Workload, PodGroup).",
    ),
    Key(
        f"{NAMES}:OWNER_NAME_LABEL",
        "label",
        "SliceReservation",
        "written by the admission check",
        "Its name.",
    ),
    Key(
        f"{NAMES}:SLOT",
        "annotation",
        "Pod (DRA), ResourceClaim (label)",
        "written by the admission webhook at pod creation; read back to know which slots are handed out",
        "The slot the pod got, `<pod set>/<index>` (on its claim, a label `<pod set>-<index>`).",
    ),
    Key(
        f"{NAMES}:CLAIM_GPUS",
        "annotation",
        "Pod (DRA)",
        "written by the admission webhook; read wherever gangslice counts a pod's GPUs",
        "How many GPUs the pod's pinned ResourceClaim asks for (it requests no `nvidia.com/gpu`).",
    ),
    Key(
        f"{NAMES}:CLAIM_TEMPLATE",
        "annotation",
        "Pod (DRA)",
        "written by the admission webhook with the slot; read by the claims controller",
        "The ResourceClaimTemplate the pod asked for, which its slot's claim is made from once the pod "
        "exists (the webhook writes nothing to the API).",
    ),
    Key(
        f"{NAMES}:SLOT_NODE",
        "annotation",
        "ResourceClaim (DRA)",
        "written by the admission webhook",
        "The node of the slot whose GPUs the claim pins.",
    ),
)

#: Other systems' keys gangslice understands.
FOREIGN_KEYS = (
    Key(
        f"{NAMES}:LWS_GROUP_INDEX",
        "label",
        "Pod (LeaderWorkerSet)",
        "read by the cluster cache",
        "Which replica group of a LeaderWorkerSet a pod belongs to.",
    ),
    Key(
        f"{NAMES}:LWS_NAME",
        "label",
        "Pod (LeaderWorkerSet)",
        "read by the admission webhook",
        "The LeaderWorkerSet a pod belongs to. A pod with it but no group index yet (a leader before "
        "LWS's own pod webhook ran) is passed unchanged, and pinned when the API server calls the "
        "webhook again.",
    ),
    Key(
        f"{NAMES}:LWS_SIZE",
        "annotation",
        "Pod (LeaderWorkerSet)",
        "read by the extender",
        "The group's pod count (the LeaderWorkerSet's `size`), written by the LWS controller: the "
        "gang's size when the pod carries no `gangslice.io/gang-size`.",
    ),
    Key(
        f"{NAMES}:DESIRED_REPLICAS",
        "annotation",
        "ReplicaSet (of a Deployment)",
        "read by the cluster cache",
        "The Deployment's `replicas`, which the deployment controller writes on each of its "
        "ReplicaSets: how many pods a plain gang's pod set holds (the newest revision's).",
    ),
    Key(
        f"{NAMES}:MAX_REPLICAS",
        "annotation",
        "ReplicaSet (of a Deployment)",
        "read by the cluster cache",
        "`replicas + maxSurge`: how many pods of the pod set may hold slots at once during a "
        "rolling update (a surge pod gets one more slot beside the gang).",
    ),
    Key(
        f"{NAMES}:REVISION",
        "annotation",
        "ReplicaSet (of a Deployment)",
        "read by the cluster cache",
        "The Deployment revision a ReplicaSet is; the newest speaks for the Deployment.",
    ),
    Key(
        f"{NAMES}:KUEUE_REQUIRED_TOPOLOGY",
        "annotation",
        "pod template (Kueue TAS)",
        "read by the admission check",
        "Kueue's required topology (a node label key); used as gangslice's required level when "
        "it is a level of gangslice's hierarchy.",
    ),
    Key(
        f"{NAMES}:KUEUE_PREFERRED_TOPOLOGY",
        "annotation",
        "pod template (Kueue TAS)",
        "read by the admission check",
        "Kueue's preferred topology, likewise.",
    ),
    Key(
        f"{NAMES}:KUEUE_PODSET_GROUP_NAME",
        "annotation",
        "pod template (Kueue TAS)",
        "read by the admission check",
        "Pod sets of one group (leader + workers) are colocated at the group's level.",
    ),
    Key(
        f"{NAMES}:KUEUE_PODSET",
        "label",
        "Pod (set by Kueue)",
        "read by the extender",
        "The pod set a Kueue pod was admitted as.",
    ),
    Key(
        f"{NAMES}:VOLCANO_GROUP",
        "annotation",
        "Pod (set by Volcano)",
        "read by the extender",
        "The Volcano PodGroup; the gang key is `<namespace>/<podgroup>`.",
    ),
    Key(
        f"{NAMES}:VOLCANO_TASK_SPEC",
        "label or annotation",
        "Pod (set by Volcano)",
        "read by the PodGroup controller and the extender",
        "The Volcano task role: the pod set of a PodGroup gang (pods of one role ask for the same GPUs).",
    ),
    Key(
        f"{NAMES}:GPU_PRODUCT_LABEL",
        "label",
        "Node (GPU Feature Discovery)",
        "read by the cluster cache",
        "The GPU model: a node that advertises GPUs but has no NodeTopology yet gets the preset "
        "graph its GPU count and this label point to (a uniform graph when none matches).",
    ),
    Key(
        f"{NAMES}:GPU_COUNT_LABEL",
        "label",
        "Node (GPU Feature Discovery)",
        "not read",
        "Defined for completeness; the GPU count comes from the Node's `status.capacity`.",
    ),
    Key(
        "extender.topology.hierarchy:HOSTNAME_LABEL",
        "label",
        "Node",
        "read by the cluster cache",
        "The node level; accepted (and ignored) in a list of levels.",
    ),
    Key(
        "literal:batch.kubernetes.io/job-completion-index",
        "label",
        "Pod (indexed Job, JobSet)",
        "read by the admission webhook",
        "The pod's index: on DRA nodes it gets the slot of that position in its pod set.",
    ),
    Key(
        "literal:apps.kubernetes.io/pod-index",
        "label",
        "Pod (StatefulSet)",
        "read by the admission webhook",
        "The pod's ordinal: on DRA nodes it gets the slot of that position in its pod set.",
    ),
    Key(
        "literal:leaderworkerset.sigs.k8s.io/worker-index",
        "label",
        "Pod (LeaderWorkerSet)",
        "read by the admission webhook",
        "The pod's index in its group: on DRA nodes it gets the slot of that position (less one "
        "where the leader is a pod set of its own).",
    ),
    Key(
        "literal:jobset.sigs.k8s.io/job-index",
        "label",
        "Pod (JobSet)",
        "read by the admission webhook",
        "Which Job of its replicatedJob the pod's Job is: on DRA nodes the pod's slot is that "
        "Job's share of the pod set plus its completion index.",
    ),
    Key(
        "literal:jobset.sigs.k8s.io/replicatedjob-replicas",
        "label",
        "Pod (JobSet)",
        "read by the admission webhook",
        "How many Jobs its replicatedJob makes: splits the pod set's slots among them.",
    ),
    Key(
        "literal:resource.kubernetes.io/pciBusID",
        "device attribute",
        "ResourceSlice device (DRA)",
        "read by the cluster cache",
        "A GPU's PCI bus ID: pairs a published device with a NodeTopology GPU when it has no UUID.",
    ),
    Key(
        "literal:resource.kubernetes.io/pcieRoot",
        "device attribute",
        "ResourceSlice device (DRA)",
        "read by the claim builder and the cluster cache",
        "A GPU's or a NIC's PCIe root: a slot whose GPUs share one gets `matchAttribute` on it as a "
        "safety net, joined by the claim's NIC request (its first alternative) where enough NICs of its "
        "class sit on that root.",
    ),
    Key(
        f"{NAMES}:COMPUTE_DOMAIN_NODE_LABEL",
        "label",
        "Node (GB200, NVIDIA's DRA driver)",
        "read by the cluster cache",
        "The UID of the ComputeDomain the node belongs to (set by the driver's compute-domain "
        "kubelet plugin, which refuses a second domain there). A node in a domain that none of "
        "gangslice's channel claims names is no fit for a multi-node NVLink pod set of any gang.",
    ),
    Key(
        "extender.placement.feasibility:UNSCHEDULABLE_TAINT",
        "taint (toleration key)",
        "Pod tolerations",
        "read by every placement policy",
        "A pod that tolerates it may be placed on a cordoned node (`spec.unschedulable`), as "
        "kube-scheduler's NodeUnschedulable filter allows.",
    ),
)

ALL_KEYS = USER_KEYS + WRITTEN_KEYS + FOREIGN_KEYS


def defined_in(key: str) -> list[str]:
    """Every ``module.NAME`` among :data:`CONSTANT_MODULES` whose value is ``key``."""
    out = []
    for name in CONSTANT_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.isupper() and value == key:
                out.append(f"`{name}.{attr}`")
    return out


# -- the command line --------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS or value is False or action.nargs == 0:
        return ""
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, (list, tuple)):
        return ", ".join(f"`{v}`" for v in value)
    return f"`{value}`"


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        if action.choices is not None:
            metavar = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            mv = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
            metavar = f" {mv}"
    return ", ".join(f"`{o}{metavar}`" for o in action.option_strings)


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            text = text % {**vars(action), "prog": prog}
    return _cell(text)


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def walk_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """(command words, one-line help, parser) for every subcommand, depth first, in the
    order they were registered."""
    for sub in _subparsers(parser):
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name, child in sub.choices.items():
            yield (*path, name), helps.get(name, ""), child
            yield from walk_commands(child, (*path, name))


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The documented arguments (hidden ones, help=SUPPRESS, are for tests and demos)."""
    skip = (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)
    return [a for a in parser._actions if not isinstance(a, skip) and a.help != argparse.SUPPRESS]


def commands_section(parser: argparse.ArgumentParser) -> list[str]:
    lines = ["## Commands", ""]
    lines.append("| command | what it does |")
    lines.append("|---|---|")
    commands = list(walk_commands(parser))
    for words, text, _ in commands:
        lines.append(f"| `gangslice {' '.join(words)}` | {_cell(text)} |")
    lines.append("")
    for words, text, child in commands:
        options = _options(child)
        if not options and list(_subparsers(child)):
            continue
        lines.append(f"### gangslice {' '.join(words)}")
        lines.append("")
        lines.append(_cell(text) or "(no summary)")
        lines.append("")
        if not options:
            lines.append("No options.")
            lines.append("")
            continue
        lines.append("| option | default | meaning |")
        lines.append("|---|---|---|")
        prog = f"gangslice {' '.join(words)}"
        for action in options:
            lines.append(f"| {_flag(action)} | {_default(action)} | {_help(action, prog)} |")
        lines.append("")
    return lines


# -- names -------------------------------------------------------------------------------------


def keys_section() -> list[str]:
    lines = ["## Labels and annotations", ""]
    for title, keys in (
        ("Set by users on pods and pod templates", USER_KEYS),
        ("Written by gangslice", WRITTEN_KEYS),
        ("Understood from other systems", FOREIGN_KEYS),
    ):
        lines += [
            f"### {title}",
            "",
            "| key | kind | on | use | meaning | defined in |",
            "|---|---|---|---|---|---|",
        ]
        for k in keys:
            where = ", ".join(defined_in(k.key))
            lines.append(f"| `{k.key}` | {k.kind} | {k.on} | {k.use} | {_cell(k.meaning)} | {where} |")
        lines.append("")
    return lines


def levels_section() -> list[str]:
    from extender.cost import Comm
    from extender.topology.hierarchy import DEFAULT_LEVELS
    from extender.topology.model import IN_NODE_LEVELS

    lines = ["## Levels", ""]
    lines.append(
        "Values of `gangslice.io/required-level` and `gangslice.io/preferred-level`: a level of the "
        "network hierarchy (by name or node label key), `node`, or an in-node level. Default hierarchy, "
        "coarse to fine:"
    )
    lines += ["", "| level | node label | kind |", "|---|---|---|"]
    for lv in DEFAULT_LEVELS:
        lines.append(f"| `{lv.name}` | `{lv.label}` | {lv.kind} |")
    lines += ["", "In-node levels, loosest to tightest:", "", "| level | a pod's GPUs must be |", "|---|---|"]
    for name, tier in sorted(IN_NODE_LEVELS.items(), key=lambda kv: -kv[1].value):
        lines.append(f"| `{name}` | {tier.words} (`{tier.name}`) |")
    lines += ["", "## Communication patterns", "", "Values of `gangslice.io/comm`:", ""]
    lines += ["| value | meaning |", "|---|---|"]
    comments = _enum_comments(Comm)
    for c in Comm:
        lines.append(f"| `{c.value}` | {_cell(comments.get(c.name, ''))} |")
    lines.append("")
    return lines


def _enum_comments(enum_cls: type) -> dict[str, str]:
    """The trailing ``# comment`` of each member in the enum's source."""
    import inspect

    out = {}
    for line in inspect.getsource(enum_cls).splitlines():
        name, sep, rest = line.strip().partition(" = ")
        if sep and "#" in rest:
            out[name] = rest.split("#", 1)[1].strip()
    return out


def api_section() -> list[str]:
    from extender.agent import publish
    from extender.controllers import api as admission_api
    from extender.controllers.leader import LeaseConfig
    from extender.kube import names

    lease = LeaseConfig()
    rows = [
        ("API group and version", f"`{names.API_VERSION}`"),
        ("Kinds", f"`NodeTopology` (`{names.NODE_TOPOLOGIES}`, cluster-scoped, one per node), "
         f"`SliceReservation` (`{names.SLICE_RESERVATIONS}`, namespaced)"),
        ("GPU resource", f"`{names.GPU_RESOURCE}`"),
        ("Kueue AdmissionCheck controllerName", f"`{names.CHECK_CONTROLLER}`"),
        ("Kueue API version", f"`{admission_api.KUEUE_API_VERSION}`"),
        ("Leader Lease", f"`{lease.namespace}/{lease.name}` (duration {lease.duration_s:g} s, "
         f"renew deadline {lease.renew_deadline_s:g} s, retry {lease.retry_period_s:g} s)"),
        ("Field managers (server-side apply)", f"`{admission_api.FIELD_MANAGER}` (controller), "
         f"`{publish.FIELD_MANAGER}` (node agent)"),
        ("Events' reportingComponent", f"`{names.CHECK_CONTROLLER}` (on Workloads), "
         f"`{names.EVENT_COMPONENT}` (on PodGroups and on plain gangs' pods); source component `gangslice`"),
    ]  # fmt: skip
    lines = ["## API names", "", "| what | value |", "|---|---|"]
    lines += [f"| {what} | {value} |" for what, value in rows]
    lines.append("")
    return lines


def metrics_section() -> list[str]:
    from extender.agent.metrics import AgentMetrics
    from extender.httpapi.metrics import Metrics
    from extender.reservations import ClusterCache

    lines = ["## Metrics", ""]
    for where, registry in (
        ("`gangslice serve`", Metrics(ClusterCache()).registry),
        ("`gangslice agent --metrics-port`", AgentMetrics().registry),
    ):
        lines += [f"Served by {where} on `/metrics`.", ""]
        lines += ["| metric | type | meaning |", "|---|---|---|"]
        for family in sorted(registry.collect(), key=lambda f: f.name):
            name = f"{family.name}_total" if family.type == "counter" else family.name
            lines.append(f"| `{name}` | {family.type} | {_cell(family.documentation)} |")
        lines.append("")
    return lines


def limits_section() -> list[str]:
    from extender.placement import files, reading
    from extender.sim import trace
    from extender.topology import nvidia_smi

    lines = ["## File limits", ""]
    lines.append(
        "Every file a command reads (cluster, gang and trace files, `nvidia-smi topo -m` output, a "
        "Workload object, the kubelet's configuration) is read within these bounds. A file beyond "
        "one is refused with one line on stderr naming the file and the bound, and exit status 2. "
        "The bounds sit far above any real fleet or model, and low enough that the worst file is "
        "refused in seconds."
    )
    rows: list[tuple[str, str, int]] = [
        ("every file", "bytes read (16 MiB)", reading.MAX_FILE_BYTES),
        ("every file", "levels of nested YAML or JSON values", reading.MAX_DEPTH),
        (
            "every file",
            "YAML values, with aliases expanded (and values on one JSON line)",
            reading.MAX_VALUES,
        ),
        ("every file", "characters of one number", reading.MAX_NUMBER_CHARS),
    ]
    rows += [("cluster and gang files", what, most) for what, most in files.LIMITS.items()]
    rows += [("trace files", what, most) for what, most in trace.LIMITS.items()]
    rows += [
        ("`nvidia-smi topo -m` output", "device columns (GPUs and NICs)", nvidia_smi.MAX_DEVICES),
        ("`nvidia-smi topo -m` output", "a GPU index", nvidia_smi.MAX_GPU_INDEX),
        ("`nvidia-smi topo -m` output", "NVLinks between two GPUs", nvidia_smi.MAX_NVLINKS),
        ("`nvidia-smi topo -m` output", "a CPU id", nvidia_smi.MAX_CPU_ID),
        ("`nvidia-smi topo -m` output", "a NUMA node", nvidia_smi.MAX_NUMA_NODE),
    ]
    lines += ["", "| file | what | at most |", "|---|---|---|"]
    lines += [f"| {where} | {_cell(what)} | {most:,} |" for where, what, most in rows]
    lines += [
        "",
        "Text is UTF-8 (a byte-order mark selects UTF-8 or UTF-16); a NUL byte marks a binary file. "
        'Counts are whole numbers as written (`8`, not `8.0`, `"8"` or `true`), no number is `.nan` or '
        "`.inf` (or JSON's `NaN` and `Infinity`), and a YAML alias may not refer to the value it sits in.",
        "",
    ]
    return lines


def render(parser: argparse.ArgumentParser | None = None) -> str:
    if parser is None:
        from extender.cli import build_parser

        parser = build_parser()
    lines = [
        "# gangslice configuration reference",
        "",
        "<!-- Generated by `make reference` (python -m extender.docs) from the code; do not edit. -->",
        "",
        "Every subcommand and flag of `gangslice`, every label and annotation gangslice reads or "
        "writes, the topology levels, communication patterns, API names, metrics and the limits on "
        "the files commands read.",
        "",
    ]
    for section in (
        commands_section(parser),
        keys_section(),
        levels_section(),
        api_section(),
        metrics_section(),
        limits_section(),
    ):
        lines += section
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m extender.docs", description="write docs/reference.md")
    p.add_argument("--output", metavar="PATH", help="write here instead of standard output")
    p.add_argument("--check", action="store_true", help="exit 1 when --output differs from the code")
    args = p.parse_args(argv)
    text = render()
    if args.output is None:
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if args.check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            print(f"{path} is out of date: run `make reference`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0


def keys(entries: Iterable[Key] = ALL_KEYS) -> list[str]:
    return [k.key for k in entries]


if __name__ == "__main__":
    sys.exit(main())
