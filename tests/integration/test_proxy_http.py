"""Plain HTTP (absolute-URI) forwarding through the proxy with curl, httpx and raw sockets."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from aiohttp import web

from tests.harness.dns import FakeDNS
from tests.harness.gateway import free_port
from tests.harness.origins import Origin, OriginFactory
from tests.harness.proxy import (
    ProxyProcess,
    proxy_policy,
    raw_exchange,
    read_head,
)

ProxyFactory = Callable[..., ProxyProcess]


def _origin_app(peers: list[tuple[str, int]]) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith(("proxy-", "x-"))}
        return web.json_response({"host": request.host, "path": request.path_qs, "seen": headers})

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(body=body, content_type="application/octet-stream")

    async def reset(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 1_000_000
        await response.prepare(request)
        await response.write(b"x" * 1000)
        assert request.transport is not None
        sock = request.transport.get_extra_info("socket")
        # SO_LINGER 0: close() sends a RST instead of a FIN, a real reset mid-body.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        request.transport.abort()
        return response

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"y" * int(request.query["bytes"]))

    async def hang(request: web.Request) -> web.Response:
        # Accepts the request and never answers (cancelled when the proxy gives up).
        await asyncio.sleep(3600)
        return web.Response()

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 1_000_000
        await response.prepare(request)
        await response.write(b"s" * 1000)
        await asyncio.sleep(3600)
        return response

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_get("/reset", reset)
    app.router.add_get("/big", big)
    app.router.add_get("/hang", hang)
    app.router.add_get("/stall", stall)
    app.router.add_get("/{tail:.*}", hello)
    return app


# The module's tests share one origin and one gateway (started once, not once per test); a test
# that counts audit lines or upstream connections takes `own_proxy`, a gateway of its own with the
# same policy, or starts one with `proxy_factory`.


@pytest.fixture(scope="module")
def origin_peers() -> list[tuple[str, int]]:
    return []


@pytest.fixture
def peers(origin_peers: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The client addresses the module's origin saw during this test (earlier tests' forgotten)."""
    origin_peers.clear()
    return origin_peers


@pytest.fixture(scope="module")
def http_origin(module_origins: OriginFactory, origin_peers: list[tuple[str, int]]) -> Origin:
    return module_origins.start(_origin_app(origin_peers), names=("plain.example.org",), tls=False)


def _head_deadline_policy(origin: Origin) -> dict[str, object]:
    return proxy_policy([origin.cidr], ports=[origin.port], proxy={"head_timeout_s": 1.0})


@pytest.fixture(scope="module")
def proxy(module_proxy_factory: ProxyFactory, http_origin: Origin) -> ProxyProcess:
    return module_proxy_factory(_head_deadline_policy(http_origin))


@pytest.fixture
def own_proxy(proxy_factory: ProxyFactory, http_origin: Origin) -> ProxyProcess:
    return proxy_factory(_head_deadline_policy(http_origin))


def test_curl_get_is_forwarded_with_host_from_the_uri_and_no_proxy_headers(
    proxy: ProxyProcess, http_origin: Origin
) -> None:
    result = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-x",
            proxy.url,
            "-H",
            "Proxy-Connection: keep-alive",
            "-H",
            "X-Trace: 1",
            http_origin.url("/a?b=c"),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f'"host": "plain.example.org:{http_origin.port}"' in result.stdout
    assert '"path": "/a?b=c"' in result.stdout
    assert "Proxy-Connection" not in result.stdout
    assert '"X-Trace": "1"' in result.stdout


def test_post_body_is_forwarded_intact(proxy: ProxyProcess, http_origin: Origin) -> None:
    payload = bytes(range(256)) * 4096
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        response = client.post(http_origin.url("/echo"), content=payload)
        chunked = client.post(http_origin.url("/echo"), content=iter([payload[:1000], payload[1000:]]))
    assert response.status_code == 200
    assert response.content == payload
    assert chunked.content == payload


def test_keep_alive_reuses_client_and_upstream_connections(
    own_proxy: ProxyProcess, http_origin: Origin, peers: list[tuple[str, int]]
) -> None:
    proxy = own_proxy  # a fresh pool and audit file: every connection and close line is this test's
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        for _ in range(5):
            assert client.get(http_origin.url("/")).status_code == 200
    assert len(peers) == 5
    assert len(set(peers)) == 1, "the upstream connection was not reused"
    lines = proxy.wait_audit(lambda lines: sum(line["event"] == "close" for line in lines) >= 5)
    closes = [line for line in lines if line["event"] == "close"]
    assert len(closes) == 5


