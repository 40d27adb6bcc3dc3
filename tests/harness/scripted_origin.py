"""A raw TCP origin whose every connection runs a scripted handler: hostile HTTP on loopback.

aiohttp origins only speak correct HTTP; the proxy's hardening tests need origins that lie about
framing, switch protocols unasked, flood interim responses, drip bytes or never end a head. Each
accepted connection runs `handler(conn, index)` in its own thread; the origin records how many
connections it accepted and the raw request heads it read. Never listens beyond 127.0.0.0/8.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.harness.dns import FakeDNS
from tests.harness.origins import OriginFactory
from tests.harness.proxy import read_head

Handler = Callable[["ScriptedOrigin", socket.socket, int], None]
HANDLER_TIMEOUT_S = 20.0


class ScriptedOrigin:
    """Accepts on `ip` (a free port) and hands each connection to `handler` in a thread."""

    def __init__(self, ip: str, handler: Handler) -> None:
        self.listener = socket.create_server((ip, 0))
        self.ip = ip
        self.port: int = self.listener.getsockname()[1]
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def cidr(self) -> str:
        return f"{self.ip}/32"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed
            with self._lock:
                index = self.connections
                self.connections += 1
            threading.Thread(target=self._run, args=(conn, index), daemon=True).start()

    def _run(self, conn: socket.socket, index: int) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(HANDLER_TIMEOUT_S)
            self.handler(self, conn, index)

    def read_request(self, conn: socket.socket) -> bytes:
        """One request head (and whatever came with it); b"" when the peer closed first."""
        data = read_head(conn)
        if b"\r\n\r\n" not in data:
            return b""
        with self._lock:
            self.requests.append(data)
        return data

    def close(self) -> None:
        self.listener.close()


def answer_each_request(response: bytes) -> Handler:
    """A handler that answers every request on the connection with the same bytes."""

    def handle(origin: ScriptedOrigin, conn: socket.socket, index: int) -> None:
        while origin.read_request(conn):
            conn.sendall(response)

    return handle


ScriptedFactory = Callable[[Handler, str], ScriptedOrigin]


@pytest.fixture
def scripted(origins: OriginFactory, fake_dns: FakeDNS) -> Iterator[ScriptedFactory]:
    """`start(handler, name)`: a scripted origin on its own loopback address, `name` routed to it."""
    started: list[ScriptedOrigin] = []

    def start(handler: Handler, name: str) -> ScriptedOrigin:
        origin = ScriptedOrigin(origins.next_ip(), handler)
        fake_dns.add(name, origin.ip)
        started.append(origin)
        return origin

    yield start
    for origin in started:
        origin.close()
