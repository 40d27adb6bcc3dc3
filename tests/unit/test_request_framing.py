"""The request half of the proxy without sockets: one named case per RFC 9112 rule it follows.

`RequestFraming` takes client bytes and returns request events; each case checks the events a
request (or a pipeline) produces, in reads of several sizes where the split matters.
"""

from __future__ import annotations

import gc
import re

import httptools
import pytest

from gateway.errors import ErrorCode
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.request_framing import (
    CONTROL_IN_LINE,
    ConnectHead,
    Refusal,
    RequestBody,
    RequestEnd,
    RequestFraming,
)
from tests.harness.request_events import RequestEvent, RequestHead, events_of

GET = b"GET http://a.example.org/ HTTP/1.1\r\nHost: a.example.org\r\n\r\n"


def body_of(events: list[RequestEvent]) -> bytes:
    return b"".join(event.data for event in events if isinstance(event, RequestBody))


def refusal_of(data: bytes) -> Refusal:
    events = events_of(data)
    assert isinstance(events[-1], Refusal), events
    return events[-1]


@pytest.mark.parametrize("read_size", [1, 5, 65536], ids=["bytewise", "small-reads", "one-read"])
def test_a_request_head_then_its_end_s3(read_size: int) -> None:
    events = events_of(GET, read_size)
    assert len(events) == 2
    head, end = events
    assert isinstance(head, RequestHead)
    assert (head.method, head.url, head.keep_alive, head.http10) == (b"GET", b"http://a.example.org/", True, False)
    assert isinstance(end, RequestEnd)


@pytest.mark.parametrize("read_size", [1, 65536], ids=["bytewise", "one-read"])
def test_content_length_frames_the_body_s6_3_rule6(read_size: int) -> None:
    events = events_of(b"POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", read_size)
    assert body_of(events) == b"abc"
    assert isinstance(events[-1], RequestEnd)


