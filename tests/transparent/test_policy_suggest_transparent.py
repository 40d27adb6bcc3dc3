"""Learn mode on transparent interception: an agent with no proxy settings (curl over redirected
TCP, DNS through the listener) in a real pod namespace, `policy suggest` on the audit log the
gateway wrote, and the suggestion reloaded into the same gateway: the same traffic passes, a name
the base allowed but the agent never used no longer does."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.transparent.conftest import transparent_policy
from tests.transparent.netns import ORIGIN_V4, OTHER_V4, Topology

REPO = Path(__file__).resolve().parents[2]
SUGGEST = (sys.executable, "-m", "gateway", "policy", "suggest")


def _https(pod: Topology, name: str, address: str) -> subprocess.CompletedProcess[str]:
    return pod.curl(f"https://{name}/", "--resolve", f"{name}:443:{address}", "-o", "/dev/null", "-w", "%{http_code}")


def test_a_suggestion_from_redirected_traffic_allows_it_again_and_nothing_else(pod: Topology, tmp_path: Path) -> None:
    assert pod.gateway is not None
    # The agent (uid of the `research` principal): HTTPS and HTTP by name, a DNS lookup, a name
    # its policy refuses, and a name that resolves to a private address.
    assert _https(pod, "docs.example.org", ORIGIN_V4).stdout == "200"
    plain = pod.curl("http://docs.example.org/p", "--resolve", f"docs.example.org:80:{ORIGIN_V4}")
    assert plain.returncode == 0, plain.stderr
    assert pod.dig("docs.example.org")["rcode"] == "NOERROR"
    assert _https(pod, "code.example.net", OTHER_V4).returncode != 0
    assert pod.dig("private.example.org")["answers"] == []
    pod.wait_audit(lambda line: line.get("host") == "private.example.org" and line.get("kind") == "dns")
    time.sleep(0.05)  # the audit writer's batch (10 ms)

    gateway_dir = pod.gateway_dir
    suggested_path = tmp_path / "suggested.yaml"
    args = (
        "--from",
        str(gateway_dir / "audit.log"),
        "--principal",
        "research",
        "--base",
        str(gateway_dir / "policy.yaml"),
    )
    result = subprocess.run(
        [*SUGGEST, *args, "-o", str(suggested_path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    suggested = yaml.safe_load(suggested_path.read_text())
    research = suggested["principals"]["research"]
    assert research["egress"]["allow_domains"] == ["docs.example.org"]
    # The other principals and the transparent section stay as the base had them.
    assert suggested["principals"]["coder"] == {"egress": {"allow_domains": ["code.example.net"]}}
    assert suggested["transparent"]["destination"] == "follow-name"
    review = result.stdout
    assert "research  code.example.net:443  policy_denied  (default_deny; transparent)" in review
    assert "research  private.example.org  blocked_destination  (builtin_ranges" in review
    assert "research: now denies many.example.org (allow_domains removed)" in review
    assert "research: now denies private.example.org (allow_domains removed)" in review

    pod.write_policy(suggested)
    pod.gateway.send_signal(signal.SIGHUP)
    try:
        # The reload is asynchronous to the signal: wait until the unused name is refused.
        deadline = time.monotonic() + 10
        while pod.dig("many.example.org")["rcode"] == "NOERROR" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pod.dig("many.example.org")["rcode"] != "NOERROR"
        assert pod.dig("docs.example.org")["rcode"] == "NOERROR"
        assert _https(pod, "docs.example.org", ORIGIN_V4).stdout == "200"
        again = pod.curl("http://docs.example.org/p", "--resolve", f"docs.example.org:80:{ORIGIN_V4}")
        assert again.stdout == f"origin={ORIGIN_V4} host=docs.example.org\n"
        assert _https(pod, "code.example.net", OTHER_V4).returncode != 0
    finally:
        pod.write_policy(transparent_policy())
        pod.gateway.send_signal(signal.SIGHUP)
