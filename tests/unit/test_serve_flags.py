"""``gangslice serve``'s admission controller wait flags: parsing, validation, the configs they build."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest

from extender import cli
from extender.cli import UsageError, build_parser
from extender.commands import serve as commands
from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.mismatch.reporter import OnMismatch
from extender.controllers.podgroups.controller import PodGroupConfig
from extender.placement.waiting import KeepCliques


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--kubeconfig", "kc", *argv])


def test_without_flags_the_configs_are_the_defaults() -> None:
    check, podgroups = commands.controller_configs(parse())
    assert check == CheckConfig()
    assert podgroups == PodGroupConfig()


def test_flags_reach_both_configs() -> None:
    args = parse(
        "--widen-after",
        "1",
        "--retry-after",
        "5.5",
        "--requeue-after",
        "30",
        "--resync",
        "0.5",
        "--hold-ttl",
        "90",
        "--member-wait",
        "7",
    )
    check, podgroups = commands.controller_configs(args)
    assert check == CheckConfig(
        widen_after_s=1.0,
        retry_after_s=5.5,
        requeue_after_s=30,
        resync_s=0.5,
        hold_ttl_s=90.0,
        member_wait_s=7.0,
    )
    assert isinstance(check.requeue_after_s, int)
    assert podgroups == PodGroupConfig(hold_ttl_s=90.0, member_wait_s=7.0, resync_s=0.5)


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--widen-after", "0"),
        ("--retry-after", "-1"),
        ("--requeue-after", "0"),
        ("--resync", "nan"),
        ("--hold-ttl", "inf"),
        ("--member-wait", "-0.5"),
    ],
)
def test_non_positive_waits_are_a_usage_error_naming_the_flag(flag: str, value: str) -> None:
    with pytest.raises(UsageError, match=f"^{flag} .*must be a positive number of seconds$"):
        commands.controller_configs(parse(flag, value))


@pytest.fixture
def no_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if serve reaches for the API server (a bad flag must stop it first)."""

    def connect(*a: Any, **k: Any) -> None:
        raise AssertionError("the API must not be reached with a bad flag")

    monkeypatch.setattr("extender.kube.client.ApiServerClient.connect", connect)


@pytest.mark.usefixtures("no_api")
def test_bad_wait_exits_2_with_one_line_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--kubeconfig", "kc", "--retry-after", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "gangslice serve: --retry-after 0: must be a positive number of seconds\n", err


def test_fractional_requeue_after_is_rejected_by_the_parser() -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--requeue-after", "1.5")
    assert exc.value.code == 2


def test_run_serve_passes_the_configs_to_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_run_controller(cache: Any, **kwargs: Any) -> None:
        seen.update(kwargs)

    async def fake_serve(
        cache: Any, options: Any, api: Any = None, controller: Any = None, reviewer: Any = None, **kw: Any
    ) -> None:
        seen["cache"] = cache
        seen["serve"] = kw
        await controller(asyncio.Event(), lambda leading: None)

    api_client = object()

    def load(kubeconfig: str | None = None, context: str | None = None) -> object:
        seen["loaded"] = kubeconfig
        return api_client

    monkeypatch.setattr("extender.kube.client.load_api_client", load)
    monkeypatch.setattr("extender.controllers.runner.run_controller", fake_run_controller)
    monkeypatch.setattr("extender.httpapi.server.serve", fake_serve)
    args = parse("--widen-after", "2", "--retry-after", "3", "--requeue-after", "4", "--member-wait", "6")
    assert commands.run_serve(args) == 0
    assert seen["config"] == CheckConfig(widen_after_s=2, retry_after_s=3, requeue_after_s=4, member_wait_s=6)
    assert seen["podgroup_config"] == PodGroupConfig(member_wait_s=6)
    # One client, from the kubeconfig, for the extender and the controllers alike.
    assert seen["loaded"] == "kc"
    assert seen["api"].api_client is api_client and seen["api_client"] is api_client
    housekeeping = seen["housekeeping"]
    assert housekeeping.topology_status is not None and housekeeping.claims is not None
    # The default: report, and evict only a pod whose GPUs break its pod set's rule.
    assert housekeeping.mismatches.on_mismatch is OnMismatch.EVICT_INCOHERENT
    assert housekeeping.mismatches.api is seen["api"]
    # The controllers hear pods from the cache's own watch, the one serve runs.
    assert seen["elect"] and seen["pods"] is not None and seen["serve"]["watcher"] is not None
    assert seen["cache"].waiting.keep is KeepCliques.WHILE_WAITING  # the default


def test_keep_cliques_reaches_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_serve(cache: Any, options: Any, **kwargs: Any) -> None:
        seen["cache"] = cache

    monkeypatch.setattr("extender.httpapi.server.serve", fake_serve)
    cluster = "examples/clusters/gb200-nvl72-pair.yaml"
    args = build_parser().parse_args(["serve", "--cluster", cluster, "--keep-cliques", "always"])
    assert commands.run_serve(args) == 0
    assert seen["cache"].waiting.keep is KeepCliques.ALWAYS


def test_on_mismatch_takes_report_evict_incoherent_or_evict_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse("--on-mismatch", "evict").on_mismatch == "evict"
    assert parse("--on-mismatch", "report").on_mismatch == "report"
    assert parse().on_mismatch == "evict-incoherent"
    with pytest.raises(SystemExit):
        parse("--on-mismatch", "delete")
    assert "invalid choice: 'delete'" in capsys.readouterr().err


@pytest.mark.usefixtures("no_api")
def test_bad_imex_daemon_requests_exit_2_naming_the_flag_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve", "--kubeconfig", "kc", "--imex-daemon-requests", "cpu=fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gangslice serve: --imex-daemon-requests: cpu: 'fast' is not a quantity"), err
