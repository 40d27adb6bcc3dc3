"""What every audit line starts with and what a client connection puts on each of its lines.

Owns the line start (`{"time":…,"schema":N,`, the RFC 3339 UTC timestamp with its seconds part
formatted once per second), the schema version, connection ids (unique across gateway processes:
a random tag per process and a counter) and a connection's `conn`, `client_ip` and `client_port`,
serialized once per connection (`ConnectionFields`) as the end of every line it writes.

Never writes a line (audit.py does) and never reads a clock but the one it is handed or
`time.time()`.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.observe.audit_members import ConnectionFields, json_members

SCHEMA_VERSION = 1


class _Clock:
    """RFC 3339 UTC timestamps; the seconds part is formatted once per second."""

    # `start` (the current second as a float) and `line_format` (`{"time":"…","schema":N,` but
    # the microseconds) are read by `AuditLog.write_line`, the start of every line, without a call.
    __slots__ = ("_text", "_time_format", "line_format", "second", "start")

    def __init__(self) -> None:
        self.second = -1
        self.start = -2.0
        self._text = ""
        self.line_format = b""
        self._time_format = ""

    def tick(self, second: int) -> None:
        self.second = second
        self.start = float(second)
        self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        # Everything a line starts with but the microseconds, as one bytes format: one
        # substitution per line instead of three.
        self.line_format = b'{"time":"%s.%%06dZ","schema":%d,' % (self._text.encode("ascii"), SCHEMA_VERSION)
        self._time_format = self._text + ".%06dZ"

    def timestamp(self, now: float) -> str:
        second = int(now)
        if second != self.second:
            self.tick(second)
        return self._time_format % int((now - second) * 1_000_000)


CLOCK = _Clock()
_PROCESS_TAG = os.urandom(4).hex()
_SEQUENCE = itertools.count(1)


def utc_timestamp(now: float | None = None) -> str:
    return CLOCK.timestamp(time.time() if now is None else now)


def client_fields(peer: object) -> dict[str, Any]:
    """`client_ip` and `client_port` from a transport's `peername` (absent when unknown)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return {"client_ip": str(peer[0]), "client_port": int(peer[1])}
    return {}


def connection_fields(peer: object) -> ConnectionFields:
    """A new client connection's audit fields: its `conn` id, then `client_fields(peer)`, with
    their members serialized for every line of the connection."""
    conn = f"{_PROCESS_TAG}-{next(_SEQUENCE):x}"  # `new_connection_id()` without its call
    if isinstance(peer, tuple) and len(peer) >= 2:
        fields = ConnectionFields(conn=conn, client_ip=str(peer[0]), client_port=int(peer[1]))
    else:
        fields = ConnectionFields(conn=conn)
    # orjson serializes the dict subclass as the dict it is; its opening brace becomes the comma.
    fields.line_end = b"," + orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE)[1:]
    return fields


def connection_fields_with(fields: ConnectionFields, **extra: Any) -> ConnectionFields:
    """A connection's fields with more members after the client's (the transparent listener's
    `original_dst`), serialized again: a `ConnectionFields` is never changed in place."""
    extended = ConnectionFields(fields, **extra)
    extended.line_end = b"," + orjson.dumps(extended, option=orjson.OPT_APPEND_NEWLINE)[1:]
    return extended


def client_line_end(client: Mapping[str, Any] | None, *, drop_none: bool) -> bytes:
    """What a proxy line ends with: the connection's audit fields as members with a leading comma
    (none for no fields), the closing brace and the newline: the bytes `ConnectionFields` keeps,
    for the callers whose fields are a plain dict. A close line leaves a None out (`drop_none`),
    an allow line writes it as null, as the lines built from a dict do."""
    if type(client) is ConnectionFields:
        return client.line_end
    if client and drop_none and None in client.values():
        client = {key: value for key, value in client.items() if value is not None}
    return b"," + json_members(client) + b"}\n" if client else b"}\n"


def new_connection_id() -> str:
    """An id unique across gateway processes (random per process) and cheap (a counter)."""
    return f"{_PROCESS_TAG}-{next(_SEQUENCE):x}"
