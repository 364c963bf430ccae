"""The informer observes and decides nothing: it tells its listeners what it saw, and the
book of reservations is the only thing that changes a reservation."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import extender
from extender.kube import names as keys
from extender.kube.api import Kind
from extender.kube.cache import ClusterInformer
from extender.kube.crd_models import reservation_object
from extender.kube.gangs import plain_gang_request
from extender.kube.pods import PodInfo
from extender.placement.ledger import Ledger, Reservation
from extender.placement.slice import Slice
from extender.placement.snapshot import NodeState
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore
from extender.testing.extender import gang_pod, node_obj
from extender.testing.reserve import hold

BOOK = "extender.reservations.book"


class Recorder:
    """A listener that only writes down what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def pod_gone(self, pod: PodInfo) -> None:
        self.calls.append(("pod_gone", pod.key))

    def pod_bound(self, pod: PodInfo) -> None:
        self.calls.append(("pod_bound", pod.key))

    def reservation_deleted(self, r: Reservation) -> None:
        self.calls.append(("reservation_deleted", r.gang))

    def devices_reported(self, nodes: Iterable[str]) -> None:
        self.calls.append(("devices_reported", tuple(sorted(nodes))))

    def listed(self, kind: Kind) -> None:
        self.calls.append(("listed", kind))

    def nodes_rebuilt(self, changed: Mapping[str, NodeState] | None) -> None:
        self.calls.append(("nodes_rebuilt", None if changed is None else tuple(sorted(changed))))


def listed_cache(cls: Callable[..., Any] = ClusterCache) -> Any:
    cache = cls()
    for kind in Kind:
        cache.replace(kind, [])
    for name in ("a", "b"):
        cache.apply(Kind.NODES, "ADDED", node_obj(name))
    return cache


def held_gang(cache: ClusterCache) -> Slice:
    request = plain_gang_request(PodInfo.from_obj(gang_pod("g-0", "g", 2, 8)))
    assert request is not None
    placed = hold(cache, "llm/g", request)
    assert isinstance(placed, Slice)
    return placed


def test_the_informer_tells_its_listeners_what_it_saw_and_keeps_no_reservation() -> None:
    informer = ClusterInformer()
    recorder = Recorder()
    informer.listen(recorder)
    for kind in Kind:
        informer.replace(kind, [])
    assert [c for c in recorder.calls if c[0] == "listed"] == [("listed", k) for k in Kind]
    informer.apply(Kind.NODES, "ADDED", node_obj("a"))
    informer.snapshot()
    recorder.calls.clear()

    pod = gang_pod("g-0", "g", 2, 8, node="a", phase="Running", extra={keys.GPUS: "0,1,2,3,4,5,6,7"})
    informer.apply(Kind.PODS, "ADDED", pod)
    informer.snapshot()
    informer.apply(Kind.PODS, "DELETED", pod)
    r = Reservation("llm/g", Slice.from_dict(_one_slot_slice()), 0.0, {}, meta={})
    informer.apply(Kind.SLICE_RESERVATIONS, "DELETED", reservation_object(r))
    assert recorder.calls == [
        ("pod_bound", "llm/g-0"),
        ("devices_reported", ("a",)),
        ("nodes_rebuilt", ("a",)),
        ("pod_gone", "llm/g-0"),
        ("devices_reported", ("a",)),
        ("reservation_deleted", "llm/g"),
    ]
    # It has nothing to change a reservation with: no ledger, no store, no decision.
    for member in ("ledger", "store", "view", "lock", "bind_slot", "drop", "expire", "flush", "hold_all"):
        assert not hasattr(informer, member), member


def test_the_informer_module_loads_no_writer_and_no_decision() -> None:
    # The solver is not listed: the placement package's __init__ loads it for every import
    # below it; the import contract in pyproject.toml checks the informer's own imports.
    code = (
        "import sys, extender.kube.cache; "
        "print(sorted(m for m in sys.modules if m.startswith(('extender.reservations', "
        "'extender.controllers', 'extender.httpapi', 'extender.kube.binder', "
        "'extender.kube.client', 'extender.kube.events', 'extender.kube.slot_claims'))))"
    )
    root = str(Path(extender.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_only_the_book_changes_the_ledger_through_a_reservation_s_whole_life() -> None:
    now = [1000.0]
    store = InMemoryReservationStore()
    cache = ClusterCache(ttl_s=10, clock=lambda: now[0], store=store)
    for kind in Kind:
        cache.replace(kind, [])
    for name in ("a", "b"):
        cache.apply(Kind.NODES, "ADDED", node_obj(name))
    changes = _record_changes(cache.ledger)

    placed = held_gang(cache)  # hold
    pods = [gang_pod(f"g-{i}", "g", 2, 8, node=s.node, phase="Running") for i, s in enumerate(placed.slots)]
    for p in pods:
        cache.apply(Kind.PODS, "ADDED", p)  # pods seen bound: slots taken
    cache.apply(Kind.PODS, "DELETED", pods[0])  # one gone: its slot freed
    cache.apply(Kind.PODS, "DELETED", pods[1])  # the last gone: the gang released
    assert cache.reservation("llm/g") is None
    held_gang(cache)
    asyncio.run(cache.flush())
    r = cache.reservation("llm/g")
    assert r is not None
    cache.apply(Kind.SLICE_RESERVATIONS, "DELETED", reservation_object(r))  # deleted by someone
    assert cache.reservation("llm/g") is None
    held_gang(cache)
    now[0] += 11
    assert [g.gang for g in cache.expire()] == ["llm/g"]  # expired

    steps = [step for step, _ in changes]
    assert {"restore", "bind", "unbind", "release", "expire"} <= set(steps)
    assert {caller for _, caller in changes} == {BOOK}


def _record_changes(ledger: Ledger) -> list[tuple[str, str]]:
    """Wrap the ledger's changing methods; each call is written down with its caller's module."""
    changes: list[tuple[str, str]] = []
    for step in ("reserve", "bind", "move_slot", "unbind", "release", "expire", "restore"):
        original = getattr(ledger, step)

        def wrapped(*args: Any, _step: str = step, _original: Any = original, **kw: Any) -> Any:
            changes.append((_step, sys._getframe(1).f_globals["__name__"]))
            return _original(*args, **kw)

        setattr(ledger, step, wrapped)
    return changes


def _one_slot_slice() -> dict[str, Any]:
    cache = listed_cache()
    return held_gang(cache).to_dict()
