"""The response half of the proxy without sockets: one named case per RFC 9112 rule it follows.

`ResponseFraming` takes upstream bytes and gives the bytes owed to the client plus the facts the
connection acts on (complete, reusable, close the client). Each case feeds a response in reads
of several sizes, so a rule holds wherever the reads split the stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httptools
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.http1.head_memos import HeadMemos
from gateway.proxy.http1.heads import HOP_BY_HOP
from gateway.proxy.http1.response_fields import BodyEnd, _read_line_by_line, read_head
from gateway.proxy.http1.response_framing import ResponseFraming
from gateway.proxy.http1.response_head import MAX_INTERIM_RESPONSES, MAX_RESPONSE_HEAD_BYTES, MAX_RESPONSE_HEADERS


class _NoCallbacks:
    """An httptools protocol with no callbacks: llhttp's own verdict."""


@dataclass(frozen=True)
class Relayed:
    output: bytes
    complete: bool
    reusable: bool
    close_client: bool


def relay(
    response: bytes,
    *,
    head_only: bool = False,
    http10: bool = False,
    close_client: bool = False,
    read_size: int = 7,
    upstream_closes: bool = False,
) -> Relayed:
    framing = ResponseFraming(
        HeadMemos(), head_only=head_only, client_http10=http10, close_client=close_client or http10
    )
    output = b""
    for start in range(0, len(response), read_size):
        output += framing.feed(response[start : start + read_size])
        assert framing.take_output() == b""  # `feed` returned all it owed
    if upstream_closes:
        framing.end_of_stream()
        output += framing.take_output()
    return Relayed(output, framing.complete, framing.reusable, framing.close_client)


def dechunk(body: bytes) -> bytes:
    decoded = b""
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert body == b"\r\n"
            return decoded
        decoded, body = decoded + body[:size], body[size + 2 :]


def _feed_in_reads(framing: ResponseFraming, response: bytes) -> None:
    for start in range(0, len(response), 65536):
        framing.feed(response[start : start + 65536])


def refused(response: bytes) -> GatewayError:
    framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False)
    with pytest.raises(GatewayError) as caught:
        _feed_in_reads(framing, response)
    assert not framing.reusable
    return caught.value


READ_SIZES = pytest.mark.parametrize("read_size", [1, 7, 65536], ids=["bytewise", "small-reads", "one-read"])


