"""``gangslice hypernodes``: our level hierarchy as Volcano ``HyperNode`` objects, so Volcano's
network-topology plugin and gangslice see the same domains.

Tiers follow the level order over the levels some node is labelled with: the finest such
level is tier 1, the next coarser tier 2, and so on (the same numbering PodGroup
``networkTopology.highestTierAllowed`` is read with, see :mod:`extender.controllers.podgroups.groups`);
``tierName`` is the level's name. A domain's members are its nodes (``type: Node``) when it is
at a node's finest labelled level, else the finer domains under it (``type: HyperNode``), all
by ``exactMatch``.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from extender.controllers.podgroups.groups import present_levels
from extender.kube import names as keys
from extender.placement.snapshot import ClusterSnapshot
from extender.topology.hierarchy import DomainKey, Hierarchy

HYPERNODE_API_VERSION = "topology.volcano.sh/v1alpha1"
#: The source label's value on every object this command renders.
SOURCE = "gangslice"

_INVALID = re.compile(r"[^a-z0-9-]+")


def _dns_label(text: str) -> str:
    return _INVALID.sub("-", text.lower()).strip("-")


def _names(keys: Iterable[DomainKey], h: Hierarchy) -> dict[DomainKey, str]:
    """A DNS name per domain: ``<level>-<value>``, with a short digest of the full path where
    two domains would otherwise share a name (the same value under different parents)."""
    keys = sorted(keys, key=lambda k: (k[0], [v or "" for v in k[1]]))
    plain = {k: f"{_dns_label(h.levels[k[0]].name)}-{_dns_label(str(k[1][-1]))}"[:240] for k in keys}
    seen: dict[str, int] = {}
    for name in plain.values():
        seen[name] = seen.get(name, 0) + 1
    out = {}
    for k, name in plain.items():
        if seen[name] > 1:
            digest = hashlib.sha256("/".join(v or "" for v in k[1]).encode()).hexdigest()[:8]
            name = f"{name}-{digest}"
        out[k] = name
    return out


def hypernodes(nodes: Iterable[tuple[str, Mapping[str, str]]], h: Hierarchy) -> list[dict[str, Any]]:
    """HyperNode objects for ``nodes`` (name, labels), coarsest tier first."""
    nodes = list(nodes)
    snap_levels = present_levels(h, (labels for _, labels in nodes))
    tier_of = {idx: t for t, idx in enumerate(reversed(snap_levels), start=1)}
    node_members: dict[DomainKey, set[str]] = {}
    child_members: dict[DomainKey, set[DomainKey]] = {}
    for name, labels in nodes:
        path = h.path(labels)
        chain = [k for i in snap_levels if (k := h.domain(path, i)) is not None]
        if not chain:
            continue
        node_members.setdefault(chain[-1], set()).add(name)
        for parent, child in itertools.pairwise(chain):
            child_members.setdefault(parent, set()).add(child)
            child_members.setdefault(child, set())
        for k in chain:
            child_members.setdefault(k, set())
    names = _names(child_members, h)
    out = []
    for key in sorted(child_members, key=lambda k: (-tier_of[k[0]], names[k])):
        members = [
            {"type": "HyperNode", "selector": {"exactMatch": {"name": names[c]}}}
            for c in sorted(child_members[key], key=names.__getitem__)
        ]
        members += [
            {"type": "Node", "selector": {"exactMatch": {"name": n}}}
            for n in sorted(node_members.get(key, ()))
        ]
        level = h.levels[key[0]]
        out.append(
            {
                "apiVersion": HYPERNODE_API_VERSION,
                "kind": "HyperNode",
                "metadata": {
                    "name": names[key],
                    "labels": {
                        keys.HYPERNODE_SOURCE_LABEL: SOURCE,
                        keys.HYPERNODE_LEVEL_LABEL: _dns_label(level.name),
                    },
                    "annotations": {level.label: str(key[1][-1])},
                },
                "spec": {"tier": tier_of[key[0]], "tierName": level.name, "members": members},
            }
        )
    return out


def from_snapshot(snap: ClusterSnapshot) -> list[dict[str, Any]]:
    return hypernodes(((n.name, n.labels) for n in snap.nodes), snap.hierarchy)


def from_live(kubeconfig: str | None) -> list[dict[str, Any]]:
    import asyncio

    from extender.kube.api import NODES
    from extender.kube.client import ApiServerClient

    listing = asyncio.run(ApiServerClient.connect(kubeconfig).list(NODES))
    nodes = []
    for obj in listing.items:
        meta = obj.get("metadata") or {}
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        nodes.append((str(meta.get("name") or ""), labels))
    return hypernodes(nodes, Hierarchy())


def render(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False) if objs else ""
