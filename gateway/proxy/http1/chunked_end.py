"""Where a chunked request body ends in the client's byte stream, and how large its trailers are.

Owns one question about a chunked body (RFC 9112 section 7.1): at which byte of a read does it
end? llhttp decodes the body and is the judge of its framing; it reports the end but not where in
the read it fell, and a request pipelined behind a chunked one in the same read must be cut out
as a head of its own before llhttp sees it (`request_framing.py` reads heads from their raw
bytes). This follows the framing llhttp accepts in strict mode (hex size digits, then a chunk
extension or nothing, CRLF, the data, CRLF; after the last chunk, trailer lines and a blank line,
none of them with a bare CR) on raw bytes, a Python step per chunk and per trailer line, never
per byte; on framing llhttp refuses it may answer anything, as llhttp refuses those bytes before
the answer is used. It also counts the trailer section's bytes for its cap.

Pure: bytes in, an offset out. Never decodes or keeps body bytes.
"""

from __future__ import annotations

_SIZE, _TRAILER_LINE_START, _TRAILER_LINE, _END, _LOST = range(5)
# More significant hex digits than a 64-bit size has: llhttp refuses the size as an overflow.
_MAX_SIZE_DIGITS = 17


class ChunkedBodyEnd:
    """Follows one chunked body from its first size line to the end of its trailer section."""

    __slots__ = ("_digits", "_in_extension", "_skip", "_state", "trailer_bytes")

    def __init__(self) -> None:
        self._state = _SIZE
        self._skip = 0  # bytes to pass over before the state applies (data, CRLFs)
        self._digits = b""  # the size line's significant digits so far
        self._in_extension = False
        self.trailer_bytes = 0

    # One state machine in one loop: its states are few and each step reads as the grammar does.
    def end_in(self, data: bytes) -> int:  # noqa: PLR0912
        """The offset in `data` just past the body's blank line, or -1 when it ends later."""
        position = 0
        length = len(data)
        while True:
            if self._skip:
                step = min(self._skip, length - position)
                position += step
                self._skip -= step
                if self._skip:
                    return -1
            state = self._state
            if state == _END:
                return position
            if position >= length or state == _LOST:
                return -1
            if state == _SIZE:
                line_end = data.find(b"\r", position)
                stop = length if line_end < 0 else line_end
                if not self._in_extension:
                    extension = data.find(b";", position, stop)
                    if extension >= 0:
                        self._in_extension = True
                    digits_end = stop if extension < 0 else extension
                    self._digits = (self._digits + data[position:digits_end]).lstrip(b"0")[:_MAX_SIZE_DIGITS]
                if line_end < 0:
                    return -1
                try:
                    size = int(self._digits, 16) if self._digits else 0
                except ValueError:
                    # Not hex: llhttp refuses the line among the bytes it is fed now.
                    self._state = _LOST
                    return -1
                self._digits = b""
                self._in_extension = False
                position = line_end
                if size:
                    self._skip = 2 + size + 2  # the size line's CRLF, the data, its CRLF
                else:
                    self._skip = 2
                    self._state = _TRAILER_LINE_START
            elif state == _TRAILER_LINE_START:
                if data[position] == 0x0D:
                    self._skip = 2  # the blank line that ends the trailer section
                    self._state = _END
                else:
                    self._state = _TRAILER_LINE
            else:
                line_end = data.find(b"\r", position)
                if line_end < 0:
                    self.trailer_bytes += length - position
                    return -1
                self.trailer_bytes += line_end + 2 - position
                position = line_end
                self._skip = 2
                self._state = _TRAILER_LINE_START
