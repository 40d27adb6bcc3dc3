"""One upstream HTTP/1.1 response re-framed for the client, without I/O: bytes in, client bytes out.

Owns the response half of plain HTTP forwarding as a state object in the style of h11: heads cut
out of the stream on raw bytes under the response-head caps (`response_head.py`), validated and
framed by llhttp (httptools, strict) with no Python call per field, hop-by-hop fields and the
fields `Connection` names cut out of the raw head once llhttp accepted it (`response_fields.py`;
a whole final head at the start of a read goes to llhttp with its body in one call), the body
re-framed (the client gets `Content-Length` as sent, or chunked whatever the upstream used, or a
close-delimited body for an HTTP/1.0 client), interim responses relayed to HTTP/1.1 clients only,
and the facts the connection owner acts on: whether the final head went out, whether the response
is complete, whether the upstream connection may be reused, whether the client must be closed.

Every way an origin can lie about framing ends in a `GatewayError` from `feed` (never a parser
exception): a malformed head or body (a control byte in the reason phrase too, which llhttp
lets through: `response_fields.py`), an unsolicited 101, a `Connection` field naming a framing
field, a cap passed. Bytes after the complete response are never relayed; they only make the
connection unusable. Never touches a socket or a timer; never quotes upstream bytes in a message.
"""

from __future__ import annotations

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.response_fields import MALFORMED, BodyEnd, read_head
from gateway.proxy.http1.response_head import (
    HEAD_END,
    MAX_RESPONSE_HEAD_BYTES,
    MAX_RESPONSE_HEADERS,
    ResponseHeadScanner,
)

