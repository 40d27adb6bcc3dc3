"""The chart matches the policy it ships (issue 29): the NetworkPolicy opens what the policy's
`allow_cidrs` and `internal_hosts` open, plus `extraEgress`; the admin port admits only the
monitoring namespaces; sidecars get a PodMonitor; the shared Deployment spreads its replicas; and
the chart's default policy differs from `policies/default.yaml` only where both say so."""

from __future__ import annotations

import json

import pytest
import yaml

from .conftest import CHART_DIR, REPO_ROOT, Helm, Manifest, gateway_container, gateway_pod_spec

FULLNAME = "egw-egress-gateway"
INTERNAL = "deployment-internal-services"


def _egress(render_policies: list[Manifest], name: str) -> list[Manifest]:
    [policy] = [p for p in render_policies if p["metadata"]["name"] == name]
    rules: list[Manifest] = policy["spec"]["egress"]
    return rules


def _ip_blocks(rule: Manifest) -> set[str]:
    return {peer["ipBlock"]["cidr"] for peer in rule.get("to", []) if set(peer) == {"ipBlock"}}


def _exception_rule(rules: list[Manifest]) -> Manifest | None:
    """The rule of plain ipBlocks without `except` (the internet rule has except lists)."""
    found = [
        r for r in rules if r.get("to") and all(set(p) == {"ipBlock"} and "except" not in p["ipBlock"] for p in r["to"])
    ]
    assert len(found) <= 1
    return found[0] if found else None


def test_the_policys_allow_cidrs_and_internal_hosts_are_admitted_on_its_ports(helm: Helm) -> None:
    rules = _egress(helm.render(INTERNAL, "1.33.0").all("NetworkPolicy"), FULLNAME)
    exception = _exception_rule(rules)
    assert exception is not None
    assert _ip_blocks(exception) == {"10.20.0.0/16", "10.96.0.0/12", "fd00:20::/64"}
    assert {(p["protocol"], p["port"]) for p in exception["ports"]} == {("TCP", 80), ("TCP", 443), ("TCP", 8080)}
    # extraEgress is passed through as written: the in-cluster SearXNG by selector and target port.
    selector_rules = [r for r in rules if any("podSelector" in p and "namespaceSelector" in p for p in r["to"])]
    searxng = [r for r in selector_rules if r["ports"] == [{"protocol": "TCP", "port": 8080}]]
    assert searxng[0]["to"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "searxng"}}


@pytest.mark.parametrize(
    "override",
    [
        pytest.param(["--set", "networkPolicy.policyExceptions=false"], id="turned-off"),
        pytest.param(["--set", "policy.existingConfigMap=my-policy"], id="existing-configmap-unreadable"),
    ],
)
def test_no_exception_is_derived_when_off_or_when_the_policy_is_not_in_the_values(
    helm: Helm, override: list[str]
) -> None:
    render = helm.render_custom(INTERNAL, "1.33.0", override)
    rules = _egress(render.all("NetworkPolicy"), FULLNAME)
    assert _exception_rule(rules) is None
    assert any("namespaceSelector" in r["to"][0] and r["ports"][0]["port"] == 8080 for r in rules)  # extraEgress stays


def test_sidecar_agent_pods_get_the_same_exceptions(helm: Helm) -> None:
    policy = {
        "version": 1,
        "defaults": {"ports": [443], "allow_cidrs": ["192.168.50.0/24"]},
        "principals": {"default": {"egress": {"allow_domains": ["*"]}}},
    }
    extra = ["--set-json", f"policy.inline={json.dumps(policy)}"]
    extra += ["--set-json", 'networkPolicy.extraEgress=[{"to":[{"podSelector":{}}],"ports":[{"port":6379}]}]']
    rules = _egress(helm.render_custom("sidecar-native", "1.33.0", extra).all("NetworkPolicy"), f"{FULLNAME}-agents")
    exception = _exception_rule(rules)
    assert exception is not None
    assert _ip_blocks(exception) == {"192.168.50.0/24"}
    assert exception["ports"] == [{"protocol": "TCP", "port": 443}]
    assert {"to": [{"podSelector": {}}], "ports": [{"port": 6379}]} in rules


