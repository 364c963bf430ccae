"""serve --migration: the plan for a gang that waited is told once, nothing evicted (report),
or carried out (on): the gang's slice and the mover's new slot held, then the eviction; a
PodDisruptionBudget that refuses leaves everything as it was (extender.controllers.migration,
extender.reservations.handover)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from extender.commands.explain import add_migration, explain_pods
from extender.controllers.explain import render, to_json
from extender.controllers.migration.reporter import (
    REASON,
    REFUSED,
    STARTED,
    Migration,
    MigrationReporter,
    waits_as,
)
from extender.controllers.owned import owner_claim
from extender.httpapi.decide import Decider
from extender.kube import names as keys
from extender.kube.api import Kind, Unavailable
from extender.kube.events import ObjectRef
from extender.kube.pods import PodInfo
from extender.placement.ledger import Reservation
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Unplaceable
from extender.reservations import ClusterCache, KubeReservationStore, ReservationStore
from extender.reservations.handover import for_gang, for_owner
from extender.reservations.reserve import Claim, reserve
from extender.testing.extender import gang_pod, node_obj, pod_obj
from extender.testing.kube import FakeKube
from extender.testing.objects import make_node_topology
from extender.topology.presets import preset_graph

WIDE = GangRequest("llm/wide", (PodSet("experts", 2, 8, required_level="leaf"),))


def leaf(name: str) -> dict[str, str]:
    return {"fabric.topograph.run/tier-1": "s", "fabric.topograph.run/tier-0": name}


def fleet(now: list[float], store: ReservationStore | None = None) -> ClusterCache:
    """Leaf a: a1 (a movable 1-GPU replica on GPU 0) and a2; leaf c: c1, free."""
    cache = ClusterCache(clock=lambda: now[0], store=store)
    for kind in Kind:
        cache.replace(kind, [])
    for name, where in (("a1", "a"), ("a2", "a"), ("c1", "c")):
        cache.apply(Kind.NODES, "ADDED", node_obj(name, labels=leaf(where)))
        cache.apply(
            Kind.NODE_TOPOLOGIES, "ADDED", make_node_topology(name).graph(preset_graph("hgx-h100")).obj()
        )
    replica = movable("server-1", "a1", "0", restart="45")
    cache.apply(Kind.PODS, "ADDED", replica)
    cache.apply(Kind.PODS, "ADDED", gang_pod("wide-0", "wide", 2, 8))
    return cache


#: The ReplicaSet that owns the movable replicas (and makes their replacements).
OWNER = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "server-7f",
    "uid": "rs-1",
    "controller": True,
}


def movable(
    name: str,
    node: str | None,
    gpus: str = "0",
    restart: str | None = None,
    mark: bool = True,
    owner: dict[str, Any] | None = OWNER,
    phase: str = "Running",
) -> dict[str, Any]:
    annotations = {keys.GPUS: gpus, **({keys.RESTART_SECONDS: restart} if restart else {})} if node else {}
    labels = {keys.MOVABLE: "true"} if mark else {}
    pod = pod_obj(name, gpus=len(gpus.split(",")), labels=labels, node=node, phase=phase, uid=f"uid-{name}")
    pod["metadata"]["annotations"].update(annotations)
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [owner]
    return pod


def evictions(api: FakeKube) -> list[str]:
    return [c.name for c in api.calls if c.subresource == "eviction"]


def test_a_gang_that_waited_hears_the_plan_once_and_nothing_is_evicted() -> None:
    now = [0.0]
    cache = fleet(now)
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    api = FakeKube()
    reporter = MigrationReporter(api, after_s=600.0)
    assert asyncio.run(reporter.sync(cache, 599.0)) == []  # not waited long enough
    now[0] = 600.0
    (plan,) = asyncio.run(reporter.sync(cache, 600.0))
    assert plan.domain == "leaf a" and plan.restart_gpu_s == 45.0
    assert [(m.gang, m.slots[0].node) for m in plan.moves] == [("llm/server-1", "c1")]
    for _ in range(2):
        asyncio.run(reporter.sync(cache, 700.0))
    (event,) = api.events
    assert event["reason"] == REASON and event["involvedObject"]["name"] == "wide-0"
    assert "would move 1 replica(s) off leaf a" in event["message"]
    assert "llm/server-1 from a1 to c1" in event["message"] and "45 GPU-seconds" in event["message"]
    assert not [c for c in api.calls if c.subresource == "eviction"]
    assert (cache.book.migration_plans, cache.book.migration_moves, cache.book.migration_restart_gpu_s) == (
        1,
        1,
        45.0,
    )
    # Placed, the gang is no longer waited for.
    cache.waiting.placed(WIDE.name)
    assert asyncio.run(reporter.sync(cache, 800.0)) == []


def test_a_workload_that_waits_without_pods_hears_the_plan_on_the_workload() -> None:
    """A Kueue Workload waits suspended, with no pod: the plan is told on the Workload the
    controller's claim names, as its other Events are."""
    now = [0.0]
    cache = fleet(now)
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "job-a", "namespace": "llm", "uid": "wl-1"},
    }
    request = GangRequest("llm/job-a", WIDE.pod_sets)
    assert isinstance(reserve(cache, request, owner_claim(request.name, workload, 3600.0)), Unplaceable)
    assert cache.pods_of_gang(request.name) == []
    api = FakeKube()
    now[0] = 600.0
    (plan,) = asyncio.run(MigrationReporter(api, after_s=600.0).sync(cache, 600.0))
    assert plan.domain == "leaf a"
    (event,) = api.events
    assert event["reason"] == REASON and event["metadata"]["namespace"] == "llm"
    assert event["involvedObject"] == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "name": "job-a",
        "namespace": "llm",
        "uid": "wl-1",
    }
    # Refused again on the extender's path (no claim meta), it still waits as the Workload.
    cache.waiting.refused(cache.view(), request, 650.0)
    told = ObjectRef("kueue.x-k8s.io/v1beta2", "Workload", "job-a", "llm", "wl-1")
    assert waits_as(cache, request.name) == told


