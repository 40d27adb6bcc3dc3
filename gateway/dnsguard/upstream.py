"""Forwarding one DNS message to the gateway's own upstream resolvers, over UDP or TCP.

The upstreams are `EGRESS_NAMESERVERS` (or the nameserver lines of /etc/resolv.conf, as the
resolver does). A UDP answer with TC set is asked again over TCP. Each server gets the timeout in
turn; the first answer wins. UDP goes over one connected socket per server, kept open: each query
leaves under a fresh random id (the client's id is put back on the answer), and an answer is
taken only when its id is one in flight and its question is the one asked, so a stray or spoofed
datagram answers nothing. Never judges a message (verdict.py does) and never sends anything the
DNS listener did not hand it.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
from collections.abc import Sequence
from pathlib import Path

from gateway.dnsguard.wire import question_end
from gateway.errors import ErrorCode, GatewayError

RESOLV_CONF = Path("/etc/resolv.conf")
DNS_PORT = 53
MAX_TCP_MESSAGE_BYTES = 65535


def parse_nameserver(text: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address."""
    if text.startswith("["):
        host, _, port = text[1:].partition("]")
        return host, int(port.lstrip(":") or DNS_PORT)
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port)
    return text, DNS_PORT


def system_nameservers(path: Path = RESOLV_CONF) -> tuple[str, ...]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ()
    return tuple(line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1)


class _Channel(asyncio.DatagramProtocol):
    """One kept-open UDP socket to one server, and the queries waiting on it by upstream id."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: dict[int, tuple[asyncio.Future[bytes], bytes]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for waiter, _ in self.pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("the upstream socket closed"))

    def datagram_received(self, data: bytes, addr: object) -> None:
        if len(data) < 12:
            return
        entry = self.pending.get(int.from_bytes(data[:2]))
        if entry is None:
            return
        waiter, question = entry
        if not waiter.done() and data[12 : 12 + len(question)] == question:
            waiter.set_result(data)

    def error_received(self, exc: Exception) -> None:
        # ICMP unreachable on a connected socket: every query on it fails now, not at its timeout.
        for waiter, _ in self.pending.values():
            if not waiter.done():
                waiter.set_exception(exc)

    async def ask(self, query: bytes) -> bytes:
        assert self.transport is not None
        end = question_end(query)
        if end is None:
            raise ValueError("a query without a question")
        upstream_id = secrets.randbelow(65536)
        while upstream_id in self.pending:
            upstream_id = secrets.randbelow(65536)
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[upstream_id] = (waiter, query[12:end])
        try:
            self.transport.sendto(upstream_id.to_bytes(2) + query[2:])
            answer = await waiter
        finally:
            del self.pending[upstream_id]
        return query[:2] + answer[2:]


class Upstream:
    def __init__(self, nameservers: Sequence[str], timeout_s: float) -> None:
        self.servers = [parse_nameserver(text) for text in (nameservers or system_nameservers())]
        self.timeout_s = timeout_s
        self._channels: dict[tuple[str, int], _Channel] = {}

    async def forward(self, query: bytes, *, tcp: bool) -> bytes:
        last: BaseException | None = None
        for host, port in self.servers:
            try:
                if not tcp:
                    answer = await asyncio.wait_for(self._udp(query, host, port), self.timeout_s)
                    # TC bit (RFC 1035 4.1.1): the whole answer only comes over TCP.
                    if len(answer) < 3 or not answer[2] & 0x02:
                        return answer
                return await asyncio.wait_for(self._tcp(query, host, port), self.timeout_s)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                last = exc
        raise GatewayError(ErrorCode.DNS_FAILURE, f"no upstream resolver answered ({last.__class__.__name__})")

    async def _udp(self, query: bytes, host: str, port: int) -> bytes:
        channel = self._channels.get((host, port))
        if channel is None or channel.transport is None:
            loop = asyncio.get_running_loop()
            _, created = await loop.create_datagram_endpoint(_Channel, remote_addr=(host, port))
            channel = self._channels.get((host, port))
            if channel is not None and channel.transport is not None:
                assert created.transport is not None
                created.transport.close()  # another query opened one meanwhile: one socket per server
            else:
                self._channels[(host, port)] = channel = created
        return await channel.ask(query)

    def close(self) -> None:
        for channel in self._channels.values():
            if channel.transport is not None:
                channel.transport.close()
        self._channels.clear()

    async def _tcp(self, query: bytes, host: str, port: int) -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(length)
        finally:
            writer.close()
