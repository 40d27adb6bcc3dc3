"""The gateway's command line run for real (`python -m gateway ...`), for the CLI tests.

Owns `run_cli` (the process with none of the caller's `EGRESS_*` settings but the ones given) and
`check_env`, a module-scoped fixture: a policy file and the fake DNS names `check` resolves, so
`check` answers without a packet leaving the machine. No tests live here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.dns import FakeDNS

ROOT = Path(__file__).resolve().parents[2]


POLICY = """
version: 1
defaults: {ports: [80, 443]}
principals:
  default:
    egress: {allow_domains: ["*"], deny_domains: ["*.blocked.example"]}
  narrow:
    token_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    egress: {allow_domains: ["docs.cli-test.example"]}
"""


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EGRESS_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**base, **(env or {})},
    )


@pytest.fixture(scope="module")
def check_env(tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS) -> dict[str, str]:
    policy = tmp_path_factory.mktemp("cli") / "policy.yaml"
    policy.write_text(POLICY)
    fake_dns.add("docs.cli-test.example", "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946")
    fake_dns.add("www.blocked.example", "93.184.216.34")
    fake_dns.add("metadata-alias.cli-test.example", "169.254.169.254")
    fake_dns.add("mixed.cli-test.example", "93.184.216.34", "10.0.0.7")
    fake_dns.add("nat64.cli-test.example", "64:ff9b::a9fe:a9fe")
    return {"EGRESS_POLICY": str(policy), "EGRESS_NAMESERVERS": fake_dns.nameserver}
