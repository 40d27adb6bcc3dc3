"""A client's request head read from its raw bytes once llhttp accepted it.

Owns what the proxy takes from a whole request head's field block: the request-head caps
counted on the raw bytes (field lines, head bytes), the rules on the fields the proxy acts on
(one `Proxy-Authorization`, a single `Transfer-Encoding: chunked` only, no `Connection` field
naming a framing field), and the end-to-end field lines the upstream head is built from
(hop-by-hop fields, the fields Connection names, `Proxy-*` and `Host` cut out); the rarer request
line forms; the same caps and rules on the fields of a head not whole yet (`HeldFields`); and,
for a head with two faults, which one comes first in the stream (`earlier_fault`), so the
refusal is the one a field-by-field reading gives. One compiled pattern splits the block at the
lines of note in one C-level scan, and each block read is remembered; llhttp calls no Python per
field (`request_framing.py` defines no `on_url` or `on_header`).

Pure: bytes in, values out. Never touches a socket, never quotes the credential in an error.
"""

from __future__ import annotations

import re

import httptools

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.head_memos import (
    MAX_REMEMBERED_FIELD_BLOCK_BYTES,
    MAX_REMEMBERED_REQUEST_FIELD_NAME_BYTES,
    FieldBlock,
    HeadMemos,
)
from gateway.proxy.http1.heads import (
    CLOSE_FIELD,
    FRAMING_FIELDS,
    HOP_BY_HOP,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_URL_BYTES,
    TOKEN_CHARS,
    any_case,
)

