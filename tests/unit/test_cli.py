"""The command-line contracts: ``gangslice topo``, ``cost`` and ``place`` as users and scripts
call them (exit codes, JSON keys, one-line errors)."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender import cli, cost
from extender.placement.files import FileError, load_cluster, load_gang
from extender.topology.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi-topo"
CLUSTERS = REPO / "examples" / "clusters"
GANGS = REPO / "examples" / "gangs"

EXIT_PLACED, EXIT_BAD_INPUT, EXIT_UNPLACEABLE = 0, 2, 3


def fixture(name: str) -> Path:
    path = FIXTURES / name
    assert path.is_file(), f"{path}: the fixture is missing from tests/fixtures/nvidia-smi-topo"
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- gangslice topo parse ------------------------------------------------------------------------


def test_topo_parse_json_of_an_8x_nv18_box(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "parse", str(fixture("h100-8gpu-nv18-2numa-compact.txt")), "--json")
    assert code == 0
    d = json.loads(out)
    # The file: GPU0-3 on NUMA 0, GPU4-7 on NUMA 1, NV18 between every pair.
    assert [(g["index"], g["numaNode"]) for g in d["gpus"]] == [(i, 0 if i < 4 else 1) for i in range(8)]
    assert {(p["a"], p["b"]) for p in d["pairs"]} == set(itertools.combinations(range(8), 2))
    assert {p["link"] for p in d["pairs"]} == {"NV18"}
    assert d["nvlinkIslands"] == [list(range(8))]


def test_topo_parse_json_of_a_pcie_box_without_nvlink(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "parse", str(fixture("a10-4gpu-pcie-sys-2nic.txt")), "--json")
    assert code == 0
    d = json.loads(out)
    # The file: 4 GPUs, all on NUMA 0, SYS between every pair, no NVLink.
    assert [(g["index"], g["numaNode"]) for g in d["gpus"]] == [(i, 0) for i in range(4)]
    assert len(d["pairs"]) == 6
    assert {p["link"] for p in d["pairs"]} == {"SYS"}
    assert d["nvlinkIslands"] == []


@pytest.mark.parametrize("name", ["garbage.txt", "missing.txt"])
def test_topo_parse_bad_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    write(tmp_path / "garbage.txt", "this is not nvidia-smi output\nat all\n")
    path = tmp_path / name
    code, out, err = run(capsys, "topo", "parse", str(path), "--json")
    assert code == 2
    assert out == ""
    line = one_line_error(err)
    assert line.startswith("gangslice topo parse: "), line
    assert str(path) in line, line


# -- gangslice topo presets ----------------------------------------------------------------------


def test_topo_presets_lists_every_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "presets")
    assert code == 0
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"hgx-h100", "gb200-tray", "pcie-8gpu-2socket"} <= listed
    assert listed == set(PRESETS)


# -- gangslice cost ------------------------------------------------------------------------------

COST_LINE = re.compile(r"over (\S+) \(([\d.]+) GB/s bottleneck\): ([\d.]+) us/layer")


def cost_figures(capsys: pytest.CaptureFixture[str], link: str) -> tuple[float, float]:
    """(bottleneck GB/s, us/layer) as ``gangslice cost`` prints them for ``link``."""
    code, out, _ = run(capsys, "cost", "--hidden", "8192", "--tokens", "128", "--tp", "4", "--link", link)
    assert code == 0
    match = COST_LINE.search(out)
    assert match is not None, out
    assert match.group(1) == link
    return float(match.group(2)), float(match.group(3))


def test_cost_sys_is_slower_than_nvlink(capsys: pytest.CaptureFixture[str]) -> None:
    nvlink_gbps, nvlink_us = cost_figures(capsys, "nvlink")
    sys_gbps, sys_us = cost_figures(capsys, "sys")
    assert nvlink_gbps == cost.link_class_gbps("nvlink")
    assert sys_gbps == cost.SYS_GBPS
    assert sys_gbps < nvlink_gbps
    assert sys_us > nvlink_us > 0


def test_cost_unknown_link_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "cost", "--tp", "4", "--link", "carrier-pigeon")
    assert code == 2
    assert one_line_error(err).startswith("gangslice cost: --link: ")


# -- gangslice place -----------------------------------------------------------------------------


def place(capsys: pytest.CaptureFixture[str], cluster: Path, gang: Path) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, "place", "--cluster", str(cluster), "--gang", str(gang), "--json")
    return code, (json.loads(out) if out else {}), err


def test_place_json_of_a_placed_gang(capsys: pytest.CaptureFixture[str]) -> None:
    code, d, _ = place(capsys, CLUSTERS / "hgx-h100-4leaf.yaml", GANGS / "llama-70b-tp8.yaml")
    assert code == EXIT_PLACED
    assert d["placed"] is True
    assert d["reason"] is None
    assert d["cost"]["perLayerMicros"] > 0
    [pod] = d["pods"]
    assert {"podSet", "index", "node", "gpus", "numaNodes"} <= set(pod)
    assert (pod["podSet"], pod["index"]) == ("server", 0)
    # Only leaf 3 has nodes with all 8 GPUs free; an HGX board's 8 GPUs span both NUMA nodes.
    assert pod["node"].startswith("leaf3-h100-")
    assert pod["gpus"] == list(range(8))
    assert pod["numaNodes"] == [0, 1]


@pytest.mark.parametrize(
    ("policy", "speed"), [("gangslice", 1.0), ("spread", 84.8 / 579.5), ("volcano", 84.8 / 265.0)]
)
def test_place_on_a_fragmented_fleet_says_how_fast_the_slice_serves(
    capsys: pytest.CaptureFixture[str], policy: str, speed: float
) -> None:
    """examples/clusters/fragmented.yaml: the two TP=4 halves on the one free NVSwitch node
    (gangslice), across an H100 and an L40S box (spread), across two H100 nodes (volcano)."""
    args = ["--cluster", str(CLUSTERS / "fragmented.yaml"), "--gang", str(GANGS / "llama-70b-tp4x2.yaml")]
    code, out, _ = run(capsys, "place", *args, "--policy", policy, "--json")
    step = json.loads(out)["step"]
    assert code == EXIT_PLACED and step["bestProven"] is True
    assert step["bestMillis"] == pytest.approx(84.8, abs=0.05)
    assert step["millis"] == pytest.approx(step["computeMillis"] + step["commMillis"], abs=0.002)
    assert step["speed"] == pytest.approx(speed, abs=0.002)
    code, out, _ = run(capsys, "place", *args, "--policy", policy)
    assert f"a GPU-hour here serves {100 * speed:.0f}% of what it could" in out.splitlines()[1]


def test_place_json_of_an_unplaceable_gang(capsys: pytest.CaptureFixture[str]) -> None:
    # GB200 trays have 4 GPUs; a TP=8 pod fits none of them, even on an empty cluster.
    code, d, _ = place(capsys, CLUSTERS / "gb200-nvl72-pair.yaml", GANGS / "llama-70b-tp8.yaml")
    assert code == EXIT_UNPLACEABLE
    assert d["placed"] is False
    assert d["pods"] == []
    assert d["cost"] is None
    assert isinstance(d["reason"], str)
    assert "no node has 8 GPUs (the largest has 4)" in d["reason"]
    assert d["feasibleWhenEmpty"] is False


def test_place_a_gang_bigger_than_a_small_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path / "c.yaml", "nodes:\n  - {name: n, gpuTopology: hgx-h100, count: 2}\n")
    gang = write(tmp_path / "g.yaml", "name: big\npodSets:\n  - {name: w, count: 3, gpusPerPod: 8}\n")
    code, d, _ = place(capsys, cluster, gang)
    assert code == EXIT_UNPLACEABLE
    assert d["placed"] is False
    assert d["reason"]


GOOD_GANG = "name: g\npodSets:\n  - {name: tp, count: 1, gpusPerPod: 2, comm: allreduce}\n"
GOOD_CLUSTER = (
    "levels: [fabric.topograph.run/tier-0]\nnodes:\n"
    "  - {name: n, gpuTopology: hgx-h100, labels: {fabric.topograph.run/tier-0: leaf-1}}\n"
)


@pytest.mark.parametrize(
    ("cluster_text", "gang_text", "bad_file", "problem"),
    [
        (
            GOOD_CLUSTER,
            "name: g\npodSets:\n  - {name: tp, count: 1, gpusPerPod: -1}\n",
            "g.yaml",
            "field podSets.0.gpusPerPod",
        ),
        (GOOD_CLUSTER, "name: g\npodSets: [oops\n", "g.yaml", "not valid YAML"),
        ("nodes:\n  - {name: n, gpuTopology: hgx-h900}\n", GOOD_GANG, "c.yaml", "gpuTopology 'hgx-h900'"),
        (
            GOOD_CLUSTER,
            "name: g\npodSets:\n  - {name: tp, count: 1, gpusPerPod: 2, requiredLevel: rack}\n",
            "g.yaml",
            "podSets[0].requiredLevel: unknown level 'rack'; known levels: ",
        ),
        (
            GOOD_CLUSTER,
            "name: g\npodSets:\n  - {name: a, count: 1, gpusPerPod: 1}\n"
            "  - {name: b, count: 1, gpusPerPod: 1, preferredLevel: rack}\n",
            "g.yaml",
            "podSets[1].preferredLevel: unknown level 'rack'",
        ),
        (
            GOOD_CLUSTER,
            "name: g\npodSets:\n  - {name: a, count: 1, gpusPerPod: 1}\n"
            "  - {name: b, count: 1, gpusPerPod: 1, colocateWith: {podSet: a, level: rack}}\n",
            "g.yaml",
            "podSets[1].colocateWith.level: unknown level 'rack'",
        ),
    ],
)
def test_place_bad_input_is_one_line_naming_file_field_and_problem(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    cluster_text: str,
    gang_text: str,
    bad_file: str,
    problem: str,
) -> None:
    cluster = write(tmp_path / "c.yaml", cluster_text)
    gang = write(tmp_path / "g.yaml", gang_text)
    code, out, err = run(capsys, "place", "--cluster", str(cluster), "--gang", str(gang), "--json")
    assert code == EXIT_BAD_INPUT
    assert out == ""  # stdout stays for the JSON a script parses
    line = one_line_error(err)
    assert line.startswith(f"gangslice place: {tmp_path / bad_file}"), line
    assert problem in line, line


def test_place_missing_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gang = write(tmp_path / "g.yaml", GOOD_GANG)
    missing = tmp_path / "nope.yaml"
    code, _, err = run(capsys, "place", "--cluster", str(missing), "--gang", str(gang))
    assert code == EXIT_BAD_INPUT
    line = one_line_error(err)
    assert str(missing) in line and "cannot read" in line, line


def test_place_unknown_policy_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        "place",
        *("--cluster", str(CLUSTERS / "hgx-h100-4leaf.yaml"), "--gang", str(GANGS / "llama-70b-tp8.yaml")),
        *("--policy", "random"),
    )
    assert code == EXIT_BAD_INPUT
    assert "--policy: unknown policy 'random'" in one_line_error(err)


# -- level names in gang files, checked against the cluster's hierarchy ---------------------------


def test_gang_levels_are_checked_only_against_a_hierarchy(tmp_path: Path) -> None:
    gang = write(
        tmp_path / "g.yaml",
        "name: g\npodSets:\n  - {name: a, count: 2, gpusPerPod: 4, requiredLevel: leaf}\n",
    )
    four_leaf = load_cluster(CLUSTERS / "hgx-h100-4leaf.yaml").hierarchy
    assert load_gang(gang).pod_sets[0].required_level == "leaf"  # no cluster yet: not judged
    assert load_gang(gang, four_leaf).pod_sets[0].required_level == "leaf"
    racks = load_cluster(
        write(
            tmp_path / "racks.yaml",
            "levels: [example.com/rack]\nnodes:\n"
            "  - {name: n, gpuTopology: hgx-h100, labels: {example.com/rack: r1}}\n",
        )
    )
    with pytest.raises(FileError) as err:
        load_gang(gang, racks.hierarchy)
    message = str(err.value)
    assert message.startswith(f"{gang}: podSets[0].requiredLevel: unknown level 'leaf'; known levels: "), (
        message
    )
    assert "rack" in message.split("known levels: ")[1]


@pytest.mark.parametrize("level", ["node", "nvlink", "numa", "pcie", "leaf", "fabric.topograph.run/tier-0"])
def test_known_levels_pass(tmp_path: Path, level: str) -> None:
    gang = write(
        tmp_path / "g.yaml",
        f"name: g\npodSets:\n  - {{name: a, count: 1, gpusPerPod: 1, preferredLevel: {level}}}\n",
    )
    hierarchy = load_cluster(CLUSTERS / "hgx-h100-4leaf.yaml").hierarchy
    assert load_gang(gang, hierarchy).pod_sets[0].preferred_level == level


# -- every bundled gang on every bundled cluster -------------------------------------------------

EXAMPLE_PAIRS = [
    (c.name, g.name) for c in sorted(CLUSTERS.glob("*.yaml")) for g in sorted(GANGS.glob("*.yaml"))
]


def test_the_examples_are_found() -> None:
    assert len(EXAMPLE_PAIRS) >= 15


@pytest.mark.parametrize(("cluster_name", "gang_name"), EXAMPLE_PAIRS)
def test_every_example_gang_on_every_example_cluster(
    capsys: pytest.CaptureFixture[str], cluster_name: str, gang_name: str
) -> None:
    cluster_path, gang_path = CLUSTERS / cluster_name, GANGS / gang_name
    code, d, err = place(capsys, cluster_path, gang_path)
    assert code in (EXIT_PLACED, EXIT_UNPLACEABLE), err
    if code == EXIT_UNPLACEABLE:
        assert d["placed"] is False and d["pods"] == []
        assert isinstance(d["reason"], str) and d["reason"]
        return
    assert d["placed"] is True and d["reason"] is None
    snap = load_cluster(cluster_path)
    spec = yaml.safe_load(gang_path.read_text())
    for ps in spec["podSets"]:
        pods = [p for p in d["pods"] if p["podSet"] == ps["name"]]
        assert sorted(p["index"] for p in pods) == list(range(ps["count"]))
        for p in pods:
            assert len(p["gpus"]) == ps["gpusPerPod"], p
            assert not set(p["gpus"]) & snap.node(p["node"]).allocated, p
    taken = [(p["node"], g) for p in d["pods"] for g in p["gpus"]]
    assert len(taken) == len(set(taken)), "a GPU given to two pods"


def test_example_wide_ep_takes_the_leaf_that_keeps_whole_nodes_free(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Leaf 1's nodes have GPUs 0-3 taken: the 4 pods of 4 GPUs fill their free halves and leave
    # leaf 3's whole nodes for TP=8.
    code, d, _ = place(capsys, CLUSTERS / "hgx-h100-4leaf.yaml", GANGS / "deepseek-wideep-4node.yaml")
    assert code == EXIT_PLACED
    assert len(d["pods"]) == 4
    assert len({p["node"] for p in d["pods"]}) == 4
    for p in d["pods"]:
        assert p["node"].startswith("leaf1-h100-"), p
        assert p["gpus"] == [4, 5, 6, 7]
        assert p["numaNodes"] == [1]


def test_example_wide_ep_stays_in_one_gb200_clique(capsys: pytest.CaptureFixture[str]) -> None:
    code, d, _ = place(capsys, CLUSTERS / "gb200-nvl72-pair.yaml", GANGS / "deepseek-wideep-4node.yaml")
    assert code == EXIT_PLACED
    racks = {p["node"].split("-tray-")[0] for p in d["pods"]}
    assert len(racks) == 1
    assert all(p["gpus"] == [0, 1, 2, 3] for p in d["pods"])


# -- a reader that goes away ---------------------------------------------------------------------


def test_a_closed_pipe_exits_quietly() -> None:
    """``gangslice topo presets | head -1``: the reader is gone before we write (the read end is
    closed first, so the write fails every time, not only when the output outgrows the pipe)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "extender.cli", "topo", "presets"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            cwd=REPO,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == cli.EXIT_BROKEN_PIPE


def test_the_kubectl_plugin_is_the_same_command() -> None:
    """`kubectl gangslice ...` runs the installed `kubectl-gangslice`: the same entry point, and
    its usage names itself the way the user typed it."""
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[cli.KUBECTL_PLUGIN] == scripts["gangslice"] == "extender.cli:main"
    plugin = Path(sys.executable).parent / cli.KUBECTL_PLUGIN
    assert plugin.is_file(), f"{plugin}: reinstall the package (make venv)"
    proc = subprocess.run([str(plugin), "place"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == EXIT_BAD_INPUT and "usage: kubectl gangslice place" in proc.stderr, proc.stderr
