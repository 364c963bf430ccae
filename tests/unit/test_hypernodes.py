"""``gangslice hypernodes``: our levels as Volcano HyperNodes, valid against the shipped CRD,
tiers counted from the finest labelled level, members by exactMatch, and the same tier
numbering PodGroup networkTopology is read with."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.cli import main
from extender.controllers.openapi import load_crd, validate, version_schema
from extender.controllers.podgroups.groups import level_tiers
from extender.controllers.podgroups.hypernodes import from_snapshot, hypernodes
from extender.placement.files import load_cluster
from extender.topology.hierarchy import Hierarchy

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "volcano"
UPSTREAM = REPO / "tests" / "fixtures" / "upstream" / "volcano"


@cache
def schema() -> dict[str, Any]:
    return version_schema(load_crd(UPSTREAM / "topology.volcano.sh_hypernodes.yaml"), "v1alpha1")


def members(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["type"], m["selector"]["exactMatch"]["name"]) for m in obj["spec"]["members"]]


def test_gb200_cliques_are_tier_1_with_node_members_under_a_tier_2_leaf() -> None:
    objs = from_snapshot(load_cluster(FIXTURES / "gb200.yaml"))
    for o in objs:
        validate(schema(), o, o["metadata"]["name"])
    by_name = {o["metadata"]["name"]: o for o in objs}
    assert sorted(by_name) == ["clique-5e1a-1", "clique-5e1a-2", "leaf-leaf-1"]
    leaf = by_name["leaf-leaf-1"]
    assert (leaf["spec"]["tier"], leaf["spec"]["tierName"]) == (2, "leaf")
    assert members(leaf) == [("HyperNode", "clique-5e1a-1"), ("HyperNode", "clique-5e1a-2")]
    c1 = by_name["clique-5e1a-1"]
    assert (c1["spec"]["tier"], c1["spec"]["tierName"]) == (1, "clique")
    assert members(c1) == [("Node", "c1-0"), ("Node", "c1-1")]


def test_tiers_agree_with_the_podgroup_mapping() -> None:
    snap = load_cluster(FIXTURES / "cluster.yaml")
    tiers = {o["spec"]["tierName"]: o["spec"]["tier"] for o in from_snapshot(snap)}
    mapping = {snap.hierarchy.levels[i].name: t for t, i in level_tiers(snap.hierarchy, snap).items()}
    assert tiers == mapping == {"spine": 2, "leaf": 1}


def test_equal_values_under_different_parents_get_distinct_names() -> None:
    h = Hierarchy()
    nodes = [
        ("n1", {"fabric.topograph.run/tier-1": "s1", "fabric.topograph.run/tier-0": "0"}),
        ("n2", {"fabric.topograph.run/tier-1": "s2", "fabric.topograph.run/tier-0": "0"}),
    ]
    objs = hypernodes(nodes, h)
    leaves = [o for o in objs if o["spec"]["tier"] == 1]
    assert len(leaves) == 2 and len({o["metadata"]["name"] for o in leaves}) == 2
    for o in objs:
        validate(schema(), o, o["metadata"]["name"])


def test_the_command_prints_yaml_documents(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hypernodes", "--cluster", str(FIXTURES / "gb200.yaml")]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["HyperNode"] * 3


def test_a_missing_cluster_file_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hypernodes", "--cluster", str(FIXTURES / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
