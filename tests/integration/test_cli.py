"""The CLI contract of DESIGN.md section 3, through the real `python -m gateway` process.

`check` resolves through the fake DNS (EGRESS_NAMESERVERS) and never connects, so a name routed
to a public-looking address sends no packet anywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_cli

CHECK_KEYS = {"allowed", "code", "reason", "host", "addresses"}


def check(env: dict[str, str], url: str, *flags: str) -> tuple[int, dict[str, Any]]:
    run = run_cli("check", *flags, url, env=env)
    assert run.returncode in {0, 3}, run.stderr
    result = json.loads(run.stdout)
    assert isinstance(result, dict)
    assert set(result) == CHECK_KEYS
    return run.returncode, result


def test_check_allowed_name_prints_the_contract_object_and_exits_0(check_env: dict[str, str]) -> None:
    code, result = check(check_env, "https://docs.cli-test.example/guide")
    assert code == 0
    assert result["allowed"] is True
    assert result["code"] is None
    assert result["host"] == "docs.cli-test.example"
    assert sorted(result["addresses"]) == ["2606:2800:220:1:248:1893:25c8:1946", "93.184.216.34"]
    assert isinstance(result["reason"], str)
    assert result["reason"]


def test_check_with_a_named_principal_uses_its_rules(check_env: dict[str, str]) -> None:
    assert check(check_env, "https://docs.cli-test.example/", "--principal", "narrow")[0] == 0
    code, result = check(check_env, "https://en.wikipedia.org/", "--principal", "narrow")
    assert code == 3
    assert result["code"] == "policy_denied"


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://localhost/", "unsafe_url"),
        ("http://metadata.google.internal/computeMetadata/v1/", "unsafe_url"),
        ("http://api.ns.svc.cluster.local/", "unsafe_url"),
        ("http://169.254.169.254/latest/meta-data/", "unsafe_url"),
        ("http://0xa9fea9fe/", "unsafe_url"),
        ("http://7147006462/", "unsafe_url"),
        ("not a url", "unsafe_url"),
        ("ftp://docs.cli-test.example/", "unsafe_url"),
        ("http://user:pw@docs.cli-test.example/", "unsafe_url"),
        ("https://docs.cli-test.example:8443/", "unsafe_url"),
        ("https://metadata-alias.cli-test.example/", "blocked_destination"),
        ("https://nat64.cli-test.example/", "blocked_destination"),
        ("https://mixed.cli-test.example/", "blocked_destination"),
        ("https://www.blocked.example/", "policy_denied"),
        ("https://nxdomain.cli-test.example/", "dns_failure"),
    ],
    ids=[
        "localhost",
        "gcp-metadata-name",
        "cluster-service",
        "metadata-literal",
        "hex-metadata-literal",
        "overflowing-literal",
        "unparsable",
        "ftp-scheme",
        "userinfo",
        "port-not-allowed",
        "name-to-metadata",
        "name-to-nat64-metadata",
        "public-and-private-answer",
        "deny-domains",
        "nxdomain",
    ],
)
def test_check_denied_url_prints_the_code_and_exits_3(check_env: dict[str, str], url: str, code: str) -> None:
    exit_code, result = check(check_env, url)
    assert exit_code == 3
    assert result["allowed"] is False
    assert result["code"] == code
    assert result["reason"]


def test_check_reports_the_metadata_address_a_name_resolves_to(check_env: dict[str, str]) -> None:
    _, result = check(check_env, "https://metadata-alias.cli-test.example/")
    assert "169.254.169.254" in result["reason"]
    assert result["host"] == "metadata-alias.cli-test.example"


def test_check_unknown_principal_is_a_usage_error_naming_the_known_ones(check_env: dict[str, str]) -> None:
    # A principal the policy does not have is a mistake in the command (exit 2), not a denial.
    result = run_cli("check", "--principal", "nobody", "https://docs.cli-test.example/", env=check_env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "egress-gateway: no principal 'nobody' in the policy (it has: default, narrow)\n"


def test_check_in_report_mode_allows_and_names_the_would_be_denial(tmp_path: Path, check_env: dict[str, str]) -> None:
    policy = tmp_path / "report.yaml"
    policy.write_text(
        'version: 1\ndefaults: {mode: report}\nprincipals: {default: {egress: {allow_domains: ["x.example"]}}}\n'
    )
    code, result = check({**check_env, "EGRESS_POLICY": str(policy)}, "https://docs.cli-test.example/")
    assert code == 0
    assert result["allowed"] is True
    assert result["code"] == "policy_denied"
    assert result["reason"].startswith("report mode, would deny")


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--no-such-flag", "https://example.com/"],
        ["check"],
        ["frobnicate"],
        [],
        ["policy"],
        ["policy", "lint"],
    ],
    ids=[
        "unknown-flag",
        "missing-url",
        "unknown-command",
        "no-command",
        "policy-without-subcommand",
        "lint-without-file",
    ],
)
def test_bad_flags_exit_2(args: list[str]) -> None:
    run = run_cli(*args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert "usage:" in run.stderr


def test_policy_token_prints_a_token_and_its_matching_sha256_line() -> None:
    run = run_cli("policy", "token")
    assert run.returncode == 0
    lines = run.stdout.splitlines()
    assert len(lines) == 2
    token_line = re.fullmatch(r"token: (\S{32,})", lines[0])
    hash_line = re.fullmatch(r'token_sha256: "([0-9a-f]{64})"', lines[1])
    assert token_line is not None, lines[0]
    assert hash_line is not None, lines[1]
    assert hashlib.sha256(token_line.group(1).encode()).hexdigest() == hash_line.group(1)


def test_policy_token_is_new_each_time() -> None:
    assert run_cli("policy", "token").stdout != run_cli("policy", "token").stdout


def test_policy_token_line_pastes_into_a_valid_policy(tmp_path: Path) -> None:
    hash_line = run_cli("policy", "token").stdout.splitlines()[1]
    policy = tmp_path / "pasted.yaml"
    policy.write_text(f"version: 1\nprincipals:\n  agent:\n    {hash_line}\n")
    run = run_cli("policy", "lint", str(policy))
    assert run.returncode == 0, run.stderr


def test_policy_lint_valid_file_exits_0() -> None:
    run = run_cli("policy", "lint", "policies/default.yaml")
    assert run.returncode == 0
    assert run.stdout == "policies/default.yaml: valid, 1 principal(s)\n"


def test_policy_lint_invalid_file_exits_1_with_every_file_line_reason(tmp_path: Path) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text("version: 1\ndefaults:\n  mode: audit\n  ports: [70000]\n")
    run = run_cli("policy", "lint", str(policy))
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        f"{policy}:3: defaults.mode must be one of enforce, report, got 'audit'",
        f"{policy}:4: defaults.ports must be between 1 and 65535, got 70000",
        f"{policy}:4: defaults.ports must name at least one port",
    ]


def test_policy_lint_missing_file_exits_1(tmp_path: Path) -> None:
    run = run_cli("policy", "lint", str(tmp_path / "absent.yaml"))
    assert run.returncode == 1
    assert "cannot read the policy file" in run.stderr


def test_check_names_the_host_as_written_when_the_guard_refuses_it(check_env: dict[str, str]) -> None:
    result = run_cli("check", "http://0x7f.1/", env=check_env)
    assert result.returncode == 3
    assert json.loads(result.stdout)["host"] == "0x7f.1"
