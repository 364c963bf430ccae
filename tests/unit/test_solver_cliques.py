"""Multi-node NVLink cliques (GB200 NVL72 racks) are kept for the pod sets that use them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from extender.cost import Comm
from extender.placement import scoring
from extender.placement.feasibility import NodeFacts, Resources
from extender.placement.ledger import Ledger
from extender.placement.request import Colocation, GangRequest, PodRequests, PodSet
from extender.placement.slice import PodSlot, Slice, Unplaceable
from extender.placement.snapshot import ClusterSnapshot
from extender.placement.solver import Solver
from extender.sim.inputs import default_cluster
from extender.sim.templates import builtin_templates
from extender.testing.builders import make_node
from extender.topology.hierarchy import Hierarchy, Level

LEAF = "fabric.topograph.run/tier-0"
CLIQUE = "nvidia.com/gpu.clique"
HIERARCHY = Hierarchy((Level("leaf", LEAF), Level("clique", CLIQUE, kind="fabric")))


#: Nodes outside a clique sit under leaf-1, GB200 trays under leaf-c (a case names the clique).
NODE = make_node().leaf("leaf-1")
TRAY = make_node().gb200_tray().leaf("leaf-c")


def mixed(**allocated: range) -> ClusterSnapshot:
    """One HGX H100 node, one dual-socket PCIe box and four GB200 trays in one clique."""
    nodes = [
        NODE.named("hgx").hgx_h100().allocated(allocated.get("hgx", ())).obj(),
        NODE.named("pcie").pcie_8gpu_2socket().obj(),
    ]
    nodes += [TRAY.named(f"tray{i}").clique("nvl72.0").obj() for i in range(4)]
    return ClusterSnapshot(nodes, HIERARCHY)


def one(
    name: str, count: int, gpus: int, comm: Comm = Comm.ALLREDUCE, required_level: str | None = None
) -> GangRequest:
    return GangRequest(name, (PodSet("p", count, gpus, comm, required_level=required_level),))


def placed(snap: ClusterSnapshot, gang: GangRequest) -> Slice:
    got = Solver(snap).place(gang)
    assert isinstance(got, Slice), got
    assert scoring.violations(snap, gang, got.slots) == []
    return got


def on_cliques(snap: ClusterSnapshot, sl: Slice) -> set[str]:
    return {n for n in sl.nodes if snap.clique(snap.index(n)) is not None}


def test_single_node_pods_stay_off_the_default_clusters_nvl72_racks() -> None:
    """The simulator's finding: 1-, 2- and 4-GPU servers took GB200 trays (the fastest
    NVLink) until no rack was whole, and every gang needing a whole NVL72 clique starved."""
    snap = default_cluster()
    templates = builtin_templates()
    for name in ("llama-8b-tp1", "qwen-14b-tp2", "llama-70b-fp8-tp4", "llama-70b-tp8"):
        sl = placed(snap, templates[name])
        assert on_cliques(snap, sl) == set(), (name, sl.nodes)
        assert scoring.fabric_waste(snap, templates[name], sl.slots) == 0
    for name in ("deepseek-v3-wideep-nvl72-8", "deepseek-v3-wideep-nvl72-16", "deepseek-v3-pd-nvl72"):
        gang = templates[name]
        sl = placed(snap, gang)
        assert on_cliques(snap, sl) == set(sl.nodes), name
        assert scoring.fabric_waste(snap, gang, sl.slots) == 0
        assert set(sl.mnnvl_nodes) == set(sl.nodes)


def test_clique_nodes_are_the_last_resort_and_a_whole_rack_stays_free() -> None:
    """Small servers fill every node outside the clique first (even slow PCIe GPUs), take
    trays only when nothing else fits, and a gang needing the whole clique then still fits."""
    snap = mixed()
    ledger = Ledger()
    order: list[str] = []
    for k in range(8):  # 16 GPUs outside the clique, 2 at a time
        sl = placed(ledger.view(snap), one(f"s{k}", 1, 2, Comm.NONE))
        ledger.reserve(sl, now=0.0)
        order.append(sl.slots[0].node)
    assert set(order) == {"hgx", "pcie"}
    wide = one("wide", 4, 4, Comm.ALLTOALL, required_level="clique")
    sl = placed(ledger.view(snap), wide)
    assert set(sl.nodes) == {f"tray{i}" for i in range(4)}
    # With nothing left outside, a small server takes a tray rather than wait.
    last = placed(ledger.view(snap), one("last", 1, 2, Comm.NONE))
    assert on_cliques(snap, last) == {last.slots[0].node}


def test_fabric_waste_comes_before_cost() -> None:
    # TP=4 on a tray is faster than on one socket of a PCIe box; it still goes to the box.
    snap = mixed(hgx=range(8))
    gang = one("tp4", 1, 4)
    sl = placed(snap, gang)
    assert sl.nodes == ("pcie",)
    tray = placed(ClusterSnapshot([n for n in snap.nodes if n.name.startswith("tray")], HIERARCHY), gang)
    assert tray.per_layer_micros < sl.per_layer_micros


def test_a_wish_given_up_for_the_clique_says_why() -> None:
    snap = mixed(hgx=range(8))
    sl = placed(snap, GangRequest("g", (PodSet("p", 1, 2, Comm.ALLREDUCE, preferred_level="nvlink"),)))
    assert sl.nodes == ("pcie",)
    assert sl.notes == (
        "pod set p: preferred level nvlink not met; placed within node pcie (keeping it would take "
        "2 GPUs of a multi-node NVLink clique without using its NVLink)",
    )


def test_a_kv_transfer_set_next_to_its_partner_in_the_clique_uses_the_fabric() -> None:
    """Decode that takes its KV cache over NVLink from prefill on other trays of the clique
    is on the fabric: it goes into the clique with prefill, not off it."""
    snap = mixed()
    prefill = PodSet("prefill", 2, 4, Comm.ALLTOALL, required_level="clique")
    decode = PodSet("decode", 1, 4, Comm.KV_TRANSFER, colocate_with=Colocation("prefill", "clique"))
    gang = GangRequest("pd", (prefill, decode))
    sl = placed(snap, gang)
    assert on_cliques(snap, sl) == set(sl.nodes)
    assert scoring.fabric_waste(snap, gang, sl.slots) == 0
    assert sl.notes == ()


# --- pods that do not talk claim no IMEX channel ------------------------------------------------


def trays_only(imex_owner: str | None = None) -> ClusterSnapshot:
    nodes = [TRAY.named(f"tray{i}").clique("nvl72.0").obj() for i in range(3)]
    nodes[0] = replace(nodes[0], mnnvl_gang=imex_owner)
    return ClusterSnapshot(nodes, HIERARCHY)


def test_pods_that_do_not_talk_claim_no_nvlink_channel() -> None:
    snap = trays_only()
    quiet = one("quiet", 3, 4, Comm.NONE)
    sl = placed(snap, quiet)
    assert len(sl.nodes) == 3
    assert sl.mnnvl_nodes == ()
    # The same spread with pods that talk claims every tray it spans.
    loud = placed(snap, one("loud", 3, 4, Comm.ALLREDUCE))
    assert loud.mnnvl_nodes == loud.nodes


@pytest.mark.parametrize("comm", [Comm.NONE, Comm.KV_TRANSFER])
def test_pods_that_do_not_talk_may_use_a_node_whose_channel_another_gang_holds(comm: Comm) -> None:
    """One multi-node NVLink gang per node binds only gangs that use the channel: a pod set
    whose pods do not talk (comm none, or kv-transfer with no partner) spans the trays anyway,
    and both reservations are held side by side."""
    snap = trays_only(imex_owner="other")
    quiet = one("quiet", 3, 4, comm)
    sl = placed(snap, quiet)
    assert "tray0" in sl.nodes and sl.mnnvl_nodes == ()
    ledger = Ledger()
    ledger.reserve(Slice("other", (), {}, mnnvl_nodes=("tray0",)), now=0.0)
    ledger.reserve(sl, now=0.0)
    assert ledger.mnnvl() == {"tray0": "other"}
    # Pods that talk may not use tray0, and 3 pods of 4 GPUs do not fit the two others.
    got = Solver(snap).place(one("loud", 3, 4, Comm.ALLREDUCE))
    assert isinstance(got, Unplaceable), got


def test_pods_that_do_not_talk_may_mix_clique_and_other_nodes() -> None:
    snap = mixed(hgx=range(4))
    # Room for 4-GPU pods: 1 on the HGX node, 2 on the PCIe box, 4 on the trays; 6 pods need
    # trays too, and take as few as they can.
    quiet = one("quiet", 6, 4, Comm.NONE)
    sl = placed(snap, quiet)
    assert {"hgx", "pcie"} <= set(sl.nodes)
    assert scoring.fabric_waste(snap, quiet, sl.slots) == 12
    assert sl.mnnvl_nodes == ()
    # Pods that talk stay in the clique or out of it, and neither holds 6.
    assert isinstance(Solver(snap).place(one("loud", 6, 4, Comm.ALLREDUCE)), Unplaceable)


def two_cliques(**allocated: tuple[int, ...]) -> ClusterSnapshot:
    """One whole HGX H100 node and two cliques of two GB200 trays each."""
    nodes = [NODE.named("hgx").hgx_h100().obj()]
    for c in (0, 1):
        nodes += [
            TRAY.named(f"t{c}{k}").clique(f"nvl72.{c}").allocated(allocated.get(f"t{c}{k}", ())).obj()
            for k in range(2)
        ]
    return ClusterSnapshot(nodes, HIERARCHY)


def test_pods_off_the_fabric_fill_a_clique_they_already_use_before_breaking_a_whole_node() -> None:
    """A clique whose trays already carry pods off the fabric (no gang holds its NVLink
    channel) is no longer whole for a gang that needs the rack: a small replica goes there
    rather than break a whole node outside cliques, and the untouched clique stays whole."""
    gang = one("tp2", 1, 2)
    clean = two_cliques()
    assert clean.spilled_cliques() == frozenset()
    assert placed(clean, gang).nodes == ("hgx",)
    spilled = two_cliques(t11=(0,))
    assert spilled.spilled_cliques() == {spilled.clique(spilled.index("t11"))}
    sl = placed(spilled, gang)
    assert set(sl.nodes) <= {"t10", "t11"}, sl.nodes
    assert scoring.fabric_waste(spilled, gang, sl.slots) == 0
    # A clique whose NVLink channel a gang holds is in use by the fabric, not spilled.
    held = ClusterSnapshot(spilled.nodes, HIERARCHY, reserved_mnnvl={"t11": "nvl72-gang"})
    assert held.spilled_cliques() == frozenset()
    assert placed(held, gang).nodes == ("hgx",)


# --- ComputeDomains: the IMEX daemon's room, and domains of someone else ------------------------


def trays_with_pods(slots_left: dict[int, int], trays: int = 3) -> ClusterSnapshot:
    """GB200 trays in one clique that take 8 pods each; ``slots_left``: tray -> pod slots left."""
    nodes = []
    for i in range(trays):
        left = slots_left.get(i, 8)
        facts = NodeFacts(allocatable=Resources(pods=8), requested=Resources(0, 0, 0, 8 - left))
        nodes.append(TRAY.named(f"tray{i}").clique("nvl72.0").facts(facts).obj())
    return ClusterSnapshot(nodes, HIERARCHY)


def test_a_clique_node_without_room_for_the_imex_daemon_next_to_the_pod_is_not_chosen() -> None:
    """tray0 has one pod slot left: the gang's pod fits, the IMEX daemon NVIDIA's driver starts
    on each node of the gang's ComputeDomain does not (it takes a pod slot of its own)."""
    snap = trays_with_pods({0: 1})
    sl = placed(snap, one("ep", 2, 4))
    assert "tray0" not in sl.nodes and len(sl.mnnvl_nodes) == 2
    # Two slots left: the pod and the daemon fit.
    assert "tray0" in placed(trays_with_pods({0: 2}), one("ep", 2, 4)).nodes
    # Pods that do not talk join no ComputeDomain: no daemon, tray0 serves.
    assert "tray0" in placed(snap, one("quiet", 3, 4, Comm.NONE)).nodes


