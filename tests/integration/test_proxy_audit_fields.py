"""The proxy's audit lines carry the connection id, the client's address, the rule that decided,
and for plain HTTP the method, the path without its query and the upstream status; plain HTTP
requests get a close line like tunnels; the id reaches the client as X-Egress-Id."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Any

import httpx
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.certs import TestPKI
from tests.harness.origins import OriginFactory
from tests.harness.proxy import ProxyProcess, proxy_policy, read_head

ProxyFactory = Callable[..., ProxyProcess]


async def _hello(request: web.Request) -> web.Response:
    if request.path.startswith("/missing"):
        # An origin that sets the header itself must not be able to pose as the gateway's id.
        return web.Response(status=404, text="no such page", headers={"X-Egress-Id": "forged-by-origin"})
    return web.Response(text="hello")


def _app() -> web.Application:
    app = web.Application()
    app.router.add_get("/{tail:.*}", _hello)
    return app


def _lines_of(lines: list[dict[str, Any]], conn: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("conn") == conn]


def test_plain_http_lines_share_a_conn_and_carry_client_method_and_path_without_query(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    origin = origins.start(_app(), names=("plain.example.org",), tls=False)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        assert client.get(origin.url("/docs/page?api_key=hunter2")).status_code == 200
    lines = proxy.wait_audit(lambda lines: any(line.get("event") == "close" for line in lines))
    decision = next(line for line in lines if line.get("event") == "decision" and line.get("kind") == "http")
    close = next(line for line in lines if line.get("event") == "close")
    assert decision["conn"] == close["conn"]
    assert decision["client_ip"] == close["client_ip"] == "127.0.0.1"
    assert isinstance(decision["client_port"], int)
    assert decision["client_port"] > 0
    assert decision["method"] == "GET"
    assert decision["path"] == "/docs/page"
    assert all("hunter2" not in str(line) for line in lines)


def test_a_forwarded_response_carries_the_id_and_its_close_line_the_status_bytes_and_address(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    origin = origins.start(_app(), names=("plain.example.org",), tls=False)
    principals = {"default": {"egress": {"deny_domains": ["deny.example.org"], "allow_domains": ["*.example.org"]}}}
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], principals=principals))
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        found = client.get(origin.url("/page"))
        missing = client.get(origin.url("/missing/page?token=abc"))
    assert (found.status_code, missing.status_code) == (200, 404)
    conn = found.headers["X-Egress-Id"]
    assert missing.headers.get_list("X-Egress-Id") == [conn], "one id per client connection, never the origin's"
    lines = proxy.wait_audit(
        lambda lines: len([line for line in _lines_of(lines, conn) if line["event"] == "close"]) == 2
    )
    decisions = [line for line in _lines_of(lines, conn) if line["event"] == "decision"]
    closes = [line for line in _lines_of(lines, conn) if line["event"] == "close"]
    assert [(line["rule"], line["rule_pattern"]) for line in decisions] == [("allow_domains[0]", "*.example.org")] * 2
    assert [(line["status"], line["method"], line["path"]) for line in closes] == [
        (200, "GET", "/page"),
        (404, "GET", "/missing/page"),
    ]
    for close in closes:
        assert close["kind"] == "http"
        assert (close["close_reason"], close["outcome"]) == ("done", "ok")
        assert close["address"] == origin.ip
        assert (close["rule"], close["generation"]) == ("allow_domains[0]", decisions[0]["generation"])
        assert close["bytes_down"] > 0
        assert close["bytes_up"] == 0
        assert close["duration_s"] >= 0
        assert close["client_ip"] == "127.0.0.1"


def test_every_proxy_decision_names_its_rule(proxy_factory: ProxyFactory, origins: OriginFactory, pki: TestPKI) -> None:
    origin = origins.start(_app(), names=("docs.example.org", "deny.example.org"), tls=False)
    principals = {"default": {"egress": {"deny_domains": ["deny.example.org"], "allow_domains": ["docs.example.org"]}}}
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], principals=principals))
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        assert client.get(f"http://deny.example.org:{origin.port}/").status_code == 403
        assert client.get(f"http://other.example.org:{origin.port}/").status_code == 403
        assert client.get(f"http://docs.example.org:{origin.port + 1}/").status_code == 403
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        authority = f"docs.example.org:{origin.port}".encode()
        sock.sendall(b"CONNECT " + authority + b" HTTP/1.1\r\nHost: " + authority + b"\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    lines = proxy.wait_audit(lambda lines: any(line.get("kind") == "connect" for line in lines))
    rules = {
        (line["kind"], line["host"]): (line["decision"], line["rule"], line.get("rule_pattern"))
        for line in lines
        if line["event"] == "decision"
    }
    assert rules == {
        ("http", "deny.example.org"): ("deny", "deny_domains[0]", "deny.example.org"),
        ("http", "other.example.org"): ("deny", "default_deny", None),
        ("http", "docs.example.org"): ("deny", "defaults.ports", str(origin.port)),
        ("connect", "docs.example.org"): ("allow", "allow_domains[0]", "docs.example.org"),
    }


def test_audit_http_paths_off_leaves_the_path_out_of_every_line(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(_app(), names=("plain.example.org",), tls=False)
    gateway = gateway_factory(proxy_policy([origin.cidr], ports=[origin.port]), env={"EGRESS_AUDIT_HTTP_PATHS": "off"})
    with httpx.Client(proxy=gateway.proxy_url, timeout=10) as client:
        assert client.get(origin.url("/private/report-2026")).status_code == 200
    lines = gateway.wait_audit(lambda lines: any(line.get("event") == "close" for line in lines))
    mine = [line for line in lines if line.get("kind") == "http"]
    assert {line["event"] for line in mine} == {"decision", "close"}
    assert all("path" not in line for line in mine)
    assert all(line["method"] == "GET" for line in mine)
    assert "report-2026" not in gateway.audit_path.read_text()


def test_a_refusal_echoes_the_conn_of_its_audit_line(proxy_factory: ProxyFactory, origins: OriginFactory) -> None:
    origin = origins.start(_app(), names=("plain.example.org",), tls=False)
    principals = {"default": {"egress": {"allow_domains": ["only.example.com"]}}}
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], principals=principals))
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        response = client.get(origin.url("/"))
    assert response.status_code == 403
    conn = response.headers["X-Egress-Id"]
    lines = proxy.wait_audit(lambda lines: bool(_lines_of(lines, conn)))
    (denial,) = _lines_of(lines, conn)
    assert denial["decision"] == "deny"
    assert denial["client_ip"] == "127.0.0.1"


def test_connect_answers_with_the_conn_that_its_decision_and_close_lines_share(
    proxy_factory: ProxyFactory, origins: OriginFactory, pki: TestPKI
) -> None:
    origin = origins.start(_app(), names=("docs.example.org",), tls=True)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        authority = f"docs.example.org:{origin.port}".encode()
        sock.sendall(b"CONNECT " + authority + b" HTTP/1.1\r\nHost: " + authority + b"\r\n\r\n")
        head = read_head(sock)
        assert b"\r\n\r\n" in head, head
        status, *fields = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        assert status.startswith("HTTP/1.1 200")
        conn = dict(field.split(": ", 1) for field in fields)["X-Egress-Id"]
        context = ssl.create_default_context(cafile=str(pki.ca_path))
        with context.wrap_socket(sock, server_hostname="docs.example.org") as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nHost: docs.example.org\r\nConnection: close\r\n\r\n")
            assert b"hello" in b"".join(iter(lambda: tls.recv(4096), b""))
    lines = proxy.wait_audit(lambda lines: any(line.get("event") == "close" for line in _lines_of(lines, conn)))
    mine = _lines_of(lines, conn)
    assert {line["event"] for line in mine} == {"decision", "close"}
    close = next(line for line in mine if line["event"] == "close")
    assert close["address"] == origin.ip
    assert (close["rule"], close["rule_pattern"], close["generation"]) == ("allow_domains[0]", "*", 1)
    assert all(line["client_ip"] == "127.0.0.1" for line in mine)


def test_a_failed_credential_names_the_claimed_principal_and_never_the_token(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    origin = origins.start(_app(), names=("plain.example.org",), tls=False)
    principals = {"agent": {"token_sha256": "0" * 64, "egress": {"allow_domains": ["*"]}}}
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], principals=principals))
    with httpx.Client(proxy=f"http://agent:wrong-token-x@127.0.0.1:{proxy.port}", timeout=10) as client:
        response = client.get(origin.url("/"))
    assert response.status_code == 407
    conn = response.headers["X-Egress-Id"]
    lines = proxy.wait_audit(lambda lines: bool(_lines_of(lines, conn)))
    (denial,) = _lines_of(lines, conn)
    assert denial["code"] == "auth_required"
    assert denial["claimed_principal"] == "agent"
    assert "principal" not in denial
    assert all("wrong-token-x" not in str(line) for line in lines)


def test_a_burst_of_failed_credentials_is_counted_in_a_metric_while_the_log_aggregates_it(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    origin = origins.start(_app(), names=("plain.example.org",), tls=False)
    principals = {"agent": {"token_sha256": "0" * 64, "egress": {"allow_domains": ["*"]}}}
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], principals=principals))
    for attempt in range(6):
        with httpx.Client(proxy=f"http://agent:guess-{attempt}@127.0.0.1:{proxy.port}", timeout=10) as client:
            assert client.get(origin.url("/")).status_code == 407
    metrics = httpx.get(f"{proxy.admin_url}/metrics", timeout=5).text
    assert 'egress_gateway_auth_failures_total{kind="http"} 6.0' in metrics
    lines = proxy.wait_audit(lambda lines: any(line.get("code") == "auth_required" for line in lines))
    denials = [line for line in lines if line.get("code") == "auth_required"]
    assert denials
    assert len(denials) < 6, "identical failures are aggregated in the log; the metric still counts each"
    assert all(line["rule"] == "credentials" for line in denials)
