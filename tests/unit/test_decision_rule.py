"""A decision names the rule that made it, for the audit line (`allow_domains[1]`, `*.github.com`)."""

from __future__ import annotations

import pytest

from gateway.policy.decide import decide_name
from gateway.policy.load import parse_policy
from gateway.vet.urls import vet_host

POLICY = parse_policy(
    """
version: 1
defaults: {ports: [443]}
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
        pytest.param("example.org", False, None, None, id="no-rule-matched"),
    ],
)
def test_the_deciding_rule_is_named(host: str, allowed: bool, rule: str | None, pattern: str | None) -> None:
    decision = decide_name(POLICY, POLICY.principals["agent"], vet_host(host))
    assert (decision.allowed, decision.rule, decision.pattern) == (allowed, rule, pattern)
