"""Policy loading: every shipped policy is valid, every invalid fixture fails with its `file:line`.

The invalid fixtures live in tests/fixtures/policies/invalid/, one small file per mistake.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy.holder import PolicyHolder
from gateway.policy.load import PolicyError, load_policy_file, parse_policy
from tests.harness.invalid_policies import (
    POLICY_FIXTURES,
    ExpectedErrors,
    assert_first_error_at,
    assert_fixtures_are_expected,
    invalid_fixture_cases,
)

ROOT = Path(__file__).resolve().parents[2]
INVALID = POLICY_FIXTURES / "invalid"
SHIPPED = sorted([ROOT / "policies" / "default.yaml", *(ROOT / "policies" / "examples").glob("*.yaml")])

EXPECTED_ERRORS: ExpectedErrors = {
    "unknown_top_key.yaml": (3, "policy: unknown key 'principal'"),
    "unknown_principal_key.yaml": (6, "principals.default.egress: unknown key 'allow'"),
    "bad_mode.yaml": (4, "defaults.mode must be one of enforce, report, got 'audit'"),
    "port_out_of_range.yaml": (4, "defaults.ports must be between 1 and 65535, got 70000"),
    "port_zero.yaml": (4, "defaults.ports must be between 1 and 65535, got 0"),
    "no_ports.yaml": (4, "defaults.ports must name at least one port"),
    "cidr_host_bits.yaml": (4, "defaults.allow_cidrs: '10.0.0.1/8' is not a CIDR network (10.0.0.1/8 has host bits"),
    "cidr_not_a_network.yaml": (4, "defaults.deny_cidrs: 'not-a-network' is not a CIDR network"),
    "bad_token_hash.yaml": (5, "principals.agent.token_sha256 must be 64 lowercase hex digits"),
    "uppercase_token_hash.yaml": (5, "principals.agent.token_sha256 must be 64 lowercase hex digits"),
    "shared_token_hash.yaml": (4, "two principals share one token_sha256"),
    "duplicate_key.yaml": (5, "defaults.mode is given twice"),
    "duplicate_principal.yaml": (6, "principals.agent is given twice"),
    "yaml_syntax_error.yaml": (5, "YAML syntax error: expected ',' or ']'"),
    "switch_wrong_type.yaml": (6, "principals.default.tools.fetch must be true or false"),
    "bad_glob.yaml": (6, "principals.default.egress.allow_domains: 'api.*.example.com' is not '*', '*.domain'"),
    "glob_with_url.yaml": (6, "principals.default.egress.allow_domains: 'https://example.com/' is not '*'"),
    "missing_version.yaml": (2, "version is required (version: 1)"),
    "wrong_version.yaml": (2, "version must be between 1 and 1, got 2"),
    "empty.yaml": (1, "the policy file is empty"),
    "literal_ips_bad.yaml": (4, "defaults.literal_ips must be one of deny, allow, got 'sometimes'"),
    "bad_principal_name.yaml": (5, "principal name 'research agent' must be 1-64 letters"),
    "internal_host_glob.yaml": (7, "principals.default.egress.internal_hosts[].host must be one exact name"),
    "budget_negative.yaml": (6, "principals.default.budgets.search.per_step must be between 0 and 1000000, got -1"),
    "fetch_bad_robots.yaml": (4, "fetch.robots must be one of respect, ignore"),
    "principals_not_mapping.yaml": (4, "principals must be a mapping"),
}


def test_every_invalid_fixture_has_an_expected_message() -> None:
    assert_fixtures_are_expected(INVALID, EXPECTED_ERRORS)


@pytest.mark.parametrize(("name", "line", "message"), invalid_fixture_cases(EXPECTED_ERRORS))
def test_invalid_policy_fails_with_file_line_and_reason(name: str, line: int, message: str) -> None:
    assert_first_error_at(INVALID / name, line, message)


def test_every_error_in_a_file_is_reported_not_just_the_first() -> None:
    text = "version: 1\ndefaults:\n  mode: audit\n  ports: [0]\n  literal_ips: maybe\n"
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "multi.yaml")
    lines = {error.split(": ", 1)[0] for error in caught.value.errors}
    assert lines == {"multi.yaml:3", "multi.yaml:4", "multi.yaml:5"}


def test_unreadable_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load_policy_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_policy_is_valid(path: Path) -> None:
    policy = load_policy_file(path)
    assert policy.version == 1
    assert policy.principals


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_policy_passes_policy_lint(path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "lint", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"{path}: valid")


def test_invalid_policy_fails_policy_lint_with_file_line_on_stderr() -> None:
    path = INVALID / "port_out_of_range.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "lint", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.startswith(f"{path}:4: defaults.ports must be between 1 and 65535")


def test_ships_the_three_documented_examples() -> None:
    names = {p.stem for p in (ROOT / "policies" / "examples").glob("*.yaml")}
    assert names >= {"strict-allowlist", "multi-principal", "report-mode-rollout"}


def test_default_policy_lets_the_default_principal_reach_public_hosts_and_use_both_tools() -> None:
    policy = load_policy_file(ROOT / "policies" / "default.yaml")
    default = policy.default_principal
    assert default is not None
    assert default.egress.allow_domains == ("*",)
    assert default.tools.search
    assert default.tools.fetch
    assert policy.defaults.ports == (80, 443)
    assert policy.defaults.mode == "enforce"


def test_minimal_policy_takes_the_documented_defaults() -> None:
    policy = parse_policy("version: 1\n")
    assert policy.defaults.mode == "enforce"
    assert policy.defaults.ports == (80, 443)
    assert policy.defaults.literal_ips == "deny"
    assert policy.defaults.allow_cidrs == ()
    assert policy.defaults.deny_cidrs == ()
    assert policy.principals == {}


def test_full_principal_is_parsed_into_the_model() -> None:
    text = """
