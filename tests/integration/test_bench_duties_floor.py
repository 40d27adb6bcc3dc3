"""The bench's duties floor (`bench/proxy_duties.py`) does the duties its figures are quoted for.

The bench reads it as the least a policy-enforcing Python proxy costs, so a sketch that skipped a
duty (forwarded what it should refuse, wrote no audit line, lost the pooled connection) would make
that figure a floor of nothing. Real sockets: an aiohttp origin, httpx and a raw CONNECT client.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.harness.audit_file import audit_records
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import free_port
from tests.harness.origins import HarnessLoop, Origin, OriginFactory

SKETCH = Path(__file__).resolve().parents[2] / "bench" / "proxy_duties.py"
WAIT_S = 10.0


@pytest.fixture(scope="module")
def origin(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[Origin]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello {request.path}", headers={"Keep-Alive": "timeout=5"})

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    factory = OriginFactory(harness_loop, pki, fake_dns)
    yield factory.start(app, names=("bench.example.org",), tls=False, register_dns=False)
    factory.stop_all()


@pytest.fixture(scope="module")
def sketch(origin: Origin, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    port = free_port()
    audit = tmp_path_factory.mktemp("duties") / "audit.log"
    proc = subprocess.Popen([sys.executable, str(SKETCH), str(port), origin.ip, str(audit)])
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield port, audit
    finally:
        proc.terminate()
        proc.wait(10)


def audit_lines(audit: Path, at_least: int) -> list[dict[str, object]]:
    deadline = time.monotonic() + WAIT_S
    while True:
        lines: list[dict[str, object]] = audit_records(audit)
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines


def test_forwards_allowed_requests_on_one_pooled_connection_and_audits_each(
    origin: Origin, sketch: tuple[int, Path]
) -> None:
    port, audit = sketch
    before = len(audit_lines(audit, 0))
    with httpx.Client(proxy=f"http://127.0.0.1:{port}", timeout=WAIT_S) as client:
        answers = [client.get(f"http://bench.example.org:{origin.port}/n{i}") for i in range(3)]
        # Hop-by-hop fields of the origin's answer are not passed on.
        assert all("keep-alive" not in answer.headers for answer in answers)
    assert [(a.status_code, a.text) for a in answers] == [(200, f"hello /n{i}") for i in range(3)]
    lines = audit_lines(audit, before + 6)[before:]
    assert [(line["event"], line.get("decision"), line.get("status")) for line in lines] == [
        ("http", "allow", None),
        ("close", None, 200),
    ] * 3
    assert {line["address"] for line in lines} == {origin.ip}


def test_refuses_names_outside_the_allowlist_and_non_proxy_requests(origin: Origin, sketch: tuple[int, Path]) -> None:
    port, _ = sketch
    with httpx.Client(proxy=f"http://127.0.0.1:{port}", timeout=WAIT_S) as client:
        assert client.get(f"http://elsewhere.test:{origin.port}/").status_code == 403
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw:
        raw.sendall(b"GET /origin-form HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 400 ")


def test_opens_a_tunnel_and_cuts_one_that_sends_no_tls(origin: Origin, sketch: tuple[int, Path]) -> None:
    port, audit = sketch
    before = len(audit_lines(audit, 0))
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw:
        authority = f"bench.example.org:{origin.port}".encode()
        raw.sendall(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority))
        assert raw.recv(100).startswith(b"HTTP/1.1 200 ")
        raw.sendall(b"GET / HTTP/1.1\r\n\r\n")  # plain HTTP where a ClientHello must come
        assert raw.recv(100) == b""
    lines = audit_lines(audit, before + 2)[before:]
    assert [(line["event"], line.get("kind")) for line in lines] == [("connect", None), ("close", "connect")]
