"""Peek the server name out of a TLS ClientHello without consuming it.

The CONNECT tunnel holds the client's first flight, asks `peek_client_hello` what it is, and only
then forwards it unchanged. The ClientHello may span several TLS records (RFC 8446 section 5.1
allows a handshake message to be fragmented), so records are reassembled up to a bound.

Pure: bytes in, a `ClientHelloPeek` out. Never reads a socket, never decides policy (the tunnel
compares the name with the CONNECT host), never raises on hostile input.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# RFC 8446 section 5.1: a record carries at most 2^14 bytes of plaintext; a ClientHello larger than
# this bound is not something a real client sends, so the peek gives up instead of buffering more.
MAX_CLIENT_HELLO_BYTES = 16 * 1024
# A record header (RFC 8446 section 5.1): content type (1 byte), legacy record version (2 bytes,
# major version 3 for every SSL 3.0 / TLS version), length (2 bytes).
TLS_RECORD_HEADER_BYTES = 5
# The ClientHello, the headers of the few records it may be fragmented over, and some slack.
MAX_PEEK_BYTES = MAX_CLIENT_HELLO_BYTES + 4 * TLS_RECORD_HEADER_BYTES + 64
RECORD_VERSION_MAJOR_AT = 1
TLS_MAJOR_VERSION = 0x03
RECORD_LENGTH_AT = 3
# A handshake message header (section 4): message type (1 byte), length (3 bytes).
HANDSHAKE_HEADER_BYTES = 4
HANDSHAKE_LENGTH_AT = 1
# The fixed fields a ClientHello and a ServerHello start with (sections 4.1.2, 4.1.3).
LEGACY_VERSION_BYTES = 2
RANDOM_BYTES = 32
CONTENT_TYPE_HANDSHAKE = 0x16
HANDSHAKE_CLIENT_HELLO = 0x01
EXTENSION_SERVER_NAME = 0x0000
EXTENSION_ALPN = 0x0010
SERVER_NAME_TYPE_HOST = 0x00
MAX_SERVER_NAME_BYTES = 255


class PeekStatus(Enum):
    NEED_MORE = "need_more"  # a ClientHello has started but is not complete yet
    NOT_TLS = "not_tls"  # the first flight is not a TLS handshake record
    MALFORMED = "malformed"  # it claims to be a ClientHello but does not parse
    COMPLETE = "complete"  # a full ClientHello; `server_name` is its SNI or None


@dataclass(frozen=True, slots=True)
class ClientHelloPeek:
    status: PeekStatus
    server_name: str | None = None
    reason: str = ""
    consumed: int = 0  # COMPLETE: the bytes of the records that carried the ClientHello
    # COMPLETE: the protocols the client offers (ALPN), None without the extension. Inspection
    # refuses an offer without HTTP/1.1 before it terminates (issue 25).
    alpn: tuple[str, ...] | None = None


_NEED_MORE = ClientHelloPeek(PeekStatus.NEED_MORE)


def _malformed(reason: str) -> ClientHelloPeek:
    return ClientHelloPeek(PeekStatus.MALFORMED, None, reason)


def _reassemble(data: bytes) -> tuple[bytes, int] | ClientHelloPeek:
    """Concatenate handshake record fragments until the ClientHello message is whole."""
    if len(data) < 1:
        return _NEED_MORE
    if data[0] != CONTENT_TYPE_HANDSHAKE:
        return ClientHelloPeek(PeekStatus.NOT_TLS, None, "first byte is not a TLS handshake record")
    if len(data) > RECORD_VERSION_MAJOR_AT and data[RECORD_VERSION_MAJOR_AT] != TLS_MAJOR_VERSION:
        return ClientHelloPeek(PeekStatus.NOT_TLS, None, "record version is not TLS")
    handshake = bytearray()
    offset = 0
    while True:
        if len(data) - offset < TLS_RECORD_HEADER_BYTES:
            return _NEED_MORE if len(data) < MAX_PEEK_BYTES else _malformed("ClientHello too large")
        if data[offset] != CONTENT_TYPE_HANDSHAKE or data[offset + RECORD_VERSION_MAJOR_AT] != TLS_MAJOR_VERSION:
            return _malformed("a non-handshake record interrupts the ClientHello")
        length = int.from_bytes(data[offset + RECORD_LENGTH_AT : offset + TLS_RECORD_HEADER_BYTES], "big")
        if length == 0 or length > MAX_CLIENT_HELLO_BYTES + 256:
            return _malformed(f"record length {length} is out of range")
        end = offset + TLS_RECORD_HEADER_BYTES + length
        if len(data) < end:
            return _NEED_MORE if end <= MAX_PEEK_BYTES else _malformed("ClientHello too large")
        handshake += data[offset + TLS_RECORD_HEADER_BYTES : end]
        offset = end
        whole = _whole_hello(handshake)
        if isinstance(whole, ClientHelloPeek):
            return whole
        if whole is not None:
            return whole, offset


def _whole_hello(handshake: bytearray) -> bytes | ClientHelloPeek | None:
    """The ClientHello body once the reassembled handshake holds all of it (None: not yet)."""
    if len(handshake) < HANDSHAKE_HEADER_BYTES:
        return None
    if handshake[0] != HANDSHAKE_CLIENT_HELLO:
        return _malformed("the first handshake message is not a ClientHello")
    body_length = int.from_bytes(handshake[HANDSHAKE_LENGTH_AT:HANDSHAKE_HEADER_BYTES], "big")
    if body_length > MAX_CLIENT_HELLO_BYTES:
        return _malformed("ClientHello too large")
    if len(handshake) > HANDSHAKE_HEADER_BYTES + body_length:
        # A second handshake message in the ClientHello's record: no client sends one, and a
        # server could act on it after the checked one (a second ClientHello).
        return _malformed("bytes follow the ClientHello in its record")
    if len(handshake) == HANDSHAKE_HEADER_BYTES + body_length:
        return bytes(handshake[HANDSHAKE_HEADER_BYTES:])
    return None


class _Reader:
    """Bounds-checked cursor; every read past the end raises IndexError, caught by the caller."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise IndexError("truncated")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, length_size: int) -> bytes:
        return self.take(self.uint(length_size))


