"""Proxy limits and lifecycle: bounded memory under a stalled reader, tunnel limits, timeouts, drain."""

from __future__ import annotations

import contextlib
import signal
import socket
import ssl
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from tests.harness.certs import TestPKI
from tests.harness.origins import Origin, OriginFactory
from tests.harness.proxy import (
    ProxyProcess,
    proxy_policy,
)

ProxyFactory = Callable[..., ProxyProcess]
PUSH_BYTES = 50 * 1024 * 1024
MAX_RSS_GROWTH_KIB = 30 * 1024


class Pusher:
    """Counts what the origin managed to send, so a test can see when the stream stalls."""

    def __init__(self) -> None:
        self.sent = 0

    def app(self) -> web.Application:
        async def push(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.content_length = PUSH_BYTES
            await response.prepare(request)
            block = b"z" * 65536
            while self.sent < PUSH_BYTES:
                await response.write(block)
                self.sent += len(block)
            return response

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello")

        app = web.Application()
        app.router.add_get("/push", push)
        app.router.add_get("/", hello)
        return app

    def wait_stalled(self, timeout_s: float = 20.0) -> None:
        """Return once the origin has sent nothing new for a second, or everything."""
        deadline = time.monotonic() + timeout_s
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline and self.sent < PUSH_BYTES:
            if self.sent != last:
                last, last_change = self.sent, time.monotonic()
            elif time.monotonic() - last_change > 1.0:
                return
            time.sleep(0.05)


def _open_tunnel(proxy: ProxyProcess, authority: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    return sock


@pytest.mark.parametrize("path", ["tunnel", "forward"])
def test_a_client_that_stops_reading_does_not_grow_gateway_memory_without_bound(
    proxy_factory: ProxyFactory, origins: OriginFactory, path: str
) -> None:
    pusher = Pusher()
    origin = origins.start(pusher.app(), names=("bulk.example.org",), tls=False)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    before = proxy.rss_kib()
    request = f"GET /push HTTP/1.1\r\nHost: bulk.example.org:{origin.port}\r\n\r\n".encode()
    if path == "tunnel":
        sock = _open_tunnel(proxy, f"bulk.example.org:{origin.port}")
        sock.sendall(request)
    else:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(request.replace(b"/push", origin.url("/push").encode(), 1))
    with sock:
        pusher.wait_stalled()
        growth = proxy.rss_kib() - before
    assert pusher.sent < PUSH_BYTES, "the origin pushed everything: nothing applied backpressure"
    assert growth < MAX_RSS_GROWTH_KIB, f"gateway RSS grew by {growth} KiB"


def test_tunnels_over_the_per_principal_limit_get_429_with_retry_after(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    origin = origins.start(Pusher().app(), names=("bulk.example.org",), tls=False)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], proxy={"max_tunnels_per_principal": 1}))
    with _open_tunnel(proxy, f"bulk.example.org:{origin.port}"):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as second:
            second.sendall(f"CONNECT bulk.example.org:{origin.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            answer = second.recv(65536)
        assert answer.startswith(b"HTTP/1.1 429 ")
        assert b"Retry-After: 1" in answer
        assert b"X-Egress-Code: concurrency_limited" in answer


def test_idle_tunnel_is_closed_after_the_idle_timeout(proxy_factory: ProxyFactory, origins: OriginFactory) -> None:
    origin = origins.start(Pusher().app(), names=("bulk.example.org",), tls=False)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], proxy={"idle_timeout_s": 0.5}))
    with _open_tunnel(proxy, f"bulk.example.org:{origin.port}") as sock:
        sock.settimeout(10)
        assert sock.recv(1024) == b""
    lines = proxy.wait_audit(lambda lines: any(line["event"] == "close" for line in lines))
    closes = [line for line in lines if line["event"] == "close"]
    assert closes[-1]["close_reason"] == "idle_timeout"


def test_a_busy_tunnel_is_still_closed_at_its_maximum_lifetime(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    # The tunnel's limits ride on the client connection's deadline (armed at accept for the head
    # deadline): activity must keep the idle limit away but never the lifetime.
    origin = origins.start(Pusher().app(), names=("bulk.example.org",), tls=False)
    proxy = proxy_factory(
        proxy_policy(
            [origin.cidr],
            ports=[origin.port],
            proxy={"idle_timeout_s": 0.4, "max_tunnel_lifetime_s": 1.5, "sni": "off"},
        )
    )
    with _open_tunnel(proxy, f"bulk.example.org:{origin.port}") as sock:
        sock.settimeout(10)
        started = time.monotonic()
        with contextlib.suppress(OSError):
            # One header line trickled byte by byte: activity the origin keeps waiting on.
            sock.sendall(b"GET /push HTTP/1.1\r\nX-Slow: ")
            while time.monotonic() - started < 8:
                sock.sendall(b"a")  # more often than the idle limit
                time.sleep(0.1)
        elapsed = time.monotonic() - started
    assert 1.0 < elapsed < 5.0, elapsed
    lines = proxy.wait_audit(lambda lines: any(line["event"] == "close" for line in lines))
    closes = [line for line in lines if line["event"] == "close"]
    assert closes[-1]["close_reason"] == "max_lifetime"


def _tls_get(tls: ssl.SSLSocket, host: str) -> bytes:
    tls.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while not data.endswith(b"hello"):
        chunk = tls.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_sigterm_drains_an_open_tunnel_then_exits(
    proxy_factory: ProxyFactory, origins: OriginFactory, pki: TestPKI
) -> None:
    origin: Origin = origins.start(Pusher().app(), names=("docs.example.org",), tls=True)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], proxy={"drain_grace_s": 30}))
    sock = _open_tunnel(proxy, f"docs.example.org:{origin.port}")
    tls = pki.client_context().wrap_socket(sock, server_hostname="docs.example.org")
    assert _tls_get(tls, "docs.example.org").endswith(b"hello")

    proxy.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    refused = False
    while time.monotonic() < deadline and not refused:
        try:
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
            time.sleep(0.05)
        except ConnectionRefusedError:
            refused = True
    assert refused, "the listener still accepts after SIGTERM"
    status, readiness = proxy.readyz()
    assert status == 503, "readiness must flip as soon as draining starts"
    assert readiness["checks"]["not_draining"] is False
    assert _tls_get(tls, "docs.example.org").endswith(b"hello"), "the tunnel stopped working during the grace"
    assert proxy.process is not None
    assert proxy.process.poll() is None
    tls.close()
    # Well under the 30 s grace: the process leaves because the last tunnel closed.
    assert proxy.process.wait(10) == 0


def test_sigterm_keeps_tunnels_working_through_the_grace_then_closes_them(
    proxy_factory: ProxyFactory, origins: OriginFactory
) -> None:
    origin = origins.start(Pusher().app(), names=("bulk.example.org",), tls=False)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], proxy={"drain_grace_s": 3}))
    with _open_tunnel(proxy, f"bulk.example.org:{origin.port}") as sock:
        assert proxy.process is not None
        proxy.process.send_signal(signal.SIGTERM)
        # Not closed at once: the tunnel still carries a request and its answer during the grace.
        sock.sendall(b"GET / HTTP/1.1\r\nHost: bulk.example.org\r\n\r\n")
        answer = b""
        while not answer.endswith(b"hello"):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        # Then closed by the gateway when the grace ends, though the client never closed it.
        assert proxy.process.wait(15) == 0
        sock.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1024) == b""
    closes = [line for line in proxy.audit_lines() if line["event"] == "close"]
    assert [line["close_reason"] for line in closes] == ["shutdown"]
