"""The snapshot's derived tables the solver reads instead of walking every node: the nodes
by node kind and free mask (kept up to date across updates), and each domain as a range of
the snapshot's order (sorted by label path, so each domain's nodes are contiguous)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.testing.builders import make_cluster, make_node
from extender.testing.hardware import hgx_h100, l40s_4gpu
from extender.topology.hierarchy import Level

LEVELS = (Level("spine", "x/spine"), Level("leaf", "x/leaf"), Level("rack", "x/rack", kind="group"))


def alternating(labels: list[dict[str, str]], allocated: list[frozenset[int]]) -> ClusterSnapshot:
    """Nodes n0, n1... with these labels, HGX H100 and 4-GPU L40S in turn (two node kinds,
    whatever was drawn), each with the drawn GPUs it has taken."""
    graphs = [hgx_h100(), l40s_4gpu()]
    nodes = []
    for i, (lab, taken) in enumerate(zip(labels, allocated, strict=True)):
        graph = graphs[i % 2]
        nodes.append(
            make_node(f"n{i}").graph(graph).labels(lab).allocated(g for g in taken if g in graph.indices)
        )
    return make_cluster(*nodes).levels(*LEVELS).obj()


def fresh_classes(snap: ClusterSnapshot) -> dict[tuple[str, int], list[int]]:
    out: dict[tuple[str, int], list[int]] = {}
    for i, n in enumerate(snap.nodes):
        out.setdefault((n.kind, snap.free_mask(i)), []).append(i)
    return out


LABELS = st.fixed_dictionaries(
    {},
    optional={
        "x/spine": st.sampled_from(["s0", "s1"]),
        "x/leaf": st.sampled_from(["l0", "l1", "l2"]),
        "x/rack": st.sampled_from(["r0", "r1"]),
    },
)
GPUS = st.frozensets(st.integers(0, 7), max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(LABELS, GPUS), min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 11), GPUS, st.sampled_from(["state", "held", "view"])), max_size=8),
)
def test_free_classes_follow_updates_as_a_fresh_build(
    nodes: list[tuple[dict[str, str], frozenset[int]]], events: list[tuple[int, frozenset[int], str]]
) -> None:
    snap = alternating([lab for lab, _ in nodes], [gpus for _, gpus in nodes])
    assert snap.free_classes() == fresh_classes(snap)
    for i, gpus, how in events:
        if i >= len(snap.nodes):
            continue
        node = snap.nodes[i]
        gpus = frozenset(g for g in gpus if g in node.graph.indices)
        before = {k: list(v) for k, v in snap.free_classes().items()}
        if how == "held":
            held = {**snap.reserved, node.name: gpus}
            nxt = snap.updated({}, held, None, also=[node.name])
        elif how == "view":  # a ledger's view: the reservations replaced wholesale
            nxt = snap.with_held({node.name: gpus}, {})
        else:
            nxt = snap.updated({node.name: replace(node, allocated=gpus)})
        assert nxt.free_classes() == fresh_classes(nxt)
        assert snap.free_classes() == before, "the older snapshot's table was written"
        snap = nxt


@settings(max_examples=60, deadline=None)
@given(st.lists(LABELS, min_size=1, max_size=16))
def test_each_domain_is_a_range_of_the_snapshot_order(labels: list[dict[str, str]]) -> None:
    snap = alternating(labels, [frozenset()] * len(labels))
    rank = snap.order()
    spans = snap.domain_spans()
    assert set(spans) == set(snap.domains())
    for key, members in snap.domains().items():
        lo, hi = spans[key]
        assert {i for i in range(len(snap.nodes)) if lo <= rank[i] < hi} == set(members), key


def test_per_node_tables_follow_node_changes_and_leave_the_older_snapshot_alone() -> None:
    snap = alternating([{"x/leaf": "l0"}] * 4, [frozenset()] * 4)
    calls: list[str] = []

    def derive(node: NodeState) -> int:
        calls.append(node.name)
        return len(node.allocated)

    assert snap.per_node("taken", derive) == [0, 0, 0, 0]
    node = snap.nodes[2]
    calls.clear()
    nxt = snap.updated({node.name: replace(node, allocated=frozenset({0, 1, 3}))})
    assert nxt.per_node("taken", derive) == [0, 0, 3, 0]
    assert calls == ["n2"], "only the changed node is derived again"
    assert snap.per_node("taken", derive) == [0, 0, 0, 0]
    calls.clear()
    held = nxt.updated({}, {"n1": frozenset({4})}, None, also=["n1"])
    assert held.per_node("taken", derive) == [0, 0, 3, 0]
    assert calls == [], "held GPUs are not node state: nothing is derived again"


def test_per_node_tables_are_bounded() -> None:
    from extender.placement.snapshot import PER_NODE_TABLES

    snap = alternating([{}] * 2, [frozenset()] * 2)
    for k in range(PER_NODE_TABLES + 5):
        assert snap.per_node(("shape", k), lambda n: n.name) == ["n0", "n1"]
    node = snap.nodes[0]
    nxt = snap.updated({node.name: replace(node, allocated=frozenset({1}))})
    assert nxt.per_node(("shape", PER_NODE_TABLES + 4), lambda n: len(n.allocated)) == ["n0", "n1"]  # kept
    assert nxt._per_node is not None and len(nxt._per_node[1]) <= PER_NODE_TABLES
