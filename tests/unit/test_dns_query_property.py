"""Property tests for the DNS listener's query path: no bytes make it raise, and the fast reader
(`dnsguard.wire`) reads every query it accepts exactly as dnslib does.

The general path (`verdict.judge_query`) must answer any datagram with a verdict, never an
exception (a label over 63 bytes used to raise while echoing the question). The fast path must
never read a name, type, id or EDNS size other than the one dnslib reads from the same bytes, so a
policy decision made on its reading is the decision the general path would make. Replies it
builds must parse back, with the asked question and the given addresses.
"""

from __future__ import annotations

import ipaddress
import struct

import pytest
from dnslib import EDNS0, QTYPE, RCODE, DNSRecord
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.dnsguard.verdict import judge_query
from gateway.dnsguard.wire import (
    TYPE_A,
    TYPE_AAAA,
    address_reply,
    answer_records,
    rcode_reply,
    read_question,
)
from gateway.policy.load import parse_policy
from tests.harness.fuzz import examples

# Hundreds of generated examples a test: seconds of CPU, left out of `make test-fast` (`make test`
# runs them with their own bounded count, `make fuzz` with more).
pytestmark = pytest.mark.slow

POLICY = parse_policy(
    """version: 1
principals:
  default: {egress: {allow_domains: ['*.example.org', example.org]}}
"""
)
DEFAULT = POLICY.principals["default"]

