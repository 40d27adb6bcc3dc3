"""Absolute-URI HTTP forwarding: one request relayed to a pinned upstream, the response streamed back.

Owns the upstream side of plain HTTP (an upstream connection and the exchange it carries): the
rewritten request head (hop-by-hop headers and the proxy credential removed, Host taken from
the URI), the response parsed with httptools and re-framed for the client (so an upstream cannot
smuggle a second response through an ambiguous body), the response byte cap, and backpressure in
both directions, the upstream response deadline (`proxy.idle_timeout_s` without a byte from the
upstream: 504 before the response head, a cut stream after it), and one retry on a fresh
connection when a pooled one turns out closed before answering an idempotent request. One client
write per upstream read: head and body bytes are coalesced.

Never resolves a name and never dials anything but a `PinnedTarget` through
`open_pinned_connection`; never forwards Proxy-Authorization.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, cast

import httptools

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import Principal
from gateway.proxy.heads import FRAMING_FIELDS, HOP_BY_HOP, connection_tokens, named_by_connection
from gateway.proxy.pool import PoolKey, UpstreamPool
from gateway.proxy.response_head import MAX_RESPONSE_HEAD_BYTES, ResponseHeadScanner

WRITE_HIGH_WATER_BYTES = 256 * 1024
WRITE_LOW_WATER_BYTES = 64 * 1024
NO_BODY_STATUSES = frozenset({204, 304})
# RFC 9110 section 9.2.2: a request with one of these methods may be sent again when the
# connection failed before any response arrived (section 9.2.2 and RFC 9112 section 9.3.1).
IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


class _StopParsing(Exception):
    """Raised inside an httptools callback to stop the parser; the reason is on the connection."""


class ClientSide(Protocol):
    """What the forwarder and dispatcher need from the client connection (implemented in server.py)."""

    transport: asyncio.Transport

    @property
    def closed(self) -> bool: ...

    def refuse_exchange(self, exchange: ForwardExchange, error: GatewayError) -> None: ...

    def response_finished(self, exchange: ForwardExchange, *, keep_alive: bool, reason: str) -> None: ...

    def fail_exchange(self, exchange: ForwardExchange, code: str, message: str) -> None: ...

    def retry_exchange(self, exchange: ForwardExchange) -> None: ...

    def pause_client_reading(self, reason: int) -> None: ...

    def resume_client_reading(self, reason: int) -> None: ...


_MALFORMED = GatewayError(ErrorCode.CONNECT_FAILURE, "the upstream response is malformed")

PAUSE_UPSTREAM_WRITE = 1
PAUSE_BODY_BUFFER = 2
PAUSE_PIPELINE = 4


class ForwardExchange:
    """One request and its response: state shared by the client and upstream protocols."""

    __slots__ = (
        "body_done",
        "bytes_down",
        "bytes_up",
        "chunked_request",
        "client",
        "client_http10",
        "client_keep_alive",
        "head_only",
        "max_response_bytes",
        "method",
        "pending",
        "pending_bytes",
        "principal",
        "principal_rule",
        "request_head",
        "response_head_s",
        "response_idle_s",
        "response_total_s",
        "retried",
        "started",
        "target",
        "upstream",
    )

    def __init__(
        self, client: ClientSide, method: bytes, *, chunked_request: bool, client_http10: bool, client_keep_alive: bool
    ) -> None:
        self.client = client
        self.method = method
        self.head_only = method == b"HEAD"
        self.chunked_request = chunked_request
        self.client_http10 = client_http10
        self.client_keep_alive = client_keep_alive
        self.body_done = False
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.upstream: UpstreamConnection | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        self.max_response_bytes = 0
        self.response_idle_s = 0.0
        self.response_head_s = 0.0
        self.response_total_s = 0.0
        self.request_head = b""
        self.retried = False
        self.started = time.perf_counter()
        self.principal = ""
        self.principal_rule: Principal | None = None  # what the decision was made for (live permission)
        self.target: PinnedTarget | None = None

    def request_body(self, data: bytes) -> None:
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked_request else data
        self.bytes_up += len(data)
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None:
            upstream.last_activity = time.monotonic()  # a slow upload is not a hung origin
            upstream.transport.write(framed)
            return
        # Not connected yet: hold the body, but never more than one write buffer's worth.
        self.pending.append(framed)
        self.pending_bytes += len(framed)
        if self.pending_bytes > WRITE_HIGH_WATER_BYTES:
            self.client.pause_client_reading(PAUSE_BODY_BUFFER)

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
        if self.upstream is not None and self.upstream.response_complete:
            self.upstream.finish()


def build_request_head(
    method: bytes,
    target: bytes,
    authority: bytes,
    headers: list[tuple[bytes, bytes]],
    chunked: bool,
    *,
    named: frozenset[bytes] | None = None,
) -> bytes:
    """The upstream head: origin-form target, Host from the absolute URI, end-to-end headers only.

    `named` are the header names the request's Connection field lists, when the caller already
    collected them while parsing (None: scan `headers` for Connection here)."""
    if named is None:
        named = connection_tokens(headers)
    parts = [method, b" ", target, b" HTTP/1.1\r\nHost: ", authority, b"\r\n"]
    for name, value in headers:
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in named or lowered.startswith(b"proxy-") or lowered == b"host":
            continue
        parts += (name, b": ", value, b"\r\n")
    if chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class UpstreamConnection(asyncio.Protocol):
    """One upstream HTTP/1.1 connection; relays the response of the exchange it carries."""

    def __init__(self, pool: UpstreamPool, key: PoolKey) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.exchange: ForwardExchange | None = None
        self.response_complete = False
        self._parser: httptools.HttpResponseParser | None = None
        self._out: list[bytes] = []
        self._headers: list[tuple[bytes, bytes]] = []  # (lower-cased name, "Name: value\r\n")
        self._has_length = False
        self._upstream_chunked = False
        self._reason = b""
        self._status = 0
        self.head_sent = False
        self._chunk_to_client = False
        self._close_client = False
        self._eof_body = False
        self._reusable = True
        # The response deadline, armed lazily: it may fire early and re-arm itself for the time
        # left, so a busy keep-alive connection does not arm and cancel a timer per request.
        self._timer: asyncio.TimerHandle | None = None
        self._connection_values: list[bytes] = []
        self.parked_at = 0.0
        self._reading_paused = False
        self._body_bytes = 0
        self._responses = 0
        self._reused = False
        self._answered = False
        self.last_activity = 0.0
        # Until the final response head has been parsed, heads are cut out of the stream on raw
        # bytes (caps counted before llhttp sees a fragment); None once the body is streaming.
        self._scanner: ResponseHeadScanner | None = None
        self._failure: GatewayError | None = None
        self._progress = 0  # body callbacks so far: a read that makes none is framing or trailers
        self._stalled = 0
        self._head_due = 0.0
        self._total_due = 0.0
        # The last exchange's decision, kept while parked: a reload may revoke it (live permission).
        self.principal_rule: Principal | None = None
        self.target: PinnedTarget | None = None

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._cancel_timer()
        exchange = self.exchange
        if exchange is None:
            self.pool.forget(self)
            return
        self._reusable = False
        if self._reused and not self._answered and exchange.resendable:
            # A pooled connection the origin closed while it sat idle (its keep-alive timeout
            # crossed our request on the wire): nothing was processed, so send it once more on a
            # fresh connection rather than fail a request the origin never saw.
            self.exchange = None
            exchange.prepare_retry()
            exchange.client.retry_exchange(exchange)
            return
        if self._eof_body and self.head_sent and exc is None:
            # A close-delimited body (no Content-Length, not chunked) ends here.
            self._finish_message()
            if self._out:
                exchange.client.transport.write(b"".join(self._out))
                self._out.clear()
            self.finish()
            return
        reason = "upstream reset" if exc is not None else "upstream closed before the response ended"
        self.exchange = None
        exchange.client.fail_exchange(exchange, "connect_failure", reason)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        parser = self._parser
        if exchange is None or parser is None or self.response_complete:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self._reusable = False
            if self.transport is not None:
                self.transport.close()
            return
        self._answered = True
        self.last_activity = time.monotonic()
        try:
            self._feed(parser, data)
        except GatewayError as error:
            self._fail(exchange, error)
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if self._failure is None and self.response_complete:
                # Bytes after the complete response (an injected second head or a stray byte):
                # never relayed, and the connection is not reused.
                self._reusable = False
            else:
                self._fail(exchange, self._failure or _MALFORMED)
                return
        if self._out:
            exchange.client.transport.write(b"".join(self._out))
            self._out.clear()
        if self._body_bytes > exchange.max_response_bytes:
            exchange.bytes_down = self._body_bytes
            self._fail(exchange, GatewayError(ErrorCode.TOO_LARGE, "the response exceeds proxy.max_response_bytes"))
            return
        if self.response_complete and exchange.body_done:
            self.finish()

    def _feed(self, parser: httptools.HttpResponseParser, data: bytes) -> None:
        """Heads whole, one at a time, through the scanner's caps; body bytes straight to llhttp."""
        scanner = self._scanner
        while scanner is not None:
            taken = scanner.take_head(data)
            if taken is None:
                return
            head, data = taken
            parser.feed_data(head)
            scanner = self._scanner  # None once the final head was parsed
            if not data:
                return
        progress = self._progress
        parser.feed_data(data)
        if self._progress != progress or self.response_complete:
            self._stalled = 0
            return
        # A read with no body byte in it: chunk framing or a trailer section. llhttp buffers
        # neither, but httptools joins a trailer field's fragments quadratically: bound it.
        self._stalled += len(data)
        if self._stalled > MAX_RESPONSE_HEAD_BYTES:
            raise GatewayError(
                ErrorCode.TOO_LARGE, f"the upstream's chunk framing or trailers exceed {MAX_RESPONSE_HEAD_BYTES} bytes"
            )

    def _fail(self, exchange: ForwardExchange, error: GatewayError) -> None:
        """End the exchange with `error`: a 502/504 if no head was sent yet, else a cut stream."""
        self._reusable = False
        if self._out and self.head_sent:
            exchange.client.transport.write(b"".join(self._out))
        self._out.clear()
        self.exchange = None
        if self.transport is not None:
            self.transport.close()
        exchange.client.fail_exchange(exchange, str(error.code), error.message)

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.pause_client_reading(PAUSE_UPSTREAM_WRITE)

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.resume_client_reading(PAUSE_UPSTREAM_WRITE)

    # driven by the client side ----------------------------------------------------------------
    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_response_deadline(self, idle_s: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + idle_s
        timer = self._timer
        if timer is not None:
            if timer.when() <= due:
                return  # fires first and re-checks against last_activity
            timer.cancel()
        self._timer = loop.call_at(due, self._response_deadline)

    def _response_deadline(self) -> None:
        """No byte from the upstream for `response_idle_s`: 504 before the head, else cut."""
        self._timer = None
        exchange = self.exchange
        if exchange is None:
            return  # parked or closed: the next start() arms a fresh deadline
        idle_s = exchange.response_idle_s
        now = time.monotonic()
        remaining = self.last_activity + idle_s - now
        if self._reading_paused:
            # We stopped reading because the client is slow; silence is not the upstream's fault.
            remaining = idle_s
        # Total deadlines too: an origin dripping a byte every few seconds is never silent.
        due = self._total_due if self.head_sent else min(self._head_due, self._total_due)
        remaining = min(remaining, due - now)
        if remaining > 0:
            self._timer = asyncio.get_running_loop().call_later(remaining, self._response_deadline)
            return
        if now >= self._total_due:
            message = f"the response did not complete within proxy.response_timeout_s ({exchange.response_total_s:g} s)"
        elif not self.head_sent and now >= self._head_due:
            message = f"no response head within proxy.response_head_timeout_s ({exchange.response_head_s:g} s)"
        else:
            message = f"the upstream sent nothing for {idle_s:g} s"
        self._reusable = False
        self.exchange = None
        if self.transport is not None:
            self.transport.abort()
        exchange.client.fail_exchange(exchange, "timeout", message)

    def close(self) -> None:
        self._reusable = False
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()

    def start(self, exchange: ForwardExchange, head: bytes) -> None:
        """Send the request head and any body received so far in one write."""
        self.exchange = exchange
        exchange.upstream = self
        self.principal_rule = exchange.principal_rule
        self.target = exchange.target
        self.response_complete = False
        self._parser = httptools.HttpResponseParser(self)
        self._headers = []
        self.head_sent = False
        self._eof_body = False
        # An HTTP/1.0 client, or one that asked to close, is told so in the final response head.
        self._close_client = exchange.client_http10 or not exchange.client_keep_alive
        self._body_bytes = 0
        self._reused = self._responses > 0
        self._answered = False
        self._scanner = ResponseHeadScanner()
        self._failure = None
        self._stalled = 0
        exchange.request_head = head
        now = self.last_activity = time.monotonic()
        self._head_due = now + exchange.response_head_s
        self._total_due = now + exchange.response_total_s
        self._arm_response_deadline(min(exchange.response_idle_s, exchange.response_head_s, exchange.response_total_s))
        assert self.transport is not None
        if exchange.pending:
            self.transport.write(head + b"".join(exchange.pending))
            exchange.pending.clear()
            exchange.pending_bytes = 0
            exchange.client.resume_client_reading(PAUSE_BODY_BUFFER)
        else:
            self.transport.write(head)

    def finish(self) -> None:
        """Response and request both complete: hand the client back and park or drop this one."""
        exchange = self.exchange
        if exchange is None:
            return
        self.exchange = None
        self._parser = None
        self._responses += 1
        self.resume_reading()
        keep_client = not self._close_client
        exchange.bytes_down = self._body_bytes
        if self._reusable and self.transport is not None and not self.transport.is_closing():
            self.pool.release(self)
        elif self.transport is not None:
            self.transport.close()
        exchange.client.response_finished(exchange, keep_alive=keep_client, reason="done")

    # httptools callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.response_complete:
            raise _StopParsing  # a second response nobody asked for: never parsed, never relayed
        self._headers = []
        self._connection_values = []
        self._has_length = False
        self._upstream_chunked = False
        self._reason = b""

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        # One pass: framing facts noted, hop-by-hop fields dropped, the rest kept as wire lines
        # (with their lower-cased name, in case a Connection field names them).
        if self._scanner is None:
            return  # a trailer field: never merged into the head the client already has
        lowered = name.lower()
        if lowered == b"content-length":
            self._has_length = True
        elif lowered == b"transfer-encoding":
            self._upstream_chunked = True
        elif lowered == b"connection":
            self._connection_values.append(value)
        if lowered in HOP_BY_HOP or lowered.startswith(b"proxy-"):
            return
        self._headers.append((lowered, name + b": " + value + b"\r\n"))

    def on_headers_complete(self) -> None:
        parser = self._parser
        exchange = self.exchange
        assert parser is not None
        assert exchange is not None
        status = parser.get_status_code()
        self._status = status
        if status == 101:
            # The gateway never forwards Upgrade, so a switch is unsolicited: relaying it would
            # hand the client a stream the proxy no longer frames.
            self._failure = GatewayError(ErrorCode.CONNECT_FAILURE, "the upstream switched protocols unasked (101)")
            raise _StopParsing
        named = named_by_connection(self._connection_values) if self._connection_values else frozenset()
        if named & FRAMING_FIELDS:
            # Framing fields are never hop-by-hop: stripping them would re-frame the body differently.
            self._failure = GatewayError(
                ErrorCode.CONNECT_FAILURE, "the upstream response's Connection field names a framing header"
            )
            raise _StopParsing
        if status >= 200:
            self._scanner = None  # the body follows; trailers, if any, are dropped
        if 100 <= status < 200 and exchange.client_http10:
            return  # RFC 9110 section 15.2: no interim response to an HTTP/1.0 client
        kept = [b"HTTP/1.1 %d %b\r\n" % (status, self._reason)]
        if named:
            kept += [line for lowered, line in self._headers if lowered not in named]
        else:
            kept += [line for _, line in self._headers]
        has_length, chunked = self._has_length, self._upstream_chunked
        if not parser.should_keep_alive():
            self._reusable = False
        informational = 100 <= status < 200
        bodiless = informational or exchange.head_only or status in NO_BODY_STATUSES
        self._chunk_to_client = False
        if not bodiless and not has_length:
            self._eof_body = not chunked
            if exchange.client_http10:
                self._close_client = True
            else:
                # Re-frame: the client gets a chunked body whatever the upstream used.
                self._chunk_to_client = True
                kept.append(b"Transfer-Encoding: chunked\r\n")
        if self._close_client and not informational:
            kept.append(b"Connection: close\r\n")
        kept.append(b"\r\n")
        self._out.append(b"".join(kept))
        if not informational:
            self.head_sent = True
        if exchange.head_only and not informational:
            # No body follows a HEAD response whatever its Content-Length says.
            self.response_complete = True

    def on_body(self, body: bytes) -> None:
        self._progress += 1
        if self.response_complete:
            self._reusable = False  # bytes after a bodiless response: do not reuse
            return
        self._body_bytes += len(body)
        if self._chunk_to_client:
            self._out.append(b"%x\r\n%b\r\n" % (len(body), body))
        else:
            self._out.append(body)

    def on_chunk_header(self) -> None:
        self._progress += 1

    def on_message_complete(self) -> None:
        self._progress += 1
        if 100 <= self._status < 200:
            return  # an interim response; the final one follows on the same parser
        self._finish_message()

    def _finish_message(self) -> None:
        if self.response_complete:
            return
        if self._chunk_to_client:
            self._out.append(b"0\r\n\r\n")
        self.response_complete = True