def test_denied_host_over_plain_http_gets_403_json(proxy_factory: ProxyFactory, http_origin: Origin) -> None:
    principals = {"default": {"egress": {"allow_domains": ["only.example.com"]}}}
    proxy = proxy_factory(proxy_policy([http_origin.cidr], ports=[http_origin.port], principals=principals))
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        response = client.get(http_origin.url("/"))
    assert response.status_code == 403
    assert response.headers["X-Egress-Code"] == "policy_denied"
    assert response.json()["egress"]["code"] == "policy_denied"


@pytest.mark.parametrize(
    "host", ["{ip}", "localhost", "metadata"], ids=["ip-literal-under-literal-ips-deny", "localhost", "metadata-name"]
)
def test_unsafe_destination_over_plain_http_gets_403_unsafe_url(
    proxy: ProxyProcess, http_origin: Origin, peers: list[tuple[str, int]], host: str
) -> None:
    url = f"http://{host.format(ip=http_origin.ip)}:{http_origin.port}/"
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        response = client.get(url)
    assert response.status_code == 403
    assert response.headers["X-Egress-Code"] == "unsafe_url"
    assert response.json()["egress"]["code"] == "unsafe_url"
    assert peers == []


def test_origin_form_request_is_refused_with_400(proxy: ProxyProcess) -> None:
    answer = raw_exchange(proxy.port, b"GET / HTTP/1.1\r\nHost: plain.example.org\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize(
    "head",
    [
        b"POST {url} HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST {url} HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
        b"GET {url} HTTP/1.1\r\nHost: h\r\nX-Folded: a\r\n b\r\n\r\n",
        b"POST {url} HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"GET {url} HTTP/1.1\r\nHost: h\r\nX-Bad: a\x00b\r\n\r\n",
        b"GET {url} HTTP/1.1\nHost: h\n\n",
    ],
    ids=["cl-and-te", "double-cl", "obs-fold", "te-not-chunked", "nul-in-value", "bare-lf"],
)
def test_smuggling_shaped_requests_are_refused_and_never_reach_the_origin(
    proxy: ProxyProcess, http_origin: Origin, peers: list[tuple[str, int]], head: bytes
) -> None:
    answer = raw_exchange(proxy.port, head.replace(b"{url}", http_origin.url("/").encode()))
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert peers == []


def test_oversized_head_gets_431(proxy: ProxyProcess, http_origin: Origin) -> None:
    head = f"GET {http_origin.url('/')} HTTP/1.1\r\nHost: h\r\n".encode() + b"X-Pad: " + b"a" * 70_000 + b"\r\n\r\n"
    assert raw_exchange(proxy.port, head).startswith(b"HTTP/1.1 431 ")


def test_slowloris_head_is_dropped_after_the_head_deadline(proxy: ProxyProcess, http_origin: Origin) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(f"GET {http_origin.url('/')} HTTP/1.1\r\n".encode())
        started = time.monotonic()
        closed = False
        # Trickle a header byte every 200 ms; the 1 s head deadline must close us well before 8 s.
        while time.monotonic() - started < 8:
            try:
                sock.sendall(b"X")
                sock.settimeout(0.2)
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed


def _read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body from a blocking socket."""
    data = read_head(sock)
    assert b"\r\n\r\n" in data, data
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, head
        body += chunk
    return head


def _closed_within(sock: socket.socket, seconds: float, *, trickle: bytes = b"") -> str:
    """'fin', 'reset' or 'open' after up to `seconds`, sending `trickle` every 200 ms meanwhile."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            if trickle:
                sock.sendall(trickle)
            sock.settimeout(0.2)
            if sock.recv(1024) == b"":
                return "fin"
        except TimeoutError:
            continue
        except OSError:
            return "reset"
    return "open"


def test_a_dripped_second_head_on_a_keep_alive_connection_meets_the_head_deadline(
    proxy: ProxyProcess, http_origin: Origin
) -> None:
    # After a response the connection waits under the idle time (300 s here); the first byte of
    # the next head switches it to the 1 s head deadline, so dripping that head cannot hold it.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(f"GET {http_origin.url('/')} HTTP/1.1\r\nHost: plain.example.org\r\n\r\n".encode())
        assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(f"GET {http_origin.url('/')} HTTP/1.1\r\n".encode())
        assert _closed_within(sock, 8, trickle=b"X") != "open"


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_time(
    proxy_factory: ProxyFactory, http_origin: Origin
) -> None:
    # Closed by the idle time (1 s) set when the response finished, well before the 8 s bound; the
    # head deadline (10 s) could not close it in time.
    policy = proxy_policy([http_origin.cidr], ports=[http_origin.port], proxy={"idle_timeout_s": 1.0})
    idle_proxy = proxy_factory(policy)
    with socket.create_connection(("127.0.0.1", idle_proxy.port), timeout=10) as sock:
        sock.sendall(f"GET {http_origin.url('/')} HTTP/1.1\r\nHost: plain.example.org\r\n\r\n".encode())
        assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
        assert _closed_within(sock, 8) != "open"