LABEL_BYTES = st.sampled_from(list(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.\\ \x00\xff*"))
# Labels around the 63-byte limit, names around the 255-byte one.
LABELS = st.lists(
    st.binary(min_size=1, max_size=70).filter(bool) | st.lists(LABEL_BYTES, min_size=1, max_size=66).map(bytes),
    min_size=1,
    max_size=6,
)
# Names the fast reader accepts (letters, digits, '-', '_'), up to and past the limits.
PLAIN_LABELS = st.lists(st.from_regex(rb"[A-Za-z0-9_-]{1,66}", fullmatch=True), min_size=1, max_size=6)
QTYPES = st.sampled_from([1, 28, 5, 15, 16, 33, 255, 41, 0, 65535])


def raw_query(txid: int, flags: int, labels: list[bytes], qtype: int, qclass: int, edns: int | None) -> bytes:
    """A query written by hand, so that names dnslib would refuse to write can be sent."""
    header = struct.pack("!HHHHHH", txid, flags, 1, 0, 0, 1 if edns is not None else 0)
    name = b"".join(bytes([len(label) & 0xFF]) + label for label in labels) + b"\x00"
    opt = b"" if edns is None else b"\x00" + struct.pack("!HHIH", 41, edns, 0, 0)
    return header + name + struct.pack("!HH", qtype, qclass) + opt


QUERIES = st.builds(
    raw_query,
    st.integers(0, 65535),
    st.sampled_from([0x0100, 0x0000, 0x8100, 0x0900, 0x0110]),
    LABELS | PLAIN_LABELS,
    QTYPES,
    st.sampled_from([1, 1, 1, 3, 255]),
    st.none() | st.integers(0, 65535),
)


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    mutable = bytearray(data)
    for position, value in edits:
        if mutable:
            mutable[position % len(mutable)] = value
    return bytes(mutable[: max(0, len(mutable) - cut)])


MUTATED = st.builds(
    _mutate, QUERIES, st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3), st.integers(0, 3)
)


def assert_reader_agrees_with_dnslib(data: bytes) -> bool:
    """Whether the fast reader accepted the bytes (having checked its reading against dnslib's)."""
    question = read_question(data)
    try:
        parsed: DNSRecord | None = DNSRecord.parse(data)
    except Exception:
        parsed = None
    if question is None:
        return False
    # The fast reader accepted it: dnslib must read the very same query.
    assert parsed is not None, data
    assert parsed.header.id == int.from_bytes(data[:2])
    assert parsed.header.qr == 0
    assert parsed.header.opcode == 0
    assert len(parsed.questions) == 1
    assert not parsed.rr
    assert not parsed.auth
    assert str(parsed.q.qname).rstrip(".").lower() == question.name
    assert parsed.q.qtype == question.qtype
    assert parsed.q.qclass == 1
    opt = [record for record in parsed.ar if record.rtype == 41]
    assert question.udp_limit == (max(512, min(int(opt[0].rclass), 4096)) if opt else 512)
    # And the general path's verdict names the same question.
    verdict = judge_query(data, POLICY, DEFAULT)
    assert (verdict.name, verdict.udp_limit) == (question.name, question.udp_limit)
    return True


@examples(200)
@given(QUERIES | MUTATED | st.binary(max_size=300))
@example(raw_query(1, 0x0100, [b"a" * 64, b"org"], 1, 1, None))
@example(raw_query(1, 0x0100, [b"b" * 63] * 4 + [b"org"], 1, 1, None))
@example(raw_query(1, 0x0100, [b"a.b", b"org"], 1, 1, None))
@example(b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01")
def test_no_datagram_makes_the_query_path_raise_and_the_fast_reader_reads_as_dnslib(data: bytes) -> None:
    verdict = judge_query(data, POLICY, DEFAULT)
    if verdict.reply is not None:
        reply = DNSRecord.parse(verdict.reply)
        assert reply.header.qr == 1
        assert reply.header.id == int.from_bytes(data[:2])
    if not verdict.forward:
        assert verdict.code is not None
    assert_reader_agrees_with_dnslib(data)


@examples(150)
@given(st.integers(0, 65535), PLAIN_LABELS, st.sampled_from([1, 28, 15]), st.none() | st.integers(0, 65535))
def test_plain_queries_take_the_fast_path_with_dnslibs_reading(
    txid: int, labels: list[bytes], qtype: int, edns: int | None
) -> None:
    data = raw_query(txid, 0x0100, labels, qtype, 1, edns)
    within = all(len(label) <= 63 for label in labels) and sum(len(label) + 1 for label in labels) + 1 <= 255
    # Every plain query within the limits is accepted (the fast path is not an empty set).
    assert assert_reader_agrees_with_dnslib(data) == within


@examples(50)
@given(st.lists(st.lists(LABEL_BYTES, min_size=64, max_size=80).map(bytes), min_size=1, max_size=2), QTYPES)
def test_an_over_long_label_is_formerr_on_both_paths(labels: list[bytes], qtype: int) -> None:
    data = raw_query(7, 0x0100, [*labels, b"org"], qtype, 1, None)
    assert read_question(data) is None
    verdict = judge_query(data, POLICY, DEFAULT)
    assert not verdict.forward
    assert verdict.reply is not None
    assert DNSRecord.parse(verdict.reply).header.rcode == RCODE.FORMERR


NAMES = st.lists(st.from_regex(r"[a-z0-9_][a-z0-9_-]{0,20}", fullmatch=True), min_size=1, max_size=4).map(".".join)
ADDRESSES = st.lists(st.ip_addresses(), max_size=50)


@examples(200)
@given(
    NAMES,
    st.sampled_from([TYPE_A, TYPE_AAAA]),
    st.none() | st.integers(0, 65535),
    ADDRESSES,
    st.integers(0, 86400),
    st.booleans(),
)
def test_built_replies_parse_back_with_the_question_and_the_addresses(
    name: str,
    qtype: int,
    edns: int | None,
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
    ttl: int,
    tcp: bool,
) -> None:
    query = DNSRecord.question(name, QTYPE[qtype])
    if edns is not None:
        query.add_ar(EDNS0(udp_len=edns))
    question = read_question(bytes(query.pack()))
    assert question is not None
    assert question.name == name.lower()
    reply = DNSRecord.parse(address_reply(query.header.id, question, answer_records(qtype, addresses, ttl), tcp=tcp))
    assert reply.header.id == query.header.id
    assert reply.header.qr == 1
    assert str(reply.q.qname).rstrip(".") == name
    assert reply.q.qtype == qtype
    family = 4 if qtype == TYPE_A else 6
    expected = [str(address) for address in addresses if address.version == family]
    if reply.header.tc:
        assert not tcp
        assert not reply.rr
    else:
        assert [str(record.rdata) for record in reply.rr] == [str(ipaddress.ip_address(a)) for a in expected]
        assert all(record.ttl == ttl for record in reply.rr)
    refused = DNSRecord.parse(rcode_reply(query.header.id, question, RCODE.REFUSED))
    assert refused.header.rcode == RCODE.REFUSED
    assert str(refused.q.qname).rstrip(".") == name