@READ_SIZES
def test_content_length_body_is_relayed_as_framed_s6_3_rule5(read_size: int) -> None:
    result = relay(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", read_size=read_size)
    assert result.output == b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    assert (result.complete, result.reusable) == (True, True)


@READ_SIZES
def test_chunked_body_is_decoded_and_rechunked_s7_1(read_size: int) -> None:
    result = relay(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\n\r\n", read_size=read_size
    )
    head, _, body = result.output.partition(b"\r\n\r\n")
    assert head == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"
    assert dechunk(body) == b"hello"  # one chunk per read: the extension is not relayed
    assert result.complete


def test_close_delimited_body_is_rechunked_for_an_http11_client_and_ends_at_close_s6_3_rule8() -> None:
    result = relay(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc", upstream_closes=True)
    assert result.output == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    assert result.complete
    assert not result.reusable


def test_close_delimited_body_goes_to_an_http10_client_as_is_with_connection_close_s6_3_rule8() -> None:
    result = relay(b"HTTP/1.1 200 OK\r\n\r\nabc", http10=True, upstream_closes=True)
    assert result.output == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc"
    assert result.close_client


def test_a_close_delimited_body_cut_before_the_head_is_not_complete() -> None:
    framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False)
    framing.feed(b"HTTP/1.1 200 OK\r\n")
    assert framing.end_of_stream() is False
    assert not framing.complete


def test_response_to_head_has_no_body_whatever_its_content_length_s6_3_rule1() -> None:
    result = relay(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n", head_only=True)
    assert result.output == b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n"
    assert result.complete


@pytest.mark.parametrize("status", [204, 304])
def test_204_and_304_have_no_body_s6_3_rule1(status: int) -> None:
    result = relay(b"HTTP/1.1 %d X\r\n\r\n" % status)
    assert result.output == b"HTTP/1.1 %d X\r\n\r\n" % status
    assert result.complete


def test_interim_responses_are_relayed_to_an_http11_client_before_the_final_one_s9110_15_2() -> None:
    result = relay(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert result.output == b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_interim_responses_are_never_sent_to_an_http10_client_s9110_15_2() -> None:
    result = relay(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", http10=True)
    assert result.output == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def test_hop_by_hop_fields_and_those_connection_names_are_removed_s9110_7_6_1() -> None:
    result = relay(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\n"
        b"Proxy-Authenticate: Basic\r\nUpgrade: h2c\r\nTrailer: X-T\r\nX-End: 1\r\nContent-Length: 0\r\n\r\n"
    )
    assert result.output == b"HTTP/1.1 200 OK\r\nX-End: 1\r\nContent-Length: 0\r\n\r\n"


def test_the_client_asked_to_close_so_the_final_head_says_so_s9_6() -> None:
    result = relay(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", close_client=True)
    assert result.output == b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", id="connection-close"),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", id="http10-without-keep-alive"),
    ],
)
def test_an_upstream_that_will_close_is_not_reused_s9_3(response: bytes) -> None:
    assert not relay(response).reusable


def test_trailer_fields_are_dropped_never_merged_into_the_head_s7_1_2() -> None:
    result = relay(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-Late: 1\r\n\r\n")
    assert b"X-Late" not in result.output
    assert result.complete


@READ_SIZES
def test_bytes_after_the_complete_response_are_never_relayed_s9_1(read_size: int) -> None:
    injected = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"
    result = relay(injected, read_size=read_size)
    assert result.output == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert result.complete
    assert not result.reusable


@pytest.mark.parametrize(
    ("response", "code"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: content-length\r\n\r\nok",
            ErrorCode.CONNECT_FAILURE,
            id="connection-names-content-length",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: Transfer-Encoding\r\n\r\n0\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="connection-names-transfer-encoding",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: transfer-encoding\r\n\r\nok",
            ErrorCode.CONNECT_FAILURE,
            id="only-line-of-note-names-transfer-encoding",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n"
            b"cOnNeCtIoN: X-A, Content-LENGTH\r\n\r\nok",
            ErrorCode.CONNECT_FAILURE,
            id="second-connection-field-names-content-length-any-case",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection:content-length\r\n\r\nok",
            ErrorCode.CONNECT_FAILURE,
            id="connection-without-space-names-content-length",
        ),
        pytest.param(
            b"HTTP/1.1 103 Early Hints\r\nConnection: transfer-encoding\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="interim-connection-names-transfer-encoding",
        ),
        pytest.param(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", ErrorCode.CONNECT_FAILURE, id="unsolicited-101"
        ),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="101-after-100",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-A : 1\r\n\r\n", ErrorCode.CONNECT_FAILURE, id="space-before-colon"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n", ErrorCode.CONNECT_FAILURE, id="nul-in-a-value"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="content-length-and-chunked-s6_3_rule3",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="conflicting-content-lengths-s6_3_rule5",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n", ErrorCode.CONNECT_FAILURE, id="obs-fold-s5_2"),
        pytest.param(b"HTTP/1.1 200 OK\nX: a\n\n", ErrorCode.CONNECT_FAILURE, id="bare-lf-line-ends-s2_2"),
        pytest.param(
            b"HTTP/1.1 200 OK\nX: a\n\nbody\r\n\r\n", ErrorCode.CONNECT_FAILURE, id="bare-lf-head-before-a-crlf-crlf"
        ),
        pytest.param(
            b"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="bare-lf-interim-head",
        ),
        pytest.param(
            b"HTTP/1.1 200 O\x01K\r\nContent-Length: 2\r\n\r\nok", ErrorCode.CONNECT_FAILURE, id="soh-in-the-reason"
        ),
        pytest.param(b"HTTP/1.0 404 \x7f\r\n\r\n", ErrorCode.CONNECT_FAILURE, id="del-in-an-http10-reason"),
        pytest.param(
            b"\r\nHTTP/1.1 200 \x1b[2J\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="esc-in-the-reason-after-an-empty-line",
        ),
        pytest.param(
            b"HTTP/1.1 103 Hints\x00\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ErrorCode.CONNECT_FAILURE,
            id="nul-in-an-interim-reason",
        ),
        pytest.param(b"HTTP/1.1 200 " + b"R" * 70000, ErrorCode.TOO_LARGE, id="endless-reason-phrase"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + b"t" * 200000,
            ErrorCode.TOO_LARGE,
            id="endless-trailer",
        ),
    ],
)
def test_a_response_the_proxy_cannot_relay_as_framed_is_an_error_never_a_parser_exception(
    response: bytes, code: ErrorCode
) -> None:
    error = refused(response)
    assert error.code == code
    assert "RRRR" not in error.message
    assert "tttt" not in error.message


@pytest.mark.parametrize("control", [b"\x00", b"\x01", b"\x08", b"\x0b", b"\x1b", b"\x1f", b"\x7f"])
def test_llhttp_accepts_a_control_byte_in_a_reason_phrase_that_the_framing_refuses(control: bytes) -> None:
    """httptools' llhttp (strict) lets any byte but CR and LF into a reason phrase; RFC 9112
    section 4 allows HTAB, SP, VCHAR and obs-text only, and h11 refuses the rest. Worked around
    in `ResponseFraming`: such a head is a malformed upstream response, never relayed."""
    response = b"HTTP/1.1 200 O" + control + b"K\r\nContent-Length: 0\r\n\r\n"
    httptools.HttpResponseParser(_NoCallbacks()).feed_data(response)  # no error: llhttp accepts it
    assert refused(response).code == ErrorCode.CONNECT_FAILURE


def test_a_reason_phrase_with_tabs_and_obs_text_is_relayed_as_sent() -> None:
    response = b"HTTP/1.1 200 O\tK \xe9t\xe9\r\nContent-Length: 0\r\n\r\n"
    assert relay(response).output.startswith(b"HTTP/1.1 200 O\tK \xe9t\xe9\r\n")


def test_the_final_head_names_the_gateways_id_and_never_the_origins() -> None:
    framing = ResponseFraming(
        HeadMemos(), head_only=False, client_http10=False, close_client=False, id_field=b"X-Egress-Id: c-1\r\n"
    )
    interim, final = framing.feed(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nX-Egress-Id: forged\r\nContent-Length: 2\r\n\r\nno"
    ).split(b"\r\n\r\n", 1)
    assert b"X-Egress-Id" not in interim
    assert final.count(b"X-Egress-Id") == 1
    assert b"X-Egress-Id: c-1\r\n" in final
    assert b"forged" not in final
    assert framing.status == 404


def _head_field_by_field(head: bytes, id_field: bytes) -> bytes:
    """The relayed head built the plain way, one httptools `on_header` call per field: the
    reference the whole-head reading in `ResponseFraming` must match byte for byte."""

    class Fields:
        def __init__(self) -> None:
            self.fields: list[tuple[bytes, bytes]] = []
            self.reason = b""

        def on_status(self, reason: bytes) -> None:
            self.reason += reason

        def on_header(self, name: bytes, value: bytes) -> None:
            self.fields.append((name, value))

    seen = Fields()
    parser = httptools.HttpResponseParser(seen)
    parser.feed_data(head)
    connection = [value for name, value in seen.fields if name.lower() == b"connection"]
    named = {token.strip().lower() for value in connection for token in value.split(b",")}
    lines = [b"HTTP/1.1 %d %b\r\n" % (parser.get_status_code(), seen.reason)]
    for name, value in seen.fields:
        lowered = name.lower()
        if lowered in HOP_BY_HOP or lowered in named or lowered.startswith(b"proxy-"):
            continue
        if lowered == b"x-egress-id" and id_field:
            continue
        lines.append(name + b": " + value + b"\r\n")
    if parser.get_status_code() >= 200:
        lines.append(id_field)
    return b"".join(lines) + b"\r\n"


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(b"X-A: 1\r\n", id="plain"),
        pytest.param(b"X-A:\t\t1\r\nX-B:1\r\nX-C:   1\r\n", id="leading-whitespace-dropped"),
        pytest.param(b"X-A: 1 \t \r\n", id="trailing-whitespace-kept"),
        pytest.param(b"X-A:\r\nX-B: \r\n", id="empty-values"),
        pytest.param(b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\n", id="repeated-field-kept-twice"),
        pytest.param(b"Date: Tue, 01 Dec 2026 16:04:45 GMT\r\nX-A: a:b: c\r\n", id="colons-in-values"),
        pytest.param(
            b"CONNECTION: Keep-Alive\r\nkeep-alive: timeout=5\r\nTE: x\r\nTrailer: X-T\r\nUPGRADE: h2c\r\n",
            id="hop-by-hop-any-case",
        ),
        pytest.param(b"Proxy-Authenticate: Basic\r\nproxy-connection: close\r\nPROXY-X: 1\r\n", id="proxy-fields"),
        pytest.param(b"Connectionx: 1\r\nTEx: 1\r\nProxy: 1\r\nX-Proxy-A: 1\r\nx-te: 1\r\n", id="lookalike-names-kept"),
        pytest.param(
            b"Conn: 1\r\nCONNECT: 2\r\nContent-Type: x\r\ncontent-language: y\r\n", id="connection-prefixes-kept"
        ),
        pytest.param(b"X-A:1\r\nConnection: X-B\r\nX-B: 2\r\nTE:\r\n", id="irregular-lines-beside-lines-of-note"),
        pytest.param(
            b"X-Hop: 1\r\nConnection: close, x-hop\r\nconnection: X-Other\r\nX-OTHER: 2\r\n", id="named-fields"
        ),
        pytest.param(b"X-Egress-Id: forged\r\nx-egress-id: forged\r\n", id="origin-egress-id"),
        pytest.param(b"X-eGrEsS-iD: forged\r\nX-A: 1\r\n", id="origin-egress-id-mixed-case"),
        pytest.param(
            b"cOnNeCtIoN: X-Foo\r\nX-FOO: 1\r\nkEeP-aLiVe: 1\r\ntRaIlEr: X\r\nuPgRaDe: h2c\r\ntE: trailers\r\n",
            id="mixed-case-names",
        ),
        pytest.param(b"Connection: close, X-Foo\r\nX-Foo: 1\r\nX-Bar: 2\r\n", id="connection-close-names-a-field"),
        pytest.param(b"Connection: close\r\nClose: 1\r\nX-A: 2\r\n", id="connection-close-names-a-close-field"),
        pytest.param(b"Connection: close\r\nX-Closed: 1\r\n", id="connection-close-and-no-close-field"),
        pytest.param(
            b"Connection: X-A\r\nX-A: 1\r\nX-B: 2\r\nconnection: x-b,  X-C \r\nX-C: 3\r\nX-D: 4\r\n",
            id="several-connection-fields",
        ),
        pytest.param(b"Connection:\r\nConnection: \r\nX-A: 1\r\n", id="empty-connection-values"),
        pytest.param(b"Connection:X-A\r\nX-A: 1\r\nConnection:\t keep-alive\r\n", id="connection-without-space"),
        pytest.param(b"X-A:  two-spaces\r\nX-B: \tspace-tab\r\nX-C:\t\r\nX-D:  \r\n", id="whitespace-only-or-doubled"),
        pytest.param(b"Proxy-: 1\r\nproxy-x-y: 2\r\nPROXY-Authorization: 3\r\nX-A: 4\r\n", id="proxy-any-token"),
        pytest.param(b'X-A: a\x80\xff\tb\r\nX-B: "q: x"\r\n', id="obs-text-and-quoted-colons"),
    ],
)
@pytest.mark.parametrize("id_field", [b"", b"X-Egress-Id: c-1\r\n"], ids=["no-id", "with-id"])
def test_the_relayed_head_is_the_one_built_field_by_field(fields: bytes, id_field: bytes) -> None:
    head = b"HTTP/1.1 200 Fine: yes\r\n" + fields + b"Content-Length: 0\r\n\r\n"
    framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False, id_field=id_field)
    assert framing.feed(head) == _head_field_by_field(head, id_field)


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(b"HTTP/1.0 200 OK\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n", id="http10-status-line"),
        pytest.param(b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", id="no-reason"),
        pytest.param(b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n", id="empty-reason"),
        pytest.param(b"HTTP/1.1 200  two  spaces \r\nContent-Length: 0\r\n\r\n", id="reason-with-spaces"),
        pytest.param(b"HTTP/1.1 200 a:b\r\nX-A:1\r\nContent-Length: 0\r\n\r\n", id="reason-with-a-colon"),
        pytest.param(b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", id="http2-version"),
        pytest.param(b"RTSP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", id="llhttp-accepts-rtsp"),
        # llhttp skips empty lines before a status line (RFC 9112 section 2.2), so the relayed
        # status line is found after them.
        pytest.param(b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", id="empty-line-before"),
        pytest.param(b"\r\n\nHTTP/1.0 404 Gone\r\nContent-Length: 0\r\n\r\n", id="empty-lines-before-http10"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length:0\r\n\r\n", id="content-length-without-space"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ncontent-LENGTH: \t 0 \r\nConnection: keep-alive\r\n\r\n", id="content-length-ows"
        ),
        pytest.param(b"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\nX-A: 1\r\n\r\n", id="no-content"),
        pytest.param(b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n", id="not-modified"),
        pytest.param(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nConnection: keep-alive\r\n\r\n", id="interim-with-fields"
        ),
    ],
)
@pytest.mark.parametrize("id_field", [b"", b"X-Egress-Id: c-1\r\n"], ids=["no-id", "with-id"])
def test_every_status_line_is_relayed_as_http11_with_the_origins_reason(head: bytes, id_field: bytes) -> None:
    framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False, id_field=id_field)
    assert framing.feed(head) == _head_field_by_field(head, id_field)


_NAMES = [b"X-A", b"x-b", b"Server", b"Date", b"Connection", b"CONNECTION", b"Keep-Alive", b"TE", b"te", b"Trailer"]
_NAMES += [b"Upgrade", b"Proxy-Authenticate", b"proxy-x", b"X-Egress-Id", b"x-egress-id", b"Close", b"Connectionx"]
_VALUES = [b"1", b"keep-alive", b"close", b"X-A", b"x-b, close", b"Server", b"", b"a: b", b"16:04:45", b"v \t", b"te"]
_OWS = [b" ", b" ", b" ", b"", b"\t", b"  ", b" \t"]


def test_random_heads_are_relayed_as_built_field_by_field() -> None:
    # Seeded: every run checks the same few hundred heads, mixing the cases above.
    rng = random.Random(17)
    for _ in range(400):
        fields = b"".join(
            rng.choice(_NAMES) + b":" + rng.choice(_OWS) + rng.choice(_VALUES) + b"\r\n"
            for _ in range(rng.randint(0, 8))
        )
        head = b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: 0\r\n\r\n"
        id_field = rng.choice([b"", b"X-Egress-Id: c-1\r\n"])
        framing = ResponseFraming(
            HeadMemos(), head_only=False, client_http10=False, close_client=False, id_field=id_field
        )
        assert framing.feed(head) == _head_field_by_field(head, id_field), head


@pytest.mark.parametrize(
    ("response", "relayed"),
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-A:1\r\nConnection: close\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\nX-Egress-Id: c-1\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            id="no-length-rechunked",
        ),
        pytest.param(
            b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\nX-Egress-Id: c-1\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            id="http10-origin-no-length-rechunked",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: chunked\r\nTrailer: X-T\r\nX-A: 1\r\n\r\n"
            b"3\r\nabc\r\n0\r\nX-T: late\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\nX-Egress-Id: c-1\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            id="chunked-with-trailers",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Egress-Id: c-1\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            id="chunked-last-coding",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\ncontent-length: 3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nX-Egress-Id: c-1\r\n\r\nabc",
            id="keep-alive-with-length",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Egress-Id: c-1\r\n\r\nabc",
            id="close-with-length",
        ),
    ],
)
def test_the_body_is_reframed_from_the_fields_llhttp_framed_it_by(response: bytes, relayed: bytes) -> None:
    framing = ResponseFraming(
        HeadMemos(), head_only=False, client_http10=False, close_client=False, id_field=b"X-Egress-Id: c-1\r\n"
    )
    output = framing.feed(response)
    framing.end_of_stream()
    assert output + framing.take_output() == relayed
    assert framing.complete


