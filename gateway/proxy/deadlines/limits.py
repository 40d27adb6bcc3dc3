"""The proxy's per-connection deadlines and half-closes as data, without I/O: times in, verdicts out.

Owns what each limit of a proxy connection means, in the style of h11 (no socket, no timer, no
clock of its own: every method takes `now`): the client connection's head deadline (slowloris),
keep-alive idle time, half-close and whether it serves another request (`ClientLimits`), a
tunnel's idle time and maximum lifetime and its two half-closes (`TunnelLimits`), and the three
response deadlines of a forwarded request: silence, the head, the whole response
(`ResponseDeadlines`). Each object keeps its next deadline as data
(`at`, and `reason` where there are several); the asyncio Protocols move their one wheel entry to
`at` after an event and, when it passes, ask the object what to do (`expired`), then do it.

Never reads a clock, never touches a transport or a timer; the listener, the tunnel and the
upstream connection carry the verdicts out, and the transparent listener reuses the tunnel's.
"""

from __future__ import annotations

from enum import Enum


class ClientDeadline(Enum):
    """Which deadline of a client connection (outside a tunnel) is running."""

    HEAD = "head"  # a request head must complete by then (slowloris), or the connection is aborted
    KEEP_ALIVE_IDLE = "keep_alive_idle"  # no new request by then: closed as HTTP/1.1 allows


class ClientExpiry(Enum):
    """What passing the client connection's deadline means."""

    ABORT = "abort"  # a slowloris client is not owed a response nor a graceful close
    CLOSE = "close"  # an idle keep-alive connection: a normal close


class ClientLimits:
    """A client connection outside a tunnel: its own deadline between requests (none while a
    request is served), its half-close, and whether it serves another request."""

    __slots__ = ("at", "eof", "reason")

    def __init__(self) -> None:
        self.at: float | None = None
        self.reason: ClientDeadline | None = None
        self.eof = False  # the client sent its FIN

    def client_eof(self, *, response_owed: bool) -> AfterFin:
        """A client may half-close after its request: the response it is owed still goes out."""
        self.eof = True
        return AfterFin.HALF_CLOSE if response_owed else AfterFin.CLOSE

    def keep_alive(self, request_keep_alive: bool, response_keep_alive: bool, body_done: bool, draining: bool) -> bool:
        """After a response or a refusal: whether the connection reads another request. It does
        only if that request and its response both allowed it (RFC 9112 section 9.3; a pipelined
        head behind it may have asked to close after its own), its body was consumed in full (else
        the stream is out of sync), the client has not half-closed and the gateway is not draining."""
        return request_keep_alive and response_keep_alive and body_done and not self.eof and not draining

    def accepted(self, now: float, head_timeout_s: float) -> None:
        self.at = now + head_timeout_s
        self.reason = ClientDeadline.HEAD

    def bytes_arrived(self, now: float, head_timeout_s: float) -> None:
        """Client bytes: after an idle wait they start the next head, which has the head deadline."""
        if self.reason is ClientDeadline.KEEP_ALIVE_IDLE:
            self.at = now + head_timeout_s
            self.reason = ClientDeadline.HEAD

    def request_started(self) -> None:
        """A head completed (a request or a CONNECT): the response's or the tunnel's limits apply."""
        self.at = None
        self.reason = None

    def response_finished(self, now: float, idle_timeout_s: float) -> None:
        self.at = now + idle_timeout_s
        self.reason = ClientDeadline.KEEP_ALIVE_IDLE

    def expired(self, now: float, *, busy: bool) -> ClientExpiry | None:
        """What to do now that the deadline may have passed; None while `at` is still ahead (or
        nothing is due, or a request is being served: its own limits apply)."""
        at = self.at
        if at is None or now < at:
            return None
        reason = self.reason
        self.at = None
        self.reason = None
        if busy:
            return None
        return ClientExpiry.CLOSE if reason is ClientDeadline.KEEP_ALIVE_IDLE else ClientExpiry.ABORT


