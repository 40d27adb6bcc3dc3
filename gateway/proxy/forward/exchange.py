"""One forwarded request in three parts, each with one writer, and its upstream head.

Owns the state of one plain-HTTP exchange (`ForwardExchange`), split by who writes it: the
request as the framing parsed it (`ParsedRequest`, immutable), the dispatcher's decision
(fields of the exchange that only `dispatch.ForwardDispatcher` writes: the URI decided, the
field lines forwarded, principal, target, settings, audit lines, the outbound scan's hold, issue
26), and the bytes each way (fields of the exchange too: the body on its way upstream, held and
bounded until a connection exists or the scan's window is read, written by its methods; what the
upstream relayed back, written by the upstream). It also owns the retry rule of an idempotent
request; the `ClientSide` and `UpstreamSide` interfaces the two halves call each other through;
the reasons client reading is paused (`PauseReason`); and `build_request_head`, the rewritten
head the upstream sees (origin-form target, Host from the URI, the end-to-end field lines
`http1/request_head.py` read from the client's head: hop-by-hop fields, the fields Connection
names and Proxy-* removed).

Never reads or writes a socket (body bytes go through `UpstreamSide.send_body`), never decides
policy, never forwards Proxy-Authorization.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import IntFlag
from typing import TYPE_CHECKING, Any, Final, Protocol

from gateway.errors import GatewayError
from gateway.policy.model import LoadedPolicy, ProxySettings
from gateway.proxy.forward.pool import PoolKey
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.request_head import request_fields
from gateway.vet.addresses import IPAddress

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.credentials.guard import BodyGuard
    from gateway.credentials.inject import Scrubber
    from gateway.egress.target import PinnedTarget
    from gateway.policy.inspect_decide import RequestVerdict
    from gateway.policy.model import Principal
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
    # Its listener's memos of the heads it has read, for the response framings too.
    head_memos: HeadMemos

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

    @property
    def key(self) -> PoolKey: ...

    @property
    def head_sent(self) -> bool: ...

    def send_body(self, data: bytes) -> bool:
        """Write request body bytes now; False when not connected (the exchange holds them)."""
        ...

    def request_ended(self) -> None:
        """The request's body ended: the exchange is finished if its response already is."""
        ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


@dataclass(slots=True)
class ParsedRequest:
    """A request head as the client's `RequestFraming` parsed it (the framing's `new_head`):
    made by the framing, never changed (its fields are `Final`). What the dispatcher rewrites (the
    URI it decides, the field lines it forwards) is the decision's, in the exchange.

    Slots rather than a named tuple: a named tuple's field is read through a descriptor Python
    3.11 does not specialise, and the fields are read about ten times per request; slots take
    about 2.3 k instructions less per request, construction included (bench/README.md
    "Structure"). Not frozen: a frozen dataclass sets each field through `object.__setattr__`."""

    method: Final[bytes]
    url: Final[bytes]  # the request target as sent
    head: Final[bytes]  # the head as the client sent it, method to blank line
    fields: Final[bytes]  # its end-to-end field lines, what the upstream head carries unless screened
    authorization: Final[bytes | None]
    chunked: Final[bool]
    http10: Final[bool]
    keep_alive: Final[bool]  # this request's own intent (RFC 9112 section 9.3)

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """Every field of the head as llhttp reads it (a Host, the request rules' header matches)."""
        return request_fields(self.head)


