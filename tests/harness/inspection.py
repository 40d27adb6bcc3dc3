"""Inspection tests' harness: a gateway with an interception CA, the files agents trust, and the
environment each client gets (the CA only through the variables the docs list). No tests here."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import certifi
import pytest

from gateway.inspect.authority import create_authority, export_bundles, write_authority
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess
from tests.harness.origins import Origin


@dataclass(frozen=True)
class InterceptionCA:
    cert: Path
    key: Path
    ca_only: Path  # what NODE_EXTRA_CA_CERTS takes
    bundle: Path  # certifi + the CA: what SSL_CERT_FILE and the per-tool variables take

    def agent_env(self, proxy_url: str) -> dict[str, str]:
        """A client's environment: the proxy, and the CA through the variables only."""
        return {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "HTTPS_PROXY": proxy_url,
            "https_proxy": proxy_url,
            "HTTP_PROXY": proxy_url,
            "http_proxy": proxy_url,
            "NO_PROXY": "",
            "SSL_CERT_FILE": str(self.bundle),
            "REQUESTS_CA_BUNDLE": str(self.bundle),
            "CURL_CA_BUNDLE": str(self.bundle),
            "GIT_SSL_CAINFO": str(self.bundle),
            "PIP_CERT": str(self.bundle),
            "NPM_CONFIG_CAFILE": str(self.bundle),
            "NODE_EXTRA_CA_CERTS": str(self.ca_only),
        }


def make_interception_ca(directory: Path) -> InterceptionCA:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "ca.pem", directory / "private" / "ca-key.pem"
    write_authority(create_authority(), cert, key)
    ca_only, bundle = directory / "ca-only.pem", directory / "bundle.pem"
    export_bundles(cert.read_bytes(), Path(certifi.where()).read_bytes(), ca_only, bundle)
    return InterceptionCA(cert, key, ca_only, bundle)


@pytest.fixture(scope="session")
def interception_ca(tmp_path_factory: pytest.TempPathFactory) -> InterceptionCA:
    return make_interception_ca(tmp_path_factory.mktemp("interception"))


class InspectingGateway(GatewayProcess):
    """A real `egress-gateway serve` with the interception CA configured."""

    @property
    def port(self) -> int:
        return self.proxy_port

    def inspect_lines(self) -> list[dict[str, Any]]:
        return [line for line in self.audit_lines() if line.get("kind") == "inspect"]


@pytest.fixture
def inspecting_gateway(
    tmp_path: Path, fake_dns: FakeDNS, pki: TestPKI, interception_ca: InterceptionCA
) -> Iterator[Any]:
    started: list[InspectingGateway] = []

    def start(policy: Mapping[str, Any], env: Mapping[str, str] | None = None) -> InspectingGateway:
        workdir = tmp_path / f"gateway{len(started)}"
        workdir.mkdir()
        settings = {
            "EGRESS_INSPECT_CA_CERT": str(interception_ca.cert),
            "EGRESS_INSPECT_CA_KEY": str(interception_ca.key),
            **(env or {}),
        }
        process = InspectingGateway(
            workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path, env=settings
        )
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


API = "api.example.org"


def tls_through(
    gateway: InspectingGateway, ca: InterceptionCA, origin: Origin, *, alpn: list[str] | None = None
) -> ssl.SSLSocket:
    """A CONNECT to api.example.org through `gateway`, then TLS trusting only the interception CA."""
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=5)
    sock.sendall(f"CONNECT {API}:{origin.port} HTTP/1.1\r\nHost: {API}\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context(cafile=str(ca.ca_only))
    if alpn:
        context.set_alpn_protocols(alpn)
    return context.wrap_socket(sock, server_hostname=API)


def read_response(tls: ssl.SSLSocket) -> bytes:
    """Bytes up to the end of a response head (or the close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        if not chunk:
            break
        data += chunk
    return data
