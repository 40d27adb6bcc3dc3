"""The NetworkPolicies really restrict: agents reach only the gateway and DNS; the gateway
reaches only public addresses on the policy's ports, DNS and (optionally) Redis."""

from __future__ import annotations

import ipaddress

import pytest

from .conftest import CHART_DIR, RELEASE, Helm, Manifest

FULLNAME = f"{RELEASE}-egress-gateway"
KUBE_SYSTEM = {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
MUST_EXCEPT_V4 = {
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
    "127.0.0.0/8", "0.0.0.0/8", "192.0.0.0/24", "168.63.129.16/32",
}  # fmt: skip
MUST_EXCEPT_V6 = {"fc00::/7", "fe80::/10", "::1/128", "::ffff:0:0/96"}


def policies(helm: Helm, values_file: str) -> dict[str, Manifest]:
    render = helm.render(values_file, "1.33.0")
    return {p["metadata"]["name"]: p for p in render.all("NetworkPolicy")}


def port_set(rule: Manifest) -> set[tuple[str, int]]:
    return {(p["protocol"], p["port"]) for p in rule["ports"]}


def is_dns_rule(rule: Manifest) -> bool:
    return port_set(rule) == {("UDP", 53), ("TCP", 53)} and all(
        peer.get("namespaceSelector") == KUBE_SYSTEM for peer in rule["to"]
    )


def test_agents_may_reach_only_the_gateway_ports_and_cluster_dns(helm: Helm) -> None:
    agents = policies(helm, "deployment-ha")[f"{FULLNAME}-agents"]
    spec = agents["spec"]
    assert spec["podSelector"] == {"matchLabels": {"egress-gateway.io/agent": "true"}}
    assert spec["policyTypes"] == ["Egress"]
    gateway_rule, dns_rule = spec["egress"]
    assert port_set(gateway_rule) == {("TCP", 3128), ("TCP", 8080)}
    [peer] = gateway_rule["to"]
    assert set(peer) == {"podSelector"}
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == RELEASE
    assert is_dns_rule(dns_rule)
    # Every rule names its peers and ports: an empty `to` or `ports` would allow everything.
    for rule in spec["egress"]:
        assert rule["to"]
        assert rule["ports"]


def test_gateway_egress_is_public_internet_on_policy_ports_minus_private_ranges(
    helm: Helm,
) -> None:
    spec = policies(helm, "deployment-ha")[FULLNAME]["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    internet, redis, dns = spec["egress"]
    assert port_set(internet) == {("TCP", 80), ("TCP", 443)}
    blocks = {peer["ipBlock"]["cidr"]: peer["ipBlock"]["except"] for peer in internet["to"]}
    assert set(blocks) == {"0.0.0.0/0", "::/0"}
    assert set(blocks["0.0.0.0/0"]) >= MUST_EXCEPT_V4
    assert set(blocks["::/0"]) >= MUST_EXCEPT_V6
    for cidr, excepts in blocks.items():
        network = ipaddress.ip_network(cidr)
        for excepted in excepts:
            # The API server rejects an except outside its cidr; check it here, too.
            assert ipaddress.ip_network(excepted).subnet_of(network)  # type: ignore[arg-type]
    assert port_set(redis) == {("TCP", 6379)}
    assert redis["to"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "redis"}}}]
    assert is_dns_rule(dns)


def test_gateway_accepts_proxy_and_api_only_from_agents(helm: Helm) -> None:
    ingress = policies(helm, "deployment-ha")[FULLNAME]["spec"]["ingress"]
    from_agents, admin = ingress
    assert port_set(from_agents) == {("TCP", 3128), ("TCP", 8080)}
    assert from_agents["from"] == [{"podSelector": {"matchLabels": {"egress-gateway.io/agent": "true"}}}]
    assert port_set(admin) == {("TCP", 9090)}


def test_sidecar_mode_confines_the_agent_pod_to_public_addresses(helm: Helm) -> None:
    found = policies(helm, "sidecar-native")
    assert set(found) == {f"{FULLNAME}-agents"}
    spec = found[f"{FULLNAME}-agents"]["spec"]
    internet, dns = spec["egress"]
    cidrs = {peer["ipBlock"]["cidr"]: peer["ipBlock"]["except"] for peer in internet["to"]}
    assert set(cidrs["0.0.0.0/0"]) >= MUST_EXCEPT_V4
    assert is_dns_rule(dns)
    example = helm.render("sidecar-native", "1.33.0").one("Deployment")
    pod_labels = example["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("values_file", ["deployment-default", "sidecar-legacy"])
def test_network_policy_is_off_unless_enabled(helm: Helm, values_file: str) -> None:
    assert not policies(helm, values_file)


def test_empty_agent_selector_is_refused(helm: Helm) -> None:
    result = helm.run(
        "template", RELEASE, str(CHART_DIR),
        "--set", "networkPolicy.enabled=true",
        "--set", "networkPolicy.agentSelector.matchLabels=null",
    )  # fmt: skip
    assert result.returncode != 0
    assert "agentSelector" in result.stderr
