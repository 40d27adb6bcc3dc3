"""Live permission: a policy reload that denies a destination closes what is open to it.

Through the real daemon: a CONNECT tunnel and a plain-HTTP response in flight to a host the new
policy denies are closed at the reload (audit close reason `policy_revoked`), long before any
idle timeout or tunnel lifetime, while a tunnel to a host that stays allowed keeps working.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness.dns import FakeDNS
from tests.harness.origins import OriginFactory
from tests.harness.proxy import ProxyProcess, open_tunnel, proxy_policy
from tests.harness.scripted_origin import ScriptedOrigin

ProxyFactory = Callable[..., ProxyProcess]

REVOKED = "revoked.example.org"
KEPT = "kept.example.org"
CLOSE_WAIT_S = 10.0  # far below the idle timeout (300 s) and tunnel lifetime (3600 s) in force


def _echo(origin: ScriptedOrigin, conn: socket.socket, index: int) -> None:
    while chunk := conn.recv(65536):
        if chunk.startswith(b"GET "):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"s" * 100)
            time.sleep(60)  # the rest of the body never comes
            return
        conn.sendall(chunk)


@pytest.fixture
def echo_origin(origins: OriginFactory, fake_dns: FakeDNS) -> Iterator[ScriptedOrigin]:
    origin = ScriptedOrigin(origins.next_ip(), _echo)
    fake_dns.add(REVOKED, origin.ip)
    fake_dns.add(KEPT, origin.ip)
    yield origin
    origin.close()


def _policy(origin: ScriptedOrigin, allowed: list[str]) -> dict[str, Any]:
    principals = {"default": {"egress": {"allow_domains": allowed}}}
    return proxy_policy([origin.cidr], ports=[origin.port], principals=principals, proxy={"sni": "off"})


def _tunnel(proxy: ProxyProcess, host: str, port: int) -> socket.socket:
    sock, answer = open_tunnel(proxy.port, f"{host}:{port}", timeout_s=CLOSE_WAIT_S)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    return sock


def _echoes(sock: socket.socket) -> bool:
    sock.sendall(b"ping")
    return sock.recv(4) == b"ping"


def _wait_closed_by_peer(sock: socket.socket) -> None:
    """Read until the gateway closes the socket; a socket still open after CLOSE_WAIT_S raises
    TimeoutError, which fails the test."""
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(65536):
            pass


def _reload(proxy: ProxyProcess, policy: dict[str, Any]) -> None:
    proxy.write_policy(policy)
    proxy.signal(signal.SIGHUP)


def test_reload_denying_a_destination_closes_its_open_tunnel_and_keeps_the_others(
    proxy_factory: ProxyFactory, echo_origin: ScriptedOrigin
) -> None:
    proxy = proxy_factory(_policy(echo_origin, [REVOKED, KEPT]))
    revoked, kept = _tunnel(proxy, REVOKED, echo_origin.port), _tunnel(proxy, KEPT, echo_origin.port)
    with revoked, kept:
        assert _echoes(revoked)
        assert _echoes(kept)
        _reload(proxy, _policy(echo_origin, [KEPT]))
        _wait_closed_by_peer(revoked)
        assert _echoes(kept)
    lines = proxy.wait_audit(lambda lines: any(line.get("close_reason") == "policy_revoked" for line in lines))
    revoked_lines = [line for line in lines if line.get("close_reason") == "policy_revoked"]
    assert [line["host"] for line in revoked_lines] == [REVOKED]


def test_reload_denying_a_destination_cuts_a_plain_http_response_in_flight(
    proxy_factory: ProxyFactory, echo_origin: ScriptedOrigin
) -> None:
    proxy = proxy_factory(_policy(echo_origin, [REVOKED]))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=CLOSE_WAIT_S) as sock:
        url = f"http://{REVOKED}:{echo_origin.port}/slow"
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {REVOKED}\r\n\r\n".encode())
        received = b""
        while b"s" * 100 not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
        _reload(proxy, _policy(echo_origin, [KEPT]))
        _wait_closed_by_peer(sock)
    lines = proxy.wait_audit(lambda lines: any(line.get("close_reason") == "policy_revoked" for line in lines))
    assert any(line.get("close_reason") == "policy_revoked" and line["kind"] == "http" for line in lines)
