"""One client connection of the forward proxy: dispatch to CONNECT or forwarding, deadlines, close.

Owns the client side of every proxy connection as an asyncio Protocol that feeds client bytes to
its `http1/request_framing.RequestFraming` (the sans-I/O request half: parsing, caps, pipelining,
keep-alive intent) and its `deadlines/limits.ClientLimits` (the head deadline against
slowloris, the keep-alive idle time, the half-close, whether another request is served) and
carries out what they say: its one entry in the listener's `deadlines/wheel.DeadlineWheel` moved, the
write side kept open after the client's FIN, the connection aborted or closed, pipelined requests
answered in order, denials with X-Egress-Code, and the request in flight dropped when a policy
reload denies it. Its `decision/context.ClientContext` is made once, as the connection is
accepted. Each absolute-URI request goes to `forward/dispatch.ForwardDispatcher` (decided without
a task when cached state suffices); a CONNECT head goes to a `tunnel/attempt.TunnelAttempt` (the
listener's `ConnectSurface`), which owns it to the splice: meanwhile this connection holds the
client's early bytes, passes its wheel entry's expiry on (it bounds the dial), and gives its
transport to the tunnel or to inspection when told. Its requests go to the dispatcher it was
given (an inspected connection's own, whose `ForwardSurface` is the connection's), and an upgrade
request to its `Upgrades` if it has them (an inspected connection's WebSocket relay), else it is
refused. `server.py` owns the listener,
`forward/upstream.py` the upstream side of an exchange and `tunnel/splice.py` an established tunnel.

Never resolves a name or dials a socket itself (the egress core decides; a tunnel attempt's
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
from gateway.proxy.deadlines.limits import AfterFin, ClientDeadline, ClientExpiry, ClientLimits
from gateway.proxy.deadlines.wheel import DeadlineWheel, LazyDeadline
from gateway.proxy.decision.context import ClientContext
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
from gateway.proxy.tunnel.attempt import Inspection, TunnelAttempt
from gateway.proxy.tunnel.connect_surface import ConnectSurface
from gateway.proxy.tunnel.splice import Tunnel
from gateway.vet.addresses import IPAddress

if TYPE_CHECKING:
    from gateway.policy.model import LoadedPolicy
    from gateway.proxy.forward.kept_decision import KeptDecision


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

    @property
    def connect_surface(self) -> ConnectSurface | None:
        """What a CONNECT's attempt does here (None where CONNECT is refused)."""
        ...

    def activity_ended(self) -> None: ...


# The unlabelled histogram's child, bound once: the family's `observe` is one more call per request.
_FORWARD_SECONDS = metrics.HTTP_FORWARD_SECONDS.labels()


# A refusal's status line names the port only when it is not the request's default.
PLAIN_HTTP_DEFAULT_PORT = 80