def test_origin_reset_mid_body_reaches_the_client_as_an_error(own_proxy: ProxyProcess, http_origin: Origin) -> None:
    proxy = own_proxy  # an audit file of its own: the last close line is this test's
    with httpx.Client(proxy=proxy.url, timeout=10) as client, pytest.raises(httpx.HTTPError):
        client.get(http_origin.url("/reset"))
    lines = proxy.wait_audit(lambda lines: any(line["event"] == "close" for line in lines))
    closes = [line for line in lines if line["event"] == "close"]
    assert closes[-1]["close_reason"] == "connect_failure"


def test_response_over_the_cap_is_cut(proxy_factory: ProxyFactory, http_origin: Origin) -> None:
    policy = proxy_policy([http_origin.cidr], ports=[http_origin.port], proxy={"max_response_bytes": 100_000})
    proxy = proxy_factory(policy)
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        assert client.get(http_origin.url("/big?bytes=1000")).content == b"y" * 1000
        with pytest.raises(httpx.HTTPError):
            client.get(http_origin.url("/big?bytes=2000000"))
    lines = proxy.wait_audit(lambda lines: any(line.get("close_reason") == "too_large" for line in lines))
    assert lines[-1]["close_reason"] == "too_large"


def test_origin_that_never_answers_gets_504_timeout_after_the_idle_timeout(
    proxy_factory: ProxyFactory, http_origin: Origin
) -> None:
    policy = proxy_policy([http_origin.cidr], ports=[http_origin.port], proxy={"idle_timeout_s": 1.0})
    proxy = proxy_factory(policy)
    with httpx.Client(proxy=proxy.url, timeout=20) as client:
        response = client.get(http_origin.url("/hang"))
    assert response.status_code == 504
    assert response.headers["X-Egress-Code"] == "timeout"
    assert response.json()["egress"]["code"] == "timeout"
    lines = proxy.wait_audit(lambda lines: any(line.get("close_reason") == "timeout" for line in lines))
    assert any(line.get("close_reason") == "timeout" for line in lines)


def test_origin_that_stalls_mid_body_has_its_stream_cut_after_the_idle_timeout(
    proxy_factory: ProxyFactory, http_origin: Origin
) -> None:
    policy = proxy_policy([http_origin.cidr], ports=[http_origin.port], proxy={"idle_timeout_s": 1.0})
    proxy = proxy_factory(policy)
    with httpx.Client(proxy=proxy.url, timeout=20) as client, pytest.raises(httpx.RemoteProtocolError):
        client.get(http_origin.url("/stall"))
    lines = proxy.wait_audit(lambda lines: any(line.get("close_reason") == "timeout" for line in lines))
    assert any(line.get("close_reason") == "timeout" for line in lines)


class ClosingKeepAliveOrigin:
    """Answers the first request on each connection with keep-alive, then closes the connection
    when the next request arrives without answering it: an origin whose keep-alive timeout fires
    just as a pooled connection is reused, made deterministic."""

    def __init__(self, ip: str) -> None:
        self.listener = socket.create_server((ip, 0))
        self.ip = ip
        self.port: int = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_head(self, conn: socket.socket) -> bytes:
        data = read_head(conn)
        return data if b"\r\n\r\n" in data else b""

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            first = self._read_head(conn)
            if not first:
                return
            self.requests.append(first.split(b"\r\n", 1)[0])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
            second = self._read_head(conn)
            if second:
                self.requests.append(second.split(b"\r\n", 1)[0])
            # Close without answering: the proxy sees EOF before any response byte.

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def closing_origin(origins: OriginFactory, fake_dns: FakeDNS) -> Iterator[ClosingKeepAliveOrigin]:
    origin = ClosingKeepAliveOrigin(origins.next_ip())
    fake_dns.add("stale.example.org", origin.ip)
    yield origin
    origin.close()


