"""The ComputeDomain facts gangslice reads: its channel claims, the driver's node label, the
IMEX daemon's requests."""

from __future__ import annotations

import pytest

from extender.kube import compute_domains as cds
from extender.kube.api import Kind
from extender.placement.feasibility import IMEX_DAEMON, Resources
from extender.reservations import ClusterCache
from extender.testing.extender import node_obj

RESERVATION = {"name": "ep-x1", "uid": "r-uid"}


def test_a_channel_claim_of_gangslice_names_its_domain_and_reservation() -> None:
    claim = cds.build_channel_claim("llm", "t0", "cd-uid", RESERVATION)
    assert cds.channel_domain(claim) == ("cd-uid", "ep-x1")
    # Someone else's claim of the same class, without our owner: not ours.
    foreign = {**claim, "metadata": {"name": "x", "namespace": "llm"}}
    assert cds.channel_domain(foreign) is None
    # Ours, but no ComputeDomain config (a GPU slot claim): no domain.
    plain = {**claim, "spec": {"devices": {"requests": []}}}
    assert cds.channel_domain(plain) is None


def test_the_daemon_s_requests_parse_as_quantities_and_keep_its_pod_slot() -> None:
    assert cds.daemon_requests("") == IMEX_DAEMON
    assert cds.daemon_requests("cpu=100m, memory=128Mi") == Resources(100, 128 << 20, 0, 1)
    assert cds.daemon_requests("ephemeral-storage=1G") == Resources(0, 0, 10**9, 1)
    with pytest.raises(ValueError, match=r"gpu=1.*expected cpu="):
        cds.daemon_requests("gpu=1")
    with pytest.raises(ValueError, match="memory:"):
        cds.daemon_requests("memory=lots")


def test_the_cache_gives_every_node_the_configured_daemon_and_names_a_foreign_domain() -> None:
    daemon = Resources(250, 64 << 20, 0, 1)
    cache = ClusterCache(imex_daemon=daemon)
    for kind in Kind:
        cache.replace(kind, [])
    cache.apply(Kind.NODES, "ADDED", node_obj("n0", gpus=8, labels={cds.NODE_LABEL: "abc"}))
    cache.apply(Kind.NODES, "ADDED", node_obj("n1", gpus=8))
    snap = cache.snapshot()
    assert snap.node("n0").facts.imex_daemon == daemon
    assert snap.node("n0").foreign_domain == cds.label_holder("abc")
    assert "abc" in cds.label_holder("abc") and cds.NODE_LABEL in cds.label_holder("abc")
    assert snap.node("n1").foreign_domain is None
    # gangslice's channel claim names the domain, but no reservation of it is held here: the
    # domain stays someone else's.
    cache.apply(Kind.RESOURCE_CLAIMS, "ADDED", cds.build_channel_claim("llm", "n0", "abc", RESERVATION))
    assert cache.snapshot().node("n0").foreign_domain == cds.label_holder("abc")