def test_a_head_response_keeps_its_framing_fields_and_drops_hop_by_hop_ones() -> None:
    result = relay(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-A\r\nX-A: 1\r\nContent-Length: 500\r\nKeep-Alive: 5\r\n\r\n",
        head_only=True,
    )
    assert result.output == b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n"
    assert result.complete


def test_interim_heads_with_fields_go_to_http11_clients_only() -> None:
    response = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nConnection: X-A\r\nX-A: 1\r\n\r\n"
    response += b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert relay(response).output == (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    assert relay(response, http10=True).output == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def test_the_next_response_on_a_connection_is_framed_as_on_a_fresh_one() -> None:
    responses = [
        (False, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        # A HEAD response: llhttp still waits for the 5 body bytes, so its parser cannot go on.
        (True, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
        (
            False,
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        ),
        (True, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        (False, b"HTTP/1.1 204 No Content\r\n\r\n"),
        (False, b"HTTP/1.1 404 Not Found\r\nX-A: 1\r\nContent-Length: 1\r\n\r\nx"),
    ]
    framing: ResponseFraming | None = None
    for head_only, response in responses:
        if framing is None:
            framing = ResponseFraming(
                HeadMemos(), head_only=head_only, client_http10=False, close_client=False, id_field=b"X: c\r\n"
            )
        else:
            framing = framing.next_response(
                head_only=head_only, client_http10=False, close_client=False, id_field=b"X: c\r\n"
            )
        fresh = ResponseFraming(
            HeadMemos(), head_only=head_only, client_http10=False, close_client=False, id_field=b"X: c\r\n"
        )
        assert (framing.feed(response), framing.complete, framing.reusable, framing.status) == (
            fresh.feed(response),
            fresh.complete,
            fresh.reusable,
            fresh.status,
        )
        assert framing.complete


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n", id="keep-alive"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, TE\r\nX-A: 1\r\n\r\n", id="names-cut-fields"),
        pytest.param(b"HTTP/1.1 404 Not Found\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n", id="two-lines-of-note"),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: x-a\r\nX-A: 1\r\nX-B: 2\r\n\r\n", id="names-a-relayed-field"),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: content-length\r\n\r\n", id="names-a-framing-field"),
        pytest.param(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", id="http10-status-line"),
        pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\nClose: 1\r\n\r\n", id="names-close"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: te, transfer-encoding\r\n\r\n", id="names-te"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", id="chunked-twice"),
        pytest.param(b"HTTP/1.1 200 O\x01K\r\nConnection: keep-alive\r\n\r\n", id="control-in-the-reason"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n", id="chunked"),
    ],
)
def test_the_cut_of_a_head_gives_its_line_by_line_reading(head: bytes) -> None:
    """`read_head`'s paths (the one-Connection-line head, the cut by the pattern) against the
    plain reading of every line: the same bytes relayed, the same facts. `read_head` reads the
    head twice with one listener's memos: the one-Connection-line path takes only a remembered
    answer, so the first read takes the general steps and the second that path."""
    for id_field in (b"", b"X-Egress-Id: c-1\r\n"):
        readings: list[tuple[bytes, BodyEnd] | tuple[ErrorCode, str]] = []
        shared = HeadMemos()
        for read, memos in ((read_head, shared), (read_head, shared), (_read_line_by_line_as_read_head, HeadMemos())):
            try:
                pieces, body_end = read(head, int(head[9:12]), id_field, False, memos)
            except GatewayError as refused:
                readings.append((refused.code, refused.message))
            else:
                readings.append((b"".join(pieces), body_end))
        assert readings[0] == readings[1] == readings[2]


def _read_line_by_line_as_read_head(
    head: bytes, status: int, id_field: bytes, keep_alive: bool, memos: HeadMemos
) -> tuple[list[bytes], BodyEnd]:
    del keep_alive  # read from the Content-Length line itself
    return _read_line_by_line(head, status, id_field, memos)


def test_remembered_status_lines_keep_each_reason_phrase() -> None:
    # The status line is remembered per (status, reason): a second reason for the same status, or
    # a reason too long to remember, is relayed as sent.
    long_reason = b"R" * 100
    for reason in [b"OK", b"Fine", b"OK", long_reason, long_reason, b""]:
        framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False)
        head = b"HTTP/1.1 200 " + reason + b"\r\nContent-Length: 0\r\n\r\n"
        assert framing.feed(head) == _head_field_by_field(head, b"")


def test_the_head_caps_count_per_response_on_a_reused_framing() -> None:
    # A pooled connection's framing (and its head scanner) serves response after response: each
    # response's heads are counted from zero, so a long-lived connection never reaches a cap that
    # one response alone stays under.
    fields = b"".join(b"X-%d: %s\r\n" % (index, b"v" * 400) for index in range(MAX_RESPONSE_HEADERS - 1))
    response = b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\n" + fields + b"Content-Length: 0\r\n\r\n"
    framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False)
    for _ in range(MAX_INTERIM_RESPONSES + 2):
        framing = framing.next_response(head_only=False, client_http10=False, close_client=False)
        framing.feed(response)
        assert framing.complete
        assert framing.reusable


