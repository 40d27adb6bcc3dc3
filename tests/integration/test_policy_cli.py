"""`policy lint` over several files and `--diff OLD NEW`, and `policy hash-token`, through the
real CLI (issue 16)."""

from __future__ import annotations

from pathlib import Path

from gateway.policy.decide import token_digest
from tests.harness.cli import run_cli

OLD = """version: 1
defaults: {ports: [443]}
principals:
  default: {egress: {allow_domains: ["*.wikipedia.org"]}, tools: {fetch: true}}
  ci:
    token_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    egress: {allow_domains: ["github.com"]}
"""
NEW = """version: 1
defaults: {ports: [443, 8443]}
principals:
  default:
    egress: {allow_domains: ["*.wikipedia.org", "*.github.com"], deny_domains: ["gist.github.com"]}
    tools: {fetch: true, search: true}
  research: {egress: {allow_domains: ["*"]}}
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_lint_takes_several_files_and_reports_each(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", OLD)
    bad = write(tmp_path, "bad.yaml", "version: 1\ndefaults: {mode: sideways}\n")
    run = run_cli("policy", "lint", good, bad)
    assert run.returncode == 1
    assert f"{good}: valid, 2 principal(s)" in run.stdout
    assert f"{bad}:2:" in run.stderr


def test_lint_diff_prints_what_the_new_policy_allows_or_denies_principal_by_principal(tmp_path: Path) -> None:
    old, new = write(tmp_path, "old.yaml", OLD), write(tmp_path, "new.yaml", NEW)
    run = run_cli("policy", "lint", "--diff", old, new)
    assert run.returncode == 0, run.stderr
    changes = [line.strip() for line in run.stdout.splitlines() if line.startswith("  ")]
    assert changes == [
        "every principal: now allows 8443 (ports added)",
        "ci: removed (its credential stops working)",
        "default: now allows *.github.com (allow_domains added)",
        "default: now denies gist.github.com (deny_domains added)",
        "default: now allows web_search (tools.search)",
        "research: new principal",
        "research: now allows * (allow_domains added)",
    ]
    same = run_cli("policy", "lint", "--diff", old, old)
    assert same.returncode == 0
    assert "no change" in same.stdout


def test_lint_diff_of_an_invalid_file_is_invalid(tmp_path: Path) -> None:
    old, bad = write(tmp_path, "old.yaml", OLD), write(tmp_path, "bad.yaml", "version: 2\n")
    run = run_cli("policy", "lint", "--diff", old, bad)
    assert run.returncode == 1
    assert "change" not in run.stdout


def test_hash_token_reads_stdin_and_prints_the_policy_line() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    def hash_token(stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "policy", "hash-token"],
            input=stdin, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    run = hash_token("s3cret-token\n")
    assert run.returncode == 0, run.stderr
    assert run.stdout == f'token_sha256: "{token_digest("s3cret-token")}"\n'
    assert "s3cret-token" not in run.stdout
    assert hash_token("").returncode == 2
    assert hash_token(" padded \n").returncode == 2