class ForwardExchange:
    """One request and its response, for the client connection that read it (`client`), in three
    parts by writer. The request as parsed (`request`, the framing's, immutable). The decision,
    written by `dispatch.ForwardDispatcher` and the surface it calls only: `url`, `fields`,
    `principal`, `target`, `settings`, `lines`, `upstream_head`, `verdict`, `body_guard`,
    `body_screened`, `scrubber` (the upstream side, the client connection and the records read
    them; slots of the exchange rather than an object of their own: one object less to build
    per request, about 2.5 k instructions). The bytes each way: the request side (`pending`,
    `pending_bytes`, `bytes_up`, `body_done`, `retried`) written by the methods below, which relay
    the request body towards the upstream (sent once one exists, held and bounded until then or
    until the outbound scan's verdict); the response side (`upstream`, `status`, `bytes_down`) by
    the `upstream.UpstreamConnection` carrying it."""

    # The decision's slots (its writer is the dispatcher) are named in the docstring.
    __slots__ = (
        "body_done",
        "body_guard",
        "body_screened",
        "bytes_down",
        "bytes_up",
        "client",
        "fields",
        "lines",
        "pending",
        "pending_bytes",
        "principal",
        "request",
        "retried",
        "scrubber",
        "settings",
        "started",
        "status",
        "target",
        "upstream",
        "upstream_head",
        "url",
        "verdict",
    )

    def __init__(self, request: ParsedRequest, client: ClientSide) -> None:
        self.request = request
        self.client = client
        # The decision, written by the dispatcher: until then, the request's own URI and fields.
        self.url = request.url  # the absolute URI decided (a surface makes it absolute)
        # The field lines the upstream head carries (after the outbound guard).
        self.fields = request.fields
        self.principal: Principal | None = None  # who it was decided for (live permission)
        self.target: PinnedTarget | None = None
        # The proxy settings of the generation it was decided under (its response cap and
        # deadlines): the object, not a copy of each.
        self.settings = UNDECIDED_SETTINGS
        self.lines: RequestLines | None = None  # its audit lines once allowed (`DecisionRecords`)
        self.upstream_head = b""  # the head sent upstream, kept for a retry
        # The inspect rules' verdict when a rule judged it (its close line names the rule).
        self.verdict: RequestVerdict | None = None
        # The outbound scan of its body (issue 26): while set, the request is held (nothing sent
        # upstream) until the window is read or the body ends; `body_screened` then continues.
        self.body_guard: BodyGuard | None = None
        self.body_screened: Callable[[], None] | None = None
        # Replaces a bound credential's real value in the response (issue 26); None: nothing to.
        self.scrubber: Scrubber | None = None
        # The monotonic clock, as the connection's deadlines: its close reads one clock for both.
        self.started = time.monotonic()
        self.body_done = False
        self.pending: list[bytes] = []  # body bytes held until an upstream exists (or screened)
        self.pending_bytes = 0
        self.bytes_up = 0
        self.retried = False
        self.upstream: UpstreamSide | None = None
        self.status = 0  # the upstream's final status once its head went to the client
        self.bytes_down = 0

    def request_body(self, data: bytes) -> None:
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self.request.chunked else data
        self.bytes_up += len(data)
        guard = self.body_guard
        if guard is not None and not guard.settled:
            self._screen_body(guard, data, framed)
            return
        upstream = self.upstream
        if upstream is not None and upstream.send_body(framed):
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

    def take_held_body(self) -> bytes:
        """The body held so far, for the upstream's first write (and the client reads again)."""
        if not self.pending:
            return b""
        held = b"".join(self.pending)
        self.pending.clear()
        self.pending_bytes = 0
        self.client.resume_client_reading(PauseReason.BODY_BUFFER)
        return held

    @property
    def resendable(self) -> bool:
        """Whether the whole request can be sent again: idempotent, no body bytes, not yet retried."""
        return self.request.method in IDEMPOTENT_METHODS and self.body_done and self.bytes_up == 0 and not self.retried

    def prepare_retry(self) -> None:
        """Reset what the failed attempt consumed so `UpstreamConnection.start` can send it again
        (the upstream that failed has let go of it)."""
        self.retried = True
        self.pending = [b"0\r\n\r\n"] if self.request.chunked else []
        self.pending_bytes = 0

    def request_end(self) -> None:
        self.body_done = True
        upstream = self.upstream
        if self.request.chunked and (upstream is None or not upstream.send_body(b"0\r\n\r\n")):
            self.pending.append(b"0\r\n\r\n")
        guard = self.body_guard
        if guard is not None and not guard.settled:
            guard.ended = True
            self._body_read()
            return
        if upstream is not None:
            upstream.request_ended()


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
