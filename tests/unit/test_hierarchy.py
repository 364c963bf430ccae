"""The network hierarchy read from node labels: levels, shared domains, bandwidth by level."""

from __future__ import annotations

import pytest

from extender.topology.hierarchy import (
    DEFAULT_LEVELS,
    HOSTNAME_LABEL,
    Hierarchy,
    HierarchyError,
    Level,
    NetworkModel,
    parse_levels,
)

CORE, SPINE, LEAF = (f"fabric.topograph.run/tier-{i}" for i in (2, 1, 0))
CLIQUE = "nvidia.com/gpu.clique"


def test_parse_levels_defaults_and_strings() -> None:
    assert parse_levels(None) == DEFAULT_LEVELS
    levels = parse_levels([SPINE, LEAF, "example.com/rack", HOSTNAME_LABEL])
    assert [(lv.name, lv.label, lv.kind) for lv in levels] == [
        ("spine", SPINE, "switch"),  # known labels keep their names
        ("leaf", LEAF, "switch"),
        ("rack", "example.com/rack", "switch"),  # others are named after the key
    ]


def test_defaults_read_topographs_nvlink_sub_domain_and_deeper_tiers_are_configurable() -> None:
    h = Hierarchy()
    sub = h.index_of("accelerator.topograph.run/sub-domain")
    assert sub is not None and h.levels[sub].name == "nvl-subdomain" and h.levels[sub].kind == "group"
    domain = h.index_of("nvl-domain")
    assert domain is not None and domain < sub < (h.index_of("clique") or 0)
    # Two racks of one NVLink domain: same domain, different sub-domains.
    a = h.path({"accelerator.topograph.run/domain": "d1", "accelerator.topograph.run/sub-domain": "r1"})
    b = h.path({"accelerator.topograph.run/domain": "d1", "accelerator.topograph.run/sub-domain": "r2"})
    assert h.domain(a, domain) == h.domain(b, domain) and h.domain(a, sub) != h.domain(b, sub)
    # A five-tier fabric names its levels; any tier-N key is accepted and named after it.
    deep = parse_levels([f"fabric.topograph.run/tier-{i}" for i in (4, 3, 2, 1, 0)])
    assert [lv.name for lv in deep] == ["tier-4", "tier-3", "core", "spine", "leaf"]


def test_parse_levels_mappings() -> None:
    levels = parse_levels(
        [
            {"nodeLabel": "example.com/block", "name": "block"},
            {"nodeLabel": "example.com/rack", "kind": "group"},
            {"label": CLIQUE},
            {"nodeLabel": HOSTNAME_LABEL},
        ]
    )
    assert levels == (
        Level("block", "example.com/block", "switch"),
        Level("rack", "example.com/rack", "group"),
        Level("clique", CLIQUE, "fabric"),
    )
    assert levels[2].fabric and not levels[0].fabric


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"name": "x"}], r"levels\[0\]: expected a label key or a mapping with nodeLabel"),
        ([LEAF, 7], r"levels\[1\]: expected a label key or a mapping, got 7"),
        ([{"nodeLabel": "a/b", "kind": "ring"}], r"levels\[0\]\.kind: expected one of"),
        (["a/rack", "b/rack"], r"duplicate level names \['rack'\]"),
    ],
)
def test_parse_levels_errors(entries: list[object], message: str) -> None:
    with pytest.raises(HierarchyError, match=message):
        parse_levels(entries)  # type: ignore[arg-type]


H = Hierarchy(parse_levels([CORE, SPINE, LEAF, CLIQUE]))


def path(
    core: str | None, spine: str | None, leaf: str | None, clique: str | None = None
) -> tuple[str | None, ...]:
    labels = {
        k: v for k, v in ((CORE, core), (SPINE, spine), (LEAF, leaf), (CLIQUE, clique)) if v is not None
    }
    return H.path(labels)


def test_common_level() -> None:
    a = path("c1", "s1", "l1")
    assert H.common_level([a]) == 2
    assert H.common_level([a, path("c1", "s1", "l1")]) == 2
    assert H.common_level([a, path("c1", "s1", "l2")]) == 1
    assert H.common_level([a, path("c1", "s2", "l1")]) == 0  # same leaf name under another spine
    assert H.common_level([a, path("c2", "s1", "l1")]) == -1
    assert H.common_level([path("c1", "s1", "l1", "x.0"), path("c1", "s1", "l1", "x.0")]) == 3


def test_nodes_missing_labels() -> None:
    no_leaf = path("c1", "s1", None)
    assert H.domain(no_leaf, 2) is None
    assert H.domain(no_leaf, 1) == (1, ("c1", "s1"))
    assert H.common_level([no_leaf, path("c1", "s1", "l1")]) == 1
    # Missing a coarse label: the finer label alone does not make a shared domain.
    no_spine = path("c1", None, "l1")
    assert H.common_level([no_spine, path("c1", "s1", "l1")]) == 0
    assert H.common_level([no_spine, path("c1", None, "l1")]) == 2
    assert H.common_level([path(None, None, None), path(None, None, None)]) == -1
    assert H.describe((2, ("c1", "s1", "l1"))) == "leaf l1"


def test_switch_gbps_halves_per_switch_level_above_the_leaf() -> None:
    h = Hierarchy(H.levels, NetworkModel(nic_gbps=100.0, oversubscription=2.0))
    assert h.switch_gbps(3) == 100.0  # one clique (a fabric level below the leaf): full NIC rate
    assert h.switch_gbps(2) == 100.0  # one leaf
    assert h.switch_gbps(1) == 50.0  # one spine: through one more switch level
    assert h.switch_gbps(0) == 25.0
    assert h.switch_gbps(-1) == 12.5  # nothing shared
    flat = Hierarchy(H.levels, NetworkModel(nic_gbps=400.0, oversubscription=1.0))
    assert {flat.switch_gbps(level) for level in range(-1, 4)} == {400.0}
    grouped = Hierarchy(parse_levels([SPINE, LEAF, {"nodeLabel": "example.com/rack", "kind": "group"}]))
    assert (
        grouped.switch_gbps(2) == grouped.switch_gbps(1) == 100.0
    )  # a rack under one leaf: no switch of its own
    assert grouped.switch_gbps(0) == 50.0


def test_index_of_by_name_or_label() -> None:
    assert H.index_of("leaf") == 2 and H.index_of(LEAF) == 2
    assert H.index_of("rack") is None
