"""``gangslice playground`` on plain data: the chart's controller and scheduler turned into local
processes, the folder it claims, the one line without Go, the fleet, and ``--once`` (the run itself
is in tests/e2e/test_playground.py)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.bench import playground as pg
from extender.bench.fake_nodes import node_objects, playground_fleet
from extender.cli import main
from extender.topology.model import FabricClique

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"


def chart_controller_args() -> list[str]:
    deployment = yaml.safe_load((MANIFESTS / "controller" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


def test_the_chart_controller_arguments_become_a_local_serve() -> None:
    files = {"tls.crt": Path("/w/crt"), "tls.key": Path("/w/key"), "ca.crt": Path("/w/ca")}
    argv = pg.serve_argv(chart_controller_args(), files, "debug")
    assert argv[0] == "serve"
    assert not [a for a in argv if "/etc/" in a], argv
    assert {"--tls-cert=/w/crt", "--tls-key=/w/key", "--tls-client-ca=/w/ca", "--log-level=debug"} <= set(
        argv
    )
    port = pg.flag_value(argv, "--port")
    assert port and port.isdigit() and port != "8888", argv
    # No scraper with a token: /metrics stays on the verbs' port, where the printed curl reads it.
    assert "--metrics-port=9443" in chart_controller_args() and pg.flag_value(argv, "--metrics-port") is None


def test_a_controller_file_the_playground_cannot_stand_in_for_is_refused() -> None:
    with pytest.raises(pg.PlaygroundError, match=r"/etc/other/x\.pem"):
        pg.serve_argv(["serve", "--tls-cert=/etc/other/x.pem"], {}, "info")


def test_the_chart_scheduler_configuration_points_at_the_local_serve() -> None:
    chart = yaml.safe_load((MANIFESTS / "scheduler" / "kube-scheduler-config-tls.yaml").read_text())
    client = (Path("/w/client.crt"), Path("/w/client.key"))
    cfg = pg.scheduler_config(
        chart, "https://127.0.0.1:4321", Path("/w/ca"), client, Path("/w/sched.kubeconfig")
    )
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:4321/gangslice"
    assert ext["tlsConfig"] == {"caFile": "/w/ca", "certFile": "/w/client.crt", "keyFile": "/w/client.key"}
    assert cfg["clientConnection"]["kubeconfig"] == "/w/sched.kubeconfig"
    assert cfg["profiles"] == chart["profiles"] and cfg["leaderElection"] == chart["leaderElection"]
    assert chart["extenders"][0]["urlPrefix"].startswith("https://gangslice-controller")  # not changed


def test_without_go_and_binaries_one_line_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GANGSLICE_E2E_BIN", raising=False)
    monkeypatch.setenv("GANGSLICE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-go"))
    with pytest.raises(pg.PlaygroundError, match=r"Go >= 1\.26 is needed .* https://go\.dev/dl/"):
        pg.find_binaries(None, print)
    assert main(["playground", "--dir", str(tmp_path / "pg")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gangslice playground: Go >= 1.26 is needed"), err


def test_binaries_built_before_serve_without_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GANGSLICE_E2E_BIN", raising=False)
    monkeypatch.setenv("GANGSLICE_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-go"))
    monkeypatch.setattr(pg, "default_bin_dir", lambda: tmp_path / "bin")
    (tmp_path / "bin").mkdir()
    for exe in pg.NEEDED:
        (tmp_path / "bin" / exe).touch(mode=0o755)
    said: list[str] = []
    assert pg.find_binaries(None, said.append) == tmp_path / "bin"
    assert "Go is not on PATH" in said[0]


def test_the_folder_is_claimed_emptied_and_locked(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(pg.PlaygroundError, match="holds files of something else"):
        pg.claim_folder(other)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]

    folder = tmp_path / "pg"
    lock = pg.claim_folder(folder)
    (folder / "logs").mkdir()
    with pytest.raises(pg.PlaygroundError, match="another gangslice playground runs"):
        pg.claim_folder(folder)
    lock.close()
    pg.claim_folder(folder).close()  # the last run's files go
    assert sorted(p.name for p in folder.iterdir()) == sorted([pg.LOCK, pg.MARKER])
    assert folder.stat().st_mode & 0o077 == 0


def test_the_fleet_is_labelled_as_gpu_feature_discovery_and_topograph_label_it() -> None:
    fleet = playground_fleet()
    by_preset: dict[str, int] = {}
    for node in fleet:
        by_preset[node.preset] = by_preset.get(node.preset, 0) + 1
    assert by_preset == {"hgx-h100": 4, "pcie-8gpu-2socket": 2, "gb200-tray": 18}
    trays = [n for n in fleet if n.preset == "gb200-tray"]
    assert len({n.clique for n in trays}) == 1 and isinstance(trays[0].clique, FabricClique)
    node, status, topology = node_objects(trays[0])
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.clique"] == trays[0].clique.label
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-GB200" and labels["nvidia.com/gpu.count"] == "4"
    assert status["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert topology["spec"]["clique"]["cliqueId"] == 1 and len(topology["spec"]["gpus"]) == 4
    hgx = node_objects(fleet[0])[0]["metadata"]["labels"]
    assert hgx["fabric.topograph.run/tier-0"] == "leaf-hgx-1" and hgx["nvidia.com/gpu.family"] == "hopper"


def test_expected_pods_count_the_example_workloads() -> None:
    docs = list(yaml.safe_load_all((REPO / "examples" / "k8s" / "plain" / "prefill-decode.yaml").read_text()))
    assert pg.expected_pods(docs) == {"inference": 2}
    assert pg.expected_pods([{"kind": "Service", "metadata": {"namespace": "x"}}]) == {}


def summary(folder: Path) -> pg.Summary:
    return pg.Summary(
        folder=folder,
        kubeconfig=folder / "admin.kubeconfig",
        server="https://127.0.0.1:6443",
        kubectl=Path("/bin/kubectl"),
        ca_file=folder / "pki" / "ca.crt",
        extender_url="https://127.0.0.1:8888",
        nodes=24,
        pods=[pg.BoundPod("inference", "p-0", "hgx-h100-1", "0,1,2,3", "0", "pd")],
        reservations=[
            pg.Reserved("inference", "pd", "inference/pd", "hgx-h100-1", ("p/0 on hgx-h100-1, GPUs 0-3",))
        ],
        seconds=12.5,
    )


def test_the_printed_commands_name_the_kubeconfig_the_gang_and_the_metrics(tmp_path: Path) -> None:
    lines = pg.commands(summary(tmp_path / "a b"))
    assert all(shlex.split(line) for line in lines)
    kubectl = [shlex.split(line) for line in lines if line.startswith("kubectl ")]
    assert all(
        words[1:3] == ["--kubeconfig", str(tmp_path / "a b" / "admin.kubeconfig")] for words in kubectl
    )
    assert any("slicereservations" in words for words in kubectl)
    kubeconfig = shlex.quote(str(tmp_path / "a b" / "admin.kubeconfig"))
    assert f"gangslice explain gang/inference/pd --kubeconfig {kubeconfig}" in lines
    assert lines[-1].startswith("curl -s --cacert ") and "https://127.0.0.1:8888/metrics" in lines[-1]


class _FakePlayground:
    downs: list[bool] = []

    def __init__(self, options: pg.PlaygroundOptions, say: Any) -> None:
        self.options = options
        self.cp: object | None = None

    def up(self) -> pg.Summary:
        self.cp = object()
        return summary(self.options.folder)

    def dead(self) -> None:
        raise AssertionError("--once does not wait")

    def down(self) -> None:
        self.downs.append(True)


def test_once_prints_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pg, "Playground", _FakePlayground)
    assert main(["playground", "--once", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Ready in 12.5 s" in out and "SliceReservation inference/pd" in out
    assert "--once: stopping." in out and out.rstrip().endswith(f"logs stay in {tmp_path / 'logs'}.")
    assert _FakePlayground.downs == [True]