def test_only_pods_marked_movable_outside_gangs_are_planned_with_and_off_means_off() -> None:
    now = [600.0]
    cache = fleet(now)
    cache.apply(Kind.PODS, "MODIFIED", movable("server-1", "a1", "0", mark=False))
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    assert asyncio.run(MigrationReporter(FakeKube(), after_s=0.0).sync(cache, 600.0)) == []
    cache = fleet(now)
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    api = FakeKube()
    assert asyncio.run(MigrationReporter(api, Migration.OFF, after_s=0.0).sync(cache, 600.0)) == []
    assert not api.events


def test_a_bare_pod_is_no_mover_its_eviction_would_not_bring_it_back() -> None:
    now = [600.0]
    cache = fleet(now)
    cache.apply(Kind.PODS, "MODIFIED", movable("server-1", "a1", "0", owner=None))
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    assert asyncio.run(MigrationReporter(FakeKube(), after_s=0.0).sync(cache, 600.0)) == []


def on(now: list[float]) -> tuple[ClusterCache, FakeKube, MigrationReporter]:
    cache = fleet(now)
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    api = FakeKube()
    api.put("pods", movable("server-1", "a1"))
    return cache, api, MigrationReporter(api, Migration.ON, after_s=600.0)


def stored(now: list[float]) -> tuple[ClusterCache, FakeKube]:
    """:func:`fleet` writing its SliceReservations to a fake API server that has the replica,
    with the wide gang waiting."""
    api = FakeKube()
    api.put("pods", movable("server-1", "a1"))
    cache = fleet(now, KubeReservationStore(api, clock=lambda: now[0]))
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    return cache, api


def holds(cache: ClusterCache) -> dict[str, Reservation]:
    return {r.gang: r for r in cache.ledger.reservations()}


def test_on_holds_the_slice_and_the_new_slot_evicts_and_the_replacement_and_the_gang_take_them() -> None:
    now = [600.0]
    cache, api, migrator = on(now)
    (plan,) = asyncio.run(migrator.sync(cache, 600.0))
    # A dry run, then the eviction; the holds were in the ledger before it.
    assert evictions(api) == ["server-1", "server-1"]
    held = holds(cache)
    assert set(held) == {"llm/drain:wide", "llm/move:server-1"}
    drain, move = held["llm/drain:wide"], held["llm/move:server-1"]
    assert drain.slice.nodes == ("a1", "a2") and drain.meta[keys.META_HELD_FOR] == for_gang(WIDE.name)
    assert move.meta[keys.META_HELD_FOR] == for_owner("rs-1")
    # The slice is held the longer by the replica's grace period to stop (30 s unset).
    ttl = cache.ledger.ttl_s
    assert (drain.expires_at, move.expires_at) == (600.0 + ttl + 30.0, 600.0 + ttl)
    ((node, gpus),) = [(s.node, s.gpus) for s in move.slice.slots]
    assert node == "c1" and (node, gpus) == (plan.moves[0].slots[0].node, plan.moves[0].slots[0].gpus)
    (event,) = api.events
    assert event["reason"] == STARTED and "moving 1 replica(s) off leaf a" in event["message"]
    assert cache.book.migration_evictions == {"evicted": 1}
    # Under way: no second plan for the gang.
    assert asyncio.run(migrator.sync(cache, 610.0)) == [] and len(evictions(api)) == 2

    # The replica goes; its ReplicaSet's replacement may bind only to the slot held for it.
    cache.apply(Kind.PODS, "DELETED", movable("server-1", "a1", "0"))
    replacement = PodInfo.from_obj(movable("server-2", None, phase="Pending"))
    decider = Decider(cache)
    assert decider.filter(replacement, ["a1", "a2", "c1"]).passed == ["c1"]
    bound = decider.plan_bind(replacement, "c1")
    assert (bound.node, bound.gpus) == ("c1", gpus)
    # Another replica of the owner finds the slot taken and is placed by the plain rule.
    other = PodInfo.from_obj(movable("server-3", None, phase="Pending"))
    assert cache.book.gang_of(other) is None

    # The gang takes the drained slice; the hold kept for it goes in the same step.
    got = reserve(cache.book, WIDE, Claim(WIDE.name))
    assert isinstance(got, Reservation) and got.slice.nodes == ("a1", "a2")
    assert "llm/drain:wide" not in holds(cache)
    # Once the replacement runs on its slot, its hold ends: the pod holds the GPUs itself.
    assert cache.book.expire() == [] and "llm/move:server-1" in holds(cache)
    ran = movable("server-2", "c1", ",".join(map(str, gpus)))
    cache.apply(Kind.PODS, "ADDED", ran)
    cache.book.expire()
    assert set(holds(cache)) == {WIDE.name}
    view = cache.view()
    i = view.index("c1")
    assert view.free_mask(i) & view.nodes[i].shape.mask_of(set(gpus)) == 0  # taken by the pod


