"""One more pod for a gang already placed: where it may go, nearest first.

A pod set grows when its owner scales up or a rolling update starts a surge pod next to the
pod it replaces. The new pod must keep the pod set's rule (its required level: all its pods
under one leaf, say) and should sit where its gang is, so the rings and the KV hand-offs it
joins stay on the links they were placed for. So the candidates come in stages, each searched
only when the ones before have no room:

1. the nodes of the pod set's own slots (a replaced pod's node, its peers');
2. the other nodes of the gang's slice inside the pod set's required domain (a P/D partner's);
3. the nodes under each domain the pod set's nodes share, finest first (their leaf, then their
   spine...), down to the required level;
4. without a required level, the whole cluster.

A pod set the slice has no slot of yet (its owner came after the gang was placed) starts from
the gang's nodes and may end anywhere: its required level binds its own pods to one another
(the solver keeps it within the unit placed), not to the gang.
"""

from __future__ import annotations

from collections.abc import Sequence

from extender.placement.request import PodSet
from extender.placement.scoring import ANYWHERE, node_scope, resolve_need
from extender.placement.slice import Slice
from extender.placement.snapshot import ClusterSnapshot


def near_slice(view: ClusterSnapshot, sl: Slice, ps: PodSet) -> list[frozenset[str]]:
    """The node sets to try for more pods of ``ps`` (a pod set of ``sl``), nearest first; each
    holds the ones before it. Raises LevelError for a level name the hierarchy lacks."""
    h = view.hierarchy
    scope = resolve_need(ps, h).scope
    own = sorted({s.node for s in sl.slots if s.pod_set == ps.name and view.has_node(s.node)})
    # A pod set with pods already is bound to their required domain; one with none yet (its
    # owner came after the gang was placed) is only drawn to the gang, and keeps its rule among
    # its own pods wherever they go.
    bound = bool(own)
    anchor = own or sorted(n for n in sl.nodes if view.has_node(n))
    everywhere = frozenset(n.name for n in view.nodes)
    if not anchor:
        return [everywhere]
    stages: list[frozenset[str]] = [frozenset(anchor)]
    if bound and scope >= node_scope(h):
        return stages
    paths = [view.path_of(n) for n in anchor]
    ref = paths[0]

    def within(path: Sequence[str | None], level: int) -> bool:
        return ref[level] is not None and tuple(path[: level + 1]) == tuple(ref[: level + 1])

    def allowed(node: str) -> bool:
        return not bound or scope == ANYWHERE or within(view.path_of(node), scope)

    partners = frozenset(n for n in sl.nodes if view.has_node(n) and allowed(n))
    _add(stages, stages[-1] | partners)
    floor = max(scope, 0) if bound else 0
    for level in range(h.common_level(paths), floor - 1, -1):
        if ref[level] is None:
            continue
        _add(stages, frozenset(n.name for n in view.nodes if within(view.path_of(n.name), level)))
    if scope == ANYWHERE or not bound:
        _add(stages, everywhere)
    return stages


def _add(stages: list[frozenset[str]], nodes: frozenset[str]) -> None:
    if nodes != stages[-1]:
        stages.append(stages[-1] | nodes)
