"""A small HTTP/1.1 response reader for raw sockets: what the proxy tests read responses with.

httpx and curl hide interim responses, pipelining order and the exact framing; the proxy tests
need to see them. `ResponseReader` reads responses (interim ones included) one at a time from a
socket, each within a deadline; `parse_one` and `parse_chunked` are its pure parts. Test-only:
strict about what the gateway must send (HTTP/1.1 status lines, framed bodies, no trailers).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

IO_TIMEOUT_S = 15.0  # generous: other processes run benchmarks on this machine


@dataclass
class RawResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


def parse_chunked(buf: bytes, start: int) -> tuple[bytes, int] | None:
    """A chunked body from `buf[start:]`: (body, end offset), or None while incomplete."""
    body = bytearray()
    pos = start
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(buf[pos:line_end].split(b";")[0], 16)
        pos = line_end + 2
        if size == 0:
            # No trailers expected from the gateway: the terminating CRLF follows at once.
            if len(buf) < pos + 2:
                return None
            assert buf[pos : pos + 2] == b"\r\n", "trailers or garbage after the last chunk"
            return bytes(body), pos + 2
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos : pos + size]
        assert buf[pos + size : pos + size + 2] == b"\r\n", "chunk not followed by CRLF"
        pos += size + 2


def parse_one(buf: bytes, *, head_only: bool = False) -> tuple[RawResponse, int] | None:
    """The first complete response in `buf` and the bytes it used, or None while incomplete."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    lines = buf[:head_end].decode("latin-1").split("\r\n")
    version, status_text, *rest = lines[0].split(" ", 2)
    assert version == "HTTP/1.1", lines[0]
    status = int(status_text)
    headers = [(name.strip(), value.strip()) for name, _, value in (line.partition(":") for line in lines[1:])]
    response = RawResponse(status, rest[0] if rest else "", headers, b"")
    body_start = head_end + 4
    if 100 <= status < 200 or status in (204, 304) or head_only:
        return response, body_start
    if (response.header("Transfer-Encoding") or "").lower() == "chunked":
        parsed = parse_chunked(buf, body_start)
        if parsed is None:
            return None
        response.body, end = parsed
        return response, end
    length = response.header("Content-Length")
    assert length is not None, f"a response without framing: {lines!r}"
    end = body_start + int(length)
    if len(buf) < end:
        return None
    response.body = buf[body_start:end]
    return response, end


class ResponseReader:
    """Reads responses, interim ones included, one at a time from a socket, each within a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.eof = False

    def next(self, timeout_s: float = IO_TIMEOUT_S) -> RawResponse:
        deadline = time.monotonic() + timeout_s
        while True:
            parsed = parse_one(self.buffer)
            if parsed is not None:
                response, used = parsed
                self.buffer = self.buffer[used:]
                return response
            if self.eof:
                raise AssertionError(f"the connection closed mid-response: {self.buffer!r}")
            self._fill(deadline)

    def finals(self, count: int, timeout_s: float = IO_TIMEOUT_S) -> list[RawResponse]:
        """The next `count` responses, failing on any interim (1xx) one."""
        responses = [self.next(timeout_s) for _ in range(count)]
        assert all(r.status >= 200 for r in responses), [r.status for r in responses]
        return responses

    def wait_closed(self, timeout_s: float = IO_TIMEOUT_S) -> bytes:
        """Everything that arrives until the peer closes (bounded); returns the unparsed rest."""
        deadline = time.monotonic() + timeout_s
        while not self.eof:
            self._fill(deadline)
        return self.buffer

    def nothing_within(self, wait_s: float) -> bool:
        """True when no byte arrives (and the peer does not close) within `wait_s`."""
        self.sock.settimeout(wait_s)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return True
        self.buffer += chunk
        self.eof = not chunk
        return False

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no complete response before the deadline: {self.buffer!r}")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"no complete response before the deadline: {self.buffer!r}") from None
        if not chunk:
            self.eof = True
        self.buffer += chunk
