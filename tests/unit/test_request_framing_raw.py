"""The request framing's raw-bytes paths: heads cut out of the stream before llhttp sees them.

`RequestFraming` feeds llhttp each head alone and reads it from its raw bytes (`request_head.py`),
so these cases check what that adds: a head split at every byte offset gives the events of one
read, pipelined requests behind bodies of each framing, the caps counted on raw bytes on both
sides of each limit, a chunked body's end and its trailers' bound (`chunked_end.py`), and the
forwarded field lines cut from the raw head against the same lines built field by field.
"""

from __future__ import annotations

import random

import pytest

from gateway.errors import ErrorCode
from gateway.proxy.http1 import request_framing
from gateway.proxy.http1.chunked_end import ChunkedBodyEnd
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.heads import MAX_HEAD_BYTES, MAX_HEADERS, MAX_URL_BYTES, named_by_connection
from gateway.proxy.http1.request_framing import (
    NO_VERSION,
    OUT_OF_STEP,
    ConnectHead,
    Refusal,
    RequestBody,
    RequestEnd,
    RequestFraming,
)
from gateway.proxy.http1.request_head import forwarded_lines, read_field_block, request_fields
from tests.harness.request_events import RequestEvent, RequestHead, events_of

SIX_FIELDS = (
    b"GET http://a.example.org/p?q=1 HTTP/1.1\r\nHost: a.example.org\r\nUser-Agent: agent/1.0\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, br\r\nConnection: keep-alive\r\n"
    b"Proxy-Authorization: Bearer t\r\n\r\n"
)
POST_LENGTH = b"POST http://a/ HTTP/1.1\r\nContent-Length: 10\r\n\r\nab\r\n\r\nGET "
POST_CHUNKED = (
    b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"4;x=y\r\n\r\n\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\nY:2\r\n\r\n"
)
CONNECT = b"CONNECT a.example.org:443 HTTP/1.1\r\nProxy-Authorization: Bearer t\r\n\r\n\x16\x03\x01"
STREAMS = [
    pytest.param(SIX_FIELDS, id="six-fields"),
    pytest.param(b"\r\n" + SIX_FIELDS + b"\r\n" + SIX_FIELDS, id="empty-lines-between"),
    pytest.param(POST_LENGTH + SIX_FIELDS + POST_CHUNKED + SIX_FIELDS, id="pipelined-behind-bodies"),
    pytest.param(SIX_FIELDS + CONNECT, id="connect-behind-a-get"),
    pytest.param(b"GET http://a/ HTTP/1.1\r\nX:\r\nConnection: x-hop\r\nX-Hop: 1\r\n\r\n", id="empty-value"),
]


def flat(events: list[RequestEvent]) -> list[object]:
    """Events with each message's body joined: how llhttp cuts a body into reads is its own."""
    out: list[object] = []
    for event in events:
        if isinstance(event, RequestBody) and out and isinstance(out[-1], RequestBody):
            out[-1] = RequestBody(out[-1].data + event.data)
        else:
            out.append(event)
    return out


@pytest.mark.parametrize("stream", STREAMS)
def test_a_stream_split_at_every_byte_gives_the_events_of_one_read(stream: bytes) -> None:
    whole = events_of(stream)
    assert not any(isinstance(event, Refusal) for event in whole)
    for offset in range(1, len(stream)):
        framing = RequestFraming(RequestHead, HeadMemos())
        events = framing.feed(stream[:offset])
        if events and isinstance(events[-1], ConnectHead):
            events[-1].rest += stream[offset:]  # the next read goes to the tunnel
        else:
            events += framing.feed(stream[offset:])
        assert flat(events) == flat(whole), offset


def test_requests_behind_bodies_of_each_framing_come_out_in_order_with_their_bodies() -> None:
    events = events_of(POST_LENGTH + SIX_FIELDS + POST_CHUNKED + SIX_FIELDS)
    kinds = [type(event).__name__ for event in flat(events)]
    assert kinds == ["RequestHead", "RequestBody", "RequestEnd", "RequestHead", "RequestEnd"] * 2
    bodies = [event.data for event in flat(events) if isinstance(event, RequestBody)]
    assert bodies == [b"ab\r\n\r\nGET ", b"\r\n\r\nabc"]
    heads = [event for event in events if isinstance(event, RequestHead)]
    assert [head.method for head in heads] == [b"POST", b"GET", b"POST", b"GET"]


