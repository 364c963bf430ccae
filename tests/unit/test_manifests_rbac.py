"""The controller's RBAC is exactly what its code calls.

The permissions are derived from the source: every ``kubernetes`` client call in the modules
``gangslice serve`` talks to the API through (the method name gives the verb and resource,
the group and plural arguments are resolved to their constants) and every kopf watch. The
ClusterRole and the leader-election Role must grant that set, no more and no less, so a new
API call fails here until manifests/controller/rbac.yaml grants it."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

from test_manifests import REPO, build

from extender.kube.api import ALL_KINDS, Resource

#: The packages whose code runs in ``gangslice serve`` (the extender and the controllers):
#: every call they make through the one client must be granted.
CONTROLLER_PACKAGES = ("extender/kube", "extender/reservations", "extender/controllers", "extender/httpapi")
CONTROLLER_FILES = ("extender/commands/serve.py",)
#: Not part of ``serve``: the `gangslice hypernodes` command's read of the nodes.
NOT_SERVE = {"extender/controllers/podgroups/hypernodes.py"}
#: kopf watches of the admission controller.
KOPF_MODULE = "extender.controllers.handlers"
#: Where ``kubernetes`` API classes may be built: nowhere, since every call goes through
#: the one client (extender/kube/client.py), which builds requests itself.
CLIENT_HOMES: set[str] = set()
#: Client method -> RBAC verb. A server-side apply of a main resource may create the object.
VERBS = {"get": {"get"}, "list": {"list"}, "watch": {"watch"}, "create": {"create"}}
VERBS |= {"replace": {"update"}, "patch": {"patch"}, "apply": {"patch", "create"}, "delete": {"delete"}}
#: Client methods that address one fixed subresource (no resource argument).
FIXED = {"evict": ("", "pods/eviction", "create")}
#: Receivers of client calls as they are written in the code.
RECEIVERS = {"api", "self.api", "self._api"}

Grant = tuple[str, str, str]  # (API group, resource, verb)


def _resources(expr: ast.expr, module: ModuleType) -> set[Resource]:
    """The resources a call's first argument can be: a constant of extender.kube.api (by name
    or as ``kube.X``), a watched kind's (``kind.resource`` and a local bound to it), or any
    value of a module-level mapping of them (``OWNERS[key]``)."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
        table = getattr(module, expr.value.id, None)
        values = set(table.values()) if isinstance(table, Mapping) else set()
        if values and all(isinstance(v, Resource) for v in values):
            return values
    if isinstance(expr, ast.Name):
        got = getattr(module, expr.id, None)
        if isinstance(got, Resource):
            return {got}
        if expr.id == "res":
            return {k.resource for k in ALL_KINDS}
    if isinstance(expr, ast.Attribute):
        if expr.attr == "resource":
            return {k.resource for k in ALL_KINDS}
        if isinstance(expr.value, ast.Name):
            got = getattr(getattr(module, expr.value.id, None), expr.attr, None)
            if isinstance(got, Resource):
                return {got}
    raise AssertionError(f"{module.__name__}: cannot resolve the resource {ast.unparse(expr)}")


def _resolve(expr: ast.expr, module: ModuleType, tree: ast.Module) -> set[str]:
    """A kopf watch's group or plural: a constant or a module global."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.Name) and isinstance(getattr(module, expr.id, None), str):
        return {getattr(module, expr.id)}
    raise AssertionError(f"{module.__name__}: cannot resolve {ast.dump(expr)}")


def _subresources(call: ast.Call) -> set[str]:
    for kw in call.keywords:
        if kw.arg == "subresource":
            v = kw.value
            if isinstance(v, ast.Constant):
                return {str(v.value)}
            if isinstance(v, ast.Name):
                return {"status", ""}  # a local that is either (the store's "status" if ... else "")
            raise AssertionError(f"cannot resolve subresource {ast.unparse(v)}")
    return {""}


def client_calls() -> Iterator[tuple[str, str, ast.Call]]:
    """(module name, method, call) for every call of the one client in ``serve``'s code."""
    files = [f for pkg in CONTROLLER_PACKAGES for f in sorted((REPO / pkg).rglob("*.py"))]
    files += [REPO / f for f in CONTROLLER_FILES]
    for path in files:
        relative = str(path.relative_to(REPO))
        if relative in NOT_SERVE or relative == "extender/kube/client.py":
            continue
        name = relative.removesuffix(".py").replace("/", ".")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and (node.func.attr in VERBS or node.func.attr in FIXED)
                and ast.unparse(node.func.value) in RECEIVERS
            ):
                yield name, node.func.attr, node