def test_idempotent_request_on_a_stale_pooled_connection_is_retried_once_on_a_fresh_one(
    proxy_factory: ProxyFactory, closing_origin: ClosingKeepAliveOrigin
) -> None:
    proxy = proxy_factory(proxy_policy([f"{closing_origin.ip}/32"], ports=[closing_origin.port]))
    url = f"http://stale.example.org:{closing_origin.port}/"
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        first = client.get(url)
        second = client.get(url)
    assert (first.status_code, first.content) == (200, b"ok")
    assert (second.status_code, second.content) == (200, b"ok")
    # The second GET went out on the pooled connection (closed unanswered), then on a fresh one.
    assert closing_origin.connections == 2
    assert closing_origin.requests == [b"GET / HTTP/1.1"] * 3


def test_post_on_a_stale_pooled_connection_is_not_retried(
    proxy_factory: ProxyFactory, closing_origin: ClosingKeepAliveOrigin
) -> None:
    proxy = proxy_factory(proxy_policy([f"{closing_origin.ip}/32"], ports=[closing_origin.port]))
    url = f"http://stale.example.org:{closing_origin.port}/"
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        assert client.post(url, content=b"a").status_code == 200
        second = client.post(url, content=b"b")
    # The origin may have acted on the POST: the client decides whether to send it again.
    assert second.status_code == 502
    assert second.headers["X-Egress-Code"] == "connect_failure"
    assert closing_origin.connections == 1


def _get_twice(proxy: ProxyProcess, url: str) -> list[httpx.Response]:
    """Two requests on one keep-alive connection: the first decided on a DNS cache miss (awaiting
    the resolver), the second from the cache (the synchronous fast path)."""
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        return [client.get(url), client.get(url)]


def test_cached_decision_still_refuses_a_name_resolving_to_a_denied_address(
    proxy_factory: ProxyFactory, http_origin: Origin, fake_dns: FakeDNS
) -> None:
    fake_dns.add("inside.example.org", "10.1.2.3", ttl=300)
    proxy = proxy_factory(proxy_policy([http_origin.cidr], ports=[http_origin.port]))
    responses = _get_twice(proxy, f"http://inside.example.org:{http_origin.port}/")
    assert [r.status_code for r in responses] == [403, 403]
    assert [r.headers["X-Egress-Code"] for r in responses] == ["blocked_destination"] * 2


def test_cached_decision_still_refuses_the_gateways_own_address(proxy_factory: ProxyFactory, fake_dns: FakeDNS) -> None:
    fake_dns.add("self.example.org", "127.0.0.1", ttl=300)
    port = free_port()
    # Even a policy that opens 127.0.0.1 and the proxy's port cannot make the proxy dial itself.
    proxy = proxy_factory(proxy_policy(["127.0.0.1/32"], ports=[port]), port)
    responses = _get_twice(proxy, f"http://self.example.org:{port}/")
    assert [r.status_code for r in responses] == [403, 403]
    assert [r.headers["X-Egress-Code"] for r in responses] == ["blocked_destination"] * 2


def test_cached_decision_in_report_mode_allows_and_audits_would_deny_each_time(
    proxy_factory: ProxyFactory, http_origin: Origin, fake_dns: FakeDNS
) -> None:
    fake_dns.add(http_origin.name, http_origin.ip, ttl=300)
    principals = {"default": {"egress": {"allow_domains": ["only.example.com"]}}}
    policy = proxy_policy(
        [http_origin.cidr], ports=[http_origin.port], principals=principals, defaults={"mode": "report"}
    )
    proxy = proxy_factory(policy)
    responses = _get_twice(proxy, http_origin.url("/"))
    assert [r.status_code for r in responses] == [200, 200]
    lines = proxy.wait_audit(lambda lines: sum(line.get("decision") == "would_deny" for line in lines) >= 2)
    decisions = [line for line in lines if line["event"] == "decision"]
    assert [(d["decision"], d["code"]) for d in decisions] == [("would_deny", "policy_denied")] * 2


def test_cached_decision_follows_a_policy_denial_on_every_request(
    proxy_factory: ProxyFactory, http_origin: Origin, fake_dns: FakeDNS
) -> None:
    fake_dns.add(http_origin.name, http_origin.ip, ttl=300)
    principals = {"default": {"egress": {"allow_domains": ["only.example.com"]}}}
    proxy = proxy_factory(proxy_policy([http_origin.cidr], ports=[http_origin.port], principals=principals))
    responses = _get_twice(proxy, http_origin.url("/"))
    assert [r.status_code for r in responses] == [403, 403]
    assert [r.headers["X-Egress-Code"] for r in responses] == ["policy_denied"] * 2
