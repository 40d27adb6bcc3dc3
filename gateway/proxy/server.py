"""The forward-proxy listener: request heads, dispatch to CONNECT or forwarding, drain.

Owns the client side of every proxy connection as an asyncio Protocol: strict head parsing with
httptools (llhttp), the head deadline (slowloris), size limits and keep-alive idle time,
pipelined requests answered in order, denials with X-Egress-Code, and drain on shutdown. Each
absolute-URI request goes to `dispatch.ForwardDispatcher` (decided without a task when cached
state suffices), each CONNECT to `connect_flow.TunnelOpener`; `forward.py` owns the upstream
side of an exchange and `tunnel.py` an established tunnel.

Never resolves a name or dials a socket itself (the egress core decides, `open_pinned_connection`
dials), never forwards or echoes the proxy credential.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from typing import cast

import httptools

from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.proxy.deadline import LazyDeadline
from gateway.proxy.decision_caches import ProxyDecisions
from gateway.proxy.dispatch import ForwardDispatcher
from gateway.proxy.exchange import ForwardExchange, ParsedRequest, PauseReason
from gateway.proxy.forward import UpstreamConnection
from gateway.proxy.heads import (
    FRAMING_FIELDS,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_URL_BYTES,
    error_response,
    named_by_connection,
)
from gateway.proxy.live_permission import REVOKED_REASON, revocation
from gateway.proxy.pool import UpstreamPool
from gateway.proxy.sni import MAX_PEEK_BYTES
from gateway.proxy.tunnel import Tunnel
from gateway.proxy.tunnel_opener import TunnelOpener, TunnelRequest
from gateway.tasks import spawn

LISTEN_BACKLOG = 4096
DRAIN_POLL_S = 0.05


class _HeadRefused(Exception):
    """Raised inside an httptools callback to stop parsing; the reason is on the connection."""


class ProxyServer:
    """The listener and the state shared by its connections: decisions, pool, tunnels."""

    def __init__(self, core: EgressCore, audit: AuditLog) -> None:
        self.core = core
        self.audit = audit
        self.decisions = ProxyDecisions(audit)
        self.pool = UpstreamPool()
        self.tunnels = TunnelOpener(core, self.decisions, audit, self.activity_ended)
        self.dispatcher = ForwardDispatcher(core, self.decisions, self.pool)
        self.draining = False
        self.connections: set[ClientConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._quiet = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets = self._server.sockets  # type: ignore[attr-defined]  # asyncio.Server and uvloop's both have it
        port: int = sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            functools.partial(ClientConnection, self), host, port, backlog=LISTEN_BACKLOG, reuse_address=True
        )

    async def drain(self, grace_s: float) -> None:
        """Stop accepting, let tunnels and in-flight requests finish up to `grace_s`, then close them."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close_if_idle()
        deadline = time.monotonic() + grace_s
        while any(c.busy for c in self.connections):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._quiet.clear()
            try:
                # Woken whenever a tunnel or exchange ends; bounded by the grace period.
                await asyncio.wait_for(self._quiet.wait(), min(remaining, DRAIN_POLL_S * 20))
            except TimeoutError:
                continue
        await self.close()

    def policy_reloaded(self) -> None:
        """Live permission: close tunnels, requests in flight and pooled connections that the
        policy now in force denies (audited with close reason `policy_revoked`)."""
        core = self.core
        loaded = core.loaded
        for tunnel in list(self.tunnels.tunnels):
            if revocation(core, loaded, tunnel.principal, tunnel.target, tunnel.address) is not None:
                tunnel.close(REVOKED_REASON)
        for conn in list(self.connections):
            conn.revoke_if_denied()

        def revoked(upstream: UpstreamConnection) -> bool:
            rule, target = upstream.principal_rule, upstream.target
            return (
                rule is not None
                and target is not None
                and revocation(core, loaded, rule, target, upstream.key[1]) is not None
            )

        self.pool.close_where(revoked)

    def activity_ended(self) -> None:
        if self.draining:
            self._quiet.set()

    async def close(self) -> None:
        self.draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort("shutdown")
        self.pool.close()


