"""The upstream half of plain HTTP forwarding: one pooled HTTP/1.1 connection and the exchange it carries.

Owns the I/O of an upstream connection: sending the request head (with any body held so far) in
one write, feeding the response bytes to its `ResponseFraming` (the sans-I/O re-framing, caps and
smuggling defences) and writing what it owes the client in one write per read, the response byte
cap, backpressure both ways, the response deadlines (`proxy.idle_timeout_s` of silence,
`proxy.response_head_timeout_s` for the head, `proxy.response_timeout_s` in total: 504 before the
head, a cut stream after it) as its `deadlines/limits.ResponseDeadlines` decides, on one entry
in the listener's deadline wheel, parking in the pool, and one retry on a
fresh connection when a pooled one turns out closed before answering an idempotent request.

Never resolves a name, never dials (the dispatcher hands it a connection to a `PinnedTarget`),
never parses bytes itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

from gateway.egress.target import PinnedTarget
from gateway.errors import ErrorCode, GatewayError
from gateway.policy.model import Principal
from gateway.proxy.deadlines.limits import ResponseDeadlines
from gateway.proxy.deadlines.wheel import LazyDeadline
from gateway.proxy.forward.exchange import (
    WRITE_HIGH_WATER_BYTES,
    WRITE_LOW_WATER_BYTES,
    ForwardExchange,
    PauseReason,
)
from gateway.proxy.forward.pool import PoolKey, UpstreamPool
from gateway.proxy.http1.response_framing import ResponseFraming


class UpstreamConnection(asyncio.Protocol):
    """One upstream HTTP/1.1 connection; relays the response of the exchange it carries."""

    def __init__(self, pool: UpstreamPool[UpstreamConnection], key: PoolKey) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.exchange: ForwardExchange | None = None
        self.framing: ResponseFraming | None = None
        # The last response's framing while parked: the next response may reuse its parser.
        self._spent_framing: ResponseFraming | None = None
        self._reusable = True
        # One wheel entry for all three response deadlines: it may come due early and is filed
        # again for the time left, so a busy keep-alive connection arms no timer per request.
        self._deadlines = ResponseDeadlines()
        self._deadline = LazyDeadline(self._response_deadline, pool.wheel)
        self.parked_at = 0.0
        self._reading_paused = False
        self._responses = 0
        self._reused = False
        self._answered = False
        self.last_activity = 0.0
        # The last exchange's decision, kept while parked: a reload may revoke it (live permission).
        self.principal_rule: Principal | None = None
        self.target: PinnedTarget | None = None
        # The last client connection's audit id and its X-Egress-Id line (see `start`).
        self._id_conn: object = None
        self._id_field = b""

    @property
    def head_sent(self) -> bool:
        return self.framing is not None and self.framing.head_sent

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES, WRITE_LOW_WATER_BYTES)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._deadline.cancel()
        exchange = self.exchange
        framing = self.framing
        if exchange is None or framing is None:
            self.pool.forget(self)
            return
        self._reusable = False
        if self._reused and not self._answered and exchange.resendable:
            # A pooled connection the origin closed while it sat idle (its keep-alive timeout
            # crossed our request on the wire): nothing was processed, so send it once more on a
            # fresh connection rather than fail a request the origin never saw.
            self.exchange = None
            exchange.upstream = None
            exchange.prepare_retry()
            exchange.client.retry_exchange(exchange)
            return
        if exc is None and framing.end_of_stream():
            # A close-delimited body (no Content-Length, not chunked) ends here.
            out = framing.take_output()
            if out:
                exchange.client.transport.write(out)
            self.finish()
            return
        reason = "upstream reset" if exc is not None else "upstream closed before the response ended"
        self.exchange = None
        exchange.client.fail_exchange(exchange, "connect_failure", reason)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        framing = self.framing
        if exchange is None or framing is None or framing.complete:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self._reusable = False
            if self.transport is not None:
                self.transport.close()
            return
        self._answered = True
        self.last_activity = time.monotonic()
        try:
            out = framing.feed(data)
        except GatewayError as error:
            self._fail(exchange, error)
            return
        scrubber = exchange.scrubber
        if scrubber is not None:
            # Length-preserving, on the relayed bytes: chunk sizes and Content-Length stay true.
            out = scrubber.body(out) + (scrubber.finish() if framing.complete else b"")
        if out:
            if not exchange.status:
                exchange.status = framing.status  # for the close line
            exchange.client.transport.write(out)
        if framing.body_bytes > exchange.settings.max_response_bytes:
            exchange.bytes_down = framing.body_bytes
            self._fail(exchange, GatewayError(ErrorCode.TOO_LARGE, "the response exceeds proxy.max_response_bytes"))
            return
        if framing.complete and exchange.body_done:
            self.finish()

    def _fail(self, exchange: ForwardExchange, error: GatewayError) -> None:
        """End the exchange with `error`: a 502/504 if no head was sent yet, else a cut stream."""
        self._reusable = False
        framing = self.framing
        if framing is not None and framing.head_sent:
            out = framing.take_output()
            scrubber = exchange.scrubber
            if scrubber is not None:
                out = scrubber.body(out) + scrubber.finish()
            if out:
                exchange.status = exchange.status or framing.status
                exchange.client.transport.write(out)
        self.exchange = None
        if self.transport is not None:
            self.transport.close()
        exchange.client.fail_exchange(exchange, str(error.code), error.message)

    def eof_received(self) -> bool | None:
        return None

    def pause_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.pause_client_reading(PauseReason.UPSTREAM_WRITE)

    def resume_writing(self) -> None:
        if self.exchange is not None:
            self.exchange.client.resume_client_reading(PauseReason.UPSTREAM_WRITE)

    # driven by the client side ----------------------------------------------------------------
    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _response_deadline(self) -> None:
        """A response deadline may have passed: 504 before the head, a cut stream after it."""
        exchange = self.exchange
        if exchange is None:
            return  # parked or closed: the next start() sets a fresh deadline
        deadlines = self._deadlines
        deadlines.last_activity = self.last_activity
        at, message = deadlines.expired(time.monotonic(), head_sent=self.head_sent, reading_paused=self._reading_paused)
        if message is None:
            self._deadline.set_at(at)
            return
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

    def send_body(self, data: bytes) -> bool:
        """Request body bytes, written now; False when not connected (the exchange holds them)."""
        transport = self.transport
        if transport is None:
            return False
        self.last_activity = time.monotonic()  # a slow upload is not a hung origin
        transport.write(data)
        return True

    def request_ended(self) -> None:
        """The request's body ended: finish if the response already has."""
        framing = self.framing
        if framing is not None and framing.complete:
            self.finish()

    def start(self, exchange: ForwardExchange, head: bytes) -> None:
        """Send the request head and any body received so far in one write."""
        self.exchange = exchange
        exchange.upstream = self
        request = exchange.request
        self.principal_rule = exchange.principal
        self.target = exchange.target
        conn = exchange.client.audit_fields.get("conn")
        if conn is not self._id_conn:
            # The id of the audit lines, as on refusals and the CONNECT 200: formatted once per
            # client connection this upstream serves in a row, not per request.
            self._id_conn = conn
            self._id_field = b"X-Egress-Id: %s\r\n" % conn.encode("ascii") if isinstance(conn, str) else b""
        spent = self._spent_framing
        self._spent_framing = None
        close_client = request.http10 or not request.keep_alive
        self.framing = (
            ResponseFraming(
                exchange.client.head_memos,
                head_only=request.method == b"HEAD",
                client_http10=request.http10,
                close_client=close_client,
                id_field=self._id_field,
            )
            if spent is None
            else spent.next_response(
                head_only=request.method == b"HEAD",
                client_http10=request.http10,
                close_client=close_client,
                id_field=self._id_field,
            )
        )
        self._reused = self._responses > 0
        self._answered = False
        now = self.last_activity = time.monotonic()
        settings = exchange.settings
        self._deadline.set_at(
            self._deadlines.start(
                now, settings.idle_timeout_s, settings.response_head_timeout_s, settings.response_timeout_s
            )
        )
        assert self.transport is not None
        # Most requests have no body held by now (a GET's head ends it): no call for those.
        self.transport.write(head + exchange.take_held_body() if exchange.pending else head)

    def finish(self) -> None:
        """Response and request both complete: hand the client back and park or drop this one."""
        exchange = self.exchange
        framing = self.framing
        if exchange is None or framing is None:
            return
        self.exchange = None
        self.framing = None
        self._deadline.clear()
        self._responses += 1
        if self._reading_paused:
            self.resume_reading()
        exchange.bytes_down = framing.body_bytes
        if self._reusable and framing.reusable and self.transport is not None and not self.transport.is_closing():
            self._spent_framing = framing
            self.pool.release(self)
        elif self.transport is not None:
            self.transport.close()
        exchange.client.response_finished(exchange, keep_alive=not framing.close_client, reason="done")
