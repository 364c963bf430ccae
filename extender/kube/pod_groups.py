"""The upstream Workload API's PodGroups as gangs (``scheduling.k8s.io/v1beta1``, beta in
Kubernetes 1.37; KEP-4671 and KEP-5732).

A pod joins a PodGroup through ``spec.schedulingGroup.podGroupName``; the PodGroup says how
many of its pods must be placed at once (``schedulingPolicy.gang.minCount``) and, optionally,
one node-label key its pods must share a value of (``schedulingConstraints.topology[0].key``).
kube-scheduler's own gang scheduling (the ``GenericWorkload`` feature gate) holds the pods back
until ``minCount`` of them exist and binds none until all of them found a node; gangslice
places the group's slice once, on the first pod's filter, as for any gang.

A pod the label ``gangslice.io/gang`` puts in a plain gang stays in that gang (its owners size
it); the PodGroup then only gates kube-scheduler. Otherwise the PodGroup is the gang, keyed
``<namespace>/<podgroup>``, and sized from its pods, never from a count kept by hand:

- one pod set (the pods name no ``gangslice.io/pod-set``, or all the same one): as many pods as
  live, and at least ``minCount`` (so it is placed on first sight, every pod alike, and a lost
  pod's replacement finds its slot held);
- several pod sets: each as many pods as live of it, placed once ``minCount`` pods live.

A ``basic`` policy (no gang) is a group of at least one pod: its pods still share the topology
constraint. The key maps to the level of the hierarchy labelled with it (``kubernetes.io/hostname``
is the node); a key no level carries is refused, naming the levels there are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.kube.api import as_map
from extender.kube.gangs import DEFAULT_POD_SET
from extender.kube.pods import MAX_GANG_SIZE, PodError, PodInfo
from extender.topology.hierarchy import HOSTNAME_LABEL, Hierarchy


@dataclass(frozen=True, slots=True)
class PodGroup:
    """One ``scheduling.k8s.io`` PodGroup, as far as a gang goes."""

    namespace: str
    name: str
    #: ``schedulingPolicy.gang.minCount``; 1 for a ``basic`` policy.
    min_count: int = 1
    #: ``schedulingConstraints.topology[*].key`` (the API allows one today).
    topology_keys: tuple[str, ...] = ()
    #: Why the object cannot be used (then its pods are refused, saying so).
    problem: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def required_level(self, h: Hierarchy) -> str | None:
        """The level the topology constraint bounds the group to (None: no constraint). Raises
        PodError for a key no level of the hierarchy is labelled with."""
        level: str | None = None
        for key in self.topology_keys:
            if key == HOSTNAME_LABEL:
                got = "node"
            else:
                idx = h.index_of(key)
                if idx is None:
                    known = ", ".join(f"{lv.name} ({lv.label})" for lv in h.levels)
                    raise PodError(
                        f"PodGroup {self.key}: schedulingConstraints.topology key {key!r} is the label "
                        f"of no level of the hierarchy; the levels are {known}, and {HOSTNAME_LABEL}"
                    )
                got = h.levels[idx].name
            level = h.finer(level, got)
        return level


def read_pod_group(obj: Mapping[str, Any]) -> PodGroup:
    """The PodGroup ``obj`` is; what cannot be read is recorded in :attr:`PodGroup.problem`."""
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    where = f"PodGroup {namespace}/{name}"
    policy = as_map(spec.get("schedulingPolicy"))
    min_count, problem = 1, None
    gang = policy.get("gang")
    if gang is not None:
        raw = as_map(gang).get("minCount")
        if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_GANG_SIZE:
            problem = (
                f"{where}: schedulingPolicy.gang.minCount {raw!r} is not a count "
                f"between 1 and {MAX_GANG_SIZE}"
            )
        else:
            min_count = raw
    keys: list[str] = []
    topology = as_map(spec.get("schedulingConstraints")).get("topology")
    for i, entry in enumerate(topology if isinstance(topology, list) else ()):
        key = as_map(entry).get("key")
        if not isinstance(key, str) or not key:
            problem = problem or f"{where}: schedulingConstraints.topology[{i}].key is not a label key"
        else:
            keys.append(key)
    return PodGroup(namespace, name, min_count, tuple(keys), problem)


@dataclass(frozen=True, slots=True)
class GroupSizes:
    """What a PodGroup's live pods make of its gang: each pod set's size, or why it must wait."""

    sizes: Mapping[str, int]
    waiting: str | None = None


def group_sizes(group: PodGroup, pods: Iterable[PodInfo]) -> GroupSizes:
    """Each pod set's size from the live pods of ``group`` (see the module docstring)."""
    live = Counter(p.pod_set or DEFAULT_POD_SET for p in pods if not p.terminal and not p.deleting)
    if len(live) <= 1:
        role = next(iter(live), DEFAULT_POD_SET)
        return GroupSizes({role: max(group.min_count, live[role])})
    total = sum(live.values())
    if total < group.min_count:
        seen = ", ".join(f"{role} {n}" for role, n in sorted(live.items()))
        return GroupSizes(
            dict(live),
            f"PodGroup {group.key}: {total} of its minCount {group.min_count} pods live ({seen}); "
            "its pod sets differ, so it is placed once all of them are there",
        )
    return GroupSizes(dict(live))
