"""A new snapshot from an old one in time proportional to what changed.

A pod event changes one node's allocation; a reservation changes the held GPUs of a few
nodes. Building a :class:`ClusterSnapshot` from scratch costs tens of milliseconds at
5,000 nodes (every node's label path and free mask), and the cache would pay it before the
next decision after every event. :func:`updated` copies the old snapshot's per-node tables
(plain list and dict copies, done in C) and recomputes only the changed nodes.

It replaces ClusterSnapshot's private ``_by_name`` and ``_free`` tables and shares the rest
(``_index``, ``_paths``, ``_domains``, and the derived tables, which notice a new ``nodes``
list); a snapshot it cannot patch (membership or labels changed) is built afresh, and
``tests/unit/test_cache_incremental.py`` checks every patch against a fresh build. It
belongs in ``placement/snapshot.py`` as a method; it lives here until the owner of that
module takes it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

from extender.placement.snapshot import ClusterSnapshot, NodeState


def updated(
    base: ClusterSnapshot,
    states: Mapping[str, NodeState],
    held: Mapping[str, frozenset[int]] | None = None,
    mnnvl: Mapping[str, str] | None = None,
    also: Iterable[str] = (),
) -> ClusterSnapshot:
    """``base`` with the node states in ``states`` replaced (same names, same labels) and,
    when given, new reservations (``held``/``mnnvl``); ``also`` names nodes whose free mask
    must be recomputed because their held GPUs changed."""
    if any(not base.has_node(name) or base.node(name).labels != s.labels for name, s in states.items()):
        return _fresh(base, states, held, mnnvl)
    snap = copy.copy(base)
    if held is not None:
        snap.reserved = dict(held)
    if mnnvl is not None:
        snap.reserved_mnnvl = dict(mnnvl)
    if states:
        # Only then a new node list: the per-node-list tables (kinds, topology) stay valid
        # across a change of reservations alone.
        snap.nodes = list(base.nodes)
        snap._by_name = dict(base._by_name)
        for name, state in states.items():
            snap.nodes[base.index(name)] = state
            snap._by_name[name] = state
    snap._free = list(base._free)
    for name in {*states, *also}:
        if snap.has_node(name):
            i = snap.index(name)
            snap._free[i] = snap._compute_free(snap.nodes[i])
    return snap


def _fresh(
    base: ClusterSnapshot,
    states: Mapping[str, NodeState],
    held: Mapping[str, frozenset[int]] | None,
    mnnvl: Mapping[str, str] | None,
) -> ClusterSnapshot:
    nodes = [states.get(n.name, n) for n in base.nodes]
    return ClusterSnapshot(
        nodes,
        base.hierarchy,
        dict(held) if held is not None else dict(base.reserved),
        dict(mnnvl) if mnnvl is not None else dict(base.reserved_mnnvl),
    )
