"""`egress-gateway mcp` on stdio, launched by the official SDK's stdio client.

In-process: the tools run through the full egress core with the policy file and in-memory budgets,
the audit log off stdout. With `--connect`: the same client talks to a running gateway's /mcp
through the bridge, so the sidecar's principal, budgets and audit apply.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import mcp_types as types
import orjson
import pytest
import yaml
from aiohttp import web
from mcp import Client, StdioServerParameters
from mcp_types import RequestParamsMeta

from gateway.policy.decide import token_digest
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, Origin, OriginFactory
from tests.harness.run_tokens import SECRET_ENV, TEST_ORCHESTRATORS, run_token

SITE = "docs.example.org"
SEARCH_HOST = "search.example.net"
TOKEN = "stdio-bridge-token-0123456789abcdef"
OPEN_BUDGET = {"per_step": 1000, "per_run": 1000, "concurrent": 100, "min_interval_s": 0}
SENTENCE = "The stdio server reads long pages in windows without losing a character. "


def site_app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        paragraphs = 1 if request.path == "/short" else 100
        body = "".join(f"<p>{SENTENCE * 4} Paragraph {n}.</p>" for n in range(paragraphs))
        return web.Response(
            text=f"<html><head><title>Stdio page</title></head><body><article><h1>Stdio page</h1>{body}</article>"
            "</body></html>",
            content_type="text/html",
        )

    async def find(request: web.Request) -> web.Response:
        rows = [{"title": f"Hit {n}", "url": f"https://{SITE}/hit{n}", "content": "snippet"} for n in (1, 2)]
        return web.json_response({"results": rows})

    app = web.Application()
    app.router.add_get("/find", find)
    app.router.add_get("/{tail:.*}", page)
    return app


def principal(search: bool, fetch: bool, fetch_budget: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "egress": {"allow_domains": [SITE, SEARCH_HOST]},
        "tools": {"search": search, "fetch": fetch},
        "budgets": {"search": OPEN_BUDGET, "fetch": fetch_budget},
    }
    if token:
        entry["token_sha256"] = token_digest(token)
    return entry


@pytest.fixture(scope="module")
def site(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[Origin]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    yield factory.start(site_app(), names=[SITE, SEARCH_HOST])
    factory.stop_all()


@pytest.fixture(scope="module")
def environment(
    site: Origin, tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI
) -> dict[str, str]:
    workdir = tmp_path_factory.mktemp("mcp-stdio")
    policy = policy_document(
        allow_cidrs=[site.cidr],
        ports=[80, 443, site.port],
        principals={
            "default": principal(True, True, OPEN_BUDGET),
            "searcher": principal(True, False, OPEN_BUDGET),
            "tight": principal(False, True, {**OPEN_BUDGET, "per_step": 1, "per_run": 1}),
        },
        fetch={"robots": "ignore"},
    )
    policy_path = workdir / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "EGRESS_POLICY": str(policy_path),
        "EGRESS_NAMESERVERS": fake_dns.nameserver,
        "EGRESS_CA_BUNDLE": str(pki.ca_path),
        "EGRESS_AUDIT_LOG": str(workdir / "audit.log"),
        "EGRESS_SEARCH_ENGINES": "template",
        "EGRESS_SEARCH_URL": site.url("/find?q={query}", name=SEARCH_HOST),
    }


def command() -> list[str]:
    """The console script as a user runs it, from this virtualenv."""
    script = shutil.which("egress-gateway", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "gateway"]


def stdio_server(env: dict[str, str], *args: str) -> StdioServerParameters:
    program, *rest = command()
    return StdioServerParameters(command=program, args=[*rest, "mcp", *args], env=env, cwd="/tmp")


def text_of(result: types.CallToolResult) -> str:
    assert result.content
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025-11-25", "2026-07-28"])
async def test_stdio_client_lists_calls_and_continues_in_process(
    site: Origin, environment: dict[str, str], mode: str
) -> None:
    async with Client(stdio_server(environment), mode=mode) as client:
        assert client.session.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        listed = await client.list_tools()
        found = await client.call_tool("web_search", {"query": "stdio windows"})
        first = await client.call_tool("web_fetch", {"url": site.url("/long"), "maxChars": 8_000})
        assert first.structured_content is not None
        second = await client.call_tool(
            "web_fetch",
            {
                "url": site.url("/long"),
                "maxChars": 8_000,
                "offset": first.structured_content["nextOffset"],
                "expectedHash": first.structured_content["contentHash"],
            },
        )
        blocked = await client.call_tool("web_fetch", {"url": "http://10.0.0.1/"})
    assert sorted(tool.name for tool in listed.tools) == ["web_fetch", "web_search"]
    assert found.is_error is False
    assert "1. Hit 1" in text_of(found)
    assert first.is_error is False
    assert "call web_fetch again" in text_of(first)
    assert second.is_error is False, text_of(second)
    assert second.structured_content is not None
    assert second.structured_content["offset"] == first.structured_content["nextOffset"]
    assert blocked.is_error is True
    assert text_of(blocked).split(":")[1].strip() in ("unsafe_url", "blocked_destination")
    audit = Path(environment["EGRESS_AUDIT_LOG"]).read_text()
    assert '"kind":"fetch"' in audit
    assert '"kind":"search"' in audit


async def test_stdio_denied_tool_and_exhausted_budget_are_tool_errors(
    site: Origin, environment: dict[str, str]
) -> None:
    async with Client(stdio_server(environment, "--principal", "searcher"), mode="legacy") as client:
        listed = await client.list_tools()
        denied = await client.call_tool("web_fetch", {"url": site.url("/short")})
    async with Client(stdio_server(environment, "--principal", "tight"), mode="legacy") as client:
        spent = await client.call_tool("web_fetch", {"url": site.url("/short")})
        exhausted = await client.call_tool("web_fetch", {"url": site.url("/short")})
    assert [tool.name for tool in listed.tools] == ["web_search"]
    assert denied.is_error is True
    assert text_of(denied).startswith("Refused: policy_denied:")
    assert spent.is_error is False, text_of(spent)
    assert exhausted.is_error is True
    assert text_of(exhausted).startswith("Refused: quota_exhausted:")


async def test_stdio_with_audit_on_stdout_keeps_stdout_protocol_only(environment: dict[str, str]) -> None:
    env = {**environment, "EGRESS_AUDIT_LOG": "-"}
    async with Client(stdio_server(env), mode="legacy") as client:
        # A refused call writes an audit line; on stdout it would break the client's framing.
        result = await client.call_tool("web_fetch", {"url": "http://127.0.0.1/"})
        again = await client.list_tools()
    assert result.is_error is True
    assert len(again.tools) == 2


@pytest.fixture(scope="module")
def sidecar(
    site: Origin, tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI
) -> Iterator[GatewayProcess]:
    policy = policy_document(
        allow_cidrs=[site.cidr],
        ports=[80, 443, site.port],
        principals={"sidecar-agent": principal(False, True, {**OPEN_BUDGET, "per_run": 2}, token=TOKEN)},
        fetch={"robots": "ignore"},
        orchestrators=TEST_ORCHESTRATORS,
    )
    gateway = GatewayProcess(
        tmp_path_factory.mktemp("mcp-bridge"),
        policy,
        nameserver=fake_dns.nameserver,
        ca_bundle=pki.ca_path,
        env=SECRET_ENV,
    )
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["2025-11-25", "2026-07-28"])
async def test_connect_bridges_stdio_to_the_sidecar_policy_and_budget(
    site: Origin, sidecar: GatewayProcess, environment: dict[str, str], mode: str, tmp_path: Path
) -> None:
    env = {"PATH": environment["PATH"], "HOME": environment["HOME"]}
    run = f"bridge-{mode}"
    # The run counts only under a run token (issue 12), minted as the test orchestrator would.
    vouched = run_token(run, principal="sidecar-agent")
    # The bearer token from the environment, the run token from a file: neither in the process list.
    run_token_file = tmp_path / "run-token"
    run_token_file.write_text(vouched + "\n")
    env["EGRESS_CONNECT_TOKEN"] = TOKEN
    bridge = stdio_server(env, "--connect", sidecar.api_url, "--run-token-file", str(run_token_file))
    async with Client(bridge, mode=mode) as client:
        listed = await client.list_tools()
        results = [
            await client.call_tool(
                "web_fetch", {"url": site.url("/short")}, meta=cast(RequestParamsMeta, {"egress-gateway/run": run})
            )
            for _ in range(3)
        ]
    assert [tool.name for tool in listed.tools] == ["web_fetch"]
    assert [result.is_error for result in results] == [False, False, True]
    assert text_of(results[2]).startswith("Refused: quota_exhausted:")
    lines = [
        line for line in sidecar.audit_lines() if line.get("kind") == "fetch" and line["principal"] == "sidecar-agent"
    ]
    assert len(lines) >= 3


async def test_connect_with_a_wrong_token_reports_the_refusal(
    sidecar: GatewayProcess, environment: dict[str, str], tmp_path: Path
) -> None:
    env = {"PATH": environment["PATH"], "HOME": environment["HOME"]}
    token_file = tmp_path / "token"
    token_file.write_text("wrong\n")
    bridge = stdio_server(env, "--connect", sidecar.api_url, "--token-file", str(token_file))
    with pytest.raises(BaseException) as raised:  # noqa: PT011 - the SDK wraps the MCPError in task groups
        async with Client(bridge, mode="legacy"):
            pass
    assert "the gateway refused the request: auth_required" in " ".join(flatten(raised.value))


def flatten(error: BaseException) -> list[str]:
    if isinstance(error, BaseExceptionGroup):
        return [message for inner in error.exceptions for message in flatten(inner)]
    return [str(error)]


def test_a_line_over_one_mebibyte_is_discarded_to_its_newline_and_answered_once(environment: dict[str, str]) -> None:
    padding = "y" * (3 * 1024 * 1024 // 2)
    oversized = {"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {"name": "web_fetch", "x": padding}}
    ping = {"jsonrpc": "2.0", "id": 43, "method": "ping"}
    stream = orjson.dumps(oversized) + b"\n" + orjson.dumps(ping) + b"\n"
    done = subprocess.run(
        [*command(), "mcp"], input=stream, env=environment, cwd="/tmp", capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    answers = [orjson.loads(line) for line in done.stdout.splitlines()]
    # One error naming the request, then the ping's answer: the rest of the long line is no message.
    assert [answer["id"] for answer in answers] == [42, 43], answers
    assert answers[0]["error"]["code"] == -32600
    assert "discarded" in answers[0]["error"]["message"]
    assert answers[1]["result"] == {}
    assert "Traceback" not in done.stderr.decode(errors="replace")


def test_connect_refuses_a_token_on_the_command_line_and_reads_none_from_argv(
    sidecar: GatewayProcess, environment: dict[str, str], tmp_path: Path
) -> None:
    env = {"PATH": environment["PATH"], "HOME": environment["HOME"]}
    for flag in ("--token", "--run-token"):
        done = subprocess.run(
            [*command(), "mcp", "--connect", sidecar.api_url, flag, TOKEN],
            input=b"",
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert "process list" in done.stderr.decode()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = subprocess.run(
        [*command(), "mcp", "--connect", sidecar.api_url, "--token-file", str(empty)],
        input=b"",
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "must hold one token" in done.stderr.decode()
