"""The ClientHello SNI peek: real hellos from Python's TLS stack, then hostile variants."""

from __future__ import annotations

import random

import pytest

from gateway.proxy.tls.sni import MAX_PEEK_BYTES, PeekStatus, peek_client_hello
from tests.harness.tls_records import client_hello


def split_into_records(hello: bytes, size: int) -> bytes:
    """Re-fragment one handshake record into several (RFC 8446 section 5.1 allows it)."""
    header, body = hello[:5], hello[5:]
    out = b""
    for start in range(0, len(body), size):
        piece = body[start : start + size]
        out += header[:3] + len(piece).to_bytes(2, "big") + piece
    return out


def test_sni_of_a_real_client_hello_is_read() -> None:
    peek = peek_client_hello(client_hello("docs.example.org"))
    assert peek.status == PeekStatus.COMPLETE
    assert peek.server_name == "docs.example.org"


def test_client_hello_without_sni_is_complete_with_no_name() -> None:
    peek = peek_client_hello(client_hello(None))
    assert peek.status == PeekStatus.COMPLETE
    assert peek.server_name is None


def test_client_hello_fragmented_across_records_is_reassembled() -> None:
    peek = peek_client_hello(split_into_records(client_hello("docs.example.org"), 7))
    assert peek.server_name == "docs.example.org"


@pytest.mark.parametrize(
    "cut", [0, 1, 3, 5, 40, -1], ids=["empty", "one-byte", "mid-header", "header-only", "mid-body", "last-byte-missing"]
)
def test_a_partial_client_hello_asks_for_more(cut: int) -> None:
    hello = client_hello("docs.example.org")
    assert peek_client_hello(hello[:cut]).status == PeekStatus.NEED_MORE


@pytest.mark.parametrize(
    "first_flight",
    [b"GET / HTTP/1.1\r\n", b"SSH-2.0-OpenSSH_9.6\r\n", b"\x16\x02\x00"],
    ids=["http", "ssh-banner", "sslv2-version"],
)
def test_non_tls_first_flight_is_reported_as_not_tls(first_flight: bytes) -> None:
    assert peek_client_hello(first_flight).status == PeekStatus.NOT_TLS


def _replace_name(hello: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new)
    return hello.replace(old, new)


def test_server_name_with_control_bytes_is_malformed() -> None:
    hello = _replace_name(client_hello("docs.example.org"), b"docs.example.org", b"docs.exa\x00ple.org")
    assert peek_client_hello(hello).status == PeekStatus.MALFORMED


def test_duplicate_server_name_extension_is_malformed() -> None:
    # Build a ClientHello by hand whose extensions hold two server_name blocks.
    name = b"b.example.o"
    entry = b"\x00" + len(name).to_bytes(2, "big") + name
    sni_list = len(entry).to_bytes(2, "big") + entry
    sni = b"\x00\x00" + len(sni_list).to_bytes(2, "big") + sni_list
    extensions = sni + sni
    fixed = b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body = fixed + len(extensions).to_bytes(2, "big") + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    record = b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake
    peek = peek_client_hello(record)
    assert peek.status == PeekStatus.MALFORMED
    assert "duplicate" in peek.reason


def test_length_fields_pointing_past_the_end_are_malformed_not_errors() -> None:
    body = b"\x03\x03" + b"\x00" * 32 + b"\x20"  # session id claims 32 bytes that are not there
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    record = b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake
    assert peek_client_hello(record).status == PeekStatus.MALFORMED


def test_a_handshake_larger_than_the_peek_bound_is_malformed() -> None:
    record = b"\x16\x03\x01\x40\x00" + b"\x01\xff\xff\xff" + b"\x00" * (MAX_PEEK_BYTES)
    assert peek_client_hello(record).status == PeekStatus.MALFORMED


@pytest.mark.parametrize("seed", range(200))
def test_random_bytes_never_raise(seed: int) -> None:
    rng = random.Random(seed)  # deterministic fuzz: a failure names its seed
    data = b"\x16\x03" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))
    assert peek_client_hello(data).status in set(PeekStatus)


def _hello_with_alpn(alpn_extension_data: bytes) -> bytes:
    """A ClientHello record whose only extension is ALPN (16) with these bytes."""
    body = b"\x03\x03" + b"\x11" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    extension = (16).to_bytes(2, "big") + len(alpn_extension_data).to_bytes(2, "big") + alpn_extension_data
    body += len(extension).to_bytes(2, "big") + extension
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake


def test_a_well_formed_alpn_list_is_read() -> None:
    peek = peek_client_hello(_hello_with_alpn(b"\x00\x0c\x02h2\x08http/1.1"))
    assert (peek.status, peek.alpn) == (PeekStatus.COMPLETE, ("h2", "http/1.1"))


@pytest.mark.parametrize(
    "alpn_extension_data",
    [
        pytest.param(b"\x00\x03\x02h2" + b"x", id="trailing-byte-after-the-list"),
        pytest.param(b"\x00\x04\x00\x02h2", id="empty-protocol-name"),
        pytest.param(b"\x00\x05\x08h2", id="name-longer-than-the-list"),
    ],
)
def test_an_alpn_list_a_server_would_reject_is_malformed(alpn_extension_data: bytes) -> None:
    # RFC 7301 3.1: the checker refuses what the server would refuse, rather than read it its own way.
    assert peek_client_hello(_hello_with_alpn(alpn_extension_data)).status is PeekStatus.MALFORMED
