"""Start-up through the real CLI: settings file and precedence, misspelled and malformed settings as
one-line errors, --version, the start-up summary, and the metrics exposition's hygiene."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway import __version__
from tests.conftest import GatewayFactory
from tests.harness.gateway import free_port, policy_document

CLI_TIMEOUT_S = 30


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
        cwd=cwd,
    )


def test_version_prints_the_package_version() -> None:
    result = _cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"egress-gateway {__version__}"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"EGRESS_PROXY_LISTN": "127.0.0.1:3128"},
            "egress-gateway: EGRESS_PROXY_LISTN is not a known setting (did you mean EGRESS_PROXY_LISTEN?)",
            id="misspelled-variable",
        ),
        pytest.param(
            {"EGRESS_NAMESERVERS": "dns.example:53"},
            "egress-gateway: EGRESS_NAMESERVERS: 'dns.example:53' is not IP[:PORT] (e.g. 10.0.0.10:53)",
            id="nameserver-not-an-address",
        ),
        pytest.param(
            {"EGRESS_NAMESERVERS": "127.0.0.1:99999"},
            "egress-gateway: EGRESS_NAMESERVERS: '127.0.0.1:99999' has a port out of range",
            id="nameserver-port",
        ),
        pytest.param(
            {"EGRESS_AUDIT_ON_FAILURE": "ignore"},
            "egress-gateway: EGRESS_AUDIT_ON_FAILURE: 'ignore' is not deny or allow",
            id="audit-on-failure",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(env: dict[str, str], message: str) -> None:
    result = _cli("serve", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == message


def test_a_ca_bundle_that_does_not_load_stops_the_start(tmp_path: Path) -> None:
    # The trust store itself is built on first use; the operator's bundle is still read at start.
    bundle = tmp_path / "extra.pem"
    bundle.write_text("not a certificate\n")
    result = _cli("serve", env={"EGRESS_CA_BUNDLE": str(bundle), "EGRESS_AUDIT_LOG": "off"})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"egress-gateway: EGRESS_CA_BUNDLE {str(bundle)!r} cannot be loaded: ")


def test_a_misspelled_settings_file_key_names_the_closest_key(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('proxy_listen = "127.0.0.1:3128"\n[audit]\non_failre = "allow"\n')
    result = _cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "egress-gateway: settings file key 'audit_on_failre' is not a known setting (did you mean audit_on_failure?)"
    )


def test_a_settings_file_that_does_not_parse_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("proxy_listen: [unclosed\n")
    result = _cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"egress-gateway: --config {config}: not valid YAML/TOML")


def test_flags_win_over_env_which_wins_over_the_settings_file(gateway_factory: GatewayFactory, tmp_path: Path) -> None:
    file_admin, file_api, env_api = free_port(), free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"admin_listen: 127.0.0.1:{file_admin}\napi_listen: 127.0.0.1:{file_api}\naudit:\n  on_failure: allow\n"
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nprincipals:\n  default:\n    egress: {allow_domains: ['*']}\n")
    proxy_flag = free_port()
    env = {
        "EGRESS_POLICY": str(policy),
        "EGRESS_API_LISTEN": f"127.0.0.1:{env_api}",
        "EGRESS_PROXY_LISTEN": "127.0.0.1:1",  # the flag below wins
        "EGRESS_AUDIT_LOG": "off",
    }
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    command = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    with subprocess.Popen(
        [*command, "--proxy-listen", f"127.0.0.1:{proxy_flag}"],
        env={**base, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            ready = _wait_http(f"http://127.0.0.1:{file_admin}/readyz", process)
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=15)
    assert ready.status_code == 200
    assert f"proxy 127.0.0.1:{proxy_flag}, api 127.0.0.1:{env_api}, admin 127.0.0.1:{file_admin}" in stderr
    assert "on failure allow" in stderr


def _wait_http(url: str, process: subprocess.Popen[str]) -> httpx.Response:
    for _ in range(400):
        if process.poll() is not None:
            raise AssertionError(f"gateway exited with {process.returncode}")
        try:
            return httpx.get(url, timeout=1)
        except httpx.TransportError:
            subprocess.run(["sleep", "0.05"], check=True)
    raise AssertionError(f"{url} never answered")


def test_the_start_up_line_says_what_is_in_force_without_credentials(gateway_factory: GatewayFactory) -> None:
    env = {"EGRESS_REDIS_URL": "redis://agent:hunter2@127.0.0.1:1/0", "EGRESS_SEARCH_ENGINES": "tavily,duckduckgo"}
    gateway = gateway_factory(policy_document(), env=env)
    (line,) = [line for line in gateway.stderr().splitlines() if "serving:" in line]
    assert f"egress-gateway {__version__} serving: policy {gateway.policy_path} generation 1 sha256 " in line
    assert "mode enforce" in line
    assert "principals default" in line
    assert "engines duckduckgo; skipped tavily (no key)" in line
    assert "store redis://***@127.0.0.1:1/0" in line
    assert "hunter2" not in gateway.stderr()
    # The store does not answer: the tools are not ready, the proxy is.
    assert gateway.readyz()[0] == 200
    assert gateway.readyz("/readyz/tools")[0] == 503


def test_metrics_carry_build_info_and_process_metrics_without_created_or_empty_codes(
    gateway_factory: GatewayFactory,
) -> None:
    gateway = gateway_factory(policy_document())
    httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": "https://127.0.0.1/"}, timeout=10)
    text = httpx.get(f"{gateway.admin_url}/metrics", timeout=5).text
    assert 'egress_gateway_build_info{policy_sha256="' in text
    assert f'version="{__version__}"' in text
    assert "process_resident_memory_bytes" in text
    assert "_created" not in text
    assert 'code=""' not in text
    assert 'egress_gateway_decisions_total{code="unsafe_url",decision="deny",kind="fetch"} 1.0' in text


def test_check_finds_the_default_policy_from_any_directory(tmp_path: Path) -> None:
    result = _cli("check", "https://metadata.google.internal/", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert '"code":"unsafe_url"' in result.stdout
