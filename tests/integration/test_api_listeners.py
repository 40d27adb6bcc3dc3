"""The tools API and admin listeners under abuse, through the real daemon.

A client resetting mid-request leaves no traceback; idle and slowloris connections are dropped at
the head deadline; each listener has its own connection budget, so holding more connections than
the process has file descriptors neither stops /healthz nor the proxy; the open-files limit the
gateway runs with is in /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, Origin, OriginFactory

SITE = "slow.example.org"
# The daemon runs with this many descriptors: fewer than the connections the attack holds.
NOFILE = 512
ATTACK_CONNECTIONS = 700
HEAD_TIMEOUT_S = 1.0
CLOSE_WAIT_S = 15.0


class LimitedGateway(GatewayProcess):
    """The daemon started under `prlimit`, so the attack can outnumber its file descriptors."""

    def start(self) -> LimitedGateway:
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                ["prlimit", f"--nofile={NOFILE}:{NOFILE}", sys.executable, "-m", "gateway", "serve"],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=self.workdir,
            )
        self.wait_ready()
        return self


def slow_site() -> web.Application:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(text="<html><body><p>late</p></body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", slow)
    return app


@pytest.fixture(scope="module")
def site(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[Origin]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    yield factory.start(slow_site(), names=[SITE])
    factory.stop_all()


@pytest.fixture(scope="module")
def gateway(
    site: Origin, tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI
) -> Iterator[LimitedGateway]:
    policy = policy_document(
        allow_cidrs=[site.cidr],
        ports=[80, 443, site.port],
        proxy={"head_timeout_s": HEAD_TIMEOUT_S},
        fetch={"robots": "ignore"},
    )
    workdir: Path = tmp_path_factory.mktemp("listeners")
    process = LimitedGateway(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path)
    process.start()
    yield process
    process.stop()


def reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): the peer sees a reset, not a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def closed_by_server(sock: socket.socket, deadline_s: float = CLOSE_WAIT_S) -> bool:
    sock.settimeout(deadline_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def healthz(gateway: GatewayProcess) -> int:
    return httpx.get(f"{gateway.admin_url}/healthz", timeout=5).status_code


def proxy_answers(gateway: GatewayProcess) -> bool:
    """The proxy accepts and decides: a CONNECT to a loopback address is refused with 403."""
    with connect(gateway.proxy_port) as sock:
        sock.sendall(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        sock.settimeout(5)
        return sock.recv(200).startswith(b"HTTP/1.1 403")


@contextlib.contextmanager
def held_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            with contextlib.suppress(OSError):
                sockets.append(connect(port))
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def test_a_client_reset_mid_request_leaves_no_traceback(gateway: LimitedGateway, site: Origin) -> None:
    head = (
        "POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        "Accept: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    partial_body = b'{"url": "https://slow.exam'
    for path in ("/v1/fetch", "/v1/search", "/mcp"):
        sock = connect(gateway.api_port)
        sock.sendall(head.format(path=path, length=500).encode() + partial_body)
        time.sleep(0.1)
        reset(sock)
        sock = connect(gateway.api_port)
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\nContent-Le")
        reset(sock)
    # A reset while the tool call is still running (the origin answers after 3 s).
    body = b'{"url": "' + site.url("/page").encode() + b'"}'
    call = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"web_fetch","arguments":' + body + b"}}"
    for path, payload in (("/v1/fetch", body), ("/mcp", call)):
        sock = connect(gateway.api_port)
        sock.sendall(head.format(path=path, length=len(payload)).encode() + payload)
        time.sleep(0.5)
        reset(sock)
    time.sleep(3.5)
    assert httpx.get(f"{gateway.api_url}/openapi.json", timeout=5).status_code == 200
    stderr = gateway.stderr()
    assert "Traceback" not in stderr
    assert "Error handling request" not in stderr


def test_idle_and_slowloris_connections_are_dropped_at_the_head_deadline(gateway: LimitedGateway) -> None:
    for port in (gateway.api_port, gateway.admin_port):
        idle = connect(port)
        slow = connect(port)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")
        dripped = 0
        slow.settimeout(0.2)
        # Keep dripping header bytes well past the head deadline; the server must close anyway.
        for _ in range(40):
            try:
                slow.sendall(b"X")
                dripped += 1
                if slow.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        assert closed_by_server(idle)
        assert closed_by_server(slow)
        assert dripped < 40
        idle.close()
        slow.close()


def test_holding_more_connections_than_descriptors_starves_neither_healthz_nor_the_proxy(
    gateway: LimitedGateway,
) -> None:
    with held_connections(gateway.api_port, ATTACK_CONNECTIONS) as held:
        assert len(held) > NOFILE
        assert healthz(gateway) == 200
        assert proxy_answers(gateway)
        metrics = httpx.get(f"{gateway.admin_url}/metrics", timeout=5).text
    with held_connections(gateway.admin_port, ATTACK_CONNECTIONS) as held:
        assert len(held) > NOFILE
        # The admin listener is full, but its budget is its own: the API and the proxy still answer.
        assert httpx.get(f"{gateway.api_url}/openapi.json", timeout=5).status_code == 200
        assert proxy_answers(gateway)
    assert healthz(gateway) == 200
    assert f"egress_gateway_open_files_limit {float(NOFILE)}" in metrics
    refused = re.search(r'egress_gateway_listener_connections_refused_total\{listener="api"\} (\d+)', metrics)
    assert refused is not None
    assert int(refused.group(1).split(".")[0]) > 0
    assert "Traceback" not in gateway.stderr()


def test_a_body_that_does_not_arrive_in_time_is_answered_504_and_closed(gateway: LimitedGateway) -> None:
    sock = connect(gateway.api_port)
    sock.sendall(
        b"POST /v1/fetch HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"
    )
    sock.settimeout(0.5)
    answer = b""
    # Drip body bytes past the body deadline (10 s); the bounded loop gives up after 40 s.
    for _ in range(80):
        try:
            sock.sendall(b" ")
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if not chunk:
            break
        answer += chunk
        if b"\r\n\r\n" in answer and b'"timeout"' in answer:
            break
    sock.close()
    assert answer.startswith(b"HTTP/1.1 504"), answer[:200]
    assert b'"code":"timeout"' in answer
