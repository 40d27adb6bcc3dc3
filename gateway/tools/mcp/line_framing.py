"""Newline-delimited JSON-RPC framing for MCP over stdio, with a bound on a line's length.

Owns the cut of a byte stream into lines and what happens to a line over `max_line_bytes`: it is
discarded up to its newline (the rest of it is never read as a message of its own) and reported
once, with the request id when the line's first bytes name one at the top level, so the client
gets exactly one error for that request. Pure: bytes in, events out; never reads a pipe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

# How much of an oversized line is kept to find its id: ids come first in every client's messages.
ID_SCAN_BYTES = 64 * 1024
# The top-level "id" member before any nested object or array: strings are skipped whole, so an
# "id" inside a string or a deeper object is never taken. Anchored, and each byte has one reading,
# so the match is linear in the (bounded) prefix.
_TOP_LEVEL_ID = re.compile(
    rb'\s*\{(?:[^{}\[\]"]|"(?:[^"\\]|\\.)*")*?"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")\s*[,}]'
)


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line over the bound, discarded; `request_id` if its prefix named one (int or str)."""

    request_id: int | str | None


def request_id_of(prefix: bytes) -> int | str | None:
    match = _TOP_LEVEL_ID.match(prefix)
    if match is None:
        return None
    try:
        value = orjson.loads(match.group(1))
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, int | str) else None


class LineFramer:
    """Feed chunks, get whole lines (without the newline) and `Oversized` events, in order."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buffer = bytearray()
        self._discarding = False

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        events: list[bytes | Oversized] = []
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if not self._discarding:
                if len(self._buffer) + (end - start) > self._max:
                    self._buffer += chunk[start : start + max(0, ID_SCAN_BYTES - len(self._buffer))]
                    events.append(Oversized(request_id_of(bytes(self._buffer[:ID_SCAN_BYTES]))))
                    self._buffer.clear()
                    self._discarding = True
                else:
                    self._buffer += chunk[start:end]
            if newline < 0:
                break
            if not self._discarding:
                events.append(bytes(self._buffer))
            self._buffer.clear()
            self._discarding = False
            start = newline + 1
        return events

    def finish(self) -> list[bytes | Oversized]:
        """At end of input: the last line if it had no newline (and was not over the bound)."""
        line, discarding = bytes(self._buffer), self._discarding
        self._buffer.clear()
        self._discarding = False
        return [line] if line and not discarding else []
