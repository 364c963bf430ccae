"""What the kube-scheduler verbs decide, on the small cluster of ``extender.testing.extender``:
h-0..h-2 HGX H100 (8 free), h-3 HGX H100 (GPUs 4-7 free), p-0/p-1 dual-socket PCIe (8 free),
l-0 four L40S."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from extender.httpapi.app import build_app
from extender.httpapi.handling import DECIDER
from extender.kube import names as keys
from extender.kube.api import Kind, KubeError
from extender.kube.binder import LocalBinder
from extender.kube.devices import DeviceMismatch
from extender.placement.ledger import Reservation
from extender.placement.request import GangRequest, PodSet
from extender.placement.slice import Slice
from extender.reservations import ClusterCache
from extender.reservations.store import InMemoryReservationStore
from extender.testing.extender import SMALL_CLUSTER_NODES, client_for, gang_pod, pod_obj, write_cluster
from extender.testing.kube import FakeKube
from extender.testing.reserve import reserve_gang

ALL = list(SMALL_CLUSTER_NODES)
Client = TestClient[Any, Any]
Body = Callable[[Client, ClusterCache], Awaitable[None]]


def run(tmp_path: Path, body: Body, api: FakeKube | None = None) -> ClusterCache:
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        app = build_app(cache, api=api)
        async with client_for(app) as client:
            await body(client, cache)

    asyncio.run(go())
    return cache


async def post(client: Client, verb: str, body: dict[str, Any]) -> Any:
    resp = await client.post(f"/gangslice/{verb}", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def filter_(client: Client, pod: dict[str, Any], names: list[str] = ALL) -> dict[str, Any]:
    reply: dict[str, Any] = await post(client, "filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    return reply


async def scores(client: Client, pod: dict[str, Any], names: list[str] = ALL) -> dict[str, int]:
    reply = await post(client, "prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})
    return {h["Host"]: h["Score"] for h in reply}


async def bind(client: Client, pod: dict[str, Any], node: str) -> str:
    meta = pod["metadata"]
    reply = await post(
        client,
        "bind",
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node},
    )
    return str(reply["Error"])


def test_a_pod_without_gpus_passes_everywhere(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod_obj("web"), [*ALL, "cpu-node"])
        assert got["NodeNames"] == [*ALL, "cpu-node"]
        assert got["FailedNodes"] == {} and got["FailedAndUnresolvableNodes"] == {}
        assert set((await scores(client, pod_obj("web"))).values()) == {0}

    run(tmp_path, body)


def test_a_gpu_pod_passes_where_free_gpus_meet_the_in_node_rule(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod_obj("eight", gpus=8), [*ALL, "ghost"])
        assert got["NodeNames"] == ["h-0", "h-1", "h-2", "p-0", "p-1"]
        assert set(got["FailedNodes"]) == {"h-3", "ghost"}
        assert "4 free GPUs" in got["FailedNodes"]["h-3"]
        assert set(got["FailedAndUnresolvableNodes"]) == {"l-0"}
        nvlink = pod_obj("tp2", gpus=2, annotations={keys.REQUIRED_LEVEL: "nvlink"})
        got = await filter_(client, nvlink)
        assert got["NodeNames"] == ["h-0", "h-1", "h-2", "h-3"]
        assert set(got["FailedAndUnresolvableNodes"]) == {"l-0", "p-0", "p-1"}
        assert "NVLink" in got["FailedAndUnresolvableNodes"]["p-0"]

    run(tmp_path, body)


def test_an_unknown_level_makes_every_node_unresolvable(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod_obj("x", gpus=2, annotations={keys.REQUIRED_LEVEL: "galaxy"}))
        assert got["NodeNames"] == [] and set(got["FailedAndUnresolvableNodes"]) == set(ALL)
        assert "galaxy" in got["FailedAndUnresolvableNodes"]["h-0"]

    run(tmp_path, body)


def test_a_plain_gang_is_reserved_on_first_sight_and_pinned_to_its_slots(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        first = gang_pod("g-0", "g", 3, 8, extra={keys.COMM: "allreduce"})
        got = await filter_(client, first)
        r = cache.reservation("llm/g")
        assert r is not None and len(r.slice.slots) == 3
        slot_nodes = sorted({s.node for s in r.slice.slots})
        assert got["NodeNames"] == slot_nodes
        assert set(got["FailedNodes"]) == set(ALL) - set(slot_nodes)
        assert all("reservation llm/g" in why for why in got["FailedNodes"].values())
        # a second member sees the same slice, nothing new is reserved
        member = gang_pod("g-1", "g", 3, 8, extra={keys.COMM: "allreduce"})
        again = await filter_(client, member)
        assert again["NodeNames"] == slot_nodes
        # kube-scheduler reads FailedNodes only when no node passes: a member offered its slot
        # nodes is told nothing of the others; offered none, it is told why on each node
        assert again["FailedNodes"] == {} and again["FailedAndUnresolvableNodes"] == {}
        elsewhere = [n for n in ALL if n not in slot_nodes]
        refused = await filter_(client, member, elsewhere)
        assert refused["NodeNames"] == [] and set(refused["FailedNodes"]) == set(elsewhere)
        assert all("reservation llm/g" in why for why in refused["FailedNodes"].values())
        assert len(cache.ledger) == 1
        assert await scores(client, first) == {n: (10 if n in slot_nodes else 0) for n in ALL}
        # the reserved GPUs are invisible to everyone else
        other = await filter_(client, pod_obj("solo", gpus=8))
        assert not set(other["NodeNames"]) & set(slot_nodes)

    run(tmp_path, body)


def test_a_member_of_another_size_gets_no_slot_and_one_without_gpus_stays_outside(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        await filter_(client, gang_pod("g-0", "g", 2, 8))
        r = cache.reservation("llm/g")
        assert r is not None and {len(s.gpus) for s in r.slice.slots} == {8}
        slot_nodes = {s.node for s in r.slice.slots}
        # A member asking for 2 GPUs cannot take an 8-GPU slot: refused, naming both counts.
        small = gang_pod("g-1", "g", 2, 2)
        got = await filter_(client, small)
        assert got["NodeNames"] == [] and set(got["FailedAndUnresolvableNodes"]) == set(ALL)
        why = next(iter(got["FailedAndUnresolvableNodes"].values()))
        assert "asks for 2 GPUs" in why and "slots have 8" in why, why
        assert "asks for 2 GPUs" in await bind(client, small, sorted(slot_nodes)[0])
        # A member without GPUs (a CPU-only leader) is outside the slice: any node, no slot.
        leader = gang_pod("g-leader", "g", 2, 0)
        assert (await filter_(client, leader))["NodeNames"] == ALL
        assert await bind(client, leader, "l-0") == ""
        after = cache.reservation("llm/g")
        assert after is not None and after.bound == {} and len(after.free_slots()) == 2

    run(tmp_path, body)


def role_pod(name: str, role: str, role_size: int, gpus: int, **extra: str) -> dict[str, Any]:
    """A pod of plain gang ``pd`` (3 pods): a prefill pod set and a decode pod set."""
    labels = {keys.GANG: "pd", keys.POD_SET: role}
    annotations = {keys.GANG_SIZE: "3", keys.POD_SET_SIZE: str(role_size), **extra}
    return pod_obj(name, gpus=gpus, labels=labels, annotations=annotations)


def unsized_pod(name: str, role: str, gpus: int) -> dict[str, Any]:
    """A pod of plain gang ``pd`` (3 pods) that names its pod set but not the pod set's size."""
    labels = {keys.GANG: "pd", keys.POD_SET: role}
    return pod_obj(name, gpus=gpus, labels=labels, annotations={keys.GANG_SIZE: "3"})


