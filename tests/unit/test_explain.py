"""``gangslice explain``: offline from files (a dry run) and online over the in-memory API
(stored check state, the reservation, a dry run with the gang's own hold left out)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from extender.cli import main
from extender.commands.explain import explain_pods, explain_workload, parse_target, podgroup_state
from extender.controllers.explain import render
from extender.controllers.kueue.contract import CheckConfig
from extender.controllers.kueue.controller import AdmissionController
from extender.controllers.runner import take_lead
from extender.kube.api import Kind
from extender.placement.files import load_cluster
from extender.placement.slice import Slice, Unplaceable
from extender.reservations import ClusterCache
from extender.reservations.store import KubeReservationStore
from extender.testing.clock import FakeClock
from extender.testing.fixtures import load_fixture
from extender.testing.kube import FakeKube

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "kueue"
CLUSTER = FIXTURES / "cluster.yaml"
T0 = datetime.fromisoformat("2026-08-25T10:00:00+00:00").timestamp()
LWS = ("serving", "leaderworkerset-vllm-0-3f2a1")


def busy_cluster(tmp_path: Path) -> Path:
    """The fixture cluster with a-2, a-3 and all of leaf-b but b-0 in use."""
    data = yaml.safe_load(CLUSTER.read_text())
    nodes = []
    for group in data["nodes"]:
        for i in range(group["count"]):
            name = f"{group['name']}-{i}"
            busy = name in {"a-2", "a-3", "b-1", "b-2", "b-3"}
            node = {k: v for k, v in group.items() if k != "count"} | {"name": name}
            if busy:
                node["allocatedGpus"] = list(range(8))
            nodes.append(node)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({**data, "nodes": nodes}))
    return path


def leaf_gang(tmp_path: Path) -> Path:
    path = tmp_path / "gang.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "serving/tp32",
                "podSets": [
                    {"name": "tp", "count": 4, "gpusPerPod": 8, "comm": "allreduce", "requiredLevel": "leaf"}
                ],
            }
        )
    )
    return path


# -- offline -----------------------------------------------------------------------------------


def test_offline_gang_that_fits(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", "--cluster", str(CLUSTER), "--gang", str(FIXTURES / "gang.yaml")])
    out = capsys.readouterr().out
    assert code == 0
    assert "asks for: 4 pod(s), 32 GPU(s)" in out
    assert "worker       3 pod(s) x 8 GPU(s), allreduce, preferred leaf, with leader in one leaf" in out
    assert "reservation: none" in out
    assert "dry run now: a slice exists: 4 pod(s) on" in out


def test_offline_gang_that_waits_names_the_closest_domain_and_what_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["explain", "--cluster", str(busy_cluster(tmp_path)), "--gang", str(leaf_gang(tmp_path))])
    out = capsys.readouterr().out
    assert code == 3  # as `gangslice place`: no slice
    assert "dry run now: no slice" in out
    assert "  why: pod set tp: no leaf has room for 4 pods" in out
    assert "  closest: leaf leaf-a; lacks 2 more pod(s) of pod set tp (16 GPUs)" in out
    assert len(out.splitlines()) < 25


def test_a_pod_set_that_fits_nowhere_is_not_said_to_lack_one_pod_of_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every node busy: no domain holds a single pod, so there is no closest one to name."""
    data = yaml.safe_load(busy_cluster(tmp_path).read_text())
    data["nodes"] = [{**n, "allocatedGpus": list(range(8))} for n in data["nodes"]]
    full = tmp_path / "full.yaml"
    full.write_text(yaml.safe_dump(data))
    gang = tmp_path / "one.yaml"
    gang.write_text(
        yaml.safe_dump({"name": "serving/one", "podSets": [{"name": "w", "count": 1, "gpusPerPod": 8}]})
    )
    code = main(["explain", "--cluster", str(full), "--gang", str(gang)])
    out = capsys.readouterr().out
    assert code == 3, out
    assert "closest: none" not in out and "lacks" not in out, out
    assert "  no domain holds even one of its pods: short by 1 pod(s) of pod set w (8 GPUs)" in out, out


def test_online_commands_without_a_kubeconfig_say_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["explain", "gang/serving/tp32"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("gangslice explain: no cluster to talk to") and "--kubeconfig" in err, err


def test_offline_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", "--cluster", str(busy_cluster(tmp_path)), "--gang", str(leaf_gang(tmp_path)), "--json"])
    got = json.loads(capsys.readouterr().out)
    assert got["gang"]["gpus"] == 32
    assert got["dryRun"]["placed"] is False
    assert (got["dryRun"]["closest"], got["dryRun"]["shortBy"]) == ("leaf leaf-a", 2)
    assert got["reservation"] is None


def test_offline_workload_shows_its_check_and_a_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "--cluster", str(CLUSTER), "--workload", str(FIXTURES / "workload-lws.yaml")]
    assert main([*args, "--check", "gangslice"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "workload serving/leaderworkerset-vllm-0-3f2a1"
    assert "admission check: Pending since 2026-08-25T10:00:00Z" in out
    assert "controller's view: quota reserved, our check is Pending" in out
    assert "preferred levels" in out and "can be met now" in out
    assert "dry run now: a slice exists" in out
    # Without --check, two entries are ambiguous: said, not guessed.
    main(args)
    assert "name ours with --check" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "--gang", "gang.yaml"],
        ["explain", "deployment/serving/x"],
        ["explain", "workload/serving"],
        ["explain"],
    ],
)
def test_bad_input_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("gangslice explain: ") and len(err.splitlines()) == 1, (out, err)


def test_parse_target() -> None:
    assert parse_target("Workload/serving/vllm") == ("workload", "serving", "vllm")
    with pytest.raises(ValueError, match="KIND/NAMESPACE/NAME"):
        parse_target("gang/vllm")


