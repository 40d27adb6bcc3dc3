"""Stdio framing: whole lines out, and a line over the bound discarded to its newline, once."""

from __future__ import annotations

import pytest

from gateway.tools.mcp.line_framing import LineFramer, Oversized, request_id_of

MAX = 1_000


def feed_all(chunks: list[bytes]) -> list[bytes | Oversized]:
    framer = LineFramer(MAX)
    events = [event for chunk in chunks for event in framer.feed(chunk)]
    return events + framer.finish()


def test_lines_split_across_chunks_come_out_whole() -> None:
    assert feed_all([b'{"a":', b'1}\n{"b"', b":2}\n", b"tail"]) == [b'{"a":1}', b'{"b":2}', b"tail"]


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 5_000], ids=["bytewise", "small", "medium", "one-chunk"])
def test_an_oversized_line_is_reported_once_with_its_id_and_its_rest_is_never_a_message(chunk_size: int) -> None:
    stream = b'{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"x":"' + b"y" * 3 * MAX + b'"}}\n{"id":43}\n'
    chunks = [stream[i : i + chunk_size] for i in range(0, len(stream), chunk_size)]
    assert feed_all(chunks) == [Oversized(42), b'{"id":43}']


def test_an_oversized_last_line_without_newline_is_reported_and_dropped() -> None:
    assert feed_all([b'{"id":"s-1",' + b" " * 2 * MAX]) == [Oversized("s-1")]


def test_a_line_of_exactly_the_bound_is_a_line() -> None:
    line = b"x" * MAX
    assert feed_all([line + b"\n"]) == [line]


@pytest.mark.parametrize(
    ("prefix", "request_id"),
    [
        pytest.param(b'{"jsonrpc":"2.0","id":7,"method":"ping"', 7, id="integer"),
        pytest.param(b' { "id" : "r\\"1" , "method"', 'r"1', id="escaped-string"),
        pytest.param(b'{"method":"tools/call","params":{"id":5},"id":9', None, id="nested-id-first-is-not-taken"),
        pytest.param(b'{"method":"id","x":"\\"id\\":3"}', None, id="id-inside-strings"),
        pytest.param(b'{"id":1.5,', None, id="float-id"),
        pytest.param(b'{"id":null,', None, id="null-id"),
        pytest.param(b'[{"id":1}]', None, id="batch"),
        pytest.param(b'{"id":12', None, id="cut-inside-the-id"),
    ],
)
def test_the_request_id_is_read_only_from_the_top_level(prefix: bytes, request_id: int | str | None) -> None:
    assert request_id_of(prefix) == request_id