class AfterFin(Enum):
    """What a connection does when a peer sends its FIN."""

    # A tunnel writes EOF toward the other side and keeps the other direction; a client
    # connection keeps its write side open for the response it is owed.
    HALF_CLOSE = "half_close"
    CLOSE = "close"  # nothing is left to relay or owed: close


EOF_FROM_CLIENT = 1
EOF_FROM_UPSTREAM = 2
EOF_BOTH = EOF_FROM_CLIENT | EOF_FROM_UPSTREAM


class TunnelLimits:
    """A tunnel's idle time, lifetime and half-closes: when it must close, and why."""

    __slots__ = ("ends_at", "eofs", "idle_s", "last_activity")

    def __init__(self, now: float, idle_s: float, max_lifetime_s: float) -> None:
        self.idle_s = idle_s
        self.ends_at = now + max_lifetime_s
        self.last_activity = now
        self.eofs = 0

    @property
    def at(self) -> float:
        """The next moment a limit may pass (activity since then may move it on)."""
        idle_at = self.last_activity + self.idle_s
        return idle_at if idle_at < self.ends_at else self.ends_at

    def expired(self, now: float) -> str | None:
        """The close reason once a limit has passed, else None (the deadline moves on to `at`)."""
        if now >= self.ends_at:
            return "max_lifetime"
        if now >= self.last_activity + self.idle_s:
            return "idle_timeout"
        return None

    def client_eof(self, *, handshake_checked: bool, upstream_can_half_close: bool) -> AfterFin:
        """The client's FIN. Before its handshake passed the SNI check nothing more may be forwarded."""
        if not handshake_checked:
            return AfterFin.CLOSE
        self.eofs |= EOF_FROM_CLIENT
        return self._after_eof(upstream_can_half_close)

    def upstream_eof(self, *, client_can_half_close: bool) -> AfterFin:
        self.eofs |= EOF_FROM_UPSTREAM
        return self._after_eof(client_can_half_close)

    def _after_eof(self, other_can_half_close: bool) -> AfterFin:
        # Both FINs seen, or the other side cannot take a half-close (closing, or a transport
        # without write_eof): nothing is left to relay.
        if self.eofs == EOF_BOTH or not other_can_half_close:
            return AfterFin.CLOSE
        return AfterFin.HALF_CLOSE


class ResponseDeadlines:
    """The deadlines of one forwarded response: upstream silence, its head, and the whole of it."""

    __slots__ = ("head_due", "head_s", "idle_s", "last_activity", "total_due", "total_s")

    def __init__(self) -> None:
        self.idle_s = self.head_s = self.total_s = 0.0
        self.head_due = self.total_due = self.last_activity = 0.0

    def start(self, now: float, idle_s: float, head_s: float, total_s: float) -> float:
        """The request went upstream; returns the first deadline."""
        self.idle_s, self.head_s, self.total_s = idle_s, head_s, total_s
        self.last_activity = now
        self.head_due = now + head_s
        self.total_due = now + total_s
        return now + min(idle_s, head_s, total_s)

    def expired(self, now: float, *, head_sent: bool, reading_paused: bool) -> tuple[float | None, str | None]:
        """(the next deadline, None) while the response may go on, else (None, why it failed)."""
        # Reading paused because the client is slow: silence then is not the upstream's fault.
        idle_at = now + self.idle_s if reading_paused else self.last_activity + self.idle_s
        # Total deadlines too: an origin dripping a byte every few seconds is never silent.
        due = self.total_due if head_sent else min(self.head_due, self.total_due)
        at = min(idle_at, due)
        if at > now:
            return at, None
        if now >= self.total_due:
            return None, f"the response did not complete within proxy.response_timeout_s ({self.total_s:g} s)"
        if not head_sent and now >= self.head_due:
            return None, f"no response head within proxy.response_head_timeout_s ({self.head_s:g} s)"
        return None, f"the upstream sent nothing for {self.idle_s:g} s"