def test_a_budget_that_refuses_leaves_everything_as_it_was_and_the_gang_waits() -> None:
    now = [600.0]
    cache, api, migrator = on(now)
    api.budget_blocks.add("llm/server-1")
    assert asyncio.run(migrator.sync(cache, 600.0)) == []
    assert evictions(api) == ["server-1"]  # the dry run alone
    assert holds(cache) == {} and api.peek("pods", "server-1", "llm") is not None
    (event,) = api.events
    assert event["reason"] == REFUSED and "PodDisruptionBudget of pod llm/server-1" in event["message"]
    assert "nothing evicted, the gang waits" in event["message"]
    assert cache.book.migration_evictions == {"blocked": 1}
    # Not asked again every pass; after the retry delay, and once the budget allows it, moved.
    assert asyncio.run(migrator.sync(cache, 620.0)) == [] and len(evictions(api)) == 1
    api.budget_blocks.clear()
    assert len(asyncio.run(migrator.sync(cache, 700.0))) == 1
    assert set(holds(cache)) == {"llm/drain:wide", "llm/move:server-1"}


class Budgets(set[str]):
    """Budget blocks whose answer for a pod is ``answer(pod, times asked)``: a budget that lets
    the dry run through and refuses the eviction, or a pod that goes while it is asked about."""

    def __init__(self, answer: Callable[[str, int], bool]) -> None:
        super().__init__()
        self.answer = answer
        self.asked: list[str] = []

    def __contains__(self, pod: object) -> bool:
        self.asked.append(str(pod))
        return self.answer(str(pod), self.asked.count(str(pod)))


def test_an_eviction_refused_midway_releases_the_gang_slice_and_the_slots_of_those_that_stay() -> None:
    now = [600.0]
    cache = fleet(now)
    cache.apply(Kind.PODS, "ADDED", movable("server-2", "a2", "0", restart="45"))
    cache.waiting.refused(cache.view(), WIDE, 0.0)
    api = FakeKube()
    # server-2's budget says yes to the dry run and no to the eviction.
    api.budget_blocks = Budgets(lambda pod, asked: pod == "llm/server-2" and asked > 1)
    for name, node in (("server-1", "a1"), ("server-2", "a2")):
        api.put("pods", movable(name, node))
    migrator = MigrationReporter(api, Migration.ON, after_s=0.0)
    assert asyncio.run(migrator.sync(cache, 600.0)) == []
    # The first moved and keeps the slot held for its replacement; the gang's hold is gone.
    assert set(holds(cache)) == {"llm/move:server-1"}
    assert cache.book.migration_evictions == {"evicted": 1, "blocked": 1}
    (event,) = api.events
    assert event["reason"] == REFUSED and "1 of 2 replica(s) evicted" in event["message"]


