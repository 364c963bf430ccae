"""Cluster and gang files: the YAML contract, and errors that name the file and the field."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from extender.cost import Comm
from extender.placement.files import FileError, cluster_from_data, gang_from_data, load_cluster, load_gang
from extender.placement.request import Colocation

LEAF = "fabric.topograph.run/tier-0"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_cluster_file_expands_count_and_reads_presets_and_topology_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = resources.files("extender.topology").joinpath("presets", "l40s-4gpu.txt").read_text("utf-8")
    write(tmp_path / "site" / "topo" / "l40s.txt", topo)
    cluster = write(
        tmp_path / "site" / "cluster.yaml",
        f"""
levels: [{LEAF}]
network: {{nicGbps: 50, oversubscription: 4}}
nodes:
  - name: h100
    count: 3
    labels: {{{LEAF}: leaf-1}}
    gpuTopology: hgx-h100
    allocatedGpus: [0, 1]
    unhealthyGpus: [7]
  - name: l40s
    labels: {{{LEAF}: leaf-2}}
    gpuTopology: topo/l40s.txt
""",
    )
    monkeypatch.chdir(tmp_path)  # the topology path is relative to the cluster file, not here
    snap = load_cluster(Path("site") / "cluster.yaml")
    assert [n.name for n in snap.nodes] == ["h100-0", "h100-1", "h100-2", "l40s"]
    for n in snap.nodes[:3]:
        assert n.labels[LEAF] == "leaf-1"
        assert n.labels["kubernetes.io/hostname"] == n.name
        assert n.allocated == frozenset({0, 1}) and n.unhealthy == frozenset({7})
        assert snap.free_gpus(n.name) == frozenset({2, 3, 4, 5, 6})
        assert len(n.graph.gpus) == 8
    assert len(snap.nodes[3].graph.gpus) == 4 and snap.free_gpus("l40s") == frozenset(range(4))
    assert [lv.name for lv in snap.hierarchy.levels] == ["leaf"]
    assert snap.hierarchy.network.nic_gbps == 50 and snap.hierarchy.network.oversubscription == 4
    assert cluster.exists()


def test_gang_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "gang.yaml",
        """
name: pd
podSets:
  - name: prefill
    count: 2
    gpusPerPod: 8
    comm: allreduce
    requiredLevel: leaf
    preferredLevel: nvlink
    model: {hiddenSize: 16384, bytesPerElement: 1, tokens: 4096}
  - name: decode
    count: 4
    gpusPerPod: 2
    comm: kv-transfer
    colocateWith: prefill
  - name: router
    count: 1
    gpusPerPod: 0
    colocateWith: {podSet: decode, level: leaf}