def test_the_six_field_head_is_read_as_llhttp_reads_it() -> None:
    head = events_of(SIX_FIELDS)[0]
    assert isinstance(head, RequestHead)
    assert (head.url, head.authorization) == (b"http://a.example.org/p?q=1", b"Bearer t")
    assert head.fields == b"\r\nUser-Agent: agent/1.0\r\nAccept: */*\r\nAccept-Encoding: gzip, br"
    assert head.client_head == SIX_FIELDS


def test_a_connect_split_in_its_head_hands_the_rest_of_the_last_read_to_the_tunnel() -> None:
    framing = RequestFraming(RequestHead, HeadMemos())
    assert framing.feed(CONNECT[:20]) == []
    assert framing.feed(CONNECT[20:]) == [ConnectHead(b"a.example.org:443", b"Bearer t", b"\x16\x03\x01")]


@pytest.mark.parametrize(
    "line",
    [
        b"GET http://a/ HTTP/1.1",
        b"GET  http://a/  HTTP/1.1",
    ],
)
def test_the_target_is_cut_from_any_request_line_llhttp_accepts(line: bytes) -> None:
    head = events_of(line + b"\r\n\r\n")[0]
    assert isinstance(head, RequestHead)
    assert (head.method, head.url, head.http10) == (b"GET", b"http://a/", False)


@pytest.mark.parametrize("line", [b"GET http://a/", b"GET  http://a/", b"GET http://a/--HTTP/1.1"])
def test_a_request_line_without_a_version_is_refused(line: bytes) -> None:
    # llhttp reads these as HTTP/0.9; h11 refuses them (tests/unit/test_framing_property.py).
    refusal = events_of(line + b"\r\nHost: a\r\n\r\n")[-1]
    assert isinstance(refusal, Refusal)
    assert refusal.error.message == NO_VERSION


def test_an_empty_proxy_authorization_is_a_credential_and_a_second_one_is_refused() -> None:
    head = events_of(b"GET http://a/ HTTP/1.1\r\nProxy-Authorization:\r\n\r\n")[0]
    assert isinstance(head, RequestHead)
    assert head.authorization == b""
    refusal = events_of(b"GET http://a/ HTTP/1.1\r\nProxy-Authorization:\r\nProxy-Authorization: b\r\n\r\n")[-1]
    assert isinstance(refusal, Refusal)
    assert refusal.error.message == "two Proxy-Authorization fields"


def _head_of(size: int) -> bytes:
    """A GET head of exactly `size` bytes."""
    start, end = b"GET http://a/ HTTP/1.1\r\nX: ", b"\r\n\r\n"
    return start + b"v" * (size - len(start) - len(end)) + end


def _head_with_fields(count: int) -> bytes:
    return b"GET http://a/ HTTP/1.1\r\n" + b"X: v\r\n" * count + b"\r\n"


