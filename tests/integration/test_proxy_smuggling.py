"""The proxy cannot be desynchronised: each attack of the hardening issue against the real daemon.

The upstream must see exactly the request the policy decided on, and the client exactly the
response framed for it: a `Connection` field naming a framing header is refused both ways, a
control byte in an origin's reason phrase is refused (llhttp lets it through), request
trailers never reach the forwarded head, bytes an origin sends beyond its response framing (an
injected second response, an unsolicited 101, a flood of 1xx) are never relayed and never crash
a parser callback, and pooled upstream connections are never shared between principals.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable

import httpx
import pytest

from tests.harness.dns import FakeDNS
from tests.harness.proxy import ProxyProcess, basic, proxy_policy, raw_exchange
from tests.harness.scripted_origin import ScriptedFactory, answer_each_request

ProxyFactory = Callable[..., ProxyProcess]

OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _no_tracebacks(proxy: ProxyProcess) -> None:
    log = proxy.stderr()
    assert "Traceback" not in log, log
    assert "call failed" not in log, log


@pytest.mark.parametrize(
    ("framing", "body"),
    [
        pytest.param(b"Content-Length: 37\r\n", b"GET /smuggled HTTP/1.1\r\nHost: evil\r\n\r\n", id="content-length"),
        pytest.param(
            b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n", id="chunked"
        ),
    ],
)
@pytest.mark.parametrize("named", [b"Content-Length", b"close, transfer-encoding"], ids=["cl", "te"])
def test_request_whose_connection_field_names_a_framing_header_is_refused_400(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory, framing: bytes, body: bytes, named: bytes
) -> None:
    origin = scripted(answer_each_request(OK_RESPONSE), "smuggle.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    request = (
        b"POST http://smuggle.example.org:%d/ HTTP/1.1\r\nHost: smuggle.example.org\r\nConnection: %b\r\n%b\r\n%b"
        % (origin.port, named, framing, body)
    )
    answer = raw_exchange(proxy.port, request)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"X-Egress-Code: invalid_input" in answer
    assert not any(b"/smuggled" in request for request in origin.requests)


def test_response_whose_connection_field_names_content_length_is_answered_502(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory
) -> None:
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: content-length\r\n\r\nhello"
    origin = scripted(answer_each_request(response), "badframe.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        answer = client.get(f"http://badframe.example.org:{origin.port}/")
    assert answer.status_code == 502
    assert answer.headers["X-Egress-Code"] == "connect_failure"


@pytest.mark.parametrize(
    "status_line",
    [b"HTTP/1.1 200 O\x01K", b"HTTP/1.1 200 \x1b]0;owned\x07", b"HTTP/1.0 200 OK\x7f"],
    ids=["soh-keep-alive-head", "terminal-escape", "del-http10-head"],
)
def test_a_control_byte_in_the_origins_reason_phrase_is_answered_502_and_never_relayed(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory, status_line: bytes
) -> None:
    response = status_line + b"\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
    origin = scripted(answer_each_request(response), "reason.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    request = b"GET http://reason.example.org:%d/ HTTP/1.1\r\nHost: reason.example.org\r\n\r\n" % origin.port
    answer = raw_exchange(proxy.port, request)
    assert answer.startswith(b"HTTP/1.1 502 "), answer
    assert b"X-Egress-Code: connect_failure" in answer
    assert not any(byte in answer for byte in (b"\x01", b"\x1b", b"\x07", b"\x7f")), answer
    # The connection that sent it is never reused: a second request dials again.
    assert raw_exchange(proxy.port, request).startswith(b"HTTP/1.1 502 ")
    assert origin.connections == 2
    _no_tracebacks(proxy)


def test_request_trailers_are_never_merged_into_the_forwarded_head(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory
) -> None:
    origin = scripted(answer_each_request(OK_RESPONSE), "trailers.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    # One write: head, chunked body and trailers all arrive while the name is being resolved.
    request = (
        b"POST http://trailers.example.org:%d/ HTTP/1.1\r\nHost: trailers.example.org\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"3\r\nabc\r\n0\r\nX-Injected: 1\r\nAuthorization: Bearer stolen\r\n\r\n" % origin.port
    )
    answer = raw_exchange(proxy.port, request)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert origin.requests
    forwarded = b"".join(origin.requests)
    assert b"X-Injected" not in forwarded
    assert b"stolen" not in forwarded


def test_a_second_response_injected_after_the_first_is_never_relayed(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory
) -> None:
    injected = OK_RESPONSE + b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"
    origin = scripted(answer_each_request(injected), "inject.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    url = f"http://inject.example.org:{origin.port}/"
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        bodies = [client.get(url).content for _ in range(3)]
    assert bodies == [b"ok"] * 3
    # The connection that carried stray bytes is never reused.
    assert origin.connections == 3
    _no_tracebacks(proxy)


def test_an_unsolicited_101_is_answered_502_and_never_relayed(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory
) -> None:
    switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nRAW-STREAM"
    origin = scripted(answer_each_request(switch), "switch.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    request = b"GET http://switch.example.org:%d/ HTTP/1.1\r\nHost: switch.example.org\r\n\r\n" % origin.port
    answer = raw_exchange(proxy.port, request)
    assert answer.startswith(b"HTTP/1.1 502 "), answer
    assert b"101" not in answer.split(b"\r\n", 1)[0]
    assert b"RAW-STREAM" not in answer
    _no_tracebacks(proxy)


def test_a_flood_of_interim_responses_is_cut_502_too_large(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory
) -> None:
    flood = b"HTTP/1.1 100 Continue\r\n\r\n" * 2000 + OK_RESPONSE
    origin = scripted(answer_each_request(flood), "flood.example.org")
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    request = b"GET http://flood.example.org:%d/ HTTP/1.1\r\nHost: flood.example.org\r\n\r\n" % origin.port
    answer = raw_exchange(proxy.port, request)
    assert answer.count(b"100 Continue") <= 8
    final = answer[answer.rfind(b"HTTP/1.1 ") :]
    assert final.startswith(b"HTTP/1.1 502 "), final[:200]
    assert b"X-Egress-Code: too_large" in final


def test_pooled_upstream_connections_are_never_shared_between_principals(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory
) -> None:
    origin = scripted(answer_each_request(OK_RESPONSE), "shared.example.org")
    principals = {
        "alice": {"token_sha256": _digest("alice-token"), "egress": {"allow_domains": ["*"]}},
        "bob": {"token_sha256": _digest("bob-token"), "egress": {"allow_domains": ["*"]}},
    }
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port], principals=principals))
    url = f"http://shared.example.org:{origin.port}/"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        for user in ("alice", "bob", "alice", "bob"):
            head = (
                f"GET {url} HTTP/1.1\r\nHost: shared.example.org\r\n"
                f"Proxy-Authorization: {basic(user, user + '-token')}\r\n\r\n"
            ).encode()
            sock.sendall(head)
            assert _read_response(sock).endswith(b"\r\n\r\nok")
    # One pooled connection per principal, each reused by its own principal only.
    assert origin.connections == 2


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while not (b"\r\n\r\n" in data and data.endswith(b"ok")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_an_upgrade_request_never_reaches_a_pooled_upstream(
    proxy_factory: ProxyFactory, scripted: ScriptedFactory, fake_dns: FakeDNS
) -> None:
    origin = scripted(answer_each_request(OK_RESPONSE), "upgrade.example.org")
    # Cached, as names are in production: the next request is decided and sent without a task.
    fake_dns.add("upgrade.example.org", origin.ip, ttl=300)
    proxy = proxy_factory(proxy_policy([origin.cidr], ports=[origin.port]))
    url = b"http://upgrade.example.org:%d/" % origin.port
    get = b"GET %b HTTP/1.1\r\nHost: upgrade.example.org\r\n\r\n" % url
    upgrade = b"GET %b HTTP/1.1\r\nHost: upgrade.example.org\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n" % url
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        # The first request leaves its upstream pooled and its decision kept, so the same request
        # with an upgrade asked next could be sent at once, before its refusal.
        sock.sendall(get)
        first = b""
        while not first.endswith(b"\r\n\r\nok"):
            chunk = sock.recv(65536)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200 "), first
        sock.sendall(upgrade)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"X-Egress-Code: invalid_input" in answer
    # Had the upgrade been sent, its refusal would have closed that upstream mid-exchange: the
    # next request reuses the pooled one only if it never carried the upgrade.
    last = raw_exchange(proxy.port, b"GET %b HTTP/1.1\r\nHost: upgrade.example.org\r\nConnection: close\r\n\r\n" % url)
    assert last.startswith(b"HTTP/1.1 200 "), last
    assert origin.connections == 1
    assert len(origin.requests) == 2, origin.requests
    _no_tracebacks(proxy)
