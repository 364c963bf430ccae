"""Split brain on the real control plane: two ``gangslice serve`` replicas elect a leader on
the Lease; the leader is stopped (SIGSTOP) past its lease while a bind waits in its socket,
the standby takes over and reserves the node's every GPU for a gang (a promise the old
leader's ledger cannot see: it holds only what it reserved itself), then the old leader is
let run again (SIGCONT) and serves the queued bind. Its fence (the lease's deadline on its
own clock) refuses it: no GPU is promised to two pods.

Nodes (pool ``spb``): one HGX H100 node of 8 GPUs. The pods name ``gangslice-scheduler``, which
no kube-scheduler serves here: the test makes the scheduler's calls itself.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    Gangslice,
    create,
    get,
    gpu_pod,
    hgx_leaves,
    install_gangslice,
    make_node,
    node_of,
    remove_node,
    reservations_of,
    service_account_kubeconfig,
    slot_places,
    wait_for,
)

from extender.bench.controlplane import ControlPlane
from extender.kube.names import GANG, GANG_SIZE

pytestmark = pytest.mark.e2e

POOL = "spb"
(NODE,) = hgx_leaves(POOL, 1)[:1]
#: The shipped lease: 15 s, renewed every 2 s, a renew deadline of 10 s.
LEASE_S = 15


def leads(server: Gangslice) -> bool:
    try:
        with urllib.request.urlopen(server.url + "/readyz", timeout=3) as resp:
            return "(leader)" in resp.read().decode()
    except OSError:
        return False


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    """Replica a, leading; the module's ``replicas`` fixture adds b."""
    cp = control_plane
    install_gangslice(cp)
    assert cp.workdir is not None
    make_node(cp, NODE, POOL)
    a = Gangslice(cp, service_account_kubeconfig(cp, cp.workdir / "split-a.kubeconfig"), True, name="split-a")
    try:
        a.start()
        wait_for("replica a to lead", lambda: leads(a), 60, 0.5)
        yield a
    finally:
        with_signal(a, signal.SIGCONT)
        a.stop()
        remove_node(cp, NODE.name)


@pytest.fixture
def standby(control_plane: ControlPlane, gangslice: Gangslice) -> Iterator[Gangslice]:
    cp = control_plane
    assert cp.workdir is not None
    b = Gangslice(cp, service_account_kubeconfig(cp, cp.workdir / "split-b.kubeconfig"), True, name="split-b")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def with_signal(server: Gangslice, sig: signal.Signals) -> None:
    proc = server.cp.processes.get(server.name)
    if proc is not None and proc.alive():
        os.killpg(proc.pid, sig)


def bind(server: Gangslice, ns: str, pod: dict[str, Any], node: str) -> dict[str, Any]:
    body = {
        "PodName": pod["metadata"]["name"],
        "PodNamespace": ns,
        "PodUID": pod["metadata"]["uid"],
        "Node": node,
    }
    return call(server, "bind", body)


def call(server: Gangslice, verb: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """One extender verb, as kube-scheduler calls it."""
    req = urllib.request.Request(
        server.url + f"/gangslice/{verb}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        reply: dict[str, Any] = json.loads(resp.read())
        return reply


def test_a_leader_stopped_past_its_lease_binds_nothing_when_it_runs_again(
    control_plane: ControlPlane, gangslice: Gangslice, standby: Gangslice, ns: str
) -> None:
    cp, a, b = control_plane, gangslice, standby
    assert leads(a) and not leads(b)
    half = create(cp, {**gpu_pod("half", 4, POOL), "metadata": {"name": "half", "namespace": ns}})
    whole = gpu_pod("whole", 8, POOL, labels={GANG: "whole"}, annotations={GANG_SIZE: "1"})
    whole = create(cp, {**whole, "metadata": {**whole["metadata"], "namespace": ns}})

    with_signal(a, signal.SIGSTOP)
    queued: dict[str, Any] = {}
    # kube-scheduler's bind reaches the stopped leader and waits in its socket.
    caller = threading.Thread(target=lambda: queued.update(bind(a, ns, half, NODE.name)), daemon=True)
    caller.start()
    try:
        wait_for("replica b to take the lease over", lambda: leads(b), LEASE_S + 45, 0.5)
        got = call(b, "filter", {"Pod": whole, "NodeNames": [NODE.name]})
        assert got["Error"] == "" and got["NodeNames"] == [NODE.name], got
        (held,) = reservations_of(cp, ns, "whole")
        assert slot_places(held) == [(NODE.name, tuple(range(8)))]
    finally:
        with_signal(a, signal.SIGCONT)
    caller.join(60)
    assert not caller.is_alive(), "the old leader never answered the queued bind"
    assert "standby" in queued.get("Error", ""), queued
    assert node_of(cp, ns, "half") is None, get(cp, "Pod", "half", ns)
    wait_for("replica a to know it no longer leads", lambda: not leads(a), 30, 0.5)
