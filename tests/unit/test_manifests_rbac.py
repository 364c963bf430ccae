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
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from test_manifests import REPO, build

#: The modules through which the controller calls the API server.
CONTROLLER_MODULES = ("extender.kube.client", "extender.controllers.api", "extender.httpapi.secure_metrics")
#: kopf watches of the admission controller.
KOPF_MODULE = "extender.controllers.handlers"
#: Where ``kubernetes`` API classes may be built: the controller's modules, the agent's
#: publisher (manifests/agent) and `gangslice explain` (the gangslice-explain ClusterRole).
CLIENT_HOMES = {
    "extender/kube/client.py",
    "extender/controllers/api.py",
    "extender/agent/publish.py",
    "extender/commands/explain.py",
    "extender/httpapi/secure_metrics.py",
}
CLIENT_ATTRS = {"_core": "", "_custom": None, "_coord": "coordination.k8s.io"}
CLIENT_ATTRS |= {"_authn": "authentication.k8s.io", "_authz": "authorization.k8s.io"}
VERBS = {"read": "get", "get": "get", "list": "list", "create": "create", "patch": "patch"}
VERBS |= {"replace": "update", "delete": "delete"}
#: Core kinds as they appear in client method names -> (resource, subresource).
CORE_KINDS = {
    "node": "nodes",
    "pod": "pods",
    "event": "events",
    "lease": "leases",
    "pod_binding": "pods/binding",
    "token_review": "tokenreviews",
    "subject_access_review": "subjectaccessreviews",
}

Grant = tuple[str, str, str]  # (API group, resource, verb)


def _resolve(expr: ast.expr, module: ModuleType, tree: ast.Module) -> set[str]:
    """The string values an argument can take: constants, module globals, ``names.X``,
    a local assigned once (possibly a conditional expression)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _resolve(expr.body, module, tree) | _resolve(expr.orelse, module, tree)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        got = getattr(getattr(module, expr.value.id), expr.attr)
        assert isinstance(got, str)
        return {got}
    if isinstance(expr, ast.Name):
        value = getattr(module, expr.id, None)
        if isinstance(value, str):
            return {value}
        sources = [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)
        ]
        assert sources, f"{module.__name__}: cannot resolve {expr.id}"
        return set().union(*(_resolve(s, module, tree) for s in sources))
    raise AssertionError(f"{module.__name__}: cannot resolve {ast.dump(expr)}")


def _grants_of_call(
    method: str, client: str, args: list[ast.expr], module: ModuleType, tree: ast.Module
) -> set[Grant]:
    if method == "get_api_resources":
        return set()  # discovery: the system:discovery role lets every authenticated user read it
    verb_word, _, rest = method.partition("_")
    verb = VERBS[verb_word]
    status = rest.endswith("_status")
    rest = rest.removesuffix("_status")
    if rest.endswith("custom_object"):
        plural_at = 3 if rest.startswith("namespaced") else 2
        groups = _resolve(args[0], module, tree)
        plurals = _resolve(args[plural_at], module, tree)
        return {(g, p + ("/status" if status else ""), verb) for g in groups for p in plurals}
    kind = rest.removeprefix("namespaced_").removeprefix("cluster_").removesuffix("_for_all_namespaces")
    group = CLIENT_ATTRS[client]
    assert group is not None and kind in CORE_KINDS, f"{module.__name__}: unmapped call {method}"
    return {(group, CORE_KINDS[kind] + ("/status" if status else ""), verb)}


def _client_refs(tree: ast.Module) -> Iterator[tuple[str, str, list[ast.expr], str]]:
    """(client attribute, method, its arguments, enclosing function) for every
    ``self._core.m(...)`` call and every ``self._call(self._core.m, ...)`` hand-on."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
            and node.value.attr in CLIENT_ATTRS
        ):
            continue
        parent = parents[node]
        if isinstance(parent, ast.Call) and parent.func is node:
            args = list(parent.args)
        elif isinstance(parent, ast.Call) and parent.args and parent.args[0] is node:
            args = list(parent.args[1:])
        else:  # a lister stored and called later: its arguments are in the call below it
            calls = [n for n in ast.walk(_function_of(node, parents)) if isinstance(n, ast.Call)]
            args = next((list(c.args) for c in calls if ast.unparse(c.func) == ast.unparse(node)), [])
        yield node.value.attr, node.attr, args, _function_of(node, parents).name


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _function_of(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> Function:
    while not isinstance(node, Function):
        node = parents[node]
    # A nested helper belongs to the method that defines it.
    while isinstance(parents.get(node), Function):
        node = parents[node]
    return node


def derived_grants() -> set[Grant]:
    grants: set[Grant] = set()
    for name in CONTROLLER_MODULES:
        module = importlib.import_module(name)
        tree = ast.parse(Path(str(module.__file__)).read_text())
        for client, method, args, fn in _client_refs(tree):
            got = _grants_of_call(method, client, args, module, tree)
            if fn == "_lister":
                # The listers serve both the list and the watch (RealKubeApi.watch).
                got |= {(g, r, "watch") for g, r, v in got if v == "list"}
            grants |= got
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
    assert ("", "pods/binding", "create") in got  # kube/client.py bind_pod
    assert ("", "nodes", "watch") in got  # kube/client.py _lister used by watch
    assert ("kueue.x-k8s.io", "workloads/status", "patch") in got  # controllers/api.py SSA
    assert ("coordination.k8s.io", "leases", "update") in got  # controllers/api.py replace_lease
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
        assert any(r == kind.value and v == "list" for _, r, v in have), kind
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
    assert "patch_pod_labels" in server and 'os.environ.get("POD_NAMESPACE")' in server
    callers = [p for p in (REPO / "extender").rglob("*.py") if "patch_pod_labels(" in p.read_text()]
    assert {str(p.relative_to(REPO)) for p in callers} <= {
        "extender/httpapi/server.py",
        "extender/kube/api.py",
        "extender/kube/client.py",
        "extender/testing/kube.py",
    }


def test_podgroup_writes_are_the_replace_the_code_makes() -> None:
    derived = {v for g, r, v in derived_grants() if r == "podgroups"}
    assert "update" in derived and not derived & {"create", "patch", "delete"}
