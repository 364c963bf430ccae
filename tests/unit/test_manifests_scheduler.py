"""The scheduler wiring: the HTTPS configurations we deploy are the extender engineer's
configurations (manifests/scheduler/*) with TLS turned on and nothing else changed; they
reach the controller's Service; the files they name are mounted where they say."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from test_manifests import MANIFESTS, REPO, build, load_all

from extender.cli import build_parser

HTTP_KUBE = MANIFESTS / "scheduler" / "kube-scheduler-config.yaml"
HTTP_VOLCANO = MANIFESTS / "scheduler" / "volcano-scheduler.conf"
TLS_VOLCANO = MANIFESTS / "volcano" / "volcano-scheduler.conf"
CA_PATCH = MANIFESTS / "volcano" / "trust-gangslice-ca.patch.yaml"


def _yaml(path: Path) -> dict[str, Any]:
    got: dict[str, Any] = yaml.safe_load(path.read_text())
    return got


def deployed_kube_config() -> dict[str, Any]:
    (cm,) = build("scheduler").of_kind("ConfigMap")
    got: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return got


def _volcano_extender(cfg: dict[str, Any]) -> dict[str, Any]:
    (ext,) = [p for tier in cfg["tiers"] for p in tier["plugins"] if p["name"] == "extender"]
    args: dict[str, Any] = ext["arguments"]
    return args


def _service_url(volcano: bool = False) -> tuple[str, int, str]:
    """(host, port, verb prefix) the controller's Service and `gangslice serve` offer to
    kube-scheduler, or with ``volcano`` to Volcano (its own port, manifests/volcano/)."""
    base = build("")
    svc = base.find("Service", "gangslice-controller", "gangslice-system")
    deploy = base.find("Deployment", "gangslice-controller", "gangslice-system")
    patch = _yaml(MANIFESTS / "volcano" / "controller-volcano-port.patch.yaml")
    assert svc and deploy
    (container,) = (patch if volcano else deploy)["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == ("volcano" if volcano else "https")]
    (container_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == port["targetPort"]]
    assert container_port == (args.volcano_port if volcano else args.port)
    host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    return host, port["port"], args.prefix + ("/volcano" if volcano else "")


def test_the_volcano_patch_keeps_the_base_arguments() -> None:
    """The patch replaces the controller's args whole: it is the base's plus --volcano-port."""
    deploy = build("").find("Deployment", "gangslice-controller", "gangslice-system")
    assert deploy is not None
    (base,) = deploy["spec"]["template"]["spec"]["containers"]
    patch = _yaml(MANIFESTS / "volcano" / "controller-volcano-port.patch.yaml")
    (patched,) = patch["spec"]["template"]["spec"]["containers"]
    assert [a for a in patched["args"] if not a.startswith("--volcano-port=")] == base["args"]
    assert patched["ports"] == base["ports"]


def test_the_volcano_port_admits_only_the_volcano_scheduler() -> None:
    (policy,) = build("volcano").of_kind("NetworkPolicy")
    base = build("").find("NetworkPolicy", "gangslice-controller", "gangslice-system")
    assert base is not None
    _, volcano_port, _ = _service_url(volcano=True)
    _, scheduler_port, _ = _service_url()
    opened = {r["ports"][0]["port"]: r.get("from") for r in base["spec"]["ingress"]}
    assert opened[scheduler_port] is None and volcano_port not in opened  # mutual TLS on 8888
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert set(rules) == {volcano_port}
    (peer,) = rules[volcano_port]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "volcano-system"}
    assert peer["podSelector"]["matchLabels"] == {"app": "volcano-scheduler"}
    deploy = build("").find("Deployment", "gangslice-controller", "gangslice-system")
    assert deploy is not None
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_deployed_kube_scheduler_configuration_is_the_http_one_with_tls() -> None:
    tls, http = deployed_kube_config(), _yaml(HTTP_KUBE)
    (t_ext,), (h_ext,) = tls["extenders"], http["extenders"]
    assert t_ext["enableHTTPS"] is True and t_ext["urlPrefix"].startswith("https://")
    assert urlparse(t_ext["urlPrefix"])._replace(scheme="") == urlparse(h_ext["urlPrefix"])._replace(
        scheme=""
    )
    strip = copy.deepcopy(tls)
    for key in ("urlPrefix", "enableHTTPS", "tlsConfig"):
        strip["extenders"][0].pop(key, None)
        http["extenders"][0].pop(key, None)
    assert strip == http, "kube-scheduler-config-tls.yaml drifted from kube-scheduler-config.yaml"


def test_the_scheduler_reaches_the_controller_service() -> None:
    host, port, prefix = _service_url()
    for url in (
        deployed_kube_config()["extenders"][0]["urlPrefix"],
        _yaml(HTTP_KUBE)["extenders"][0]["urlPrefix"],
    ):
        got = urlparse(url)
        assert (got.hostname, got.port, got.path) == (host, port, prefix)
    for url in (_volcano_extender(_yaml(TLS_VOLCANO))["extender.urlPrefix"],):
        got = urlparse(url)
        assert (got.hostname, got.port, got.path) == _service_url(volcano=True)


def test_the_scheduler_deployment_mounts_its_configuration_and_the_ca() -> None:
    b = build("scheduler")
    deploy = b.find("Deployment", "gangslice-scheduler", "gangslice-system")
    assert deploy is not None
    spec = deploy["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (config_flag,) = [a for a in container["command"] if a.startswith("--config=")]
    folder, _, key = config_flag.removeprefix("--config=").rpartition("/")
    (cm,) = b.of_kind("ConfigMap")
    assert volumes[mounts[folder]]["configMap"]["name"] == cm["metadata"]["name"] and key in cm["data"]
    ca_file = deployed_kube_config()["extenders"][0]["tlsConfig"]["caFile"]
    folder, _, key = ca_file.rpartition("/")
    secret = volumes[mounts[folder]]["secret"]
    assert secret["secretName"] == "gangslice-tls"
    assert secret["items"] == [{"key": "ca.crt", "path": key}]  # the CA, never the private key
    tls = deployed_kube_config()["extenders"][0]["tlsConfig"]
    for name in ("certFile", "keyFile"):
        folder, _, key = tls[name].rpartition("/")
        client = volumes[mounts[folder]]["secret"]
        assert client["secretName"] == "gangslice-scheduler-client" and key in ("tls.crt", "tls.key")


def test_the_scheduler_leader_election_matches_its_role() -> None:
    election = deployed_kube_config()["leaderElection"]
    b = build("scheduler")
    role = b.find("Role", "gangslice-scheduler-leader-election", election["resourceNamespace"])
    assert role is not None
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named and all(r["resourceNames"] == [election["resourceName"]] for r in named)
    reader = b.find("RoleBinding", "gangslice-scheduler-authentication-reader", "kube-system")
    assert reader is not None


def test_the_scheduler_image_is_the_kubernetes_release_the_e2e_tier_builds() -> None:
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "hack" / "e2e" / "tools" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    deploy = build("scheduler").find("Deployment", "gangslice-scheduler", "gangslice-system")
    assert deploy is not None
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"registry.k8s.io/kube-scheduler:{versions['KUBERNETES_VERSION']}"


def test_the_deployed_volcano_configuration_is_the_http_one_with_https() -> None:
    tls, http = _yaml(TLS_VOLCANO), _yaml(HTTP_VOLCANO)
    t_url = _volcano_extender(tls)["extender.urlPrefix"]
    h_url = _volcano_extender(http)["extender.urlPrefix"]
    assert t_url.startswith("https://") and t_url.removeprefix("https://") == h_url.split("://", 1)[1]
    _volcano_extender(tls)["extender.urlPrefix"] = h_url
    assert tls == http, "manifests/volcano/volcano-scheduler.conf drifted from manifests/scheduler/"


def test_the_volcano_kustomization_replaces_volcanos_configmap() -> None:
    (cm,) = build("volcano").of_kind("ConfigMap")
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == (
        "volcano-scheduler-configmap",
        "volcano-system",
    )
    assert yaml.safe_load(cm["data"]["volcano-scheduler.conf"]) == _yaml(TLS_VOLCANO)
    k = _yaml(MANIFESTS / "volcano" / "kustomization.yaml")
    assert k["configMapGenerator"][0]["options"]["disableNameSuffixHash"] is True


def test_the_volcano_patch_points_go_at_the_mounted_ca() -> None:
    (patch,) = load_all(CA_PATCH)
    spec = patch["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    folder, _, key = env["SSL_CERT_FILE"].rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "gangslice-ca" and key == "ca.crt"
    assert patch["metadata"]["namespace"] == "volcano-system"
