"""Forwarding one DNS message to the gateway's own upstream resolvers, over UDP or TCP.

The upstreams are `EGRESS_NAMESERVERS` (or the nameserver lines of /etc/resolv.conf, as the
resolver does). A UDP answer with TC set is asked again over TCP. Each server gets the timeout in
turn; the first answer wins. Never judges a message (verdict.py does) and never sends anything
the DNS listener did not hand it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from pathlib import Path

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


class _Reply(asyncio.DatagramProtocol):
    def __init__(self, waiter: asyncio.Future[bytes]) -> None:
        self.waiter = waiter

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.waiter.done():
            self.waiter.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(exc)


class Upstream:
    def __init__(self, nameservers: Sequence[str], timeout_s: float) -> None:
        self.servers = [parse_nameserver(text) for text in (nameservers or system_nameservers())]
        self.timeout_s = timeout_s

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
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bytes] = loop.create_future()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Reply(waiter), remote_addr=(host, port))
        try:
            transport.sendto(query)
            return await waiter
        finally:
            transport.close()

    async def _tcp(self, query: bytes, host: str, port: int) -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(length)
        finally:
            writer.close()