class ClientConnection(asyncio.Protocol):
    """One client connection: parses heads, runs exchanges one at a time, or becomes a tunnel."""

    __slots__ = (
        "_authorization",
        "_chunked",
        "_closed",
        "_connecting",
        "_connection_values",
        "_deadline",
        "_early",
        "_eof",
        "_exchange",
        "_head_size",
        "_headers",
        "_idle_timer",
        "_in_head",
        "_no_more_requests",
        "_parser",
        "_pause_mask",
        "_queued",
        "_raw_head_bytes",
        "_receiving",
        "_refusal",
        "_tunnel",
        "_url",
        "server",
        "transport",
    )

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._authorization: bytes | None = None
        self._chunked = False
        self._raw_head_bytes = 0
        self._head_size = 0
        self._in_head = True
        self._refusal: GatewayError | None = None
        self._exchange: ForwardExchange | None = None
        self._receiving: ForwardExchange | None = None
        self._queued: deque[ParsedRequest] = deque()
        self._tunnel: Tunnel | None = None
        self._connecting = False
        # Client bytes that arrive while a CONNECT is being dialed (a ClientHello sent eagerly).
        self._early = bytearray()
        self._pause_mask = PauseReason(0)
        # One deadline serves the head deadline and the keep-alive idle time (which one: _idle_timer).
        self._deadline = LazyDeadline(self._timeout, server.loop)
        self._idle_timer = False
        self._connection_values: list[bytes] = []
        self._eof = False
        self._closed = False
        self._no_more_requests = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return self._tunnel is not None or self._exchange is not None or self._connecting

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.server.connections.add(self)
        self._set_deadline(self.server.core.loaded.policy.proxy.head_timeout_s, idle=False)

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel.from_client(data)
            return
        if self._connecting:
            # Held, not parsed: beyond one peek's worth the client waits for the tunnel.
            self._early += data
            if len(self._early) > MAX_PEEK_BYTES:
                self.transport.pause_reading()
            return
        parser = self._parser
        if parser is None or self._closed:
            return
        if self._in_head:
            self._raw_head_bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if parser.get_method() != b"CONNECT":
                self._refuse(GatewayError(ErrorCode.INVALID_INPUT, "protocol upgrades are not proxied; use CONNECT"))
                return
            self._begin_connect(data[upgrade.args[0] :])
            return
        except httptools.HttpParserError as exc:
            if self._no_more_requests:
                # RFC 9112 section 9.6: after a request that asked to close, further requests are
                # not processed; it is still owed its response, so the bytes are dropped, not refused.
                self._parser = None
                return
            refusal = self._refusal or GatewayError(ErrorCode.INVALID_INPUT, f"malformed request: {exc}")
            self._refuse(refusal)
            return
        if self._no_more_requests:
            self._parser = None
            return
        if self._in_head and self._raw_head_bytes > MAX_HEAD_BYTES:
            self._refuse(GatewayError(ErrorCode.TOO_LARGE, "the request head is too large", status=431))

    def eof_received(self) -> bool | None:
        if self._tunnel is not None:
            return self._tunnel.client_eof()
        self._eof = True
        # A client may half-close after its request: keep the socket to send the response.
        return True if self._exchange is not None or self._connecting else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        self._deadline.cancel()
        if self._tunnel is not None:
            self._tunnel.client_lost(exc)
            return
        for exchange in [self._exchange, *(queued.exchange for queued in self._queued)]:
            if exchange is not None and exchange.upstream is not None:
                upstream = exchange.upstream
                upstream.exchange = None
                upstream.close()
                self.server.decisions.record_exchange_close(exchange, "client_closed")
        self._exchange = None
        self._queued.clear()

    def pause_writing(self) -> None:
        if self._tunnel is not None:
            self._tunnel.upstream.pause_reading()
        elif self._exchange is not None and self._exchange.upstream is not None:
            self._exchange.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self._tunnel is not None:
            if not self._tunnel.closed:
                self._tunnel.upstream.resume_reading()
        elif self._exchange is not None and self._exchange.upstream is not None:
            self._exchange.upstream.resume_reading()

    # httptools callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._head_size = 0
        self._headers = []
        self._authorization = None
        self._chunked = False
        self._in_head = True
        self._connection_values = []
        if self._idle_timer:
            # The next head has started: it must complete within the head deadline (slowloris).
            self._set_deadline(self.server.core.loaded.policy.proxy.head_timeout_s, idle=False)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > MAX_URL_BYTES:
            self._refusal = GatewayError(ErrorCode.TOO_LARGE, "the request line is too long", status=431)
            raise _HeadRefused

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            # A trailer field (after a chunked body): never merged into the head that already went
            # upstream or is about to, only bounded. The forwarded body ends with no trailers.
            self._head_size += len(name) + len(value) + 4
            if self._head_size > MAX_HEAD_BYTES:
                self._refusal = GatewayError(ErrorCode.TOO_LARGE, "the request trailers are too large", status=431)
                raise _HeadRefused
            return
        headers = self._headers
        if len(headers) >= MAX_HEADERS:
            self._refusal = GatewayError(ErrorCode.TOO_LARGE, f"more than {MAX_HEADERS} header fields", status=431)
            raise _HeadRefused
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD_BYTES:
            self._refusal = GatewayError(ErrorCode.TOO_LARGE, "the request head is too large", status=431)
            raise _HeadRefused
        lowered = name.lower()
        if lowered == b"proxy-authorization":
            if self._authorization is not None:
                self._refusal = GatewayError(ErrorCode.INVALID_INPUT, "two Proxy-Authorization fields")
                raise _HeadRefused
            self._authorization = value
        elif lowered == b"connection":
            self._connection_values.append(value)
        elif lowered == b"transfer-encoding":
            # Only `chunked` alone: any other coding makes the body length ambiguous between us
            # and the origin (request smuggling).
            if value.strip().lower() != b"chunked" or self._chunked:
                self._refusal = GatewayError(ErrorCode.INVALID_INPUT, "only one Transfer-Encoding: chunked is accepted")
                raise _HeadRefused
            self._chunked = True
        headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        self._in_head = False
        self._raw_head_bytes = 0
        named = named_by_connection(self._connection_values)
        if named & FRAMING_FIELDS:
            self._refusal = GatewayError(
                ErrorCode.INVALID_INPUT, "the Connection field names Content-Length or Transfer-Encoding"
            )
            raise _HeadRefused
        self._head_size = 0  # from here on it counts trailer bytes
        self._deadline.clear()  # no deadline of ours while the request is served or tunnelled
        method = parser.get_method()
        if method == b"CONNECT":
            return  # httptools raises HttpParserUpgrade next; handled in data_received
        exchange = ForwardExchange(
            self,
            method,
            chunked_request=self._chunked,
            client_http10=parser.get_http_version() == "1.0",
            client_keep_alive=parser.should_keep_alive(),
        )
        self._receiving = exchange
        item = ParsedRequest(exchange, self._url, self._headers, self._authorization, named)
        if self._exchange is None:
            self._exchange = exchange
            self.server.dispatcher.start(item)
        else:
            # Pipelined: answer in order, and read no further until this one's turn.
            self._queued.append(item)
            self.pause_client_reading(PauseReason.PIPELINE)

    def on_body(self, body: bytes) -> None:
        if self._receiving is not None:
            self._receiving.request_body(body)

    def on_message_complete(self) -> None:
        receiving = self._receiving
        self._receiving = None
        self._in_head = True
        if receiving is not None:
            if not receiving.client_keep_alive:
                self._no_more_requests = True
            receiving.request_end()

    # the ClientSide interface used by forward.py ---------------------------------------------
    def pause_client_reading(self, reason: PauseReason) -> None:
        if not self._pause_mask and not self._closed:
            self.transport.pause_reading()
        self._pause_mask |= reason

    def resume_client_reading(self, reason: PauseReason) -> None:
        if not self._pause_mask & reason:
            return
        self._pause_mask &= ~reason
        if not self._pause_mask and not self._closed:
            self.transport.resume_reading()

    def response_finished(self, exchange: ForwardExchange, *, keep_alive: bool, reason: str) -> None:
        # One histogram per request (latency); sizes are in the close audit line.
        metrics.HTTP_FORWARD_SECONDS.observe(time.perf_counter() - exchange.started)
        self.server.decisions.record_exchange_close(exchange, reason)
        self._exchange = None
        self.server.activity_ended()
        if self._closed:
            return
        # The finished request's own keep-alive, not the connection's: a pipelined head behind it
        # may already have asked to close after its own response.
        if (
            not keep_alive
            or not exchange.client_keep_alive
            or self._eof
            or self.server.draining
            or not exchange.body_done
        ):
            self._close()
            return
        self._next_exchange()

    def fail_exchange(self, exchange: ForwardExchange, code: str, message: str) -> None:
        """The upstream failed mid-exchange: a 502 if nothing was sent yet, else cut the stream."""
        self.server.decisions.record_exchange_close(exchange, code)
        self._exchange = None
        self.server.activity_ended()
        if self._closed:
            return
        upstream = exchange.upstream
        head_sent = upstream is not None and upstream.head_sent
        if not head_sent:
            error = GatewayError(ErrorCode(code), message)
            self.server.decisions.count_decision("http", "error", code)
            self.transport.write(error_response(error, keep_alive=False))
        self._close()

    def refuse_exchange(self, exchange: ForwardExchange, error: GatewayError) -> None:
        # Answered on the next loop iteration: a decision made as the head completes precedes the
        # parser's end-of-message for a bodiless request, and the connection may only stay open
        # once the request is fully consumed.
        asyncio.get_running_loop().call_soon(self._answer_refusal, exchange, error)

    def retry_exchange(self, exchange: ForwardExchange) -> None:
        self.server.dispatcher.retry(exchange)

    # dispatch --------------------------------------------------------------------------------
    def _answer_refusal(self, exchange: ForwardExchange, error: GatewayError) -> None:
        self._exchange = None
        if self._closed:
            return
        # The connection survives a denial only when the request body was consumed in full.
        keep = exchange.client_keep_alive and exchange.body_done and not self._eof and not self.server.draining
        self.transport.write(error_response(error, keep_alive=keep))
        if keep:
            self._next_exchange()
        else:
            self._close()

    def _next_exchange(self) -> None:
        if self._queued:
            item = self._queued.popleft()
            self._exchange = item.exchange
            if not self._queued:
                self.resume_client_reading(PauseReason.PIPELINE)
            self.server.dispatcher.start(item)
            return
        self._set_deadline(self.server.core.loaded.policy.proxy.idle_timeout_s, idle=True)

    def _begin_connect(self, early: bytes) -> None:
        opener = self.server.tunnels
        try:
            # Decided here when cached state suffices: a refusal is answered without a task.
            request = opener.decide(self._url, self._authorization)
        except GatewayError as error:
            self.transport.write(error_response(error, keep_alive=False))
            self._close()
            return
        # Reading continues while the upstream is dialed (no pause/resume pair per tunnel);
        # data_received holds whatever arrives until the tunnel exists.
        self._connecting = True
        self._early += early
        spawn(self._open_tunnel(request), name="proxy-connect", loop=self.server.loop)

    async def _open_tunnel(self, request: TunnelRequest) -> None:
        opener = self.server.tunnels
        try:
            dialed = await opener.dial(request)
        except GatewayError as error:
            self._connecting = False
            if not self._closed:
                self.transport.write(error_response(error, keep_alive=False))
                self._close()
            return
        self._connecting = False
        if self._closed or self.server.draining:
            # While dialing, only a reset closes the client side (a FIN is answered as a half-close).
            opener.abandon(request, dialed, "shutdown" if self.server.draining else "client_reset")
            self._close()
            return
        self._parser = None  # a tunnel never parses HTTP again; free the parser's memory
        self._headers = []
        early = self._early
        if early:
            self._early = bytearray()
        tunnel = self._tunnel = opener.establish(
            self.transport, request, dialed, bytes(early) if early else b"", self._deadline
        )
        if tunnel.closed:
            return
        if len(early) > MAX_PEEK_BYTES:
            self.transport.resume_reading()  # data_received paused reading while we dialed
        if self._eof:
            tunnel.client_eof()  # the client half-closed while we dialed

    # closing ---------------------------------------------------------------------------------
    def _refuse(self, error: GatewayError) -> None:
        """A head that cannot be served: answer once and close (the stream is out of sync)."""
        self._parser = None
        if self._closed:
            return
        if self._exchange is not None and self._exchange.upstream is not None:
            # Mid-body: the request already went upstream; nothing consistent can be sent back.
            self.abort("malformed_request")
            return
        generation = self.server.core.loaded.generation
        self.server.decisions.record_deny("http", None, None, None, error=error, generation=generation)
        self.transport.write(error_response(error, keep_alive=False))
        self._close()

    def revoke_if_denied(self) -> None:
        """Drop the request in flight (and the connection) if the policy now denies its destination."""
        exchange = self._exchange
        if exchange is None or exchange.target is None or exchange.principal_rule is None or self._closed:
            return
        upstream = exchange.upstream
        address = upstream.key[1] if upstream is not None else exchange.target.address_texts[0]
        loaded = self.server.core.loaded
        if revocation(self.server.core, loaded, exchange.principal_rule, exchange.target, address) is None:
            return
        if upstream is not None:
            upstream.exchange = None
            upstream.close()
        self.server.decisions.record_exchange_close(exchange, REVOKED_REASON)
        self._exchange = None
        self.abort(REVOKED_REASON)

    def close_if_idle(self) -> None:
        if not self.busy:
            self._close()

    def abort(self, reason: str) -> None:
        if self._tunnel is not None:
            self._tunnel.close(reason, abort=True)
            return
        self._closed = True
        self.transport.abort()

    def _close(self) -> None:
        self._closed = True
        self._deadline.cancel()
        self.transport.close()

    def _set_deadline(self, delay_s: float, *, idle: bool) -> None:
        self._idle_timer = idle
        self._deadline.set(delay_s)

    def _timeout(self) -> None:
        if self._tunnel is not None:
            self._tunnel.deadline_check()  # the tunnel's idle time or lifetime
            return
        # Head deadline or keep-alive idle time passed: drop without a response (a slowloris
        # client is not owed one, and an idle keep-alive close is normal HTTP/1.1).
        if not self.busy and not self._closed:
            self._closed = True
            if self._idle_timer:
                self.transport.close()
            else:
                self.transport.abort()
