"""The inspection commands as an operator runs them (issue 25): `ca init` and `ca export`, `policy
lint` warnings with their lines, `lint --diff` per host and method, `check --method`."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import certifi
from cryptography import x509

from gateway.inspect.authority import load_authority

POLICY = """\
version: 1
principals:
  default:
    egress: {allow_domains: ["*"]}
    inspect:
      - host: github.com
        allow:
          - {id: git-refs, methods: [GET], paths: ["/**/info/refs"], query: {service: git-upload-pack}}
          - {id: git-fetch, methods: [POST], paths: ["/**/git-upload-pack"]}
          - {id: refs-again, methods: [GET], paths: ["/org/**/info/refs"], query: {service: git-upload-pack}}
        deny:
          - {id: git-push, paths: ["/**/git-receive-pack"]}
"""


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def test_ca_init_and_export_write_the_ca_the_key_0600_and_both_bundles(tmp_path: Path) -> None:
    cert, key = tmp_path / "ca.pem", tmp_path / "private" / "ca-key.pem"
    flags = ["--inspect-ca-cert", str(cert), "--inspect-ca-key", str(key)]
    made = _run("ca", "init", *flags, "--days", "30")
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    again = _run("ca", "init", *flags)
    assert again.returncode == 2
    assert "already exists" in again.stderr
    exported = _run(
        "ca", "export", *flags, "--ca-out", str(tmp_path / "ca-only.pem"), "--bundle-out", str(tmp_path / "b.pem")
    )
    assert exported.returncode == 0, exported.stderr
    ca_only = x509.load_pem_x509_certificates((tmp_path / "ca-only.pem").read_bytes())
    assert ca_only == [load_authority(cert, key).certificate]
    # Counted, not parsed: one of certifi's roots has a serial cryptography warns about.
    bundle = (tmp_path / "b.pem").read_bytes()
    roots = Path(certifi.where()).read_bytes()
    assert bundle.count(b"BEGIN CERTIFICATE") == roots.count(b"BEGIN CERTIFICATE") + 1
    assert bundle.endswith(cert.read_bytes())


def test_policy_lint_warns_with_the_line_and_lint_diff_names_host_and_method(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text(POLICY)
    linted = _run("policy", "lint", str(old))
    assert linted.returncode == 0, linted.stderr
    assert f"{old}:10: warning: principals.default.inspect: rule refs-again is shadowed by git-refs" in linted.stdout
    new = tmp_path / "new.yaml"
    new.write_text(
        POLICY.replace('          - {id: git-push, paths: ["/**/git-receive-pack"]}\n', "").replace(
            "        deny:\n", ""
        )
    )
    diff = _run("policy", "lint", "--diff", str(old), str(new))
    assert diff.returncode == 0, diff.stderr
    assert "default: github.com POST opens /**/git-receive-pack (deny removed)" in diff.stdout


def test_check_with_a_method_names_the_rule(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    refused = _run("check", "--policy", str(policy), "--method", "POST", "https://github.com/o/r.git/git-receive-pack")
    assert refused.returncode == 3
    result = json.loads(refused.stdout)
    assert (result["allowed"], result["code"], result["rule"], result["verdict"]) == (
        False,
        "policy_denied",
        "git-push",
        "deny",
    )