def _head_of(length: int) -> bytes:
    start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: "
    return start + b"p" * (length - len(start) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "within"),
    [
        pytest.param(_head_of(MAX_RESPONSE_HEAD_BYTES), True, id="bytes-at-the-cap"),
        pytest.param(_head_of(MAX_RESPONSE_HEAD_BYTES + 1), False, id="bytes-past-the-cap"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\n" + b"X: v\r\n" * (MAX_RESPONSE_HEADERS - 1) + b"Content-Length: 2\r\n\r\n",
            True,
            id="fields-at-the-cap",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\n" + b"X: v\r\n" * MAX_RESPONSE_HEADERS + b"Content-Length: 2\r\n\r\n",
            False,
            id="fields-past-the-cap",
        ),
    ],
)
@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused"])
def test_a_whole_final_head_in_the_first_read_meets_the_same_caps(head: bytes, within: bool, reused: bool) -> None:
    # The framing cuts a whole final head at the start of a read itself, without the scanner: the
    # caps hold as the scanner counts them, on a fresh framing and on a reused one.
    framing = ResponseFraming(HeadMemos(), head_only=False, client_http10=False, close_client=False)
    if reused:
        framing.feed(b"HTTP/1.1 204 No Content\r\n\r\n")
        framing = framing.next_response(head_only=False, client_http10=False, close_client=False)
    if within:
        assert framing.feed(head + b"ok") == head + b"ok"
        assert framing.complete
    else:
        with pytest.raises(GatewayError) as caught:
            framing.feed(head + b"ok")
        assert caught.value.code == ErrorCode.TOO_LARGE
        assert framing.take_output() == b""
