"""Every YAML file under manifests/ and examples/ parses; the kustomizations build (resolved
here, without kubectl); every object validates against its schema (our CRDs, Kueue's and
Volcano's upstream CRDs) or, for built-in kinds, structurally; and every reference between
objects (ServiceAccounts, Secrets, ConfigMaps, roles, selectors, ports) resolves.

The helpers here (``build``, ``pod_templates``, ...) are shared by the other
``test_manifests_*`` files."""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.cli import build_parser
from extender.controllers.openapi import load_crd, validate, version_schema
from extender.placement.files import load_cluster, load_gang

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
EXAMPLES = REPO / "examples"
#: Kubernetes objects; examples/clusters and examples/gangs are gangslice's own file formats.
K8S_EXAMPLES = EXAMPLES / "k8s"
UPSTREAM = REPO / "tests" / "fixtures" / "upstream"

#: Every kustomization a user applies (docs/install.md).
KUSTOMIZATIONS = (
    "", "scheduler", "kueue", "volcano", "monitoring", "openshift-scheduler", "components/cert-manager",
)  # fmt: skip
#: The base's folders: every file in them must be listed in manifests/kustomization.yaml.
BASE_DIRS = ("crds", "controller", "agent")
#: Secrets the base expects but does not ship: hack/gen-certs.sh or the cert-manager
#: component creates them (test_manifests_tls.py checks that both name this one).
PROVIDED_SECRETS = {("gangslice-system", "gangslice-tls"), ("gangslice-system", "gangslice-scheduler-client")}
#: ConfigMaps made outside kustomize: `hack/gen-certs.sh --volcano-namespace volcano-system`.
PROVIDED_CONFIG_MAPS = {("volcano-system", "gangslice-ca")}
#: Roles every cluster has (bootstrap RBAC policy).
BUILTIN_ROLES = {
    ("ClusterRole", None, "system:kube-scheduler"),
    ("ClusterRole", None, "system:volume-scheduler"),
    ("Role", "kube-system", "extension-apiserver-authentication-reader"),
}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "AdmissionCheck",
    "ClusterQueue", "ResourceFlavor", "Topology", "NodeTopology", "PriorityClass", "Queue", "HyperNode",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}  # fmt: skip
KUSTOMIZE_KEYS = {
    "apiVersion", "kind", "resources", "components", "namespace", "labels", "images", "configMapGenerator",
}  # fmt: skip
#: Files that are configuration, not API objects.
CONFIG_KINDS = {"Kustomization", "Component", "KubeSchedulerConfiguration"}
GANGSLICE_IMAGE = "ghcr.io/gangslice/gangslice"

Obj = dict[str, Any]


