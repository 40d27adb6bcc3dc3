"""One forwarded request and what both sides of the proxy share about it, and its upstream head.

Owns the state of one plain-HTTP exchange (`ForwardExchange`): the request's framing and
keep-alive intent as parsed, its body on the way upstream (held, bounded, until a connection
exists, or until the outbound scan's window is read: `body_guard`, issue 26), the retry rule of
an idempotent request, and the decision it was allowed under; the
`ClientSide` interface the upstream half calls back through; the reasons client reading is paused
(`PauseReason`); and `build_request_head`, the rewritten head the upstream sees (origin-form
target, Host from the URI, the end-to-end field lines `http1/request_head.py` read from the client's
head: hop-by-hop fields, the fields Connection names and Proxy-* removed).

Never reads or writes a socket of its own (the listener and `upstream.UpstreamConnection` do),
never decides policy, never forwards Proxy-Authorization.
"""

from __future__ import annotations

import asyncio
import time
from enum import IntFlag
from typing import TYPE_CHECKING, Any, Protocol

from gateway.egress.target import PinnedTarget
from gateway.errors import GatewayError
from gateway.policy.model import LoadedPolicy, Principal, ProxySettings
from gateway.proxy.forward.pool import PoolKey
from gateway.proxy.http1.request_head import request_fields
from gateway.proxy.http1.response_framing import ResponseFraming
from gateway.vet.addresses import IPAddress

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.credentials.guard import BodyGuard
    from gateway.credentials.inject import Scrubber
    from gateway.proxy.decision.records import RequestLines
    from gateway.proxy.forward.kept_decision import KeptDecision

WRITE_HIGH_WATER_BYTES = 256 * 1024
WRITE_LOW_WATER_BYTES = 64 * 1024
# RFC 9110 section 9.2.2: a request with one of these methods may be sent again when the
# connection failed before any response arrived (section 9.2.2 and RFC 9112 section 9.3.1).
IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


class PauseReason(IntFlag):
    """Why the client's reading is paused; reading resumes once no reason is left."""

    UPSTREAM_WRITE = 1  # the upstream's write buffer is full
    BODY_BUFFER = 2  # a request body is held while the upstream is dialed
    PIPELINE = 4  # a pipelined request waits for the ones before it


# An exchange's settings until its decision sets the policy's (nothing reads them before).
UNDECIDED_SETTINGS = ProxySettings()

# Built once: calling a Flag class costs several Python frames, once per connection otherwise.
NOT_PAUSED = PauseReason(0)


class ClientSide(Protocol):
    """What the forwarder and dispatcher need from the client connection (implemented in client_connection.py)."""

    transport: asyncio.Transport
    # `conn`, `client_ip`, `client_port`: what every audit line of this connection carries.
    audit_fields: dict[str, Any]
    # Its last request's decision, which the dispatcher may reuse for the next (`KeptDecision`).
    kept_decision: KeptDecision | None
    # Where a redirected connection was sent (the transparent listener's), else None.
    original: tuple[IPAddress, int] | None

    @property
    def closed(self) -> bool: ...

    def refuse_exchange(self, exchange: ForwardExchange, error: GatewayError) -> None: ...

    def peer_uid(self, loaded: LoadedPolicy) -> int | None: ...

    def response_finished(self, exchange: ForwardExchange, *, keep_alive: bool, reason: str) -> None: ...

    def fail_exchange(self, exchange: ForwardExchange, code: str, message: str) -> None: ...

    def retry_exchange(self, exchange: ForwardExchange) -> None: ...

    def pause_client_reading(self, reason: PauseReason) -> None: ...

    def resume_client_reading(self, reason: PauseReason) -> None: ...


