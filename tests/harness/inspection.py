"""Inspection tests' harness: a gateway with an interception CA, the files agents trust, the
environment each client gets (the CA only through the variables the docs list), and the policy
that inspects one origin. No tests here.

The root conftest loads this module as a pytest plugin, so a test module asks for
`inspecting_gateway` and `interception_ca` by name without importing them."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from tests.harness.proxy import open_tunnel, proxy_policy


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


InspectingGatewayFactory = Callable[..., InspectingGateway]


def _inspecting_gateways(
    workdir: Path, fake_dns: FakeDNS, pki: TestPKI, ca: InterceptionCA
) -> Iterator[InspectingGatewayFactory]:
    started: list[InspectingGateway] = []

    def start(policy: Mapping[str, Any], env: Mapping[str, str] | None = None) -> InspectingGateway:
        directory = workdir / f"gateway{len(started)}"
        directory.mkdir()
        settings = {"EGRESS_INSPECT_CA_CERT": str(ca.cert), "EGRESS_INSPECT_CA_KEY": str(ca.key), **(env or {})}
        process = InspectingGateway(
            directory, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path, env=settings
        )
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def inspecting_gateway(
    tmp_path: Path, fake_dns: FakeDNS, pki: TestPKI, interception_ca: InterceptionCA
) -> Iterator[InspectingGatewayFactory]:
    """`start(policy, env)`: a gateway with the interception CA, stopped after the test."""
    yield from _inspecting_gateways(tmp_path, fake_dns, pki, interception_ca)


@pytest.fixture(scope="module")
def module_inspecting_gateway(
    tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI, interception_ca: InterceptionCA
) -> Iterator[InspectingGatewayFactory]:
    """`inspecting_gateway` for a gateway a whole module shares, stopped after its last test."""
    yield from _inspecting_gateways(tmp_path_factory.mktemp("inspecting"), fake_dns, pki, interception_ca)


API = "api.example.org"


def inspect_policy(
    origin: Origin,
    entry: Mapping[str, Any],
    *,
    also: Sequence[Origin] = (),
    allow_domains: Sequence[str] = ("*",),
    proxy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A proxy policy whose default principal inspects `origin` (its first name, on its port) under
    `entry`'s rules (`access`, `allow`, `deny`); the origins in `also` are reachable, not inspected."""
    reachable = (origin, *also)
    inspected = {"host": origin.names[0], "ports": [origin.port], **entry}
    return proxy_policy(
        [each.cidr for each in reachable],
        principals={"default": {"egress": {"allow_domains": list(allow_domains)}, "inspect": [inspected]}},
        ports=[80, 443, *(each.port for each in reachable)],
        proxy=proxy,
    )


def tls_through(
    gateway: InspectingGateway,
    ca: InterceptionCA,
    origin: Origin,
    *,
    host: str = API,
    alpn: list[str] | None = None,
    timeout_s: float = 5.0,
) -> ssl.SSLSocket:
    """A CONNECT to `host` on the origin's port through `gateway`, then TLS trusting only the
    interception CA (so only the gateway's leaf for `host` passes)."""
    sock, answer = open_tunnel(gateway.port, f"{host}:{origin.port}", timeout_s=timeout_s)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    context = ssl.create_default_context(cafile=str(ca.ca_only))
    if alpn:
        context.set_alpn_protocols(alpn)
    return context.wrap_socket(sock, server_hostname=host)