def _head_with_target(length: int) -> bytes:
    target = b"http://a/" + b"p" * (length - len(b"http://a/"))
    return b"GET " + target + b" HTTP/1.1\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "message"),
    [
        pytest.param(_head_of(MAX_HEAD_BYTES), None, id="head-at-the-cap"),
        pytest.param(_head_of(MAX_HEAD_BYTES + 1), "the request head is too large", id="head-over-the-cap"),
        pytest.param(_head_with_fields(MAX_HEADERS), None, id="fields-at-the-cap"),
        pytest.param(_head_with_fields(MAX_HEADERS + 1), f"more than {MAX_HEADERS} header fields", id="fields-over"),
        pytest.param(_head_with_target(MAX_URL_BYTES), None, id="target-at-the-cap"),
        pytest.param(_head_with_target(MAX_URL_BYTES + 1), "the request line is too long", id="target-over"),
        pytest.param(b"\r\n" * (MAX_HEAD_BYTES // 2 + 1), "the request head is too large", id="endless-empty-lines"),
    ],
)
@pytest.mark.parametrize("reads", [1, 2, 3, 977], ids=lambda reads: f"{reads}-reads")
def test_the_head_caps_count_raw_bytes_whole_or_split(head: bytes, message: str | None, reads: int) -> None:
    size = -(-len(head) // reads)
    events = events_of(head, size)
    if message is None:
        assert isinstance(events[0], RequestHead)
        assert isinstance(events[-1], RequestEnd)
        return
    refusal = events[-1]
    assert isinstance(refusal, Refusal)
    assert (refusal.error.code, refusal.error.status_on("proxy"), refusal.error.message) == (
        ErrorCode.TOO_LARGE,
        431,
        message,
    )


CHUNKED_HEAD = b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "trailers",
    [
        pytest.param(b"X: v\r\n" * 20000 + b"\r\n", id="many-lines"),
        pytest.param(b"X: " + b"v" * 70000, id="a-line-that-never-ends"),
    ],
)
@pytest.mark.parametrize("read_size", [1000, 65536], ids=["small-reads", "one-read"])
def test_trailers_are_bounded_on_raw_bytes(trailers: bytes, read_size: int) -> None:
    events = events_of(CHUNKED_HEAD + b"1\r\na\r\n0\r\n" + trailers, read_size)
    refusal = events[-1]
    assert isinstance(refusal, Refusal)
    assert (refusal.error.status_on("proxy"), refusal.error.message) == (431, "the request trailers are too large")


def _chunked_body(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randrange(4)):
        data = bytes(rng.choice(b"a0;\r\n") for _ in range(rng.randrange(1, 40)))
        extension = rng.choice([b"", b";a", b';a="b;c"', b";a=b;c"])
        parts.append(b"%x%b\r\n%b\r\n" % (len(data), extension, data))
    last = rng.choice([b"0", b"000", b"0;e"])
    trailers = b"".join(rng.choice([b"X-T: 1\r\n", b"Y:2\r\n"]) for _ in range(rng.randrange(3)))
    return b"".join(parts) + last + b"\r\n" + trailers + b"\r\n"


def test_a_chunked_body_ends_where_llhttp_ends_it_in_seeded_random_bodies() -> None:
    rng = random.Random(17)
    for _ in range(300):
        body = _chunked_body(rng)
        events = events_of(CHUNKED_HEAD + body + SIX_FIELDS, rng.choice([1, 3, 17, 65536]))
        assert [type(event) for event in events if not isinstance(event, RequestBody)] == [
            RequestHead,
            RequestEnd,
            RequestHead,
            RequestEnd,
        ], body
        finder = ChunkedBodyEnd()
        assert finder.end_in(body + b"GET") == len(body)


def test_a_body_end_llhttp_does_not_agree_with_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Never for framing llhttp accepts; if the finder were wrong, the stream is out of sync.
    class Early(ChunkedBodyEnd):
        def end_in(self, data: bytes) -> int:
            return 1

    monkeypatch.setattr(request_framing, "ChunkedBodyEnd", Early)
    refusal = events_of(CHUNKED_HEAD + b"3\r\nabc\r\n0\r\n\r\n")[-1]
    assert isinstance(refusal, Refusal)
    assert refusal.error.message == OUT_OF_STEP


FIELD_LINES = [
    b"Host: a",
    b"HOST:b",
    b"User-Agent: agent/1.0",
    b"Accept: */*",
    b"X:1",
    b"X:  1",
    b"X:\t1",
    b"X: 1 ",
    b"X: ",
    b"X:",
    b"Content-Length:3",
    b"Connection: keep-alive",
    b"connection:close",
    b"Connection: x-hop, Keep-Alive",
    b"Connection: proxy-foo",
    b"Connection: close",
    b"close: 1",
    b"X-Hop: 1",
    b"Proxy-Connection: keep-alive",
    b"Proxy-Foo: z",
    b"proxy-authorization: Bearer t",
    b"Keep-Alive: 300",
    b"TE: trailers",
    b"Trailer: X",
    b"Upgrade: h2c",
    b"Hostname: q",
    b"Tea: 1",
    b"Cookie: a=b",
]


def test_the_forwarded_lines_cut_from_the_raw_head_are_the_ones_built_field_by_field() -> None:
    rng = random.Random(5)
    for _ in range(400):
        lines = rng.sample(FIELD_LINES, rng.randrange(len(FIELD_LINES) // 2))
        head = b"GET http://a/ HTTP/1.1\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n"
        fields = request_fields(head)
        if sum(name.lower() == b"proxy-authorization" for name, _ in fields) > 1:
            continue
        named = named_by_connection([value for name, value in fields if name.lower() == b"connection"])
        read = read_field_block(head.partition(b"\r\n")[2], len(head), HeadMemos())
        assert read.named == named
        assert read.lines == forwarded_lines(fields, named, HeadMemos()), head


def test_a_remembered_field_block_still_counts_toward_its_heads_size() -> None:
    # The block is read once and remembered; the next head with it is over the cap only through
    # the empty lines before it, which the block's reading never saw.
    head = b"GET http://a/ HTTP/1.1\r\nX-Pad: " + b"p" * 600 + b"\r\n\r\n"
    assert isinstance(events_of(head)[0], RequestHead)
    empty_lines = b"\r\n" * ((MAX_HEAD_BYTES - len(head)) // 2 + 1)
    refusal = events_of(empty_lines + head)[-1]
    assert isinstance(refusal, Refusal)
    assert (refusal.error.status_on("proxy"), refusal.error.message) == (431, "the request head is too large")


def _refusal_message(stream: bytes, read_size: int = 65536) -> str:
    refusal = events_of(stream, read_size)[-1]
    assert isinstance(refusal, Refusal), refusal
    return refusal.error.message


TWO_CREDENTIALS = b"Proxy-Authorization: a\r\nProxy-Authorization: b\r\n"


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\n" + TWO_CREDENTIALS + b"Y: 1\r\nX :bad\r\n\r\n",
            "two Proxy-Authorization fields",
            id="broken-field-then-bad-grammar",
        ),
        pytest.param(
            # The second credential is handed over as the next name ends, which llhttp refuses.
            b"GET http://a/ HTTP/1.1\r\n" + TWO_CREDENTIALS + b"X :bad\r\n\r\n",
            "malformed request: Invalid header token",
            id="broken-field-then-bad-name",
        ),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\nX :bad\r\n" + TWO_CREDENTIALS + b"\r\n",
            "malformed request: Invalid header token",
            id="bad-grammar-then-broken-field",
        ),
        pytest.param(
            _head_with_target(MAX_URL_BYTES + 1).replace(b"HTTP/1.1", b"HTTP/1.2"),
            "the request line is too long",
            id="long-target-then-bad-version",
        ),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\n" + TWO_CREDENTIALS + b"X: v\r\n" * MAX_HEADERS + b"\r\n",
            "two Proxy-Authorization fields",
            id="broken-field-then-too-many-fields",
        ),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\n" + b"X: v\r\n" * MAX_HEADERS + TWO_CREDENTIALS + b"\r\n",
            f"more than {MAX_HEADERS} header fields",
            id="too-many-fields-then-broken-field",
        ),
    ],
)
@pytest.mark.parametrize("read_size", [7, 65536], ids=["small-reads", "one-read"])
def test_of_two_faults_in_a_head_the_first_in_the_stream_is_refused(
    stream: bytes, message: str, read_size: int
) -> None:
    assert _refusal_message(stream, read_size) == message