class UpstreamSide(Protocol):
    """What the client side and the exchange need of its upstream connection (`upstream.py`)."""

    # The exchange it carries; set to None by whoever takes the exchange off it.
    exchange: ForwardExchange | None
    last_activity: float

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def framing(self) -> ResponseFraming | None: ...

    @property
    def key(self) -> PoolKey: ...

    @property
    def head_sent(self) -> bool: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class ForwardExchange:
    """One request and its response: state shared by the client and upstream protocols.

    Made by the listener's `RequestFraming` as the head completes (its `new_head`), so the parse
    and the exchange are one object; `client` is set by the connection that parsed it, before
    anything reads it."""

    __slots__ = (
        "authorization",
        "body_done",
        "body_guard",
        "body_screened",
        "bytes_down",
        "bytes_up",
        "chunked_request",
        "client",
        "client_head",
        "client_http10",
        "client_keep_alive",
        "connection_named",
        "fields",
        "lines",
        "method",
        "pending",
        "pending_bytes",
        "principal",
        "principal_rule",
        "request_head",
        "retried",
        "scrubber",
        "settings",
        "started",
        "status",
        "target",
        "upstream",
        "url",
    )

    client: ClientSide

    # Positional: the framing calls it once per request head, and keywords cost more per call.
    def __init__(  # noqa: PLR0917
        self,
        method: bytes,
        url: bytes,
        client_head: bytes,
        fields: bytes,
        authorization: bytes | None,
        connection_named: frozenset[bytes],
        chunked_request: bool,
        client_http10: bool,
        client_keep_alive: bool,
    ) -> None:
        self.method = method
        self.url = url
        self.client_head = client_head  # the head as the client sent it, method to blank line
        self.fields = fields  # its end-to-end field lines, what the upstream head carries
        self.authorization = authorization
        self.connection_named = connection_named  # the header names its Connection field lists
        self.chunked_request = chunked_request
        self.client_http10 = client_http10
        self.client_keep_alive = client_keep_alive  # this request's own intent
        self.body_done = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.upstream: UpstreamSide | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        # The proxy settings of the generation the request was decided under (its response cap
        # and deadlines): the object, not a copy of each.
        self.settings = UNDECIDED_SETTINGS
        self.request_head = b""
        self.retried = False
        # The monotonic clock, as the connection's deadlines: its close reads one clock for both.
        self.started = time.monotonic()
        self.status = 0  # the upstream's final status once its head went to the client
        self.lines: RequestLines | None = None  # its audit lines once allowed (`DecisionRecords`)
        self.principal = ""
        self.principal_rule: Principal | None = None  # what the decision was made for (live permission)
        self.target: PinnedTarget | None = None
        # The outbound scan of its body (issue 26): while set, the request is held (nothing sent
        # upstream) until the window is read or the body ends; `body_screened` then continues.
        self.body_guard: BodyGuard | None = None
        self.body_screened: Callable[[], None] | None = None
        # Replaces a bound credential's real value in the response (issue 26); None: nothing to.
        self.scrubber: Scrubber | None = None

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """Every field of the request head as llhttp reads it (the transparent listener's Host)."""
        return request_fields(self.client_head)

    def request_body(self, data: bytes) -> None:
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked_request else data
        self.bytes_up += len(data)
        guard = self.body_guard
        if guard is not None and not guard.settled:
            self._screen_body(guard, data, framed)
            return
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None:
            upstream.last_activity = time.monotonic()  # a slow upload is not a hung origin
            upstream.transport.write(framed)
            return
        # Not connected yet: hold the body, but never more than one write buffer's worth.
        self.pending.append(framed)
        self.pending_bytes += len(framed)
        if self.pending_bytes > WRITE_HIGH_WATER_BYTES:
            self.client.pause_client_reading(PauseReason.BODY_BUFFER)

    def _screen_body(self, guard: BodyGuard, data: bytes, framed: bytes) -> None:
        """Scan and hold: nothing of a screened body leaves before its verdict."""
        guard.feed(data)
        self.pending.append(framed)
        self.pending_bytes += len(framed)
        if guard.settled:
            self._body_read()
        elif self.pending_bytes > guard.body.window_bytes + WRITE_HIGH_WATER_BYTES:
            self.client.pause_client_reading(PauseReason.BODY_BUFFER)

    def _body_read(self) -> None:
        """The window is read (or the body ended): the dispatcher continues, if it is waiting
        (else it finds the guard settled when its decision is made)."""
        then, self.body_screened = self.body_screened, None
        if then is not None:
            then()

    @property
    def resendable(self) -> bool:
        """Whether the whole request can be sent again: idempotent, no body bytes, not yet retried."""
        return self.method in IDEMPOTENT_METHODS and self.body_done and self.bytes_up == 0 and not self.retried

    def prepare_retry(self) -> None:
        """Reset what the failed attempt consumed so `UpstreamConnection.start` can send it again."""
        self.retried = True
        self.upstream = None
        self.pending = [b"0\r\n\r\n"] if self.chunked_request else []
        self.pending_bytes = 0

    def request_end(self) -> None:
        self.body_done = True
        if self.chunked_request:
            if self.upstream is not None and self.upstream.transport is not None:
                self.upstream.transport.write(b"0\r\n\r\n")
            else:
                self.pending.append(b"0\r\n\r\n")
        guard = self.body_guard
        if guard is not None and not guard.settled:
            guard.ended = True
            self._body_read()
            return
        upstream = self.upstream
        # `upstream.response_complete`, inline: once per request.
        if upstream is not None and upstream.framing is not None and upstream.framing.complete:
            upstream.finish()


def build_request_head(method: bytes, target: bytes, authority: bytes, fields: bytes, chunked: bool) -> bytes:
    """The upstream head: origin-form target, Host from the absolute URI, then the request's
    end-to-end field lines (`request_head.read_field_block`'s, each CRLF first)."""
    return b"".join(
        (
            method,
            b" ",
            target,
            b" HTTP/1.1\r\nHost: ",
            authority,
            fields,
            b"\r\nTransfer-Encoding: chunked\r\n\r\n" if chunked else b"\r\n\r\n",
        )
    )
