"""The DRA webhook's caBundle without cert-manager: `serve --webhook-ca-bundle` sets the CA of
hack/gen-certs.sh on the entries of the shipped MutatingWebhookConfiguration that call
gangslice, leaves other entries alone, sets it again after a rotation or a reset, never
overwrites a change it did not read, and refuses a file that holds no certificate."""

from __future__ import annotations

import asyncio
import base64
import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.cli import main
from extender.controllers.webhook_ca.sync import CaBundleError, WebhookCa, ours, read_ca
from extender.kube.api import MUTATING_WEBHOOKS, Conflict
from extender.kube.names import WEBHOOK_CONFIGURATION
from extender.testing.kube import FakeKube

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "manifests" / "dra" / "webhook.yaml"


def gen_certs(out: Path) -> Path:
    subprocess.run(
        ["bash", str(REPO / "hack/gen-certs.sh"), "--out", str(out)], check=True, capture_output=True
    )
    return out / "ca.crt"


@pytest.fixture(scope="module")
def cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return gen_certs(tmp_path_factory.mktemp("ca")), gen_certs(tmp_path_factory.mktemp("rotated"))


def shipped(extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    cfg["webhooks"] += extra or []
    return cfg


FOREIGN = {
    "name": "someone-else.example.com",
    "clientConfig": {
        "service": {"name": "other", "namespace": "other", "path": "/mutate"},
        "caBundle": "b3RoZXI=",
    },
}


def bundles(api: FakeKube) -> dict[str, str | None]:
    cfg = api.peek(MUTATING_WEBHOOKS, WEBHOOK_CONFIGURATION)
    assert cfg is not None
    return {h["name"]: h["clientConfig"].get("caBundle") for h in cfg["webhooks"]}


def test_sets_the_ca_on_gangslices_entries_only_and_keeps_it(tmp_path: Path, cas: tuple[Path, Path]) -> None:
    ca, rotated = cas
    mounted = tmp_path / "ca.crt"
    shutil.copy(ca, mounted)
    api = FakeKube()
    clock = [0.0]
    sync = WebhookCa(api, WEBHOOK_CONFIGURATION, str(mounted), clock=lambda: clock[0])
    assert asyncio.run(sync.sync()) == "absent"  # DRA not installed yet: nothing to do, no error
    api.put(MUTATING_WEBHOOKS, shipped([FOREIGN]))
    clock[0] += 61
    assert asyncio.run(sync.sync()) == "patched"
    want = base64.b64encode(ca.read_bytes()).decode()
    assert bundles(api) == {
        "pin-gang-pods.gangslice.io": want,
        "pin-managed-pods.gangslice.io": want,
        "pods.gangslice.io": want,
        "someone-else.example.com": "b3RoZXI=",
    }
    writes = len(api.writes())
    asyncio.run(sync.sync())  # not due: nothing read or written
    clock[0] += 61
    assert asyncio.run(sync.sync()) == "current" and len(api.writes()) == writes
    # A rotated CA file is set at the next housekeeping, without waiting for the recheck.
    shutil.copy(rotated, mounted)
    assert asyncio.run(sync.sync()) == "patched"
    assert bundles(api)["pods.gangslice.io"] == base64.b64encode(rotated.read_bytes()).decode()
    # Someone re-applies the manifest without caBundle: put right at the recheck.
    api.put(MUTATING_WEBHOOKS, shipped([FOREIGN]))
    asyncio.run(sync.sync())  # not due yet
    assert bundles(api)["pods.gangslice.io"] is None
    clock[0] += 61
    assert asyncio.run(sync.sync()) == "patched"
    assert bundles(api)["pin-gang-pods.gangslice.io"] == base64.b64encode(rotated.read_bytes()).decode()


def test_a_change_made_after_the_read_is_not_overwritten(tmp_path: Path, cas: tuple[Path, Path]) -> None:
    api = FakeKube()
    api.put(MUTATING_WEBHOOKS, shipped())
    api.fail_next("replace mutatingwebhookconfigurations", Conflict(409, "the object has been modified"))
    clock = [0.0]
    sync = WebhookCa(api, WEBHOOK_CONFIGURATION, str(cas[0]), clock=lambda: clock[0])
    state = asyncio.run(sync.sync())
    assert "has been modified" in state and bundles(api)["pods.gangslice.io"] is None
    reads = len(api.calls)
    assert asyncio.run(sync.sync()) == state and len(api.calls) == reads  # not on every tick
    clock[0] += 16
    assert asyncio.run(sync.sync()) == "patched"  # read again and set


def test_entries_calling_gangslice_by_url_count_as_ours() -> None:
    assert ours({"clientConfig": {"url": "https://127.0.0.1:8888/admission/pods"}})
    assert not ours({"clientConfig": {"url": "https://127.0.0.1:8888/mutate"}})
    assert not ours({"clientConfig": {}})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no PEM certificate"),
        (
            "-----BEGIN CERTIFICATE-----\nnot base64 !!\n-----END CERTIFICATE-----\n",
            "certificate 1 is not valid",
        ),
    ],
)
def test_a_file_without_a_certificate_is_refused_naming_it(tmp_path: Path, text: str, words: str) -> None:
    bad = tmp_path / "ca.crt"
    bad.write_text(text)
    with pytest.raises(CaBundleError, match=words) as err:
        read_ca(str(bad))
    assert str(bad) in str(err.value)
    api = FakeKube()
    api.put(MUTATING_WEBHOOKS, shipped())
    before = copy.deepcopy(api.peek(MUTATING_WEBHOOKS, WEBHOOK_CONFIGURATION))
    state = asyncio.run(WebhookCa(api, WEBHOOK_CONFIGURATION, str(bad)).sync())
    assert words in state and api.peek(MUTATING_WEBHOOKS, WEBHOOK_CONFIGURATION) == before


def test_the_serve_flag_refuses_a_bad_file_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "ca.crt"
    bad.write_text("nothing here")
    argv = ["serve", "--kubeconfig", str(tmp_path / "kubeconfig"), "--tls-cert", "c", "--tls-key", "k"]
    assert main([*argv, "--webhook-ca-bundle", str(bad)]) != 0
    assert "--webhook-ca-bundle" in capsys.readouterr().err
    assert main(["serve", "--cluster", "x.yaml", "--webhook-ca-bundle", str(bad)]) != 0
    assert "needs --tls-cert and an API server" in capsys.readouterr().err
