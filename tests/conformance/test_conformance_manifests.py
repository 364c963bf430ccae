"""The scheduler configurations in manifests/scheduler: valid as upstream reads them, and every
verb they name is served by the app."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from extender.httpapi.app import build_app
from extender.reservations import ClusterCache

ROOT = Path(__file__).resolve().parents[2]
KUBE_CONFIG = ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
VOLCANO_CONFIG = ROOT / "manifests" / "scheduler" / "volcano-scheduler.conf"

#: kube-scheduler config/v1 Extender fields (kubernetes/kube-scheduler:config/v1/types.go).
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}  # fmt: skip
#: Volcano extender plugin arguments (pkg/scheduler/plugins/extender).
VOLCANO_ARGUMENTS = {
    f"extender.{name}"
    for name in (
        "urlPrefix", "httpTimeout", "onSessionOpenVerb", "onSessionCloseVerb", "predicateVerb",
        "prioritizeVerb", "preemptableVerb", "reclaimableVerb", "queueOverusedVerb", "jobEnqueueableVerb",
        "jobEnqueuedVerb", "jobReadyVerb", "allocateFuncVerb", "deallocateFuncVerb", "ignorable",
        "managedResources",
    )
}  # fmt: skip
GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


def served_posts(tmp_path: Path) -> set[str]:
    (tmp_path / "c.yaml").write_text("nodes: [{name: n, gpuTopology: hgx-h100}]\n")
    app = build_app(ClusterCache.from_cluster_file(tmp_path / "c.yaml"))
    return {
        r.resource.canonical for r in app.router.routes() if r.method == "POST" and r.resource is not None
    }


def verb_path(url_prefix: str, verb: str) -> str:
    # HTTPExtender.send and Volcano's send: strings.TrimRight(urlPrefix, "/") + "/" + verb
    return urlparse(url_prefix.rstrip("/") + "/" + verb).path


def kube_config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(KUBE_CONFIG.read_text())
    return data


def test_kube_scheduler_configuration_is_valid_for_an_extender() -> None:
    cfg = kube_config()
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["percentageOfNodesToScore"] == 100
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gangslice-scheduler"]
    assert all(p.get("percentageOfNodesToScore", 100) == 100 for p in cfg["profiles"])
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    assert isinstance(ext["enableHTTPS"], bool)
    assert ext["urlPrefix"].startswith("https://" if ext["enableHTTPS"] else "http://")
    assert ext["weight"] > 0  # required when prioritizeVerb is set
    assert GO_DURATION.match(ext["httpTimeout"])
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert sum(1 for e in cfg["extenders"] if e.get("bindVerb")) <= 1


def test_every_kube_scheduler_verb_is_served(tmp_path: Path) -> None:
    (ext,) = kube_config()["extenders"]
    verbs = [ext[k] for k in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb") if ext.get(k)]
    assert len(verbs) == 4
    served = served_posts(tmp_path)
    for verb in verbs:
        assert verb_path(ext["urlPrefix"], verb) in served, verb


def volcano_extender_arguments() -> tuple[dict[str, Any], list[str]]:
    cfg = yaml.safe_load(VOLCANO_CONFIG.read_text())
    actions = [a.strip() for a in cfg["actions"].split(",")]
    found = [p for tier in cfg["tiers"] for p in tier["plugins"] if p["name"] == "extender"]
    assert len(found) == 1, "exactly one extender plugin"
    return found[0]["arguments"], actions


def test_volcano_configuration_uses_known_arguments() -> None:
    args, actions = volcano_extender_arguments()
    assert set(args) <= VOLCANO_ARGUMENTS
    assert GO_DURATION.match(args["extender.httpTimeout"])
    assert args["extender.ignorable"] is False
    assert args["extender.managedResources"] == ["nvidia.com/gpu"]
    assert "extender.onSessionOpenVerb" not in args  # see the comment in the file
    if "extender.jobEnqueueableVerb" in args:
        assert "enqueue" in actions


def test_every_volcano_verb_is_served(tmp_path: Path) -> None:
    args, _ = volcano_extender_arguments()
    verbs = [v for k, v in args.items() if k.endswith("Verb")]
    assert {"predicate", "prioritize", "jobEnqueueable", "allocate", "deallocate"} <= set(verbs)
    served = served_posts(tmp_path)
    for verb in verbs:
        assert verb_path(args["extender.urlPrefix"], verb) in served, verb
