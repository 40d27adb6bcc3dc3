"""One client connection of the forward proxy: dispatch to CONNECT or forwarding, deadlines, close.

Owns the client side of every proxy connection as an asyncio Protocol that feeds client bytes to
its `http1/request_framing.RequestFraming` (the sans-I/O request half: parsing, caps, pipelining,
keep-alive intent) and its `deadlines/limits.ClientLimits` (the head deadline against
slowloris, the keep-alive idle time, the half-close, whether another request is served) and
carries out what they say: its one entry in the listener's `deadlines/wheel.DeadlineWheel` moved (the
entry also bounds each attempt of a CONNECT's dial, as the dialer's `DialDeadline`; the dial
runs without a task, reporting to this connection as its `DialOwner`), the
write side kept open after the client's FIN, the connection aborted or closed, pipelined requests
answered in order, denials with X-Egress-Code, and the request in flight dropped when a policy
reload denies it. Each absolute-URI request goes to `forward/dispatch.ForwardDispatcher` (decided without
a task when cached state suffices), each CONNECT to `tunnel/opener.TunnelOpener`; `server.py`
owns the listener, `forward/upstream.py` the upstream side of an exchange and `tunnel/splice.py` an established
tunnel.

Never resolves a name or dials a socket itself (the egress core decides; a CONNECT's
`PinnedDial` and the forward dispatcher's `open_pinned_connection` dial), never parses bytes
itself, never forwards or echoes the proxy credential.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gateway.egress.target import EgressCore
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit_fields import connection_fields, connection_fields_with
from gateway.peer_uid import loopback_peer_uid
from gateway.policy.inspect_decide import inspects_host
from gateway.proxy.deadlines.limits import AfterFin, ClientDeadline, ClientExpiry, ClientLimits
from gateway.proxy.deadlines.wheel import DeadlineWheel, LazyDeadline
from gateway.proxy.decision.live_permission import REVOKED_REASON, revocation
from gateway.proxy.decision.records import ExchangeRecords
from gateway.proxy.forward.dispatch import ForwardDispatcher
from gateway.proxy.forward.exchange import NOT_PAUSED, ForwardExchange, ParsedRequest, PauseReason
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.heads import error_response
from gateway.proxy.http1.request_framing import (
    UPGRADE_REFUSED,
    ConnectHead,
    RequestBody,
    RequestEnd,
    RequestFraming,
    UpgradeHead,
)
from gateway.proxy.tls.sni import MAX_PEEK_BYTES
from gateway.proxy.tunnel.opener import TunnelOpener, TunnelRequest
from gateway.proxy.tunnel.splice import DialedUpstream, Tunnel, UpstreamTunnelProtocol
from gateway.tasks import spawn
from gateway.vet.addresses import IPAddress

if TYPE_CHECKING:
    from gateway.egress.connect import PinnedDial
    from gateway.policy.model import LoadedPolicy
    from gateway.proxy.forward.kept_decision import KeptDecision


class Inspection(Protocol):
    """TLS interception for the hosts an `inspect` entry names (`inspected.InspectService`)."""

    def take_over(
        self,
        raw: asyncio.Transport,
        *,
        principal: str,
        host: str,
        port: int,
        early: bytes,
        audit_fields: Mapping[str, Any],
        preface: bytes = b"",
    ) -> None: ...

    def begin_drain(self) -> None: ...

    def has_busy_connections(self) -> bool: ...

    def close(self) -> None: ...


class Upgrades(Protocol):
    """How a connection's protocol upgrades are served: an inspected connection's are judged by
    its rules and relayed (`inspected/upgrades.InspectedUpgrades`); a connection without one
    refuses them ("use CONNECT")."""

    def take_over(self, client: ClientConnection, head: UpgradeHead) -> asyncio.BaseProtocol:
        """Judge `head` and start relaying it; the protocol `client`'s transport belongs to from
        now on. Raises a `GatewayError` (already recorded) to refuse it."""
        ...

    def refused_with_body(self) -> GatewayError:
        """The refusal of an upgrade request that carries a body (not a WebSocket handshake)."""
        ...


class ListenerState(Protocol):
    """What a client connection reads from its listener (`server.ProxyServer`)."""

    @property
    def core(self) -> EgressCore: ...
    @property
    def wheel(self) -> DeadlineWheel: ...
    @property
    def records(self) -> ExchangeRecords: ...
    @property
    def tunnels(self) -> TunnelOpener: ...
    @property
    def connections(self) -> set[ClientConnection]: ...
    @property
    def draining(self) -> bool: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    @property
    def inspection(self) -> Inspection | None: ...
    @property
    def head_memos(self) -> HeadMemos: ...
    @property
    def connect_refusal(self) -> str | None:
        """Why a CONNECT is refused on this listener's connections, or None: served."""
        ...

    def activity_ended(self) -> None: ...