# -- online (in-memory API) --------------------------------------------------------------------


def _api() -> FakeKube:
    api = FakeKube()
    api.put("admissionchecks", load_fixture("kueue/admissioncheck.yaml"))
    api.put("resourceflavors", load_fixture("kueue/resourceflavor.yaml"))
    api.put("workloads", load_fixture("kueue/workload-lws.yaml"))
    return api


def test_online_workload_holding_a_reservation() -> None:
    async def body() -> None:
        api, clock = _api(), FakeClock(T0 + 5)
        cache = ClusterCache.from_snapshot(
            load_cluster(CLUSTER), clock=clock, store=KubeReservationStore(api)
        )
        ctl = AdmissionController(api, cache, CheckConfig(), clock=clock)
        await take_lead(ctl.cache, ctl)
        await ctl.on_admission_check(None, load_fixture("kueue/admissioncheck.yaml"))
        wl = api.peek("workloads", LWS[1], LWS[0])
        assert wl is not None
        await ctl.on_workload(None, wl)

        facts = await explain_workload(api, cache, *LWS)
        assert facts.check is not None and facts.check.state == "Ready"
        assert facts.reservation is not None and len(facts.reservation.slice.slots) == 4
        # The dry run leaves the gang's own hold out, so it finds a slice again.
        assert isinstance(facts.dry_run, Slice)
        text = render(facts)
        assert "reservation: leaderworkerset-vllm-0-3f2a1 (Reserved, 0/4 pods bound)" in text
        assert "32 GPU(s) on" in text and "us/layer" in text
        assert "leader/0" in text and "worker/2" in text

        # From the stored object alone (a cache that has not seen it, e.g. --cluster FILE).
        fresh = ClusterCache.from_snapshot(load_cluster(CLUSTER), clock=clock)
        facts = await explain_workload(api, fresh, *LWS)
        assert (
            facts.reservation is not None and facts.reservation.gang == "serving/leaderworkerset-vllm-0-3f2a1"
        )

    asyncio.run(body())


def test_online_waiting_workload_shows_the_stored_reason_and_a_fresh_dry_run() -> None:
    async def body() -> None:
        api = _api()
        wl = api.peek("workloads", LWS[1], LWS[0])
        assert wl is not None
        wl["status"]["admissionChecks"][0]["message"] = "waiting for a slice: stored reason"
        api.put("workloads", wl)
        snap = load_cluster(CLUSTER)
        cache = ClusterCache.from_snapshot(
            type(snap)([n for n in snap.nodes if n.name in {"a-0", "b-0"}], snap.hierarchy)
        )
        facts = await explain_workload(api, cache, *LWS)
        assert facts.check is not None and facts.check.message == "waiting for a slice: stored reason"
        assert isinstance(facts.dry_run, Unplaceable)
        text = render(facts)
        assert "admission check: Pending since 2026-08-25T10:00:00Z" in text
        assert "  waiting for a slice: stored reason" in text
        assert "dry run now: no slice" in text and "closest:" in text

        missing = await explain_workload(api, cache, "serving", "nope")
        assert missing.problems == ["workload serving/nope not found"]

    asyncio.run(body())


def test_online_plain_gang_from_its_pods() -> None:
    cache = ClusterCache.from_snapshot(load_cluster(CLUSTER))
    for i in range(2):
        cache.apply(
            Kind.PODS,
            "ADDED",
            {
                "metadata": {
                    "name": f"tp-{i}",
                    "namespace": "serving",
                    "uid": f"u{i}",
                    "labels": {"gangslice.io/gang": "tp"},
                    "annotations": {"gangslice.io/gang-size": "2", "gangslice.io/required-level": "leaf"},
                },
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            },
        )
    facts = explain_pods(cache, "gang", "serving", "tp", None)
    assert facts.gang is not None and (facts.gang.pods, facts.gang.gpus) == (2, 16)
    assert isinstance(facts.dry_run, Slice)
    assert explain_pods(cache, "gang", "serving", "other", None).problems == [
        "no pods of gang serving/other in the cluster"
    ]


def test_online_podgroup_uses_the_controllers_request_and_its_stored_state() -> None:
    """The PodGroup's roles, minMember and network topology, as the PodGroup controller
    reads them, not a request guessed from the pods present."""
    volcano = Path(__file__).resolve().parents[1] / "fixtures" / "volcano"
    pg = yaml.safe_load((volcano / "podgroup-llama.yaml").read_text())
    pg["metadata"].setdefault("annotations", {})["gangslice.io/status"] = "Waiting: waiting for 1 more pod"
    cache = ClusterCache.from_snapshot(load_cluster(volcano / "cluster.yaml"))
    for pod in yaml.safe_load_all((volcano / "pods-llama.yaml").read_text()):
        cache.apply(Kind.PODS, "ADDED", pod)
    ns, name = pg["metadata"]["namespace"], pg["metadata"]["name"]
    facts = explain_pods(cache, "podgroup", ns, name, podgroup_state(pg), pg)
    assert facts.problems == []
    assert facts.gang is not None
    sets = {ps.name: ps for ps in facts.gang.pod_sets}
    assert (sets["leader"].count, sets["worker"].count) == (1, 3)
    assert sets["worker"].required_level == "leaf"  # spec.networkTopology, hard, tier 1
    assert facts.check is not None and (facts.check.state, facts.check.message) == (
        "Waiting",
        "waiting for 1 more pod",
    )
    assert isinstance(facts.dry_run, Slice)
    gone = explain_pods(cache, "podgroup", ns, "gone", None, None)
    assert gone.problems == [f"PodGroup {ns}/gone not found"]
