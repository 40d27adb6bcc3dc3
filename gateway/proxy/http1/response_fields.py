"""The relayed head of an upstream response llhttp has accepted: which lines go on, and how.

Owns the cut of a response head for the client: hop-by-hop fields, the fields `Connection`
names, `Proxy-*` fields and the origin's X-Egress-Id removed from the raw head, the status line
relayed as `HTTP/1.1 <status> <reason>`, and what the framing needs from the head: how its body
ends (`BodyEnd`). Reads a head only after strict
llhttp accepted it, so it relies on llhttp's checks of every line and never decides framing
itself, but refuses (`connect_failure`) the heads llhttp accepts and the relay cannot pass on
as framed: a Connection field naming a framing field, chunked applied other than once, a control
byte in the status line (llhttp lets any byte but CR and LF into a reason phrase; RFC 9112
section 4 allows HTAB, SP, VCHAR and obs-text only, and h11 refuses the rest). Pure: bytes in,
pieces out; never quotes upstream bytes.
"""

from __future__ import annotations

import re
from enum import Enum

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.head_memos import MAX_REMEMBERED_REASON_BYTES, HeadMemos
from gateway.proxy.http1.heads import (
    CLOSE_FIELD,
    FRAMING_FIELDS,
    HOP_BY_HOP,
    TOKEN_CHARS,
    any_case,
)

# What a field name means to the relay, for the heads read line by line (`_field_role`).
_CONNECTION, _CHUNKED, _DROP, _LENGTH, _EGRESS_ID, _RELAY = range(6)

MALFORMED = "the upstream response is malformed"
# A status line relayed as the origin sent it: `HTTP/1.1`, a status from 100 (llhttp has checked
# the three digits), a space, and a reason without a control byte, to the CR that ends the line.
# Any other status line is rebuilt (`_status_line`), its reason checked there.
_STATUS_LINE_AS_SENT = re.compile(rb"HTTP/1\.1 [1-9][0-9][0-9] [^\x00-\x08\x0a-\x1f\x7f]*+\r")
_CONTROL_IN_REASON = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# From the space that ends the version to the reason: the space, three digits, the space.
_STATUS_CODE_AND_SPACES = len(b" 200 ")


def _fields_of_note(dropped: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """The lines the relay acts on, found in one C-level scan of a head llhttp has accepted.

    In strict mode llhttp has checked that each line is a token, a colon with nothing before it,
    optional whitespace and a value without CR, LF or NUL, so every CRLF of the head starts a
    field line and a line's name ends at its first colon. A line of note is Connection (group
    `connection_value`: its value), Transfer-Encoding (group `transfer_encoding`), a field never
    relayed (group `dropped`: `dropped` and `Proxy-*`), or an irregular line (group `irregular`:
    its name): llhttp reads a value without the whitespace after the colon and the relay sends
    `name: value`, so a line is relayed as its raw bytes only when one space and no more
    whitespace follow the colon; a head with any other line is read line by line.
    Content-Length is relayed as it is, its presence read from llhttp's answer
    (`should_keep_alive`). A lookahead on the first letter (on `conn` for Connection, so that
    Content-* lines skip the names too) keeps most lines out of the name alternatives; `[^:]` and
    `[^\r]` (one excluded byte) are sre's fast repeats, and the irregular line's test is a
    lookahead that consumes nothing."""
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
        + rb": (?P<connection_value>[^\r]*)|(?P<transfer_encoding>"
        + any_case(b"transfer-encoding")
        + rb"):[^\r]*|(?P<dropped>"
        + b"|".join(any_case(name) for name in dropped)
        + b"|"
        + any_case(b"proxy-")
        + TOKEN_CHARS
        + rb"*):[^\r]*)|(?P<irregular>[^:]*+):(?! [^ \t]))"
    )


_HOP_BY_HOP_NAMES = (b"keep-alive", b"te", b"trailer", b"upgrade")
_FIELDS_OF_NOTE = _fields_of_note(_HOP_BY_HOP_NAMES)
# The origin's X-Egress-Id is dropped when the gateway sends its own.
_FIELDS_OF_NOTE_BESIDE_AN_ID = _fields_of_note((*_HOP_BY_HOP_NAMES, b"x-egress-id"))
_CONTENT_LENGTH = re.compile(rb"\r\n" + any_case(b"content-length") + b":")
_HOP_BY_HOP_AND_CLOSE = HOP_BY_HOP | {b"close"}
# Names a Connection field may list for a head to be relayed without another look: Connection
# and Transfer-Encoding are cut already, but naming Transfer-Encoding is refused.
_CUT_AND_NOT_FRAMING = HOP_BY_HOP - FRAMING_FIELDS

