"""Where the solver's memos live: never in a module, and what outlives one decision only in the
:class:`SolverMemory` of whoever built the snapshot, shared by every view derived from it."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from types import ModuleType

import pytest

import extender.placement.search
from extender.kube.api import Kind
from extender.placement.ledger import Ledger
from extender.placement.request import GangRequest, PodSet
from extender.placement.search.memory import SolverMemory
from extender.placement.snapshot import ClusterSnapshot, NodeState
from extender.placement.solver import place
from extender.reservations import ClusterCache
from extender.testing.extender import node_obj
from extender.topology.hierarchy import Hierarchy, Level
from extender.topology.presets import preset_graph

HIERARCHY = Hierarchy((Level("leaf", "fabric.topograph.run/tier-0"),))


def solver_modules() -> list[str]:
    package = extender.placement.search
    found = [m.name for m in pkgutil.iter_modules(package.__path__, f"{package.__name__}.")]
    return ["extender.placement.solver", package.__name__, *found]


def module_state(module: ModuleType) -> list[str]:
    """The names of a module's globals that can hold state: containers, and instances of
    classes with a ``__dict__`` (a table object); not modules, classes, functions, type
    aliases or immutable constants."""
    found = []
    for attr, value in vars(module).items():
        if attr.startswith("__") or isinstance(value, ModuleType | type | Callable):
            continue
        if type(value).__module__ == "__future__":
            continue  # from __future__ import annotations
        if isinstance(value, dict | list | set | bytearray) or hasattr(value, "__dict__"):
            found.append(attr)
    return found


@pytest.mark.parametrize("name", solver_modules())
def test_no_module_of_the_solver_holds_a_table(name: str) -> None:
    assert module_state(importlib.import_module(name)) == []


def test_the_check_sees_a_module_table() -> None:
    module = ModuleType("solver_like")
    module.TABLES = SolverMemory()  # type: ignore[attr-defined]
    module.SEEN = {}  # type: ignore[attr-defined]
    module.LIMIT = 3  # type: ignore[attr-defined]
    module.KEY = (1, "a")  # type: ignore[attr-defined]
    assert module_state(module) == ["TABLES", "SEEN"]


def cluster(allocated: Iterable[int] = ()) -> ClusterSnapshot:
    nodes = [
        NodeState(f"n{i}", {"fabric.topograph.run/tier-0": f"leaf-{i % 2}"}, preset_graph("hgx-h100"))
        for i in range(4)
    ]
    nodes[0] = NodeState("n0", nodes[0].labels, nodes[0].graph, frozenset(allocated))
    return ClusterSnapshot(nodes, HIERARCHY)


def test_every_view_of_a_snapshot_shares_its_memory() -> None:
    snap = cluster([0])
    memory = snap.memory
    views = [
        snap.with_held({"n1": frozenset({0})}, {}),
        snap.with_held_masks({1: 1}, {}),
        snap.with_clique_demand(False),
        snap.emptied(),
        snap.updated({"n2": NodeState("n2", snap.nodes[2].labels, snap.nodes[2].graph, frozenset({3}))}),
        Ledger().view(snap),
    ]
    assert all(v.memory is memory for v in views)
    # A snapshot built afresh has its own, unless its builder passes one on.
    assert cluster().memory is not memory
    assert ClusterSnapshot(snap.nodes, HIERARCHY, memory=memory).memory is memory


def test_a_decision_fills_the_memory_of_its_snapshot_only() -> None:
    snap, other = cluster(), cluster()
    got = place(snap, GangRequest("g", (PodSet("p", 2, 4),)))
    assert got
    assert snap.memory.classes._entries and not other.memory.classes._entries


def test_the_cache_keeps_its_memory_when_the_snapshot_is_rebuilt() -> None:
    cache = ClusterCache(awaiting=())
    cache.replace(Kind.NODES, [node_obj(f"n{i}") for i in range(3)])
    first = cache.snapshot()
    assert first.memory is cache.solver_memory
    cache.apply(Kind.NODES, "ADDED", node_obj("n3"))  # a new node: the snapshot is built afresh
    second = cache.snapshot()
    assert second is not first and len(second.nodes) == 4
    assert second.memory is cache.solver_memory and cache.view().memory is cache.solver_memory
