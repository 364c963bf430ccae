"""On a device-plugin node the in-node choice is the plugin's, for every policy; on a DRA node
it is gangslice's own (plain data: shipped presets and example files)."""

from __future__ import annotations

from pathlib import Path

from extender.cost import Comm
from extender.peers import POLICIES
from extender.placement import choice
from extender.placement.exact import exact_slice
from extender.placement.files import load_gang
from extender.placement.plugin_fit import plugin_pick
from extender.placement.request import GangRequest, PodSet
from extender.placement.scoring import resolve_need, violations
from extender.placement.slice import Placement, Slice, Unplaceable
from extender.placement.solver import Solver
from extender.testing.builders import make_cluster, make_node
from extender.testing.hardware import hgx_h100, pcie_8gpu_2socket
from extender.topology.device_plugin import plugin_view, preferred_allocation
from extender.topology.kubelet import KubeletAlignment, NumaNode, TopologyPolicy
from extender.topology.model import Tier

ROOT = Path(__file__).resolve().parents[2]
PCIE = pcie_8gpu_2socket()
HGX = hgx_h100()


#: The nodes here sit under one leaf; a case says which GPUs are free and who picks them.
PCIE_NODE = make_node().pcie_8gpu_2socket().leaf("l0")
HGX_NODE = make_node().hgx_h100().leaf("l0")
CLUSTER = make_cluster().levels("leaf")


def socket_gang(count: int = 1) -> GangRequest:
    """3-GPU pods that must stay within one socket (NUMA node)."""
    return GangRequest("g", (PodSet("tp", count, 3, Comm.ALLREDUCE, required_level="numa"),))


def placed(result: Placement) -> Slice:
    assert isinstance(result, Slice), getattr(result, "reason", result)
    return result


def test_a_socket_tier_pod_set_does_not_fit_where_the_plugin_crosses_sockets() -> None:
    """GPUs 0-4 free on the dual-socket PCIe box: gangslice's own choice is 0,1,2 (socket 0);
    the plugin keeps the PIX pair 2,3 whole and answers 0,1,4 across the sockets, so under
    the device plugin the node is no fit, and the reason names the plugin's answer."""
    g = socket_gang()
    dra = placed(Solver(CLUSTER.nodes(PCIE_NODE.named("p").dra().free(0, 1, 2, 3, 4)).obj()).place(g))
    assert dra.slots[0].gpus == (0, 1, 2)
    got = Solver(CLUSTER.nodes(PCIE_NODE.named("p").device_plugin().free(0, 1, 2, 3, 4)).obj()).place(g)
    assert isinstance(got, Unplaceable)
    assert "the device plugin may answer GPUs 0,1,4" in got.reason, got.reason
    assert "looser than NUMA-local" in got.reason, got.reason


def test_the_solver_goes_where_the_plugin_keeps_the_tier() -> None:
    """The same box beside one whose free GPUs the plugin serves within a socket: the pod goes
    to the second, with the GPUs the plugin hands out there."""
    s = CLUSTER.nodes(
        PCIE_NODE.named("a").device_plugin().free(0, 1, 2, 3, 4),
        PCIE_NODE.named("b").device_plugin().free(4, 5, 6, 7),
    ).obj()
    got = placed(Solver(s).place(socket_gang()))
    assert [(x.node, x.gpus) for x in got.slots] == [("b", (4, 5, 6))]
    b = s.node("b")
    assert plugin_pick(b.graph, s.free_mask(1), 3, Tier.NUMA, 1) == (b.shape.mask_of((4, 5, 6)),)
    assert violations(s, socket_gang(), got.slots) == []


def test_capacity_is_what_the_plugin_serves() -> None:
    """Whole box, pods of 2 GPUs within one PCIe switch: the own choice and the plugin both
    serve 4 (the plugin answers the switch pairs in turn); with 0,1,2,4 free, own choice and
    plugin serve 1 (only 0,1 is a switch pair)."""
    full = PCIE_NODE.named("p").device_plugin().obj()
    assert choice.capacity(full, full.shape.full_mask, 2, Tier.PIX) == 4
    some = full.shape.mask_of((0, 1, 2, 4))
    assert choice.capacity(full, some, 2, Tier.PIX) == 1
    # 3 GPUs within a socket from 0-4: own choice serves 1, the plugin none.
    mask = full.shape.mask_of((0, 1, 2, 3, 4))
    assert choice.capacity(PCIE_NODE.named("d").dra().obj(), mask, 3, Tier.NUMA) == 1
    assert choice.capacity(full, mask, 3, Tier.NUMA) == 0


