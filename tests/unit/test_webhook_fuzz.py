"""Malformed and adversarial bodies on every verb: never a 5xx, never a hang, never a decision
that raises (an "internal error" reply), and the server still answers /healthz afterwards."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.httpapi.app import build_app
from extender.kube import names as keys
from extender.reservations import ClusterCache
from extender.testing.extender import SMALL_CLUSTER_NODES, ServerThread, write_cluster

VERBS = [
    "/gangslice/filter",
    "/gangslice/prioritize",
    "/gangslice/bind",
    "/gangslice/preempt",
    "/gangslice/volcano/predicate",
    "/gangslice/volcano/prioritize",
    "/gangslice/volcano/jobEnqueueable",
    "/gangslice/volcano/allocate",
    "/gangslice/volcano/deallocate",
    "/gangslice/volcano/onSessionOpen",
]
#: Seconds a reply may take before the test calls it a hang.
HANG_S = 20

KEYS = st.sampled_from(
    [
        "Pod", "pod", "POD", "Nodes", "nodes", "NodeNames", "nodenames", "items", "metadata", "spec",
        "PodName", "PodNamespace", "PodUID", "Node", "NodeNameToVictims", "NodeNameToMetaVictims",
        "Pods", "UID", "task", "node", "job", "Job", "Name", "Namespace", "Resreq", "ScalarResources",
        "TaskRole", "NodeName", "PodGroup", "TotalRequest", "labels", "annotations", "containers",
    ]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from([*SMALL_CLUSTER_NODES, "8", "-1", "1e9", "0,1", keys.GPU_RESOURCE]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(KEYS, st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=30,
)

GANG_VALUES = st.one_of(
    st.text(max_size=12), st.sampled_from(["g", "1", "0", "-3", "100000", "999999999999"])
)
LEVELS = st.sampled_from(["nvlink", "leaf", "spine", "node", "numa", "pcie", "galaxy", ""])


@st.composite
def adversarial_pods(draw: st.DrawFn) -> dict[str, Any]:
    """Pods that are valid JSON but push on gangslice's labels, annotations and quantities."""
    labels = draw(st.dictionaries(st.sampled_from([keys.GANG, keys.POD_SET, keys.KUEUE_PODSET]), GANG_VALUES))
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                [keys.GANG_SIZE, keys.RESERVATION, keys.GPUS, keys.COMM, keys.VOLCANO_GROUP, keys.POD_SET]
            ),
            GANG_VALUES,
        )
    )
    if draw(st.booleans()):
        annotations[keys.REQUIRED_LEVEL] = draw(LEVELS)
    if draw(st.booleans()):
        annotations[keys.PREFERRED_LEVEL] = draw(LEVELS)
    gpus = draw(st.one_of(st.integers(-2, 20), st.sampled_from(["4", "1.5", "x", "8000m", None])))
    return {
        "metadata": {
            "name": draw(st.text(min_size=0, max_size=10)),
            "namespace": draw(st.sampled_from(["llm", "", "x/y"])),
            "uid": draw(st.text(max_size=6)),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: gpus}}}]},
    }


@st.composite
def adversarial_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    verb = draw(st.sampled_from(VERBS))
    kind = draw(st.sampled_from(["bytes", "json", "args", "plain", "volcano"]))
    if kind == "bytes":
        return verb, draw(st.binary(max_size=200))
    if kind == "json":
        return verb, json.dumps(draw(JSON)).encode()
    names = draw(st.lists(st.sampled_from([*SMALL_CLUSTER_NODES, "ghost", ""]), max_size=12))
    pod = draw(adversarial_pods())
    if kind == "plain":  # a GPU pod in no gang: the per-node rule on known and unknown nodes
        pod["metadata"]["labels"], pod["metadata"]["annotations"] = {}, {}
        pod["spec"]["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] = draw(st.integers(1, 9))
        if draw(st.booleans()):
            pod["metadata"]["annotations"][keys.REQUIRED_LEVEL] = draw(LEVELS)
        kind = "args"
    if kind == "args":
        body: dict[str, Any] = {
            draw(st.sampled_from(["Pod", "pod"])): pod,
            "NodeNames": draw(st.one_of(st.none(), st.just(names))),
            "Nodes": draw(
                st.one_of(st.none(), st.just({"items": [{"metadata": {"name": n}} for n in names]}))
            ),
            "PodName": pod["metadata"]["name"],
            "PodNamespace": pod["metadata"]["namespace"],
            "Node": draw(st.sampled_from([*SMALL_CLUSTER_NODES, "ghost"])),
            "NodeNameToMetaVictims": {n: {"Pods": [{"UID": "u"}], "NumPDBViolations": 0} for n in names},
        }
        return verb, json.dumps(body).encode()
    task = {
        "Name": pod["metadata"]["name"],
        "Namespace": "llm",
        "Job": draw(GANG_VALUES),
        "Pod": pod,
        "NodeName": draw(st.sampled_from([*SMALL_CLUSTER_NODES, ""])),
    }
    body = {
        "task": task,
        "node": {"Name": draw(st.sampled_from(names or ["h-0"]))},
        "nodes": [{"Name": n} for n in names],
        "job": {"Name": draw(GANG_VALUES), "Namespace": "llm"},
    }
    return verb, json.dumps(body).encode()


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_S)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path: Path = write_cluster(tmp_path_factory.mktemp("fuzz"))
    app = build_app(ClusterCache.from_cluster_file(path))
    with ServerThread(app) as s:
        yield s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=adversarial_bodies())
