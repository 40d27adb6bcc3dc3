"""Pure proxy head handling: credentials, CONNECT authorities, absolute targets, header rewriting."""

from __future__ import annotations

import base64

import orjson
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.proxy.forward.exchange import build_request_head
from gateway.proxy.http1.heads import (
    connection_tokens,
    error_response,
    parse_connect_authority,
    parse_proxy_authorization,
    proxy_status,
    split_absolute_target,
)
from gateway.proxy.http1.request_head import forwarded_lines
from gateway.proxy.tls.sni import ClientHelloPeek, PeekStatus
from gateway.proxy.tunnel.splice import sni_verdict


def b64(text: str) -> bytes:
    return base64.b64encode(text.encode())


@pytest.mark.parametrize(
    ("value", "user", "token"),
    [
        (None, None, None),
        (b"Basic " + b64("agent:tok"), "agent", "tok"),
        (b"basic " + b64(":tok"), None, "tok"),
        (b"Bearer tok", None, "tok"),
        (b"Basic " + b64("agent:to:ken"), "agent", "to:ken"),
    ],
    ids=["absent", "basic", "basic-no-user", "bearer", "colon-in-token"],
)
def test_proxy_authorization_yields_user_and_token(value: bytes | None, user: str | None, token: str | None) -> None:
    credential = parse_proxy_authorization(value)
    assert (credential.user, credential.token) == (user, token)


@pytest.mark.parametrize(
    "value",
    [b"Basic !!!", b"Basic " + b64("agent"), b"Basic " + b64("agent:"), b"Digest abc", b"Bearer", b"Basic"],
    ids=["bad-base64", "no-colon", "empty-token", "digest", "bearer-empty", "basic-empty"],
)
def test_malformed_proxy_authorization_is_auth_required(value: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_proxy_authorization(value)
    assert caught.value.code == ErrorCode.AUTH_REQUIRED


def test_a_malformed_credential_is_never_echoed() -> None:
    value = b"Basic " + b64("sup3rs3cretvalue")
    with pytest.raises(GatewayError) as caught:
        parse_proxy_authorization(value)
    assert "sup3rs3cret" not in caught.value.message
    assert b64("sup3rs3cretvalue").decode() not in caught.value.message


@pytest.mark.parametrize(
    ("raw", "host", "port"),
    [
        (b"docs.example.org:443", "docs.example.org", 443),
        (b"DOCS.Example.ORG:443", "docs.example.org", 443),
        (b"[2606:4700::1]:443", "2606:4700::1", 443),
        (b"93.184.216.34:8443", "93.184.216.34", 8443),
    ],
    ids=["name", "mixed-case", "ipv6-bracketed", "ipv4"],
)
def test_connect_authority_is_parsed(raw: bytes, host: str, port: int) -> None:
    authority = parse_connect_authority(raw)
    assert (authority.host.name, authority.port) == (host, port)


@pytest.mark.parametrize(
    "raw",
    [
        b"docs.example.org",
        b"docs.example.org:",
        b"docs.example.org:0",
        b"docs.example.org:65536",
        b"docs.example.org:+443",
        b"::1:443",
        b":443",
        b"user@docs.example.org:443",
        b"localhost:443",
        b"docs.example.org:0443x",
    ],
    ids=[
        "no-port",
        "empty-port",
        "port-zero",
        "port-too-big",
        "signed-port",
        "unbracketed-ipv6",
        "no-host",
        "userinfo",
        "internal-name",
        "garbage-port",
    ],
)
def test_bad_connect_authority_is_refused(raw: bytes) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_connect_authority(raw)
    assert caught.value.code in {ErrorCode.INVALID_INPUT, ErrorCode.UNSAFE_URL}


@pytest.mark.parametrize(
    ("raw", "host", "port", "origin_form"),
    [
        (b"http://a.example.org/x?y=1#frag", b"a.example.org", 80, b"/x?y=1"),
        (b"http://a.example.org", b"a.example.org", 80, b"/"),
        (b"http://a.example.org:8080/p", b"a.example.org", 8080, b"/p"),
        (b"http://[2606:4700::1]/", b"[2606:4700::1]", 80, b"/"),
    ],
    ids=["path-query-fragment", "no-path", "port", "ipv6"],
)
def test_absolute_target_is_split(raw: bytes, host: bytes, port: int, origin_form: bytes) -> None:
    target = split_absolute_target(raw)
    assert (target.raw_host, target.port, target.origin_form) == (host, port, origin_form)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"/relative", ErrorCode.INVALID_INPUT),
        (b"*", ErrorCode.INVALID_INPUT),
        (b"http:///nohost", ErrorCode.INVALID_INPUT),
        (b"https://a.example.org/", ErrorCode.UNSAFE_URL),
        (b"ftp://a.example.org/", ErrorCode.UNSAFE_URL),
        (b"http://u:p@a.example.org/", ErrorCode.UNSAFE_URL),
        (b"http://a.example.org:99999/", ErrorCode.INVALID_INPUT),
        (b"http://a.example.org/" + b"a" * 9000, ErrorCode.UNSAFE_URL),
    ],
    ids=["origin-form", "asterisk", "no-host", "https", "ftp", "userinfo", "port-overflow", "too-long"],
)
def test_bad_absolute_target_is_refused(raw: bytes, code: ErrorCode) -> None:
    with pytest.raises(GatewayError) as caught:
        split_absolute_target(raw)
    assert caught.value.code == code


