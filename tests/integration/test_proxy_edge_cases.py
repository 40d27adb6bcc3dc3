"""Forward-proxy edge cases with real clients on loopback: pipelining, Expect: 100-continue, IPv6.

- HTTP/1.1 pipelining on the plain-HTTP (absolute-URI) path: several requests in one write on one
  connection are answered in order, each with its own body (`client_connection.ClientConnection`
  queues them and pauses reading until each one's turn), with and without a cached DNS answer,
  with a denial in the middle, with a POST body in the middle, and when the client half-closes
  after writing.
- `Expect: 100-continue` on a plain-HTTP POST. The gateway does not interpret Expect: it is not a
  hop-by-hop field (`heads.HOP_BY_HOP`), so `forward/exchange.build_request_head` forwards it to the origin;
  the gateway never writes a 100 of its own, and `forward/upstream.UpstreamConnection`
  relays the origin's interim 1xx to an HTTP/1.1 client before the final response (never to an
  HTTP/1.0 client, RFC 9110 section 15.2). A client that hears
  nothing (the origin sends no 100) and sends its body anyway after ~1 s, as curl does, still gets
  its answer.
- An IPv6 proxy listener (`EGRESS_PROXY_LISTEN=[::1]:PORT`): CONNECT and plain GET work through it,
  and a CONNECT to the proxy's own [::1] address is refused with 403 and X-Egress-Code.

Two tests guard fixes these tests first found: a pipeline whose last request says
`Connection: close` is answered in full before the close, and an HTTP/1.0 client is never sent the
origin's interim 100.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.harness import proxy as support
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.http_responses import IO_TIMEOUT_S, RawResponse, ResponseReader, parse_one
from tests.harness.origins import Origin, OriginFactory
from tests.harness.proxy import ProxyProcess, proxy_policy

ProxyFactory = Callable[..., ProxyProcess]

EXPECT_WAIT_S = 1.0  # how long the client waits for a 100 before sending its body (curl's default)


@contextlib.contextmanager
def _client(port: int, host: str = "127.0.0.1") -> Iterator[tuple[socket.socket, ResponseReader]]:
    with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as sock:
        yield sock, ResponseReader(sock)


def _get(url: str, *extra: str) -> bytes:
    return (f"GET {url} HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in extra) + "\r\n").encode()


# --- the plain-HTTP origin ----------------------------------------------------------------------


@dataclass
class Seen:
    """What the origin saw, in arrival order."""

    paths: list[str]
    expect: list[str | None]
    bodies: list[bytes]
    peers: list[tuple[str, int]]

    def arrived(self, request: web.Request) -> None:
        self.paths.append(request.path_qs)
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))


def _origin_app(seen: Seen) -> web.Application:
    async def page(request: web.Request) -> web.Response:
        seen.arrived(request)
        # The first request of a pipeline is made the slowest, so answering in completion order
        # instead of request order would show.
        await asyncio.sleep(float(request.query.get("delay", "0")))
        name = request.match_info["name"]
        return web.Response(text=f"page {name} " + name * 3, headers={"X-Page": name})

    async def echo(request: web.Request) -> web.Response:
        seen.arrived(request)
        seen.expect.append(request.headers.get("Expect"))
        body = await request.read()
        seen.bodies.append(body)
        return web.Response(body=b"echo:" + body, content_type="application/octet-stream")

    async def no_continue(request: web.Request) -> None:
        # An origin that never answers 100: it just waits for the body (which `echo` reads).
        return None

    app = web.Application()
    app.router.add_get("/p/{name}", page)
    app.router.add_post("/echo", echo)
    app.router.add_post("/echo-no-100", echo, expect_handler=no_continue)
    return app


@pytest.fixture
def seen() -> Seen:
    return Seen([], [], [], [])


@pytest.fixture
def http_origin(origins: OriginFactory, seen: Seen) -> Origin:
    return origins.start(_origin_app(seen), names=("edge.example.org",), tls=False)


@pytest.fixture
def proxy(proxy_factory: ProxyFactory, http_origin: Origin) -> ProxyProcess:
    return proxy_factory(proxy_policy([http_origin.cidr], ports=[http_origin.port], proxy={"head_timeout_s": 1.0}))


# --- 1. pipelining --------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, 300], ids=["dns-lookup-per-request", "cached-decision"])
def test_pipelined_gets_in_one_write_are_answered_in_order_with_their_own_bodies(
    proxy_factory: ProxyFactory, http_origin: Origin, fake_dns: FakeDNS, seen: Seen, ttl: int
) -> None:
    # ttl 0: every request waits on a DNS lookup (a task per request); ttl 300: after the first,
    # requests are decided synchronously from the cache (client_connection.py's other dispatch path).
    fake_dns.add(http_origin.name, http_origin.ip, ttl=ttl)
    proxy = proxy_factory(proxy_policy([http_origin.cidr], ports=[http_origin.port]))
    names = ["one", "two", "three"]
    with _client(proxy.port) as (sock, reader):
        sock.sendall(
            _get(http_origin.url("/p/one?delay=0.3"))
            + _get(http_origin.url("/p/two?delay=0.1"))
            + _get(http_origin.url("/p/three"))
        )
        responses = reader.finals(3)
        assert [r.status for r in responses] == [200, 200, 200]
        assert [r.body.decode() for r in responses] == [f"page {n} {n * 3}" for n in names]
        assert [r.header("X-Page") for r in responses] == names
        assert reader.buffer == b"", "bytes after the third response"
        # The connection is still in step: one more request on it is answered normally.
        sock.sendall(_get(http_origin.url("/p/four"), "Connection: close"))
        (fourth,) = reader.finals(1)
        assert fourth.body == b"page four fourfourfour"
        assert reader.wait_closed() == b""
    assert seen.paths == ["/p/one?delay=0.3", "/p/two?delay=0.1", "/p/three", "/p/four"]


THREE_PAGE_PATHS = ["/p/one?delay=0.3", "/p/two", "/p/three"]


def _three_pages(origin: Origin, *last_headers: str) -> bytes:
    """Three pipelined GETs in one write, the first answered slowest; `last_headers` go on the last."""
    return (
        _get(origin.url(THREE_PAGE_PATHS[0]))
        + _get(origin.url(THREE_PAGE_PATHS[1]))
        + _get(origin.url(THREE_PAGE_PATHS[2]), *last_headers)
    )


def _three_answers_then_close(reader: ResponseReader) -> list[RawResponse]:
    responses = reader.finals(3)
    assert [r.body.decode() for r in responses] == [
        "page one oneoneone",
        "page two twotwotwo",
        "page three threethreethree",
    ]
    assert reader.wait_closed() == b""
    return responses


def test_pipelined_requests_ending_with_connection_close_are_all_answered_then_closed(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen
) -> None:
    # The usual way to end a pipeline: the last request asks for the close. Each request carries
    # its own keep-alive intent; the close applies after the response to the request that asked.
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_three_pages(http_origin, "Connection: close"))
        responses = _three_answers_then_close(reader)
        # Only the response to the request that asked for the close says so.
        assert [r.header("connection") for r in responses] == [None, None, "close"]
    assert seen.paths == THREE_PAGE_PATHS


def test_a_request_behind_one_that_asked_to_close_is_dropped_and_the_first_still_answered(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen
) -> None:
    # RFC 9112 section 9.6: the server answers the request that asked to close, processes nothing
    # after it, and closes. The extra bytes are neither forwarded nor answered with an error.
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_get(http_origin.url("/p/one?delay=0.3"), "Connection: close") + _get(http_origin.url("/p/two")))
        (first,) = reader.finals(1)
        assert first.status == 200
        assert first.body == b"page one oneoneone"
        assert first.header("connection") == "close"
        assert reader.wait_closed() == b""
    assert seen.paths == ["/p/one?delay=0.3"]


def test_pipelined_requests_then_half_close_are_all_answered_before_the_close(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen
) -> None:
    # `printf 'GET ...GET ...' | nc proxy 3128`: the client writes everything, then shuts down
    # its sending side and reads; every pipelined request is still owed its response.
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_three_pages(http_origin))
        sock.shutdown(socket.SHUT_WR)
        _three_answers_then_close(reader)
    assert seen.paths == THREE_PAGE_PATHS


def test_a_denied_request_in_a_pipeline_is_answered_in_its_place(
    proxy_factory: ProxyFactory, http_origin: Origin, seen: Seen
) -> None:
    principals = {"default": {"egress": {"allow_domains": [http_origin.name]}}}
    proxy = proxy_factory(proxy_policy([http_origin.cidr], ports=[http_origin.port], principals=principals))
    with _client(proxy.port) as (sock, reader):
        sock.sendall(
            _get(http_origin.url("/p/one?delay=0.3"))
            + _get(f"http://denied.example.com:{http_origin.port}/p/never")
            + _get(http_origin.url("/p/three"))
        )
        first, denied, third = reader.finals(3)
    assert (first.status, first.body) == (200, b"page one oneoneone")
    assert denied.status == 403
    assert denied.header("X-Egress-Code") == "policy_denied"
    assert b'"code":"policy_denied"' in denied.body
    assert (third.status, third.body) == (200, b"page three threethreethree")
    assert seen.paths == ["/p/one?delay=0.3", "/p/three"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_post_body_in_a_pipeline_reaches_the_origin_and_the_order_holds(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen, chunked: bool
) -> None:
    payload = bytes(range(256)) * 64
    if chunked:
        post = (
            f"POST {http_origin.url('/echo')} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
            + b"%x\r\n%b\r\n" % (len(payload), payload)
            + b"0\r\n\r\n"
        )
    else:
        post = (
            f"POST {http_origin.url('/echo')} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_get(http_origin.url("/p/one?delay=0.3")) + post + _get(http_origin.url("/p/three")))
        first, echoed, third = reader.finals(3)
    assert first.body == b"page one oneoneone"
    assert (echoed.status, echoed.body) == (200, b"echo:" + payload)
    assert third.body == b"page three threethreethree"
    assert seen.bodies == [payload]
    assert seen.paths == ["/p/one?delay=0.3", "/echo", "/p/three"]


# --- 2. Expect: 100-continue ------------------------------------------------------------------------


def _expect_head(url: str, payload: bytes, *, chunked: bool, version: str = "1.1") -> bytes:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(payload)}"
    return f"POST {url} HTTP/{version}\r\nHost: x\r\n{framing}\r\nExpect: 100-continue\r\n\r\n".encode()


def _body(payload: bytes, *, chunked: bool) -> bytes:
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload) if chunked else payload


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_expect_100_continue_is_forwarded_and_the_origins_100_is_relayed(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen, chunked: bool
) -> None:
    payload = b"expect-me:" + bytes(range(256)) * 16
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_expect_head(http_origin.url("/echo"), payload, chunked=chunked))
        # The body is held back until the interim response: only the origin's 100 can unblock us.
        interim = reader.next()
        assert (interim.status, interim.reason) == (100, "Continue")
        assert reader.buffer == b"", "the final response came before the body was sent"
        sock.sendall(_body(payload, chunked=chunked))
        (final,) = reader.finals(1)
        assert (final.status, final.body) == (200, b"echo:" + payload)
        assert reader.buffer == b"", "a second interim or stray bytes after the final response"
        # The interim response left both sides in step: the connection (and the pooled upstream
        # one) serves the next request.
        sock.sendall(_get(http_origin.url("/p/after"), "Connection: close"))
        (after,) = reader.finals(1)
        assert (after.status, after.body) == (200, b"page after afterafterafter")
        assert reader.wait_closed() == b""
    # Forwarded as sent: the origin saw the expectation (it is what made the origin send 100).
    assert seen.expect == ["100-continue"]
    assert seen.bodies == [payload]
    assert len(set(seen.peers)) == 1, "the upstream connection was not reused after the interim response"


def test_a_client_that_gets_no_100_sends_its_body_after_waiting_and_still_gets_its_answer(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen
) -> None:
    payload = b"sent-anyway:" + b"z" * 5000
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_expect_head(http_origin.url("/echo-no-100"), payload, chunked=False))
        # This origin never sends 100, and the gateway does not make one up: the client hears
        # nothing for its whole wait (which is as long as the proxy's 1 s head deadline: the wait
        # for a body is not a head wait).
        assert reader.nothing_within(EXPECT_WAIT_S), f"unexpected bytes: {reader.buffer!r}"
        sock.sendall(payload)
        (final,) = reader.finals(1)
        assert reader.buffer == b""
    assert (final.status, final.body) == (200, b"echo:" + payload)
    assert seen.expect == ["100-continue"]
    assert seen.bodies == [payload]


@pytest.mark.parametrize(
    ("path", "relayed"), [("/echo", True), ("/echo-no-100", False)], ids=["origin-sends-100", "origin-silent"]
)
def test_curl_with_expect_100_continue_completes_its_post(
    proxy: ProxyProcess, http_origin: Origin, seen: Seen, tmp_path: Path, path: str, relayed: bool
) -> None:
    payload = bytes(range(256)) * 200
    data = tmp_path / "payload.bin"
    data.write_bytes(payload)
    result = subprocess.run(
        [
            "curl",
            "-sS",
            "-v",
            "--max-time",
            "20",
            "--expect100-timeout",
            str(EXPECT_WAIT_S),
            "-x",
            proxy.url,
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            f"@{data}",
            "-o",
            str(tmp_path / "out.bin"),
            "-w",
            "%{http_code}",
            http_origin.url(path),
        ],
        capture_output=True,
        timeout=40,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout == b"200"
    assert (tmp_path / "out.bin").read_bytes() == b"echo:" + payload
    assert (b"< HTTP/1.1 100 Continue" in result.stderr) is relayed
    assert seen.expect == ["100-continue"]
    assert seen.bodies == [payload]


def test_an_http10_client_never_gets_an_interim_100(proxy: ProxyProcess, http_origin: Origin, seen: Seen) -> None:
    # HTTP/1.0 has no 1xx responses: such a client reads the first status line as its answer.
    # The origin is asked in HTTP/1.1 (build_request_head), honours the forwarded Expect and sends
    # 100; the gateway must swallow it (or strip Expect) rather than pass it to this client.
    payload = b"one-zero body"
    with _client(proxy.port) as (sock, reader):
        sock.sendall(_expect_head(http_origin.url("/echo"), payload, chunked=False, version="1.0") + payload)
        rest = reader.wait_closed()
    first = parse_one(rest)
    assert first is not None, rest
    assert first[0].status == 200, rest
    assert first[0].body == b"echo:" + payload


# --- 3. an IPv6 listener -------------------------------------------------------------------------------


def _free_v6_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.bind(("::1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ipv6_loopback_unusable() -> str | None:
    """Why the IPv6 tests cannot run here, or None when [::1] can be bound."""
    if not socket.has_ipv6:
        return "this Python has no IPv6 support (socket.has_ipv6 is False)"
    try:
        _free_v6_port()
    except OSError as exc:
        return f"cannot bind [::1] on this host: {exc}"
    return None


class IPv6ProxyProcess(ProxyProcess):
    """The gateway with its proxy listener on [::1]:PORT (the API and admin stay on 127.0.0.1)."""

    def __init__(self, workdir: Path, policy: Mapping[str, Any], nameserver: str, ca_bundle: Path, port: int) -> None:
        super().__init__(workdir, policy, nameserver, ca_bundle)
        self._listen_v6(port)

    def _listen_v6(self, port: int) -> None:
        self.proxy_port = port
        self.env["EGRESS_PROXY_LISTEN"] = f"[::1]:{port}"

    def _pick_ports(self) -> None:
        # Another process took a port between our probe and the bind: GatewayProcess.start retries.
        super()._pick_ports()
        self._listen_v6(_free_v6_port())

    @property
    def proxy_url(self) -> str:
        return f"http://[::1]:{self.proxy_port}"


IPv6ProxyFactory = Callable[[Mapping[str, Any], int], IPv6ProxyProcess]


@pytest.fixture
def ipv6_proxy_factory(tmp_path: Path, fake_dns: FakeDNS, pki: TestPKI) -> Iterator[IPv6ProxyFactory]:
    reason = _ipv6_loopback_unusable()
    if reason is not None:
        pytest.skip(reason)
    start, started = support.starting_proxies(IPv6ProxyProcess, tmp_path, fake_dns.nameserver, pki.ca_path, "proxy6-")
    yield start
    for process in started:
        with contextlib.suppress(Exception):
            process.stop()


def _tls_origin_app() -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"tls hello from {request.host}")

    app = web.Application()
    app.router.add_get("/", hello)
    return app


def _connect_v6(port: int, authority: str) -> bytes:
    """A CONNECT to the [::1] listener: the answer head (the connection is closed after it)."""
    with _client(port, "::1") as (sock, reader):
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        (answer,) = reader.finals(1)
    head = f"HTTP/1.1 {answer.status} {answer.reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in answer.headers)
    return head.encode() + b"\r\n" + answer.body


def test_ipv6_listener_serves_connect_and_plain_http(
    ipv6_proxy_factory: IPv6ProxyFactory, origins: OriginFactory, http_origin: Origin, pki: TestPKI
) -> None:
    tls_origin = origins.start(_tls_origin_app(), names=("docs6.example.org",), tls=True)
    policy = proxy_policy([tls_origin.cidr, http_origin.cidr], ports=[tls_origin.port, http_origin.port])
    proxy = ipv6_proxy_factory(policy, _free_v6_port())
    assert proxy.url.startswith("http://[::1]:")
    # CONNECT (curl, end-to-end TLS verified against the test CA).
    tunnelled = subprocess.run(
        ["curl", "-sS", "--max-time", "15", "-x", proxy.url, "--cacert", str(pki.ca_path), tls_origin.url("/")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert tunnelled.returncode == 0, (tunnelled.stderr, proxy.stderr())
    assert tunnelled.stdout == f"tls hello from docs6.example.org:{tls_origin.port}"
    # Plain absolute-URI GET, with curl and with httpx.
    plain = subprocess.run(
        ["curl", "-sS", "--max-time", "15", "-x", proxy.url, http_origin.url("/p/six")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert plain.returncode == 0, (plain.stderr, proxy.stderr())
    assert plain.stdout == "page six sixsixsix"
    with httpx.Client(proxy=proxy.url, timeout=IO_TIMEOUT_S) as client:
        response = client.get(http_origin.url("/p/seven"))
    assert response.status_code == 200
    assert response.text == "page seven sevensevenseven"
    lines = proxy.wait_audit(lambda lines: sum(line["event"] == "decision" for line in lines) >= 3)
    decisions = [(line["kind"], line["decision"]) for line in lines if line["event"] == "decision"]
    assert decisions == [("connect", "allow"), ("http", "allow"), ("http", "allow")]


@pytest.mark.parametrize("target", ["name", "literal"], ids=["name-resolving-to-::1", "ip-literal-[::1]"])
def test_ipv6_listener_refuses_connect_to_its_own_address(
    ipv6_proxy_factory: IPv6ProxyFactory, fake_dns: FakeDNS, target: str
) -> None:
    fake_dns.add("self6.example.net", "::1")
    port = _free_v6_port()
    # Even a policy that opens ::1, IP literals and the proxy's own port cannot make it dial itself.
    policy = proxy_policy(["::1/128"], ports=[port], defaults={"literal_ips": "allow"})
    proxy = ipv6_proxy_factory(policy, port)
    host = "self6.example.net" if target == "name" else "[::1]"
    answer = _connect_v6(proxy.port, f"{host}:{proxy.port}")
    assert answer.startswith(b"HTTP/1.1 403 "), answer
    assert b"X-Egress-Code: blocked_destination" in answer
    assert b'"code":"blocked_destination"' in answer
    lines = proxy.wait_audit(lambda lines: any(line.get("decision") == "deny" for line in lines))
    deny = [line for line in lines if line.get("decision") == "deny"]
    assert deny[0]["kind"] == "connect"
    assert "own listeners" in deny[0]["reason"]
