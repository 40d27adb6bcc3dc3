"""Why inspection never uses `loop.start_tls` (cpython #142352, uvloop #707), kept as a test.

A client that sends its ClientHello in the same segment as the CONNECT head (curl and Go do
when they can) leaves the ClientHello in the bytes the proxy's protocol already read. A server
that then calls `loop.start_tls` on the transport never sees those bytes again: its handshake
waits for a ClientHello that already came, and so does the client. The gateway's terminator is
fed the bytes the connection holds, so the same coalesced flight completes.

The first test pins the dependency's behaviour: if a future asyncio or uvloop hands the held
bytes over, it fails and says so, and the workaround can be reconsidered with that evidence.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from gateway.inspect.authority import create_authority
from gateway.inspect.leaves import LeafContexts
from gateway.inspect.terminator import TlsTerminator

HOST = "api.example.org"
HANDSHAKE_WAIT_S = 2.0


class ConnectThenStartTls(asyncio.Protocol):
    """Reads a CONNECT head (with whatever follows it in the same read), answers 200, then asks
    the loop to start TLS on the transport as `start_tls` users do."""

    def __init__(self, context: ssl.SSLContext, outcome: asyncio.Future[str]) -> None:
        self.context = context
        self.outcome = outcome
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        assert b"\r\n\r\n" in data
        assert len(data.partition(b"\r\n\r\n")[2]) > 0
        self.transport.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        asyncio.get_running_loop().create_task(self._start_tls())

    async def _start_tls(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.transport is not None
        try:
            await asyncio.wait_for(
                loop.start_tls(self.transport, self, self.context, server_side=True), HANDSHAKE_WAIT_S
            )
        except TimeoutError:
            self.outcome.set_result("hung")
            return
        self.outcome.set_result("completed")


async def _coalesced_client(port: int, ca_pem: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Open a socket and send the CONNECT head and the ClientHello in one write."""
    context = ssl.create_default_context(cafile=str(ca_pem))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    hello = outgoing.read()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode() + hello)
    await writer.drain()
    return reader, writer, hello


@pytest.fixture
def leaves(tmp_path: Path) -> tuple[LeafContexts, Path]:
    authority = create_authority()
    ca_pem = tmp_path / "ca.pem"
    ca_pem.write_bytes(authority.pem)
    return LeafContexts(authority, tmp_path / "leaves"), ca_pem


async def test_start_tls_hangs_when_the_client_hello_came_with_the_connect_head(
    leaves: tuple[LeafContexts, Path],
) -> None:
    contexts, ca_pem = leaves
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = await asyncio.get_running_loop().create_server(
        lambda: ConnectThenStartTls(contexts.context_for(HOST), outcome), "127.0.0.1", 0
    )
    async with server:
        port = server.sockets[0].getsockname()[1]
        _, writer, _ = await _coalesced_client(port, ca_pem)
        try:
            assert await asyncio.wait_for(outcome, HANDSHAKE_WAIT_S * 3) == "hung", (
                "start_tls completed with a coalesced ClientHello: the dependency bug is fixed on "
                "this loop; the sans-IO terminator is still required for uvloop (#707)"
            )
        finally:
            writer.close()


def test_the_terminator_completes_the_same_coalesced_flight(leaves: tuple[LeafContexts, Path]) -> None:
    contexts, ca_pem = leaves
    context = ssl.create_default_context(cafile=str(ca_pem))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    flight = f"CONNECT {HOST}:443 HTTP/1.1\r\n\r\n".encode() + outgoing.read()
    held = flight.partition(b"\r\n\r\n")[2]  # what the proxy holds after parsing the head
    server = TlsTerminator(contexts.context_for(HOST), HOST)
    server.feed(held)
    assert server.handshake() is False
    incoming.write(server.outgoing())
    client.do_handshake()
    server.feed(outgoing.read())
    assert server.handshake() is True