def test_hop_by_hop_and_proxy_headers_are_not_forwarded() -> None:
    headers = [
        (b"Host", b"evil.example.com"),
        (b"Connection", b"keep-alive, X-Secret-Hop"),
        (b"X-Secret-Hop", b"1"),
        (b"Proxy-Authorization", b"Basic c2VjcmV0"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"Keep-Alive", b"300"),
        (b"TE", b"trailers"),
        (b"Trailer", b"X"),
        (b"Upgrade", b"h2c"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Accept", b"*/*"),
        (b"Content-Length", b"3"),
    ]
    fields = forwarded_lines(headers, connection_tokens(headers))
    head = build_request_head(b"POST", b"/p", b"a.example.org", fields, chunked=True)
    assert head == (
        b"POST /p HTTP/1.1\r\nHost: a.example.org\r\nAccept: */*\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )


def test_denial_response_carries_code_header_and_json_body() -> None:
    raw = error_response(GatewayError(ErrorCode.POLICY_DENIED, "no"), keep_alive=True)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 403 Forbidden (egress: policy_denied)\r\n")
    assert b"X-Egress-Code: policy_denied" in head
    assert b"Connection: keep-alive" in head
    document = orjson.loads(body)
    assert document["egress"]["code"] == "policy_denied"
    assert document["egress"]["message"] == "no"
    assert document["egress"]["retryable"] is False
    assert "allow_domains" in document["egress"]["hint"]
    assert document["error"] == document["message"] == f"policy_denied: no ({document['egress']['hint']})"


def test_auth_denial_is_407_with_proxy_authenticate() -> None:
    raw = error_response(GatewayError(ErrorCode.AUTH_REQUIRED, "x", status=401), keep_alive=False)
    assert raw.startswith(b"HTTP/1.1 407 ")
    assert b'Proxy-Authenticate: Basic realm="egress-gateway"' in raw


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (GatewayError(ErrorCode.UNSAFE_URL, "IP-literal host"), 403),
        (GatewayError(ErrorCode.BLOCKED_DESTINATION, "resolves to loopback"), 403),
        (GatewayError(ErrorCode.POLICY_DENIED, "not in allow_domains"), 403),
        (GatewayError(ErrorCode.AUTH_REQUIRED, "no credential", status=401), 407),
        (GatewayError(ErrorCode.INVALID_INPUT, "malformed"), 400),
        (GatewayError(ErrorCode.TOO_LARGE, "head too large", status=431), 431),
        (GatewayError(ErrorCode.CONCURRENCY_LIMITED, "tunnel limit", retry_after_s=1.0), 429),
        (GatewayError(ErrorCode.DNS_FAILURE, "NXDOMAIN"), 502),
        (GatewayError(ErrorCode.CONNECT_FAILURE, "refused"), 502),
        (GatewayError(ErrorCode.TOO_LARGE, "response over the cap"), 502),
        (GatewayError(ErrorCode.TIMEOUT, "no response"), 504),
    ],
    ids=[
        "unsafe-url",
        "blocked-destination",
        "policy-denied",
        "auth-required",
        "malformed",
        "head-too-large",
        "tunnel-limit",
        "dns-failure",
        "connect-failure",
        "response-too-large",
        "upstream-timeout",
    ],
)
def test_proxy_status_for_each_code(error: GatewayError, status: int) -> None:
    assert proxy_status(error) == status
    assert error_response(error, keep_alive=False).startswith(b"HTTP/1.1 %d " % status)


def test_limit_denial_has_retry_after() -> None:
    raw = error_response(GatewayError(ErrorCode.CONCURRENCY_LIMITED, "x", retry_after_s=1.0), keep_alive=False)
    assert raw.startswith(b"HTTP/1.1 429 ")
    assert b"Retry-After: 1\r\n" in raw


def _peek(status: PeekStatus, name: str | None = None) -> ClientHelloPeek:
    return ClientHelloPeek(status, name)


@pytest.mark.parametrize(
    ("mode", "port", "peek", "allowed"),
    [
        ("require", 443, _peek(PeekStatus.COMPLETE, "a.example.org"), True),
        ("require", 443, _peek(PeekStatus.COMPLETE, "b.example.org"), False),
        ("require", 443, _peek(PeekStatus.COMPLETE, None), False),
        ("require", 443, _peek(PeekStatus.NOT_TLS), False),
        ("require", 22, _peek(PeekStatus.NOT_TLS), True),
        ("require", 8443, _peek(PeekStatus.COMPLETE, "b.example.org"), False),
        ("match-if-present", 443, _peek(PeekStatus.COMPLETE, None), True),
        ("match-if-present", 443, _peek(PeekStatus.NOT_TLS), True),
        ("match-if-present", 443, _peek(PeekStatus.COMPLETE, "b.example.org"), False),
        ("match-if-present", 443, _peek(PeekStatus.MALFORMED), False),
        ("off", 443, _peek(PeekStatus.COMPLETE, "b.example.org"), True),
    ],
    ids=[
        "require-match",
        "require-mismatch",
        "require-no-sni",
        "require-not-tls",
        "require-plain-port",
        "require-other-port-mismatch",
        "present-no-sni",
        "present-not-tls",
        "present-mismatch",
        "malformed",
        "off",
    ],
)
def test_sni_verdict_by_mode(mode: str, port: int, peek: ClientHelloPeek, allowed: bool) -> None:
    verdict = sni_verdict(mode, port, "a.example.org", False, peek)  # type: ignore[arg-type]
    assert (verdict is None) == allowed
