"""The relayed head of an upstream response llhttp has accepted: which lines go on, and how.

Owns the cut of a response head for the client: hop-by-hop fields, the fields `Connection`
names, `Proxy-*` fields and the origin's X-Egress-Id removed from the raw head, the status line
relayed as `HTTP/1.1 <status> <reason>`, and what the framing needs from the head (whether it has
Content-Length or Transfer-Encoding, the names Connection lists). Reads a head only after strict
llhttp accepted it, so it relies on llhttp's checks of every line and never decides framing
itself. Pure: bytes in, pieces out; never quotes upstream bytes.
"""

from __future__ import annotations

import re

from gateway.memo import BoundedMemo
from gateway.proxy.http1.heads import (
    CLOSE_FIELD,
    FRAMING_FIELDS,
    HOP_BY_HOP,
    NAMED_BY_SHORT_CONNECTION_VALUE,
    NOTHING_NAMED,
    TOKEN_CHARS,
    any_case,
    named_by_connection,
)

# What a field name means to the relay, for the heads read line by line (`_field_role`).
_CONNECTION, _CHUNKED, _DROP, _LENGTH, _EGRESS_ID, _RELAY = range(6)


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
    answer (`should_keep_alive`). A lookahead on the first letter (on `conn` for Connection, so
    that Content-* lines skip the names too) keeps most lines out of the name alternatives;
    `[^:]` and `[^\r]` (one excluded byte) are sre's fast repeats, and the irregular line's test
    is a lookahead that consumes nothing."""
    others = (b"transfer-encoding", b"proxy-", *dropped)
    first_letters = bytes(sorted({name[0] for name in others}))
    return re.compile(
        rb"\r\n(?:(?="
        + any_case(b"conn")
        + rb"|["
        + first_letters
        + first_letters.upper()
        + rb"])(?:"
        + any_case(b"connection")
        + rb": ([^\r]*)|("
        + any_case(b"transfer-encoding")
        + rb"):[^\r]*|("
        + b"|".join(any_case(name) for name in dropped)
        + b"|"
        + any_case(b"proxy-")
        + TOKEN_CHARS
        + rb"*):[^\r]*)|[^:]*+:(?! [^ \t]))"
    )


_HOP_BY_HOP_NAMES = (b"keep-alive", b"te", b"trailer", b"upgrade")
_FIELDS_OF_NOTE = _fields_of_note(_HOP_BY_HOP_NAMES)
# The origin's X-Egress-Id is dropped when the gateway sends its own.
_FIELDS_OF_NOTE_BESIDE_AN_ID = _fields_of_note((*_HOP_BY_HOP_NAMES, b"x-egress-id"))
_CONTENT_LENGTH = re.compile(rb"\r\n" + any_case(b"content-length") + b":")
_HOP_BY_HOP_AND_CLOSE = HOP_BY_HOP | {b"close"}
# Names a Connection field may list for the head to be relayed without another look: Connection
# and Transfer-Encoding are cut already, but naming Transfer-Encoding is refused.
_CUT_AND_NOT_FRAMING = HOP_BY_HOP - FRAMING_FIELDS
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


def read_head(head: bytes, status: int, id_field: bytes, keep_alive: bool) -> tuple[list[bytes], bool, bool, bool]:
    """The relayed head's pieces to the CRLF that ends its last field line (the fields the
    framing adds and the blank line follow), whether it has Content-Length, whether it has
    Transfer-Encoding, whether its Connection fields name a framing field: read from the whole
    head once llhttp accepted it.

    The relayed head is the raw head with the lines of note cut out, each with the CRLF before
    it: one C call gives the kept spans and, after each, the line's Connection value,
    Transfer-Encoding name and dropped name (or None: an irregular line has none)."""
    pieces = (_FIELDS_OF_NOTE_BESIDE_AN_ID if id_field else _FIELDS_OF_NOTE).split(head)
    # The origin's status line is the relayed one when it reads `HTTP/1.1 <3 digits> <reason>`
    # (llhttp has checked the digits and what may follow them: a space or the CRLF).
    status_line_as_sent = head.startswith(b"HTTP/1.1 ") and head[12] == 0x20 and status >= 100
    if len(pieces) == 5 and pieces[1] and status_line_as_sent:
        # Nearly every keep-alive response: one line of note, a Connection field with a value
        # (`keep-alive`) naming only fields that are cut already and never a framing one, and a
        # status line relayed as it is. The steps below, for that head alone.
        named = NAMED_BY_SHORT_CONNECTION_VALUE.get(pieces[1]) or named_by_connection([pieces[1]])
        if named <= _CUT_AND_NOT_FRAMING:
            return [pieces[0], pieces[4][:-2]], keep_alive or _CONTENT_LENGTH.search(head) is not None, False, False
    if len(pieces) == 1:
        kept = pieces
        values: list[bytes] = []
        chunked = irregular = False
    elif len(pieces) == 5:
        # One line of note: read without slicing the list.
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
    names_only_cut = named <= HOP_BY_HOP or (named <= _HOP_BY_HOP_AND_CLOSE and CLOSE_FIELD.search(head) is None)
    if irregular or not names_only_cut:
        line_start, line_end = _status_line_bounds(head)
        fields, has_length, chunked, named = _fields_line_by_line(head, line_end, id_field)
        status_line = _status_line(head, line_start, line_end, status)
        return [status_line, *fields], has_length, chunked, not FRAMING_FIELDS.isdisjoint(named)
    if not status_line_as_sent:
        line_start, line_end = _status_line_bounds(head)
        kept[0] = _status_line(head, line_start, line_end, status) + kept[0][line_end:]
    # llhttp keeps a connection alive only when the body's end is known: with no Transfer-Encoding
    # (strict llhttp refuses it beside Content-Length) that is Content-Length, or a status without
    # a body.
    has_length = not chunked and (keep_alive or _CONTENT_LENGTH.search(head) is not None)
    kept[-1] = kept[-1][:-2]  # the blank line
    return kept, has_length, chunked, not FRAMING_FIELDS.isdisjoint(named)
