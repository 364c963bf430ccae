"""The metrics port under the hostile bench's load, on a real kube-apiserver
(:mod:`extender.bench.hostile_metrics`, what ``gangslice bench extender --hostile --bin-dir``
prints): the goals of the hardening on its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.bench.hostile_metrics import run_metrics_hostile

pytestmark = pytest.mark.e2e


def test_idle_clients_and_invented_tokens_neither_lock_the_scraper_out_nor_flood_the_api_server(
    e2e_bin_dir: Path,
) -> None:
    f = run_metrics_hostile(e2e_bin_dir)
    shown = f.render()
    assert f.control_calls and f.control_ok == f.control_calls, shown
    # 256 idle keep-alive clients without a token: their connections give way to the scraper's.
    assert f.idle_clients == 256 and f.idle_scrapes_ok >= 0.95 * f.idle_scrapes, shown
    # Invented tokens: none gets the metrics, and most are refused without asking the API server
    # (the reviews in flight are bounded), while the scraper and the verbs' probes are answered.
    assert f.tokens_sent == 512 and f.token_statuses["200"] == 0, shown
    assert f.token_statuses["401"] + f.token_statuses["503"] == f.tokens_sent, shown
    assert f.token_statuses["401"] < f.tokens_sent / 2, shown
    assert f.token_scrapes and f.token_scrapes_ok >= 0.95 * f.token_scrapes, shown
    assert f.verbs_healthz_checks and f.verbs_healthz_ok == f.verbs_healthz_checks, shown
    assert f.verbs_healthz_slowest_ms <= 1000, shown
    assert f.rss_peak_mib < 300, shown