def test_the_daemon_s_own_requests_count_where_the_driver_gives_it_some() -> None:
    daemon = Resources(500, 0, 0, 1)
    nodes = []
    for i, cpu in enumerate((4_000, 64_000, 64_000)):
        facts = NodeFacts(allocatable=Resources(cpu_millis=cpu), imex_daemon=daemon)
        nodes.append(TRAY.named(f"tray{i}").clique("nvl72.0").facts(facts).obj())
    snap = ClusterSnapshot(nodes, HIERARCHY)
    gang = GangRequest("ep", (PodSet("p", 2, 4, Comm.ALLTOALL, requests=PodRequests(cpu_millis=4_000)),))
    sl = placed(snap, gang)
    assert "tray0" not in sl.nodes  # 4000m: the pod fits, the pod and the daemon's 500m do not


def test_no_clique_node_with_room_for_the_daemon_leaves_the_gang_unplaceable_saying_so() -> None:
    snap = trays_with_pods({0: 1, 1: 1}, trays=2)
    got = Solver(snap).place(one("ep", 2, 4))
    assert isinstance(got, Unplaceable)
    assert "no room for a pod next to the IMEX daemon pod" in got.reason and "tray0" in got.reason, got.reason
    # The same two trays break the rule in a slice handed in (a verify, an exact search).
    crossing = [PodSlot("p", 0, "tray0", (0, 1, 2, 3)), PodSlot("p", 1, "tray1", (0, 1, 2, 3))]
    problems = scoring.violations(snap, one("ep", 2, 4), crossing)
    assert any("with the IMEX daemon pod of the gang's ComputeDomain" in p for p in problems), problems


