"""Node-name lists from a request, bounded before any decision.

A list much longer than the cluster (more than twice its nodes, and more than
:data:`MIN_ALLOWED`) or with a name longer than a DNS subdomain is refused with 400. Names
that are no node gangslice knows never reach the decider (one stand-in is asked about in
their place): its memo tables (``extender.httpapi.memo`` and the per-node verdicts) are keyed by
node names only, so what they hold is bounded by the cluster, not by what clients send.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from extender.httpapi.decide import Decider, FilterOutcome, Scores
from extender.kube.pods import PodInfo
from extender.reservations import ClusterCache

#: Lists up to this long are always taken (a cluster still being listed, a small cluster).
MIN_ALLOWED = 1000
#: The longest node name Kubernetes accepts (a DNS subdomain).
MAX_NAME = 253
#: No node is named so: the decider is asked about it in place of every unknown name.
STAND_IN = ""


def allowed(cache: ClusterCache) -> int:
    return max(MIN_ALLOWED, 2 * cache.node_count())


def check(names: Sequence[str]) -> None:
    """Raise HTTP 400 for a name no node can have (the list's length was checked before the
    body was validated: :func:`check_body`)."""
    if names and max(map(len, names)) > MAX_NAME:
        raise web.HTTPBadRequest(text=f"a node name is longer than {MAX_NAME} characters\n")


#: The fields of the verbs' bodies that list nodes (a NodeList's under ``items``).
NODE_FIELDS = ("NodeNames", "Nodes", "NodeNameToVictims", "NodeNameToMetaVictims", "nodes")


def check_body(cache: ClusterCache, body: object) -> None:
    """Raise HTTP 400 for a decoded body whose node fields list more nodes than
    :func:`allowed`, before any of its objects is validated or read (every JSON verb calls it:
    :func:`extender.httpapi.handling.json_endpoint`)."""
    if not isinstance(body, dict):
        return
    limit = allowed(cache)
    for name in NODE_FIELDS:
        value = body.get(name)
        if isinstance(value, dict) and name == "Nodes":
            value = value.get("items")
        if isinstance(value, list | dict) and len(value) > limit:
            what = "node names" if name == "NodeNames" else f"nodes in {name}"
            raise web.HTTPBadRequest(
                text=f"{len(value)} {what}: more than {limit} (twice the {cache.node_count()} nodes known)\n"
            )


def filter_known(
    decider: Decider, pod: PodInfo, names: Sequence[str], job: str | None = None
) -> FilterOutcome:
    """``decider.filter`` over ``names``, with every name that is no known node asked about
    as the one :data:`STAND_IN` (the answer for such a name depends on the pod alone)."""
    cache = decider.cache
    view = cache.book.view()
    if view.all_known(names):
        return decider.filter(pod, names, job)

    def known(n: str) -> bool:
        # A node whose NodeTopology gangslice refused is no stand-in: its reply names why.
        return view.has_node(n) or cache.node_problem(n) is not None

    out = decider.filter(pod, [*(n for n in names if known(n)), STAND_IN], job)
    passed, failed, unresolvable = set(out.passed), dict(out.failed), dict(out.unresolvable)
    stand_in_passed = STAND_IN in passed
    passed.discard(STAND_IN)
    stand_in_failed, stand_in_unresolvable = failed.pop(STAND_IN, None), unresolvable.pop(STAND_IN, None)
    for n in names:
        if not known(n):
            if stand_in_passed:
                passed.add(n)
            elif stand_in_failed is not None:
                failed[n] = stand_in_failed
            elif stand_in_unresolvable is not None:
                unresolvable[n] = stand_in_unresolvable
    return FilterOutcome(
        [n for n in names if n in passed], failed, unresolvable, out.outcome, reserved=out.reserved
    )


def prioritize_known(
    decider: Decider, pod: PodInfo, names: Sequence[str], job: str | None = None
) -> tuple[Scores, bool]:
    """``decider.prioritize`` likewise; and whether every name was known (only then may the
    reply's encoding be remembered by name)."""
    view = decider.cache.book.view()
    if view.all_known(names):
        return decider.prioritize(pod, names, job), True
    known = [n for n in names if view.has_node(n)]
    got = decider.prioritize(pod, [*known, STAND_IN], job).values
    score = dict(zip(known, got, strict=False))
    return Scores([score.get(n, got[-1]) for n in names]), False