version: 1
defaults:
  {mode: report, ports: [443, 8443], literal_ips: allow, allow_cidrs: ["127.0.0.2/32"], deny_cidrs: ["8.8.8.0/24"]}
principals:
  agent:
    token_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    mode: enforce
    egress:
      allow_domains: ["*.Wikipedia.org.", "BÜCHER.example"]
      deny_domains: ["evil.example"]
      internal_hosts: [{host: "api.corp.example", cidrs: ["10.20.0.0/16"]}]
    tools: {search: true, fetch: false}
    budgets: {search: {per_step: 5, per_run: 50, concurrent: 2, min_interval_s: 0.5}}
"""
    policy = parse_policy(text)
    agent = policy.principals["agent"]
    assert policy.defaults.ports == (443, 8443)
    assert policy.defaults.allow_cidrs == (ipaddress.ip_network("127.0.0.2/32"),)
    assert agent.egress.allow_domains == ("*.wikipedia.org", "xn--bcher-kva.example")
    assert agent.egress.internal_hosts[0].host == "api.corp.example"
    assert agent.egress.internal_hosts[0].cidrs == (ipaddress.ip_network("10.20.0.0/16"),)
    assert (agent.tools.search, agent.tools.fetch) == (True, False)
    assert agent.budgets.search.per_step == 5
    assert agent.budgets.search.min_interval_s == 0.5
    assert agent.budgets.fetch == policy.principals["agent"].budgets.fetch
    assert policy.mode_for(agent) == "enforce"


def test_reload_of_a_bad_file_keeps_the_last_good_policy_and_generation(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\nprincipals: {default: {tools: {fetch: true}}}\n")
    outcomes: list[tuple[bool, int]] = []
    holder = PolicyHolder(path, on_reload=lambda ok, generation: outcomes.append((ok, generation)))
    assert holder.current.generation == 1

    path.write_text("version: 1\ndefaults: {mode: audit}\n")
    assert holder.reload() is False
    assert holder.current.generation == 1
    assert holder.current.policy.principals["default"].tools.fetch

    path.write_text("version: 1\nprincipals: {default: {tools: {search: true}}}\n")
    assert holder.reload() is True
    assert holder.current.generation == 2
    assert holder.current.policy.principals["default"].tools.search
    assert holder.poll() is False  # nothing changed since
    assert outcomes == [(False, 1), (True, 2)]


@pytest.mark.parametrize("written", ["off", "'off'", '"off"'], ids=["unquoted", "single-quoted", "double-quoted"])
def test_sni_off_is_accepted_as_the_readme_writes_it(written: str) -> None:
    # YAML 1.1 reads an unquoted `off` as the boolean false (issue 12).
    policy = parse_policy(f"version: 1\nproxy: {{sni: {written}}}\nprincipals: {{default: {{}}}}\n")
    assert policy.proxy.sni == "off"


def test_a_boolean_that_is_not_a_choice_is_still_refused() -> None:
    with pytest.raises(PolicyError, match=r"proxy\.sni must be a non-empty string"):
        parse_policy("version: 1\nproxy: {sni: true}\nprincipals: {default: {}}\n")


@pytest.mark.parametrize("host", ["localhost", "metadata.goog", "searxng"], ids=["localhost", "metadata", "one-label"])
def test_internal_hosts_cannot_open_a_name_serve_refuses_anyway(host: str) -> None:
    text = (
        "version: 1\nprincipals:\n  default:\n    egress:\n"
        f"      internal_hosts: [{{host: {host}, cidrs: [10.0.0.0/8]}}]\n"
    )
    with pytest.raises(PolicyError, match="it cannot be opened"):
        parse_policy(text)


def test_internal_hosts_can_name_an_in_cluster_service() -> None:
    text = (
        "version: 1\nprincipals:\n  default:\n    egress:\n"
        "      internal_hosts: [{host: searxng.tools.svc.cluster.local, cidrs: [10.96.0.0/12]}]\n"
    )
    rule = parse_policy(text).principals["default"].egress.internal_hosts[0]
    assert rule.host == "searxng.tools.svc.cluster.local"
