"""Plain HTTP seen transparently: the proxy's own request handling, per request, not a splice.

A redirected connection whose first flight is an HTTP/1 request is handed to the forward proxy's
`ClientConnection` (strict llhttp parsing, size limits, head deadline, pipelining, hop-by-hop
headers, keep-alive, the upstream pool) through a per-port `PortListener`, whose requests differ
through one small interface (`PortRequests`, the dispatcher's `ForwardSurface`) in three ways
only: the principal is the listener port's (the uid's), never a Proxy-Authorization; an
origin-form request target is made absolute from its `Host` header (the port the agent dialed
when Host names none); and `destination: strict` refuses a request whose Host does not resolve to
the address dialed. The lines and counts say `kind: "transparent"` and name the `original_dst`.
Every request on a kept-alive connection is decided afresh, so the policy sees the method and host
of each one. CONNECT is refused: a transparent connection is already a connection to somewhere.

Never parses HTTP itself, never writes a second HTTP/1.1 implementation, never subclasses the
proxy's classes (they are configured: a `ListenerState`, a `ForwardSurface`, constructor options).
"""

from __future__ import annotations

import asyncio
import ssl

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.decision.caches import DecisionCaches, ForwardTarget
from gateway.proxy.decision.records import DecisionRecords
from gateway.proxy.forward.dispatch import ForwardDispatcher
from gateway.proxy.forward.exchange import ForwardExchange
from gateway.proxy.server import ProxyServer
from gateway.proxy.tunnel.attempt import Inspection
from gateway.transparent.destination import pin_destination
from gateway.transparent.listener import HttpHandOver
from gateway.transparent.tunnel_surface import KIND
from gateway.transparent.verdicts import format_original, principal_for_port
from gateway.vet.addresses import IPAddress


def absolute_target(url: bytes, headers: list[tuple[bytes, bytes]], original_port: int) -> bytes:
    """`/path` + `Host: name[:port]` → `http://name[:port]/path` (absolute forms pass unchanged)."""
    if not url.startswith(b"/"):
        return url
    hosts = [value.strip() for name, value in headers if name.lower() == b"host"]
    if len(hosts) != 1 or not hosts[0]:
        raise GatewayError(ErrorCode.INVALID_INPUT, "a transparent HTTP request needs exactly one Host header")
    host = hosts[0]
    has_port = host.rsplit(b"]", 1)[-1].count(b":") == 1 if host.startswith(b"[") else b":" in host
    if not has_port and original_port != 80:
        host += b":%d" % original_port
    return b"http://" + host + url


class PortRequests:
    """`ForwardSurface` of one transparent port: its principal, origin-form targets made absolute
    from their Host, and the destination rule applied before sending; plain TCP upstream."""

    outbound_scheme = "http"
    outbound_kind = "http"
    dial_kind = "http"

    def __init__(self, records: DecisionRecords, caches: DecisionCaches, uid: int | None) -> None:
        self.records = records
        self.caches = caches
        self.uid = uid

    def principal_for(self, loaded: LoadedPolicy) -> Principal:
        # The uid decides who is asking; a Proxy-Authorization the agent adds changes nothing.
        return principal_for_port(loaded, self.uid)

    def request_url(self, exchange: ForwardExchange, loaded: LoadedPolicy) -> bytes:
        client = exchange.client
        original = client.original
        assert original is not None  # every connection of a port listener was redirected
        request = exchange.request
        try:
            return absolute_target(request.url, request.headers, original[1])
        except GatewayError as error:
            self.records.record_deny(
                KIND, None, None, original[1], error=error, generation=0, client=client.audit_fields
            )
            raise

    def destination(self, loaded: LoadedPolicy, target: PinnedTarget, exchange: ForwardExchange) -> PinnedTarget:
        original = exchange.client.original
        assert original is not None
        return pin_destination(loaded.policy.transparent, target, original[0])

    def forward_target(self, url: bytes) -> ForwardTarget:
        return self.caches.forward_target(url)

    async def upstream_tls(self) -> ssl.SSLContext | None:
        return None


class PortListener:
    """`ListenerState` of one transparent port for the proxy's `ClientConnection`: the forward
    proxy's upstream pool and inspection (so pooled connections are the gateway's, not per port),
    its own records (kind `transparent`) and dispatcher (the port's `PortRequests`); it never
    listens itself and serves no CONNECT."""

    connect_refusal = "CONNECT is not accepted on a transparent connection"
    connect_surface = None

    def __init__(self, proxy: ProxyServer, uid: int | None) -> None:
        self.proxy = proxy
        self.core = proxy.core
        self.wheel = proxy.wheel
        # The forward proxy's: the same agents send the same heads on either path.
        self.head_memos = proxy.head_memos
        self.records = DecisionRecords(proxy.audit, kind=KIND)
        self.dispatcher = ForwardDispatcher(
            proxy.core,
            proxy.caches,
            self.records,
            proxy.pool,
            proxy.dispatcher.guard,
            surface=PortRequests(self.records, proxy.caches, uid),
        )
        self.connections: set[ClientConnection] = set()
        self.draining = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.proxy.loop

    @property
    def inspection(self) -> Inspection | None:
        return self.proxy.inspection

    def activity_ended(self) -> None:
        return None  # only the forward proxy's drain waits for its connections


class TransparentHttp(HttpHandOver):
    """Hands HTTP connections from the transparent listener to the proxy's request handling."""

    def __init__(self, proxy: ProxyServer) -> None:
        self.proxy = proxy
        self.servers: dict[int | None, PortListener] = {}

    def take_over(
        self, transport: asyncio.Transport, uid: int | None, original: tuple[IPAddress, int], first: bytes
    ) -> None:
        server = self.servers.get(uid)
        if server is None:
            server = self.servers[uid] = PortListener(self.proxy, uid)
        # On every line of the connection, as on a tunnel's: a request dialled at the metadata
        # address with an allowed Host must not read like any other request to that host.
        client = ClientConnection(
            server, server.dispatcher, original=original, audit_extra={"original_dst": format_original(original)}
        )
        transport.set_protocol(client)
        client.connection_made(transport)
        client.data_received(first)

    def close(self) -> None:
        for server in self.servers.values():
            server.draining = True
            for conn in list(server.connections):
                conn.abort("shutdown")
