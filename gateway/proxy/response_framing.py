"""One upstream HTTP/1.1 response re-framed for the client, without I/O: bytes in, client bytes out.

Owns the response half of plain HTTP forwarding as a state object in the style of h11: heads cut
out of the stream on raw bytes under the response-head caps (`response_head.py`), parsed by llhttp
(httptools, strict), hop-by-hop fields and the fields `Connection` names removed, the body
re-framed (the client gets `Content-Length` as sent, or chunked whatever the upstream used, or a
close-delimited body for an HTTP/1.0 client), interim responses relayed to HTTP/1.1 clients only,
and the facts the connection owner acts on: whether the final head went out, whether the response
is complete, whether the upstream connection may be reused, whether the client must be closed.

Every way an origin can lie about framing ends in a `GatewayError` from `feed` (never a parser
exception): a malformed head or body, an unsolicited 101, a `Connection` field naming a framing
field, a cap passed. Bytes after the complete response are never relayed; they only make the
connection unusable. Never touches a socket or a timer; never quotes upstream bytes in a message.
"""

from __future__ import annotations

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.memo import BoundedMemo
from gateway.proxy.heads import (
    FRAMING_FIELDS,
    HOP_BY_HOP,
    NAMED_BY_SHORT_CONNECTION_VALUE,
    NOTHING_NAMED,
    FieldRoles,
    named_by_connection,
)
from gateway.proxy.response_head import MAX_RESPONSE_HEAD_BYTES, ResponseHeadScanner

NO_BODY_STATUSES = frozenset({204, 304})
MALFORMED = "the upstream response is malformed"

# What a field name means to the relay, remembered per name an origin sends (`FieldRoles`).
_RELAY, _LENGTH, _CHUNKED, _CONNECTION, _DROP, _EGRESS_ID = range(6)  # the first two are relayed
# The relayed status line of each (status, short reason) an origin sends: formatting bytes parses
# the format on every call, and origins repeat a handful (`200 OK`).
MAX_REMEMBERED_REASON_BYTES = 64
MAX_REMEMBERED_STATUS_LINES = 256
_STATUS_LINES: BoundedMemo[tuple[int, bytes], bytes] = BoundedMemo(MAX_REMEMBERED_STATUS_LINES)


def _field_role(name: bytes) -> int:
    lowered = name.lower()
    if lowered == b"content-length":
        return _LENGTH
    if lowered == b"transfer-encoding":
        return _CHUNKED
    if lowered == b"connection":
        return _CONNECTION
    if lowered == b"x-egress-id":
        return _EGRESS_ID  # dropped when the gateway sends its own
    if lowered in HOP_BY_HOP or lowered.startswith(b"proxy-"):
        return _DROP
    return _RELAY


_FIELD_ROLES = FieldRoles(_field_role)


def _status_line(status: int, reason: bytes) -> bytes:
    line = b"HTTP/1.1 %d %b\r\n" % (status, reason)
    if len(reason) <= MAX_REMEMBERED_REASON_BYTES:
        _STATUS_LINES.put((status, reason), line)
    return line


def _without_named(lines: list[bytes], named: frozenset[bytes]) -> list[bytes]:
    """`lines` (name, ": ", value, CRLF, ...) without the fields a Connection field names."""
    kept: list[bytes] = []
    for start in range(0, len(lines), 4):
        if lines[start].lower() not in named:
            kept += lines[start : start + 4]
    return kept


class _StopParsing(Exception):
    """Raised inside an httptools callback to stop the parser; the reason is on the framing."""


