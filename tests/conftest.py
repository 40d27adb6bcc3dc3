"""Session fixtures: the fake DNS, the test PKI, loopback origins, gateway processes, Redis."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.harness.audit_schema import all_errors
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess
from tests.harness.origins import HarnessLoop, OriginFactory

pytest_plugins = ["tests.harness.redis_server", "tests.harness.redis_topologies"]


@pytest.fixture(scope="session", autouse=True)
def audit_lines_match_the_schema() -> Iterator[None]:
    """After the whole session: every audit line any harness gateway wrote is valid schema v1."""
    yield
    problems = all_errors(GatewayProcess.audit_files)
    if problems:
        shown = "\n".join(problems[:20])
        pytest.fail(f"{len(problems)} audit line problem(s) against audit.schema.json:\n{shown}")


@pytest.fixture(scope="session")
def fake_dns() -> Iterator[FakeDNS]:
    dns = FakeDNS().start()
    yield dns
    dns.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPKI:
    return TestPKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def harness_loop() -> Iterator[HarnessLoop]:
    loop = HarnessLoop()
    yield loop
    loop.stop()


@pytest.fixture
def origins(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[OriginFactory]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    yield factory
    factory.stop_all()


GatewayFactory = Callable[..., GatewayProcess]


@pytest.fixture
def gateway_factory(tmp_path: Path, fake_dns: FakeDNS, pki: TestPKI) -> Iterator[GatewayFactory]:
    started: list[GatewayProcess] = []

    def start(policy: Mapping[str, Any], env: Mapping[str, str] | None = None, name: str = "gw") -> GatewayProcess:
        workdir = tmp_path / f"{name}{len(started)}"
        workdir.mkdir()
        gateway = GatewayProcess(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path, env=env)
        started.append(gateway)
        return gateway.start()

    yield start
    for gateway in started:
        # Teardown must reach every gateway even when one of them fails to stop.
        with contextlib.suppress(Exception):
            gateway.stop()
