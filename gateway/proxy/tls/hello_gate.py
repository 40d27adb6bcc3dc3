"""The SNI rule over a tunnel's whole plaintext TLS handshake, not only its first flight.

Owns the client bytes of a tunnel until the SNI rule has seen every ClientHello the server will
act on: the first one, and after a HelloRetryRequest (RFC 8446 section 4.1.4) the second one,
which a client could otherwise send naming another host once the first had passed. After the
first ClientHello the client's further bytes are held until the server's first flight shows
whether it is a HelloRetryRequest (a client that pipelines a second ClientHello behind the first
gains nothing); then they are forwarded, or checked as the second ClientHello first.

Pure: bytes in, `GateStep`s out, so the forward-proxy tunnel and the transparent listener share
it and it is table-tested without sockets. Never reads a socket, never decides the rule itself
(the owner's `check` does), never raises on hostile input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from gateway.proxy.tls.sni import (
    CONTENT_TYPE_HANDSHAKE,
    HANDSHAKE_HEADER_BYTES,
    LEGACY_VERSION_BYTES,
    MAX_PEEK_BYTES,
    RANDOM_BYTES,
    RECORD_LENGTH_AT,
    TLS_RECORD_HEADER_BYTES,
    ClientHelloPeek,
    PeekStatus,
    peek_client_hello,
)

# RFC 8446 section 4.1.3: a HelloRetryRequest is a ServerHello whose random is this value.
HELLO_RETRY_REQUEST_RANDOM = bytes.fromhex("CF21AD74E59A6111BE1D8C021E65B891C2A211167ABB8C5E079E09E2C8A8339C")
HANDSHAKE_SERVER_HELLO = 0x02
CONTENT_TYPE_CHANGE_CIPHER_SPEC = 0x14
# Where a ServerHello's random starts in its first record, and where it ends.
_SERVER_RANDOM_AT = TLS_RECORD_HEADER_BYTES + HANDSHAKE_HEADER_BYTES + LEGACY_VERSION_BYTES
SERVER_HELLO_PREFIX_BYTES = _SERVER_RANDOM_AT + RANDOM_BYTES
# Client bytes held while the server's first flight is awaited; past it the owner stops reading.
MAX_HELD_BYTES = 64 * 1024


class ServerFlight(Enum):
    NEED_MORE = "need_more"
    RETRY = "hello_retry_request"
    OTHER = "other"  # a real ServerHello, an alert, or not TLS: no second ClientHello will count


def classify_server_flight(data: bytes) -> ServerFlight:
    """Whether the server's first bytes are a HelloRetryRequest."""
    if not data:
        return ServerFlight.NEED_MORE
    if data[0] != CONTENT_TYPE_HANDSHAKE:
        return ServerFlight.OTHER
    if len(data) < SERVER_HELLO_PREFIX_BYTES:
        record_length = (
            int.from_bytes(data[RECORD_LENGTH_AT:TLS_RECORD_HEADER_BYTES], "big")
            if len(data) >= TLS_RECORD_HEADER_BYTES
            else None
        )
        if record_length is not None and record_length < SERVER_HELLO_PREFIX_BYTES - TLS_RECORD_HEADER_BYTES:
            # A ServerHello fragmented across tiny records: no real server does that. Counted as a
            # retry, so the client's next ClientHello, if any, is checked all the same.
            return ServerFlight.RETRY
        return ServerFlight.NEED_MORE
    if data[TLS_RECORD_HEADER_BYTES] != HANDSHAKE_SERVER_HELLO:
        return ServerFlight.OTHER
    if data[_SERVER_RANDOM_AT:SERVER_HELLO_PREFIX_BYTES] == HELLO_RETRY_REQUEST_RANDOM:
        return ServerFlight.RETRY
    return ServerFlight.OTHER


def skip_change_cipher_spec(data: bytes) -> bytes | None:
    """The bytes after any leading ChangeCipherSpec records (TLS 1.3 middlebox compatibility
    mode sends one before the second ClientHello); None while one is incomplete."""
    offset = 0
    while offset < len(data) and data[offset] == CONTENT_TYPE_CHANGE_CIPHER_SPEC:
        if len(data) - offset < TLS_RECORD_HEADER_BYTES:
            return None
        length = int.from_bytes(data[offset + RECORD_LENGTH_AT : offset + TLS_RECORD_HEADER_BYTES], "big")
        end = offset + TLS_RECORD_HEADER_BYTES + length
        if end > len(data):
            return None
        offset = end
    return data[offset:]


