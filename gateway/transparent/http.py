"""Plain HTTP seen transparently: the proxy's own request handling, per request, not a splice.

A redirected connection whose first flight is an HTTP/1 request is handed to the forward proxy's
`ClientConnection` (strict llhttp parsing, size limits, head deadline, pipelining, hop-by-hop
headers, keep-alive, the upstream pool) through a per-port `ProxyServer` whose decisions differ in
three ways only: the principal is the listener port's (the uid's), never a Proxy-Authorization;
an origin-form request target is made absolute from its `Host` header (the port the agent dialed
when Host names none); and the lines and counts say `kind: "transparent"`. Every request on a
kept-alive connection is decided afresh, so the policy sees the method and host of each one.
`destination: strict` refuses a request whose Host does not resolve to the address dialed.
CONNECT is refused: a transparent connection is already a connection to somewhere.

Never parses HTTP itself and never writes a second HTTP/1.1 implementation.
"""

from __future__ import annotations

import asyncio

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.observe.audit_fields import connection_fields_with
from gateway.observe.audit_members import ConnectionFields
from gateway.policy.model import LoadedPolicy, Principal
from gateway.proxy.client_connection import ClientConnection
from gateway.proxy.decision.caches import DecisionCaches, ForwardTarget
from gateway.proxy.decision.records import DecisionRecords
from gateway.proxy.forward.dispatch import ForwardDispatcher
from gateway.proxy.forward.exchange import ForwardExchange
from gateway.proxy.http1.request_framing import ConnectHead
from gateway.proxy.server import ProxyServer
from gateway.transparent.destination import pin_destination
from gateway.transparent.listener import KIND, HttpHandOver
from gateway.transparent.verdicts import format_original, principal_for_port
from gateway.vet.addresses import IPAddress


class _PortDecisions(DecisionCaches):
    """The proxy's decision caches, with the port's principal."""

    def __init__(self, uid: int | None) -> None:
        super().__init__()
        self.uid = uid

    def principal_for(
        self, loaded: LoadedPolicy, authorization: bytes | None, peer_uid: int | None = None
    ) -> Principal:
        # The uid decides who is asking; a Proxy-Authorization the agent adds changes nothing.
        return principal_for_port(loaded, self.uid)


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


class _TransparentClient(ClientConnection):
    """The proxy's client connection, for one redirected connection with a known destination."""

    def __init__(self, server: ProxyServer, original: tuple[IPAddress, int]) -> None:
        super().__init__(server)
        self.original = original

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # On every line of the connection, as on a tunnel's: a request dialled at the metadata
        # address with an allowed Host must not read like any other request to that host.
        fields = self.audit_fields
        assert isinstance(fields, ConnectionFields)  # connection_made built it
        self.audit_fields = connection_fields_with(fields, original_dst=format_original(self.original))

    def _begin_connect(self, head: ConnectHead) -> None:
        self._refuse(GatewayError(ErrorCode.INVALID_INPUT, "CONNECT is not accepted on a transparent connection"))


class _StrictDispatcher(ForwardDispatcher):
    """Origin-form targets made absolute, and the destination rule applied before sending."""

    def start(self, exchange: ForwardExchange) -> None:
        client = exchange.client
        assert isinstance(client, _TransparentClient)
        try:
            url = absolute_target(exchange.url, exchange.headers, client.original[1])
        except GatewayError as error:
            self.records.record_deny(
                KIND, None, None, client.original[1], error=error, generation=0, client=client.audit_fields
            )
            client.refuse_exchange(exchange, error)
            return
        exchange.url = url
        super().start(exchange)

    def _send(
        self,
        exchange: ForwardExchange,
        principal: Principal,
        forward: ForwardTarget,
        target: PinnedTarget,
        loaded: LoadedPolicy,
    ) -> None:
        client = exchange.client
        assert isinstance(client, _TransparentClient)
        try:
            target = pin_destination(loaded.policy.transparent, target, client.original[0])
        except GatewayError as error:
            self._deny(exchange, error, loaded, principal, forward)
            return
        super()._send(exchange, principal, forward, target, loaded)


class _PortServer(ProxyServer):
    """The state a `ClientConnection` reads from its server, for one transparent port.

    Shares the forward proxy's tunnel bookkeeping and upstream pool (so limits and pooled
    connections are the gateway's, not per port) and never listens itself."""

    def __init__(self, proxy: ProxyServer, uid: int | None) -> None:
        # ProxyServer.__init__ would build a second tunnel opener and pool; share the proxy's.
        self.core = proxy.core
        self.audit = proxy.audit
        self.caches = _PortDecisions(uid)
        self.records = DecisionRecords(proxy.audit, kind=KIND)
        self.pool = proxy.pool
        self.tunnels = proxy.tunnels
        self.dispatcher = _StrictDispatcher(proxy.core, self.caches, self.records, proxy.pool, proxy.dispatcher.guard)
        self.draining = False
        self.connections = set()
        self._server = None
        self._quiet = asyncio.Event()
        self.loop = proxy.loop
        self.wheel = proxy.wheel
        self.inspection = proxy.inspection


class TransparentHttp(HttpHandOver):
    """Hands HTTP connections from the transparent listener to the proxy's request handling."""

    def __init__(self, proxy: ProxyServer) -> None:
        self.proxy = proxy
        self.servers: dict[int | None, _PortServer] = {}

    def take_over(
        self, transport: asyncio.Transport, uid: int | None, original: tuple[IPAddress, int], first: bytes
    ) -> None:
        server = self.servers.get(uid)
        if server is None:
            server = self.servers[uid] = _PortServer(self.proxy, uid)
        client = _TransparentClient(server, original)
        transport.set_protocol(client)
        client.connection_made(transport)
        client.data_received(first)

    def close(self) -> None:
        for server in self.servers.values():
            server.draining = True
            for conn in list(server.connections):
                conn.abort("shutdown")
