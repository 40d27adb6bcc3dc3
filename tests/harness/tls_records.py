"""TLS records for the tests that feed the gateway's handshake code bytes: real and hostile hellos.

Owns the first flight Python's own TLS client sends (captured through memory BIOs, so it is a
real ClientHello), one rewritten to offer no key share (which makes a TLS 1.3 server answer with a
HelloRetryRequest), and the server records a test plays back: a ServerHello with a chosen random,
the HelloRetryRequest (RFC 8446 section 4.1.3 gives its random) and a ChangeCipherSpec. No tests
live here.
"""

from __future__ import annotations

import ssl

import pytest

# RFC 8446 section 4.1.3: a ServerHello with this random is a HelloRetryRequest.
HELLO_RETRY_REQUEST_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")


def client_hello(server_name: str | None) -> bytes:
    """The first flight Python's TLS client sends, captured through memory BIOs."""
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


CHANGE_CIPHER_SPEC = b"\x14\x03\x03\x00\x01\x01"


def server_hello(random: bytes) -> bytes:
    body = b"\x03\x03" + random + b"\x00" + b"\x13\x01" + b"\x00" + b"\x00\x06\x00\x2b\x00\x02\x03\x04"
    handshake = b"\x02" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x03" + len(handshake).to_bytes(2, "big") + handshake


HRR = server_hello(HELLO_RETRY_REQUEST_RANDOM)


def without_key_shares(hello: bytes) -> bytes:
    """A real ClientHello with an empty key_share list, so a TLS 1.3 server must send a
    HelloRetryRequest (lengths rewritten; everything else as Python's client sent it)."""
    body = hello[9:]
    pos = 2 + 32
    pos += 1 + body[pos]
    pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
    pos += 1 + body[pos]
    length = int.from_bytes(body[pos : pos + 2], "big")
    extensions, rebuilt, index = body[pos + 2 : pos + 2 + length], b"", 0
    while index < len(extensions):
        kind = int.from_bytes(extensions[index : index + 2], "big")
        size = int.from_bytes(extensions[index + 2 : index + 4], "big")
        data = b"\x00\x00" if kind == 51 else extensions[index + 4 : index + 4 + size]
        index += 4 + size
        rebuilt += kind.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data
    body = body[:pos] + len(rebuilt).to_bytes(2, "big") + rebuilt
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + len(handshake).to_bytes(2, "big") + handshake
