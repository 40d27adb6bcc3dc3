"""The floor: the least a uvloop forward proxy does, measured beside the gateway in bench/proxy.py.

Not a proxy anyone should run. It has no policy, no DNS (every request goes to the one origin
address it was started with), no principal, no audit line, no metric, no deadline, no flow
control and no error handling, and it parses just enough to forward:

- `CONNECT host:port`: dial the origin's address on that port, answer 200, splice both ways.
- `GET http://host/path`: one upstream connection per client connection, kept alive; the request
  line is rewritten to origin form and the origin's bytes are passed back unread, which is only
  correct because the bench's clients send one request at a time and wait for the whole answer.

What it costs per tunnel and per request on this machine is what CPython and uvloop cost before
the gateway does any of its own work: the gap between it and the gateway is the price of the
policy path, and the gap between it and squid says whether a Python proxy can reach a target.

    python bench/proxy_floor.py PORT ORIGIN_IP
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


class UpstreamSide(asyncio.Protocol):
    """The origin's bytes go to the client as they come."""

    __slots__ = ("client",)

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class ClientSide(asyncio.Protocol):
    """A client connection: a CONNECT head, or absolute-URI requests, then bytes to the origin."""

    __slots__ = ("origin_ip", "pending", "transport", "tunnel", "upstream")
    transport: asyncio.Transport

    def __init__(self, origin_ip: str) -> None:
        self.origin_ip = origin_ip
        self.upstream: asyncio.Transport | None = None
        self.pending = b""
        self.tunnel = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self.tunnel and self.upstream is not None:
            self.upstream.write(data)
            return
        self.pending += data
        end = self.pending.find(b"\r\n\r\n")
        if end < 0:
            return
        head, self.pending = self.pending[: end + 4], self.pending[end + 4 :]
        method, target, rest = head.split(b" ", 2)
        if method == b"CONNECT":
            self.tunnel = True
            port = int(target.rsplit(b":", 1)[1])
            asyncio.get_running_loop().create_task(self.dial(port, CONNECT_ESTABLISHED, to_client=True))
            return
        path = b"/" + target.split(b"/", 3)[3] if target.count(b"/") >= 3 else b"/"
        request = method + b" " + path + b" " + rest
        if self.upstream is None:
            asyncio.get_running_loop().create_task(self.dial(80, request, to_client=False))
        else:
            self.upstream.write(request)

    async def dial(self, port: int, first: bytes, *, to_client: bool) -> None:
        loop = asyncio.get_running_loop()
        transport = self.transport
        upstream, _ = await loop.create_connection(lambda: UpstreamSide(transport), self.origin_ip, port)
        self.upstream = upstream
        if to_client:
            transport.write(first)
        else:
            upstream.write(first)
        if self.pending and self.tunnel:
            upstream.write(self.pending)
            self.pending = b""

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, origin_ip: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ClientSide(origin_ip), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2]))
