"""Chart extras an operator opts into: the PrometheusRule and the Grafana dashboard name only
metrics the gateway exports; the inline policy is linted at render time with the gateway's own
messages; agents from other namespaces and a node-local DNS cache can be admitted."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gateway.observe.metrics import REGISTRY
from gateway.policy.load import PolicyError, parse_policy

from .conftest import CHART_DIR, CI_DIR, RELEASE, Helm

FULLNAME = f"{RELEASE}-egress-gateway"
METRIC_NAME = re.compile(r"\b((?:egress_gateway|process|python)_[a-z0-9_]+)\b")
DASHBOARD = CHART_DIR / "dashboards" / "egress-gateway.json"


def exported_metric_names() -> set[str]:
    """Every sample name /metrics can carry, from the registry the gateway serves."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        names.update(sample.name for sample in family.samples)
    return names


def _names_in(expression: str) -> set[str]:
    return set(METRIC_NAME.findall(expression))


def _render(helm: Helm, *sets: str) -> list[dict[str, Any]]:
    extra = [arg for value in sets for arg in ("--set", value)]
    result = helm.template([CI_DIR / "deployment-default.yaml"], "1.33.0", extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_prometheus_rule_alerts_on_what_operators_need_with_exported_metrics(helm: Helm) -> None:
    docs = _render(helm, "metrics.prometheusRule.enabled=true")
    (rule,) = [doc for doc in docs if doc["kind"] == "PrometheusRule"]
    alerts = {alert["alert"]: alert["expr"] for group in rule["spec"]["groups"] for alert in group["rules"]}
    assert set(alerts) == {
        "EgressGatewayDenialSpike",
        "EgressGatewayAuthFailures",
        "EgressGatewayPolicyReloadFailed",
        "EgressGatewayStoreUnavailable",
        "EgressGatewayAuditWriteFailures",
        "EgressGatewayTunnelLimitHits",
    }
    exported = exported_metric_names()
    for name, expression in alerts.items():
        used = _names_in(expression)
        assert used, name
        assert used <= exported, (name, used - exported)
        assert f'job="{FULLNAME}"' in expression


def test_the_prometheus_rule_and_dashboard_are_opt_in(helm: Helm) -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in _render(helm)}
    assert ("ConfigMap", f"{FULLNAME}-dashboard") not in kinds
    assert not [kind for kind, _ in kinds if kind == "PrometheusRule"]


def test_every_dashboard_expression_names_an_exported_metric(helm: Helm) -> None:
    docs = _render(helm, "metrics.grafanaDashboard.enabled=true")
    (config_map,) = [doc for doc in docs if doc["metadata"]["name"] == f"{FULLNAME}-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["egress-gateway.json"])
    assert dashboard == json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(expressions) >= 10
    exported = exported_metric_names()
    for expression in expressions:
        used = _names_in(expression)
        assert used, expression
        assert used <= exported, (expression, used - exported)


INVALID_POLICIES = {
    "unknown-top-key": "policy.inline.principalz.x=1",
    "wrong-version": "policy.inline.version=2",
    "mode-typo": "policy.inline.defaults.mode=enforc",
    "port-out-of-range": "policy.inline.defaults.ports[0]=70000",
    "principal-key-typo": "policy.inline.principals.default.egres.allow_domains[0]=x",
    "egress-key-typo": "policy.inline.principals.default.egress.allow_domain[0]=x",
    "tools-key-typo": "policy.inline.principals.default.tools.browse=true",
    "bad-token-hash": "policy.inline.principals.agent.token_sha256=ABC",
    "bad-principal-name": "policy.inline.principals.bad!name.mode=report",
    "principal-mode": "policy.inline.principals.default.mode=audit",
}


@pytest.mark.parametrize("override", INVALID_POLICIES.values(), ids=INVALID_POLICIES.keys())
def test_an_invalid_inline_policy_fails_the_render_with_the_lint_message(helm: Helm, override: str) -> None:
    extra = ["--set", override, "--show-only", "templates/configmap.yaml"]
    result = helm.template([CI_DIR / "deployment-default.yaml"], "1.33.0", extra)
    assert result.returncode != 0
    (line,) = [line for line in result.stderr.splitlines() if "policy.inline:" in line]
    rendered_message = line.split("policy.inline: ", 1)[1]
    # The same policy through the gateway's own lint: its first reason, without file:line.
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    policy = _apply_set(values["policy"]["inline"], override.removeprefix("policy.inline."))
    with pytest.raises(PolicyError) as raised:
        parse_policy(yaml.safe_dump(policy), "policy.yaml")
    lint_reason = raised.value.errors[0].split(": ", 1)[1]
    assert rendered_message == lint_reason


def _apply_set(document: dict[str, Any], assignment: str) -> dict[str, Any]:
    """`a.b[0]=v` as helm --set applies it (values parsed as YAML scalars)."""
    path, _, raw = assignment.partition("=")
    value = yaml.safe_load(raw)
    node: Any = document
    parts = path.split(".")
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        match = re.fullmatch(r"(.+)\[(\d+)\]", part)
        if match:
            key, position = match.group(1), int(match.group(2))
            items = node.setdefault(key, [])
            if last:
                if position < len(items):
                    items[position] = value
                else:
                    items.append(value)
            else:
                node = items[position]
        elif last:
            node[part] = value
        else:
            node = node.setdefault(part, {})
    return document


def test_agents_from_other_namespaces_and_a_node_local_dns_cache_can_be_admitted(helm: Helm) -> None:
    docs = _render(
        helm,
        "networkPolicy.enabled=true",
        "networkPolicy.agentNamespaceSelector.matchLabels.team=research",
        "networkPolicy.dns.nodeLocalCIDRs[0]=169.254.20.10/32",
    )
    policies = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "NetworkPolicy"}
    gateway_ingress = policies[FULLNAME]["spec"]["ingress"][0]["from"][0]
    assert gateway_ingress["namespaceSelector"] == {"matchLabels": {"team": "research"}}
    assert gateway_ingress["podSelector"] == {"matchLabels": {"egress-gateway.io/agent": "true"}}
    for name in (FULLNAME, f"{FULLNAME}-agents"):
        rules = policies[name]["spec"]["egress"]
        node_local = [rule for rule in rules if rule["to"] == [{"ipBlock": {"cidr": "169.254.20.10/32"}}]]
        assert len(node_local) == 1, name
        assert {(port["protocol"], port["port"]) for port in node_local[0]["ports"]} == {("UDP", 53), ("TCP", 53)}


def test_without_a_namespace_selector_only_the_release_namespace_is_admitted(helm: Helm) -> None:
    docs = _render(helm, "networkPolicy.enabled=true")
    (gateway,) = [doc for doc in docs if doc["kind"] == "NetworkPolicy" and doc["metadata"]["name"] == FULLNAME]
    assert "namespaceSelector" not in gateway["spec"]["ingress"][0]["from"][0]
