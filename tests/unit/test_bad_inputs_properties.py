"""Every loader of a user's file, fed random bytes, random text and random YAML/JSON
structures: it loads, or it raises its own error (FileError, TraceError, TopologyError,
KubeletProblem), never anything else, and within seconds; and what it loads is within the
bounds the file formats state (no 2**64 pods, no event at infinity).

The structures are valid files with one value replaced by a random one (huge, tiny and
negative numbers, NaN and infinities, booleans, nulls, text, lists and mappings, values
nested 60 to 70 levels deep), so that the random value reaches the field checks behind the
parser; one test replaces only numbers, the values most bounds are about. The command-line
cases are in test_bad_inputs.py."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.agent.kubelet_config import KubeletProblem, parse_config
from extender.placement.files import (
    LIMITS,
    MAX_GPUS_PER_POD,
    MAX_NODES,
    MAX_PODS,
    FileError,
    load_cluster,
    load_gang,
)
from extender.placement.reading import read_text
from extender.placement.request import GangRequest
from extender.placement.snapshot import ClusterSnapshot
from extender.sim.trace import MAX_REPLICAS, MAX_SECONDS, Trace, TraceError, load_trace
from extender.topology.model import TopologyError
from extender.topology.nvidia_smi import parse_topo

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: Seconds one load may take, on a busy machine; the bounds of the file formats keep the
#: worst real case to a few.
SLOW_S = 10.0

GANG: dict[str, Any] = {
    "name": "g",
    "podSets": [
        {
            "name": "s",
            "count": 2,
            "gpusPerPod": 4,
            "comm": "allreduce",
            "preferredLevel": "nvlink",
            "model": {"hiddenSize": 8192, "tokens": 128, "parameters": "70B"},
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "requests": {"cpu": "8", "memory": "64Gi"},
        },
        {"name": "router", "count": 1, "gpusPerPod": 0, "colocateWith": "s"},
    ],
}
CLUSTER: dict[str, Any] = {
    "levels": ["leaf"],
    "network": {"nicGbps": 400, "oversubscription": 2},
    "nodes": [
        {
            "name": "h",
            "count": 2,
            "labels": {"leaf": "l1", "pool": "a"},
            "gpuTopology": "hgx-h100",
            "allocatedGpus": [0, 1],
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "allocatable": {"cpu": "192", "memory": "2Ti", "pods": 110},
            "kubelet": {
                "topologyManagerPolicy": "single-numa-node",
                "cpuManagerPolicy": "static",
                "numaNodes": [{"id": 0, "cpus": 56}, {"id": 1, "cpus": 56}],
            },
        }
    ],
}
TRACE: dict[str, Any] = {
    "templates": {"mine": {**GANG, "maxSurge": 1, "loadSeconds": 60}},
    "events": [
        {"at": 0, "deployment": "d", "template": "mine", "replicas": 2, "lifetime": 3600},
        {
            "at": 10,
            "deployment": "e",
            "gang": {"podSets": [{"name": "s", "count": 1, "gpusPerPod": 8}]},
            "lifetime": 60,
        },
        {"at": 100, "scale": "d", "replicas": 3},
        {"at": 200, "rollout": "d"},
        {"at": 300, "nodeDown": "h-0", "repairAfter": 600},
    ],
}
KUBELET: dict[str, Any] = {"kind": "KubeletConfiguration", "topologyManagerPolicy": "restricted"}

SPECIAL = [0, 1, -1, -0.0, 2**63, 2**64, 10**30, 10**300, 1e30, -1e30, 1e-300, 5e-324]
SPECIAL += [float("nan"), float("inf"), float("-inf"), True, False, None, "", "1e30", "8.0", "-0", "NaN"]
SCALARS = st.one_of(
    st.sampled_from(SPECIAL),
    st.integers(-1000, 1000),
    st.integers(min_value=10**6),
    st.integers(max_value=-(10**6)),
    st.floats(),
    st.text(max_size=12),
)
FIELDS = sorted(
    {"name", "count", "gpusPerPod", "podSets", "nodes", "events", "at", "model", "labels", "gangs"}
)
KEYS = st.sampled_from(FIELDS) | st.text(max_size=8)


def nested(value: Any, depth: int) -> Any:
    for k in range(depth):
        value = [value] if k % 2 else {"a": value}
    return value


VALUES = st.one_of(
    st.recursive(
        SCALARS,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS, kids, max_size=4),
        max_leaves=20,
    ),
    st.builds(nested, SCALARS, st.integers(60, 70)),
)


def paths(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``doc`` a value sits (the document itself included)."""
    yield at
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from paths(value, (*at, key))


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    inner = out
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return out


def value_at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutants(draw: st.DrawFn, base: Any, numbers_only: bool = False) -> Any:
    """``base`` with the value at one random place (one number) replaced by a random one."""
    every = list(paths(base))
    if numbers_only:
        every = [p for p in every if type(value_at(base, p)) in (int, float)]
    value = draw(SCALARS if numbers_only else VALUES)
    return replaced(base, every[draw(st.integers(0, len(every) - 1))], value)


def as_yaml(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def as_json_lines(doc: Any) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("events"), list):
        lines = [{"templates": doc["templates"]}] if "templates" in doc else []
        return "\n".join(json.dumps(x) for x in [*lines, *doc["events"]])
    return json.dumps(doc)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-inputs")


