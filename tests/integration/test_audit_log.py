"""The audit log of a real daemon: ids echoed to clients, fail-closed on a lost destination with
/readyz saying why, recovery, reopen on SIGUSR1, and a clear start-up failure."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.audit_file import audit_records
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin, OriginFactory
from tests.harness.run_tokens import SECRET_ENV, TEST_ORCHESTRATORS, mint

WAIT_S = 10.0


def _app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body><p>audited page</p></body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


def _lines(path: Path) -> list[dict[str, Any]]:
    return audit_records(path)


def _fetch(gateway: GatewayProcess, origin: Origin) -> httpx.Response:
    return httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": origin.url("/page")}, timeout=20)


def _start(gateway_factory: GatewayFactory, origin: Origin, audit_path: Path, **env: str) -> GatewayProcess:
    GatewayProcess.audit_files.append(audit_path)
    policy = policy_document(allow_cidrs=[origin.cidr], ports=[80, 443, origin.port])
    return gateway_factory(policy, env={"EGRESS_AUDIT_LOG": str(audit_path), **env})


def _wait_ready(gateway: GatewayProcess, *, ready: bool) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    status, body = gateway.readyz()
    while (status == 200) != ready and time.monotonic() < deadline:
        time.sleep(0.05)
        status, body = gateway.readyz()
    assert (status == 200) == ready, body
    return body


def test_the_tools_api_echoes_the_line_id_and_the_line_carries_the_client(
    gateway_factory: GatewayFactory, origins: OriginFactory, tmp_path: Path
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    audit_path = tmp_path / "audit.log"
    gateway = _start(gateway_factory, origin, audit_path)
    response = httpx.post(
        f"{gateway.api_url}/v1/fetch",
        json={"url": origin.url("/page?q=secret")},
        headers={"X-Egress-Run": "run-7", "X-Egress-Step": "step-2"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    (line,) = [line for line in _lines(audit_path) if line["event"] == "decision"]
    assert response.headers["X-Egress-Id"] == line["conn"]
    assert line["client_ip"] == "127.0.0.1"
    assert isinstance(line["client_port"], int)
    assert (line["decision"], line["outcome"], line["run"], line["step"]) == ("allow", "ok", "run-7", "step-2")
    assert (line["rule"], line["rule_pattern"]) == ("allow_domains[0]", "*")
    assert "secret" not in audit_path.read_text()


def test_every_api_response_names_its_request_and_every_tool_line_its_rule(
    gateway_factory: GatewayFactory, origins: OriginFactory, tmp_path: Path
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    audit_path = tmp_path / "audit.log"
    GatewayProcess.audit_files.append(audit_path)
    principals = {
        "default": {"egress": {"allow_domains": ["docs.example.org"]}, "tools": {"fetch": True, "search": False}},
    }
    policy = policy_document(
        allow_cidrs=[origin.cidr], ports=[80, 443, origin.port], principals=principals, orchestrators=TEST_ORCHESTRATORS
    )
    gateway = gateway_factory(policy, env={"EGRESS_AUDIT_LOG": str(audit_path), **SECRET_ENV})
    api = gateway.api_url
    calls = {
        "fetch-allowed": httpx.post(f"{api}/v1/fetch", json={"url": origin.url("/page")}, timeout=20),
        "fetch-denied": httpx.post(f"{api}/v1/fetch", json={"url": f"http://other.example.org:{origin.port}/"}),
        "search-switched-off": httpx.post(f"{api}/v1/search", json={"query": "anything"}),
        "malformed": httpx.post(f"{api}/v1/fetch", content=b"{", headers={"Content-Type": "application/json"}),
        "run-token": mint(api, {"principal": "default", "run": "run-9"}),
    }
    others = [httpx.get(f"{api}/v1/tools"), httpx.get(f"{api}/v1/nothing-here"), httpx.get(f"{api}/openapi.json")]
    assert [response.status_code for response in calls.values()] == [200, 403, 403, 400, 200]
    assert all(response.headers.get("X-Egress-Id") for response in others)
    by_conn = {line["conn"]: line for line in _lines(audit_path) if line["event"] == "decision"}
    lines = {name: by_conn[response.headers["X-Egress-Id"]] for name, response in calls.items()}
    assert {name: (line["kind"], line["decision"], line.get("rule")) for name, line in lines.items()} == {
        "fetch-allowed": ("fetch", "allow", "allow_domains[0]"),
        "fetch-denied": ("fetch", "deny", "default_deny"),
        "search-switched-off": ("search", "deny", "tools.search"),
        "malformed": ("fetch", "none", None),
        "run-token": ("run_token", "allow", "orchestrators"),
    }
    assert lines["fetch-allowed"]["rule_pattern"] == "docs.example.org"
    assert lines["fetch-allowed"]["address"] == origin.ip
    assert lines["run-token"]["client_ip"] == "127.0.0.1"


def test_a_lost_audit_destination_refuses_egress_until_it_can_be_written_again(
    gateway_factory: GatewayFactory, origins: OriginFactory, tmp_path: Path
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    directory = tmp_path / "logs"
    directory.mkdir()
    audit_path = directory / "audit.log"
    gateway = _start(gateway_factory, origin, audit_path)
    assert _fetch(gateway, origin).status_code == 200

    shutil.rmtree(directory)
    _fetch(gateway, origin)  # its line cannot be written: the gateway learns the destination is gone
    refused = _fetch(gateway, origin)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "audit_unavailable"
    with httpx.Client(proxy=gateway.proxy_url, timeout=10) as client:
        proxied = client.get(origin.url("/page"))
    assert proxied.status_code == 503
    assert proxied.headers["X-Egress-Code"] == "audit_unavailable"
    body = _wait_ready(gateway, ready=False)
    assert body["checks"]["audit_writable"] is False
    assert "audit.log" in body["reasons"]["audit_writable"]
    metrics = httpx.get(f"{gateway.admin_url}/metrics", timeout=5).text
    assert "egress_gateway_audit_writable 0.0" in metrics
    assert "egress_gateway_audit_write_failures_total 0.0" not in metrics

    directory.mkdir()
    _wait_ready(gateway, ready=True)
    assert _fetch(gateway, origin).status_code == 200
    lines = _lines(audit_path)
    assert any(line["event"] == "audit_resumed" for line in lines)
    assert any(line.get("code") == "audit_unavailable" for line in lines), "the refusals are audited once back"


def test_audit_failure_allow_keeps_traffic_flowing(
    gateway_factory: GatewayFactory, origins: OriginFactory, tmp_path: Path
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    directory = tmp_path / "logs"
    directory.mkdir()
    gateway = _start(gateway_factory, origin, directory / "audit.log", EGRESS_AUDIT_ON_FAILURE="allow")
    shutil.rmtree(directory)
    assert [_fetch(gateway, origin).status_code for _ in range(3)] == [200, 200, 200]
    assert gateway.readyz()[0] == 200


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGHUP], ids=["sigusr1", "sighup"])
def test_a_signal_reopens_the_audit_file_after_logrotate_moved_it(
    gateway_factory: GatewayFactory, origins: OriginFactory, tmp_path: Path, signum: signal.Signals
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    audit_path = tmp_path / "audit.log"
    gateway = _start(gateway_factory, origin, audit_path)
    assert _fetch(gateway, origin).status_code == 200
    rotated = tmp_path / "audit.log.1"
    audit_path.rename(rotated)
    GatewayProcess.audit_files.append(rotated)
    gateway.signal(signum)
    deadline = time.monotonic() + WAIT_S
    while not audit_path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _fetch(gateway, origin).status_code == 200
    assert [line["event"] for line in _lines(rotated)] == ["audit_started", "decision"]
    assert [line["event"] for line in _lines(audit_path)] == ["decision"]


def test_an_unwritable_audit_destination_is_a_one_line_start_up_failure(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "EGRESS_AUDIT_LOG": str(tmp_path / "missing" / "audit.log"),
        "EGRESS_PROXY_LISTEN": "127.0.0.1:0",
        "EGRESS_API_LISTEN": "127.0.0.1:0",
        "EGRESS_ADMIN_LISTEN": "127.0.0.1:0",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"egress-gateway: EGRESS_AUDIT_LOG: cannot open {tmp_path}/missing/audit.log: No such file or directory"
    )


def _admin_answer(gateway: GatewayProcess) -> tuple[int, dict[str, Any]]:
    """/readyz once the admin listener answers (the daemon not being ready is the point)."""
    deadline = time.monotonic() + WAIT_S * 3
    while True:
        try:
            return gateway.readyz()
        except (OSError, ValueError):
            assert gateway.process is not None
            assert gateway.process.poll() is None, gateway.stderr()
            assert time.monotonic() < deadline, gateway.stderr()
            time.sleep(0.05)


def test_a_full_disk_at_start_is_seen_before_readiness_and_before_the_first_allow(
    origins: OriginFactory, fake_dns: Any, tmp_path: Path
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    policy = policy_document(allow_cidrs=[origin.cidr], ports=[80, 443, origin.port])
    # /dev/full opens for writing and fails every write with ENOSPC: a disk that is full from the start.
    gateway = GatewayProcess(
        tmp_path, policy, nameserver=fake_dns.nameserver, ca_bundle=None, env={"EGRESS_AUDIT_LOG": "/dev/full"}
    ).launch()
    try:
        status, body = _admin_answer(gateway)
        assert status == 503, body
        assert body["checks"]["audit_writable"] is False
        assert "No space left on device" in body["reasons"]["audit_writable"]
        # The very first request through each surface is refused, not served unaudited.
        fetched = _fetch(gateway, origin)
        assert fetched.status_code == 503, fetched.text
        assert fetched.json()["error"]["code"] == "audit_unavailable"
        with httpx.Client(proxy=gateway.proxy_url, timeout=10) as client:
            proxied = client.get(origin.url("/page"))
        assert (proxied.status_code, proxied.headers.get("X-Egress-Code")) == (503, "audit_unavailable")
        assert "Traceback" not in gateway.stderr()
    finally:
        gateway.stop()


def test_the_first_line_of_a_start_is_audit_started(
    gateway_factory: GatewayFactory, origins: OriginFactory, tmp_path: Path
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"], tls=False)
    audit_path = tmp_path / "audit.log"
    _start(gateway_factory, origin, audit_path)
    first = _lines(audit_path)[0]
    assert (first["event"], first["generation"]) == ("audit_started", 1)
