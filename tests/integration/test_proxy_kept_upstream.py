"""The upstream a client connection keeps between its own requests follows the pool's rules.

A client connection keeps the upstream of its last response for its next request instead of
parking it in the pool; through the real daemon and a scripted origin that counts and watches its
connections: the next request to the same destination reuses it, a request elsewhere hands it to
the pool (where another client connection reuses it), and a reload that denies its destination
closes it at once, as it closes pooled connections.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.harness import proxy as support
from tests.harness.dns import FakeDNS
from tests.harness.origins import OriginFactory
from tests.harness.proxy import ProxyProcess, proxy_policy
from tests.harness.scripted_origin import ScriptedOrigin

ProxyFactory = Callable[..., ProxyProcess]
proxy_factory = support.proxy_factory

FIRST = "first.example.org"
SECOND = "second.example.org"
WAIT_S = 10.0
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class WatchedOrigin(ScriptedOrigin):
    """Answers every request with `OK`; records which of its connections the proxy closed."""

    def __init__(self, ip: str) -> None:
        self.closed: list[int] = []
        self.closed_event = threading.Event()
        super().__init__(ip, WatchedOrigin._answer)

    @staticmethod
    def _answer(origin: ScriptedOrigin, conn: socket.socket, index: int) -> None:
        assert isinstance(origin, WatchedOrigin)
        while origin.read_request(conn):
            conn.sendall(OK)
        origin.closed.append(index)
        origin.closed_event.set()


@pytest.fixture
def origin(origins: OriginFactory, fake_dns: FakeDNS) -> Iterator[WatchedOrigin]:
    served = WatchedOrigin(origins.next_ip())
    fake_dns.add(FIRST, served.ip, ttl=300)
    fake_dns.add(SECOND, served.ip, ttl=300)
    yield served
    served.close()


def _policy(origin: WatchedOrigin, allowed: list[str]) -> dict[str, Any]:
    principals = {"default": {"egress": {"allow_domains": allowed}}}
    return proxy_policy([origin.cidr], ports=[origin.port], principals=principals)


def _client(proxy: ProxyProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)


def _get(sock: socket.socket, host: str, port: int) -> None:
    sock.sendall(f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer


def test_the_next_request_reuses_the_kept_upstream_and_one_elsewhere_hands_it_to_the_pool(
    proxy_factory: ProxyFactory, origin: WatchedOrigin
) -> None:
    proxy = proxy_factory(_policy(origin, [FIRST, SECOND]))
    with _client(proxy) as one, _client(proxy) as other:
        _get(one, FIRST, origin.port)
        _get(one, FIRST, origin.port)  # the upstream it kept
        assert origin.connections == 1
        _get(one, SECOND, origin.port)  # another host: a second upstream; the first goes to the pool
        assert origin.connections == 2
        _get(other, FIRST, origin.port)  # another client connection takes the pooled one
        assert origin.connections == 2
    assert origin.closed == []  # none was closed to make room: each was reused


def test_a_reload_denying_its_destination_closes_the_kept_upstream(
    proxy_factory: ProxyFactory, origin: WatchedOrigin
) -> None:
    proxy = proxy_factory(_policy(origin, [FIRST, SECOND]))
    with _client(proxy) as sock:
        _get(sock, FIRST, origin.port)
        proxy.write_policy(_policy(origin, [SECOND]))
        proxy.signal(signal.SIGHUP)
        # Long before any idle limit (the pool's is 30 s), with the client connection still open.
        assert origin.closed_event.wait(WAIT_S)
        assert origin.closed == [0]
        _get(sock, SECOND, origin.port)  # the client connection itself still serves
        assert origin.connections == 2
