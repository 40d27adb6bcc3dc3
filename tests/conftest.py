"""Session fixtures: the fake DNS, the test PKI, loopback origins, gateway processes, Redis."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from xdist.remote import Producer

from tests.harness.audit_schema import NOTED_LINE_KINDS, NOTED_PROBLEMS, all_errors, line_kinds
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.parallel import FileScheduling

# Fixture modules of the harness: a test module asks for their fixtures by name, never imports them.
# A module another one imports comes first (proxy before inspection), or pytest cannot rewrite its
# asserts and warns, which `filterwarnings = error` makes fatal.
pytest_plugins = [
    "tests.harness.proxy",
    "tests.harness.cli",
    "tests.harness.inspection",
    "tests.harness.mcp_gateway",
    "tests.harness.redis_server",
    "tests.harness.redis_topologies",
    "tests.harness.scripted_origin",
]


# The line kinds each of these tests writes: when it passed, the session's schema check must
# have seen them, so no kind of line escapes validation (issue 16: every line kind is covered).
_AUDIT = "tests/integration/test_audit_log.py::"
_PROXY = "tests/integration/test_proxy_audit_fields.py::"
LINE_KINDS_BY_TEST: dict[str, set[tuple[str, str]]] = {
    _PROXY + "test_every_proxy_decision_names_its_rule": {("decision", "http"), ("decision", "connect")},
    _PROXY + "test_a_forwarded_response_carries_the_id_and_its_close_line_the_status_bytes_and_address": {
        ("close", "http")
    },
    _PROXY + "test_connect_answers_with_the_conn_that_its_decision_and_close_lines_share": {("close", "connect")},
    _PROXY + "test_a_burst_of_failed_credentials_is_counted_in_a_metric_while_the_log_aggregates_it": {
        ("repeated", "http")
    },
    _AUDIT + "test_every_api_response_names_its_request_and_every_tool_line_its_rule": {
        ("decision", "fetch"),
        ("decision", "search"),
        ("decision", "run_token"),
    },
    "tests/integration/test_mcp_http.py::test_a_guessed_bearer_token_on_mcp_is_audited_and_counted_as_on_v1": {
        ("decision", "mcp")
    },
    _AUDIT + "test_the_first_line_of_a_start_is_audit_started": {("audit_started", "")},
    _AUDIT + "test_a_lost_audit_destination_refuses_egress_until_it_can_be_written_again": {("audit_resumed", "")},
    "tests/transparent/test_transparent_tcp.py::test_curl_https_without_proxy_settings_is_forced_through_the_gateway": {
        ("decision", "transparent"),
        ("close", "transparent"),
    },
    "tests/transparent/test_transparent_dns.py::test_an_allowed_name_resolves_through_the_listener": {
        ("decision", "dns")
    },
}
_PASSED: set[str] = set()


# tryfirst: xdist's own hook would answer `--dist loadfile` with its plain file scheduling.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> FileScheduling | None:
    """`--dist loadfile` (as `make test` runs): whole files per worker, the netns files as one."""
    return FileScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _PASSED.add(report.nodeid)


@pytest.fixture(scope="session", autouse=True)
def audit_lines_match_the_schema() -> Iterator[None]:
    """After the whole session: every audit line any harness gateway wrote is valid schema v1,
    and every line kind a passed test writes was among the lines checked."""
    yield
    problems = NOTED_PROBLEMS + all_errors(GatewayProcess.audit_files)
    if problems:
        shown = "\n".join(problems[:20])
        pytest.fail(f"{len(problems)} audit line problem(s) against audit.schema.json:\n{shown}")
    seen = set(NOTED_LINE_KINDS)
    for path in GatewayProcess.audit_files:
        seen |= line_kinds(path)
    unchecked = {
        test: sorted(kinds - seen) for test, kinds in LINE_KINDS_BY_TEST.items() if test in _PASSED and kinds - seen
    }
    if unchecked:
        pytest.fail(f"line kinds written by passed tests but never schema-checked: {unchecked}")


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


@pytest.fixture(scope="module")
def module_origins(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[OriginFactory]:
    """`origins` for origins a whole module shares (with a gateway it shares), stopped after it."""
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