# `split` on `_fields_of_note` gives the bytes kept before the first line of note, then for each
# line of note its groups in the pattern's order and the bytes kept after it: each list below is
# read by its group's name. (Both patterns have the same groups.)
_PIECES_PER_LINE = _FIELDS_OF_NOTE.groups + 1
_KEPT = slice(0, None, _PIECES_PER_LINE)
_CONNECTION_VALUES = slice(_FIELDS_OF_NOTE.groupindex["connection_value"], None, _PIECES_PER_LINE)
_TRANSFER_ENCODINGS = slice(_FIELDS_OF_NOTE.groupindex["transfer_encoding"], None, _PIECES_PER_LINE)
_IRREGULAR_NAMES = slice(_FIELDS_OF_NOTE.groupindex["irregular"], None, _PIECES_PER_LINE)
# A head with one line of note splits in this many pieces; that line's Connection value is here.
_ONE_LINE_OF_NOTE = _PIECES_PER_LINE + 1
_ONLY_CONNECTION_VALUE = _FIELDS_OF_NOTE.groupindex["connection_value"]


class BodyEnd(Enum):
    """How a response's body ends, as llhttp frames it (`read_head`'s answer beside the pieces)."""

    LENGTH = "length"  # at its Content-Length, or there is none (llhttp keeps the connection alive)
    CHUNKED = "chunked"  # at the last chunk
    CLOSE = "close"  # when the upstream closes, unless the status or the request has no body


_LENGTH_END, _CHUNKED_END, _CLOSE_END = BodyEnd.LENGTH, BodyEnd.CHUNKED, BodyEnd.CLOSE
# The transfer codings of a head's Transfer-Encoding lines (a chunked head only).
_TRANSFER_CODINGS = re.compile(rb"(?i)(?:^|\r\n)transfer-encoding[ \t]*:[ \t]*([^\r]*)")
NAMES_FRAMING = "the upstream response's Connection field names a framing header"


def _chunked_end(head: bytes, named: frozenset[bytes]) -> BodyEnd:
    """`BodyEnd.CHUNKED` for a head with Transfer-Encoding whose Connection fields (`named`)
    name no framing field and whose codings apply chunked once, and last; raises otherwise.

    Framing fields are never hop-by-hop: stripping them would re-frame the body differently.
    RFC 9112 section 6.1: chunked is applied once, and last. llhttp decodes one chunked layer of
    `chunked, chunked` (or two such lines) where a plain parser (h11) refuses: refused here too,
    so no reader downstream sees other message boundaries."""
    if not FRAMING_FIELDS.isdisjoint(named):
        raise GatewayError(ErrorCode.CONNECT_FAILURE, NAMES_FRAMING)
    codings = [
        coding.strip(b" \t").lower()
        for value in _TRANSFER_CODINGS.findall(head)
        for coding in value.split(b",")
        if coding.strip(b" \t")
    ]
    if codings.count(b"chunked") != 1:
        raise GatewayError(ErrorCode.CONNECT_FAILURE, MALFORMED)
    return _CHUNKED_END


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


def _status_line(head: bytes, line_start: int, line_end: int, status: int, memos: HeadMemos) -> bytes:
    """`HTTP/1.1 <status> <reason>`, the reason as the origin sent it, without its CRLF (remembered
    in `memos` for a short reason). llhttp has checked the line: a version without spaces, one
    space, three digits, then a space and the reason, or nothing. Raises `connect_failure` for a
    reason with a control byte."""
    reason = head[head.index(b" ", line_start) + _STATUS_CODE_AND_SPACES : line_end]
    line = memos.status_lines.get((status, reason))
    if line is None:
        # Only a reason without a control byte is remembered.
        if _CONTROL_IN_REASON.search(reason) is not None:
            raise GatewayError(ErrorCode.CONNECT_FAILURE, MALFORMED)
        line = b"HTTP/1.1 %d %b" % (status, reason)
        if len(reason) <= MAX_REMEMBERED_REASON_BYTES:
            memos.status_lines.put((status, reason), line)
    return line


