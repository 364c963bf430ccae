"""NodeTopology validation on a real API server: the generated CRD refuses a bandwidth of 0 on write;
a spec the CRD keeps but gangslice cannot read (two GPUs, no link between them) keeps the node out of
placement, with the condition ``Accepted=False`` on the NodeTopology (applied by ``gangslice serve`` under
the shipped RBAC), a Warning Event on the Node and the reason in the extender's filter reply; fixing the
spec brings the node back and turns the condition True.

Nodes (pool ``ntp``): two HGX H100 nodes, one per leaf.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    Gangslice,
    create,
    events_for,
    extender_stack,
    get,
    gpu_pod,
    hgx_leaves,
    merge_patch,
    wait_for,
)

from extender.bench.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

POOL = "ntp"
NODES = hgx_leaves(POOL, 1)


@pytest.fixture(scope="module")
def gangslice(control_plane: ControlPlane) -> Iterator[Gangslice]:
    # The probe pod's scheduler is gangslice's too (the verbs answer only for pods of its
    # schedulers), but no kube-scheduler serves it: it is never bound.
    schedulers = ["--scheduler-name=gangslice-scheduler", f"--scheduler-name={PROBE_SCHEDULER}"]
    with extender_stack(control_plane, POOL, NODES, name="gangslice-ntp", extra_args=schedulers) as server:
        yield server


def accepted(cp: ControlPlane, node: str) -> dict[str, Any] | None:
    obj = get(cp, "NodeTopology", node) or {}
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Accepted":
            return dict(c)
    return None


PROBE_SCHEDULER = "gangslice-e2e-nobody"


def filter_reply(server: Gangslice, names: list[str]) -> dict[str, Any]:
    """The extender's filter for an 8-GPU pod. The pod exists (the verbs answer only for pods
    in gangslice's pod watch) under a scheduler name no kube-scheduler serves, so it is never
    bound."""
    probe = gpu_pod("probe", 8, POOL, scheduler=PROBE_SCHEDULER)
    probe["metadata"]["namespace"] = "default"
    if get(server.cp, "Pod", "probe", "default") is None:
        create(server.cp, probe)
    pod = get(server.cp, "Pod", "probe", "default")
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()

    def ask() -> dict[str, Any] | None:
        req = urllib.request.Request(server.url + "/gangslice/filter", data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            reply: dict[str, Any] = json.loads(resp.read())
        unknown = any("not in its pod watch" in r for r in (reply.get("FailedNodes") or {}).values())
        return None if unknown else reply

    return wait_for("the probe pod in gangslice's pod watch", ask, 30)


def test_the_api_server_refuses_a_zero_nvlink_bandwidth(
    control_plane: ControlPlane, gangslice: Gangslice
) -> None:
    node = NODES[0].name
    with pytest.raises(urllib.error.HTTPError) as err:
        merge_patch(control_plane, "NodeTopology", node, {"spec": {"nvlinkGbps": 0}})
    assert err.value.code == 422
    assert "spec.nvlinkGbps" in err.value.read().decode()


def test_an_unreadable_spec_is_said_on_the_object_the_node_and_the_filter(
    control_plane: ControlPlane, gangslice: Gangslice
) -> None:
    cp = control_plane
    bad, good = NODES[0].name, NODES[1].name
    links = (get(cp, "NodeTopology", bad) or {})["spec"]["links"]
    merge_patch(cp, "NodeTopology", bad, {"spec": {"links": []}})
    try:
        cond = wait_for(
            "Accepted=False on the NodeTopology",
            lambda: (c := accepted(cp, bad)) and c["status"] == "False" and c,
            30,
        )
        assert cond["reason"] == "InvalidSpec"
        assert "no link given between GPU0 and GPU1" in cond["message"]
        events = wait_for(
            "a Warning Event on the Node",
            lambda: [e for e in events_for(cp, "default", bad) if e["reason"] == "InvalidNodeTopology"],
            30,
        )
        assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "Node"
        reply = filter_reply(gangslice, [bad, good])
        assert reply["NodeNames"] == [good]
        assert "no link given" in reply["FailedNodes"][bad]
    finally:
        merge_patch(cp, "NodeTopology", bad, {"spec": {"links": links}})
    cond = wait_for(
        "Accepted=True once the spec reads",
        lambda: (c := accepted(cp, bad)) and c["status"] == "True" and c,
        30,
    )
    assert cond["reason"] == "SpecValid"
    assert sorted(filter_reply(gangslice, [bad, good])["NodeNames"]) == sorted([bad, good])