def _server_name(extension: bytes) -> str | ClientHelloPeek:
    reader = _Reader(extension)
    names = _Reader(reader.vector(2))
    if reader.pos != len(extension):
        return _malformed("trailing bytes after the server_name list")
    found: str | None = None
    while names.pos < len(names.data):
        name_type = names.uint(1)
        raw = names.vector(2)
        if name_type != SERVER_NAME_TYPE_HOST:
            continue
        if found is not None:
            # RFC 6066 section 3: at most one name of each type; two is an evasion attempt.
            return _malformed("two host_name entries in server_name")
        if not raw or len(raw) > MAX_SERVER_NAME_BYTES or any(b <= 0x20 or b >= 0x7F for b in raw):
            return _malformed("server_name is not a printable ASCII host name")
        found = raw.decode("ascii").lower().rstrip(".")
    if found is None:
        return _malformed("server_name extension without a host_name")
    return found


def _alpn(extension: bytes) -> tuple[str, ...] | ClientHelloPeek:
    # RFC 7301 section 3.1: one ProtocolNameList filling the extension, each name 1 to 255 bytes.
    # A list the server would reject with decode_error is refused here too, rather than read
    # differently from the server that gets it (as for server_name above).
    reader = _Reader(extension)
    names = _Reader(reader.vector(2))
    if reader.pos != len(extension):
        return _malformed("trailing bytes after the ALPN protocol list")
    offered: list[str] = []
    while names.pos < len(names.data):
        name = names.vector(1)
        if not name:
            return _malformed("an empty ALPN protocol name")
        offered.append(name.decode("ascii", "replace"))
    return tuple(offered)


def parse_client_hello(body: bytes) -> ClientHelloPeek:
    """SNI of a ClientHello handshake body (after the 4-byte handshake header)."""
    try:
        reader = _Reader(body)
        reader.take(LEGACY_VERSION_BYTES)
        reader.take(RANDOM_BYTES)
        reader.vector(1)  # legacy_session_id
        reader.vector(2)  # cipher_suites
        reader.vector(1)  # legacy_compression_methods
        if reader.pos == len(body):
            return ClientHelloPeek(PeekStatus.COMPLETE, None)  # no extensions at all
        extensions = _Reader(reader.vector(2))
        server_name: str | None = None
        alpn: tuple[str, ...] | None = None
        seen: set[int] = set()
        while extensions.pos < len(extensions.data):
            ext_type = extensions.uint(2)
            ext_data = extensions.vector(2)
            if ext_type in seen:
                # RFC 8446 section 4.2: duplicate extensions are illegal, and a second SNI is a
                # classic way to make a checker and the server read different names.
                return _malformed(f"duplicate extension {ext_type}")
            seen.add(ext_type)
            if ext_type == EXTENSION_SERVER_NAME:
                parsed = _server_name(ext_data)
                if isinstance(parsed, ClientHelloPeek):
                    return parsed
                server_name = parsed
            elif ext_type == EXTENSION_ALPN:
                offered = _alpn(ext_data)
                if isinstance(offered, ClientHelloPeek):
                    return offered
                alpn = offered
    except IndexError:
        return _malformed("ClientHello is truncated inside a length-prefixed field")
    return ClientHelloPeek(PeekStatus.COMPLETE, server_name, alpn=alpn)


def peek_client_hello(data: bytes) -> ClientHelloPeek:
    """What the first client bytes of a tunnel are: need more, not TLS, malformed, or the SNI."""
    reassembled = _reassemble(data)
    if isinstance(reassembled, ClientHelloPeek):
        return reassembled
    body, consumed = reassembled
    peek = parse_client_hello(body)
    if peek.status is PeekStatus.COMPLETE:
        return ClientHelloPeek(PeekStatus.COMPLETE, peek.server_name, consumed=consumed, alpn=peek.alpn)
    return peek