def test_explain_shows_the_plan_and_then_the_migration_under_way() -> None:
    now = [600.0]
    cache, _, migrator = on(now)
    cache.apply(Kind.PODS, "ADDED", gang_pod("wide-1", "wide", 2, 8, extra={keys.REQUIRED_LEVEL: "leaf"}))
    cache.apply(Kind.PODS, "MODIFIED", gang_pod("wide-0", "wide", 2, 8, extra={keys.REQUIRED_LEVEL: "leaf"}))
    facts = explain_pods(cache, "gang", "llm", "wide", None)
    add_migration(cache, facts)
    assert isinstance(facts.dry_run, Unplaceable) and facts.plan is not None
    assert facts.plan.domain == "leaf a" and facts.plan.restart_gpu_s == 45.0
    text = render(facts)
    assert "migration: once it has waited, serve --migration would move 1 replica(s) off leaf a" in text
    assert "llm/server-1 from a1 to c1" in text
    assert to_json(facts)["migration"]["plan"]["moves"][0]["pod"] == "llm/server-1"
    asyncio.run(migrator.sync(cache, 600.0))
    facts = explain_pods(cache, "gang", "llm", "wide", None)
    add_migration(cache, facts)
    assert facts.migration == "under way: the drained slice is held for this gang (llm/drain:wide)"
    # Without movable replicas: why there is no plan.
    cache = fleet(now)
    cache.apply(Kind.PODS, "MODIFIED", movable("server-1", "a1", "0", mark=False))
    cache.apply(Kind.PODS, "MODIFIED", gang_pod("wide-0", "wide", 2, 8, extra={keys.REQUIRED_LEVEL: "leaf"}))
    cache.apply(Kind.PODS, "ADDED", gang_pod("wide-1", "wide", 2, 8, extra={keys.REQUIRED_LEVEL: "leaf"}))
    facts = explain_pods(cache, "gang", "llm", "wide", None)
    add_migration(cache, facts)
    assert facts.plan is None and facts.migration.startswith("no plan: no domain this gang fits is freed")


def test_holds_that_could_not_be_written_are_released_and_nothing_is_evicted() -> None:
    now = [600.0]
    cache, api = stored(now)
    api.fail_next("apply slicereservations", Unavailable(503, "etcd is down"))
    assert asyncio.run(MigrationReporter(api, Migration.ON, after_s=0.0).sync(cache, 600.0)) == []
    assert evictions(api) == ["server-1"]  # the dry run alone
    assert holds(cache) == {} and api.peek("pods", "server-1", "llm") is not None
    assert not api.objects("slicereservations")
    assert cache.book.migration_evictions == {} and cache.book.migration_plans == 0


def test_a_plan_the_cluster_changed_under_during_the_dry_runs_is_not_carried_out() -> None:
    now = [600.0]
    cache, api, migrator = on(now)

    def goes(pod: str, asked: int) -> bool:
        cache.apply(Kind.PODS, "DELETED", movable("server-1", "a1", "0"))
        return False

    api.budget_blocks = Budgets(goes)  # the pod goes during its dry run
    assert asyncio.run(migrator.sync(cache, 600.0)) == []
    assert evictions(api) == ["server-1"]  # the dry run alone
    assert holds(cache) == {} and cache.book.migration_plans == 0


def test_the_store_deletes_the_hold_before_it_writes_the_gang_reservation_that_replaces_it() -> None:
    now = [600.0]
    cache, api = stored(now)
    assert len(asyncio.run(MigrationReporter(api, Migration.ON, after_s=0.0).sync(cache, 600.0))) == 1
    names_of = lambda: sorted(o["metadata"]["name"] for o in api.objects("slicereservations"))  # noqa: E731
    assert names_of() == ["drain-wide", "move-server-1"]
    cache.apply(Kind.PODS, "DELETED", movable("server-1", "a1", "0"))
    assert isinstance(reserve(cache.book, WIDE, Claim(WIDE.name)), Reservation)
    before = len(api.calls)
    # What the reserving filter does before it replies: the promise made durable.
    assert asyncio.run(cache.persist(WIDE.name))
    writes = [(c.verb, c.name) for c in api.calls[before:] if c.plural == "slicereservations" and c.write]
    assert writes[0] == ("delete", "drain-wide") and ("apply", "wide") in writes, writes
    assert names_of() == ["move-server-1", "wide"]


def test_a_slot_held_on_a_node_cordoned_since_is_not_handed_to_the_replacement() -> None:
    now = [600.0]
    cache, _, migrator = on(now)
    asyncio.run(migrator.sync(cache, 600.0))
    replacement = PodInfo.from_obj(movable("server-2", None, phase="Pending"))
    assert cache.book.gang_of(replacement) is not None
    cache.apply(Kind.NODES, "MODIFIED", node_obj("c1", labels=leaf("c"), unschedulable=True))
    assert cache.book.gang_of(replacement) is None  # placed by the plain rule; the hold lapses
    cache.apply(Kind.NODES, "MODIFIED", node_obj("c1", labels=leaf("c")))
    assert cache.book.gang_of(replacement) is not None