def finite_within(value: float, most: float) -> bool:
    return math.isfinite(value) and 0 <= value <= most


def sane(loaded: object) -> None:
    """What a loader returns is within the bounds its format states."""
    if isinstance(loaded, ClusterSnapshot):
        assert 1 <= len(loaded.nodes) <= MAX_NODES
        net = loaded.hierarchy.network
        assert finite_within(net.nic_gbps, LIMITS["network.nicGbps"])
        assert finite_within(net.oversubscription, LIMITS["network.oversubscription"])
    gangs = [loaded] if isinstance(loaded, GangRequest) else []
    if isinstance(loaded, Trace):
        gangs = [d.gang for d in loaded.deployments]
        times = [x for d in loaded.deployments for x in (d.at, d.lifetime)]
        times += [x for f in loaded.node_downs for x in (f.at, f.repair_s)]
        times += [s.at for s in loaded.scales]
        assert all(finite_within(t, MAX_SECONDS) for t in times), times
        counts = [d.replicas for d in loaded.deployments] + [s.replicas for s in loaded.scales]
        assert all(0 <= n <= MAX_REPLICAS for n in counts), counts
    for gang in gangs:
        assert sum(ps.count for ps in gang.pod_sets) <= MAX_PODS
        for ps in gang.pod_sets:
            assert ps.count >= 1 and 0 <= ps.gpus_per_pod <= MAX_GPUS_PER_POD
            assert 0 < ps.model.hidden_size <= LIMITS["model.hiddenSize"]
            most = LIMITS["model.parameters, model.activeParameters"]
            assert finite_within(ps.model.parameters, most)


def loads_or_refuses(
    load: Callable[[], object], error: type[Exception] | tuple[type[Exception], ...]
) -> None:
    started = time.monotonic()
    try:
        sane(load())
    except error as exc:
        assert str(exc) and "\n" not in str(exc), repr(exc)
    took = time.monotonic() - started
    assert took < SLOW_S, f"{took:.1f} s"


def every_file_loader(path: Path) -> None:
    """Each loader that reads ``path``, as the commands call them."""
    loads_or_refuses(lambda: load_cluster(path), FileError)
    loads_or_refuses(lambda: load_gang(path), FileError)
    loads_or_refuses(lambda: load_trace(path), TraceError)
    loads_or_refuses(lambda: parse_topo(read_text(path), source=str(path)), (FileError, TopologyError))


@SETTINGS
@given(data=st.binary(max_size=400))
def test_random_bytes(folder: Path, data: bytes) -> None:
    for name in ("f.yaml", "f.jsonl"):
        path = folder / name
        path.write_bytes(data)
        every_file_loader(path)


@SETTINGS
@given(text=st.text(max_size=300))
def test_random_text(folder: Path, text: str) -> None:
    for name in ("f.yaml", "f.jsonl"):
        path = folder / name
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        every_file_loader(path)


@SETTINGS
@given(doc=VALUES)
def test_random_structures(folder: Path, doc: Any) -> None:
    (folder / "f.yaml").write_text(as_yaml(doc))
    (folder / "f.jsonl").write_text(as_json_lines(doc))
    every_file_loader(folder / "f.yaml")
    loads_or_refuses(lambda: load_trace(folder / "f.jsonl"), TraceError)


@SETTINGS
@given(doc=mutants(CLUSTER))
def test_cluster_files_with_one_random_value(folder: Path, doc: Any) -> None:
    (folder / "cluster.yaml").write_text(as_yaml(doc))
    loads_or_refuses(lambda: load_cluster(folder / "cluster.yaml"), FileError)


@SETTINGS
@given(doc=mutants(GANG))
def test_gang_files_with_one_random_value(folder: Path, doc: Any) -> None:
    (folder / "gang.yaml").write_text(as_yaml(doc))
    loads_or_refuses(lambda: load_gang(folder / "gang.yaml"), FileError)


@SETTINGS
@given(doc=mutants(TRACE))
def test_trace_files_with_one_random_value(folder: Path, doc: Any) -> None:
    (folder / "trace.yaml").write_text(as_yaml(doc))
    (folder / "trace.jsonl").write_text(as_json_lines(doc))
    loads_or_refuses(lambda: load_trace(folder / "trace.yaml"), TraceError)
    loads_or_refuses(lambda: load_trace(folder / "trace.jsonl"), TraceError)


@SETTINGS
@given(which=st.sampled_from(["cluster", "gang", "trace"]), data=st.data())
def test_files_with_one_random_number(folder: Path, which: str, data: st.DataObject) -> None:
    base, load, error = {
        "cluster": (CLUSTER, load_cluster, FileError),
        "gang": (GANG, load_gang, FileError),
        "trace": (TRACE, load_trace, TraceError),
    }[which]
    path = folder / f"{which}.yaml"
    path.write_text(as_yaml(data.draw(mutants(base, numbers_only=True))))
    loads_or_refuses(lambda: load(path), error)


@SETTINGS
@given(doc=mutants(KUBELET))
def test_kubelet_configurations_with_one_random_value(doc: Any) -> None:
    loads_or_refuses(lambda: parse_config(as_yaml(doc), "config.yaml"), KubeletProblem)
