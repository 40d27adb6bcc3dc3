"""Inspected HTTPS through the real daemon (issue 25): real clients trusting the interception CA
only through environment variables, loopback TLS origins with the test PKI, the fake DNS.

Covers: curl and httpx (with VERIFY_X509_STRICT) allowed and refused per request with audit
lines; a host that is not inspected still spliced (the agent sees the origin's own certificate);
fronting inside TLS (host_mismatch); smuggling inside TLS; an h2-only ClientHello; a client that
does not trust the CA; a reload changing the next request on a kept-alive connection; plain HTTP
judged by the same rules."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.inspect.authority import load_authority, mint_leaf
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import shared_for_a_test
from tests.harness.inspection import (
    API,
    InspectingGateway,
    InspectingGatewayFactory,
    InterceptionCA,
    inspect_policy,
    tls_through,
)
from tests.harness.origins import HarnessLoop, Origin, OriginFactory, listening_socket, stop_serving
from tests.harness.proxy import proxy_policy, read_head
from tests.harness.tls_records import CHANGE_CIPHER_SPEC, client_hello, without_key_shares

PLAIN = "splice.example.org"


def _app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {"method": request.method, "path": request.path_qs, "host": request.host, "body": len(body)}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


def _policy(origin: Origin, plain: Origin | None = None, *, reads: str = "read-only") -> dict[str, Any]:
    rules = {
        "access": reads,
        "allow": [{"id": "issue-comments", "methods": ["POST"], "paths": ["/repos/myorg/*/issues"]}],
        "deny": [{"id": "no-admin", "paths": ["/admin/**"]}],
    }
    return inspect_policy(origin, rules, also=[plain] if plain is not None else [])


# The module's tests share one origin, and those that only read share one gateway (`gateway`,
# with its audit lines counted from the test's start); a test that reloads the policy, needs
# another policy or another origin starts its own with `inspecting_gateway`.
@pytest.fixture(scope="module")
def module_api_origin(module_origins: OriginFactory) -> Origin:
    return module_origins.start(_app(), names=(API,))


@pytest.fixture
def api_origin(module_api_origin: Origin, fake_dns: FakeDNS) -> Origin:
    """The module's origin, with its name routed to it again (a test's own origin may have taken it)."""
    fake_dns.add(API, module_api_origin.ip)
    return module_api_origin


@pytest.fixture(scope="module")
def module_gateway(module_inspecting_gateway: InspectingGatewayFactory, module_api_origin: Origin) -> InspectingGateway:
    return module_inspecting_gateway(_policy(module_api_origin))


@pytest.fixture
def gateway(module_gateway: InspectingGateway, api_origin: Origin) -> Iterator[InspectingGateway]:
    """The module's gateway under the default `_policy`, for a test that only reads."""
    with shared_for_a_test(module_gateway) as shared:
        yield shared


def _curl(ca: InterceptionCA, gateway: InspectingGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}", *args],
        env=ca.agent_env(gateway.proxy_url),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def test_curl_allowed_and_refused_per_request_with_audit_lines(
    gateway: InspectingGateway, interception_ca: InterceptionCA, api_origin: Origin
) -> None:
    url = f"https://{API}:{api_origin.port}"
    got = _curl(interception_ca, gateway, f"{url}/repos/myorg/tools?page=2")
    assert got.returncode == 0, got.stderr
    body, status = got.stdout.rsplit("\n", 1)
    assert status == "200"
    assert json.loads(body)["host"] == f"{API}:{api_origin.port}"
    refused = _curl(interception_ca, gateway, "-X", "DELETE", "-D", "-", f"{url}/repos/myorg/tools")
    assert refused.stdout.rsplit("\n", 1)[1] == "403"
    assert "x-egress-code: policy_denied" in refused.stdout.lower()
    refusal_body = refused.stdout.split("\n\n", 1)[1]
    assert "DELETE" in refusal_body
    assert "/repos" not in refusal_body
    assert "inspect[" not in refusal_body
    posted = _curl(interception_ca, gateway, "-d", "x=1", f"{url}/repos/myorg/tools/issues")
    assert posted.stdout.rsplit("\n", 1)[1] == "200"
    lines = gateway.wait_audit(lambda ls: len([x for x in ls if x.get("kind") == "inspect"]) >= 3)
    inspect = [line for line in lines if line.get("kind") == "inspect"]
    allowed = [line for line in inspect if line["decision"] == "allow"]
    denied = [line for line in inspect if line["decision"] == "deny"]
    assert {(line["method"], line["path"], line["status"], line["rule"]) for line in allowed} == {
        ("GET", "/repos/myorg/tools", 200, "inspect[0].access"),
        ("POST", "/repos/myorg/tools/issues", 200, "issue-comments"),
    }
    assert [(line["method"], line["path"], line["code"], line["rule"]) for line in denied] == [
        ("DELETE", "/repos/myorg/tools", "policy_denied", "inspect[0].default_deny")
    ]
    connects = [line for line in lines if line.get("kind") == "connect" and line["event"] == "decision"]
    assert {line["conn"] for line in connects} >= {line["conn"] for line in inspect}
    assert all(line["bytes_down"] > 0 for line in allowed)


