"""One upstream HTTP/1.1 response re-framed for the client, without I/O: bytes in, client bytes out.

Owns the response half of plain HTTP forwarding as a state object in the style of h11: heads cut
out of the stream on raw bytes under the response-head caps (`response_head.py`), validated and
framed by llhttp (httptools, strict) with no Python call per field, hop-by-hop fields and the
fields `Connection` names cut out of the raw head once llhttp accepted it, the body re-framed (the
client gets `Content-Length` as sent, or chunked whatever the upstream used, or a close-delimited
body for an HTTP/1.0 client), interim responses relayed to HTTP/1.1 clients only,
and the facts the connection owner acts on: whether the final head went out, whether the response
is complete, whether the upstream connection may be reused, whether the client must be closed.

Every way an origin can lie about framing ends in a `GatewayError` from `feed` (never a parser
exception): a malformed head or body, an unsolicited 101, a `Connection` field naming a framing
field, a cap passed. Bytes after the complete response are never relayed; they only make the
connection unusable. Never touches a socket or a timer; never quotes upstream bytes in a message.
"""

from __future__ import annotations

import re

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.proxy.heads import (
    FRAMING_FIELDS,
    HOP_BY_HOP,
    NAMED_BY_SHORT_CONNECTION_VALUE,
    NOTHING_NAMED,
    named_by_connection,
)
from gateway.proxy.response_head import MAX_RESPONSE_HEAD_BYTES, ResponseHeadScanner

NO_BODY_STATUSES = frozenset({204, 304})
MALFORMED = "the upstream response is malformed"

# What a field name means to the relay, for the heads read line by line (`_field_role`).
_CONNECTION, _CHUNKED, _DROP, _LENGTH, _EGRESS_ID, _RELAY = range(6)
# tchar (RFC 9110 section 5.6.2): a `Proxy-*` name is `proxy-` and any token.
_TOKEN_CHARS = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]"


def _any_case(name: bytes) -> bytes:
    """A pattern for `name` in any letter case: explicit classes, not re.IGNORECASE, which sre
    scans far slower."""
    return b"".join(
        b"[%c%c]" % (char, char ^ 0x20) if 0x61 <= char <= 0x7A else re.escape(bytes([char])) for char in name
    )


