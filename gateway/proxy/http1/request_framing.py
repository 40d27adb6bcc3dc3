"""The request half of a proxy client connection, without I/O: client bytes in, request events out.

Owns how the listener reads HTTP/1.1 requests, as a state object in the style of h11: each head
cut out of the stream on raw bytes and fed to llhttp alone (httptools, strict: conflicting or
duplicate framing, obs-fold, bare CR/LF, NUL and invalid methods are refused by the parser
itself), with no Python call per field: llhttp validates the head in C, the request line is cut
from it, and `request_head.py` reads the caps (URL, field lines, head bytes, counted on raw
bytes) and the fields the proxy acts on from the whole head once llhttp accepted it (one
`Proxy-Authorization`, a single `Transfer-Encoding: chunked` only, no `Connection` field naming
a framing field). A head split across reads is held, bounded, until whole, each part fed to
llhttp as it comes, so a malformed start is refused at once, and its fields are checked as each
next line begins. Of two faults in a head, the first in the stream is the one refused
(llhttp's or the proxy's own). Bodies are fed to llhttp up to where they end (a Content-Length
counted, a chunked body's end found by `chunked_end.ChunkedBodyEnd`, which also bounds its
trailers; trailers are dropped), so every request of a read comes out in order (pipelining), as
does the keep-alive intent of each (RFC 9112 section 9.6: after a request that asked to close,
further bytes are dropped, not refused). No protocol upgrade but CONNECT.

Each `feed` returns the events of that read: a request head (what the owner's `new_head` makes
of it), `RequestBody`, `RequestEnd`, `ConnectHead` (the rest of the read belongs to the tunnel),
or `Refusal` (answer it and close; nothing further is parsed). Never touches a socket or a
timer; the listener carries the events out and the transparent listener can reuse it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NoReturn, TypeVar, Union

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.chunked_end import ChunkedBodyEnd
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.heads import MAX_HEAD_BYTES, MAX_URL_BYTES
from gateway.proxy.http1.request_head import (
    LINE_TOO_LONG,
    HeldFields,
    content_length,
    earlier_fault,
    read_field_block,
    request_line,
    too_large,
)

NO_VERSION = "the request line has no HTTP version (HTTP/0.9 is not served)"
CONTROL_IN_LINE = "the request line holds a control character"
# Each control byte (C0 and DEL) as 0, every other byte as 1: `0 in line.translate(...)` finds a
# control byte in one C pass, where a regex search runs sre's charset test on every byte (about
# 2 k instructions more per request line under bench/callgrind_proxy.py).
_CONTROL_AS_ZERO = bytes(0 if byte < 0x20 or byte == 0x7F else 1 for byte in range(256))

# What a complete request head (not CONNECT) becomes, made by the framing's owner from the parse:
# (method, url, the whole head as sent, its forwarded field lines (the fields Connection names
# already left out), authorization, chunked, HTTP/1.0, this request's own keep-alive intent, RFC
# 9112 section 9.3). The listener's is a `forward/exchange.ParsedRequest`, which its client
# connection makes into the request's exchange; the request's body and end follow it as events.
H = TypeVar("H")
HeadFactory = Callable[
    [bytes, bytes, bytes, bytes, bytes | None, bool, bool, bool],
    H,
]


@dataclass(slots=True)
class RequestBody:
    data: bytes


@dataclass(frozen=True, slots=True)
class RequestEnd:
    pass


@dataclass(slots=True)  # not frozen either: once per tunnel
class ConnectHead:
    """A CONNECT head; `rest` (bytes already read after it) belongs to the tunnel, not to HTTP."""

    authority: bytes
    authorization: bytes | None
    rest: bytes


@dataclass(slots=True)
class UpgradeHead:
    """A bodiless request asking for a protocol upgrade (WebSocket), from a framing made with
    `upgrades=True` (inside an inspected connection); `rest` is the bytes read after its head,
    which belong to the upgraded protocol, not to HTTP."""

    method: bytes
    url: bytes
    head: bytes
    rest: bytes


@dataclass(frozen=True, slots=True)
class Refusal:
    """The stream cannot be served: answer `error` once and close (it is out of sync)."""

    error: GatewayError


UPGRADE_REFUSED = "protocol upgrades are not proxied; use CONNECT"
# llhttp ended a message where the framing did not cut it (never for bytes llhttp accepts).
OUT_OF_STEP = "malformed request: the message framing could not be followed"
# `Union`: a generic alias (`RequestEvent[ForwardExchange]`), which `|` cannot spell with a TypeVar.
RequestEvent = Union[H, RequestBody, RequestEnd, ConnectHead, UpgradeHead, Refusal]  # noqa: UP007
_END = RequestEnd()
HEAD_END = b"\r\n\r\n"
_HEAD_END_BYTES = len(HEAD_END)
# The two line breaks, as the first byte of a read: empty lines before a request line (llhttp
# skips them); no method starts with a byte at or below CR.
_CR, _LF = ord("\r"), ord("\n")


class _Refused(Exception):
    """Raised to stop parsing (inside an httptools callback or not); the reason is on the framing."""


class RequestFraming(Generic[H]):
    """Requests of one client connection, parsed one read at a time; each head made by `new_head`."""

    __slots__ = (
        "_body_left",
        "_chunks",
        "_connect",
        "_events",
        "_head",
        "_head_bytes",
        "_held",
        "_held_fields",
        "_held_lines",
        "_in_head",
        "_memos",
        "_new_head",
        "_no_more_requests",
        "_parser",
        "_preface",
        "_refusal",
        "_upgrade",
        "_upgrades",
        "done",
    )

    # `upgrades` is positional: a keyword to a class costs Python 3.11 a dict (one framing per connection).
    def __init__(self, new_head: HeadFactory[H], memos: HeadMemos, upgrades: bool = False) -> None:
        self._new_head = new_head
        # The listener's memos of the heads it has read (`head_memos`).
        self._memos = memos
        # Upgrades become `UpgradeHead` events instead of refusals (an inspected connection
        # judges and relays them; the forward proxy refuses them: "use CONNECT").
        self._upgrades = upgrades
        self._upgrade: UpgradeHead | None = None
        # Neither `on_url` nor `on_header` (nor `on_message_begin`) is defined, so httptools
        # installs no callback for them: llhttp calls Python once per head and once per message.
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._events: list[RequestEvent[H]] = []
        # The whole head llhttp is being fed (`on_headers_complete` reads it; empty otherwise).
        self._head = b""
        self._head_bytes = 0  # bytes of empty lines before the head being read (they count)
        self._held: bytearray | None = None  # the start of a head that is not whole yet
        self._held_lines = 0
        self._held_fields: HeldFields | None = None  # the checks on a held head's fields so far
        self._body_left = 0  # bytes of a Content-Length body still to come
        self._chunks: ChunkedBodyEnd | None = None  # while a chunked body is read
        self._connect: ConnectHead | None = None  # the head was a CONNECT (no HTTP follows it)
        self._in_head = True
        self._refusal: GatewayError | None = None
        self._preface = False  # llhttp read an HTTP/2 preface head (no head event)
        self._no_more_requests = False
        self.done = False  # nothing more will be parsed (refused, tunnelled, or asked to close)

    @property
    def in_head(self) -> bool:
        """Between requests or inside a head (the head deadline applies), not inside a body."""
        return self._in_head

    # One loop over the messages of a read, its common case inline: a helper call per head would
    # cost more than the branches (once per request).
    def feed(self, data: bytes) -> list[RequestEvent[H]]:  # noqa: PLR0912, PLR0915
        if self.done:
            return []
        events = self._events = []
        parser = self._parser
        assert parser is not None  # let go of only once done
        try:
            while data and not self._no_more_requests:
                if not self._in_head:
                    data = self._body(data)
                    continue
                # (A first byte at or below CR, LF among them, is never a method: llhttp refuses
                # it whichever path feeds it.)
                if self._held is None and data[0] > _CR and (end := data.find(HEAD_END)) > 0:
                    # The common case: a whole head at the start of the read, fed to llhttp alone.
                    head_end = end + _HEAD_END_BYTES
                    if head_end == len(data):
                        head = part = data
                        data = b""
                    else:
                        head = part = data[:head_end]
                        data = data[head_end:]
                else:
                    cut, part, data = self._cut_head(data)
                    if cut is None:
                        continue
                    head = cut
                self._head = head
                parser.feed_data(part)
                if not self._in_head:
                    if self._chunks is None:
                        # llhttp did not end the message with its head: a Content-Length body.
                        self._body_left = content_length(head)
                elif self._head:
                    # llhttp took the head without a head event (the HTTP/2 preface's `PRI`):
                    # its caps hold all the same, and what follows is llhttp's alone to judge.
                    self._preface = True
                    fault = earlier_fault(head, self._head_bytes + len(head))
                    if fault is not None:
                        self._refuse(fault)
        except httptools.HttpParserUpgrade:
            self._finish()
            connect = self._connect
            upgrade = self._upgrade
            if upgrade is not None:
                upgrade.rest = data  # the bytes after its head
                events.append(upgrade)
            elif connect is None:
                events.append(Refusal(GatewayError(ErrorCode.INVALID_INPUT, UPGRADE_REFUSED)))
            else:
                connect.rest = data  # the bytes after its head
                events.append(connect)
            return events
        except (httptools.HttpParserError, _Refused) as exc:
            self._finish()
            if not self._no_more_requests:
                error = self._refusal
                if error is None and self._in_head and not self._preface:
                    # llhttp refused bytes of a head: a fault of the proxy's own before them is
                    # the one refused, as when each field was checked as it ended.
                    head = self._head or bytes(self._held or b"")
                    error = earlier_fault(head, self._head_bytes + len(head))
                events.append(Refusal(error or GatewayError(ErrorCode.INVALID_INPUT, f"malformed request: {exc}")))
            # else RFC 9112 section 9.6: after a request that asked to close, further requests are
            # not processed; it is still owed its response, so the bytes are dropped, not refused.
            return events
        if self._no_more_requests:
            self._finish()
        return events

    def _cut_head(self, data: bytes) -> tuple[bytes | None, bytes, bytes]:
        """A head that does not start and end in this read, the rare case: (the whole head, its
        bytes in this read, the bytes after it), or None while it is not whole. Each part is fed
        to llhttp as it arrives (it refuses a malformed start at once) and held, the caps
        counted on what is held."""
        parser = self._parser
        assert parser is not None  # called from feed
        held = self._held
        if held is None:
            if data[0] == _CR or data[0] == _LF:
                # Empty lines before a request line (RFC 9112 section 2.2): llhttp skips them.
                start = data.lstrip(b"\r\n")
                skipped = len(data) - len(start)
                parser.feed_data(data[:skipped] if start else data)
                self._head_bytes += skipped
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._refuse(too_large("the request head is too large"))
                return None, b"", start
            held = self._held = bytearray()
            self._held_lines = 0
            self._held_fields = None
            self._head = b""  # (one llhttp took without a head event: the HTTP/2 preface)
        searched = max(0, len(held) - (len(HEAD_END) - 1))  # the end may straddle two reads
        held += data
        end = held.find(HEAD_END, searched)
        if end >= 0:
            head_end = end + len(HEAD_END)
            taken = head_end - (len(held) - len(data))
            self._held = None
            head = bytes(held) if head_end == len(held) else bytes(held[:head_end])
            return head, data if taken == len(data) else data[:taken], data[taken:]
        parser.feed_data(data)
        self._count_held(data)
        return None, b"", b""

    def _count_held(self, data: bytes) -> None:
        """The caps on a head not whole yet, once llhttp accepted its bytes so far."""
        held = self._held
        assert held is not None  # called as a part is held
        lines_before = self._held_lines
        lines = self._held_lines = lines_before + data.count(b"\n")
        if not lines_before and len(held) > MAX_URL_BYTES:
            # The request line was not whole before this read: its target may be past the cap.
            line_end = held.find(b"\r")
            line = held if line_end < 0 else held[:line_end]
            target = line[line.find(b" ") + 1 :].lstrip(b" ")
            target_end = target.find(b" ")
            if (len(target) if target_end < 0 else target_end) > MAX_URL_BYTES:
                self._refuse(too_large(LINE_TOO_LONG))
        if lines:
            fields = self._held_fields
            if fields is None:
                fields = self._held_fields = HeldFields(held.find(b"\r\n") + 2)
            try:
                fields.check(held)
            except GatewayError as error:
                self._refuse(error)
        if self._head_bytes + len(held) > MAX_HEAD_BYTES:
            self._refuse(too_large("the request head is too large"))

    def _body(self, data: bytes) -> bytes:
        """Feed llhttp the body bytes of this read; returns the bytes after the message."""
        parser = self._parser
        assert parser is not None  # called from feed
        chunks = self._chunks
        if chunks is None:
            left = self._body_left
            if len(data) < left:
                self._body_left = left - len(data)
                parser.feed_data(data)
                return b""
            self._body_left = 0
            parser.feed_data(data if len(data) == left else data[:left])
            if not self._in_head:
                self._refuse(GatewayError(ErrorCode.INVALID_INPUT, OUT_OF_STEP))
            return data[left:]
        end = chunks.end_in(data)
        if chunks.trailer_bytes > MAX_HEAD_BYTES:
            # Refused before the message ends (a request that asked to close would have its
            # refusal dropped), once llhttp accepted the trailer lines.
            parser.feed_data(data if end < 0 else data[: max(0, end - 2)])
            self._refuse(too_large("the request trailers are too large"))
        if end < 0 or end == len(data):
            parser.feed_data(data)
            rest = b""
        else:
            parser.feed_data(data[:end])
            rest = data[end:]
        if end >= 0 and not self._in_head:
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, OUT_OF_STEP))
        return rest

    def _finish(self) -> None:
        """Nothing more is parsed: the parser is let go of. It holds this object's callbacks, a
        reference cycle the garbage collector would otherwise have to find (once per tunnel)."""
        self.done = True
        self._parser = None

    def _refuse(self, error: GatewayError) -> NoReturn:
        self._refusal = error
        raise _Refused

    # httptools callbacks ------------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        head = self._head
        if not head:
            # A head llhttp read that the framing did not cut out: never fed to the reader.
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, OUT_OF_STEP))
        self._head = b""
        self._in_head = False
        counted = self._head_bytes + len(head)
        self._head_bytes = 0
        # llhttp accepted the head: its request line is `method SP target SP version` (more
        # spaces, or no version for HTTP/0.9, on the slower path), its first CRLF ends it.
        line, _, block = head.partition(b"\r\n")
        words = line.split(b" ")
        method, url, version = words if len(words) == 3 and words[1] and words[2] else request_line(line)
        if len(url) > MAX_URL_BYTES:
            self._refuse(too_large(LINE_TOO_LONG))
        if 0 in line.translate(_CONTROL_AS_ZERO):
            # llhttp lets a bare LF (or another control) into the target: a reader that ends
            # lines at LF would see the rest as a field line. A plain parser refuses the line.
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, CONTROL_IN_LINE))
        if not version:
            # llhttp reads `GET url` as HTTP/0.9, so `GET http://a/ HTTP/1.1` mistyped as
            # `GET http://a/-HTTP/1.1` took the version into the target; a plain parser refuses.
            self._refuse(GatewayError(ErrorCode.INVALID_INPUT, NO_VERSION))
        try:
            fields = read_field_block(block, counted, self._memos)
        except GatewayError as error:
            self._refuse(error)
        if method == b"CONNECT":
            self._connect = ConnectHead(url, fields.authorization, b"")
            return  # httptools raises HttpParserUpgrade next; `feed` hands the rest to the tunnel
        parser = self._parser
        assert parser is not None  # callbacks run inside feed_data
        if parser.should_upgrade():
            # Refused at its head, not once llhttp reaches the message's end: by then the head
            # event would have started the exchange, and a pooled upstream could see the request.
            # (llhttp reads `Proxy-Connection: upgrade` as a Connection field too.)
            if not self._upgrades or fields.chunked or content_length(head):
                # An upgrade carrying a body is not a WebSocket handshake: refused as before.
                self._refuse(GatewayError(ErrorCode.INVALID_INPUT, UPGRADE_REFUSED))
            self._upgrade = UpgradeHead(method, url, head, b"")
            return  # httptools raises HttpParserUpgrade at the message's end
        if fields.chunked:
            self._chunks = ChunkedBodyEnd()
        http10 = version == b"HTTP/1.0"
        keep_alive = parser.should_keep_alive()
        self._events.append(
            self._new_head(method, url, head, fields.lines, fields.authorization, fields.chunked, http10, keep_alive)
        )

    def on_body(self, body: bytes) -> None:
        self._events.append(RequestBody(body))

    def on_message_complete(self) -> None:
        self._in_head = True
        self._chunks = None
        if self._connect is not None or self._upgrade is not None:
            return  # no HTTP message follows: `feed` hands the rest to the tunnel
        parser = self._parser
        assert parser is not None  # callbacks run inside feed_data
        if not parser.should_keep_alive():
            self._no_more_requests = True
        self._events.append(_END)
