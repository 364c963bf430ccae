"""The hostile bench's loads on a real kube-apiserver (:mod:`extender.bench.hostile_api`, what
``gangslice bench extender --hostile --bin-dir`` prints): the goals of the hardening on its
figures, for the metrics port, the Volcano port and the OpenShift install."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.bench.hostile_api import run_hostile_api

pytestmark = pytest.mark.e2e


def test_the_metrics_port_and_the_openshift_verbs_hold_against_the_hostile_load(e2e_bin_dir: Path) -> None:
    f, volcano, openshift = run_hostile_api(e2e_bin_dir)
    shown = "\n".join(x.render() for x in (f, volcano, openshift))
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
    # The Volcano port and OpenShift: forged calls that need none of the scheduler's knowledge
    # change nothing on the API server.
    assert len(volcano.calls) == 5 and volcano.changed == [], shown
    assert len(openshift.calls) == 6 and openshift.changed == [], shown