NO_BODY_STATUSES = frozenset({204, 304})
_LENGTH_END, _CLOSE_END = BodyEnd.LENGTH, BodyEnd.CLOSE
# The first digit of the status code after `HTTP/1.1 `: above `1`, the head is a final one.
_STATUS_CLASS_AT = len(b"HTTP/1.1 ")
_INTERIM_CLASS = ord("1")


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
        "_memos",
        "_out",
        "_parser",
        "_progress",
        "_scanner",
        "_stalled",
        "_streaming",
        "body_bytes",
        "close_client",
        "complete",
        "eof_body",
        "head_sent",
        "reusable",
        "status",
    )

    def __init__(
        self, memos: HeadMemos, *, head_only: bool, client_http10: bool, close_client: bool, id_field: bytes = b""
    ) -> None:
        # The listener's memos of the heads it has read (`head_memos`).
        self._memos = memos
        self._parser = httptools.HttpResponseParser(self)
        # A fresh parser is where one that ended a response is: expecting the next one.
        self._at_boundary = True
        self.reusable = True
        self.next_response(
            head_only=head_only, client_http10=client_http10, close_client=close_client, id_field=id_field
        )

    def next_response(
        self, *, head_only: bool, client_http10: bool, close_client: bool, id_field: bytes = b""
    ) -> ResponseFraming:
        """The framing of the next response on the same upstream connection: this object again,
        keeping its parser, when the last response ended where llhttp expects the next one
        (building a parser and its callbacks costs about a third of a small response's framing);
        a new one when it did not (a HEAD response leaves llhttp waiting for a body that never
        comes) or the connection's framing is lost. (`__init__` starts the first response here.)"""
        if not (self._at_boundary and self.reusable):
            return ResponseFraming(
                self._memos,
                head_only=head_only,
                client_http10=client_http10,
                close_client=close_client,
                id_field=id_field,
            )
        self._head_only = head_only
        # `X-Egress-Id: <conn>\r\n` for the final head (the origin's own field of that name is dropped).
        self._id_field = id_field
        self._client_http10 = client_http10
        # An HTTP/1.0 client, or one that asked to close, is told so in the final response head.
        self.close_client = close_client
        # Until the final head has been parsed, heads are cut out of the stream on raw bytes
        # (caps counted before llhttp sees a fragment); then the body is streaming. The scanner
        # is made for an exchange whose first read is not a whole final head (`feed`).
        self._scanner: ResponseHeadScanner | None = None
        self._streaming = False
        self._out: list[bytes] = []
        # The whole head llhttp is parsing (`on_headers_complete` reads its lines).
        self._head = b""
        self._chunk_to_client = False
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
        return self

    # the owner's interface ----------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        """Upstream bytes; returns the bytes owed to the client so far (`take_output`). Raises
        GatewayError when the response cannot be relayed as framed; what was owed before the
        failure stays for `take_output`."""
        if self.complete:
            self.reusable = False  # bytes nobody asked for: the connection's framing is lost
            return b""
        try:
            parser = self._parser
            if self._streaming:
                progress = self._progress
                parser.feed_data(data)
                after_head = len(data)
            else:
                head_length = data.find(HEAD_END) + len(HEAD_END) if self._scanner is None else 0
                if (
                    len(HEAD_END) <= head_length <= MAX_RESPONSE_HEAD_BYTES
                    and data.startswith(b"HTTP/1.1 ")
                    and data[_STATUS_CLASS_AT] > _INTERIM_CLASS
                    and data.count(b"\n", 0, head_length) <= MAX_RESPONSE_HEADERS + 2
                ):
                    # The common case, inline: the exchange's first read starts with a whole final
                    # head (its status is not 1xx, so no other head follows) within the scanner's
                    # caps for one head, so llhttp takes the whole read in one call.
                    self._head = data[:head_length]
                    progress = self._progress
                    parser.feed_data(data)
                    after_head = len(data) - head_length
                else:
                    rest = self._take_heads(data)
                    progress = self._progress
                    if rest:
                        parser.feed_data(rest)
                    after_head = len(rest)
            if after_head:
                if self.complete or self._progress != progress:
                    self._stalled = 0
                else:
                    self._count_stalled(after_head)
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

    def _count_stalled(self, length: int) -> None:
        # A read with no body byte in it: chunk framing or a trailer section, which llhttp reads
        # without a callback and without end: bound it.
        self._stalled += length
        if self._stalled > MAX_RESPONSE_HEAD_BYTES:
            raise GatewayError(
                ErrorCode.TOO_LARGE, f"the upstream's chunk framing or trailers exceed {MAX_RESPONSE_HEAD_BYTES} bytes"
            )

    def _take_heads(self, data: bytes) -> bytes | memoryview:
        """Feed llhttp each head that is whole, cut out by the scanner; returns the bytes after the
        final head (the body so far), or nothing while the final head is incomplete."""
        scanner = self._scanner
        if scanner is None:
            scanner = self._scanner = ResponseHeadScanner()
        rest: bytes | memoryview = data
        while not self._streaming:
            taken = scanner.take_head(rest if isinstance(rest, bytes) else rest.tobytes())
            if taken is None:
                return b""
            head, rest = taken
            self._head = head
            self._parser.feed_data(head)
            if not rest:
                break
        return rest

    def take_output(self) -> bytes:
        """The bytes owed to the client so far (head and body coalesced into one write)."""
        out = self._out
        output = b"".join(out)  # one piece is returned as it is, no piece as b""
        out.clear()
        return output

    def end_of_stream(self) -> bool:
        """The upstream closed: True when that completes a close-delimited body."""
        self.reusable = False
        if self.eof_body and self.head_sent and not self.complete:
            # The close ends the body as llhttp's end of a message does (the parser is not kept:
            # the connection is not reusable).
            self.on_message_complete()
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
        keep_alive = parser.should_keep_alive()
        if status == 101:
            # The gateway never forwards Upgrade, so a switch is unsolicited: relaying it would
            # hand the client a stream the proxy no longer frames.
            self._failure = GatewayError(ErrorCode.CONNECT_FAILURE, "the upstream switched protocols unasked (101)")
            raise _StopParsing
        try:
            pieces, body_end = read_head(self._head, status, self._id_field, keep_alive, self._memos)
        except GatewayError as unframeable:
            self._failure = unframeable
            raise _StopParsing from None
        # The head's pieces go straight into the output: one join for head and body.
        out = self._out
        if status < 200:
            # RFC 9110 section 15.2: no interim response to an HTTP/1.0 client.
            if not self._client_http10:
                out += pieces
                if not keep_alive:
                    self.reusable = False
                out.append(b"\r\n")
            return
        self._streaming = True  # the body follows; trailers, if any, are dropped
        out += pieces
        if not keep_alive:
            self.reusable = False
        self._chunk_to_client = False
        if body_end is not _LENGTH_END and not self._head_only and status not in NO_BODY_STATUSES:
            self.eof_body = body_end is _CLOSE_END
            if self._client_http10:
                self.close_client = True
            else:
                # Re-frame: the client gets a chunked body whatever the upstream used.
                self._chunk_to_client = True
                out.append(b"Transfer-Encoding: chunked\r\n")
        if self._id_field:
            out.append(self._id_field)
        if self.close_client:
            out.append(b"Connection: close\r\n")
        out.append(b"\r\n")
        self.head_sent = True
        self.status = status
        if self._head_only:
            # No body follows a HEAD response whatever its Content-Length says.
            self.complete = True

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
        if not self._streaming:
            return  # an interim response; the final one follows on the same parser
        self._at_boundary = True
        if self.complete:
            return  # a HEAD response, complete at its head
        if self._chunk_to_client:
            self._out.append(b"0\r\n\r\n")
        self.complete = True