class GateState(Enum):
    FIRST_HELLO = "first_hello"
    AWAIT_SERVER = "await_server"
    SECOND_HELLO = "second_hello"
    OPEN = "open"  # nothing more to check: bytes flow freely
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class GateStep:
    """What the owner does now: send `to_upstream`, refuse with `refusal`, stop reading (`hold`)."""

    to_upstream: bytes = b""
    refusal: str | None = None
    hold: bool = False


_WAIT = GateStep()
_HOLD = GateStep(hold=True)
# Nothing held yet: most tunnels are closed or opened before a buffer is needed, so none is made
# until a byte must be kept.
_NOTHING = b""


class HelloGate:
    """Holds client bytes until every ClientHello the server acts on has passed `check`.

    `check(peek)` returns None when a ClientHello (or the first flight's peek) may pass, else why
    the tunnel is refused (the tunnel's `sni_verdict` for its mode, host and port)."""

    __slots__ = ("_check", "_held", "_server", "state")

    def __init__(self, check: Callable[[ClientHelloPeek], str | None]) -> None:
        self._check = check
        self._held: bytes | bytearray = _NOTHING
        # The server's first bytes, up to a ServerHello's random (a few dozen bytes: copied).
        self._server = _NOTHING
        self.state = GateState.FIRST_HELLO

    @property
    def open(self) -> bool:
        return self.state is GateState.OPEN

    def from_client(self, data: bytes) -> GateStep:
        if self.state is GateState.OPEN:
            return GateStep(to_upstream=data)
        if self.state is GateState.REFUSED:
            return _WAIT
        held = self._held
        if isinstance(held, bytearray):
            held += data
        else:
            self._held = bytearray(data)
        if self.state is GateState.FIRST_HELLO:
            return self._first_hello()
        if self.state is GateState.SECOND_HELLO:
            return self._second_hello()
        return _HOLD if len(self._held) > MAX_HELD_BYTES else _WAIT

    def client_eof(self) -> bool:
        """The client half-closed: True when nothing is held back any more (the EOF may pass)."""
        return self.state is GateState.OPEN

    def from_server(self, data: bytes | bytearray | memoryview) -> GateStep:
        """The server's bytes (always relayed to the client by the owner); may release held bytes."""
        if self.state is not GateState.AWAIT_SERVER:
            return _WAIT
        self._server += bytes(data[: SERVER_HELLO_PREFIX_BYTES - len(self._server)])
        flight = classify_server_flight(self._server)
        if flight is ServerFlight.NEED_MORE:
            return _WAIT
        self._server = _NOTHING
        if flight is ServerFlight.RETRY:
            self.state = GateState.SECOND_HELLO
            return self._second_hello()
        return self._release()

    def _first_hello(self) -> GateStep:
        peek = peek_client_hello(bytes(self._held))
        if peek.status is PeekStatus.NEED_MORE and len(self._held) < MAX_PEEK_BYTES:
            return _WAIT
        refusal = self._check(peek)
        if refusal is not None:
            return self._refuse(refusal)
        if peek.status is not PeekStatus.COMPLETE:
            return self._release()  # not TLS (and allowed as such): nothing more to watch
        hello = bytes(self._held[: peek.consumed])
        self._held = self._held[peek.consumed :]
        self.state = GateState.AWAIT_SERVER
        return GateStep(to_upstream=hello)

    def _second_hello(self) -> GateStep:
        rest = skip_change_cipher_spec(bytes(self._held))
        if rest is None or not rest:
            return _WAIT if len(self._held) < MAX_PEEK_BYTES else self._refuse("the second flight is too large")
        peek = peek_client_hello(rest)
        if peek.status is PeekStatus.NEED_MORE and len(self._held) < MAX_PEEK_BYTES:
            return _WAIT
        if peek.status is not PeekStatus.COMPLETE:
            return self._refuse("after a HelloRetryRequest the client did not send a ClientHello")
        refusal = self._check(peek)
        if refusal is not None:
            return self._refuse(f"second ClientHello: {refusal}")
        return self._release()

    def _release(self) -> GateStep:
        self.state = GateState.OPEN
        held = bytes(self._held)
        self._held = _NOTHING
        return GateStep(to_upstream=held)

    def _refuse(self, reason: str) -> GateStep:
        self.state = GateState.REFUSED
        self._held = _NOTHING
        return GateStep(refusal=reason)
