"""Every body within the caps arrives whole from a TLS origin that closes without close_notify.

uvloop 0.23 with aiohttp 3.14 drops the tail of a TLS stream when the peer closes the TCP
connection without a TLS close_notify while reading is paused by flow control (uvloop PR 661):
a 1 MB page stopped at 868,352 bytes in most tries, and the asyncio loop got all of it. Real
servers close that way, and the gateway asks every origin to close. The origin here is a
blocking TLS socket in a thread that sends its whole response and then shuts the TCP connection
down without close_notify; the gateway (on uvloop, as it runs) must hand back every byte.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import GatewayFactory
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import policy_document
from tests.harness.proxy import read_head

BODY_CHARS = 1_000_000
TRIES = 10
NAME = "truncating.example.org"


class AbruptTlsOrigin:
    """Answers each connection with one text/plain body, then closes without close_notify."""

    def __init__(self, ip: str, context: ssl.SSLContext, body: bytes) -> None:
        self._context = context
        self._listener = socket.create_server((ip, 0))
        self.ip = ip
        self.port: int = self._listener.getsockname()[1]
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
        self._response = head.encode() + body  # no Content-Length: the close ends the body
        self._thread = threading.Thread(target=self._serve, name="abrupt-tls-origin", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(raw,), name="abrupt-tls-answer", daemon=True).start()

    def _answer(self, raw: socket.socket) -> None:
        raw.settimeout(20)
        try:
            with self._context.wrap_socket(raw, server_side=True) as tls:
                if b"\r\n\r\n" not in read_head(tls):
                    return  # the client closed before its request's end
                tls.sendall(self._response)
                # SSLSocket.shutdown drops the TLS layer and shuts the TCP socket: FIN, no close_notify.
                tls.shutdown(socket.SHUT_RDWR)
        except OSError:
            return

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def abrupt_origin(pki: TestPKI, fake_dns: FakeDNS) -> Iterator[AbruptTlsOrigin]:
    origin = AbruptTlsOrigin("127.0.0.253", pki.server_context(NAME), b"a" * BODY_CHARS)
    fake_dns.add(NAME, origin.ip)
    yield origin
    origin.close()


def test_a_tls_body_closed_without_close_notify_arrives_whole(
    gateway_factory: GatewayFactory, abrupt_origin: AbruptTlsOrigin
) -> None:
    gateway = gateway_factory(
        policy_document(
            allow_cidrs=[f"{abrupt_origin.ip}/32"],
            ports=[443, abrupt_origin.port],
            fetch={"robots": "ignore", "max_source_chars": 2 * BODY_CHARS},
        )
    )
    totals = []
    for _ in range(TRIES):
        response = httpx.post(
            f"{gateway.api_url}/v1/fetch", json={"url": f"https://{NAME}:{abrupt_origin.port}/page"}, timeout=60
        )
        assert response.status_code == 200, response.text
        totals.append(response.json()["totalChars"])
    assert totals == [BODY_CHARS] * TRIES, totals
