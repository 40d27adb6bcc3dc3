"""The proxy tests' harness: a real `egress-gateway serve`, seen from its proxy listener.

`ProxyProcess` is a `GatewayProcess` (policy file, fake DNS, test CA, audit file, free loopback
ports) with helpers to read its RSS and wait for audit lines, so tests can drive the proxy with
curl and httpx exactly as an agent would and send the daemon SIGTERM; `proxy_factory` is the
fixture that starts them (`module_proxy_factory` for one a module shares), `raw_exchange` talks raw
bytes to one, `open_tunnel` sends it a CONNECT and `read_head` reads an answer's head. The root
conftest loads this module as a pytest plugin. No tests live here.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.harness.certs import TestPKI
from tests.harness.gateway import GatewayProcess, policy_document


class ProxyProcess(GatewayProcess):
    """A real `egress-gateway serve` seen from its proxy listener, with RSS and audit helpers."""

    def __init__(
        self, workdir: Path, policy: Mapping[str, Any], nameserver: str, ca_bundle: Path, port: int | None = None
    ) -> None:
        super().__init__(workdir, policy, nameserver=nameserver, ca_bundle=ca_bundle)
        if port is not None:
            self.proxy_port = port
            self.env["EGRESS_PROXY_LISTEN"] = f"127.0.0.1:{port}"

    @property
    def port(self) -> int:
        return self.proxy_port

    @property
    def url(self) -> str:
        return self.proxy_url

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS line")


def proxy_policy(
    allow_cidrs: Sequence[str],
    *,
    proxy: Mapping[str, Any] | None = None,
    principals: Mapping[str, Any] | None = None,
    ports: Sequence[int] = (80, 443),
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    if proxy:
        sections["proxy"] = dict(proxy)
    if defaults:
        sections["defaults"] = dict(defaults)
    return policy_document(allow_cidrs=allow_cidrs, ports=ports, principals=principals, **sections)


def basic(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


def raw_exchange(port: int, payload: bytes, *, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes to the proxy and read until it closes (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        chunks: list[bytes] = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


def read_head(sock: socket.socket) -> bytes:
    """What arrives up to a head's end (`\r\n\r\n`), with whatever the same reads brought after
    it; without the end when the peer closed first (so a caller's assertion shows what came)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def open_tunnel(port: int, authority: str, *headers: str, timeout_s: float = 5.0) -> tuple[socket.socket, bytes]:
    """A CONNECT for `authority` (with extra header lines) to the proxy on `port`: the socket, left
    open for the tunnel, and the proxy's answer head."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    extra = "".join(header + "\r\n" for header in headers)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n".encode())
    return sock, read_head(sock)


P = TypeVar("P", bound=ProxyProcess)


def starting_proxies(
    process_class: Callable[[Path, Mapping[str, Any], str, Path, Any], P],
    tmp_path: Path,
    nameserver: str,
    ca_path: Path,
    prefix: str = "proxy",
) -> tuple[Callable[..., P], list[P]]:
    """A `start(policy, port)` that runs one more gateway of `process_class` in its own workdir,
    and the list it appends to, for the fixture to stop them all."""
    started: list[P] = []

    def start(policy: Mapping[str, Any], port: Any = None) -> P:
        workdir = tmp_path / f"{prefix}{len(started)}"
        workdir.mkdir()
        process = process_class(workdir, policy, nameserver, ca_path, port)
        started.append(process)
        process.start()
        return process

    return start, started


@pytest.fixture
def proxy_factory(tmp_path: Path, fake_dns: Any, pki: TestPKI) -> Iterator[Any]:
    start, started = starting_proxies(ProxyProcess, tmp_path, fake_dns.nameserver, pki.ca_path)
    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="module")
def module_proxy_factory(tmp_path_factory: pytest.TempPathFactory, fake_dns: Any, pki: TestPKI) -> Iterator[Any]:
    """`proxy_factory` for gateways a whole module shares, stopped after its last test."""
    workdir = tmp_path_factory.mktemp("module-proxies")
    start, started = starting_proxies(ProxyProcess, workdir, fake_dns.nameserver, pki.ca_path)
    yield start
    for process in started:
        process.stop()