def derived_grants() -> set[Grant]:
    grants: set[Grant] = set()
    for name, method, call in client_calls():
        if method in FIXED:
            grants.add(FIXED[method])
            continue
        module = importlib.import_module(name)
        assert call.args, f"{name}: {ast.unparse(call)} names no resource"
        for res in _resources(call.args[0], module):
            for sub in _subresources(call):
                resource = res.plural + (f"/{sub}" if sub else "")
                verbs = VERBS[method] - ({"create"} if method == "apply" and sub else set())
                grants |= {(res.group, resource, v) for v in verbs}
    handlers = importlib.import_module(KOPF_MODULE)
    tree = ast.parse(Path(str(handlers.__file__)).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "kopf.on.event":
            group = _resolve(node.args[0], handlers, tree)
            plural = _resolve(node.args[2], handlers, tree)
            grants |= {(g, p, v) for g in group for p in plural for v in ("list", "watch")}
    return grants


def granted(role_kinds: tuple[str, ...] = ("ClusterRole", "Role")) -> set[Grant]:
    b = build("")
    names = set()
    for binding in b.of_kind("ClusterRoleBinding", "RoleBinding"):
        if any(s["name"] == "gangslice-controller" for s in binding["subjects"]):
            names.add((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
    out: set[Grant] = set()
    for role in b.of_kind(*role_kinds):
        if (role["kind"], role["metadata"]["name"]) in names:
            for rule in role["rules"]:
                out |= {
                    (g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
                }
    return out


def test_the_derivation_sees_the_calls_we_know_of() -> None:
    got = derived_grants()
    # A sample from each source, so a broken scan cannot pass by finding nothing.
    assert ("", "pods/binding", "create") in got  # kube/binder.py
    assert ("", "pods/eviction", "create") in got  # controllers/mismatch/reporter.py
    assert ("", "nodes", "watch") in got  # kube/watch.py, for every watched kind
    assert ("kueue.x-k8s.io", "workloads/status", "patch") in got  # controllers/kueue/controller.py SSA
    assert ("coordination.k8s.io", "leases", "update") in got  # controllers/leader.py replace
    assert ("kueue.x-k8s.io", "admissionchecks", "watch") in got  # kopf
    assert ("authorization.k8s.io", "subjectaccessreviews", "create") in got  # secure_metrics.py


def test_the_controller_is_granted_exactly_what_its_code_calls() -> None:
    derived, have = derived_grants(), granted()
    assert have - derived == set(), f"granted but never called: {sorted(have - derived)}"
    assert derived - have == set(), f"called but not granted: {sorted(derived - have)}"


def test_the_lease_rules_are_namespaced_and_named() -> None:
    b = build("")
    role = b.find("Role", "gangslice-controller-leader-election", "gangslice-system")
    assert role is not None
    from extender.controllers.leader import LeaseConfig

    cfg = LeaseConfig()
    assert cfg.namespace == "gangslice-system"
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named and all(r["resourceNames"] == [cfg.name] for r in named)
    unnamed = {v for r in role["rules"] if not r.get("resourceNames") for v in r["verbs"]}
    assert unnamed == {"create"}  # the one verb RBAC cannot restrict by name
    cluster = granted(("ClusterRole",))
    assert not any(r == "leases" for _, r, _ in cluster)


def test_api_clients_are_built_only_where_rbac_was_audited() -> None:
    pattern = re.compile(r"\b(?:client\.)?([A-Z]\w*V\d\w*Api|CustomObjectsApi)\(")
    for path in (REPO / "extender").rglob("*.py"):
        relative = str(path.relative_to(REPO))
        if pattern.search(path.read_text()):
            assert relative in CLIENT_HOMES, f"{relative} builds a Kubernetes API client: audit its RBAC"


def test_the_explain_role_covers_what_explain_reads() -> None:
    b = build("")
    role = b.find("ClusterRole", "gangslice-explain")
    assert role is not None
    have = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert all(v in ("get", "list") for _, _, v in have)  # read-only
    from extender.kube.api import ALL_KINDS

    for kind in ALL_KINDS:  # live_cache lists every kind the cache watches
        res = kind.resource
        assert (res.group, res.plural, "list") in have, kind
    assert ("scheduling.volcano.sh", "podgroups", "get") in have
    assert ("kueue.x-k8s.io", "workloads", "get") in have
    assert not any(b2["roleRef"]["name"] == "gangslice-explain" for b2 in b.of_kind("ClusterRoleBinding"))


def test_the_rbac_table_in_the_install_guide_matches_the_role() -> None:
    text = (REPO / "docs" / "install.md").read_text()
    rows: set[Grant] = set()
    verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] != "controller":
            continue
        group = "" if cells[1] == "core" else cells[1]
        resource = cells[2].split(" (")[0]
        rows |= {(group, resource, v) for v in re.findall(r"[a-z]+", cells[3]) if v in verbs}
    assert rows == granted(), f"docs/install.md RBAC table: {sorted(rows ^ granted())}"


def test_the_leader_label_is_granted_in_the_controllers_namespace() -> None:
    """label_own_pod patches the pod named by POD_NAME in POD_NAMESPACE (gangslice-system):
    a namespaced Role grants it, so the grant outlives the cluster-wide pods: patch of bind."""
    role = build("").find("Role", "gangslice-controller-leader-label", "gangslice-system")
    assert role is not None
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"]] == [
        ([""], ["pods"], ["patch"])
    ]
    server = (REPO / "extender" / "httpapi" / "server.py").read_text()
    assert "async def label_own_pod" in server and 'os.environ.get("POD_NAMESPACE")' in server
    labellers = [p for p in (REPO / "extender").rglob("*.py") if '{"metadata": {"labels": ' in p.read_text()]
    assert {str(p.relative_to(REPO)) for p in labellers} == {"extender/httpapi/server.py"}


def test_podgroup_writes_are_the_replace_the_code_makes() -> None:
    derived = {v for g, r, v in derived_grants() if r == "podgroups"}
    assert "update" in derived and not derived & {"create", "patch", "delete"}


def test_no_cluster_wide_pod_writes_the_leader_label_is_the_only_pod_patch() -> None:
    """A bind is one Binding (pods/binding) and a plain gang that never fits is told by an
    Event, so the ClusterRole writes no pod; the one pod patch in serve's code is the leader
    label on the controller's own pod, granted by a Role in its namespace."""
    cluster = granted(("ClusterRole",))
    assert {v for _, r, v in cluster if r == "pods"} == {"get", "list", "watch"}
    assert ("", "pods/binding", "create") in cluster
    patches = [
        (name, ast.unparse(call))
        for name, method, call in client_calls()
        if method in ("patch", "replace", "apply") and ast.unparse(call.args[0]).endswith("PODS")
    ]
    assert [name for name, _ in patches] == ["extender.httpapi.server"], patches
    b = build("")
    role = b.find("Role", "gangslice-controller-leader-label", "gangslice-system")
    assert role is not None and role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}
    ]
