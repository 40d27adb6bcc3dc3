"""What a redirected connection's first bytes are: a TLS ClientHello, an HTTP/1 request, or else.

The name of a redirected connection comes from its own first flight (SNI, or the Host of the
first request), never from the address the agent dialed or the DNS answer it got. Pure: bytes
in, a `FirstFlight` out; the SNI itself is read by the proxy's `sni.peek_client_hello`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from gateway.proxy.tls.sni import MAX_PEEK_BYTES, PeekStatus, peek_client_hello

# An HTTP/1 request line starts with a method token and one space (RFC 9112 section 3).
_REQUEST_LINE_START = re.compile(rb"^[A-Z]{3,10} ")
_METHOD_PREFIX = re.compile(rb"^[A-Z]{1,10}$")
SEEN_BYTES = 24


class FlightKind(Enum):
    NEED_MORE = "need_more"
    TLS = "tls"
    HTTP = "http"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class FirstFlight:
    kind: FlightKind
    server_name: str | None = None  # TLS: the SNI, None when the ClientHello carries none
    reason: str = ""


def describe_seen(data: bytes | bytearray) -> str:
    """The first bytes as a short printable text for the audit line (`SSH-2.0-OpenSSH_9.6`)."""
    head = data[:SEEN_BYTES]
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in head)
    return text + ("…" if len(data) > SEEN_BYTES else "")


def classify_first_flight(data: bytes) -> FirstFlight:
    if not data:
        return FirstFlight(FlightKind.NEED_MORE)
    if data[0] == 0x16:
        peek = peek_client_hello(data)
        if peek.status == PeekStatus.NEED_MORE:
            if len(data) >= MAX_PEEK_BYTES:
                return FirstFlight(FlightKind.UNKNOWN, reason="a TLS ClientHello larger than the peek bound")
            return FirstFlight(FlightKind.NEED_MORE)
        if peek.status == PeekStatus.COMPLETE:
            return FirstFlight(FlightKind.TLS, peek.server_name)
        return FirstFlight(FlightKind.UNKNOWN, reason=f"malformed TLS: {peek.reason}")
    if _REQUEST_LINE_START.match(data):
        return FirstFlight(FlightKind.HTTP)
    if len(data) < 11 and _METHOD_PREFIX.match(data):
        return FirstFlight(FlightKind.NEED_MORE)  # a method split across reads
    return FirstFlight(FlightKind.UNKNOWN, reason=f"neither TLS nor HTTP: {describe_seen(data)!r}")
