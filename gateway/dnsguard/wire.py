"""The DNS listener's fast path on the wire: one plain question read from raw bytes, and the replies
built from raw parts, without a full message parse.

`read_question` accepts only the common shape (RFC 1035 4.1): a standard query, one question
with an uncompressed name of letters, digits, `-` and `_` within the RFC's limits (labels of at
most 63 bytes, a name of at most 255 on the wire), class IN, and at most one additional record,
an EDNS0 OPT (RFC 6891) announcing the client's UDP size. Anything else returns None and goes to
the general path (dnslib), which answers it or refuses it. The property tests hold this reader
to dnslib's reading of the same bytes.

Pure: bytes in, values and bytes out. Never opens a socket and never judges a name.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.vet.addresses import IPAddress

HEADER_BYTES = 12
MAX_LABEL_BYTES = 63
MAX_NAME_BYTES = 255  # RFC 1035 2.3.4, length octets included
CLASS_IN = 1
TYPE_A, TYPE_AAAA, TYPE_OPT = 1, 28, 41
CLASSIC_UDP_BYTES = 512
MAX_UDP_BYTES = 4096
RCODE_FORMERR, RCODE_SERVFAIL, RCODE_NXDOMAIN, RCODE_REFUSED = 1, 2, 3, 5
_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_HEADER = struct.Struct("!HHHHHH")
_TYPE_CLASS = struct.Struct("!HH")
_RECORD = struct.Struct("!HHIH")  # type, class, TTL, rdata length (after a 2-byte name pointer)
_POINTER_TO_QUESTION = b"\xc0\x0c"


@dataclass(frozen=True, slots=True)
class Question:
    """One plain query but its id (`txid_of`): its flags, the question as sent, and what it asks.

    Without the id, the same question asked again is the same bytes after the first two, which
    `QuestionMemo` reads once."""

    flags: int
    name: str  # lower case, no trailing dot
    qtype: int
    question: bytes  # the question section's bytes, echoed in the reply
    udp_limit: int


def read_question(data: bytes) -> Question | None:
    """The query's question when it has the plain shape above, else None (the general path)."""
    if len(data) < HEADER_BYTES + 5:
        return None
    _txid, flags, qdcount, ancount, nscount, arcount = _HEADER.unpack_from(data)
    # QR clear, opcode 0 (QUERY); one question and nothing else but an optional OPT.
    if flags & 0xF800 or qdcount != 1 or ancount or nscount or arcount > 1:
        return None
    offset, labels = HEADER_BYTES, []
    while True:
        length = data[offset] if offset < len(data) else -1
        if length == 0:
            offset += 1
            break
        if length < 0 or length > MAX_LABEL_BYTES:
            return None  # out of bytes, a compression pointer, or an over-long label
        label = data[offset + 1 : offset + 1 + length]
        if len(label) != length or not _NAME_BYTES.issuperset(label):
            return None
        labels.append(label)
        offset += 1 + length
    if offset - HEADER_BYTES > MAX_NAME_BYTES or not labels or offset + 4 > len(data):
        return None
    qtype, qclass = _TYPE_CLASS.unpack_from(data, offset)
    offset += 4
    question = data[HEADER_BYTES:offset]
    udp_limit = CLASSIC_UDP_BYTES
    if arcount:
        # The OPT pseudo-record: root name, type 41, the UDP size in the class field, no rdata here.
        if data[offset : offset + 1] != b"\x00" or len(data) < offset + 11:
            return None
        rtype, size, _ttl, rdlength = _RECORD.unpack_from(data, offset + 1)
        if rtype != TYPE_OPT or rdlength or offset + 11 != len(data):
            return None
        udp_limit = max(CLASSIC_UDP_BYTES, min(size, MAX_UDP_BYTES))
    elif offset != len(data):
        return None
    if qclass != CLASS_IN:
        return None
    name = b".".join(labels).decode("ascii").lower()
    return Question(flags, name, qtype, bytes(question), udp_limit)


def txid_of(data: bytes) -> int:
    return int.from_bytes(data[:2])


class QuestionMemo:
    """`read_question` remembered per query without its id: an agent asks the same few names over
    and over, and reading one costs more than the rest of a remembered answer. Bounded; what is
    not plain is remembered too (as None), so a flood of one malformed query costs a lookup."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._read: dict[bytes, Question | None] = {}

    def read(self, data: bytes) -> Question | None:
        key = data[2:]
        try:
            return self._read[key]
        except KeyError:
            pass
        if len(self._read) >= self.max_entries:
            self._read.clear()  # a new working set: cheaper than an LRU's bookkeeping per query
        question = self._read[key] = read_question(data)
        return question


def _reply_header(txid: int, query: Question, rcode: int, answers: int, *, truncated: bool = False) -> bytes:
    # QR, the query's RD, RA (we recurse for the client); AA clear: the gateway is no authority.
    flags = 0x8080 | (query.flags & 0x0100) | (0x0200 if truncated else 0) | rcode
    return _HEADER.pack(txid, flags, 1, answers, 0, 0)


def rcode_reply(txid: int, query: Question, rcode: int) -> bytes:
    """The question echoed with `rcode` and no answer (a refusal, NXDOMAIN, SERVFAIL)."""
    return _reply_header(txid, query, rcode, 0) + query.question


def answer_records(qtype: int, addresses: Sequence[IPAddress], ttl_s: int) -> tuple[int, bytes]:
    """The answer section for the addresses of the asked family, each under the asked name (a
    pointer to the question), and how many records it holds."""
    family = 4 if qtype == TYPE_A else 6
    picked = [address.packed for address in addresses if address.version == family]
    ttl = max(0, int(ttl_s))
    records = b"".join(_POINTER_TO_QUESTION + _RECORD.pack(qtype, CLASS_IN, ttl, len(raw)) + raw for raw in picked)
    return len(picked), records


def address_reply(txid: int, query: Question, records: tuple[int, bytes], *, tcp: bool) -> bytes:
    """`answer_records` as the answer to `query`.

    A CNAME chain the resolver followed is not repeated: the answer names the addresses the
    gateway itself will dial for this name. Over UDP, an answer larger than the client can take is
    the question alone with TC set (RFC 2181 9), so the client asks again over TCP.
    """
    count, section = records
    reply = _reply_header(txid, query, 0, count) + query.question + section
    if not tcp and len(reply) > query.udp_limit:
        return _reply_header(txid, query, 0, 0, truncated=True) + query.question
    return reply


def header_only_reply(data: bytes, rcode: int) -> bytes | None:
    """A 12-byte reply with the query's id and `rcode` and no question (RFC 1035 allows it for
    FORMERR): for a query whose question cannot be echoed. None when there is no header at all."""
    if len(data) < HEADER_BYTES:
        return None
    txid, flags = struct.unpack_from("!HH", data)
    return _HEADER.pack(txid, 0x8080 | (flags & 0x0100) | rcode, 0, 0, 0, 0)


def question_end(data: bytes) -> int | None:
    """Where the first question of a message ends (for matching an upstream's reply to a query)."""
    offset = HEADER_BYTES
    while offset < len(data):
        length = data[offset]
        if length == 0:
            end = offset + 5
            return end if end <= len(data) else None
        if length > MAX_LABEL_BYTES:
            return None
        offset += 1 + length
    return None
