"""A decision names the rule that made it, for the audit line (`allow_domains[1]`, `*.github.com`)."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.policy.decide import decide_addresses, decide_form, decide_name
from gateway.policy.load import parse_policy
from gateway.vet.addresses import AddressGuard, parse_networks
from gateway.vet.urls import vet_host

POLICY = parse_policy(
    """
version: 1
defaults: {ports: [443, 8443]}
principals:
  agent:
    token_sha256: "%s"
    egress:
      allow_domains: ["pypi.org", "*.github.com"]
      deny_domains: ["gist.github.com"]
      internal_hosts: [{host: searxng.internal.example, cidrs: ["10.0.0.5/32"]}]
"""
    % ("a" * 64)
)


@pytest.mark.parametrize(
    ("host", "allowed", "rule", "pattern"),
    [
        pytest.param("api.github.com", True, "allow_domains[1]", "*.github.com", id="glob"),
        pytest.param("pypi.org", True, "allow_domains[0]", "pypi.org", id="exact"),
        pytest.param("gist.github.com", False, "deny_domains[0]", "gist.github.com", id="deny"),
        pytest.param("searxng.internal.example", True, "internal_hosts[0]", "searxng.internal.example", id="internal"),
        pytest.param("example.org", False, "default_deny", None, id="no-rule-matched"),
    ],
)
def test_the_deciding_rule_is_named(host: str, allowed: bool, rule: str | None, pattern: str | None) -> None:
    decision = decide_name(POLICY, POLICY.principals["agent"], vet_host(host))
    assert (decision.allowed, decision.rule, decision.pattern) == (allowed, rule, pattern)


@pytest.mark.parametrize(
    ("host", "port", "rule", "pattern"),
    [
        pytest.param("pypi.org", 80, "defaults.ports", "443,8443", id="port"),
        pytest.param("93.184.216.34", 443, "defaults.literal_ips", "deny", id="literal-ip"),
        pytest.param("search.default.svc.cluster.local", 443, "builtin_names", None, id="in-cluster-name"),
    ],
)
def test_a_refusal_of_the_form_names_the_default_that_refused(host: str, port: int, rule: str, pattern: str) -> None:
    decision = decide_form(POLICY, POLICY.principals["agent"], vet_host(host, keep_internal=True), port)
    assert (decision.allowed, decision.rule, decision.pattern) == (False, rule, pattern)
    error = decision.to_error()
    assert (error.rule, error.rule_pattern) == (rule, pattern)
    assert "rule" not in error.to_body()["error"], "the agent is not told the policy's layout"


@pytest.mark.parametrize(
    ("address", "rule", "pattern"),
    [
        pytest.param("169.254.169.254", "builtin_ranges", "169.254.0.0/16", id="metadata"),
        pytest.param("198.51.100.7", "defaults.deny_cidrs[1]", "198.51.100.0/28", id="policy-deny-cidr"),
        pytest.param("64:ff9b::a9fe:a9fe", "builtin_ranges", "64:ff9b::/96", id="nat64-embedding"),
    ],
)
def test_an_address_refusal_names_the_range_rule(address: str, rule: str, pattern: str) -> None:
    guard = AddressGuard(deny_cidrs=parse_networks(["203.0.113.0/24", "198.51.100.0/28"]))
    decision = decide_addresses(guard, POLICY.principals["agent"], "pypi.org", [ipaddress.ip_address(address)])
    assert (decision.allowed, decision.rule, decision.pattern) == (False, rule, pattern)