def test_slots_record_the_plugins_sets_in_allocation_order() -> None:
    """Four 2-GPU pods on one device-plugin box: each slot holds the plugin's answer for the
    GPUs the pods before it left (the order the kubelet allocates them in)."""
    s = CLUSTER.nodes(PCIE_NODE.named("p").device_plugin()).obj()
    g = GangRequest("g", (PodSet("tp", 4, 2, Comm.NONE, required_level="pcie"),))
    got = placed(Solver(s).place(g))
    view = plugin_view(PCIE)
    free = set(PCIE.indices)
    for slot in sorted(got.slots, key=lambda x: x.index):
        answer = preferred_allocation(view, tuple(sorted(free)), 2)
        assert slot.gpus == answer.gpus
        free -= set(answer.gpus)


def test_one_node_type_in_two_modes_is_two_kinds() -> None:
    """The memo tables are per (node type, allocation mode): the same shape and free GPUs give
    the DRA node a fit and the device-plugin node none within one solve."""
    s = CLUSTER.nodes(
        PCIE_NODE.named("a-plugin").device_plugin().free(0, 1, 2, 3, 4),
        PCIE_NODE.named("b-dra").dra().free(0, 1, 2, 3, 4),
    ).obj()
    assert s.kinds()[0] != s.kinds()[1]
    got = placed(Solver(s).place(socket_gang()))
    assert [(x.node, x.gpus) for x in got.slots] == [("b-dra", (0, 1, 2))]
    # Two pods: only the DRA node serves one, so the gang does not fit, and the reason
    # says what the device plugin does on the other.
    two = Solver(s).place(socket_gang(2))
    assert isinstance(two, Unplaceable)
    assert (
        "node a-plugin's free GPUs hold 1 such pods, but the device plugin may answer GPUs 0,1,4"
        in two.reason
    )


def test_the_exact_search_follows_the_plugin() -> None:
    s = CLUSTER.nodes(
        PCIE_NODE.named("a").device_plugin().free(0, 1, 2, 3, 4),
        PCIE_NODE.named("b").device_plugin().free(4, 5, 6, 7),
    ).obj()
    g = socket_gang()
    got = exact_slice(s, g, {ps.name: resolve_need(ps, s.hierarchy) for ps in g.pod_sets})
    assert got is not None
    assert [(x.node, x.gpus) for x in got.slots] == [("b", (4, 5, 6))]
    alone = CLUSTER.nodes(PCIE_NODE.named("a").device_plugin().free(0, 1, 2, 3, 4)).obj()
    assert exact_slice(alone, g, {"tp": resolve_need(g.pod_sets[0], alone.hierarchy)}) is None


def test_every_baseline_gets_the_plugins_choice() -> None:
    """The peers choose the node only; on a device-plugin node the pod gets the plugin's set
    (0,1,4 across the sockets here), on a DRA node the lowest free GPUs."""
    g = GangRequest("g", (PodSet("tp", 1, 3, Comm.ALLREDUCE),))
    for name in ("spread", "binpack", "kueue-tas", "volcano", "kai"):
        on_plugin = placed(
            POLICIES[name](CLUSTER.nodes(PCIE_NODE.named("p").device_plugin().free(0, 1, 2, 3, 4)).obj(), g)
        )
        assert on_plugin.slots[0].gpus == (0, 1, 4), name
        on_dra = placed(
            POLICIES[name](CLUSTER.nodes(PCIE_NODE.named("p").dra().free(0, 1, 2, 3, 4)).obj(), g)
        )
        assert on_dra.slots[0].gpus == (0, 1, 2), name


