"""The pure policy decision: globs, deny-over-allow, ports, literal IPs, internal hosts, report mode, auth."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import (
    authenticate,
    decide_addresses,
    decide_destination,
    glob_matches,
    token_digest,
)
from gateway.policy.load import parse_policy
from gateway.policy.model import Policy, Principal
from gateway.vet.addresses import AddressGuard, IPAddress
from gateway.vet.urls import VettedHost, vet_host

RESEARCH_TOKEN = "research-token-for-tests-only"
CODING_TOKEN = "coding-token-for-tests-only"

POLICY_TEXT = f"""
version: 1
defaults: {{ports: [80, 443]}}
principals:
  default:
    egress: {{allow_domains: ["*"], deny_domains: ["*.evil.example", "pastebin.com"]}}
  research-agent:
    token_sha256: "{token_digest(RESEARCH_TOKEN)}"
    egress: {{allow_domains: ["*.wikipedia.org", "github.com"]}}
  coding-agent:
    token_sha256: "{token_digest(CODING_TOKEN)}"
    egress:
      allow_domains: ["pypi.org"]
      internal_hosts: [{{host: "api.corp.example", cidrs: ["10.20.0.0/16"]}}]
"""
POLICY = parse_policy(POLICY_TEXT)
DEFAULT = POLICY.principals["default"]
RESEARCH = POLICY.principals["research-agent"]
CODING = POLICY.principals["coding-agent"]


def host(name: str) -> VettedHost:
    return vet_host(name)


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


# --- globs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "name", "matches"),
    [
        ("*", "example.com", True),
        ("*", "a.b.c.example.com", True),
        ("*.example.com", "www.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "badexample.com", False),
        ("*.example.com", "example.com.evil.net", False),
        ("example.com", "example.com", True),
        ("example.com", "www.example.com", False),
        ("example.com", "notexample.com", False),
    ],
    ids=[
        "star-any",
        "star-deep",
        "wildcard-sub",
        "wildcard-deep-sub",
        "wildcard-not-apex",
        "wildcard-not-suffix-text",
        "wildcard-not-prefix",
        "exact",
        "exact-not-sub",
        "exact-not-suffix-text",
    ],
)
def test_domain_glob_matching(glob: str, name: str, matches: bool) -> None:
    assert glob_matches(glob, name) is matches


@pytest.mark.parametrize(
    ("principal", "name", "allowed"),
    [
        (RESEARCH, "en.wikipedia.org", True),
        (RESEARCH, "wikipedia.org", False),
        (RESEARCH, "github.com", True),
        (RESEARCH, "api.github.com", False),
        (RESEARCH, "EN.Wikipedia.ORG.", True),
        (DEFAULT, "anything.example.org", True),
        (DEFAULT, "x.evil.example", False),
        (DEFAULT, "pastebin.com", False),
        (DEFAULT, "evil.example", True),
    ],
    ids=[
        "wildcard-sub",
        "wildcard-apex-denied",
        "exact",
        "exact-sub-denied",
        "normalised-name",
        "star",
        "deny-glob-beats-star",
        "deny-exact-beats-star",
        "deny-wildcard-not-apex",
    ],
)
def test_destination_follows_allow_and_deny_domains(principal: Principal, name: str, allowed: bool) -> None:
    decision = decide_destination(POLICY, principal, host(name), 443)
    assert decision.allowed is allowed, decision.reason
    if not allowed:
        assert decision.code is ErrorCode.POLICY_DENIED


def test_deny_domains_wins_over_an_exact_allow() -> None:
    policy = parse_policy(
        "version: 1\nprincipals:\n  default:\n"
        '    egress: {allow_domains: ["a.example.com"], deny_domains: ["*.example.com"]}\n'
    )
    decision = decide_destination(policy, policy.principals["default"], host("a.example.com"), 443)
    assert not decision.allowed
    assert "deny_domains" in decision.reason


def test_principal_without_egress_rules_reaches_nothing() -> None:
    policy = parse_policy("version: 1\nprincipals: {default: {}}\n")
    assert not decide_destination(policy, policy.principals["default"], host("example.com"), 443).allowed


@pytest.mark.parametrize(
    ("port", "allowed"), [(80, True), (443, True), (8080, False), (22, False)], ids=["http", "https", "8080", "ssh"]
)
def test_port_must_be_in_the_policy_ports(port: int, allowed: bool) -> None:
    decision = decide_destination(POLICY, DEFAULT, host("example.com"), port)
    assert decision.allowed is allowed
    if not allowed:
        # The same code on every surface (issue 11): a port is part of the destination's form.
        assert decision.code is ErrorCode.UNSAFE_URL


@pytest.mark.parametrize(
    ("literal_ips", "allowed"), [("deny", False), ("allow", True)], ids=["literal-ips-deny", "literal-ips-allow"]
)
def test_literal_ip_host_follows_literal_ips(literal_ips: str, allowed: bool) -> None:
    policy = parse_policy(
        f"version: 1\ndefaults: {{literal_ips: {literal_ips}}}\n"
        'principals: {default: {egress: {allow_domains: ["*"]}}}\n'
    )
    decision = decide_destination(policy, policy.principals["default"], host("93.184.216.34"), 443)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.code is ErrorCode.UNSAFE_URL


def test_literal_ip_allowed_by_policy_is_still_classified() -> None:
    guard = AddressGuard()
    literal = host("0x7f.1")
    assert literal.ip is not None
    decision = decide_addresses(guard, DEFAULT, literal.name, [literal.ip])
    assert not decision.allowed
    assert decision.code is ErrorCode.BLOCKED_DESTINATION


# --- addresses and internal hosts -------------------------------------------------------------


@pytest.mark.parametrize(
    ("addresses", "allowed"),
    [
        (["93.184.216.34"], True),
        (["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"], True),
        (["93.184.216.34", "10.0.0.1"], False),
        (["169.254.169.254"], False),
        (["64:ff9b::a9fe:a9fe"], False),
    ],
    ids=["public", "public-dual-stack", "public-and-private-is-an-attack", "metadata", "nat64-metadata"],
)
def test_every_resolved_address_must_pass(addresses: list[str], allowed: bool) -> None:
    decision = decide_addresses(AddressGuard(), DEFAULT, "example.com", [ip(a) for a in addresses])
    assert decision.allowed is allowed
    if not allowed:
        assert decision.code is ErrorCode.BLOCKED_DESTINATION


def test_no_address_is_a_dns_failure() -> None:
    decision = decide_addresses(AddressGuard(), DEFAULT, "example.com", [])
    assert decision.code is ErrorCode.DNS_FAILURE


@pytest.mark.parametrize(
    ("principal", "name", "address", "allowed"),
    [
        (CODING, "api.corp.example", "10.20.1.5", True),
        (CODING, "api.corp.example", "10.21.0.1", False),
        (CODING, "api.corp.example", "169.254.169.254", False),
        (CODING, "other.corp.example", "10.20.1.5", False),
        (DEFAULT, "api.corp.example", "10.20.1.5", False),
    ],
    ids=[
        "named-host-in-its-range",
        "named-host-outside-its-range",
        "named-host-to-metadata",
        "other-name-same-range",
        "other-principal-same-name",
    ],
)
def test_internal_host_opens_its_range_to_that_name_and_principal_only(
    principal: Principal, name: str, address: str, allowed: bool
) -> None:
    decision = decide_addresses(AddressGuard(), principal, name, [ip(address)])
    assert decision.allowed is allowed, decision.reason


def test_internal_host_is_an_allowed_destination_for_its_principal() -> None:
    assert decide_destination(POLICY, CODING, host("api.corp.example"), 443).allowed
    assert not decide_destination(POLICY, RESEARCH, host("api.corp.example"), 443).allowed


# --- report mode ------------------------------------------------------------------------------


def report_policy(principal_mode: str | None = None) -> Policy:
    mode_line = f"    mode: {principal_mode}\n" if principal_mode else ""
    return parse_policy(
        "version: 1\ndefaults: {mode: report}\nprincipals:\n  default:\n"
        f'    egress: {{allow_domains: ["github.com"]}}\n{mode_line}'
    )


@pytest.mark.parametrize(
    ("principal_mode", "mode"),
    [(None, "report"), ("enforce", "enforce"), ("report", "report")],
    ids=["inherits-defaults", "principal-enforces", "principal-reports"],
)
def test_mode_for_principal_overrides_defaults(principal_mode: str | None, mode: str) -> None:
    policy = report_policy(principal_mode)
    assert policy.mode_for(policy.principals["default"]) == mode


def test_report_mode_decision_still_names_the_denial() -> None:
    # The decision functions stay pure and truthful; the egress core turns a denial into
    # "would deny" when the principal's mode is report.
    policy = report_policy()
    decision = decide_destination(policy, policy.principals["default"], host("example.com"), 443)
    assert not decision.allowed
    assert decision.code is ErrorCode.POLICY_DENIED


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "token", "expected"),
    [
        (None, RESEARCH_TOKEN, "research-agent"),
        ("research-agent", RESEARCH_TOKEN, "research-agent"),
        (None, CODING_TOKEN, "coding-agent"),
        (None, None, "default"),
        ("research-agent", None, "default"),
    ],
    ids=[
        "bearer-token",
        "basic-user-and-token",
        "other-token",
        "no-credential-gets-default",
        "user-without-token-gets-default",
    ],
)
def test_authenticate_names_the_principal(user: str | None, token: str | None, expected: str) -> None:
    assert authenticate(POLICY, user, token).name == expected


@pytest.mark.parametrize(
    ("user", "token"),
    [
        (None, "wrong-token"),
        (None, ""),
        ("coding-agent", RESEARCH_TOKEN),
        ("default", RESEARCH_TOKEN),
        (None, token_digest(RESEARCH_TOKEN)),
    ],
    ids=["wrong-token", "empty-token", "user-token-mismatch", "default-user-with-token", "hash-as-token"],
)
def test_authenticate_refuses_a_bad_credential(user: str | None, token: str | None) -> None:
    with pytest.raises(GatewayError) as caught:
        authenticate(POLICY, user, token)
    assert caught.value.code is ErrorCode.AUTH_REQUIRED


def test_no_credential_without_a_default_principal_is_auth_required() -> None:
    policy = parse_policy(f'version: 1\nprincipals: {{agent: {{token_sha256: "{token_digest("t")}"}}}}\n')
    with pytest.raises(GatewayError) as caught:
        authenticate(policy, None, None)
    assert caught.value.code is ErrorCode.AUTH_REQUIRED
    assert authenticate(policy, "agent", "t").name == "agent"


def test_token_digest_is_hex_sha256() -> None:
    assert token_digest("test") == "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