def test_httpx_with_strict_verification_through_ssl_cert_file(
    gateway: InspectingGateway, interception_ca: InterceptionCA, api_origin: Origin
) -> None:
    script = (
        "import ssl, sys, httpx\n"
        "ctx = ssl.create_default_context()\n"  # SSL_CERT_FILE decides what it trusts
        "ctx.verify_flags |= ssl.VERIFY_X509_STRICT\n"
        "with httpx.Client(proxy=sys.argv[1], verify=ctx, trust_env=False) as c:\n"
        "    for path in sys.argv[3:]:\n"
        "        r = c.request(path.split(' ')[0], sys.argv[2] + path.split(' ')[1])\n"
        "        print(r.status_code, r.headers.get('x-egress-code'))\n"
    )
    url = f"https://{API}:{api_origin.port}"
    got = subprocess.run(
        [sys.executable, "-c", script, gateway.proxy_url, url, "GET /a", "PUT /a", "GET /admin/x", "HEAD /b"],
        env=interception_ca.agent_env(gateway.proxy_url),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[:4] == ["200 None", "403 policy_denied", "403 policy_denied", "200 None"]
    lines = gateway.wait_audit(lambda ls: len([x for x in ls if x.get("kind") == "inspect"]) >= 4)
    conns = {line["conn"] for line in lines if line.get("kind") == "inspect"}
    assert len(conns) == 1  # one kept-alive connection carried all four


def test_a_host_not_named_in_inspect_is_spliced_untouched(
    inspecting_gateway: InspectingGatewayFactory, origins: OriginFactory, api_origin: Origin, pki: TestPKI
) -> None:
    plain = origins.start(_app(), names=(PLAIN,))
    gateway = inspecting_gateway(_policy(api_origin, plain))
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(f"CONNECT {PLAIN}:{plain.port} HTTP/1.1\r\nHost: {PLAIN}\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        # Only the origin's own CA: a terminated connection would fail this handshake.
        context = pki.client_context()
        with context.wrap_socket(sock, server_hostname=PLAIN) as tls:
            issuer = dict(x[0] for x in tls.getpeercert()["issuer"])  # type: ignore[index, misc]
            tls.sendall(f"POST /x HTTP/1.1\r\nHost: {PLAIN}\r\nContent-Length: 0\r\n\r\n".encode())
            assert tls.recv(4096).startswith(b"HTTP/1.1 200")
    assert "egress-gateway" not in json.dumps(issuer)
    lines = gateway.wait_audit(lambda ls: any(x.get("event") == "close" and x.get("kind") == "connect" for x in ls))
    assert not [line for line in lines if line.get("kind") == "inspect"]
    assert any(line.get("kind") == "connect" and line.get("close_reason") for line in lines)


@pytest.mark.parametrize(
    "host_line",
    ["Host: other.example.org", "Host: api.example.org.evil.test", "Host: api.example.org\r\nHost: other.test"],
    ids=["other-host", "suffix", "two-hosts"],
)
def test_fronting_inside_tls_is_host_mismatch_and_audited(
    gateway: InspectingGateway, interception_ca: InterceptionCA, api_origin: Origin, host_line: str
) -> None:
    with tls_through(gateway, interception_ca, api_origin) as tls:
        tls.sendall(f"GET /a HTTP/1.1\r\n{host_line}\r\n\r\n".encode())
        answer = read_head(tls)
    assert answer.startswith(b"HTTP/1.1 400") or answer.startswith(b"HTTP/1.1 403"), answer
    lines = gateway.wait_audit(lambda ls: any(x.get("code") in ("host_mismatch", "invalid_input") for x in ls))
    codes = {line.get("code") for line in lines if line.get("kind") in ("inspect", "http")}
    assert codes & {"host_mismatch", "invalid_input"}


def test_absolute_form_naming_another_host_is_host_mismatch(
    gateway: InspectingGateway, interception_ca: InterceptionCA, api_origin: Origin
) -> None:
    with tls_through(gateway, interception_ca, api_origin) as tls:
        tls.sendall(f"GET https://other.example.org/a HTTP/1.1\r\nHost: {API}\r\n\r\n".encode())
        answer = read_head(tls)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b"host_mismatch" in answer
    lines = gateway.wait_audit(lambda ls: any(x.get("code") == "host_mismatch" for x in ls))
    line = next(x for x in lines if x.get("code") == "host_mismatch")
    assert line["kind"] == "inspect"
    assert line["host"] == API


def test_smuggling_inside_tls_is_refused(
    gateway: InspectingGateway, interception_ca: InterceptionCA, api_origin: Origin
) -> None:
    with tls_through(gateway, interception_ca, api_origin) as tls:
        tls.sendall(
            f"POST /repos/myorg/x/issues HTTP/1.1\r\nHost: {API}\r\nContent-Length: 4\r\n"
            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin/x HTTP/1.1\r\nHost: api.example.org\r\n\r\n".encode()
        )
        answer = read_head(tls)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    time.sleep(0.2)
    assert not [x for x in gateway.inspect_lines() if x.get("path", "").startswith("/admin")]


def _h2_exchange(gateway: InspectingGateway, ca: InterceptionCA, origin: Origin) -> None:
    with tls_through(gateway, ca, origin, alpn=["h2"]) as tls:
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        if not tls.recv(100):
            raise ConnectionError("closed")


def test_h2_only_client_hello_is_refused_as_inspection_unsupported(
    gateway: InspectingGateway, interception_ca: InterceptionCA, api_origin: Origin
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _h2_exchange(gateway, interception_ca, api_origin)
    lines = gateway.wait_audit(lambda ls: any(x.get("code") == "inspection_unsupported" for x in ls))
    line = next(x for x in lines if x.get("code") == "inspection_unsupported")
    assert line["kind"] == "inspect"
    assert "HTTP/1.1 only" in line["reason"]


def test_a_client_that_does_not_trust_the_ca_is_logged_once_per_host(
    gateway: InspectingGateway, api_origin: Origin
) -> None:
    for _ in range(2):
        got = subprocess.run(
            ["curl", "-sS", "--max-time", "10", "-x", gateway.proxy_url, f"https://{API}:{api_origin.port}/a"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env={"PATH": "/usr/bin:/bin", "CURL_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt"},
        )
        assert got.returncode != 0
    lines = gateway.wait_audit(lambda ls: len([x for x in ls if x.get("code") == "tls_untrusted"]) >= 2)
    untrusted = [x for x in lines if x.get("code") == "tls_untrusted"]
    assert len(untrusted) >= 2
    assert "SSL_CERT_FILE" in untrusted[0]["reason"]
    assert gateway.stderr().count("tls_untrusted") == 1


def test_a_reload_changes_the_next_request_on_a_kept_alive_connection(
    inspecting_gateway: InspectingGatewayFactory, interception_ca: InterceptionCA, api_origin: Origin
) -> None:
    gateway = inspecting_gateway(_policy(api_origin))
    with tls_through(gateway, interception_ca, api_origin) as tls:
        request = f"PUT /repos/x HTTP/1.1\r\nHost: {API}\r\nContent-Length: 0\r\n\r\n".encode()
        tls.sendall(request)
        assert read_head(tls).startswith(b"HTTP/1.1 403")
        gateway.write_policy(_policy(api_origin, reads="read-write"))
        deadline = time.monotonic() + 10
        answer = b""
        while time.monotonic() < deadline:
            time.sleep(0.3)
            tls.sendall(request)
            answer = read_head(tls)
            if answer.startswith(b"HTTP/1.1 200"):
                break
        assert answer.startswith(b"HTTP/1.1 200"), answer
    lines = gateway.wait_audit(lambda ls: any(x.get("kind") == "inspect" and x.get("status") == 200 for x in ls))
    inspect = [line for line in lines if line.get("kind") == "inspect"]
    assert len({line["conn"] for line in inspect}) == 1
    assert inspect[0]["rule"] == "inspect[0].default_deny"
    assert inspect[-1]["rule"] == "inspect[0].access"
    assert inspect[-1]["decision"] == "allow"


def test_plain_http_to_an_inspected_host_is_judged_by_the_same_rules(
    inspecting_gateway: InspectingGatewayFactory, origins: OriginFactory
) -> None:
    plain = origins.start(_app(), names=(API,), tls=False)
    policy = proxy_policy(
        [plain.cidr],
        principals={
            "default": {
                "egress": {"allow_domains": ["*"]},
                "inspect": [{"host": API, "ports": [plain.port], "access": "read-only"}],
            }
        },
        ports=[80, 443, plain.port],
    )
    gateway = inspecting_gateway(policy)
    url = f"http://{API}:{plain.port}/x"
    base = ["curl", "-sS", "--max-time", "10", "-x", gateway.proxy_url, "-o", "/dev/null", "-w", "%{http_code}"]
    assert subprocess.run([*base, url], capture_output=True, text=True, check=False).stdout == "200"
    assert subprocess.run([*base, "-d", "x", url], capture_output=True, text=True, check=False).stdout == "403"
    lines = gateway.wait_audit(lambda ls: any(x.get("rule") == "inspect[0].default_deny" for x in ls))
    assert any(x.get("rule") == "inspect[0].default_deny" and x.get("method") == "POST" for x in lines)


def test_a_second_client_hello_after_hello_retry_naming_another_host_is_refused(
    gateway: InspectingGateway, api_origin: Origin
) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(f"CONNECT {API}:{api_origin.port} HTTP/1.1\r\nHost: {API}\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(without_key_shares(client_hello(API)))  # the gateway must ask again
        retry = sock.recv(65536)
        assert retry[:1] == b"\x16"
        assert retry[5] == 0x02
        sock.sendall(CHANGE_CIPHER_SPEC + client_hello("other.example.org"))
        received = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
    assert b"\x16\x03\x03" not in received[:5]  # no ServerHello for the other name
    lines = gateway.wait_audit(lambda ls: any(x.get("code") == "host_mismatch" for x in ls))
    line = next(x for x in lines if x.get("code") == "host_mismatch")
    assert line["kind"] == "inspect"
    assert line["host"] == API


def test_the_interception_ca_is_never_trusted_upstream(
    inspecting_gateway: InspectingGatewayFactory,
    interception_ca: InterceptionCA,
    origins: OriginFactory,
    harness_loop: HarnessLoop,
    fake_dns: FakeDNS,
    tmp_path: Path,
) -> None:
    # An origin whose certificate the interception CA signed: the agent would trust it, the
    # gateway's upstream must not.
    leaf = mint_leaf(load_authority(interception_ca.cert, interception_ca.key), API)
    (tmp_path / "leaf.pem").write_bytes(leaf.cert_pem + leaf.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "leaf.pem")
    ip = origins.next_ip()
    listener = listening_socket(ip, 0)

    async def serve() -> web.AppRunner:
        runner = web.AppRunner(_app())
        await runner.setup()
        await web.SockSite(runner, listener, ssl_context=context).start()
        return runner

    runner = harness_loop.run(serve())
    try:
        fake_dns.add(API, ip)
        port = listener.getsockname()[1]
        origin = Origin(ip, port, (API,), True, runner, listener)
        gateway = inspecting_gateway(_policy(origin))
        got = _curl(interception_ca, gateway, "-D", "-", f"https://{API}:{port}/a")
        assert got.stdout.rsplit("\n", 1)[1] == "502"
        assert "x-egress-code: connect_failure" in got.stdout.lower()
    finally:
        harness_loop.run(stop_serving(runner, listener))
