"""Issue 29's confusing messages and missing help, each through the real `python -m gateway`:
a blocked name's reason reads as a sentence and `check` names the addresses it refused, a
misspelled setting suggests the one meant, an unreadable policy file says why in the OS's words,
`fetch` has the `--offset` it tells you to use, `--nameservers` says what it accepts, and an
NXDOMAIN is not retryable while a SERVFAIL is."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.certs import TestPKI
from tests.harness.cli import run_cli
from tests.harness.dns import FakeDNS
from tests.harness.gateway import policy_document
from tests.harness.origins import OriginFactory


def test_a_blocked_name_reads_as_a_sentence_and_check_lists_what_it_resolved_to(
    check_env: dict[str, str], fake_dns: FakeDNS
) -> None:
    fake_dns.add("two-private.cli-test.example", "10.0.0.7", "10.0.0.8")
    result = run_cli("check", "https://two-private.cli-test.example/", env=check_env)
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert report["code"] == "blocked_destination"
    assert report["reason"] == (
        "two-private.cli-test.example resolves to a denied address: 10.0.0.7 is in 10.0.0.0/8 (private)"
    )
    assert sorted(report["addresses"]) == ["10.0.0.7", "10.0.0.8"]


def test_a_misspelled_setting_suggests_the_setting_of_the_same_shape(check_env: dict[str, str]) -> None:
    env = {**check_env, "EGRESS_AUDIT_FILE": "/tmp/audit.log"}
    result = run_cli("check", "https://docs.cli-test.example/", env=env)
    assert result.returncode == 2
    expected = "egress-gateway: EGRESS_AUDIT_FILE is not a known setting (did you mean EGRESS_AUDIT_LOG?)\n"
    assert result.stderr == expected


@pytest.mark.parametrize("command", [["check", "https://docs.cli-test.example/"], ["policy", "lint"]])
def test_a_missing_policy_file_is_named_with_the_os_reason_and_no_exception_name(
    command: list[str], tmp_path: Path
) -> None:
    absent = tmp_path / "absent.yaml"
    args = [*command, str(absent)] if command[0] == "policy" else [*command, "--policy", str(absent)]
    result = run_cli(*args)
    assert result.returncode in (1, 2)
    assert result.stderr == f"{absent}: cannot read the policy file: No such file or directory\n"


def test_nameservers_take_addresses_and_say_so_in_help_and_error(check_env: dict[str, str]) -> None:
    help_text = " ".join(run_cli("check", "--help").stdout.split())
    assert "comma list of IP[:PORT] of DNS servers" in help_text
    result = run_cli("check", "--nameservers", "dns.example:53", "https://docs.cli-test.example/", env=check_env)
    assert result.returncode == 2
    assert "is not IP[:PORT]" in result.stderr


def _long_page() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        words = " ".join(f"word{index}" for index in range(400))
        return web.Response(text=f"<html><body><p>{words}</p></body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


def test_fetch_says_how_to_read_on_and_offset_does(
    origins: OriginFactory, fake_dns: FakeDNS, pki: TestPKI, tmp_path: Path
) -> None:
    origin = origins.start(_long_page(), names=["long.cli-test.example"], tls=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(json.dumps(policy_document(allow_cidrs=[origin.cidr], ports=[origin.port])))
    env = {"EGRESS_POLICY": str(policy), "EGRESS_NAMESERVERS": fake_dns.nameserver, "EGRESS_AUDIT_LOG": "off"}
    url = origin.url("/", name="long.cli-test.example")
    first = run_cli("fetch", url, "--max-chars", "200", env=env)
    assert first.returncode == 0, first.stderr
    assert "word0" in first.stdout
    hint = first.stderr.strip()
    assert hint.startswith("(truncated at 200 of ")
    assert hint.endswith("read on with --offset 200)")
    second = run_cli("fetch", url, "--max-chars", "200", "--offset", "200", env=env)
    assert second.returncode == 0, second.stderr
    assert "word0 " not in second.stdout
    assert second.stdout.strip()
    assert second.stdout.strip() not in first.stdout


def test_nxdomain_is_not_retryable_and_servfail_is(gateway_factory: GatewayFactory, fake_dns: FakeDNS) -> None:
    fake_dns.fail("flaky.cli-test.example", "SERVFAIL")
    gateway = gateway_factory(policy_document())
    answers = {
        name: httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": f"https://{name}/"}, timeout=20).json()["error"]
        for name in ("no-such-name.cli-test.example", "flaky.cli-test.example")
    }
    assert answers["no-such-name.cli-test.example"]["code"] == "dns_failure"
    assert "NXDOMAIN" in answers["no-such-name.cli-test.example"]["message"]
    assert answers["no-such-name.cli-test.example"]["retryable"] is False
    assert answers["flaky.cli-test.example"]["code"] == "dns_failure"
    assert answers["flaky.cli-test.example"]["retryable"] is True