def test_a_plain_gang_of_two_pod_sets_is_placed_once_both_are_seen(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        prefill = role_pod(
            "pd-prefill-0",
            "prefill",
            1,
            4,
        )
        waiting = await filter_(client, prefill)
        assert waiting["NodeNames"] == [] and cache.reservation("llm/pd") is None
        why = next(iter(waiting["FailedNodes"].values()))
        assert "prefill 1" in why and "1 of 3 pods" in why and "every other pod set" in why, why
        decode = role_pod("pd-decode-0", "decode", 2, 8)
        got = await filter_(client, decode)
        r = cache.reservation("llm/pd")
        assert r is not None
        by_set = {ps: [s for s in r.slice.slots if s.pod_set == ps] for ps in ("prefill", "decode")}
        assert [len(s.gpus) for s in by_set["prefill"]] == [4]
        assert [len(s.gpus) for s in by_set["decode"]] == [8, 8]
        assert set(got["NodeNames"]) == {s.node for s in by_set["decode"]}
        # The prefill pod now goes to its own slot, under the decode pods' leaf.
        prefill_node = by_set["prefill"][0].node
        assert (await filter_(client, prefill))["NodeNames"] == [prefill_node]
        hgx = {"h-0", "h-1", "h-2", "h-3"}
        assert {s.node for s in by_set["decode"]} <= hgx and prefill_node in hgx

    run(tmp_path, body)


@pytest.mark.parametrize(
    ("pods", "words", "held"),
    [
        (
            [unsized_pod("a", "prefill", 4), unsized_pod("b", "decode", 8)],
            # The first pod alone looks like a gang of one pod set: the second cannot fit it.
            "gives each pod gangslice.io/pod-set-size",
            True,
        ),
        (
            [role_pod("a", "prefill", 1, 4), unsized_pod("b", "decode", 8)],
            "each pod needs the annotation gangslice.io/pod-set-size",
            False,
        ),
        ([role_pod("a", "prefill", 2, 4), role_pod("b", "decode", 2, 8)], "add up to 4, more than", False),
    ],
)
def test_pod_set_sizes_that_cannot_work_are_refused_with_the_reason(
    tmp_path: Path, pods: list[dict[str, Any]], words: str, held: bool
) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        await filter_(client, pods[0])
        got = await filter_(client, pods[1])
        assert got["NodeNames"] == [] and set(got["FailedAndUnresolvableNodes"]) == set(ALL)
        assert words in next(iter(got["FailedAndUnresolvableNodes"].values()))
        assert (cache.reservation("llm/pd") is not None) is held

    run(tmp_path, body)


def test_unplaceable_gangs_fail_every_node_with_the_engines_reason(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        never = await filter_(client, gang_pod("big-0", "big", 50, 8))
        assert never["NodeNames"] == [] and set(never["FailedAndUnresolvableNodes"]) == set(ALL)
        assert "gang llm/big" in never["FailedAndUnresolvableNodes"]["h-0"]
        # four whole HGX nodes in one leaf: leaf-1 has four, but h-3 is half taken
        later = await filter_(client, gang_pod("leafy-0", "leafy", 4, 8, extra={keys.REQUIRED_LEVEL: "leaf"}))
        assert later["NodeNames"] == [] and set(later["FailedNodes"]) == set(ALL)
        assert later["FailedAndUnresolvableNodes"] == {}
        assert len(cache.ledger) == 0

    run(tmp_path, body)


def test_a_gang_label_without_size_waits_for_a_reservation(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod_obj("w-0", gpus=8, labels={keys.GANG: "w"}))
        assert got["NodeNames"] == [] and "no reservation yet" in got["FailedNodes"]["h-0"]
        missing = pod_obj("k-0", gpus=8, annotations={keys.RESERVATION: "nope"})
        got = await filter_(client, missing)
        assert "reservation llm/nope does not exist" in got["FailedNodes"]["h-0"]

    run(tmp_path, body)


def test_the_kueue_path_matches_the_pods_reservation_and_pod_set(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        request = GangRequest(
            "llm/wl-1", (PodSet("leader", 1, 4), PodSet("workers", 2, 8, required_level="leaf"))
        )
        placed = await reserve_gang(cache, "llm/wl-1", request, {"name": "wl-1-abcde"})
        assert isinstance(placed, Slice)
        workers = sorted({s.node for s in placed.slots if s.pod_set == "workers"})
        pod = pod_obj(
            "w-0", gpus=8, annotations={keys.RESERVATION: "wl-1-abcde"}, labels={keys.POD_SET: "workers"}
        )
        got = await filter_(client, pod)
        assert got["NodeNames"] == workers
        # the reason on the other nodes (sent when no node passes) names the reservation
        elsewhere = await filter_(client, pod, [n for n in ALL if n not in workers])
        assert "reservation llm/wl-1-abcde" in next(iter(elsewhere["FailedNodes"].values()))

    run(tmp_path, body)


def test_prioritize_prefers_the_best_fit_node(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        got = await scores(client, pod_obj("tp4", gpus=4))
        assert got["h-3"] == 10  # exactly its four free NVLink GPUs: nothing left over
        assert got["h-3"] > got["h-0"] > got["p-0"] > 0
        assert got["h-0"] == got["h-1"] == got["h-2"]
        assert all(0 <= s <= 10 for s in got.values())
        eight = await scores(client, pod_obj("tp8", gpus=8))
        assert eight["h-3"] == 0 and eight["l-0"] == 0 and eight["h-0"] == 10

    run(tmp_path, body)


def test_bind_picks_the_gpu_set_and_records_it(tmp_path: Path) -> None:
    binder = LocalBinder()

    async def body(client: Client, cache: ClusterCache) -> None:
        client.app[DECIDER]  # app built
        pod = pod_obj("tp4", gpus=4)
        await filter_(client, pod)
        assert await bind(client, pod, "h-3") == ""
        assert cache.snapshot().free_gpus("h-3") == frozenset()
        pod2 = pod_obj("tp4b", gpus=4)
        await filter_(client, pod2)
        assert "no longer has 4 free GPUs" in await bind(client, pod2, "h-3")
        assert "not known" in await bind(client, pod_obj("never-seen"), "h-0")

    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        app = build_app(cache, binder=binder)
        async with client_for(app) as client:
            await body(client, cache)

    asyncio.run(go())
    nics = "mlx5_5,mlx5_6,mlx5_7,mlx5_8"  # the NIC on each GPU's switch
    ucx = ",".join(f"{n}:1" for n in nics.split(","))
    written = {keys.NICS: nics, keys.NCCL_IB_HCA: f"={nics}", keys.UCX_NET_DEVICES: ucx}
    assert binder.bound == [("llm/tp4", "h-3", {keys.GPUS: "4,5,6,7", keys.NUMA_NODE: "1", **written})]


def test_bind_through_the_api_writes_annotations_and_the_binding(tmp_path: Path) -> None:
    api = FakeKube()
    pod = gang_pod("g-0", "g", 2, 8)
    api.put(Kind.PODS, pod)

    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod)
        node = got["NodeNames"][0]
        assert await bind(client, pod, node) == ""
        r = cache.reservation("llm/g")
        assert r is not None and list(r.bound.values()) == ["g-0"]
        slot = r.slot_of("g-0")
        assert slot is not None and slot.node == node
        stored = api.peek(Kind.PODS, "g-0", "llm")
        assert stored is not None and stored["spec"]["nodeName"] == node
        assert stored["metadata"]["annotations"][keys.GPUS] == ",".join(map(str, slot.gpus))
        assert stored["metadata"]["annotations"][keys.NUMA_NODE] == ",".join(map(str, slot.numa_nodes))

    run(tmp_path, body, api)
    # One write: the Binding carries the annotations (no patch of the pod).
    assert [c.label for c in api.writes(Kind.PODS)] == ["create pods/binding"]


def test_a_failed_bind_releases_the_slot_and_says_why(tmp_path: Path) -> None:
    api = FakeKube()
    pod = gang_pod("g-0", "g", 2, 8)
    api.put(Kind.PODS, pod)
    api.fail_next("create pods/binding", KubeError(409, "pod is being deleted"))

    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod)
        error = await bind(client, pod, got["NodeNames"][0])
        assert "pod is being deleted" in error
        r = cache.reservation("llm/g")
        assert r is not None and r.bound == {}
        assert cache.pod("llm", "g-0") is not None
        assert cache.snapshot().free_gpus(got["NodeNames"][0]) == frozenset(range(8))
        # and the retry succeeds on the same slot
        assert await bind(client, pod, got["NodeNames"][0]) == ""

    run(tmp_path, body, api)


def test_bind_to_a_node_without_a_free_slot_is_refused(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        pod = gang_pod("g-0", "g", 1, 8)
        got = await filter_(client, pod)
        elsewhere = next(n for n in ALL if n not in got["NodeNames"])
        assert "no free slot" in await bind(client, pod, elsewhere)
        r = cache.reservation("llm/g")
        assert r is not None and r.bound == {}

    run(tmp_path, body)


def test_preempt_keeps_only_nodes_where_the_victims_make_room(tmp_path: Path) -> None:
    async def body(client: Client, cache: ClusterCache) -> None:
        a, b = pod_obj("a", gpus=4), pod_obj("b", gpus=4)
        for p in (a, b):
            await filter_(client, p, ["h-0"])
            assert await bind(client, p, "h-0") == ""
        uid_a, uid_b = a["metadata"]["uid"], b["metadata"]["uid"]
        request = {
            "Pod": pod_obj("big", gpus=8),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "h-0": {"Pods": [{"UID": uid_a}, {"UID": uid_b}], "NumPDBViolations": 1},
                "h-3": {"Pods": [{"UID": uid_a}], "NumPDBViolations": 0},
            },
        }
        got = await post(client, "preempt", request)
        assert got == {
            "NodeNameToMetaVictims": {
                "h-0": {"Pods": [{"UID": uid_a}, {"UID": uid_b}], "NumPDBViolations": 1}
            }
        }
        one = {**request, "NodeNameToMetaVictims": {"h-0": {"Pods": [{"UID": uid_a}], "NumPDBViolations": 0}}}
        assert await post(client, "preempt", one) == {"NodeNameToMetaVictims": {}}
        cpu = {**request, "Pod": pod_obj("web")}
        assert set((await post(client, "preempt", cpu))["NodeNameToMetaVictims"]) == {"h-0", "h-3"}

    run(tmp_path, body)


def test_an_internal_error_is_a_200_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.httpapi.decide import Decider

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("the solver caught fire")

    monkeypatch.setattr(Decider, "filter", boom)

    async def body(client: Client, cache: ClusterCache) -> None:
        got = await filter_(client, pod_obj("x", gpus=1))
        assert "internal error" in got["Error"] and "the solver caught fire" in got["Error"]
        assert got["NodeNames"] == []
        health = await client.get("/healthz")
        assert health.status == 200

    run(tmp_path, body)


def test_a_restart_rebuilds_the_same_reservation_and_doubles_nothing(tmp_path: Path) -> None:
    from extender.reservations.store import InMemoryReservationStore

    store = InMemoryReservationStore()
    path = write_cluster(tmp_path)
    first_pod = gang_pod("g-0", "g", 3, 8, extra={keys.COMM: "allreduce"})
    second_pod = gang_pod("g-1", "g", 3, 8, extra={keys.COMM: "allreduce"})

    async def life(pod: dict[str, Any], bind_it: bool) -> tuple[list[str], dict[str, Any]]:
        cache = ClusterCache.from_cluster_file(path, store=store)
        await cache.rebuild_ledger()
        async with client_for(build_app(cache)) as client:
            got = await filter_(client, pod)
            if bind_it:
                assert await bind(client, pod, got["NodeNames"][0]) == ""
        return got["NodeNames"], cache.ledger.to_dict()

    before, ledger_before = asyncio.run(life(first_pod, bind_it=True))
    after, ledger_after = asyncio.run(life(second_pod, bind_it=False))
    assert len(store.objects) == 1
    assert ledger_after["reservations"] == ledger_before["reservations"]
    r = ledger_after["reservations"][0]
    bound_node = r["slice"]["pods"][int(next(iter(r["bound"])).split("/")[1])]["node"]
    # the restarted service still knows g-0 holds its slot, so g-1 is offered the other two
    assert list(r["bound"].values()) == ["g-0"]
    assert after == sorted(set(before) - {bound_node})


class _SlowStore(InMemoryReservationStore):
    """Saves only while ``go`` is set: a SliceReservation write that takes a while."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.go.set()

    async def save(self, r: Reservation, mismatches: Sequence[DeviceMismatch] = ()) -> None:
        await self.go.wait()
        await super().save(r, mismatches)


def test_only_a_new_reservation_gates_the_filter_and_binds_answer_before_their_save(tmp_path: Path) -> None:
    """The filter that reserves a gang answers once its SliceReservation is saved (the promise
    must outlive a restart); after that, kube-scheduler's one scheduling loop never waits on
    the store: a bind and the next member's filter answer while the bind's update is still
    being written, and the update lands afterwards."""
    store = _SlowStore()
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path), store=store)

    async def go() -> None:
        app = build_app(cache)
        async with client_for(app) as client:
            first, second = gang_pod("g-0", "g", 2, 8), gang_pod("g-1", "g", 2, 8)
            got = await asyncio.wait_for(filter_(client, first), 5)
            assert got["NodeNames"] and len(store.objects) == 1  # saved before the reply
            store.go.clear()  # from here on every write waits
            assert await asyncio.wait_for(bind(client, first, got["NodeNames"][0]), 5) == ""
            again = await asyncio.wait_for(filter_(client, second), 5)
            assert again["NodeNames"]
            (held,) = store.objects.values()
            assert not (held.get("status") or {}).get("boundPods")  # the bind's update waits
            store.go.set()
            for _ in range(100):
                await asyncio.sleep(0.01)
                (saved,) = store.objects.values()
                if cache.unflushed == 0 and (saved.get("status") or {}).get("boundPods"):
                    break
            (saved,) = store.objects.values()
            assert saved["status"]["boundPods"], saved["status"]

    asyncio.run(go())


def test_a_second_bind_to_another_node_is_refused_and_keeps_the_gpus(tmp_path: Path) -> None:
    """kube-scheduler binds again when a bind answered past its httpTimeout, possibly to
    another node: the pod stays where it is, with its GPUs, and nothing is written for it."""
    binder = LocalBinder()
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path))

    async def go() -> None:
        app = build_app(cache, binder=binder)
        async with client_for(app) as client:
            pod = pod_obj("tp2", gpus=2)
            await filter_(client, pod)
            assert await bind(client, pod, "h-0") == ""
            held = cache.snapshot().free_gpus("h-0")
            got = await bind(client, pod, "h-1")
            assert "already bound to node h-0" in got, got  # extender/httpapi/checks.py
            assert await bind(client, pod, "h-0") == ""  # the same node again is fine
            assert cache.snapshot().free_gpus("h-0") == held
            assert cache.snapshot().free_gpus("h-1") == frozenset(range(8))

    asyncio.run(go())
    assert [node for _, node, _ in binder.bound] == ["h-0", "h-0"]
    assert binder.bound[0][2] == binder.bound[1][2]


def test_filter_and_bind_follow_the_device_plugin_on_its_nodes(tmp_path: Path) -> None:
    """Two dual-socket PCIe boxes with GPUs 0-4 free, one under the device plugin and one
    under DRA. A 3-GPU pod that must stay in one socket: the device-plugin node fails the
    filter with the plugin's answer named (0,1,4, across the sockets); the DRA node passes and
    bind gives it 0,1,2."""
    text = "".join(
        f"  - {{name: {name}, gpuTopology: pcie-8gpu-2socket, allocatedGpus: [5, 6, 7], "
        f"allocation: {mode}}}\n"
        for name, mode in (("plugin-0", "devicePlugin"), ("dra-0", "dra"))
    )
    cache = ClusterCache.from_cluster_file(write_cluster(tmp_path, "nodes:\n" + text))
    binder = LocalBinder()

    async def go() -> None:
        app = build_app(cache, binder=binder)
        async with client_for(app) as client:
            pod = pod_obj("tp3", gpus=3, annotations={keys.REQUIRED_LEVEL: "numa"})
            got = await filter_(client, pod, ["plugin-0", "dra-0"])
            assert got["NodeNames"] == ["dra-0"]
            why = got["FailedNodes"]["plugin-0"]
            assert "the device plugin may answer GPUs 0,1,4" in why, why
            assert await bind(client, pod, "dra-0") == ""

    asyncio.run(go())
    nic = {keys.NICS: "NIC0", keys.NCCL_IB_HCA: "=NIC0", keys.UCX_NET_DEVICES: "NIC0:1"}  # the socket's NIC
    assert binder.bound == [("llm/tp3", "dra-0", {keys.GPUS: "0,1,2", keys.NUMA_NODE: "0", **nic})]
