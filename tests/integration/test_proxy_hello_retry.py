"""A second ClientHello, sent after the server's HelloRetryRequest, meets the SNI rule too.

The origin here plays a TLS 1.3 server that answers every first ClientHello with a
HelloRetryRequest and records what the client sends next; the client passes the SNI check with
its first ClientHello and names another host in the second (RFC 8446 section 4.1.2 says it must
not, but a server may not check). Through the real daemon, the second ClientHello naming another
host never reaches the origin and the tunnel is refused with an `sni` audit line; one naming the
CONNECT host passes unchanged.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator

import pytest

from tests.harness.dns import FakeDNS
from tests.harness.origins import OriginFactory
from tests.harness.proxy import ProxyProcess, proxy_policy, read_head
from tests.harness.scripted_origin import ScriptedOrigin
from tests.harness.tls_records import CHANGE_CIPHER_SPEC, HRR, client_hello

ProxyFactory = Callable[..., ProxyProcess]

NAME = "retry.example.org"


class RetryingServer:
    """Answers the first flight with a HelloRetryRequest; keeps every byte received after it."""

    def __init__(self) -> None:
        self.after_retry = b""

    def __call__(self, origin: ScriptedOrigin, conn: socket.socket, index: int) -> None:
        if not conn.recv(65536):
            return
        conn.sendall(HRR)
        conn.settimeout(3)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                self.after_retry += chunk


@pytest.fixture
def retrying(origins: OriginFactory, fake_dns: FakeDNS) -> Iterator[tuple[ScriptedOrigin, RetryingServer]]:
    server = RetryingServer()
    origin = ScriptedOrigin(origins.next_ip(), server)
    fake_dns.add(NAME, origin.ip)
    yield origin, server
    origin.close()


def _handshake_through(proxy: ProxyProcess, port: int, second_name: str) -> bytes:
    """CONNECT, first ClientHello for NAME, wait for the retry, second ClientHello; what came back."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(f"CONNECT {NAME}:{port} HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n".encode())
        answer = read_head(sock)
        assert answer.startswith(b"HTTP/1.1 200 ")
        sock.sendall(client_hello(NAME))
        received = b""
        while len(received) < len(HRR):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        assert received == HRR
        sock.sendall(CHANGE_CIPHER_SPEC + client_hello(second_name))
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                received += chunk
        return received


def test_second_client_hello_naming_another_host_is_refused_and_never_forwarded(
    proxy_factory: ProxyFactory, retrying: tuple[ScriptedOrigin, RetryingServer]
) -> None:
    origin, server = retrying
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    _handshake_through(proxy, origin.port, "evil.example.com")
    lines = proxy.wait_audit(lambda lines: any(line.get("stage") == "sni" for line in lines))
    sni = [line for line in lines if line.get("stage") == "sni"]
    assert sni[0]["decision"] == "deny"
    assert "second ClientHello" in sni[0]["reason"]
    assert "evil.example.com" in sni[0]["reason"]
    assert b"evil.example.com" not in server.after_retry


def test_second_client_hello_naming_the_connect_host_passes_unchanged(
    proxy_factory: ProxyFactory, retrying: tuple[ScriptedOrigin, RetryingServer]
) -> None:
    origin, server = retrying
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(f"CONNECT {NAME}:{origin.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        read_head(sock)  # the CONNECT's answer, before the ClientHello
        sock.sendall(client_hello(NAME))
        received = b""
        while len(received) < len(HRR):
            received += sock.recv(65536)
        second = CHANGE_CIPHER_SPEC + client_hello(NAME)
        sock.sendall(second)
        for _ in range(50):
            if len(server.after_retry) >= len(second):
                break
            sock.settimeout(0.1)
            with contextlib.suppress(TimeoutError):
                sock.recv(1)
    assert server.after_retry == second