def test_a_node_already_in_the_gang_s_domain_has_its_daemon_counted_once() -> None:
    """The driver's label names the gang's own domain: its daemon pod is one of the node's pods
    already (``requested``), so no second one is kept room for."""
    snap = trays_with_pods({0: 1, 1: 1}, trays=2)
    snap = ClusterSnapshot([replace(n, mnnvl_gang="ep") for n in snap.nodes], HIERARCHY)
    assert set(placed(snap, one("ep", 2, 4)).nodes) == {"tray0", "tray1"}


def test_a_node_in_a_compute_domain_of_someone_else_is_no_fit_for_a_clique_pod_set() -> None:
    words = "ComputeDomain 0f3e (resource.nvidia.com/computeDomain), not created or adopted by gangslice"
    nodes = [TRAY.named(f"tray{i}").clique("nvl72.0").obj() for i in range(3)]
    nodes[0] = replace(nodes[0], foreign_domain=words)
    snap = ClusterSnapshot(nodes, HIERARCHY)
    sl = placed(snap, one("ep", 2, 4))
    assert "tray0" not in sl.nodes
    # A pod on one node joins no domain: tray0 serves it.
    assert placed(ClusterSnapshot(nodes[:1], HIERARCHY), one("solo", 1, 4)).nodes == ("tray0",)
    got = Solver(ClusterSnapshot(nodes[:2], HIERARCHY)).place(one("ep", 2, 4))
    assert isinstance(got, Unplaceable)
    assert f"tray0 ({words})" in got.reason, got.reason
    crossing = [PodSlot("p", 0, "tray0", (0, 1, 2, 3)), PodSlot("p", 1, "tray1", (0, 1, 2, 3))]
    assert any(
        f"node tray0's NVLink channel is held by {words}" in p
        for p in scoring.violations(snap, one("ep", 2, 4), crossing)
    )
    # No gang owns it, not even one whose name is the words.
    assert not snap.channel_free(words, 0) and snap.channel_free("ep", 1)


def test_an_unhealthy_gpu_does_not_open_a_clique_to_small_replicas() -> None:
    from dataclasses import replace

    clean = two_cliques()
    nodes = list(clean.nodes)
    i = clean.index("t11")
    nodes[i] = replace(nodes[i], unhealthy=frozenset({0}))
    faulty = ClusterSnapshot(nodes, clean.hierarchy)
    assert faulty.spilled_cliques() == frozenset()
    assert placed(faulty, one("tp2", 1, 2)).nodes == placed(clean, one("tp2", 1, 2)).nodes