def load_all(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def yaml_files(root: Path) -> list[Path]:
    return sorted([*root.rglob("*.yaml"), *root.rglob("*.conf")])


@dataclass
class Build:
    """A kustomization resolved the way kustomize does for the features used here."""

    root: Path
    objects: list[Obj] = field(default_factory=list)
    files: set[Path] = field(default_factory=set)

    def find(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        for o in self.objects:
            if o["kind"] == kind and o["metadata"]["name"] == name and namespace_of(o) == namespace:
                return o
        return None

    def of_kind(self, *kinds: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in kinds]


def namespace_of(obj: Mapping[str, Any]) -> str | None:
    if obj["kind"] in CLUSTER_SCOPED:
        return None
    got = obj["metadata"].get("namespace")
    return str(got) if got else "default"


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@cache
def build(relative: str) -> Build:
    """``kubectl kustomize manifests/<relative>``, for resources, components, namespace,
    labels, images and configMapGenerator files; fails on any other kustomization key."""
    root = (MANIFESTS / relative).resolve()
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert k["kind"] in ("Kustomization", "Component"), root
    unknown = set(k) - KUSTOMIZE_KEYS
    assert not unknown, f"{root}: kustomization keys this test does not resolve: {unknown}"
    out = Build(root, files={root / "kustomization.yaml"})
    for entry in [*k.get("resources", []), *k.get("components", [])]:
        path = (root / entry).resolve()
        assert path.exists(), f"{root}/kustomization.yaml lists {entry}, which does not exist"
        if path.is_dir():
            sub = build(str(path.relative_to(MANIFESTS)))
            out.objects += [dict(o) for o in sub.objects]
            out.files |= sub.files
        else:
            assert _inside(path, root), f"{entry}: kustomize loads files only under {root}"
            out.files.add(path)
            out.objects += load_all(path)
    for gen in k.get("configMapGenerator", []):
        data = {}
        for item in gen.get("files", []):
            key, _, name = item.rpartition("=")
            path = (root / name).resolve()
            assert path.is_file() and _inside(path, root), f"{root}: generator file {name}"
            out.files.add(path)
            data[key or path.name] = path.read_text()
        meta: Obj = {"name": gen["name"]}
        if gen.get("namespace"):
            meta["namespace"] = gen["namespace"]
        out.objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    if k.get("namespace"):
        for o in out.objects:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = k["namespace"]
    return out


def all_builds() -> list[Build]:
    return [build(k) for k in KUSTOMIZATIONS]


def example_objects() -> list[tuple[Path, Obj]]:
    return [(p, o) for p in yaml_files(K8S_EXAMPLES) for o in load_all(p)]


def pod_templates(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(which, pod template) of a workload object: metadata + spec of every pod it makes."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    if kind == "Pod":
        yield "pod", obj
    elif kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        yield "template", spec["template"]
    elif kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        if "leaderTemplate" in lwt:
            yield "leader", lwt["leaderTemplate"]
        yield "worker", lwt["workerTemplate"]


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- parsing and identity ----------------------------------------------------------------------


@pytest.mark.parametrize("path", yaml_files(MANIFESTS) + yaml_files(K8S_EXAMPLES), ids=lambda p: p.name)
def test_every_yaml_file_parses_into_objects_with_an_identity(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path}: empty"
    for d in docs:
        assert isinstance(d, dict), f"{path}: a document is not a mapping"
        if path.suffix == ".conf":
            assert "tiers" in d  # Volcano's scheduler configuration
            continue
        assert d.get("apiVersion") and d.get("kind"), f"{path}: apiVersion and kind"
        if d["kind"] in CONFIG_KINDS:
            continue
        assert d.get("metadata", {}).get("name"), f"{path}: {d['kind']} without metadata.name"


def test_every_example_yaml_is_known() -> None:
    """Nothing under examples/ escapes a check: k8s objects here, clusters and gangs below."""
    known = (K8S_EXAMPLES, EXAMPLES / "clusters", EXAMPLES / "gangs")
    for path in yaml_files(EXAMPLES):
        assert any(folder in path.parents for folder in known), f"{path}: no test reads it"


@pytest.mark.parametrize("path", yaml_files(EXAMPLES / "clusters"), ids=lambda p: p.name)
def test_example_cluster_files_load(path: Path) -> None:
    snap = load_cluster(path)
    assert snap.nodes


@pytest.mark.parametrize("path", yaml_files(EXAMPLES / "gangs"), ids=lambda p: p.name)
def test_example_gang_files_load(path: Path) -> None:
    gang = load_gang(path)
    assert gang.pod_sets and gang.gpus > 0


@pytest.mark.parametrize("relative", KUSTOMIZATIONS)
def test_each_kustomization_builds_without_duplicates(relative: str) -> None:
    b = build(relative)
    assert b.objects
    ids = [(o["kind"], namespace_of(o), o["metadata"]["name"]) for o in b.objects]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_the_base_lists_every_file_of_its_folders() -> None:
    listed = build("").files
    for folder in BASE_DIRS:
        for path in yaml_files(MANIFESTS / folder):
            assert path.resolve() in listed, f"{path} is not listed in manifests/kustomization.yaml"
    assert (MANIFESTS / "namespace.yaml").resolve() in listed


def test_the_base_installs_what_the_issue_asks_for() -> None:
    b = build("")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in b.objects}
    assert {
        ("CustomResourceDefinition", "nodetopologies.gangslice.io"),
        ("CustomResourceDefinition", "slicereservations.gangslice.io"),
        ("Namespace", "gangslice-system"),
        ("ServiceAccount", "gangslice-controller"),
        ("ServiceAccount", "gangslice-agent"),
        ("ClusterRole", "gangslice-controller"),
        ("ClusterRole", "gangslice-agent"),
        ("Role", "gangslice-controller-leader-election"),
        ("Deployment", "gangslice-controller"),
        ("Service", "gangslice-controller"),
        ("PodDisruptionBudget", "gangslice-controller"),
        ("DaemonSet", "gangslice-agent"),
    } <= kinds
    deploy = b.find("Deployment", "gangslice-controller", "gangslice-system")
    assert deploy is not None and deploy["spec"]["replicas"] == 2
    # Both replicas are ready once listed; the Service reaches only the labelled leader.
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    service = b.find("Service", "gangslice-controller", "gangslice-system")
    assert service is not None and service["spec"]["selector"]["gangslice.io/leader"] == "true"
    pdb = b.find("PodDisruptionBudget", "gangslice-controller", "gangslice-system")
    assert pdb is not None and pdb["spec"]["minAvailable"] == 1
    for o in b.objects:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"]["namespace"] == "gangslice-system", o["metadata"]["name"]


@pytest.mark.parametrize("relative", KUSTOMIZATIONS)
def test_no_role_uses_a_wildcard(relative: str) -> None:
    for role in build(relative).of_kind("Role", "ClusterRole"):
        for rule in role["rules"]:
            if "nonResourceURLs" in rule:  # only the metrics reader: get /metrics
                assert rule == {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, role["metadata"]["name"]
                continue
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                for value in rule.get(key, []):
                    assert "*" not in value, f"{role['metadata']['name']}: {key} {value!r}"


# -- schemas -----------------------------------------------------------------------------------


@cache
def crd_schemas() -> dict[tuple[str, str, str], Obj]:
    """(group, version, kind) -> openAPIV3Schema, from our CRDs and the upstream copies."""
    paths = [*(MANIFESTS / "crds").glob("*.yaml")]
    paths += [*(UPSTREAM / "kueue").glob("*.yaml"), *(UPSTREAM / "volcano").glob("*.yaml")]
    out = {}
    for path in paths:
        crd = load_crd(path)
        for v in crd["spec"]["versions"]:
            key = (crd["spec"]["group"], v["name"], crd["spec"]["names"]["kind"])
            out[key] = version_schema(crd, v["name"])
    return out


def custom_objects() -> list[tuple[str, Obj]]:
    objs = [(str(b.root.relative_to(REPO)), o) for b in all_builds() for o in b.objects]
    objs += [(str(p.relative_to(REPO)), o) for p, o in example_objects()]
    groups = ("gangslice.io/", "kueue.x-k8s.io/", "scheduling.volcano.sh/", "topology.volcano.sh/")
    return [(where, o) for where, o in objs if o["apiVersion"].startswith(groups)]


def test_custom_objects_match_their_crd_schemas() -> None:
    checked = set()
    for where, obj in custom_objects():
        group, version = obj["apiVersion"].split("/")
        schema = crd_schemas().get((group, version, obj["kind"]))
        assert schema is not None, f"{where}: no CRD for {obj['apiVersion']} {obj['kind']}"
        validate(schema, obj, f"{where}: {obj['kind']} {obj['metadata']['name']}")
        checked.add(obj["kind"])
    assert {"AdmissionCheck", "ClusterQueue", "LocalQueue", "ResourceFlavor", "Topology"} <= checked


#: The example queue setup a Kueue user adapts (kept out of manifests/kueue, see below).
EXAMPLE_QUEUES = K8S_EXAMPLES / "kueue-queues.yaml"


def test_kueue_objects_use_v1beta2_and_the_queue_runs_our_check() -> None:
    kueue = build("kueue")
    queues_file = load_all(EXAMPLE_QUEUES)
    objects = [*kueue.objects, *queues_file]
    assert {o["apiVersion"] for o in objects} == {"kueue.x-k8s.io/v1beta2"}
    (check,) = kueue.of_kind("AdmissionCheck")
    from extender.kube.names import CHECK_CONTROLLER

    assert check["spec"]["controllerName"] == CHECK_CONTROLLER
    of_kind = lambda kind: [o for o in objects if o["kind"] == kind]  # noqa: E731
    flavors = {o["metadata"]["name"] for o in of_kind("ResourceFlavor")}
    assert of_kind("ClusterQueue") and of_kind("LocalQueue")
    for cq in of_kind("ClusterQueue"):
        named = [c["name"] for c in cq["spec"]["admissionChecksStrategy"]["admissionChecks"]]
        assert check["metadata"]["name"] in named
        used = {f["name"] for g in cq["spec"]["resourceGroups"] for f in g["flavors"]}
        assert used <= flavors
    queues = {o["metadata"]["name"] for o in of_kind("ClusterQueue")}
    local = {lq["metadata"]["name"] for lq in of_kind("LocalQueue")}
    assert all(lq["spec"]["clusterQueue"] in queues for lq in of_kind("LocalQueue"))
    for path, obj in example_objects():
        queue = obj["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name")
        if queue is not None:
            assert queue in local, f"{path}: LocalQueue {queue} is not in {EXAMPLE_QUEUES.name}"
    topologies = {o["metadata"]["name"] for o in of_kind("Topology")}
    for rf in of_kind("ResourceFlavor"):
        assert rf["spec"].get("topologyName", next(iter(topologies))) in topologies


#: Overlays that change an object gangslice does not own (documented: never `kubectl delete -k` it).
REPLACES_FOREIGN_OBJECTS = {"volcano"}
#: Objects whose name someone else fixes: the Secondary Scheduler Operator reconciles only "cluster".
FIXED_NAMES = {("SecondaryScheduler", "cluster")}


@pytest.mark.parametrize("relative", [k for k in KUSTOMIZATIONS if k not in REPLACES_FOREIGN_OBJECTS])
def test_install_overlays_hold_only_what_gangslice_owns(relative: str) -> None:
    """`kubectl delete -k` of an install overlay deletes gangslice and nothing else: every object
    is named for gangslice, and the only Namespace is gangslice-system (examples live apart)."""
    for o in build(relative).objects:
        name = o["metadata"]["name"]
        if (o["kind"], name) in FIXED_NAMES:
            continue
        assert name.startswith("gangslice") or name.endswith(".gangslice.io"), (
            f"{relative}: {o['kind']} {name}"
        )
        if o["kind"] == "Namespace":
            assert name == "gangslice-system", name


def test_the_kueue_topology_has_gangslices_default_levels() -> None:
    from extender.topology.hierarchy import DEFAULT_LEVELS, HOSTNAME_LABEL

    (topology,) = build("kueue").of_kind("Topology")
    labels = [lv["nodeLabel"] for lv in topology["spec"]["levels"]]
    assert labels == [lv.label for lv in DEFAULT_LEVELS] + [HOSTNAME_LABEL]


def test_cert_manager_objects_are_well_formed() -> None:
    b = build("components/cert-manager")
    issuers = {o["metadata"]["name"] for o in b.of_kind("Issuer")}
    for obj in b.objects:
        assert obj["apiVersion"] == "cert-manager.io/v1"
        assert obj["metadata"]["namespace"] == "gangslice-system"
    for cert in b.of_kind("Certificate"):
        spec = cert["spec"]
        assert spec["secretName"] and spec["issuerRef"]["name"] in issuers
        assert spec["issuerRef"]["kind"] == "Issuer"
    ca_issuers = [i for i in b.of_kind("Issuer") if "ca" in i["spec"]]
    ca_secrets = {c["spec"]["secretName"] for c in b.of_kind("Certificate") if c["spec"].get("isCA")}
    assert ca_issuers and all(i["spec"]["ca"]["secretName"] in ca_secrets for i in ca_issuers)


# -- built-in kinds: structure and references ------------------------------------------------


def _containers(template: Mapping[str, Any]) -> list[Obj]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _check_pod_template(where: str, template: Mapping[str, Any]) -> None:
    spec = template["spec"]
    assert spec["containers"], f"{where}: no containers"
    volumes = {v["name"] for v in spec.get("volumes", [])}
    for c in _containers(template):
        image = c["image"]
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, f"{where}: image {image} needs a tag"
        assert c.get("command") or c.get("args"), f"{where}: {c['name']} runs the image's default"
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{where}: mount of unknown volume {m['name']}"
        ports = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            port = (c.get(probe) or {}).get("httpGet", {}).get("port")
            if isinstance(port, str):
                assert port in ports, f"{where}: {probe} names port {port}"
        res = c.get("resources", {})
        assert res.get("requests"), f"{where}: {c['name']} has no resource requests"
        gpus = {part: res.get(part, {}).get("nvidia.com/gpu") for part in ("requests", "limits")}
        if any(v is not None for v in gpus.values()):
            assert gpus["requests"] == gpus["limits"], f"{where}: GPU requests and limits differ"


@pytest.mark.parametrize("relative", KUSTOMIZATIONS)
def test_workloads_are_sane_and_their_references_resolve(relative: str) -> None:
    b = build(relative)
    base = build("")
    for obj in b.of_kind("Deployment", "DaemonSet"):
        where = f"{relative or 'base'}: {obj['kind']} {obj['metadata']['name']}"
        ns = namespace_of(obj)
        ((_, template),) = pod_templates(obj)
        assert matches(obj["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]), where
        _check_pod_template(where, template)
        spec = template["spec"]
        sa = spec.get("serviceAccountName")
        assert sa and (b.find("ServiceAccount", sa, ns) or base.find("ServiceAccount", sa, ns)), where
        for vol in spec.get("volumes", []):
            if "secret" in vol:
                name = vol["secret"]["secretName"]
                assert (ns, name) in PROVIDED_SECRETS or b.find("Secret", name, ns), f"{where}: {name}"
            if "configMap" in vol:
                name = vol["configMap"]["name"]
                assert b.find("ConfigMap", name, ns) or (ns, name) in PROVIDED_CONFIG_MAPS, where
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where


@pytest.mark.parametrize("relative", KUSTOMIZATIONS)
def test_bindings_name_existing_roles_and_service_accounts(relative: str) -> None:
    b = build(relative)
    base = build("")
    for binding in b.of_kind("RoleBinding", "ClusterRoleBinding"):
        ref = binding["roleRef"]
        ns = None if ref["kind"] == "ClusterRole" else namespace_of(binding)
        key = (ref["kind"], ns, ref["name"])
        assert b.find(ref["kind"], ref["name"], ns) or key in BUILTIN_ROLES, f"{binding['metadata']}: {key}"
        for s in binding["subjects"]:
            assert s["kind"] == "ServiceAccount"
            assert b.find("ServiceAccount", s["name"], s["namespace"]) or base.find(
                "ServiceAccount", s["name"], s["namespace"]
            ), s


def test_the_service_and_the_budget_select_the_controller_pods() -> None:
    b = build("")
    deploy = b.find("Deployment", "gangslice-controller", "gangslice-system")
    svc = b.find("Service", "gangslice-controller", "gangslice-system")
    pdb = b.find("PodDisruptionBudget", "gangslice-controller", "gangslice-system")
    assert deploy and svc and pdb
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    # The leader adds gangslice.io/leader=true to its own pod at run time (httpapi/server.py).
    leader = {**labels, "gangslice.io/leader": "true"}
    assert matches(svc["spec"]["selector"], leader) and not matches(svc["spec"]["selector"], labels)
    assert matches(pdb["spec"]["selector"]["matchLabels"], labels)
    agent = b.find("DaemonSet", "gangslice-agent", "gangslice-system")
    assert agent and not matches(svc["spec"]["selector"], agent["spec"]["template"]["metadata"]["labels"])
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [p["name"] for p in svc["spec"]["ports"]] == ["https", "volcano"]
    for port in svc["spec"]["ports"]:
        assert port["targetPort"] in ports and ports[port["targetPort"]] == port["port"]


def _gangslice_args(relative: str) -> list[tuple[str, Obj, Mapping[str, Any]]]:
    out = []
    for obj in build(relative).of_kind("Deployment", "DaemonSet"):
        for _, template in pod_templates(obj):
            for c in _containers(template):
                if c["image"].startswith(GANGSLICE_IMAGE + ":"):
                    out.append((obj["metadata"]["name"], c, template))
    return out


def test_gangslice_containers_run_commands_the_cli_accepts() -> None:
    parser = build_parser()
    found = _gangslice_args("")
    assert {name for name, _, _ in found} == {"gangslice-controller", "gangslice-agent"}
    for name, c, template in found:
        assert "command" not in c, f"{name}: the image's entrypoint is gangslice"
        args = parser.parse_args(c["args"])
        assert callable(args.func), name
        if args.command == "serve":
            assert args.kubeconfig is None and args.cluster is None  # in-cluster configuration
            assert not getattr(args, "no_controller", False)  # the admission check and the lease
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            secrets = {
                v["name"]: v["secret"]["secretName"] for v in template["spec"]["volumes"] if "secret" in v
            }
            for flag, key in ((args.tls_cert, "tls.crt"), (args.tls_key, "tls.key")):
                folder, _, file = str(flag).rpartition("/")
                (vol,) = [v for v, path in mounts.items() if path == folder]
                assert vol in secrets and file == key, f"{name}: {flag}"


def _annotations_volume(template: Mapping[str, Any], c: Mapping[str, Any], file: Path) -> Obj | None:
    """The downward-API volume item that puts the pod's annotations at ``file`` in ``c``."""
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    volume = mounts.get(str(file.parent))
    for v in template["spec"].get("volumes", []):
        if v["name"] == volume and "downwardAPI" in v:
            for item in v["downwardAPI"]["items"]:
                if (
                    item["path"] == file.name
                    and item.get("fieldRef", {}).get("fieldPath") == "metadata.annotations"
                ):
                    return dict(item)
    return None


def test_example_gangslice_containers_run_a_preflight_the_cli_accepts() -> None:
    """The gangslice containers of examples/k8s: init containers running `gangslice preflight`
    on the pod's annotations (a downward-API file) and expecting the pod's GPU count."""
    from extender import __version__
    from extender.kube.pods import gpu_request

    parser = build_parser()
    found = set()
    for path, obj in example_objects():
        for which, template in pod_templates(obj):
            where = f"{path.relative_to(K8S_EXAMPLES)}: {obj['kind']} {obj['metadata']['name']} {which}"
            for c in _containers(template):
                if not c["image"].startswith(GANGSLICE_IMAGE + ":"):
                    continue
                found.add(str(path.relative_to(K8S_EXAMPLES)))
                assert c["image"] == f"{GANGSLICE_IMAGE}:{__version__}", where
                assert "command" not in c, f"{where}: the image's entrypoint is gangslice"
                args = parser.parse_args(c["args"])
                assert callable(args.func) and args.command == "preflight", where
                assert c in template["spec"].get("initContainers", []), f"{where}: preflight must run first"
                assert args.expect_tp == gpu_request(template["spec"]), f"{where}: --expect-tp"
                tp = [a for x in template["spec"]["containers"] for a in x.get("args", [])]
                assert f"--tensor-parallel-size={args.expect_tp}" in tp, f"{where}: vLLM's TP differs"
                assert _annotations_volume(template, c, args.annotations), (
                    f"{where}: {args.annotations} is not the pod's annotations from a downward-API volume"
                )
    assert {"kueue/llama-70b-tp8.yaml", "plain/llama-70b-tp8.yaml"} <= found


def test_every_version_is_pyprojects() -> None:
    """pyproject.toml's version is the one version of a release (make release reads it there):
    the package's ``__version__``, the image tag and the chart's version and appVersion
    (hack/gen-chart.py writes them from it) are that version."""
    import tomllib

    from extender import __version__

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "charts" / "gangslice" / "Chart.yaml").read_text())
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    (image,) = [i for i in k["images"] if i["name"] == GANGSLICE_IMAGE]
    assert (__version__, image["newTag"], chart["version"], chart["appVersion"]) == (version,) * 4


def test_the_image_tag_is_the_package_version() -> None:
    from extender import __version__

    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    (image,) = [i for i in k["images"] if i["name"] == GANGSLICE_IMAGE]
    assert image["newTag"] == __version__
    for _, c, _ in _gangslice_args(""):
        assert c["image"] == f"{GANGSLICE_IMAGE}:{__version__}"


# -- examples ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", yaml_files(K8S_EXAMPLES), ids=lambda p: str(p.relative_to(K8S_EXAMPLES)).replace("/", "-")
)
def test_example_workloads_are_sane(path: Path) -> None:
    for obj in load_all(path):
        for which, template in pod_templates(obj):
            where = f"{path.name}: {obj['kind']} {obj['metadata']['name']} {which}"
            _check_pod_template(where, template)
            spec = template["spec"]
            assert spec["schedulerName"] == "gangslice-scheduler", where
            for c in spec["containers"]:
                for env in c.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    assert ref is None or ref.get("optional") is True, f"{where}: Secret {ref}"
            text = " ".join(shlex.quote(a) for c in spec["containers"] for a in c.get("args", []))
            assert "$(" not in text or "LWS_" in text, where  # only the variables LWS injects
        if obj["kind"] == "LeaderWorkerSet":
            lwt = obj["spec"]["leaderWorkerTemplate"]
            assert isinstance(lwt["size"], int) and lwt["size"] >= 2
            assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        if obj["kind"] in ("Deployment",):
            assert matches(
                obj["spec"]["selector"]["matchLabels"], obj["spec"]["template"]["metadata"]["labels"]
            )


def test_the_scheduler_name_the_examples_use_is_the_profile_we_ship() -> None:
    (cm,) = build("scheduler").of_kind("ConfigMap")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["gangslice-scheduler"]