def test_no_body_gets_a_5xx_or_hangs(server: ServerThread, case: tuple[str, bytes]) -> None:
    verb, body = case
    status, reply = request(server.port, "POST", verb, body)
    assert status in (200, 400), (status, reply[:200])
    if status == 400:
        assert reply.count(b"\n") == 1 and reply.endswith(b"\n")
    else:
        json.loads(reply)
        assert b"internal error" not in reply, reply[:300]  # a decision that raised is a bug


def test_pathological_bodies_are_refused_cleanly(server: ServerThread) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert request(server.port, "POST", "/gangslice/filter", deep)[0] == 400
    nested_pod = b'{"Pod": {"metadata": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}}"
    assert request(server.port, "POST", "/gangslice/filter", nested_pod)[0] in (200, 400)
    too_big = b'{"Pod": {}, "NodeNames": ["' + b"x" * (33 * 1024 * 1024) + b'"]}'
    assert request(server.port, "POST", "/gangslice/filter", too_big)[0] == 413
    assert request(server.port, "POST", "/gangslice/filter", b"")[0] == 400
    assert request(server.port, "POST", "/gangslice/bind", b'{"PodName": 7, "Node": []}')[0] == 400


def test_the_server_still_answers_after_the_fuzz(server: ServerThread) -> None:
    assert request(server.port, "GET", "/healthz") == (200, b"ok\n")
    status, body = request(server.port, "GET", "/metrics")
    assert status == 200 and b"gangslice_extender_requests_total" in body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    verb=st.sampled_from(["/gangslice/filter", "/gangslice/prioritize"]),
    gpus=st.integers(1, 9),
    level=st.one_of(st.none(), LEVELS),
    names=st.lists(st.sampled_from([*SMALL_CLUSTER_NODES, "ghost", ""]), min_size=1, max_size=10),
    full_nodes=st.booleans(),
)
def test_gpu_pods_on_any_node_list(
    server: ServerThread, verb: str, gpus: int, level: str | None, names: list[str], full_nodes: bool
) -> None:
    """The per-node rule on known, unknown, empty and repeated node names, in both node modes."""
    annotations = {keys.REQUIRED_LEVEL: level} if level is not None else {}
    pod = {
        "metadata": {"name": "p", "namespace": "llm", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}}}]},
    }
    nodes = {"items": [{"metadata": {"name": n}} for n in names]} if full_nodes else None
    body = {"Pod": pod, "Nodes": nodes, "NodeNames": None if full_nodes else names}
    status, reply = request(server.port, "POST", verb, json.dumps(body).encode())
    assert status == 200 and b"internal error" not in reply, reply[:300]
    got = json.loads(reply)
    if verb.endswith("filter"):
        passed = (
            got["NodeNames"] if not full_nodes else [i["metadata"]["name"] for i in got["Nodes"]["items"]]
        )
        judged = set(passed) | set(got["FailedNodes"]) | set(got["FailedAndUnresolvableNodes"])
        assert judged == {n for n in names if n or not full_nodes}
    else:
        assert [h["Host"] for h in got] == [n for n in names if n or not full_nodes]
