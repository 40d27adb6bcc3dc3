"""Upstream response heads cut out of the byte stream on raw bytes, before any parser sees them.

Owns the response-side head caps of plain HTTP forwarding: the bytes and field lines of every
head of one exchange (interim 1xx heads included) are counted as they arrive, in one linear pass
with a bounded buffer, and a head is handed to the parser only once it is whole. A hostile origin
that sends a header line that never ends, hundreds of thousands of fields or an endless reason
phrase is cut at the cap (`too_large`) instead of feeding llhttp a fragment per read (httptools
joins the fragments of one field by concatenation, which is quadratic in the number of reads).
`ResponseFraming.feed` checks a whole final head at the start of an exchange's first read against
the same caps itself (one head: its bytes, its lines) and makes a scanner for every other read.

Pure: bytes in, whole heads out. Never touches a socket, never quotes upstream bytes in an error.
"""

from __future__ import annotations

from gateway.errors import ErrorCode, GatewayError

MAX_RESPONSE_HEAD_BYTES = 64 * 1024
MAX_RESPONSE_HEADERS = 100
# RFC 9110 section 15.2 allows several interim responses; more than a handful is an origin
# trying to keep the exchange alive without answering.
MAX_INTERIM_RESPONSES = 8
HEAD_END = b"\r\n\r\n"


class ResponseHeadScanner:
    """Buffers one response head at a time; the caps hold across every head of the exchange."""

    __slots__ = ("_buffer", "_fields", "_heads", "_scanned", "_total")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of `_buffer` already searched for the end of the head
        self._total = 0  # head bytes of this exchange so far, interim heads included
        self._fields = 0  # field lines of this exchange so far
        self._heads = 0

    def take_head(self, data: bytes) -> tuple[bytes, memoryview] | None:
        """The whole head (with its blank line, as bytes: the framing reads its lines) and a view
        of the bytes after it, or None while incomplete.

        Raises `too_large` as soon as the raw bytes pass a cap, whether or not the head is done."""
        if not self._buffer:
            # The common case, a whole head at the start of a read: no copy into the buffer, and
            # the bytes after it (often the whole body) stay a view of the read.
            # (A bare LF before the CRLF CRLF needs no search here: the buffered path below would
            # cut the same head, and strict llhttp refuses it.)
            end = data.find(HEAD_END)
            if end >= 0:
                head_length = end + len(HEAD_END)
                self._count(head_length, data.count(b"\n", 0, head_length))
                self._complete_head()
                return data[:head_length], memoryview(data)[head_length:]
        buffer = self._buffer
        start = max(0, len(buffer) - 3)  # the terminator may straddle two reads
        buffer += data
        end = buffer.find(HEAD_END, start)
        if end < 0:
            # A bare LF line end (RFC 9112 section 2.2 lets a recipient accept it; llhttp in strict
            # mode refuses it): hand the head over so the parser refuses it now, not at the cap.
            end = buffer.find(b"\n\n", start)
            if end >= 0:
                end -= 2
        if end < 0:
            self._count(len(data), buffer.count(b"\n", self._scanned))
            self._scanned = len(buffer)
            return None
        head_length = end + len(HEAD_END)
        # The status line and the blank line are not fields.
        lines = buffer.count(b"\n", self._scanned, head_length)
        self._count(head_length - (len(buffer) - len(data)), lines)
        whole = bytes(buffer)
        self._buffer = bytearray()
        self._scanned = 0
        self._complete_head()
        return whole[:head_length], memoryview(whole)[head_length:]

    def _complete_head(self) -> None:
        self._heads += 1
        if self._heads > MAX_INTERIM_RESPONSES + 1:
            raise GatewayError(
                ErrorCode.TOO_LARGE, f"the upstream sent more than {MAX_INTERIM_RESPONSES} interim responses"
            )

    def _count(self, new_bytes: int, new_lines: int) -> None:
        self._total += new_bytes
        self._fields += new_lines
        if self._total > MAX_RESPONSE_HEAD_BYTES:
            raise GatewayError(
                ErrorCode.TOO_LARGE, f"the upstream response head exceeds {MAX_RESPONSE_HEAD_BYTES} bytes"
            )
        # Each head's status line and blank line end in a newline too: they are not fields.
        if self._fields > MAX_RESPONSE_HEADERS + 2 * (self._heads + 1):
            raise GatewayError(
                ErrorCode.TOO_LARGE, f"the upstream response head has more than {MAX_RESPONSE_HEADERS} fields"
            )