class ClientConnection(asyncio.Protocol):
    """One client connection: parses heads, runs exchanges one at a time, or becomes a tunnel."""

    __slots__ = (
        "_attempt",
        "_audit_extra",
        "_closed",
        "_deadline",
        "_dispatcher",
        "_early",
        "_exchange",
        "_framing",
        "_limits",
        "_pause_mask",
        "_queued",
        "_receiving",
        "_refusal_port",
        "_tunnel",
        "_upgrades",
        "audit_fields",
        "context",
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
        self.context: ClientContext = None  # type: ignore[assignment]  # made in connection_made
        # None once the connection is a tunnel (or refused): its parser's memory is freed. Each
        # head it parses is a `ParsedRequest`, which `_request_head` makes into its exchange.
        serves_upgrades = upgrades is not None
        self._framing: RequestFraming[ParsedRequest] | None = RequestFraming(
            ParsedRequest, server.head_memos, serves_upgrades
        )
        self._exchange: ForwardExchange | None = None
        self._receiving: ForwardExchange | None = None
        self._queued: deque[ForwardExchange] = deque()
        self._tunnel: Tunnel | None = None
        # A CONNECT on its way to a tunnel: it owns the decision, the dial and the hand-over.
        self._attempt: TunnelAttempt[ConnectHead] | None = None
        # Client bytes that arrive while a CONNECT's attempt runs (a ClientHello sent eagerly):
        # bytes, not a bytearray, so that none is made for a connection that sends nothing early.
        self._early = b""
        self._pause_mask = NOT_PAUSED
        # The connection's deadline (head or keep-alive idle) and half-close, as data; `_deadline`
        # is its entry in the wheel, which a tunnel on this connection takes over for its limits.
        self._limits = ClientLimits()
        self._deadline = LazyDeadline(self._timeout, server.wheel)
        self._closed = False
        self.kept_decision: KeptDecision | None = None  # the dispatcher's, for the next request

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def busy(self) -> bool:
        return self._tunnel is not None or self._exchange is not None or self._attempt is not None

    def peer_uid(self, loaded: LoadedPolicy) -> int | None:
        """The uid behind a loopback client, when the policy binds uids to principals (an agent
        cannot borrow another principal, or `default`, through this listener); read from the
        kernel once per connection (`ClientContext.peer_uid`), and never when no uid is bound."""
        return self.context.peer_uid(loaded)

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it (no typing.cast:
        # it is a Python call on every connection).
        self.transport = transport  # type: ignore[assignment]
        fields = connection_fields(transport.get_extra_info("peername"))
        if self._audit_extra:
            fields = connection_fields_with(fields, **self._audit_extra)
        self.audit_fields = fields
        self.context = ClientContext(self.transport, fields, self.original)
        self.server.connections.add(self)
        self._limits.accepted(time.monotonic(), self.server.core.policy.current.policy.proxy.head_timeout_s)
        self._deadline.set_at(self._limits.at)

    def data_received(self, data: bytes) -> None:  # noqa: PLR0912  (one inline loop: the hot path)
        if self._tunnel is not None:
            self._tunnel.from_client(data)
            return
        if self._attempt is not None:
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
        owed = self._exchange is not None or self._attempt is not None
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
        if self._attempt is None:
            self._deadline.release()  # while an attempt runs, the entry still bounds its dial
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
        # the same duration. One clock read for it and the keep-alive idle deadline.
        now = time.monotonic()
        duration_s = now - exchange.started
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
        self._next_exchange(now)

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
            self._next_exchange(time.monotonic())
        else:
            self._close()

    def _next_exchange(self, now: float) -> None:
        """The next queued request starts, or the keep-alive idle deadline runs from `now` (the
        clock the finished exchange's close read)."""
        if self._queued:
            exchange = self._exchange = self._queued.popleft()
            if not self._queued:
                self.resume_client_reading(PauseReason.PIPELINE)
            self._dispatcher.start(exchange)
            return
        self._limits.response_finished(now, self.server.core.policy.current.policy.proxy.idle_timeout_s)
        self._deadline.set_at(self._limits.at)

    def _begin_connect(self, head: ConnectHead) -> None:
        refusal = self.server.connect_refusal
        if refusal is not None:
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, refusal))
            return
        surface = self.server.connect_surface
        assert surface is not None  # a listener that serves CONNECT has one
        self._framing = None  # a tunnel never parses HTTP again; free the parser's memory
        # Reading continues while the attempt runs (no pause/resume pair per tunnel);
        # data_received holds whatever arrives until the tunnel exists.
        self._early += head.rest
        attempt = self._attempt = TunnelAttempt(surface, self.context, self, self._deadline, head)
        attempt.start()

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
        self._give_away()
        self.transport.set_protocol(relay)

    # TunnelClient (tunnel/attempt.py): the attempt gives the transport away, or ends ------------
    def gone_reason(self) -> str | None:
        if self.server.draining:
            return "shutdown"
        # While dialing, only a reset closes the client side (a FIN is answered as a half-close).
        return "client_reset" if self._closed else None

    def splice(self, tunnel: Tunnel) -> None:
        self._attempt = None
        self._tunnel = tunnel
        early = self._early
        if early:
            self._early = b""
        # Reading resumes if data_received paused it while we dialed; a half-close is passed on.
        tunnel.start(early, self._limits.eof)

    def detach(self) -> bytes:
        self._attempt = None
        self._give_away()  # to the inspected connection
        early, self._early = self._early, b""
        if len(early) > MAX_PEEK_BYTES:
            self.transport.resume_reading()
        return early

    def attempt_ended(self, answer: bytes) -> None:
        self._attempt = None
        if self._closed:
            self._deadline.release()  # the dial it bounded is over
            return
        if answer:
            self.transport.write(answer)
        self._close()

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
        target, principal = exchange.target, exchange.principal
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

    def _give_away(self) -> None:
        """This protocol is done: another (a WebSocket relay, inspection) owns the transport from
        now on."""
        self._closed = True
        self.server.connections.discard(self)
        self._deadline.cancel()

    def _close(self) -> None:
        self._closed = True
        self._deadline.cancel()
        self.transport.close()

    def _timeout(self) -> None:
        if self._tunnel is not None:
            self._tunnel.deadline_check()  # the tunnel's idle time or lifetime
            return
        if self._attempt is not None:
            self._attempt.deadline_passed()  # it bounds the attempt's dial
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
