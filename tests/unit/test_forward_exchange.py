"""The request body's way through a `ForwardExchange` (issue 27): held, bounded, until its upstream
exists, then sent through `UpstreamSide.send_body`; the exchange never touches a transport.

The exchange's partners are recorded, not simulated: a client that notes each pause and resume,
and an upstream that notes what it was given.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import cast

import pytest

from gateway.proxy.forward.exchange import (
    WRITE_HIGH_WATER_BYTES,
    ClientSide,
    ForwardExchange,
    ParsedRequest,
    PauseReason,
    UpstreamSide,
)


class _Client:
    def __init__(self) -> None:
        self.pauses: list[tuple[str, PauseReason]] = []

    def pause_client_reading(self, reason: PauseReason) -> None:
        self.pauses.append(("pause", reason))

    def resume_client_reading(self, reason: PauseReason) -> None:
        self.pauses.append(("resume", reason))


class _Upstream:
    def __init__(self, *, connected: bool = True) -> None:
        self.connected = connected
        self.sent: list[bytes] = []
        self.ended = 0

    def send_body(self, data: bytes) -> bool:
        if not self.connected:
            return False
        self.sent.append(data)
        return True

    def request_ended(self) -> None:
        self.ended += 1


def _exchange(method: bytes = b"POST", *, chunked: bool = False) -> tuple[ForwardExchange, _Client]:
    request = ParsedRequest(method, b"http://a.example/", b"", b"", None, chunked, False, True)
    client = _Client()
    return ForwardExchange(request, cast(ClientSide, client)), client


def test_a_body_before_its_upstream_is_held_then_taken_once_with_reading_resumed() -> None:
    exchange, client = _exchange()
    exchange.request_body(b"abc")
    exchange.request_body(b"def")
    assert (exchange.bytes_up, exchange.pending_bytes) == (6, 6)
    assert exchange.take_held_body() == b"abcdef"
    assert client.pauses == [("resume", PauseReason.BODY_BUFFER)]
    assert exchange.take_held_body() == b""
    assert exchange.pending_bytes == 0


def test_a_held_body_over_one_write_buffer_pauses_the_client() -> None:
    exchange, client = _exchange()
    exchange.request_body(b"x" * WRITE_HIGH_WATER_BYTES)
    assert client.pauses == []
    exchange.request_body(b"x")
    assert client.pauses == [("pause", PauseReason.BODY_BUFFER)]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_once_the_upstream_exists_body_bytes_go_through_it_and_the_end_is_reported(chunked: bool) -> None:
    exchange, _ = _exchange(chunked=chunked)
    upstream = _Upstream()
    exchange.upstream = cast(UpstreamSide, upstream)
    exchange.request_body(b"hello")
    exchange.request_end()
    expected = [b"5\r\nhello\r\n", b"0\r\n\r\n"] if chunked else [b"hello"]
    assert upstream.sent == expected
    assert upstream.ended == 1
    assert exchange.pending == []
    assert exchange.body_done


def test_a_chunked_body_is_held_framed_while_the_upstream_is_still_connecting() -> None:
    exchange, _ = _exchange(chunked=True)
    exchange.upstream = cast(UpstreamSide, _Upstream(connected=False))
    exchange.request_body(b"hi")
    exchange.request_end()
    assert exchange.take_held_body() == b"2\r\nhi\r\n0\r\n\r\n"


@pytest.mark.parametrize(
    ("method", "body", "resendable"),
    [(b"GET", b"", True), (b"PUT", b"", True), (b"POST", b"", False), (b"PUT", b"x", False)],
    ids=["get", "put-empty", "post", "put-with-body"],
)
def test_only_an_idempotent_request_without_body_bytes_is_resendable_once(
    method: bytes, body: bytes, resendable: bool
) -> None:
    exchange, _ = _exchange(method)
    if body:
        exchange.request_body(body)
    exchange.request_end()
    assert exchange.resendable is resendable
    exchange.prepare_retry()
    assert not exchange.resendable


def test_a_retried_chunked_request_holds_its_terminator_again() -> None:
    exchange, _ = _exchange(b"GET", chunked=True)
    exchange.request_end()
    assert exchange.take_held_body() == b"0\r\n\r\n"
    exchange.prepare_retry()
    assert exchange.take_held_body() == b"0\r\n\r\n"


def test_every_field_of_the_parsed_request_is_final() -> None:
    # Nothing may rewrite the parse: mypy --strict (`make lint`) refuses an assignment to a
    # `Final` field, so a field added without it fails here.
    annotations = typing.get_type_hints(ParsedRequest, include_extras=True)
    assert {field.name for field in dataclasses.fields(ParsedRequest)} == set(annotations)
    assert all(typing.get_origin(hint) is typing.Final for hint in annotations.values())


def test_the_decision_is_written_beside_the_parse_never_into_it() -> None:
    exchange, _ = _exchange()
    parsed = (exchange.request.url, exchange.request.fields)
    exchange.url = b"http://elsewhere.example/"
    exchange.fields = b"\r\nX-Injected: 1"
    assert (exchange.request.url, exchange.request.fields) == parsed
