"""The checks and the setup of ``gangslice bench scheduler`` on plain data (the run itself is
in tests/e2e/test_bench_scheduler.py)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.bench.controlplane import ControlPlaneError
from extender.bench.scheduler import (
    Case,
    SchedulerBenchOptions,
    api_writes,
    bench_pods,
    cases,
    check_prerequisites,
    double_booked,
    fabric,
    metric_samples,
    scheduler_config,
    split_gangs,
)
from extender.cli import main


def pod(
    name: str, node: str | None, gpus: str = "", gang: str | None = None, asks: int = 2
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"gangslice.io/gang": gang} if gang else {},
            "annotations": {"gangslice.io/gpus": gpus} if gpus else {},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(asks)}}}],
        },
    }


def test_double_booked_counts_gpus_annotated_twice_on_a_node() -> None:
    fine = [pod("a", "n1", "0,1"), pod("b", "n1", "2,3"), pod("c", "n2", "0,1")]
    assert double_booked(fine) == 0
    assert double_booked([*fine, pod("d", "n1", "1,4")]) == 1


def test_double_booked_counts_gpus_beyond_the_node_without_annotations() -> None:
    four = [pod(f"p{i}", "n1") for i in range(4)]
    assert double_booked(four) == 0
    assert double_booked([*four, pod("p4", "n1")]) == 2
    assert double_booked([pod("unbound", None)] * 9) == 0


def test_split_gangs_counts_gangs_under_two_leaves() -> None:
    leaf_of = {"n1": "l1", "n2": "l1", "n3": "l2"}
    pods = [pod("g-0", "n1", gang="g"), pod("g-1", "n2", gang="g"), pod("h-0", "n1", gang="h")]
    assert split_gangs(pods, leaf_of) == 0
    assert split_gangs([*pods, pod("h-1", "n3", gang="h")], leaf_of) == 1


def test_every_case_places_the_same_pods_in_whole_gangs() -> None:
    options = SchedulerBenchOptions(pods=40, gang_sizes=(4, 16))
    names = [c.name for c in cases(options)]
    assert names == ["default scheduler", "extender, pods", "extender, gangs of 4", "extender, gangs of 16"]
    assert len(bench_pods(Case("x", 0), options, "ns")) == 40
    gangs = bench_pods(Case("x", 4), options, "ns")
    assert len(gangs) == 40
    assert {p["metadata"]["annotations"]["gangslice.io/gang-size"] for p in gangs} == {"4"}
    assert len({p["metadata"]["labels"]["gangslice.io/gang"] for p in gangs}) == 10
    # 40 // 16 = 2 whole gangs: 32 pods.
    assert len(bench_pods(Case("x", 16), options, "ns")) == 32


def test_fabric_puts_nodes_under_leaves_and_spines() -> None:
    nodes = fabric(SchedulerBenchOptions(nodes=20, nodes_per_leaf=4, leaves_per_spine=2))
    assert len({n.leaf for n in nodes}) == 5
    assert len({n.spine for n in nodes}) == 3


def test_the_default_case_is_the_shipped_config_without_its_extender() -> None:
    alone = scheduler_config(None)
    withit = scheduler_config("http://127.0.0.1:1")
    assert "extenders" not in alone
    assert withit["extenders"][0]["urlPrefix"] == "http://127.0.0.1:1/gangslice"
    assert alone["profiles"] == withit["profiles"]
    assert alone["leaderElection"] == {"leaderElect": False}


def test_api_writes_are_the_difference_of_two_scrapes() -> None:
    text = (
        "# TYPE apiserver_request_total counter\n"
        'apiserver_request_total{{verb="POST",resource="pods",subresource="binding",code="201"}} {}\n'
        'apiserver_request_total{{verb="GET",resource="pods",subresource="",code="200"}} {}\n'
    )
    before, after = metric_samples(text.format(3, 5)), metric_samples(text.format(10, 50))
    assert api_writes(before, after) == {"POST pods/binding": 7.0}


def test_missing_binaries_fail_naming_what_to_install(tmp_path: Any) -> None:
    (tmp_path / "etcd").write_text("")
    with pytest.raises(ControlPlaneError, match=r"kube-apiserver, kube-scheduler.*hack/e2e/build.sh"):
        check_prerequisites(tmp_path)


def test_the_command_fails_loudly_without_binaries(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "scheduler", "--bin-dir", str(tmp_path), "--nodes", "2", "--pods", "4", "--gang-sizes"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "missing in" in err and "hack/e2e/build.sh" in err and "Go >= 1.26" in err
