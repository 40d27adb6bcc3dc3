"""Learn mode end to end: a scripted agent drives a real gateway in report mode (curl through
CONNECT, httpx through plain HTTP, the tools API), `egress-gateway policy suggest` reads the audit
log it wrote, and the suggested policy, enforced by a second gateway, lets the same traffic through
and refuses a host the agent never used."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web

from gateway.policy.decide import token_digest
from tests.conftest import GatewayFactory
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin, OriginFactory

TOKEN = "suggest-agent-token-0123456789"
TLS_NAMES = ("a.docs.example.org", "b.docs.example.org", "pkg.example.net", "new.example.net")
# Resolves into loopback outside the policy's allow_cidrs: the address guard's to refuse.
GUARDED = "internal.example.org"
GUARDED_IP = "127.0.0.250"
# The CONNECT status, then the origin's (000 when the tunnel was refused).
CURL = ("curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_connect} %{http_code}")


def _app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=f"<html><body><p>page of {request.host}</p></body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


def _base_policy(tls: Origin, plain: Origin) -> dict[str, Any]:
    principals = {
        "agent": {
            "token_sha256": token_digest(TOKEN),
            "egress": {"allow_domains": [], "deny_domains": ["blocked.example.net"]},
            "tools": {"search": True, "fetch": True},
            "budgets": {"fetch": {"per_step": 7}},
        },
    }
    return policy_document(
        allow_cidrs=[tls.cidr, plain.cidr],
        ports=[80, 443, tls.port, plain.port],
        principals=principals,
        defaults={"mode": "report"},
    )


def _curl(gateway: GatewayProcess, pki: TestPKI, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CURL, "-x", gateway.proxy_url, "--proxy-user", f"agent:{TOKEN}", "--cacert", str(pki.ca_path), url],
        capture_output=True,
        text=True,
        check=False,
        timeout=20,
    )


def _agent(gateway: GatewayProcess, pki: TestPKI, tls: Origin, plain: Origin) -> dict[str, str]:
    """The scripted agent's traffic; the status each step got."""
    got: dict[str, str] = {}
    for name in ("a.docs.example.org", "b.docs.example.org", "pkg.example.net"):
        result = _curl(gateway, pki, tls.url("/simple/", name=name))
        got[f"connect {name}"] = result.stdout.split()[-1]
    with httpx.Client(proxy=f"http://agent:{TOKEN}@127.0.0.1:{gateway.proxy_port}", timeout=10) as client:
        got["http files.example.com"] = str(client.get(plain.url("/files/x", name="files.example.com")).status_code)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    fetched = httpx.post(
        f"{gateway.api_url}/v1/fetch", json={"url": plain.url("/doc", name="wiki.example.edu")}, headers=headers
    )
    got["fetch wiki.example.edu"] = str(fetched.status_code)
    return got


def _suggest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "suggest", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def origins_pair(origins: OriginFactory, fake_dns: FakeDNS) -> tuple[Origin, Origin]:
    tls = origins.start(_app(), names=TLS_NAMES, tls=True)
    plain = origins.start(_app(), names=("files.example.com", "wiki.example.edu"), tls=False)
    fake_dns.add(GUARDED, GUARDED_IP)
    return tls, plain