def test_chunked_body_is_decoded_and_trailers_are_dropped_s7_1_and_s7_1_2() -> None:
    events = events_of(b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n")
    head = events[0]
    assert isinstance(head, RequestHead)
    assert head.chunked
    assert body_of(events) == b"abc"
    assert b"X-T" not in head.client_head
    assert b"X-T" not in head.fields
    assert isinstance(events[-1], RequestEnd)


def test_pipelined_requests_come_out_in_order_s9_3_2() -> None:
    events = events_of(GET + b"GET http://b.example.org/ HTTP/1.1\r\nHost: b\r\n\r\n")
    heads = [event.url for event in events if isinstance(event, RequestHead)]
    assert heads == [b"http://a.example.org/", b"http://b.example.org/"]


def test_after_a_request_that_asks_to_close_further_bytes_are_dropped_not_refused_s9_6() -> None:
    events = events_of(b"GET http://a/ HTTP/1.1\r\nConnection: close\r\n\r\n" + GET)
    assert [type(event) for event in events] == [RequestHead, RequestEnd]
    head = events[0]
    assert isinstance(head, RequestHead)
    assert not head.keep_alive


def test_an_http10_request_does_not_keep_alive_by_default_s9_3() -> None:
    head = events_of(b"GET http://a/ HTTP/1.0\r\n\r\n")[0]
    assert isinstance(head, RequestHead)
    assert (head.http10, head.keep_alive) == (True, False)


def test_connect_hands_the_rest_of_the_read_to_the_tunnel_s9110_9_3_6() -> None:
    events = events_of(b"CONNECT a.example.org:443 HTTP/1.1\r\nProxy-Authorization: Bearer t\r\n\r\n\x16\x03\x01")
    assert events == [ConnectHead(b"a.example.org:443", b"Bearer t", b"\x16\x03\x01")]


def test_the_fields_connection_names_are_not_forwarded_s9110_7_6_1() -> None:
    head = events_of(
        b"GET http://a/ HTTP/1.1\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nAccept: */*\r\n"
        b"Keep-Alive: timeout=5\r\n\r\n"
    )[0]
    assert isinstance(head, RequestHead)
    assert head.fields == b"\r\nAccept: */*"


@pytest.mark.parametrize(
    ("data", "code", "status"),
    [
        pytest.param(
            b"POST http://a/ HTTP/1.1\r\nConnection: content-length\r\nContent-Length: 1\r\n\r\nx",
            ErrorCode.INVALID_INPUT,
            400,
            id="connection-names-content-length",
        ),
        pytest.param(
            b"POST http://a/ HTTP/1.1\r\nConnection: Transfer-Encoding\r\nTransfer-Encoding: chunked\r\n\r\n",
            ErrorCode.INVALID_INPUT,
            400,
            id="connection-names-transfer-encoding",
        ),
        pytest.param(
            b"POST http://a/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            ErrorCode.INVALID_INPUT,
            400,
            id="content-length-and-chunked-s6_3_rule3",
        ),
        pytest.param(
            b"POST http://a/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            ErrorCode.INVALID_INPUT,
            400,
            id="duplicate-content-length-s6_3_rule5",
        ),
        pytest.param(
            b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            ErrorCode.INVALID_INPUT,
            400,
            id="coding-other-than-chunked-s6_1",
        ),
        pytest.param(b"GET http://a/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n", ErrorCode.INVALID_INPUT, 400, id="obs-fold-s5_2"),
        pytest.param(b"GET http://a/ HTTP/1.1\nX: a\n\n", ErrorCode.INVALID_INPUT, 400, id="bare-lf-s2_2"),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\nProxy-Authorization: a\r\nProxy-Authorization: b\r\n\r\n",
            ErrorCode.INVALID_INPUT,
            400,
            id="two-proxy-authorizations",
        ),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            ErrorCode.INVALID_INPUT,
            400,
            id="protocol-upgrade",
        ),
        pytest.param(b"GET http://a/" + b"p" * 9000 + b" HTTP/1.1\r\n\r\n", ErrorCode.TOO_LARGE, 431, id="long-url"),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\n" + b"X: v\r\n" * 101 + b"\r\n", ErrorCode.TOO_LARGE, 431, id="too-many-fields"
        ),
        pytest.param(
            b"GET http://a/ HTTP/1.1\r\nX: " + b"v" * 70000, ErrorCode.TOO_LARGE, 431, id="endless-header-line"
        ),
        pytest.param(
            b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"X: v\r\n" * 20000,
            ErrorCode.TOO_LARGE,
            431,
            id="huge-trailers",
        ),
    ],
)
def test_a_request_the_proxy_will_not_frame_is_refused(data: bytes, code: ErrorCode, status: int) -> None:
    refusal = refusal_of(data)
    assert (refusal.error.code, refusal.error.status_on("proxy")) == (code, status)