def test_a_broken_field_is_refused_once_the_next_line_begins_not_when_the_head_ends() -> None:
    framing = RequestFraming(RequestHead, HeadMemos())
    assert framing.feed(b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n") == []
    refusal = framing.feed(b"X")[-1]
    assert isinstance(refusal, Refusal)
    assert refusal.error.message == "only one Transfer-Encoding: chunked is accepted"


def test_more_fields_than_the_cap_in_a_head_not_whole_are_refused_as_the_next_begins() -> None:
    framing = RequestFraming(RequestHead, HeadMemos())
    assert framing.feed(_head_with_fields(MAX_HEADERS + 1)[:-2]) == []
    refusal = framing.feed(b"X")[-1]
    assert isinstance(refusal, Refusal)
    assert refusal.error.message == f"more than {MAX_HEADERS} header fields"


def test_an_http2_preface_with_a_long_target_is_held_to_the_target_cap() -> None:
    # llhttp reads `PRI` without a head event; the target's cap holds all the same.
    head = _head_with_target(MAX_URL_BYTES + 1).replace(b"GET ", b"PRI ")
    assert _refusal_message(b"\r\n" + head) == "the request line is too long"


def test_trailers_over_the_cap_are_refused_even_when_the_request_asked_to_close() -> None:
    stream = (
        b"POST http://a/ HTTP/1.1\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\na\r\n0\r\n" + b"X: v\r\n" * 20000 + b"\r\n"
    )
    assert _refusal_message(stream) == "the request trailers are too large"


def test_after_an_http2_preface_llhttps_refusal_stands() -> None:
    # llhttp expects the preface's `SM` next: a request there is refused as llhttp says, whatever
    # it holds (the proxy's own checks see it as a head of its own, which it is not).
    stream = b"PRI http://a/ HTTP/1.1\r\n\r\nGET http://a/ HTTP/1.1\r\n" + TWO_CREDENTIALS + b"\r\n"
    assert _refusal_message(stream) == "malformed request: Expected HTTP/2 Connection Preface"
