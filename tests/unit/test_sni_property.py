"""Property tests for the SNI reader (`peek_client_hello`): real and built ClientHellos, whole,
fragmented across records and cut short, and mutated or random bytes.

The oracle is the hello's construction (the name OpenSSL was given, the extensions we wrote) and
a plain reference parser written straight from RFC 8446 4.1.2 and RFC 6066 3 below, in a
different shape (offsets, not a cursor): the reader must never raise, and must never name a
server the reference does not, nor accept a hello the reference refuses.
"""

from __future__ import annotations

import contextlib
import ssl
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.proxy.tls.sni import MAX_PEEK_BYTES, PeekStatus, peek_client_hello
from tests.harness.fuzz import examples

# Hundreds of generated examples a test: seconds of CPU, left out of `make test-fast` (`make test`
# runs them with their own bounded count, `make fuzz` with more).
pytestmark = pytest.mark.slow

# A top-level label is never all digits (RFC 3696 2): such names ("0.0.0.0") are IP literals, for
# which OpenSSL sends no server_name at all, so they are not host names this property is about.
HOSTNAMES = (
    st.lists(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", fullmatch=True), min_size=2, max_size=5)
    .filter(lambda labels: not labels[-1].isdigit())
    .map(".".join)
)


# One client context for every hello (loading the default CAs per example is most of the cost).
CLIENT = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def openssl_hello(name: str) -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = CLIENT.wrap_bio(incoming, outgoing, server_hostname=name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def records(handshake: bytes, cuts: list[int]) -> bytes:
    """The handshake message in TLS records, split at `cuts` (RFC 8446 5.1 allows fragmenting)."""
    points = [*sorted({c % len(handshake) for c in cuts} - {0}), len(handshake)]
    out, start = b"", 0
    for end in points:
        out += b"\x16\x03\x01" + struct.pack("!H", end - start) + handshake[start:end]
        start = end
    return out


def sni_extension(name: bytes) -> bytes:
    entry = b"\x00" + struct.pack("!H", len(name)) + name
    return struct.pack("!HH", 0, len(entry) + 2) + struct.pack("!H", len(entry)) + entry


def built_hello(extensions: list[tuple[int, bytes]], session_id: bytes) -> bytes:
    """A ClientHello handshake message with these extensions in this order."""
    body = b"\x03\x03" + b"\x11" * 32 + bytes([len(session_id)]) + session_id
    body += b"\x00\x02\x13\x01" + b"\x01\x00"
    blob = b"".join(struct.pack("!HH", kind, len(data)) + data for kind, data in extensions)
    body += struct.pack("!H", len(blob)) + blob
    return b"\x01" + len(body).to_bytes(3, "big") + body


def reference_sni(data: bytes) -> tuple[str, str | None]:
    """('complete', name) / ('malformed', None) / ('need_more', None) / ('not_tls', None)."""
    if not data:
        return "need_more", None
    if data[0] != 0x16 or (len(data) > 1 and data[1] != 3):
        return "not_tls", None
    message, i = b"", 0
    while True:
        if i + 5 > len(data):
            return "need_more", None
        if data[i] != 0x16 or data[i + 1] != 3:
            return "malformed", None
        size = int.from_bytes(data[i + 3 : i + 5])
        # RFC 8446 5.1/5.2: no empty handshake record, none over 2^14 (+256); and the reader's bound.
        if size == 0 or size > 2**14 + 256 or i + 5 + size > MAX_PEEK_BYTES:
            return "malformed", None
        if i + 5 + size > len(data):
            return "need_more", None
        message += data[i + 5 : i + 5 + size]
        i += 5 + size
        if len(message) >= 4:
            if message[0] != 1:
                return "malformed", None
            total = 4 + int.from_bytes(message[1:4])
            if len(message) > total or total > 4 + 2**14:
                return "malformed", None
            if len(message) == total:
                break
    body = message[4:]
    try:
        at = 34
        at += 1 + body[at]  # session id
        at += 2 + int.from_bytes(body[at : at + 2])  # cipher suites
        at += 1 + body[at]  # compression methods
        if at == len(body):
            return "complete", None
        end = at + 2 + int.from_bytes(body[at : at + 2])
        if end > len(body):
            return "malformed", None
        at += 2
        seen, name = set(), None
        while at < end:
            kind, size = struct.unpack_from("!HH", body, at)
            ext = body[at + 4 : at + 4 + size]
            if at + 4 + size > end or kind in seen:
                return "malformed", None
            seen.add(kind)
            at += 4 + size
            if kind == 0:
                names_size = int.from_bytes(ext[:2])
                if len(ext) < 2 or names_size != len(ext) - 2:
                    return "malformed", None
                j, hosts = 2, []
                while j < len(ext):
                    if j + 3 > len(ext) or j + 3 + int.from_bytes(ext[j + 1 : j + 3]) > len(ext):
                        return "malformed", None
                    size_j = int.from_bytes(ext[j + 1 : j + 3])
                    if ext[j] == 0:
                        hosts.append(ext[j + 3 : j + 3 + size_j])
                    j += 3 + size_j
                if len(hosts) != 1 or not hosts[0] or len(hosts[0]) > 255:
                    return "malformed", None
                if any(b <= 0x20 or b >= 0x7F for b in hosts[0]):
                    return "malformed", None
                name = hosts[0].decode().lower().rstrip(".")
            elif kind == 16:
                # RFC 7301 3.1: a ProtocolNameList filling the extension, names of 1 to 255 bytes.
                if len(ext) < 2 or int.from_bytes(ext[:2]) != len(ext) - 2:
                    return "malformed", None
                j = 2
                while j < len(ext):
                    if ext[j] == 0 or j + 1 + ext[j] > len(ext):
                        return "malformed", None
                    j += 1 + ext[j]
        return "complete", name
    except (IndexError, struct.error):
        return "malformed", None


def assert_agrees(data: bytes) -> None:
    peek = peek_client_hello(data)
    assert isinstance(peek.status, PeekStatus)
    expected_status, expected_name = reference_sni(data[:MAX_PEEK_BYTES])
    if len(data) >= MAX_PEEK_BYTES and expected_status == "need_more":
        expected_status = "malformed"  # the reader's bound: it gives up rather than buffer more
    assert (peek.status.value, peek.server_name) == (expected_status, expected_name), data[:80]
    if peek.status is PeekStatus.COMPLETE:
        assert 0 < peek.consumed <= len(data)


@examples(60)
@given(HOSTNAMES, st.lists(st.integers(1, 4000), max_size=4), st.integers(0, 2000))
def test_openssl_hellos_give_their_name_whole_fragmented_and_never_early(name: str, cuts: list[int], cut: int) -> None:
    hello = openssl_hello(name)
    data = records(hello[5:], cuts)
    peek = peek_client_hello(data)
    assert (peek.status, peek.server_name, peek.consumed) == (PeekStatus.COMPLETE, name, len(data))
    prefix = data[: cut % len(data)]
    assert peek_client_hello(prefix).status is PeekStatus.NEED_MORE
    assert_agrees(data)


# Extensions the reader skips unread: not server_name (0, placed by the test) nor ALPN (16, whose
# list the reader checks; random bytes there are a malformed hello, which the mutation test covers).
EXTENSIONS = st.lists(
    st.tuples(st.integers(1, 65535).filter(lambda kind: kind != 16), st.binary(max_size=40)),
    max_size=6,
    unique_by=lambda item: item[0],
)


@examples(200)
@given(
    EXTENSIONS,
    st.none() | HOSTNAMES,
    st.integers(0, 6),
    st.binary(max_size=32),
    st.lists(st.integers(1, 300), max_size=3),
)
def test_built_hellos_give_exactly_the_name_written(
    others: list[tuple[int, bytes]], name: str | None, position: int, session_id: bytes, cuts: list[int]
) -> None:
    extensions = list(others)
    if name is not None:
        extensions.insert(position % (len(extensions) + 1), (0, sni_extension(name.encode())[4:]))
    data = records(built_hello(extensions, session_id), cuts)
    peek = peek_client_hello(data)
    assert (peek.status, peek.server_name) == (PeekStatus.COMPLETE, name)
    assert_agrees(data)


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    mutable = bytearray(data)
    for position, value in edits:
        mutable[position % len(mutable)] = value
    return bytes(mutable[: len(mutable) - cut % len(mutable)])


@examples(400)
@given(
    st.builds(
        _mutate,
        st.builds(
            lambda ext, sid, cuts: records(built_hello(ext, sid), cuts),
            EXTENSIONS.map(lambda e: [(0, sni_extension(b"a.example")[4:]), *e]),
            st.binary(max_size=8),
            st.lists(st.integers(1, 200), max_size=2),
        ),
        st.lists(st.tuples(st.integers(0, 600), st.integers(0, 255)), min_size=1, max_size=4),
        st.integers(0, 3),
    )
    | st.binary(max_size=400)
    | st.binary(max_size=64).map(lambda tail: b"\x16\x03\x01" + tail)
)
def test_mutated_and_random_bytes_never_raise_and_agree_with_the_reference(data: bytes) -> None:
    assert_agrees(data)