def _fields_of_note(dropped: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """The lines the relay acts on, found in one C-level scan of a head llhttp has accepted.

    In strict mode llhttp has checked that each line is a token, a colon with nothing before it,
    optional whitespace and a value without CR, LF or NUL, so every CRLF of the head starts a
    field line and a line's name ends at its first colon. A line of note is Connection (group 1:
    its value), Transfer-Encoding (group 2), a field never relayed (group 3: `dropped` and
    `Proxy-*`), or, with no group, an irregular line: llhttp reads a value without the
    whitespace after the colon and the relay sends `name: value`, so a line is relayed as its raw
    bytes only when one space and no more whitespace follow the colon; a head with any other line
    is read line by line. Content-Length is relayed as it is, its presence read from llhttp's
    answer (`should_keep_alive`). A lookahead on the first letter keeps most lines out of the
    name alternatives; `[^:]` and `[^\\r]` (one excluded byte) are sre's fast repeats."""
    first_letters = bytes(sorted({name[0] for name in (b"connection", b"transfer-encoding", b"proxy-", *dropped)}))
    return re.compile(
        rb"\r\n(?:(?=["
        + first_letters
        + first_letters.upper()
        + rb"])(?:"
        + _any_case(b"connection")
        + rb": ([^\r]*)|("
        + _any_case(b"transfer-encoding")
        + rb"):[^\r]*|("
        + b"|".join(_any_case(name) for name in dropped)
        + b"|"
        + _any_case(b"proxy-")
        + _TOKEN_CHARS
        + rb"*):[^\r]*)|[^:]*+:(?:[^ ]| [ \t]))"
    )


_HOP_BY_HOP_NAMES = (b"keep-alive", b"te", b"trailer", b"upgrade")
_FIELDS_OF_NOTE = _fields_of_note(_HOP_BY_HOP_NAMES)
# The origin's X-Egress-Id is dropped when the gateway sends its own.
_FIELDS_OF_NOTE_BESIDE_AN_ID = _fields_of_note((*_HOP_BY_HOP_NAMES, b"x-egress-id"))
_CONTENT_LENGTH = re.compile(rb"\r\n" + _any_case(b"content-length") + b":")
# `Connection: close` names a field too, which origins almost never send.
_CLOSE_FIELD = re.compile(rb"\r\n" + _any_case(b"close") + b":")
_HOP_BY_HOP_AND_CLOSE = HOP_BY_HOP | {b"close"}
# The relayed status line, without its CRLF, of each (status, short reason) an origin sends whose
# own line is not already that (`HTTP/1.0 200 OK`): formatting bytes parses the format on every
# call, and origins repeat a handful.
MAX_REMEMBERED_REASON_BYTES = 64
MAX_REMEMBERED_STATUS_LINES = 256
_STATUS_LINES: BoundedMemo[tuple[int, bytes], bytes] = BoundedMemo(MAX_REMEMBERED_STATUS_LINES)


def _field_role(name: bytes) -> int:
    """The role `_FIELDS_OF_NOTE` gives a regular line of this name (`_RELAY` for one it skips)."""
    lowered = name.lower()
    if lowered == b"connection":
        return _CONNECTION
    if lowered == b"content-length":
        return _LENGTH
    if lowered == b"transfer-encoding":
        return _CHUNKED
    if lowered == b"x-egress-id":
        return _EGRESS_ID  # dropped when the gateway sends its own
    if lowered in HOP_BY_HOP or lowered.startswith(b"proxy-"):
        return _DROP
    return _RELAY


def _status_line_bounds(head: bytes) -> tuple[int, int]:
    """Where the status line starts and ends (before its CRLF): llhttp skips empty lines before
    a status line (RFC 9112 section 2.2)."""
    line_start = len(head) - len(head.lstrip(b"\r\n"))
    return line_start, head.index(b"\r\n", line_start)


def _status_line(head: bytes, line_start: int, line_end: int, status: int) -> bytes:
    """`HTTP/1.1 <status> <reason>`, the reason as the origin sent it. llhttp has checked the line:
    a version without spaces, one space, three digits, then a space and the reason, or nothing."""
    reason = head[head.index(b" ", line_start) + 5 : line_end]
    line = _STATUS_LINES.get((status, reason))
    if line is None:
        line = b"HTTP/1.1 %d %b" % (status, reason)
        if len(reason) <= MAX_REMEMBERED_REASON_BYTES:
            _STATUS_LINES.put((status, reason), line)
    return line


def _fields_line_by_line(
    head: bytes, line_end: int, id_field: bytes
) -> tuple[list[bytes], bool, bool, frozenset[bytes]]:
    """The head's relayed field lines (each CRLF and `name: value`, then the CRLF that ends the
    last), whether it has Content-Length, whether it has Transfer-Encoding, the names its
    Connection fields list: each line read in Python, for the rare head `_FIELDS_OF_NOTE` cannot
    cut (an irregular line, a Connection field naming fields that are not cut already). Values
    are read as llhttp reads them: leading whitespace dropped, trailing whitespace kept."""
    fields: list[tuple[bytes, bytes]] = []
    has_length = chunked = False
    values: list[bytes] = []
    for line in head[line_end + 2 : -4].split(b"\r\n") if len(head) - line_end > 4 else ():
        name, _, value = line.partition(b":")
        value = value.lstrip(b" \t")
        role = _field_role(name)
        if role == _CONNECTION:
            values.append(value)
        elif role == _CHUNKED:
            chunked = True
        elif role == _DROP or (role == _EGRESS_ID and id_field):
            continue
        else:
            has_length = has_length or role == _LENGTH
            fields.append((name, value))
    # The fields a Connection field names are hop-by-hop too (RFC 9110 section 7.6.1).
    named = named_by_connection(values)
    lines = [b"\r\n" + name + b": " + value for name, value in fields if name.lower() not in named]
    lines.append(b"\r\n")
    return lines, has_length, chunked, named


def _read_head(
    head: bytes, status: int, id_field: bytes, keep_alive: bool
) -> tuple[list[bytes], bool, bool, frozenset[bytes]]:
    """The relayed head's pieces to the CRLF that ends its last field line (the fields the
    framing adds and the blank line follow), whether it has Content-Length, whether it has
    Transfer-Encoding, the names its Connection fields list: read from the whole head once
    llhttp accepted it.

    The relayed head is the raw head with the lines of note cut out, each with the CRLF before
    it: one C call gives the kept spans and, after each, the line's Connection value,
    Transfer-Encoding name and dropped name (or None: an irregular line has none)."""
    pieces = (_FIELDS_OF_NOTE_BESIDE_AN_ID if id_field else _FIELDS_OF_NOTE).split(head)
    if len(pieces) == 1:
        kept = pieces
        values: list[bytes] = []
        chunked = irregular = False
    elif len(pieces) == 5:
        # One line of note, nearly always Connection: read without slicing the list.
        connection, coding, dropped = pieces[1], pieces[2], pieces[3]
        kept = [pieces[0], pieces[4]]
        values = [connection] if connection else []
        chunked = coding is not None
        irregular = connection is None and coding is None and dropped is None
    else:
        kept = pieces[::4]
        values = list(filter(None, pieces[1::4]))
        chunked = any(pieces[2::4])
        # Each line of note but an irregular one (no group) has one group that is not None.
        irregular = pieces.count(None) > len(pieces) // 2
    # `named_by_connection`'s remembered answer first, inline: nearly every response has one
    # short Connection value (`keep-alive`).
    named = (
        (len(values) == 1 and NAMED_BY_SHORT_CONNECTION_VALUE.get(values[0])) or named_by_connection(values)
        if values
        else NOTHING_NAMED
    )
    # The fields a Connection field names are hop-by-hop too (RFC 9110 section 7.6.1): a head
    # naming any that is not cut already is read line by line, as is a head with an irregular line.
    names_only_cut = named <= HOP_BY_HOP or (named <= _HOP_BY_HOP_AND_CLOSE and _CLOSE_FIELD.search(head) is None)
    if irregular or not names_only_cut:
        line_start, line_end = _status_line_bounds(head)
        fields, has_length, chunked, named = _fields_line_by_line(head, line_end, id_field)
        return [_status_line(head, line_start, line_end, status), *fields], has_length, chunked, named
    # The origin's status line is the relayed one when it reads `HTTP/1.1 <3 digits> <reason>`
    # (llhttp has checked the digits and what may follow them: a space or the CRLF).
    if not (head.startswith(b"HTTP/1.1 ") and head[12] == 0x20 and status >= 100):
        line_start, line_end = _status_line_bounds(head)
        kept[0] = _status_line(head, line_start, line_end, status) + kept[0][line_end:]
    # llhttp keeps a connection alive only when the body's end is known: with no Transfer-Encoding
    # (strict llhttp refuses it beside Content-Length) that is Content-Length, or a status without
    # a body.
    has_length = not chunked and (keep_alive or _CONTENT_LENGTH.search(head) is not None)
    kept[-1] = kept[-1][:-2]  # the blank line
    return kept, has_length, chunked, named


class _StopParsing(Exception):
    """Raised inside an httptools callback to stop the parser; the reason is on the framing."""


class ResponseFraming:
    """The response to one request: feed upstream bytes, take the bytes owed to the client."""

    __slots__ = (
        "_at_boundary",
        "_chunk_to_client",
        "_client_http10",
        "_failure",
        "_head",
        "_head_only",
        "_id_field",
        "_out",
        "_parser",
        "_progress",
        "_scanner",
        "_stalled",
        "_status",
        "_streaming",
        "body_bytes",
        "close_client",
        "complete",
        "eof_body",
        "head_sent",
        "reusable",
        "status",
    )

    # Declared here: `next_response` sets them again before `_start` in this file.
    _streaming: bool
    _out: list[bytes]
    reusable: bool
    _at_boundary: bool

    def __init__(self, *, head_only: bool, client_http10: bool, close_client: bool, id_field: bytes = b"") -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._start(head_only, client_http10, close_client, id_field)

    def next_response(
        self, *, head_only: bool, client_http10: bool, close_client: bool, id_field: bytes = b""
    ) -> ResponseFraming:
        """The framing of the next response on the same upstream connection: this object again,
        keeping its parser, when the last response ended where llhttp expects the next one
        (building a parser and its callbacks costs about a third of a small response's framing);
        a new one when it did not (a HEAD response leaves llhttp waiting for a body that never
        comes) or the connection's framing is lost."""
        if not (self._at_boundary and self.reusable):
            return ResponseFraming(
                head_only=head_only, client_http10=client_http10, close_client=close_client, id_field=id_field
            )
        # `_start`, less what a response that ended at the boundary and left the connection
        # reusable already holds as a fresh framing would: no failure, no stall (a completing read
        # resets it), not close-delimited (such a body never reaches the boundary), and the state
        # of a head, which `on_headers_complete` reads from the head itself.
        self._head_only = head_only
        self._id_field = id_field
        self._client_http10 = client_http10
        self.close_client = close_client
        self._scanner.restart()  # the same scanner: its caps count from zero for each exchange
        self._streaming = False
        self._out = []
        self.head_sent = False
        self.complete = False
        self.body_bytes = 0
        self.status = 0
        self._at_boundary = False
        return self

    def _start(self, head_only: bool, client_http10: bool, close_client: bool, id_field: bytes) -> None:
        self._head_only = head_only
        # `X-Egress-Id: <conn>\r\n` for the final head (the origin's own field of that name is dropped).
        self._id_field = id_field
        self._client_http10 = client_http10
        # An HTTP/1.0 client, or one that asked to close, is told so in the final response head.
        self.close_client = close_client
        # Until the final head has been parsed, heads are cut out of the stream on raw bytes
        # (caps counted before llhttp sees a fragment); then the body is streaming.
        self._scanner = ResponseHeadScanner()
        self._streaming = False
        self._out = []
        # The whole head llhttp is parsing (`on_headers_complete` reads its lines).
        self._head = b""
        self._chunk_to_client = False
        self._status = 0
        self._failure: GatewayError | None = None
        self._progress = 0  # body callbacks so far: a read that makes none is framing or trailers
        self._stalled = 0
        self.head_sent = False  # the final head is in the output
        self.complete = False
        self.reusable = True
        self.eof_body = False  # the body ends when the upstream closes
        self.body_bytes = 0
        self.status = 0  # the final response's status once its head was sent
        self._at_boundary = False  # llhttp has seen the final response end: it may parse the next

    # the owner's interface ----------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        """Upstream bytes; returns the bytes owed to the client so far (`take_output`). Raises
        GatewayError when the response cannot be relayed as framed; what was owed before the
        failure stays for `take_output`."""
        if self.complete:
            self.reusable = False  # bytes nobody asked for: the connection's framing is lost
            return b""
        try:
            # Heads are cut out on raw bytes until the final one is parsed, then the body streams.
            # Inline, not a method: once per upstream read.
            parser = self._parser
            rest: bytes | memoryview = data
            # Streaming once the final head was parsed (`rest` copied below only after a 1xx).
            while not self._streaming:
                taken = self._scanner.take_head(rest if isinstance(rest, bytes) else rest.tobytes())
                if taken is None:
                    rest = b""
                    break
                head, rest = taken
                self._head = head
                parser.feed_data(head)
                if not rest:
                    break
            if rest:
                progress = self._progress
                parser.feed_data(rest)
                if self._progress != progress or self.complete:
                    self._stalled = 0
                else:
                    # A read with no body byte in it: chunk framing or a trailer section, which
                    # llhttp reads without a callback and without end: bound it.
                    self._stalled += len(rest)
                    if self._stalled > MAX_RESPONSE_HEAD_BYTES:
                        raise GatewayError(
                            ErrorCode.TOO_LARGE,
                            f"the upstream's chunk framing or trailers exceed {MAX_RESPONSE_HEAD_BYTES} bytes",
                        )
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            if self._failure is None and self.complete:
                # After the complete response (an injected second head, a stray byte): dropped.
                self.reusable = False
                return self.take_output()
            self.reusable = False
            raise self._failure or GatewayError(ErrorCode.CONNECT_FAILURE, MALFORMED) from None
        except GatewayError:
            self.reusable = False
            raise
        return self.take_output()

    def take_output(self) -> bytes:
        """The bytes owed to the client so far (head and body coalesced into one write)."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def end_of_stream(self) -> bool:
        """The upstream closed: True when that completes a close-delimited body."""
        self.reusable = False
        if self.eof_body and self.head_sent and not self.complete:
            self._finish_message()
            return True
        return False

    # httptools callbacks: llhttp calls none per field, as none is defined (`on_header`,
    # `on_status`); it validates and frames the head in C, and `on_headers_complete` reads the
    # lines the relay acts on from the whole head.
    def on_message_begin(self) -> None:
        if self.complete:
            raise _StopParsing  # a second response nobody asked for: never parsed, never relayed

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        self._status = status
        keep_alive = parser.should_keep_alive()
        kept, has_length, chunked, named = _read_head(self._head, status, self._id_field, keep_alive)
        if status == 101 or (named and not FRAMING_FIELDS.isdisjoint(named)):
            self._refuse_unframeable(status)
        informational = status < 200
        if not informational:
            self._streaming = True  # the body follows; trailers, if any, are dropped
        elif self._client_http10:
            return  # RFC 9110 section 15.2: no interim response to an HTTP/1.0 client
        # The head's pieces go straight into the output: one join for head and body.
        out = self._out
        out += kept
        if not keep_alive:
            self.reusable = False
        bodiless = informational or self._head_only or status in NO_BODY_STATUSES
        self._chunk_to_client = False
        if not bodiless and not has_length:
            self.eof_body = not chunked
            if self._client_http10:
                self.close_client = True
            else:
                # Re-frame: the client gets a chunked body whatever the upstream used.
                self._chunk_to_client = True
                out.append(b"Transfer-Encoding: chunked\r\n")
        if not informational and self._id_field:
            out.append(self._id_field)
        if self.close_client and not informational:
            out.append(b"Connection: close\r\n")
        out.append(b"\r\n")
        if not informational:
            self.head_sent = True
            self.status = status
            if self._head_only:
                # No body follows a HEAD response whatever its Content-Length says.
                self.complete = True

    def _refuse_unframeable(self, status: int) -> None:
        if status == 101:
            # The gateway never forwards Upgrade, so a switch is unsolicited: relaying it would
            # hand the client a stream the proxy no longer frames.
            self._failure = GatewayError(ErrorCode.CONNECT_FAILURE, "the upstream switched protocols unasked (101)")
            raise _StopParsing
        # Framing fields are never hop-by-hop: stripping them would re-frame the body differently.
        self._failure = GatewayError(
            ErrorCode.CONNECT_FAILURE, "the upstream response's Connection field names a framing header"
        )
        raise _StopParsing

    def on_body(self, body: bytes) -> None:
        self._progress += 1
        if self.complete:
            self.reusable = False  # bytes after a bodiless response: do not reuse
            return
        self.body_bytes += len(body)
        if self._chunk_to_client:
            self._out.append(b"%x\r\n%b\r\n" % (len(body), body))
        else:
            self._out.append(body)

    def on_chunk_header(self) -> None:
        self._progress += 1

    def on_message_complete(self) -> None:
        self._progress += 1
        if self._status < 200:
            return  # an interim response; the final one follows on the same parser
        # `_finish_message`, inline: once per response.
        if not self.complete:
            if self._chunk_to_client:
                self._out.append(b"0\r\n\r\n")
            self.complete = True
        self._at_boundary = True

    def _finish_message(self) -> None:
        if self.complete:
            return
        if self._chunk_to_client:
            self._out.append(b"0\r\n\r\n")
        self.complete = True
