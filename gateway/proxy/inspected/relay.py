"""A protocol upgrade (WebSocket) inside an inspected connection, once the rules allowed it.

Owns the upstream side of one upgrade request: the request head written on a fresh pinned TLS
connection, the origin's answer read up to its head, and then either a byte relay between the
agent's decrypted stream and the upstream (the origin said 101) or the origin's other answer
relayed as it is and the connection closed once that response ends (never a relay: bytes the
agent sends after a refused upgrade are not HTTP the rules have judged). The relay is bounded
(each side pauses the other's reading when its write buffer is full, bytes the agent sends
before the 101 are held up to a cap) and deadline-respecting (the policy's idle time and tunnel
lifetime). A bound credential's value in the origin's answer head (and a refusal's body) is
scrubbed, as any inspected response's. One audit line at close with the bytes each way.

The relay is also the protocol of the agent's side once the inspected connection handed its
transport over (`RelayClientSide`). Never parses WebSocket frames, never dials or decides
(`upgrades.InspectedUpgrades` judges, pins and dials), never forwards a byte of the agent's
before the origin switched protocols.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import httptools

from gateway.credentials.inject import Scrubber
from gateway.proxy.http1.heads import MAX_HEAD_BYTES

# Bytes the agent may send before the origin answers (a client that does not wait for the 101):
# held up to this, then its reading pauses.
MAX_HELD_BYTES = 64 * 1024
HEAD_END = b"\r\n\r\n"
# Never forwarded upstream out of the agent's head: the proxy's own fields.
_PROXY_FIELDS = (b"proxy-authorization:", b"proxy-connection:")


def upgrade_fields(head: bytes) -> bytes:
    """The agent's upgrade head's field lines as the proxy's field blocks hold them (each
    `\r\nName: value`), the proxy's own fields dropped and every other line (Host checked,
    Upgrade, Connection, Sec-WebSocket-*) kept: what the outbound guard screens and injects into."""
    block = head.partition(b"\r\n")[2]
    return b"".join(
        b"\r\n" + field for field in block.split(b"\r\n") if field and not field.lower().startswith(_PROXY_FIELDS)
    )


def upstream_upgrade_head(head: bytes, origin_form: bytes, fields: bytes) -> bytes:
    """The upgrade head for the origin: the agent's method and version, its target in
    origin-form, `fields` (from `upgrade_fields`, after the outbound guard)."""
    line = head.partition(b"\r\n")[0]
    method, _, rest = line.partition(b" ")
    version = rest.rpartition(b" ")[2]
    return b"%b %b %b%b\r\n\r\n" % (method, origin_form, version, fields)


class RelayState(Enum):
    AWAITING_ANSWER = "awaiting_answer"
    RELAYING = "relaying"  # the origin said 101
    ANSWERING = "answering"  # any other answer, relayed until its end
    CLOSED = "closed"


@dataclass(slots=True)
class RelayOutcome:
    """What the close audit line says of the upgrade."""

    status: int | None
    bytes_up: int
    bytes_down: int
    duration_s: float
    reason: str
    address: str


class UpgradeRelay(asyncio.Protocol):
    """The pinned TLS upstream of one upgrade request, and the relay once the origin agrees."""

    def __init__(
        self,
        client: asyncio.Transport,
        head: bytes,
        *,
        idle_timeout_s: float,
        lifetime_s: float,
        on_close: Callable[[RelayOutcome], None],
        scrubber: Scrubber | None = None,
    ) -> None:
        self.client = client
        self.head = head
        self.idle_timeout_s = idle_timeout_s
        self.lifetime_s = lifetime_s
        self.on_close = on_close
        # A bound credential's values replaced in the origin's answer: the 101's head, or a
        # refusal's head and body (up to the scrubber's window). Frames after a 101 are not.
        self.scrubber = scrubber
        self.state = RelayState.AWAITING_ANSWER
        self.upstream: asyncio.Transport | None = None
        self.address = ""
        self.status: int | None = None
        self.bytes_up = 0
        self.bytes_down = 0
        self._answer = bytearray()  # the origin's answer until its head is whole
        self._held = bytearray()  # the agent's bytes before the origin switched
        self._response: httptools.HttpResponseParser | None = None
        self.started = time.monotonic()
        self._last_activity = self.started
        self._timer: asyncio.TimerHandle | None = None
        self._client_paused = False

    # the upstream --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.state is RelayState.CLOSED:
            transport.close()  # the agent left while this was dialed
            return
        self.upstream = transport  # type: ignore[assignment]  # uvloop's transports do not subclass
        transport.write(self.head)  # type: ignore[attr-defined]
        self.bytes_up += len(self.head)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._last_activity = time.monotonic()
        if self.state is RelayState.RELAYING:
            self.bytes_down += len(data)
            self.client.write(data)
        elif self.state is RelayState.AWAITING_ANSWER:
            self._answer += data
            self._read_answer()
        elif self.state is RelayState.ANSWERING:
            self._relay_response(data)

    def _read_answer(self) -> None:
        answer = self._answer
        end = answer.find(HEAD_END)
        if end < 0:
            if len(answer) > MAX_HEAD_BYTES:
                self.close("upstream_reset")
            return
        words = bytes(answer[: answer.find(b"\r\n")]).split(b" ", 2)
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
        self.status = status or None
        data = bytes(answer)
        self._answer = bytearray()
        if status == 101:
            self.state = RelayState.RELAYING
            self.bytes_down += len(data)
            scrubber, cut = self.scrubber, end + len(HEAD_END)
            if scrubber is not None:
                data = scrubber.body(data[:cut]) + scrubber.finish() + data[cut:]
            self.client.write(data)
            if self._held:
                held, self._held = bytes(self._held), bytearray()
                self._to_upstream(held)
            if self._client_paused:
                self._client_paused = False
                self.client.resume_reading()
            return
        if status == 0:
            self.close("upstream_reset")
            return
        self.state = RelayState.ANSWERING
        self._response = httptools.HttpResponseParser(self)
        self._relay_response(data)

    def _relay_response(self, data: bytes) -> None:
        self.bytes_down += len(data)
        # Length-preserving: the answer's framing (read from the bytes as they came) stays true.
        self.client.write(self.scrubber.body(data) if self.scrubber is not None else data)
        parser = self._response
        if parser is None:
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError:
            self.close("upstream_reset")

    def on_message_complete(self) -> None:  # httptools: the non-101 answer ended
        self._response = None
        self._release_scrubbed()
        asyncio.get_running_loop().call_soon(self.close, "done")

    def eof_received(self) -> bool | None:
        self.close("upstream_closed")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.close("upstream_reset" if exc is not None else "upstream_closed")

    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        if self.state is not RelayState.CLOSED:
            self.client.resume_reading()

    # the agent's side ----------------------------------------------------------------------------
    def from_client(self, data: bytes) -> None:
        self._last_activity = time.monotonic()
        if self.state is RelayState.RELAYING:
            self._to_upstream(data)
        elif self.state is RelayState.AWAITING_ANSWER:
            self._held += data
            if len(self._held) > MAX_HELD_BYTES and not self._client_paused:
                self._client_paused = True
                self.client.pause_reading()
        # ANSWERING: the upgrade was not granted; nothing more of the agent's goes upstream.

    def _to_upstream(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is not None and not upstream.is_closing():
            self.bytes_up += len(data)
            upstream.write(data)

    def client_paused_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def client_resumed_writing(self) -> None:
        if self.upstream is not None and self.state is not RelayState.CLOSED:
            self.upstream.resume_reading()

    def _release_scrubbed(self) -> None:
        """What the scrubber held back (the possible start of a value), once the answer ended."""
        if self.scrubber is not None:
            tail = self.scrubber.finish()
            if tail:
                self.client.write(tail)

    @property
    def closed(self) -> bool:
        return self.state is RelayState.CLOSED

    # deadlines and close -----------------------------------------------------------------------
    def _arm(self) -> None:
        due = min(self._last_activity + self.idle_timeout_s, self.started + self.lifetime_s)
        # `call_later`: the loop's clock need not be `time.monotonic` (uvloop's is libuv's).
        delay = max(0.0, due - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._check_deadline)

    def _check_deadline(self) -> None:
        self._timer = None
        if self.state is RelayState.CLOSED:
            return
        now = time.monotonic()
        if now >= self.started + self.lifetime_s:
            self.close("max_lifetime")
        elif now >= self._last_activity + self.idle_timeout_s:
            self.close("idle_timeout")
        else:
            self._arm()

    def close(self, reason: str) -> None:
        """Both sides closed, the audit line written (once)."""
        if self.state is RelayState.CLOSED:
            return
        self.state = RelayState.CLOSED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.upstream is not None:
            self.upstream.close()
        self._release_scrubbed()  # a close-delimited answer ends here
        self.client.close()
        self.on_close(
            RelayOutcome(
                self.status,
                self.bytes_up,
                self.bytes_down,
                time.monotonic() - self.started,
                reason,
                self.address,
            )
        )


class RelayClientSide(asyncio.Protocol):
    """The agent's side of a relay: the protocol of the inspected connection's decrypted stream
    once its client connection handed the transport over (`ClientConnection._begin_upgrade`)."""

    def __init__(self, relay: UpgradeRelay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_client(data)

    def eof_received(self) -> bool | None:
        return None  # TLS has no half-close: the relay ends with the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close("client_reset" if exc is not None else "client_closed")

    def pause_writing(self) -> None:
        self.relay.client_paused_writing()

    def resume_writing(self) -> None:
        self.relay.client_resumed_writing()
