"""The response-head scanner: whole heads cut on raw bytes, caps across interim heads, linear."""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.response_head import (
    MAX_INTERIM_RESPONSES,
    MAX_RESPONSE_HEAD_BYTES,
    MAX_RESPONSE_HEADERS,
    ResponseHeadScanner,
)

HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"


def _feed_in_pieces(data: bytes, size: int) -> tuple[bytes, memoryview] | None:
    scanner = ResponseHeadScanner()
    for start in range(0, len(data), size):
        taken = scanner.take_head(data[start : start + size])
        if taken is not None:
            return taken
    return None


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 1000], ids=lambda size: f"reads-of-{size}")
def test_a_head_split_anywhere_comes_out_whole_with_the_bytes_after_it(size: int) -> None:
    taken = _feed_in_pieces(HEAD + b"ok", size)
    assert taken is not None
    head, rest = bytes(taken[0]), bytes(taken[1])
    assert head == HEAD
    assert (HEAD + b"ok").startswith(head + rest)


def test_an_incomplete_head_is_held() -> None:
    assert ResponseHeadScanner().take_head(HEAD[:-1]) is None


def _take_every_head(data: bytes) -> None:
    scanner = ResponseHeadScanner()
    while data:
        taken = scanner.take_head(data)
        data = bytes(taken[1]) if taken is not None else b""


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * MAX_RESPONSE_HEAD_BYTES, id="endless-line"),
        pytest.param(b"HTTP/1.1 200 " + b"R" * MAX_RESPONSE_HEAD_BYTES, id="endless-reason"),
        pytest.param(b"HTTP/1.1 200 OK\r\n" + b"X: v\r\n" * (MAX_RESPONSE_HEADERS + 1) + b"\r\n", id="too-many-fields"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INTERIM_RESPONSES + 2), id="interim-flood"),
    ],
)
def test_caps_raise_too_large_before_the_head_completes(data: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        _take_every_head(data)
    assert caught.value.code == ErrorCode.TOO_LARGE
    assert "aaaa" not in caught.value.message
    assert "RRRR" not in caught.value.message


def test_exactly_the_field_cap_passes() -> None:
    head = b"HTTP/1.1 200 OK\r\n" + b"X: v\r\n" * MAX_RESPONSE_HEADERS + b"\r\n"
    taken = ResponseHeadScanner().take_head(head)
    assert taken is not None
    assert (bytes(taken[0]), bytes(taken[1])) == (head, b"")


def test_interim_heads_count_toward_the_byte_cap() -> None:
    scanner = ResponseHeadScanner()
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"l" * (MAX_RESPONSE_HEAD_BYTES // 2) + b"\r\n\r\n"
    taken = scanner.take_head(interim)
    assert taken is not None
    assert bytes(taken[0]) == interim
    with pytest.raises(GatewayError):
        scanner.take_head(interim)