""",
    )
    gang = load_gang(path)
    assert gang.name == "pd" and gang.pods == 7 and gang.gpus == 24
    prefill, decode, router = gang.pod_sets
    assert (prefill.comm, prefill.required_level, prefill.preferred_level) == (
        Comm.ALLREDUCE,
        "leaf",
        "nvlink",
    )
    assert (prefill.model.hidden_size, prefill.model.bytes_per_element, prefill.model.tokens) == (
        16384,
        1,
        4096,
    )
    assert decode.colocate_with == Colocation("prefill", "node")  # a bare name means the same node
    assert router.colocate_with == Colocation("decode", "leaf")
    assert decode.model.hidden_size == 8192  # the 70B-class defaults


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("name: g\npodSets:\n  - {name: a, count: 1, gpusPerPod: -1}\n", "field podSets.0.gpusPerPod"),
        (
            "name: g\npodSets:\n  - {name: a, count: 1, gpusPerPod: 1, colour: red}\n",
            "field podSets.0.colour",
        ),
        ("name: g\npodSets:\n  - {name: a, count: 0, gpusPerPod: 1}\n", "field podSets.0.count"),
        ("name: g\npodSets:\n  - {name: a, count: 1, gpusPerPod: 1, comm: gossip}\n", "field podSets.0.comm"),
        ("name: g\npodSets: []\n", "field podSets"),
        ("podSets:\n  - {name: a, count: 1, gpusPerPod: 1}\n", "field name"),
        (
            "name: g\npodSets:\n  - {name: a, count: 1, gpusPerPod: 1, colocateWith: b}\n",
            "colocateWith names unknown pod set 'b'",
        ),
        ("name: g\npodSets:\n  - [a, b\n", "not valid YAML"),
        ("- just a list\n", "expected a mapping with name and podSets"),
    ],
)
def test_gang_file_errors_name_the_file_and_the_field(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path / "bad-gang.yaml", text)
    with pytest.raises(FileError) as err:
        load_gang(path)
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert problem in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "nodes:\n  - {name: n, gpuTopology: hgx-h200}\n",
            "nodes[0] (n): gpuTopology 'hgx-h200' is neither a preset",
        ),
        (
            "nodes:\n  - {name: n, gpuTopology: hgx-h100, allocatedGpus: [9]}\n",
            "allocatedGpus names GPUs [9]",
        ),
        ("nodes:\n  - {name: n, gpuTopology: hgx-h100, count: 0}\n", "field nodes.0.count"),
        ("nodes:\n  - {name: n, gpuTopology: hgx-h100, rack: 3}\n", "field nodes.0.rack"),
        ("nodes:\n  - {name: n}\n", "field nodes.0.gpuTopology"),
        ("levels: [{name: x}]\nnodes:\n  - {name: n, gpuTopology: hgx-h100}\n", "levels[0]"),
        (
            "nodes:\n  - {name: n, gpuTopology: hgx-h100}\n  - {name: n, gpuTopology: hgx-h100}\n",
            "duplicate node",
        ),
        ("nodes:\n  - {name: n, gpuTopology: broken.txt}\n", "nodes[0] (n): gpuTopology"),
        ("nodes: []\n", "field nodes"),
    ],
)
def test_cluster_file_errors_name_the_file_and_the_field(tmp_path: Path, text: str, problem: str) -> None:
    write(tmp_path / "broken.txt", "this is not nvidia-smi output\n")
    path = write(tmp_path / "bad-cluster.yaml", text)
    with pytest.raises(FileError) as err:
        load_cluster(path)
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert problem in message, message


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(FileError, match="cannot read"):
        load_gang(tmp_path / "missing.yaml")


def test_from_data_names_the_source() -> None:
    with pytest.raises(FileError, match=r"^inline: field podSets\.0\.gpusPerPod"):
        gang_from_data({"name": "g", "podSets": [{"name": "a", "count": 1, "gpusPerPod": -1}]}, "inline")
    with pytest.raises(FileError, match=r"^inline: expected a mapping with nodes"):
        cluster_from_data([], Path("."), "inline")


def test_misspelt_field_is_named_with_the_known_one() -> None:
    data = {"name": "g", "podSets": [{"name": "a", "count": 1, "gpusPerPods": 8}]}
    with pytest.raises(FileError, match=r"podSets\.0\.gpusPerPods: unknown field; did you mean gpusPerPod\?"):
        gang_from_data(data)


def test_misspelt_cluster_field_is_named() -> None:
    data = {"nodes": [{"name": "n", "gpuTopolgy": "hgx-h100"}]}
    with pytest.raises(FileError, match=r"nodes\.0\.gpuTopolgy: unknown field; did you mean gpuTopology\?"):
        cluster_from_data(data, Path("."))


def test_a_gang_without_gpus_is_refused() -> None:
    data = {"name": "g", "podSets": [{"name": "a", "count": 2, "gpusPerPod": 0}]}
    with pytest.raises(FileError, match="every pod set has gpusPerPod: 0"):
        gang_from_data(data)


def test_a_gpuless_pod_set_must_sit_next_to_another() -> None:
    data = {
        "name": "g",
        "podSets": [
            {"name": "a", "count": 1, "gpusPerPod": 8},
            {"name": "b", "count": 1, "gpusPerPod": 0},
        ],
    }
    with pytest.raises(FileError, match=r"podSets\[1\]\.gpusPerPod: 0 GPUs, and no colocateWith"):
        gang_from_data(data)


def test_a_level_no_node_carries_is_refused() -> None:
    data = {
        "levels": ["example.com/rack", "fabric.topograph.run/tier-0"],
        "nodes": [{"name": "n", "gpuTopology": "hgx-h100", "labels": {"fabric.topograph.run/tier-0": "l1"}}],
    }
    with pytest.raises(FileError, match=r"no node carries the label 'example\.com/rack'"):
        cluster_from_data(data, Path("."))
