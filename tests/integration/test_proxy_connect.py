"""CONNECT through the proxy with real clients (curl, httpx, raw sockets) to loopback TLS origins."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import random
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from aiohttp import web

from gateway.egress.connect import open_pinned_connection
from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.decide import token_digest
from gateway.vet.urls import vet_host
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, free_port
from tests.harness.origins import Origin, OriginFactory, unanswering_listener
from tests.harness.proxy import (
    ProxyProcess,
    basic,
    open_tunnel,
    proxy_policy,
    raw_exchange,
)

ProxyFactory = Callable[..., ProxyProcess]
TOKEN = "s3cret-token-for-tests"


def _origin_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello from {request.host}")

    async def big(request: web.Request) -> web.StreamResponse:
        total = int(request.query.get("bytes", "0"))
        response = web.StreamResponse()
        response.content_length = total
        await response.prepare(request)
        block = b"x" * 65536
        sent = 0
        while sent < total:
            piece = block[: min(len(block), total - sent)]
            await response.write(piece)
            sent += len(piece)
        return response

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/big", big)
    return app


# One origin for the module. The tests that only read a refusal (no audit lines, no cached
# decision or answer) share a gateway per policy; the others start their own.
@pytest.fixture(scope="module")
def module_tls_origin(module_origins: OriginFactory) -> Origin:
    return module_origins.start(_origin_app(), names=("docs.example.org",), tls=True)


@pytest.fixture
def tls_origin(module_tls_origin: Origin, fake_dns: FakeDNS) -> Origin:
    """The module's origin, its name routed to it again (a test's own origin may have taken it)."""
    fake_dns.add("docs.example.org", module_tls_origin.ip)
    return module_tls_origin


@pytest.fixture(scope="module")
def port_443_proxy(module_proxy_factory: ProxyFactory, module_tls_origin: Origin) -> ProxyProcess:
    """A gateway that opens only port 443, shared by the refusal tests."""
    return module_proxy_factory(proxy_policy([module_tls_origin.cidr], ports=[443]))


@pytest.fixture(scope="module")
def default_ports_proxy(module_proxy_factory: ProxyFactory, module_tls_origin: Origin) -> ProxyProcess:
    """A gateway with the default ports (80, 443), shared by the malformed-authority cases."""
    return module_proxy_factory(proxy_policy([module_tls_origin.cidr]))


def _curl(proxy: ProxyProcess, url: str, pki: TestPKI, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-x", proxy.url, "--cacert", str(pki.ca_path), *extra, url],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def _connect(proxy: ProxyProcess, authority: str, *headers: str) -> tuple[socket.socket, bytes]:
    return open_tunnel(proxy.port, authority, *headers)


def test_https_through_connect_verifies_the_origin_certificate_end_to_end(
    proxy_factory: ProxyFactory, tls_origin: Origin, pki: TestPKI
) -> None:
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port]))
    result = _curl(proxy, tls_origin.url("/"), pki)
    assert result.returncode == 0, (result.stderr, proxy.stderr(), proxy.audit_lines())
    assert result.stdout == f"hello from docs.example.org:{tls_origin.port}"
    lines = proxy.wait_audit(lambda lines: any(line["event"] == "close" for line in lines))
    decisions = [line for line in lines if line["event"] == "decision"]
    assert decisions[0]["decision"] == "allow"
    assert decisions[0]["kind"] == "connect"
    assert decisions[0]["addresses"] == [tls_origin.ip]
    closes = [line for line in lines if line["event"] == "close"]
    assert closes
    assert closes[0]["bytes_up"] > 0
    assert closes[0]["bytes_down"] > 0


def test_httpx_through_connect_with_basic_credentials(
    proxy_factory: ProxyFactory, tls_origin: Origin, pki: TestPKI
) -> None:
    principals = {"agent": {"token_sha256": token_digest(TOKEN), "egress": {"allow_domains": ["docs.example.org"]}}}
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port], principals=principals))
    proxy_url = f"http://agent:{TOKEN}@127.0.0.1:{proxy.port}"
    with httpx.Client(proxy=proxy_url, verify=pki.client_context(), timeout=10) as client:
        response = client.get(tls_origin.url("/"))
    assert response.status_code == 200
    assert response.text.startswith("hello from docs.example.org")
    assert TOKEN not in proxy.audit_path.read_text()


def test_missing_credentials_get_407_with_proxy_authenticate(proxy_factory: ProxyFactory, tls_origin: Origin) -> None:
    principals = {"agent": {"token_sha256": token_digest(TOKEN), "egress": {"allow_domains": ["*"]}}}
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port], principals=principals))
    sock, answer = _connect(proxy, f"docs.example.org:{tls_origin.port}")
    sock.close()
    assert answer.startswith(b"HTTP/1.1 407 ")
    assert b'Proxy-Authenticate: Basic realm="egress-gateway"' in answer
    assert b"X-Egress-Code: auth_required" in answer


def test_wrong_credentials_get_407_and_the_token_is_never_echoed(
    proxy_factory: ProxyFactory, tls_origin: Origin
) -> None:
    principals = {"agent": {"token_sha256": token_digest(TOKEN), "egress": {"allow_domains": ["*"]}}}
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port], principals=principals))
    wrong = "wrong-token-value-123"
    credential = f"Proxy-Authorization: {basic('agent', wrong)}"
    sock, answer = _connect(proxy, f"docs.example.org:{tls_origin.port}", credential)
    rest = sock.recv(65536)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 407 ")
    assert wrong.encode() not in answer + rest
    assert wrong not in proxy.audit_path.read_text()


def test_denied_host_gets_403_policy_denied(proxy_factory: ProxyFactory, tls_origin: Origin) -> None:
    principals = {"default": {"egress": {"allow_domains": ["*.wikipedia.org"]}}}
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port], principals=principals))
    sock, answer = _connect(proxy, f"docs.example.org:{tls_origin.port}")
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"X-Egress-Code: policy_denied" in answer
    assert b'"code":"policy_denied"' in answer
    lines = proxy.wait_audit(lambda lines: any(line.get("decision") == "deny" for line in lines))
    deny = [line for line in lines if line.get("decision") == "deny"]
    assert deny[0]["code"] == "policy_denied"


@pytest.mark.parametrize(
    ("name", "address"),
    [("internal.example.net", "10.1.2.3"), ("metadata.example.net", "169.254.169.254")],
    ids=["private-10", "cloud-metadata"],
)
def test_name_resolving_to_a_denied_address_gets_403_blocked_destination(
    port_443_proxy: ProxyProcess, fake_dns: FakeDNS, name: str, address: str
) -> None:
    fake_dns.add(name, address)
    proxy = port_443_proxy
    sock, answer = _connect(proxy, f"{name}:443")
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"X-Egress-Code: blocked_destination" in answer


def test_denied_port_gets_403(port_443_proxy: ProxyProcess, tls_origin: Origin) -> None:
    proxy = port_443_proxy
    sock, answer = _connect(proxy, "docs.example.org:8443")
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    # The code /v1/fetch gives the same port (docs/reference/error-codes.md): one decision, one code.
    assert b"X-Egress-Code: unsafe_url" in answer


def test_connect_to_an_ip_literal_gets_403_unsafe_url(proxy_factory: ProxyFactory, tls_origin: Origin) -> None:
    # literal_ips: deny (the default) refuses an IP literal even inside allow_cidrs.
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port]))
    sock, answer = _connect(proxy, f"{tls_origin.ip}:{tls_origin.port}")
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"X-Egress-Code: unsafe_url" in answer


def test_connect_to_the_proxys_own_address_is_denied(proxy_factory: ProxyFactory, fake_dns: FakeDNS) -> None:
    fake_dns.add("self.example.net", "127.0.0.1")
    port = free_port()
    # Even a policy that opens 127.0.0.1 and the proxy's port cannot make the proxy dial itself.
    proxy = proxy_factory(proxy_policy(["127.0.0.1/32"], ports=[port]), port)
    sock, answer = _connect(proxy, f"self.example.net:{port}")
    sock.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert b"X-Egress-Code: blocked_destination" in answer


@pytest.mark.parametrize(
    "authority",
    ["docs.example.org", "docs.example.org:0", "docs.example.org:70000", "docs.example.org:44x", "::1:443", ":443"],
    ids=["no-port", "port-zero", "port-too-big", "port-garbage", "unbracketed-ipv6", "empty-host"],
)
def test_malformed_connect_authority_is_refused(default_ports_proxy: ProxyProcess, authority: str) -> None:
    proxy = default_ports_proxy
    answer = raw_exchange(proxy.port, f"CONNECT {authority} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 403 "))


def _tls_through(proxy: ProxyProcess, origin: Origin, pki: TestPKI, server_hostname: str) -> bytes:
    sock, answer = _connect(proxy, f"docs.example.org:{origin.port}")
    assert answer.startswith(b"HTTP/1.1 200 ")
    context = pki.client_context()
    context.check_hostname = False
    with context.wrap_socket(sock, server_hostname=server_hostname) as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: docs.example.org\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = tls.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_sni_matching_the_connect_host_is_allowed(
    proxy_factory: ProxyFactory, tls_origin: Origin, pki: TestPKI
) -> None:
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port], proxy={"sni": "match-if-present"}))
    assert b"hello from" in _tls_through(proxy, tls_origin, pki, "docs.example.org")


def test_sni_naming_another_host_is_denied_and_audited(
    proxy_factory: ProxyFactory, tls_origin: Origin, pki: TestPKI
) -> None:
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port], proxy={"sni": "match-if-present"}))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _tls_through(proxy, tls_origin, pki, "evil.example.com")
    lines = proxy.wait_audit(lambda lines: any(line.get("stage") == "sni" for line in lines))
    sni = [line for line in lines if line.get("stage") == "sni"]
    assert sni[0]["decision"] == "deny"
    assert "evil.example.com" in sni[0]["reason"]


@pytest.mark.parametrize(("reset", "reason"), [(False, "client_closed"), (True, "client_reset")])
def test_a_client_that_leaves_while_the_upstream_is_dialed_still_leaves_both_audit_lines(
    proxy_factory: ProxyFactory, tls_origin: Origin, fake_dns: FakeDNS, reset: bool, reason: str
) -> None:
    # A slow resolver holds the CONNECT in the dial step; the client gives up meanwhile, with a
    # FIN (a half-close: the tunnel opens, then closes) or a reset (the dial is abandoned).
    fake_dns.add("slow.example.org", tls_origin.ip, delay_s=1.0)
    proxy = proxy_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port]))
    authority = f"slow.example.org:{tls_origin.port}"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        time.sleep(0.2)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    lines = proxy.wait_audit(
        lambda lines: any(line["event"] == "close" and line["host"] == "slow.example.org" for line in lines),
        timeout_s=10.0,
    )
    mine = [line for line in lines if line.get("host") == "slow.example.org"]
    assert [line["event"] for line in mine] == ["decision", "close"], lines
    assert mine[0]["decision"] == "allow"
    assert mine[1]["close_reason"] == reason
    assert mine[1]["bytes_up"] == 0
    assert mine[1]["bytes_down"] == 0


def test_egress_gateway_serve_proxies_connect_on_its_proxy_listener(
    gateway_factory: Callable[..., GatewayProcess], tls_origin: Origin, pki: TestPKI
) -> None:
    gateway = gateway_factory(proxy_policy([tls_origin.cidr], ports=[tls_origin.port]))
    result = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-x", gateway.proxy_url, "--cacert", str(pki.ca_path), tls_origin.url("/")],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, (result.stderr, gateway.stderr())
    assert result.stdout.startswith("hello from docs.example.org")
    assert gateway.stop() == 0


# --- the dial's own deadline (gateway/egress/connect.py) ------------------------------------------


def _pinned(port: int) -> PinnedTarget:
    return PinnedTarget(vet_host("127.0.0.1"), port, (ipaddress.ip_address("127.0.0.1"),), 1, 0.0)


async def test_a_dial_that_gets_no_answer_fails_as_timed_out_after_connect_timeout() -> None:
    listener, fillers = unanswering_listener()
    try:
        started = time.monotonic()
        with pytest.raises(GatewayError, match="timed out") as caught:
            await open_pinned_connection(_pinned(listener.getsockname()[1]), asyncio.Protocol, timeout_s=0.2)
        assert caught.value.code == ErrorCode.CONNECT_FAILURE
        assert time.monotonic() - started < 2.0
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0, "the timeout's own cancellation was not undone"
    finally:
        for sock in [listener, *fillers]:
            sock.close()


async def test_a_dial_cancelled_from_outside_stays_cancelled_not_a_timeout() -> None:
    listener, fillers = unanswering_listener()
    try:
        dial = asyncio.ensure_future(
            open_pinned_connection(_pinned(listener.getsockname()[1]), asyncio.Protocol, timeout_s=5.0)
        )
        await asyncio.sleep(0.05)
        dial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dial
    finally:
        for sock in [listener, *fillers]:
            sock.close()


def _unanswering_origin(origins: OriginFactory) -> tuple[socket.socket, list[socket.socket]]:
    """`unanswering_listener` on an origin address of its own (the gateway's own 127.0.0.1 is denied)."""
    return unanswering_listener(origins.next_ip())


@pytest.mark.parametrize("leaves", [False, True], ids=["client-waits", "client-resets-while-dialing"])
def test_a_connect_whose_dial_gets_no_answer_is_refused_after_connect_timeout_with_its_audit_lines(
    proxy_factory: ProxyFactory, origins: OriginFactory, fake_dns: FakeDNS, leaves: bool
) -> None:
    # The proxy bounds its dial with the client connection's deadline-wheel entry, not a loop
    # timer: the attempt must still end at connect_timeout_s, also once the client has gone.
    listener, fillers = _unanswering_origin(origins)
    ip, port = listener.getsockname()
    try:
        fake_dns.add("hang.example.org", ip)
        proxy = proxy_factory(proxy_policy([f"{ip}/32"], ports=[port], proxy={"connect_timeout_s": 0.3}))
        authority = f"hang.example.org:{port}"
        started = time.monotonic()
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        with sock:
            sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            if leaves:
                time.sleep(0.1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 502 "), answer
                assert b"X-Egress-Code: connect_failure" in answer
                assert b"timed out" in answer
                assert time.monotonic() - started < 3.0
        lines = proxy.wait_audit(
            lambda lines: any(line["event"] == "close" and line["host"] == "hang.example.org" for line in lines),
            timeout_s=10.0,
        )
        mine = [line for line in lines if line.get("host") == "hang.example.org"]
        assert [line["event"] for line in mine] == ["decision", "close"], lines
        assert mine[0]["decision"] == "allow"
        assert mine[1]["close_reason"] == "connect_failure"
    finally:
        for each in [listener, *fillers]:
            each.close()


def _random_app(total: int) -> web.Application:
    async def random_bytes(request: web.Request) -> web.StreamResponse:
        seed = int(request.query["seed"])
        response = web.StreamResponse()
        response.content_length = total
        await response.prepare(request)
        await response.write(random.Random(seed).randbytes(total))
        return response

    app = web.Application()
    app.router.add_get("/random", random_bytes)
    return app


def _download_through_tunnel(proxy: ProxyProcess, origin: Origin, seed: int, *, slow: bool) -> bytes:
    """CONNECT, then a plain GET inside the tunnel; the body as received. A slow reader makes the
    gateway's client-side writes back up, so part of each write waits in its transport."""
    authority = f"docs.example.org:{origin.port}"
    sock, answer = _connect(proxy, authority)
    with sock:
        assert b" 200 " in answer.split(b"\r\n", 1)[0], answer
        sock.settimeout(30)
        sock.sendall(f"GET /random?seed={seed} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode())
        received = bytearray()
        while True:
            chunk = sock.recv(16384 if slow else 1 << 20)
            if not chunk:
                break
            received += chunk
            if slow and len(received) % (256 * 1024) < 16384:
                time.sleep(0.02)
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    return body


def test_tunnel_downloads_arrive_intact_when_readers_are_slow_and_fast_at_once(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    # Tunnels share one read buffer for their upstream side; a slow reader's transport keeps a view
    # of it while a fast one reads on. Every byte must still arrive, in order, in both.
    total = 6 * 1024 * 1024
    origin = origins.start(_random_app(total), tls=False)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], proxy={"sni": "off"}))
    results: dict[int, bytes] = {}

    def run(seed: int, slow: bool) -> None:
        results[seed] = _download_through_tunnel(proxy, origin, seed, slow=slow)

    threads = [threading.Thread(target=run, args=(seed, seed % 2 == 0)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    for seed, body in results.items():
        expected = random.Random(seed).randbytes(total)
        assert len(body) == total, (seed, len(body))
        assert hashlib.sha256(body).digest() == hashlib.sha256(expected).digest(), seed