@pytest.mark.parametrize(
    ("values_file", "expected"),
    [
        pytest.param(
            "deployment-ha",
            [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "blackbox-exporter"}}},
            ],
            id="default-selector-and-adminFrom",
        ),
        pytest.param(
            INTERNAL,
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}],
            id="own-selector",
        ),
    ],
)
def test_the_admin_port_admits_only_the_monitoring_namespaces(
    helm: Helm, values_file: str, expected: list[Manifest]
) -> None:
    [policy] = [p for p in helm.render(values_file, "1.33.0").all("NetworkPolicy") if p["metadata"]["name"] == FULLNAME]
    [admin] = [rule for rule in policy["spec"]["ingress"] if rule["ports"] == [{"protocol": "TCP", "port": 9090}]]
    assert admin["from"] == expected


def test_sidecars_get_a_pod_monitor_on_the_admin_port_of_the_agent_pods(helm: Helm) -> None:
    render = helm.render("sidecar-native", "1.33.0")
    monitor = render.one("PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["agents"]}
    [endpoint] = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("admin", "/metrics")
    # It selects the example agent pod, and that pod's gateway container has the named port.
    pod_template = render.one("Deployment")["spec"]["template"]
    assert spec["selector"]["matchLabels"].items() <= pod_template["metadata"]["labels"].items()
    ports = {p["name"] for p in gateway_container(pod_template["spec"])["ports"]}
    assert "admin" in ports
    assert not render.all("ServiceMonitor")


def test_pod_monitor_is_sidecar_only_and_opt_in(helm: Helm) -> None:
    assert not helm.render("sidecar-legacy", "1.33.0").all("PodMonitor")
    deployment = helm.render_custom("deployment-ha", "1.33.0", ["--set", "metrics.podMonitor.enabled=true"])
    assert not deployment.all("PodMonitor")
    custom = helm.render_custom(
        "sidecar-native", "1.33.0", ["--set", "metrics.podMonitor.selector.matchLabels.team=agents"]
    )
    assert custom.one("PodMonitor")["spec"]["selector"] == {"matchLabels": {"team": "agents"}}


def test_the_shared_deployment_spreads_its_replicas_over_nodes_and_zones_by_default(helm: Helm) -> None:
    spread = gateway_pod_spec(helm.render("deployment-default", "1.33.0"))["topologySpreadConstraints"]
    assert [(c["topologyKey"], c["maxSkew"], c["whenUnsatisfiable"]) for c in spread] == [
        ("kubernetes.io/hostname", 1, "ScheduleAnyway"),
        ("topology.kubernetes.io/zone", 1, "ScheduleAnyway"),
    ]
    deployment = helm.render("deployment-default", "1.33.0").one("Deployment")
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # The operator's own constraints replace the default; and it can be turned off.
    own = gateway_pod_spec(helm.render("deployment-ha", "1.33.0"))["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in own] == ["kubernetes.io/hostname"]
    off = helm.render_custom("deployment-default", "1.33.0", ["--set", "defaultTopologySpread=false"])
    assert "topologySpreadConstraints" not in gateway_pod_spec(off)


def test_the_chart_default_policy_differs_from_the_repositorys_only_in_the_tools_and_both_say_why() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    chart_policy = values["policy"]["inline"]
    repo_text = (REPO_ROOT / "policies" / "default.yaml").read_text()
    repo_policy = yaml.safe_load(repo_text)
    assert chart_policy["principals"]["default"]["tools"] == {"search": False, "fetch": False}
    assert repo_policy["principals"]["default"]["tools"] == {"search": True, "fetch": True}
    chart_policy["principals"]["default"]["tools"] = repo_policy["principals"]["default"]["tools"]
    assert chart_policy == repo_policy
    assert "policies/default.yaml" in (CHART_DIR / "values.yaml").read_text()
    assert "values.yaml" in repo_text
