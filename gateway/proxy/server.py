"""The forward-proxy listener: request heads, principals, and dispatch to CONNECT or forwarding.

Owns the client side of every proxy connection as an asyncio Protocol: strict head parsing with
httptools (llhttp), the head deadline (slowloris) and size limits, the principal from
Proxy-Authorization, the decision through `EgressCore.pin`, denials with X-Egress-Code, tunnel
limits, decision audit lines and metrics, and drain on shutdown.

Never resolves a name or dials a socket itself (the egress core decides, `open_pinned_connection`
dials), never forwards or echoes the proxy credential.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import cast

import httptools
from prometheus_client import Counter

from gateway.egress.connect import open_pinned_connection
from gateway.egress.target import EgressCore, PinnedTarget
from gateway.egress.urls import VettedHost, vet_host
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import AuditLog
from gateway.policy.decide import authenticate
from gateway.policy.load import LoadedPolicy
from gateway.policy.model import Principal, ProxySettings
from gateway.proxy.forward import (
    PAUSE_PIPELINE,
    ForwardExchange,
    UpstreamConnection,
    UpstreamPool,
    build_request_head,
)
from gateway.proxy.heads import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_URL_BYTES,
    error_response,
    host_authority,
    parse_connect_authority,
    parse_proxy_authorization,
    split_absolute_target,
)
from gateway.proxy.tunnel import Tunnel, UpstreamTunnelProtocol
from gateway.tasks import spawn

log = logging.getLogger("egress_gateway.proxy")

CONNECT_ESTABLISHED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
LIMIT_RETRY_AFTER_S = 1.0
MAX_CACHED_CREDENTIALS = 1024
MAX_CACHED_HOSTS = 4096
LISTEN_BACKLOG = 4096
DRAIN_POLL_S = 0.05

_CONNECT_LATENCY = metrics.CONNECT_SECONDS.labels("connect")
_HTTP_LATENCY = metrics.CONNECT_SECONDS.labels("http")


class _HeadRefused(Exception):
    """Raised inside an httptools callback to stop parsing; the reason is on the connection."""


class ProxyServer:
    """The listener and the state shared by its connections: pool, tunnel counts, caches."""

    def __init__(self, core: EgressCore, audit: AuditLog) -> None:
        self.core = core
        self.audit = audit
        self.pool = UpstreamPool()
        self.draining = False
        self.connections: set[ClientConnection] = set()
        self.tunnels: set[Tunnel] = set()
        self._tunnels_by_principal: dict[str, int] = {}
        self._reserved_total = 0
        self._server: asyncio.AbstractServer | None = None
        self._credentials: dict[tuple[int, bytes | None], Principal] = {}
        self._hosts: dict[bytes | str, VettedHost] = {}
        self._quiet = asyncio.Event()
        self._decision_counters: dict[tuple[str, str, str], Counter] = {}

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets = self._server.sockets  # type: ignore[attr-defined]  # asyncio.Server and uvloop's both have it
        port: int = sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self), host, port, backlog=LISTEN_BACKLOG, reuse_address=True
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

    # principals and hosts --------------------------------------------------------------------
    def principal_for(self, loaded: LoadedPolicy, authorization: bytes | None) -> Principal:
        """Authenticate, caching successes per policy generation (hashing every token per request
        would be the single largest cost on a keep-alive connection)."""
        key = (loaded.generation, authorization)
        principal = self._credentials.get(key)
        if principal is None:
            credential = parse_proxy_authorization(authorization)
            principal = authenticate(loaded.policy, credential.user, credential.token)
            if len(self._credentials) >= MAX_CACHED_CREDENTIALS:
                self._credentials.clear()
            self._credentials[key] = principal
        return principal

    def vetted_host(self, raw: bytes | str) -> VettedHost:
        """`vet_host` behind a bounded cache: IDNA canonicalisation costs more than the rest of a
        cached decision, and agents ask for the same few hosts over and over."""
        host = self._hosts.get(raw)
        if host is None:
            if isinstance(raw, bytes):
                try:
                    text = raw.decode("ascii")
                except UnicodeDecodeError:
                    raise GatewayError(ErrorCode.UNSAFE_URL, "the host is not ASCII") from None
            else:
                text = raw
            host = vet_host(text)
            if len(self._hosts) >= MAX_CACHED_HOSTS:
                self._hosts.clear()
            self._hosts[raw] = host
        return host

    # tunnel limits ---------------------------------------------------------------------------
    def reserve_tunnel(self, principal: str, settings: ProxySettings) -> None:
        if self._reserved_total >= settings.max_tunnels_total:
            raise GatewayError(ErrorCode.CONCURRENCY_LIMITED, "the gateway's tunnel limit is reached",
                               retry_after_s=LIMIT_RETRY_AFTER_S)
        count = self._tunnels_by_principal.get(principal, 0)
        if count >= settings.max_tunnels_per_principal:
            raise GatewayError(ErrorCode.CONCURRENCY_LIMITED, f"{principal} has reached its tunnel limit",
                               retry_after_s=LIMIT_RETRY_AFTER_S)
        self._tunnels_by_principal[principal] = count + 1
        self._reserved_total += 1

    def release_tunnel(self, principal: str) -> None:
        self._reserved_total -= 1
        remaining = self._tunnels_by_principal.get(principal, 1) - 1
        if remaining <= 0:
            self._tunnels_by_principal.pop(principal, None)
        else:
            self._tunnels_by_principal[principal] = remaining

    def tunnel_closed(self, tunnel: Tunnel) -> None:
        if tunnel in self.tunnels:
            self.tunnels.discard(tunnel)
            self.release_tunnel(tunnel.principal)
        self.activity_ended()

    # audit -----------------------------------------------------------------------------------
    def count_decision(self, kind: str, decision: str, code: str) -> None:
        key = (kind, decision, code)
        counter = self._decision_counters.get(key)
        if counter is None:
            counter = self._decision_counters[key] = metrics.DECISIONS.labels(kind, decision, code)
        counter.inc()

    def record_allow(self, kind: str, principal: Principal, target: PinnedTarget, **extra: object) -> None:
        would = target.would_deny
        decision = "would_deny" if would is not None else "allow"
        code = str(would.code) if would is not None else ""
        self.count_decision(kind, decision, code)
        self.audit.decision(
            kind=kind, principal=principal.name, host=target.name, port=target.port,
            addresses=[str(a) for a in target.addresses], decision=decision, code=code or None,
            reason=would.message if would is not None else None, generation=target.generation,
            **extra,
        )

    def record_deny(self, kind: str, principal: str | None, host: str | None, port: int | None, *,
                    error: GatewayError, generation: int) -> None:
        self.count_decision(kind, "deny", str(error.code))
        self.audit.decision(
            kind=kind, principal=principal, host=host, port=port, decision="deny", code=str(error.code),
            reason=error.message, generation=generation,
        )


class ClientConnection(asyncio.Protocol):
    """One client connection: parses heads, runs exchanges one at a time, or becomes a tunnel."""

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
        self._queued: deque[tuple[ForwardExchange, bytes, list[tuple[bytes, bytes]], bytes | None, bool]] = deque()
        self._keep_alive = True
        self._tunnel: Tunnel | None = None
        self._connecting = False
        self._pause_mask = 0
        self._timer: asyncio.TimerHandle | None = None
        self._idle_timer = False
        self._eof = False
        self._closed = False

    @property
    def busy(self) -> bool:
        return self._tunnel is not None or self._exchange is not None or self._connecting

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.server.connections.add(self)
        self._arm_timer(self.server.core.loaded.policy.proxy.head_timeout_s, idle=False)

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel.from_client(data)
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
            self._begin_connect(data[upgrade.args[0]:])
            return
        except httptools.HttpParserError as exc:
            refusal = self._refusal or GatewayError(ErrorCode.INVALID_INPUT, f"malformed request: {exc}")
            self._refuse(refusal)
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
        self._cancel_timer()
        if self._tunnel is not None:
            self._tunnel.client_lost(exc)
            return
        for exchange in [self._exchange, *(q[0] for q in self._queued)]:
            if exchange is not None and exchange.upstream is not None:
                upstream = exchange.upstream
                upstream.exchange = None
                upstream.close()
                self._audit_close(exchange, "client_closed")
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
        if self._idle_timer:
            # The next head has started: it must complete within the head deadline (slowloris).
            self._arm_timer(self.server.core.loaded.policy.proxy.head_timeout_s, idle=False)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > MAX_URL_BYTES:
            self._refusal = GatewayError(ErrorCode.TOO_LARGE, "the request line is too long", status=431)
            raise _HeadRefused

    def on_header(self, name: bytes, value: bytes) -> None:
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
        self._cancel_timer()
        self._keep_alive = parser.should_keep_alive()
        method = parser.get_method()
        if method == b"CONNECT":
            return  # httptools raises HttpParserUpgrade next; handled in data_received
        exchange = ForwardExchange(self, method, self._chunked, parser.get_http_version() == "1.0")
        self._receiving = exchange
        item = (exchange, self._url, self._headers, self._authorization, self._keep_alive)
        if self._exchange is None:
            self._exchange = exchange
            spawn(self._run_exchange(*item), name="proxy-forward")
        else:
            # Pipelined: answer in order, and read no further until this one's turn.
            self._queued.append(item)
            self.pause_client_reading(PAUSE_PIPELINE)

    def on_body(self, body: bytes) -> None:
        if self._receiving is not None:
            self._receiving.request_body(body)

    def on_message_complete(self) -> None:
        receiving = self._receiving
        self._receiving = None
        self._in_head = True
        if receiving is not None:
            receiving.request_end()

    # the ClientSide interface used by forward.py ---------------------------------------------
    def pause_client_reading(self, reason: int) -> None:
        if not self._pause_mask and not self._closed:
            self.transport.pause_reading()
        self._pause_mask |= reason

    def resume_client_reading(self, reason: int) -> None:
        if not self._pause_mask & reason:
            return
        self._pause_mask &= ~reason
        if not self._pause_mask and not self._closed:
            self.transport.resume_reading()

    def response_finished(self, exchange: ForwardExchange, *, keep_alive: bool, reason: str) -> None:
        metrics.HTTP_FORWARD_SECONDS.observe(time.perf_counter() - exchange.started)
        metrics.HTTP_RESPONSE_BYTES.observe(exchange.bytes_down)
        self._audit_close(exchange, reason)
        self._exchange = None
        self.server.activity_ended()
        if self._closed:
            return
        if not keep_alive or not self._keep_alive or self._eof or self.server.draining or not exchange.body_done:
            self._close()
            return
        self._next_exchange()

    def fail_exchange(self, exchange: ForwardExchange, code: str, message: str) -> None:
        """The upstream failed mid-exchange: a 502 if nothing was sent yet, else cut the stream."""
        self._audit_close(exchange, code)
        self._exchange = None
        self.server.activity_ended()
        if self._closed:
            return
        upstream = exchange.upstream
        head_sent = upstream is not None and upstream.head_sent
        if not head_sent:
            error = GatewayError(ErrorCode(code), message)
            self.server.count_decision("http", "error", code)
            self.transport.write(error_response(error, keep_alive=False))
        self._close()

    # dispatch --------------------------------------------------------------------------------
    async def _run_exchange(
        self, exchange: ForwardExchange, url: bytes, headers: list[tuple[bytes, bytes]],
        authorization: bytes | None, keep_alive: bool,
    ) -> None:
        server = self.server
        loaded = server.core.loaded
        principal_name: str | None = None
        host_name: str | None = None
        port: int | None = None
        try:
            principal = server.principal_for(loaded, authorization)
            principal_name = principal.name
            split = split_absolute_target(url)
            port = split.port
            host = server.vetted_host(split.raw_host)
            host_name = host.name
            target = await server.core.pin(principal, host, split.port, loaded=loaded)
        except GatewayError as error:
            server.record_deny("http", principal_name, host_name, port, error=error, generation=loaded.generation)
            self._answer_refusal(exchange, error, keep_alive)
            return
        exchange.principal = principal.name
        exchange.target = target
        server.record_allow("http", principal, target, method=exchange.method.decode("ascii", "replace"))
        settings = loaded.policy.proxy
        exchange.max_response_bytes = settings.max_response_bytes
        upstream = server.pool.acquire(target)
        if upstream is None:
            started = time.perf_counter()
            try:
                _, upstream, address = await open_pinned_connection(
                    target, lambda: UpstreamConnection(server.pool, ("", "", 0)), timeout_s=settings.connect_timeout_s
                )
            except GatewayError as error:
                self.fail_exchange(exchange, str(error.code), error.message)
                return
            _HTTP_LATENCY.observe(time.perf_counter() - started)
            upstream.key = (address, target.name, target.port)
        if self._closed:
            upstream.close()
            return
        head = build_request_head(exchange.method, split.origin_form, host_authority(host, split.port), headers,
                                  exchange.chunked_request)
        upstream.start(exchange, head)
        if exchange.body_done and upstream.response_complete:
            upstream.finish()

    def _answer_refusal(self, exchange: ForwardExchange, error: GatewayError, keep_alive: bool) -> None:
        self._exchange = None
        if self._closed:
            return
        # The connection survives a denial only when the request body was consumed in full.
        keep = keep_alive and exchange.body_done and not self._eof and not self.server.draining
        self.transport.write(error_response(error, keep_alive=keep))
        if keep:
            self._next_exchange()
        else:
            self._close()

    def _next_exchange(self) -> None:
        if self._queued:
            item = self._queued.popleft()
            self._exchange = item[0]
            spawn(self._run_exchange(*item), name="proxy-forward")
            if not self._queued:
                self.resume_client_reading(PAUSE_PIPELINE)
            return
        self._arm_timer(self.server.core.loaded.policy.proxy.idle_timeout_s, idle=True)

    def _begin_connect(self, early: bytes) -> None:
        self._connecting = True
        self.transport.pause_reading()
        spawn(self._open_tunnel(self._url, self._authorization, early), name="proxy-connect")

    async def _open_tunnel(self, raw_target: bytes, authorization: bytes | None, early: bytes) -> None:
        server = self.server
        loaded = server.core.loaded
        settings = loaded.policy.proxy
        principal_name: str | None = None
        host_name: str | None = None
        port: int | None = None
        reserved = False
        target: PinnedTarget | None = None
        try:
            principal = server.principal_for(loaded, authorization)
            principal_name = principal.name
            authority = parse_connect_authority(raw_target, server.vetted_host)
            host_name, port = authority.host.name, authority.port
            server.reserve_tunnel(principal.name, settings)
            reserved = True
            target = await server.core.pin(principal, authority.host, authority.port, loaded=loaded)
            started = time.perf_counter()
            upstream, proto, address = await open_pinned_connection(
                target, UpstreamTunnelProtocol, timeout_s=settings.connect_timeout_s
            )
            _CONNECT_LATENCY.observe(time.perf_counter() - started)
        except GatewayError as error:
            if reserved:
                server.release_tunnel(principal_name or "")
            if target is None:
                server.record_deny("connect", principal_name, host_name, port, error=error,
                                   generation=loaded.generation)
            else:
                server.count_decision("connect", "error", str(error.code))
                server.audit.write("close", kind="connect", principal=principal_name, host=host_name, port=port,
                                   bytes_up=0, bytes_down=0, duration_s=0.0, close_reason=str(error.code))
            self._connecting = False
            if not self._closed:
                self.transport.write(error_response(error, keep_alive=False))
                self._close()
            return
        self._connecting = False
        if self._closed or server.draining:
            upstream.close()
            server.release_tunnel(principal.name)
            self._close()
            return
        server.record_allow("connect", principal, target)
        self.transport.write(CONNECT_ESTABLISHED)
        tunnel = Tunnel(
            owner=server, audit=server.audit, client=self.transport, upstream=upstream, upstream_proto=proto,
            principal=principal.name, connect_host=target.name, host_is_ip=target.host.ip is not None,
            port=target.port, address=address, generation=target.generation, sni_mode=settings.sni,
            idle_s=settings.idle_timeout_s, lifetime_s=settings.max_tunnel_lifetime_s,
        )
        self._tunnel = tunnel
        self._parser = None  # a tunnel never parses HTTP again; free the parser's memory
        self._headers = []
        server.tunnels.add(tunnel)
        tunnel.start(early)
        if not tunnel.closed:
            self.transport.resume_reading()

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
        self.server.record_deny("http", None, None, None, error=error, generation=self.server.core.loaded.generation)
        self.transport.write(error_response(error, keep_alive=False))
        self._close()

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
        self._cancel_timer()
        self.transport.close()

    def _arm_timer(self, delay_s: float, *, idle: bool) -> None:
        self._cancel_timer()
        self._idle_timer = idle
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timeout(self) -> None:
        # Head deadline or keep-alive idle time passed: drop without a response (a slowloris
        # client is not owed one, and an idle keep-alive close is normal HTTP/1.1).
        self._timer = None
        if not self.busy:
            self._closed = True
            if self._idle_timer:
                self.transport.close()
            else:
                self.transport.abort()

    def _audit_close(self, exchange: ForwardExchange, reason: str) -> None:
        target = exchange.target
        if target is None:
            return
        self.server.audit.write(
            "close", kind="http", principal=exchange.principal, host=target.name, port=target.port,
            bytes_up=exchange.bytes_up, bytes_down=exchange.bytes_down,
            duration_s=round(time.perf_counter() - exchange.started, 6), close_reason=reason,
        )