class ResponseFraming:
    """The response to one request: feed upstream bytes, take the bytes owed to the client."""

    __slots__ = (
        "_at_boundary",
        "_chunk_to_client",
        "_client_http10",
        "_connection_values",
        "_failure",
        "_has_length",
        "_head_only",
        "_id_field",
        "_lines",
        "_out",
        "_parser",
        "_progress",
        "_reason",
        "_scanner",
        "_stalled",
        "_status",
        "_streaming",
        "_upstream_chunked",
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
        # of a head, which `on_message_begin` and `on_headers_complete` set before it is read.
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
        # The head being parsed: its relayed field lines (name, ": ", value, CRLF, ...), its
        # Connection values, and whether it framed its body.
        self._lines: list[bytes] = []
        self._connection_values: list[bytes] = []
        self._has_length = False
        self._upstream_chunked = False
        self._chunk_to_client = False
        self._reason = b""
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
                parser.feed_data(head)
                if not rest:
                    break
            if rest:
                progress = self._progress
                parser.feed_data(rest)
                if self._progress != progress or self.complete:
                    self._stalled = 0
                else:
                    # A read with no body byte in it: chunk framing or a trailer section. llhttp
                    # buffers neither, but httptools joins a trailer field's fragments
                    # quadratically: bound it.
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

    # parsing ------------------------------------------------------------------------------------
    # httptools callbacks ------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:
            raise _StopParsing  # a second response nobody asked for: never parsed, never relayed
        self._lines = []
        self._connection_values = []
        self._has_length = False
        self._upstream_chunked = False
        self._reason = b""

    def on_status(self, status: bytes) -> None:
        self._reason += status  # one call per head: the scanner feeds each head whole

    def on_header(self, name: bytes, value: bytes) -> None:
        # One pass: framing facts noted, hop-by-hop and Proxy-* fields dropped, the rest kept as
        # wire lines.
        if self._streaming:
            return  # a trailer field: never merged into the head the client already has
        role = _FIELD_ROLES.get(name)
        if role is None:
            role = _FIELD_ROLES.learn(name)
        if role <= _LENGTH or (role == _EGRESS_ID and not self._id_field):  # relayed
            self._lines += (name, b": ", value, b"\r\n")
            if role == _LENGTH:
                self._has_length = True
        elif role == _CONNECTION:
            self._connection_values.append(value)
        elif role == _CHUNKED:
            self._upstream_chunked = True

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        self._status = status
        values = self._connection_values
        # `named_by_connection`'s remembered answer first, inline: nearly every response has one
        # short Connection value (`keep-alive`).
        named = (
            (len(values) == 1 and NAMED_BY_SHORT_CONNECTION_VALUE.get(values[0])) or named_by_connection(values)
            if values
            else NOTHING_NAMED
        )
        if status == 101 or (named and not FRAMING_FIELDS.isdisjoint(named)):
            self._refuse_unframeable(status, named)
        informational = status < 200
        if not informational:
            self._streaming = True  # the body follows; trailers, if any, are dropped
        elif self._client_http10:
            return  # RFC 9110 section 15.2: no interim response to an HTTP/1.0 client
        reason = self._reason
        # The head's pieces go straight into the output: one join for head and body.
        kept = self._out
        kept.append(_STATUS_LINES.get((status, reason)) or _status_line(status, reason))
        # The fields a Connection field names are hop-by-hop too (RFC 9110 section 7.6.1).
        kept += self._lines if named <= HOP_BY_HOP else _without_named(self._lines, named)
        if not parser.should_keep_alive():
            self.reusable = False
        bodiless = informational or self._head_only or status in NO_BODY_STATUSES
        self._chunk_to_client = False
        if not bodiless and not self._has_length:
            self.eof_body = not self._upstream_chunked
            if self._client_http10:
                self.close_client = True
            else:
                # Re-frame: the client gets a chunked body whatever the upstream used.
                self._chunk_to_client = True
                kept.append(b"Transfer-Encoding: chunked\r\n")
        if not informational and self._id_field:
            kept.append(self._id_field)
        if self.close_client and not informational:
            kept.append(b"Connection: close\r\n")
        kept.append(b"\r\n")
        if not informational:
            self.head_sent = True
            self.status = status
            if self._head_only:
                # No body follows a HEAD response whatever its Content-Length says.
                self.complete = True

    def _refuse_unframeable(self, status: int, named: frozenset[bytes]) -> None:
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