def test_suggested_policy_allows_what_report_mode_saw_and_denies_a_new_host(
    gateway_factory: GatewayFactory,
    origins_pair: tuple[Origin, Origin],
    pki: TestPKI,
    tmp_path: Path,
) -> None:
    tls, plain = origins_pair
    observing = gateway_factory(_base_policy(tls, plain), name="observe")
    seen = _agent(observing, pki, tls, plain)
    assert set(seen.values()) == {"200"}, seen
    headers = {"Authorization": f"Bearer {TOKEN}"}
    searched = httpx.post(f"{observing.api_url}/v1/search", json={"query": "learn mode"}, headers=headers)
    assert searched.status_code in (200, 502, 503), searched.text  # no engine is routed: used, not answered
    # What the agent also tried: a port outside the policy (refused in every mode) and an
    # internal address (let through by report mode, never to be suggested).
    assert _curl(observing, pki, f"https://a.docs.example.org:{tls.port + 1}/").stdout == "403 000"
    guarded = _curl(observing, pki, f"https://{GUARDED}:{tls.port}/")
    assert guarded.stdout != "200 200"
    observing.wait_audit(lambda lines: sum(line.get("event") == "decision" for line in lines) >= 8)
    observing.stop()

    base_path = tmp_path / "base.yaml"
    base_path.write_text(yaml.safe_dump(_base_policy(tls, plain), sort_keys=False))
    suggested_path = tmp_path / "suggested.yaml"
    result = _suggest("--from", str(observing.audit_path), "--base", str(base_path), "-o", str(suggested_path))
    assert result.returncode == 0, result.stderr
    review = result.stdout
    suggested = yaml.safe_load(suggested_path.read_text())
    agent = suggested["principals"]["agent"]
    assert agent["egress"]["allow_domains"] == [
        "files.example.com",
        "wiki.example.edu",
        "pkg.example.net",
        "*.docs.example.org",
    ]
    assert agent["egress"]["deny_domains"] == ["blocked.example.net"]
    assert agent["tools"] == {"search": True, "fetch": True}
    assert agent["token_sha256"] == token_digest(TOKEN)
    assert agent["budgets"] == {"fetch": {"per_step": 7}}
    assert suggested["defaults"]["mode"] == "enforce"
    assert sorted(suggested["defaults"]["ports"]) == sorted({tls.port, plain.port})
    # The review: the refusal listed with its count, the guarded name listed with the hint and
    # kept out of the policy, the would-deny lines, and the diff against the base.
    assert f"agent  a.docs.example.org:{tls.port + 1}  unsafe_url  (defaults.ports" in review
    assert (
        f"agent  {GUARDED}:{tls.port}  blocked_destination  (builtin_ranges 127.0.0.0/8; connect)  1 time(s)" in review
    )
    assert "egress.internal_hosts" in review
    assert GUARDED not in suggested_path.read_text()
    assert "would deny (report mode let them through; suggested above, review each): 5" in review
    assert "agent: now allows *.docs.example.org (allow_domains added)" in review
    assert "agent: mode report → enforce" in review

    enforcing = gateway_factory(suggested, name="enforce")
    assert set(_agent(enforcing, pki, tls, plain).values()) == {"200"}
    assert _curl(enforcing, pki, tls.url("/", name="new.example.net")).stdout == "403 000"
    assert _curl(enforcing, pki, f"https://{GUARDED}:{tls.port}/").stdout == "403 000"
    expected = {("new.example.net", "policy_denied"), (GUARDED, "policy_denied")}
    lines = enforcing.wait_audit(lambda lines: expected <= {(line.get("host"), line.get("code")) for line in lines})
    refused = {
        (line.get("host"), line.get("code"))
        for line in lines
        if line.get("event") == "decision" and line.get("decision") == "deny"
    }
    assert refused == expected


def test_without_a_base_no_address_exception_is_known_so_internal_origins_are_only_listed(
    gateway_factory: GatewayFactory, origins_pair: tuple[Origin, Origin], pki: TestPKI
) -> None:
    tls, plain = origins_pair
    observing = gateway_factory(_base_policy(tls, plain), name="observe")
    _agent(observing, pki, tls, plain)
    observing.wait_audit(lambda lines: sum(line.get("event") == "decision" for line in lines) >= 5)
    result = _suggest("--from", str(observing.audit_path), "--principal", "agent", "--since", "1h")
    assert result.returncode == 0, result.stderr
    comments = [line for line in result.stdout.splitlines() if line.startswith("#")]
    policy = yaml.safe_load(result.stdout)
    # The harness's origins live on loopback, opened only by the base's allow_cidrs: without it
    # each is the guard's to refuse, listed for review and never learned as a name or a range.
    assert policy["principals"] == {}
    assert "allow_cidrs" not in policy["defaults"]
    guarded = [line for line in comments if "blocked_destination  (builtin_ranges 127.0.0.0/8" in line]
    assert len(guarded) == 5, comments
    assert any("egress.internal_hosts" in line for line in comments)
    nobody = _suggest("--from", str(observing.audit_path), "--principal", "nobody")
    assert yaml.safe_load(nobody.stdout)["principals"] == {}
    assert "0 decision line(s)" in nobody.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--from", "/nonexistent/audit.log"], "cannot read the audit log /nonexistent/audit.log", id="missing-log"
        ),
        pytest.param(["--from", "{log}", "--since", "last week"], "--since 'last week' is neither", id="bad-since"),
        pytest.param(["--from", "{junk}"], "no audit lines (2 line(s) not audit JSON)", id="not-an-audit-log"),
        pytest.param(
            ["--from", "{log}", "--base", "/nonexistent/policy.yaml"], "/nonexistent/policy.yaml", id="missing-base"
        ),
    ],
)
def test_bad_input_is_one_line_and_a_usage_exit(args: list[str], message: str, tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text('{"time":"2026-12-01T11:00:00.000000Z","schema":1,"event":"decision","decision":"allow"}\n')
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    fill: Callable[[str], str] = lambda arg: arg.format(log=log, junk=junk)  # noqa: E731
    result = _suggest(*map(fill, args))
    assert result.returncode in (1, 2), result
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