def test_nothing_is_parsed_after_a_refusal() -> None:
    framing = RequestFraming(RequestHead, HeadMemos())
    assert isinstance(framing.feed(b"GET http://a/ HTTP/1.1\nX: a\n\n")[-1], Refusal)
    assert framing.feed(GET) == []


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"CONNECT docs.example.org:443 HTTP/1.1\r\nHost: docs.example.org:443\r\n\r\n", id="connect"),
        pytest.param(b"GET http://docs.example.org/ HTTP/1.1\r\nConnection: close\r\n\r\n", id="asked-to-close"),
        pytest.param(
            b"GET http://docs.example.org/ HTTP/1.1\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n", id="upgrade"
        ),
        pytest.param(b"BREW / HTTP/1.1\r\n\r\n", id="malformed"),
    ],
)
@pytest.mark.slow  # a full collection of the heap per case: left out of make test-fast
def test_a_framing_done_parsing_leaves_no_reference_cycle(data: bytes) -> None:
    # The parser holds the framing's callbacks: once nothing more is parsed, the framing lets go of
    # it, so a tunnel's or a refused connection's framing is freed without the garbage collector.
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        framing = RequestFraming(RequestHead, HeadMemos())
        framing.feed(data)
        assert framing.done
        del framing
        gc.collect()
        left = [item for item in gc.garbage if isinstance(item, RequestFraming)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


@pytest.mark.parametrize(
    "version_and_fields",
    [
        b"HTTP/1.1\r\n",
        b"HTTP/1.1\r\nConnection: close\r\n",
        b"HTTP/1.1\r\nConnection: keep-alive\r\n",
        b"HTTP/1.1\r\nProxy-Connection: close\r\n",
        b"HTTP/1.0\r\n",
        b"HTTP/1.0\r\nConnection: keep-alive\r\n",
        b"HTTP/1.0\r\nConnection: Keep-Alive, x-a\r\nX-A: 1\r\n",
        b"HTTP/1.0\r\nProxy-Connection: keep-alive\r\n",
        b"HTTP/1.0\r\nPROXY-CONNECTION: Keep-Alive\r\n",
        b"HTTP/1.0\r\nKeep-Alive: 1\r\n",
        b"HTTP/2.0\r\n",
        b"HTTP/0.9\r\n",
    ],
)
def test_http10_and_keep_alive_are_what_llhttp_reads_s9_3(version_and_fields: bytes) -> None:
    # The framing infers HTTP/1.1 from a kept-alive request with no Connection or Proxy-Connection
    # field instead of asking for the version: both must agree with llhttp's own answers (for a
    # second, pipelined head too, after the first one's fields).
    request = b"GET http://a.example.org/ " + version_and_fields + b"Host: a.example.org\r\n\r\n"

    class Answers:
        version = ""
        keep_alive = False

        def on_headers_complete(self) -> None:
            self.version, self.keep_alive = parser.get_http_version(), parser.should_keep_alive()

    answers = Answers()
    parser = httptools.HttpRequestParser(answers)
    parser.feed_data(request)
    heads = [event for event in events_of(request + request) if isinstance(event, RequestHead)]
    assert heads
    assert all((head.http10, head.keep_alive) == (answers.version == "1.0", answers.keep_alive) for head in heads)


@pytest.mark.parametrize("connection", [b"Connection", b"Proxy-Connection"])
@pytest.mark.parametrize("body", [b"", b"Content-Length: 3\r\n"], ids=["bodiless", "with-length"])
def test_an_upgrade_request_is_refused_at_its_head_without_a_head_event(connection: bytes, body: bytes) -> None:
    # A head event would start the exchange before the refusal: on a pooled upstream the origin
    # would see a request the proxy refuses. Pipelined behind a GET, only the GET comes out.
    upgrade = b"GET http://a/ HTTP/1.1\r\nUpgrade: websocket\r\n%b: upgrade\r\n%b\r\nabc" % (connection, body)
    events = events_of(GET + upgrade)
    assert [type(event) for event in events] == [RequestHead, RequestEnd, Refusal], events
    refusal = events[-1]
    assert isinstance(refusal, Refusal)
    assert refusal.error.code == ErrorCode.INVALID_INPUT
    assert "upgrades are not proxied" in refusal.error.message


_CONTROL_BYTE = re.compile(rb"[\x00-\x1f\x7f]")
# Where a byte goes in the request line: llhttp refuses most control bytes itself; a bare LF
# right after the scheme it takes as the line's end, which only the framing's own check refuses.
_LINES = (
    b"GET http://%ba:.example.org/ HTTP/1.1",
    b"GET http://a.ex%bample.org/x HTTP/1.1",
    b"GET http://a.example.org/x%by HTTP/1.1",
    b"GET http://a.example.org/ HTTP/1.1%b",
)


@pytest.mark.parametrize("template", _LINES, ids=["after-scheme", "host", "path", "after-version"])
def test_a_control_byte_in_the_request_line_is_refused_as_a_regex_finds_it(template: bytes) -> None:
    # The framing finds a control byte with `bytes.translate` (one C pass) where the plain reading
    # is a regex search: for every byte value, a line the regex flags is refused (by llhttp or by
    # the framing), and the framing's refusal names a control byte only where the regex finds one.
    for byte in range(256):
        line = template % bytes([byte])
        events = events_of(line + b"\r\nHost: a.example.org\r\n\r\n")
        refused_as_control = isinstance(events[-1], Refusal) and events[-1].error.message == CONTROL_IN_LINE
        if _CONTROL_BYTE.search(line) is None:
            assert not refused_as_control, (byte, events)
        else:
            assert isinstance(events[-1], Refusal), (byte, events)


def test_the_framing_itself_refuses_the_bare_lf_llhttp_takes_as_a_line_end() -> None:
    # The h11 divergence (bb9944d): without the framing's check this line would be framed.
    events = events_of(b"GET http://\na:.example.org/ HTTP/1.1\r\nHost: a.example.org\r\n\r\n")
    assert isinstance(events[-1], Refusal)
    assert events[-1].error.message == CONTROL_IN_LINE