def _read_line_by_line(head: bytes, status: int, id_field: bytes, memos: HeadMemos) -> tuple[list[bytes], BodyEnd]:
    """`read_head` for the rare head `_FIELDS_OF_NOTE` cannot cut (an irregular line, a Connection
    field naming fields that are not cut already): the status line rebuilt, each field line read
    in Python and relayed as CRLF and `name: value`, then the CRLF that ends the last. Values are
    read as llhttp reads them: leading whitespace dropped, trailing whitespace kept."""
    line_start, line_end = _status_line_bounds(head)
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
    named = memos.named_by_connection(values)
    pieces = [_status_line(head, line_start, line_end, status, memos)]
    pieces += [b"\r\n" + name + b": " + value for name, value in fields if name.lower() not in named]
    pieces.append(b"\r\n")
    if chunked:
        return pieces, _chunked_end(head, named)
    if not FRAMING_FIELDS.isdisjoint(named):
        raise GatewayError(ErrorCode.CONNECT_FAILURE, NAMES_FRAMING)
    return pieces, _LENGTH_END if has_length else _CLOSE_END


def read_head(
    head: bytes, status: int, id_field: bytes, keep_alive: bool, memos: HeadMemos
) -> tuple[list[bytes], BodyEnd]:
    """The relayed head's pieces to the CRLF that ends its last field line (the fields the framing
    adds and the blank line follow) and how its body ends, read from the whole head once llhttp
    accepted it (`keep_alive`: llhttp's `should_keep_alive`), with the listener's `memos`. Raises
    `connect_failure` for a head the relay cannot pass on as framed (see the module docstring).

    The relayed head is the raw head with the lines of note cut out, each with the CRLF before
    it: one C-level split gives the kept spans and, for each line of note, its named groups."""
    pieces = (_FIELDS_OF_NOTE_BESIDE_AN_ID if id_field else _FIELDS_OF_NOTE).split(head)
    status_line_as_sent = _STATUS_LINE_AS_SENT.match(head) is not None
    if len(pieces) == _ONE_LINE_OF_NOTE and status_line_as_sent and (value := pieces[_ONLY_CONNECTION_VALUE]):
        # Nearly every keep-alive response: its one line of note a Connection field naming only
        # fields cut already (`keep-alive`), its status line relayed as it is. What the steps
        # below give that head, without their other cases (about 10 k instructions per request
        # under bench/callgrind_proxy.py; the tests compare every head with its line-by-line
        # reading, this path included).
        # Only a remembered answer (a dict read in C, no Python call): the first head with this
        # value takes the steps below, which remember it.
        named = memos.connection_values.get(value)
        if named is not None and named <= _CUT_AND_NOT_FRAMING:
            has_length = keep_alive or _CONTENT_LENGTH.search(head) is not None
            return [pieces[0], pieces[-1][:-2]], _LENGTH_END if has_length else _CLOSE_END
    if any(pieces[_IRREGULAR_NAMES]):
        return _read_line_by_line(head, status, id_field, memos)
    chunked = any(pieces[_TRANSFER_ENCODINGS])
    named = memos.named_by_connection(list(filter(None, pieces[_CONNECTION_VALUES])))
    # The fields a Connection field names are hop-by-hop too (RFC 9110 section 7.6.1): a head
    # naming any that is not cut already is read line by line.
    if not (named <= HOP_BY_HOP or (named <= _HOP_BY_HOP_AND_CLOSE and CLOSE_FIELD.search(head) is None)):
        return _read_line_by_line(head, status, id_field, memos)
    kept: list[bytes] = pieces[_KEPT]
    if not status_line_as_sent:
        line_start, line_end = _status_line_bounds(head)
        kept[0] = _status_line(head, line_start, line_end, status, memos) + kept[0][line_end:]
    kept[-1] = kept[-1][:-2]  # the blank line
    if chunked:
        return kept, _chunked_end(head, named)
    if not FRAMING_FIELDS.isdisjoint(named):
        raise GatewayError(ErrorCode.CONNECT_FAILURE, NAMES_FRAMING)
    # llhttp keeps a connection alive only when the body's end is known: with no Transfer-Encoding
    # (strict llhttp refuses it beside Content-Length) that is Content-Length, or a status without
    # a body.
    return kept, _LENGTH_END if keep_alive or _CONTENT_LENGTH.search(head) is not None else _CLOSE_END
