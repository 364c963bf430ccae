"""manifests/components/openshift and manifests/openshift-scheduler: the agent's SCC grants what
its DaemonSet asks for and nothing more, the component leaves the controller to restricted-v2,
and the Secondary Scheduler Operator runs our scheduler configuration. The real API server
with OpenShift's CRDs accepts every object (tests/e2e/test_openshift.py)."""

from __future__ import annotations

from typing import Any

import yaml
from test_manifests import MANIFESTS, build, load_all

COMPONENT = MANIFESTS / "components" / "openshift"
AGENT_ACCOUNT = "system:serviceaccount:gangslice-system:gangslice-agent"
#: DaemonSet volume kinds as SCC names them.
VOLUME_KINDS = {"hostPath": "hostPath", "emptyDir": "emptyDir", "secret": "secret", "configMap": "configMap"}


def scc() -> dict[str, Any]:
    (obj,) = [o for o in load_all(COMPONENT / "scc.yaml") if o["kind"] == "SecurityContextConstraints"]
    return obj


def test_the_agent_scc_allows_exactly_what_the_daemonset_asks() -> None:
    s = scc()
    assert s["users"] == [AGENT_ACCOUNT] and not s["groups"]
    assert s["runAsUser"] == {"type": "MustRunAs", "uid": 0}
    assert s["allowPrivilegedContainer"] is False and s["allowPrivilegeEscalation"] is False
    assert s["requiredDropCapabilities"] == ["ALL"] and s["allowedCapabilities"] == []
    assert s["readOnlyRootFilesystem"] is True and s["allowHostDirVolumePlugin"] is True
    for host in ("allowHostNetwork", "allowHostPID", "allowHostIPC", "allowHostPorts"):
        assert s[host] is False, host
    agent = build("").find("DaemonSet", "gangslice-agent", "gangslice-system")
    assert agent is not None
    pod = agent["spec"]["template"]["spec"]
    used = {VOLUME_KINDS[k] for v in pod["volumes"] for k in v if k in VOLUME_KINDS}
    assert used <= set(s["volumes"]), used
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert s["seccompProfiles"] == ["runtime/default"]
    hosts = [v["hostPath"] for v in pod["volumes"] if "hostPath" in v]
    assert {h["path"] for h in hosts} == {"/var/lib/kubelet/pod-resources", "/var/lib/kubelet/config.yaml"}
    for host in hosts:
        mounts = [m for c in pod["containers"] for m in c["volumeMounts"] if m["mountPath"] == host["path"]]
        assert mounts and all(m["readOnly"] for m in mounts)


def _patches() -> dict[str, list[dict[str, Any]]]:
    """The component's JSON patches by target kind."""
    k = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    return {p["target"]["kind"]: yaml.safe_load(p["patch"]) for p in k["patches"]}


def test_the_component_hands_ids_to_openshift_and_the_selinux_type_to_the_scc() -> None:
    patches = _patches()
    removed = {
        op["path"] for op in patches["Deployment"] if op["op"] == "remove" and "securityContext" in op["path"]
    }
    base = build("").find("Deployment", "gangslice-controller", "gangslice-system")
    assert base is not None
    fixed = {f"/spec/template/spec/securityContext/{k}" for k in ("runAsUser", "runAsGroup", "fsGroup")}
    assert fixed == removed and all(k in base["spec"]["template"]["spec"]["securityContext"] for k in (
        "runAsUser", "runAsGroup", "fsGroup"))  # fmt: skip
    (selinux,) = patches["DaemonSet"]
    assert selinux["value"] == scc()["seLinuxContext"]["seLinuxOptions"]


def test_the_service_ca_issues_the_secret_the_controller_mounts() -> None:
    (op,) = _patches()["Service"]
    secret = op["value"]["service.beta.openshift.io/serving-cert-secret-name"]
    deploy = build("").find("Deployment", "gangslice-controller", "gangslice-system")
    assert deploy is not None
    volumes = deploy["spec"]["template"]["spec"]["volumes"]
    assert secret in {v["secret"]["secretName"] for v in volumes if "secret" in v}


def test_the_secondary_scheduler_runs_our_configuration() -> None:
    b = build("openshift-scheduler")
    (ss,) = b.of_kind("SecondaryScheduler")
    (cm,) = b.of_kind("ConfigMap")
    assert ss["metadata"]["name"] == "cluster"  # the one the operator reconciles
    assert ss["spec"]["schedulerConfig"] == cm["metadata"]["name"]
    assert (
        cm["metadata"]["namespace"] == ss["metadata"]["namespace"] == "openshift-secondary-scheduler-operator"
    )
    ours = yaml.safe_load(cm["data"]["config.yaml"])
    (shipped,) = build("scheduler").of_kind("ConfigMap")
    expected = yaml.safe_load(shipped["data"]["config.yaml"])
    expected["leaderElection"] = {"leaderElect": False}
    # The service CA; no client certificate (the operator's pod cannot mount one).
    service_ca = "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"
    expected["extenders"][0]["tlsConfig"] = {"caFile": service_ca}
    assert ours == expected
    (sched,) = build("scheduler").of_kind("Deployment")
    (container,) = sched["spec"]["template"]["spec"]["containers"]
    assert ss["spec"]["imageSpec"] == container["image"]


def _json_patch(obj: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 test, add (to an object), replace and remove on a copy (what the component's
    patches use)."""
    import copy

    out = copy.deepcopy(obj)
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        target = out
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        key: Any = int(last) if isinstance(target, list) else last
        if op["op"] == "test":
            assert target[key] == op["value"], f"{op['path']}: {target[key]!r} is not {op['value']!r}"
        elif op["op"] in ("replace", "add"):
            target[key] = op["value"]
        elif op["op"] == "remove":
            del target[key]
    return out


def test_on_openshift_the_controller_reads_only_files_the_service_ca_secret_has() -> None:
    """The service CA's Secret holds tls.crt and tls.key only: no flag may name another file of
    it (the controller exits on a flag file it cannot read)."""
    base = build("").find("Deployment", "gangslice-controller", "gangslice-system")
    assert base is not None
    ops = [op for op in _patches()["Deployment"] if op["op"] in ("test", "replace", "remove")]
    patched = _json_patch(base, ops)
    (container,) = [c for c in patched["spec"]["template"]["spec"]["containers"] if c["name"] == "controller"]
    files = {a.split("=", 1)[1] for a in container["args"] if "=/" in a}
    secret_dir = "/etc/gangslice/tls/"
    assert {f for f in files if f.startswith(secret_dir)} <= {secret_dir + "tls.crt", secret_dir + "tls.key"}
    assert "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt" in files


def test_on_openshift_only_the_secondary_scheduler_and_the_host_network_reach_the_verbs() -> None:
    """No mutual TLS there: the NetworkPolicy narrows port 8888 to the Secondary Scheduler
    Operator's namespace and the host network (kube-apiserver, the kubelet's probes); the
    metrics port stays open to token-reviewed scrapes; no other port opens."""
    base = build("").find("NetworkPolicy", "gangslice-controller", "gangslice-system")
    assert base is not None
    policy = _json_patch(base, _patches()["NetworkPolicy"])
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert set(rules) == {8888, 9443} and rules[9443] is None
    assert [peer["namespaceSelector"]["matchLabels"] for peer in rules[8888]] == [
        {"kubernetes.io/metadata.name": "openshift-secondary-scheduler-operator"},
        {"policy-group.network.openshift.io/host-network": ""},
    ]
    (secondary,) = build("openshift-scheduler").of_kind("SecondaryScheduler")
    assert secondary["metadata"]["namespace"] == "openshift-secondary-scheduler-operator"