# Not looked up yet (None is a looked-up answer: not on loopback, or the socket is gone).
_UNKNOWN_UID = object()
# The unlabelled histogram's child, bound once: the family's `observe` is one more call per request.
_FORWARD_SECONDS = metrics.HTTP_FORWARD_SECONDS.labels()


# A refusal's status line names the port only when it is not the request's default.
CONNECT_DEFAULT_PORT = 443
PLAIN_HTTP_DEFAULT_PORT = 80


class ClientConnection(asyncio.Protocol):
    """One client connection: parses heads, runs exchanges one at a time, or becomes a tunnel."""

    __slots__ = (
        "_audit_extra",
        "_closed",
        "_connecting",
        "_deadline",
        "_dial",
        "_dispatcher",
        "_early",
        "_exchange",
        "_framing",
        "_limits",
        "_pause_mask",
        "_peer_uid",
        "_queued",
        "_receiving",
        "_refusal_port",
        "_request",
        "_tunnel",
        "_upgrades",
        "audit_fields",
        "head_memos",
        "kept_decision",
        "original",
        "server",
        "transport",
    )

    def __init__(
        self,
        server: ListenerState,
        dispatcher: ForwardDispatcher,
        *,
        original: tuple[IPAddress, int] | None = None,
        audit_extra: Mapping[str, Any] | None = None,
        upgrades: Upgrades | None = None,
        refusal_default_port: int = PLAIN_HTTP_DEFAULT_PORT,
    ) -> None:
        self.server = server
        self.head_memos = server.head_memos
        # Where its requests are decided and sent: its listener's dispatcher, or its own (an
        # inspected connection's, whose surface is the connection's principal and host).
        self._dispatcher = dispatcher
        # Who serves its upgrade requests; None: refused.
        self._upgrades = upgrades
        # The port a refusal's status line leaves out (an inspected connection's is 443).
        self._refusal_port = refusal_default_port
        # Where a redirected connection was sent (the transparent listener's plain HTTP), else
        # None; `audit_extra` joins the client's members on every line (its `original_dst`).
        self.original = original
        self._audit_extra = audit_extra
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set in connection_made
        self.audit_fields: dict[str, Any] = {}
        # None once the connection is a tunnel (or refused): its parser's memory is freed. Each
        # head it parses is a `ParsedRequest`, which `_request_head` makes into its exchange.
        self._framing: RequestFraming[ParsedRequest] | None = RequestFraming(
            ParsedRequest, server.head_memos, upgrades=upgrades is not None
        )
        self._exchange: ForwardExchange | None = None
        self._receiving: ForwardExchange | None = None
        self._queued: deque[ForwardExchange] = deque()
        self._tunnel: Tunnel | None = None
        self._connecting = False
        # Client bytes that arrive while a CONNECT is being dialed (a ClientHello sent eagerly):
        # bytes, not a bytearray, so that none is made for a connection that sends nothing early.
        self._early = b""
        self._pause_mask = NOT_PAUSED
        self._peer_uid: int | object | None = _UNKNOWN_UID
        # The connection's deadline (head or keep-alive idle) and half-close, as data; `_deadline`
        # is its entry in the wheel, which a tunnel on this connection takes over for its limits.
        self._limits = ClientLimits()
        self._deadline = LazyDeadline(self._timeout, server.wheel)
        self._closed = False
        # The CONNECT's dial (no task) and what it was decided for; the wheel entry bounds its
        # attempts (`DialDeadline`).
        self._dial: PinnedDial[UpstreamTunnelProtocol] | None = None
        self._request: TunnelRequest | None = None
        self.kept_decision: KeptDecision | None = None  # the dispatcher's, for the next request

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return self._tunnel is not None or self._exchange is not None or self._connecting

    def peer_uid(self, loaded: LoadedPolicy) -> int | None:
        """The uid behind a loopback client, when the policy binds uids to principals (an agent
        cannot borrow another principal, or `default`, through this listener); read from the
        kernel once per connection, and never when no uid is bound."""
        if not loaded.policy.transparent.principals:
            return None
        uid = self._peer_uid
        if uid is _UNKNOWN_UID:
            transport = self.transport
            uid = self._peer_uid = loopback_peer_uid(
                transport.get_extra_info("peername"), transport.get_extra_info("sockname")
            )
        return uid if isinstance(uid, int) else None

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it (no typing.cast:
        # it is a Python call on every connection).
        self.transport = transport  # type: ignore[assignment]
        fields = connection_fields(transport.get_extra_info("peername"))
        if self._audit_extra:
            fields = connection_fields_with(fields, **self._audit_extra)
        self.audit_fields = fields
        self.server.connections.add(self)
        self._limits.accepted(time.monotonic(), self.server.core.policy.current.policy.proxy.head_timeout_s)
        self._deadline.set_at(self._limits.at)

    def data_received(self, data: bytes) -> None:  # noqa: PLR0912  (one inline loop: the hot path)
        if self._tunnel is not None:
            self._tunnel.from_client(data)
            return
        if self._connecting:
            # Held, not parsed: beyond one peek's worth the client waits for the tunnel.
            self._early += data
            if len(self._early) > MAX_PEEK_BYTES:
                self.transport.pause_reading()
            return
        framing = self._framing
        if framing is None or self._closed:
            return
        limits = self._limits
        # Bytes after an idle wait start the next head, which must complete within the head
        # deadline (slowloris). Armed after this read's events, and only if the head is still
        # incomplete then: a head that arrives whole starts its request at once, which clears
        # that deadline again (no policy read, clock read or wheel move per keep-alive request).
        was_idle = limits.reason is ClientDeadline.KEEP_ALIVE_IDLE
        for event in framing.feed(data):
            # The events of a bodiless request first: one isinstance call each.
            if isinstance(event, ParsedRequest):
                self._request_head(event)
            elif isinstance(event, RequestEnd):
                self._request_end()
            elif isinstance(event, RequestBody):
                if self._receiving is not None:
                    self._receiving.request_body(event.data)
            elif isinstance(event, ConnectHead):
                # The tunnel's own limits take over. The wheel entry stays filed: when its slot
                # comes, `_timeout` finds nothing due and moves it on.
                self._limits.request_started()
                self._begin_connect(event)
            elif isinstance(event, UpgradeHead):
                self._limits.request_started()
                self._begin_upgrade(event)
                return
            else:
                error = event.error
                if self._upgrades is not None and error.message == UPGRADE_REFUSED:
                    error = self._upgrades.refused_with_body()
                self._refuse(error)
                return
        if was_idle and limits.reason is ClientDeadline.KEEP_ALIVE_IDLE:
            limits.bytes_arrived(time.monotonic(), self.server.core.policy.current.policy.proxy.head_timeout_s)
            self._deadline.set_at(limits.at)

    def eof_received(self) -> bool | None:
        if self._tunnel is not None:
            return self._tunnel.client_eof()
        owed = self._exchange is not None or self._connecting
        return True if self._limits.client_eof(response_owed=owed) is AfterFin.HALF_CLOSE else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        tunnel = self._tunnel
        if tunnel is not None:
            # Its close releases the wheel entry. It is usually closed already: the client's FIN
            # or the upstream's ended it.
            if not tunnel.closed:
                tunnel.client_lost(exc)
            return
        if not self._connecting:
            self._deadline.release()  # while dialing, the entry still bounds the dial
        for exchange in [self._exchange, *self._queued]:
            upstream = exchange.upstream if exchange is not None else None
            if exchange is not None and upstream is not None:
                upstream.exchange = None
                upstream.close()
                self.server.records.record_exchange_close(exchange, "client_closed")
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

    # request events ---------------------------------------------------------------------------
    def _request_head(self, request: ParsedRequest) -> None:
        self._limits.request_started()  # no deadline of ours while the request is served
        exchange = self._receiving = ForwardExchange(request, self)
        if self._exchange is None:
            self._exchange = exchange
            self._dispatcher.start(exchange)
        else:
            # Pipelined: answer in order, and read no further until this one's turn.
            self._queued.append(exchange)
            self.pause_client_reading(PauseReason.PIPELINE)

    def _request_end(self) -> None:
        receiving = self._receiving
        self._receiving = None
        if receiving is not None:
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
        # One histogram per request (latency); sizes are in the close audit line, which takes
        # the same duration.
        duration_s = time.monotonic() - exchange.started
        _FORWARD_SECONDS.observe(duration_s)
        server = self.server
        server.records.record_exchange_close(exchange, reason, duration_s)
        self._exchange = None
        if server.draining:
            server.activity_ended()  # it only wakes a drain
        if self._closed:
            return
        # The finished request's own keep-alive, not the connection's.
        if not self._limits.keep_alive(exchange.request.keep_alive, keep_alive, exchange.body_done, server.draining):
            self._close()
            return
        self._next_exchange()

    def fail_exchange(self, exchange: ForwardExchange, code: str, message: str) -> None:
        """The upstream failed mid-exchange: a 502 if nothing was sent yet, else cut the stream."""
        self.server.records.record_exchange_close(exchange, code)
        self._exchange = None
        self.server.activity_ended()
        if self._closed:
            return
        upstream = exchange.upstream
        head_sent = upstream is not None and upstream.head_sent
        if not head_sent:
            error = GatewayError(ErrorCode(code), message)
            self.server.records.count_decision("http", "error", code)
            self._answer_and_close(error)
            return
        self._close()

    def refuse_exchange(self, exchange: ForwardExchange, error: GatewayError) -> None:
        # Answered on the next loop iteration: a decision made as the head completes precedes the
        # parser's end-of-message for a bodiless request, and the connection may only stay open
        # once the request is fully consumed.
        asyncio.get_running_loop().call_soon(self._answer_refusal, exchange, error)

    def retry_exchange(self, exchange: ForwardExchange) -> None:
        self._dispatcher.retry(exchange)

    # dispatch --------------------------------------------------------------------------------
    def _answer_refusal(self, exchange: ForwardExchange, error: GatewayError) -> None:
        self._exchange = None
        if self._closed:
            return
        keep = self._limits.keep_alive(exchange.request.keep_alive, True, exchange.body_done, self.server.draining)
        conn = self.audit_fields.get("conn")
        self.transport.write(error_response(error, keep_alive=keep, conn=conn, default_port=self._refusal_port))
        if keep:
            self._next_exchange()
        else:
            self._close()

    def _next_exchange(self) -> None:
        if self._queued:
            exchange = self._exchange = self._queued.popleft()
            if not self._queued:
                self.resume_client_reading(PauseReason.PIPELINE)
            self._dispatcher.start(exchange)
            return
        self._limits.response_finished(time.monotonic(), self.server.core.policy.current.policy.proxy.idle_timeout_s)
        self._deadline.set_at(self._limits.at)

    def _begin_connect(self, head: ConnectHead) -> None:
        refusal = self.server.connect_refusal
        if refusal is not None:
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, refusal))
            return
        opener = self.server.tunnels
        self._framing = None  # a tunnel never parses HTTP again; free the parser's memory
        try:
            # Decided here when cached state suffices: a refusal is answered without a task.
            request = opener.decide(
                head.authority, head.authorization, self.audit_fields, peer_uid=self.peer_uid(self.server.core.loaded)
            )
        except GatewayError as error:
            self._answer_and_close(error, CONNECT_DEFAULT_PORT)
            return
        policy = request.loaded.policy
        if request.principal.inspect or policy.defaults.inspect or policy.credentials.entries:
            loaded, principal = request.loaded, request.principal
            if inspects_host(loaded.policy, principal, request.host.name, request.port, tls=True):
                self._begin_inspection(request, head.rest)
                return
        # Reading continues while the upstream is dialed (no pause/resume pair per tunnel);
        # data_received holds whatever arrives until the tunnel exists.
        self._connecting = True
        self._early += head.rest
        if request.target is None:
            # Not decided from cached state: the decision waits for DNS, in a task of its own.
            # Nothing is due until the dial's first attempt starts (the lookup has its own timeout).
            self._deadline.clear()
            spawn(self._resolve_then_dial(request), name="proxy-connect", loop=self.server.loop)
            return
        self._dial_upstream(request)

    def _begin_upgrade(self, head: UpgradeHead) -> None:
        """An upgrade request (only a framing made with `upgrades=True`, for a connection given
        `Upgrades`, emits one): judged and relayed by them, the transport theirs from then on."""
        upgrades = self._upgrades
        if upgrades is None:
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, UPGRADE_REFUSED))
            return
        self._framing = None  # whatever follows is the upgraded protocol's, or nothing
        try:
            relay = upgrades.take_over(self, head)
        except GatewayError as error:
            self._answer_and_close(error, self._refusal_port)
            return
        # This protocol is done; the relay owns the transport from here.
        self._closed = True
        self.server.connections.discard(self)
        self._deadline.cancel()
        self.transport.set_protocol(relay)

    # inspection (issue 25) ---------------------------------------------------------------------
    def _begin_inspection(self, request: TunnelRequest, early: bytes) -> None:
        """A CONNECT to a host an `inspect` entry names: TLS is terminated, never spliced."""
        opener = self.server.tunnels
        if self.server.inspection is None:
            opener.release(request.principal.name)
            error = GatewayError(
                ErrorCode.INSPECTION_UNSUPPORTED,
                f"{request.host.name} is inspected but no interception CA is configured (EGRESS_INSPECT_CA_CERT)",
            )
            self.server.records.record_deny(
                "connect",
                request.principal.name,
                request.host.name,
                request.port,
                error=error,
                generation=request.loaded.generation,
                client=self.audit_fields,
            )
            self._answer_and_close(error, CONNECT_DEFAULT_PORT)
            return
        self._connecting = True
        self._early += early
        if request.target is None:
            self._deadline.clear()
            spawn(self._resolve_then_inspect(request), name="proxy-inspect", loop=self.server.loop)
            return
        self._hand_to_inspection(request)

    async def _resolve_then_inspect(self, request: TunnelRequest) -> None:
        try:
            request = await self.server.tunnels.resolve(request)
        except GatewayError as error:
            self._connect_failed(error)
            return
        self._hand_to_inspection(request)

    def _hand_to_inspection(self, request: TunnelRequest) -> None:
        # Inspected requests are limited per request (the pool, the deadlines), not as a tunnel.
        opener = self.server.tunnels
        opener.release(request.principal.name)
        self._connecting = False
        service = self.server.inspection
        if self._closed or service is None:
            return
        assert request.target is not None
        self.server.records.record_allow("connect", request.principal, request.target, client=self.audit_fields)
        conn = self.audit_fields.get("conn")
        established = (
            b"HTTP/1.1 200 Connection Established\r\n"
            + (b"X-Egress-Id: " + conn.encode("ascii") + b"\r\n" if isinstance(conn, str) else b"")
            + b"\r\n"
        )
        # This protocol is done; the inspected connection owns the transport from here.
        self._closed = True
        self._framing = None
        self.server.connections.discard(self)
        self._deadline.cancel()
        early, self._early = self._early, b""
        if len(early) > MAX_PEEK_BYTES:
            self.transport.resume_reading()
        service.take_over(
            self.transport,
            principal=request.principal.name,
            host=request.host.name,
            port=request.port,
            early=early,
            audit_fields=self.audit_fields,
            preface=established,
        )

    async def _resolve_then_dial(self, request: TunnelRequest) -> None:
        try:
            request = await self.server.tunnels.resolve(request)
        except GatewayError as error:
            self._connect_failed(error)
            return
        self._dial_upstream(request)
        dial = self._dial
        if dial is not None and self.server.tunnels.shutting_down:
            dial.cancel()  # the listener shut down while DNS answered: it stops no dial made later

    def _dial_upstream(self, request: TunnelRequest) -> None:
        loop = self.server.loop
        assert loop is not None  # set as the listener starts, before any connection
        self._request = request
        dial = self._dial = self.server.tunnels.dial(request, self, self, loop)
        dial.start()

    # DialDeadline (gateway.egress.dial_deadline): the connection's wheel entry, which has nothing
    # else due while the CONNECT is dialed, bounds each attempt: no loop timer per dial.
    def start_dial_attempt(self, timeout_s: float) -> None:
        self._deadline.set_at(time.monotonic() + timeout_s)

    def end_dial_attempt(self) -> None:
        self._deadline.clear()

    # DialOwner (gateway.egress.connect): how the dial ended.
    def dial_connected(self, transport: asyncio.Transport, protocol: UpstreamTunnelProtocol, address: str) -> None:
        request, dial = self._request, self._dial
        assert request is not None
        assert dial is not None
        self._request = self._dial = None
        self._connecting = False
        opener = self.server.tunnels
        dialed = DialedUpstream(transport, protocol, address, dial.target)
        if self._closed or self.server.draining:
            # While dialing, only a reset closes the client side (a FIN is answered as a half-close).
            opener.abandon(request, dial, dialed, "shutdown" if self.server.draining else "client_reset")
            self._close()
            return
        early = self._early
        if early:
            self._early = b""
        tunnel = self._tunnel = opener.establish(
            self.transport, request, dial, dialed, early=early, deadline=self._deadline
        )
        if tunnel.closed:
            return
        if len(early) > MAX_PEEK_BYTES:
            self.transport.resume_reading()  # data_received paused reading while we dialed
        if self._limits.eof:
            tunnel.client_eof()  # the client half-closed while we dialed

    def dial_failed(self, error: GatewayError | None) -> None:
        request, dial = self._request, self._dial
        assert request is not None
        assert dial is not None
        self._request = self._dial = None
        if error is not None and error.destination is None:
            error.destination = (request.host.name, request.port)  # the status line names it
        self.server.tunnels.dial_failed(request, dial, error)
        self._connect_failed(error)

    def _connect_failed(self, error: GatewayError | None) -> None:
        """The CONNECT was refused after its head (DNS, the dial), or its dial cancelled (None:
        shutdown, no answer owed)."""
        self._connecting = False
        if self._closed:
            self._deadline.release()
        elif error is None:
            self._close()
        else:
            self._answer_and_close(error, CONNECT_DEFAULT_PORT)

    # closing ---------------------------------------------------------------------------------
    def _refuse(self, error: GatewayError) -> None:
        """A head that cannot be served: answer once and close (the stream is out of sync)."""
        self._framing = None
        if self._closed:
            return
        if self._exchange is not None and self._exchange.upstream is not None:
            # Mid-body: the request already went upstream; nothing consistent can be sent back.
            self.abort("malformed_request")
            return
        generation = self.server.core.policy.current.generation
        self.server.records.record_deny(
            "http", None, None, None, error=error, generation=generation, client=self.audit_fields
        )
        self._answer_and_close(error)

    def _answer_and_close(self, error: GatewayError, default_port: int | None = None) -> None:
        """The error response (with the connection's id), then the close: the connection serves
        nothing more after a refusal or a failed exchange. `default_port`: the request's own
        (443 for CONNECT), left out of the status line's destination."""
        conn = self.audit_fields.get("conn")
        self.transport.write(error_response(error, keep_alive=False, conn=conn, default_port=default_port))
        self._close()

    def revoke_if_denied(self) -> None:
        """Drop the request in flight (and the connection) if the policy now denies its destination."""
        exchange = self._exchange
        if exchange is None or self._closed:
            return
        target, principal = exchange.decision.target, exchange.decision.principal
        if target is None or principal is None:
            return
        upstream = exchange.upstream
        address = upstream.key[1] if upstream is not None else target.address_texts[0]
        loaded = self.server.core.policy.current
        if revocation(self.server.core, loaded, principal, target, address) is None:
            return
        if upstream is not None:
            upstream.exchange = None
            upstream.close()
        self.server.records.record_exchange_close(exchange, REVOKED_REASON)
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

    def _timeout(self) -> None:
        if self._tunnel is not None:
            self._tunnel.deadline_check()  # the tunnel's idle time or lifetime
            return
        if self._connecting:
            # An attempt of the dial outlived connect_timeout_s (even if the client has left: the
            # dial must still end, with its audit lines): the dialer takes this as its timeout.
            if self._dial is not None:
                self._dial.attempt_timed_out()
            return
        if self._closed:
            return
        expiry = self._limits.expired(time.monotonic(), busy=self.busy)
        if expiry is None:
            self._deadline.set_at(self._limits.at)  # not due yet, or nothing due while busy
            return
        # Dropped without a response: a slowloris client is not owed one, and an idle keep-alive
        # close is normal HTTP/1.1.
        self._closed = True
        if expiry is ClientExpiry.CLOSE:
            self.transport.close()
        else:
            self.transport.abort()
