"""The ValidatingAdmissionPolicy that keeps the node agent to its own node's NodeTopology
(manifests/agent/own-node-policy.yaml) matches the agent's ServiceAccount and every write its
ClusterRole allows; tests/e2e/test_install.py checks it on the real API server."""

from __future__ import annotations

from test_manifests import build


def test_the_policy_covers_the_agents_writes_and_is_enforced() -> None:
    b = build("")
    policy = b.find("ValidatingAdmissionPolicy", "gangslice-agent-own-node")
    binding = b.find("ValidatingAdmissionPolicyBinding", "gangslice-agent-own-node")
    daemonset = b.find("DaemonSet", "gangslice-agent", "gangslice-system")
    role = b.find("ClusterRole", "gangslice-agent")
    assert policy and binding and daemonset and role
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'system:serviceaccount:gangslice-system:{account}'" in condition["expression"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    writes = {
        res
        for r in role["rules"]
        if "gangslice.io" in r["apiGroups"] and set(r["verbs"]) & {"create", "update", "patch", "delete"}
        for res in r["resources"]
    }
    assert writes and writes <= set(rule["resources"])
    assert {"CREATE", "UPDATE"} <= set(rule["operations"])
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (check,) = policy["spec"]["validations"]
    assert "request.name == variables.node" in check["expression"]
    (var,) = policy["spec"]["variables"]
    assert "authentication.kubernetes.io/node-name" in var["expression"]