def test_pd_pair_on_hgx_under_the_device_plugin_and_under_dra() -> None:
    """The shipped P/D gang on two HGX H100 nodes. Under DRA the slots are gangslice's own
    choice; under the device plugin each is the plugin's answer, and on an NVSwitch board
    every answer the plugin may give keeps the pods' GPUs NVLink-connected, so the node stays
    a fit. The plugin ranks the two sockets' 4-sets alike, so which one a pod gets is the
    kubelet's map order: both are possible answers, and the agent's report settles it."""
    gang = load_gang(ROOT / "examples" / "gangs" / "pd-pair.yaml")
    dra = placed(
        Solver(CLUSTER.nodes(HGX_NODE.named("h0").dra(), HGX_NODE.named("h1").dra()).obj()).place(gang)
    )
    s = CLUSTER.nodes(HGX_NODE.named("h0").device_plugin(), HGX_NODE.named("h1").device_plugin()).obj()
    plugin = placed(Solver(s).place(gang))
    assert violations(s, gang, plugin.slots) == []
    assert plugin.per_layer_micros == dra.per_layer_micros
    view = plugin_view(HGX)
    for name in sorted({x.node for x in plugin.slots}):
        free = set(HGX.indices)
        for slot in [x for x in plugin.slots if x.node == name]:
            answer = preferred_allocation(view, tuple(sorted(free)), 4)
            assert slot.gpus == answer.gpus
            assert all(HGX.shape.tier_of(HGX.shape.mask_of(p)) == Tier.NVLINK for p in answer.possible)
            free -= set(answer.gpus)
    first = preferred_allocation(view, HGX.indices, 4)
    assert first.possible == {frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})}


def test_pd_pair_on_pcie_boxes_differs_by_mode() -> None:
    """The P/D gang with 3-GPU pods on two dual-socket PCIe boxes that each have GPUs 0-4 free
    (the default rule: each pod within one socket). Under DRA each box serves one pod (0,1,2);
    under the device plugin neither box serves a pod within a socket."""
    gang = load_gang(ROOT / "examples" / "gangs" / "pd-pair.yaml")
    small = GangRequest(
        gang.name,
        tuple(PodSet(ps.name, 1, 3, ps.comm, colocate_with=ps.colocate_with) for ps in gang.pod_sets),
    )
    dra = CLUSTER.nodes(
        PCIE_NODE.named("p0").dra().free(0, 1, 2, 3, 4), PCIE_NODE.named("p1").dra().free(0, 1, 2, 3, 4)
    ).obj()
    got = placed(Solver(dra).place(small))
    assert sorted(x.gpus for x in got.slots) == [(0, 1, 2), (0, 1, 2)]
    plugin = CLUSTER.nodes(
        PCIE_NODE.named("p0").device_plugin().free(0, 1, 2, 3, 4),
        PCIE_NODE.named("p1").device_plugin().free(0, 1, 2, 3, 4),
    ).obj()
    refused = Solver(plugin).place(small)
    assert isinstance(refused, Unplaceable)
    assert "device plugin" in refused.reason


def test_under_single_numa_node_the_plugin_picks_among_the_gpus_of_the_numa_node_offered() -> None:
    """The kubelet's devicemanager hands the plugin only the GPUs of the NUMA node the Topology
    Manager aligned the pod to. On the dual-socket box with GPUs 0-4 free the plugin alone
    answers 0,1,4 across the sockets; with single-numa-node the kubelet offers socket 0's
    0-3, so the pod gets the plugin's answer among those and the socket-tier pod set fits,
    in the solver, the exact search and every baseline alike."""
    numa = tuple(NumaNode(n, 32, 0, None, 0) for n in range(2))
    aligned = KubeletAlignment(TopologyPolicy.SINGLE_NUMA_NODE, numa_nodes=numa)
    s = CLUSTER.nodes(PCIE_NODE.named("p").device_plugin().free(0, 1, 2, 3, 4).kubelet(aligned)).obj()
    g = socket_gang()
    expected = preferred_allocation(plugin_view(PCIE), (0, 1, 2, 3), 3).gpus
    assert set(expected) <= {0, 1, 2, 3}
    got = placed(Solver(s).place(g))
    assert got.slots[0].gpus == tuple(sorted(expected))
    exact = exact_slice(s, g, {ps.name: resolve_need(ps, s.hierarchy) for ps in g.pod_sets})
    assert exact is not None and exact.slots[0].gpus == tuple(sorted(expected))
    for name, policy in POLICIES.items():
        if name == "gangslice":
            continue
        result = policy(s, g)
        assert isinstance(result, Slice), (name, result)
        assert result.slots[0].gpus == tuple(sorted(expected)), name
