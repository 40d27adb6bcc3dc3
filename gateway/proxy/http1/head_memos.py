"""What a listener remembers of the heads it has read, so that repeated heads cost a lookup.

Owns the bounded memos of the HTTP/1.1 head readers (`request_head`, `response_fields`): the
names a short Connection value lists, the relayed status line of a (status, reason), whether a
request field name is never forwarded, and each request field block read. One `HeadMemos`
belongs to a listener (`ProxyServer.head_memos`) and is handed to the framings of its
connections: agents repeat the same few heads across connections, and nothing here is shared
between listeners or kept at module level. Holds answers only; never decides them (the readers
compute each one, and remember only what their rules allow: a block within the caps, say).
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.memo import BoundedMemo
from gateway.proxy.http1.heads import NOTHING_NAMED, named_by_connection

# A Connection value this short is remembered: nearly every keep-alive response and many requests
# carry one of a few (`keep-alive`, `close`), and splitting one costs 7 k instructions.
MAX_REMEMBERED_CONNECTION_VALUE_BYTES = 64
MAX_REMEMBERED_CONNECTION_VALUES = 256
# The relayed status line of each (status, short reason) an origin sends whose own line is not
# already that: formatting bytes parses the format on every call, and origins repeat a handful.
MAX_REMEMBERED_REASON_BYTES = 64
MAX_REMEMBERED_STATUS_LINES = 256
# Whether a request field is never forwarded, per name as sent: lower-casing and classifying
# each name cost more.
MAX_REMEMBERED_REQUEST_FIELD_NAME_BYTES = 64
MAX_REMEMBERED_REQUEST_FIELD_NAMES = 1024
# Each request field block read: an agent repeats its fields from request to request (its Host,
# User-Agent, Accept, credential), and hashing the block costs far less than splitting it.
MAX_REMEMBERED_FIELD_BLOCK_BYTES = 2048
MAX_REMEMBERED_FIELD_BLOCKS = 256


class FieldBlock(NamedTuple):
    """What `request_head.read_field_block` reads from a request's field block (defined here, below
    the reader, because each block read is remembered in `HeadMemos.read_blocks`)."""

    lines: bytes  # the forwarded field lines, each CRLF first
    authorization: bytes | None  # the Proxy-Authorization value
    named: frozenset[bytes]  # the names the Connection field lists, lower-cased
    chunked: bool  # the body is chunked (`Transfer-Encoding: chunked`, the only coding accepted)


class HeadMemos:
    """The head readers' memos of one listener (see the module docstring)."""

    __slots__ = ("connection_values", "dropped_request_fields", "read_blocks", "status_lines")

    def __init__(self) -> None:
        self.connection_values: BoundedMemo[bytes, frozenset[bytes]] = BoundedMemo(MAX_REMEMBERED_CONNECTION_VALUES)
        self.status_lines: BoundedMemo[tuple[int, bytes], bytes] = BoundedMemo(MAX_REMEMBERED_STATUS_LINES)
        self.dropped_request_fields: BoundedMemo[bytes, bool] = BoundedMemo(MAX_REMEMBERED_REQUEST_FIELD_NAMES)
        self.read_blocks: BoundedMemo[bytes, FieldBlock] = BoundedMemo(MAX_REMEMBERED_FIELD_BLOCKS)

    def named_by_connection(self, values: list[bytes]) -> frozenset[bytes]:
        """`heads.named_by_connection`, a single short value's answer remembered."""
        if not values:
            return NOTHING_NAMED
        if len(values) == 1 and len(values[0]) <= MAX_REMEMBERED_CONNECTION_VALUE_BYTES:
            named = self.connection_values.get(values[0])
            return named if named is not None else self.connection_values.put(values[0], named_by_connection(values))
        return named_by_connection(values)