# Never forwarded whatever the message says: hop-by-hop (RFC 9110 section 7.6.1), the Host the
# proxy rewrites from the absolute URI; `Proxy-*` (the credential among them) too.
_DROPPED_NAMES = (b"host", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade")
_CUT_NAMES = HOP_BY_HOP | {b"host"}
_CUT_NAMES_AND_CLOSE = _CUT_NAMES | {b"close"}


def _lines_of_note() -> re.Pattern[bytes]:
    """The lines the proxy acts on, found in one C-level scan of a head llhttp has accepted.

    In strict mode llhttp has checked that each line is a token, a colon with nothing before it,
    optional whitespace and a value without CR, LF or NUL, so every CRLF of the head starts a
    field line and a line's name ends at its first colon. A line of note is Connection (group
    `connection_value`), Transfer-Encoding (group `coding`: its value), Proxy-Authorization
    (group `authorization`: its value), a field never forwarded (group `dropped`, empty), or,
    with no group, an irregular line: llhttp reads a value
    without the whitespace after the colon and the upstream head says `name: value`, so a line
    is forwarded as its raw bytes only when one space and no more whitespace follow the colon; a
    head with any other line is read line by line (the check is a lookahead: the CRLF that may
    follow an empty value starts the next line). Values are captured as llhttp reads them:
    without their leading whitespace, with their trailing whitespace. A lookahead on the first
    letter keeps most lines out of the name alternatives."""
    names = (b"connection", b"transfer-encoding", b"proxy-authorization", *_DROPPED_NAMES, b"proxy-")
    first_letters = bytes(sorted({name[0] for name in names}))
    return re.compile(
        rb"\r\n(?:(?=["
        + first_letters
        + first_letters.upper()
        + rb"])(?:"
        + any_case(b"connection")
        + rb":[ \t]*(?P<connection_value>[^\r]*)|"
        + any_case(b"transfer-encoding")
        + rb":[ \t]*(?P<coding>[^\r]*)|"
        + any_case(b"proxy-authorization")
        + rb":[ \t]*(?P<authorization>[^\r]*)|(?:"
        + b"|".join(any_case(name) for name in _DROPPED_NAMES)
        + b"|"
        + any_case(b"proxy-")
        + TOKEN_CHARS
        + rb"*):[^\r]*(?P<dropped>))|[^:]*+:(?=[^ ]| [ \t]))"
    )


_LINES_OF_NOTE = _lines_of_note()
# The groups of `_lines_of_note` the reader acts on: a line of note matches exactly one group
# (`dropped` among them), or none (an irregular line), so a match's `lastgroup` names it.
_CONNECTION_VALUE = "connection_value"
_CODING = "coding"
_AUTHORIZATION = "authorization"
_CONTENT_LENGTH = re.compile(rb"\r\n" + any_case(b"content-length") + rb":[ \t]*([0-9]+)")

TOO_MANY_FIELDS = f"more than {MAX_HEADERS} header fields"
LINE_TOO_LONG = "the request line is too long"
TWO_AUTHORIZATIONS = "two Proxy-Authorization fields"
ONLY_CHUNKED = "only one Transfer-Encoding: chunked is accepted"
CONNECTION_NAMES_FRAMING = "the Connection field names Content-Length or Transfer-Encoding"


def too_large(message: str) -> GatewayError:
    return GatewayError(ErrorCode.TOO_LARGE, message, status=431)


def _learn_dropped(name: bytes, memos: HeadMemos) -> bool:
    lowered = name.lower()
    dropped = lowered in _CUT_NAMES or lowered.startswith(b"proxy-")
    if len(name) <= MAX_REMEMBERED_REQUEST_FIELD_NAME_BYTES:
        memos.dropped_request_fields.put(name, dropped)
    return dropped


def request_fields(head: bytes) -> list[tuple[bytes, bytes]]:
    """Every field of a head llhttp accepted as llhttp reads it, in order: (name, value without
    its leading whitespace)."""
    block = head[head.index(b"\r\n") + 2 : -4]
    if not block:
        return []
    fields = []
    for line in block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        fields.append((name, value.lstrip(b" \t")))
    return fields


def forwarded_lines(fields: list[tuple[bytes, bytes]], named: frozenset[bytes], memos: HeadMemos) -> bytes:
    """The end-to-end field lines of these fields, each as CRLF and `name: value`: hop-by-hop
    fields, `Proxy-*`, `Host` and the fields `named` by Connection (lower-cased) left out. Whether
    a name is left out whatever the message says is remembered in `memos`."""
    parts: list[bytes] = []
    dropped_names = memos.dropped_request_fields
    for name, value in fields:
        dropped = dropped_names.get(name)
        if dropped is None:
            dropped = _learn_dropped(name, memos)
        if dropped or (named and name.lower() in named):
            continue
        parts += (b"\r\n", name, b": ", value)
    return b"".join(parts)


def content_length(head: bytes) -> int:
    """The body length a head llhttp accepted declares (llhttp has checked the digits and that
    there is one Content-Length and no Transfer-Encoding beside it); 0 when it has none."""
    found = _CONTENT_LENGTH.search(head)
    return int(found.group(1)) if found is not None else 0


def request_line(line: bytes) -> tuple[bytes, bytes, bytes]:
    """Method, target and version (b"" for HTTP/0.9) of a request line llhttp accepted with
    more than one space between two of them (it allows several)."""
    words = [word for word in line.split(b" ") if word]
    return words[0], words[1], words[2] if len(words) > 2 else b""


# A head shorter than this cannot hold more than MAX_HEADERS field lines (each at least `a:` and
# its CRLF): its lines need no count.
_FIELD_LINES_COUNTED_FROM = 4 * MAX_HEADERS


class _FieldRules:
    """The rules on the fields the proxy acts on, applied one field at a time in stream order:
    one Proxy-Authorization, and a single `Transfer-Encoding: chunked` only (any other coding
    makes the body length ambiguous between us and the origin: request smuggling)."""

    __slots__ = ("authorization", "chunked")

    def __init__(self) -> None:
        self.authorization = False
        self.chunked = False

    def authorization_field(self) -> None:
        if self.authorization:
            raise GatewayError(ErrorCode.INVALID_INPUT, TWO_AUTHORIZATIONS)
        self.authorization = True

    def coding_field(self, coding: bytes) -> None:
        if self.chunked or coding.strip().lower() != b"chunked":
            raise GatewayError(ErrorCode.INVALID_INPUT, ONLY_CHUNKED)
        self.chunked = True

    def field(self, name: bytes, value: bytes) -> None:
        """A field line read as llhttp reads it; only the two fields of the rules are looked at."""
        lowered = name.lower()
        if lowered == b"proxy-authorization":
            self.authorization_field()
        elif lowered == b"transfer-encoding":
            self.coding_field(value)


def _only_cut_names(named: frozenset[bytes], head: bytes) -> bool:
    """Whether every field the Connection field names is one the pattern cuts already."""
    if named <= _CUT_NAMES:
        return True
    if named <= _CUT_NAMES_AND_CLOSE:
        return CLOSE_FIELD.search(head) is None
    return all(name in _CUT_NAMES or name.startswith(b"proxy-") for name in named)


def read_field_block(block: bytes, head_bytes: int, memos: HeadMemos) -> FieldBlock:
    """The forwarded field lines (each CRLF first), the Proxy-Authorization value, the names the
    Connection field lists and whether the body is chunked, read from the field block of a head
    llhttp accepted (after the request line's CRLF, to the blank line; `head_bytes` of the head
    counted, with any empty lines before it). Remembered per block as sent in `memos`: only
    blocks within the caps and the rules are, so a remembered block needs no check but the head's
    own size.

    Raises `too_large` (431) for a head over a cap, whatever else it holds; then
    `invalid_input` for the first line of note that breaks a rule, then for a Connection field
    naming a framing field. (The target's cap is the caller's: it is not in the block.)"""
    read = memos.read_blocks.get(block)
    if read is None:
        read = _read_field_block(b"\r\n" + block, head_bytes, memos)
        if len(block) <= MAX_REMEMBERED_FIELD_BLOCK_BYTES:
            memos.read_blocks.put(block, read)
    elif head_bytes > MAX_HEAD_BYTES:
        raise too_large("the request head is too large")
    return read


def _read_field_block(block: bytes, head_bytes: int, memos: HeadMemos) -> FieldBlock:
    """`read_field_block`'s reading of a block not remembered, with the CRLF that ends the
    request line before it: the field-line and head caps, the rules, the forwarded lines."""
    # The request line and the blank line end in a newline too: they are not fields.
    too_many = len(block) > _FIELD_LINES_COUNTED_FROM and block.count(b"\n") - 2 > MAX_HEADERS
    if too_many or head_bytes > MAX_HEAD_BYTES:
        # Over a cap: the first fault in stream order is the one refused (a broken field before
        # the cap's line is), as when each field was checked as it ended.
        fault = _first_field_fault(block, 2, head_bytes - len(block))
        if fault is not None:
            raise fault[1]
        raise too_large(TOO_MANY_FIELDS if too_many else "the request head is too large")
    # The rules are applied to the lines of note in the order they came: the first broken one is
    # the one refused, whatever else the block holds.
    rules = _FieldRules()
    authorization: bytes | None = None
    values: list[bytes] = []
    kept: list[bytes] = []
    irregular = False
    start = 0
    for line in _LINES_OF_NOTE.finditer(block):
        kept.append(block[start : line.start()])
        start = line.end()
        role = line.lastgroup
        if role == _CONNECTION_VALUE:
            values.append(line[_CONNECTION_VALUE])
        elif role == _CODING:
            rules.coding_field(line[_CODING])
        elif role == _AUTHORIZATION:
            rules.authorization_field()
            authorization = line[_AUTHORIZATION]
        elif role is None:
            irregular = True
    kept.append(block[start:])
    named = memos.named_by_connection(values)
    if named and not named.isdisjoint(FRAMING_FIELDS):
        # Framing fields are never hop-by-hop: stripping them after they framed the body would
        # have the origin read the body as a second request (smuggling).
        raise GatewayError(ErrorCode.INVALID_INPUT, CONNECTION_NAMES_FRAMING)
    if irregular or (named and not _only_cut_names(named, block)):
        lines = forwarded_lines(request_fields(block), named, memos)
    else:
        lines = b"".join(kept)[:-4]  # without the blank line
    return FieldBlock(lines, authorization, named, rules.chunked)


class _Probe:
    """A parser protocol with no callbacks: llhttp's verdict on some bytes, nothing else."""


def _accepted(prefix: bytes) -> bool:
    """Whether llhttp accepts these bytes as the start of a request (a fresh parser's verdict)."""
    try:
        httptools.HttpRequestParser(_Probe()).feed_data(prefix)
    except httptools.HttpParserUpgrade:
        return True
    except httptools.HttpParserError:
        return False
    return True


def _first_fault(head: bytes, head_bytes: int) -> tuple[int, GatewayError] | None:
    """The first of the proxy's own faults in a head (whole or not) in stream order, and the bytes
    llhttp must have accepted for it to be the one refused: the target's cap once the target
    ends; a field's caps and rules once the next line's name ends (or the head does)."""
    line_end = head.find(b"\r\n")
    line = head if line_end < 0 else head[:line_end]
    method_end = line.find(b" ")
    if method_end >= 0:
        target_start = method_end + 1
        while line[target_start : target_start + 1] == b" ":
            target_start += 1
        target_end = line.find(b" ", target_start)
        target_end = len(line) if target_end < 0 else target_end
        if target_end - target_start > MAX_URL_BYTES:
            return target_end, too_large(LINE_TOO_LONG)
    if line_end < 0:
        return None
    return _first_field_fault(head, line_end + 2, head_bytes - len(head))


def _first_field_fault(head: bytes, position: int, before: int) -> tuple[int, GatewayError] | None:
    """`_first_fault` among the field lines from `position` on (`before`: the bytes counted
    before the head, its empty lines)."""
    rules = _FieldRules()
    index = 0
    while (field_end := head.find(b"\r\n", position)) > position:
        error: GatewayError | None = None
        if index >= MAX_HEADERS:
            error = too_large(TOO_MANY_FIELDS)
        elif before + field_end + 2 > MAX_HEAD_BYTES:
            error = too_large("the request head is too large")
        else:
            name, _, value = head[position:field_end].partition(b":")
            try:
                rules.field(name, value)
            except GatewayError as broken:
                error = broken
        if error is not None:
            # httptools hands a field over as the next line's name ends (or the head does).
            following = field_end + 2
            if head.startswith(b"\r\n", following):
                return following + 2, error
            colon = head.find(b":", following)
            return (len(head) if colon < 0 else colon), error
        position = field_end + 2
        index += 1
    return None


def earlier_fault(head: bytes, head_bytes: int) -> GatewayError | None:
    """For a head llhttp refused: the proxy's own fault in it, when that fault comes first in
    the stream (llhttp accepts the bytes up to it), as when every field was checked as it
    ended; None when llhttp's refusal is the first."""
    fault = _first_fault(head, head_bytes)
    if fault is None:
        return None
    stop, error = fault
    return error if _accepted(head[:stop]) else None


class HeldFields:
    """The caps and rules on the fields of a head not whole yet, each field checked once the next
    line's name has begun (as httptools handed fields over one by one), so a broken field is
    refused before the client ends its head, and no field is read twice."""

    __slots__ = ("_count", "_next", "_rules")

    def __init__(self, start: int) -> None:
        self._next = start  # where the first field line not checked yet starts
        self._count = 0
        self._rules = _FieldRules()

    def check(self, held: bytearray) -> None:
        last = held.rfind(b"\r\n")
        if last < self._next:
            return
        after = last + 2
        if after >= len(held) or held[after] == 0x0D:
            # The last field's next line has not begun: that field is not handed over yet.
            last = held.rfind(b"\r\n", self._next, last)
            if last < 0:
                return
        for line in bytes(held[self._next : last]).split(b"\r\n"):
            if self._count >= MAX_HEADERS:
                raise too_large(TOO_MANY_FIELDS)
            self._count += 1
            name, _, value = line.partition(b":")
            self._rules.field(name, value)
        self._next = last + 2
