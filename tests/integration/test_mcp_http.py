"""MCP over Streamable HTTP, driven by the official `mcp` SDK client against a real gateway.

Each revision the SDK can speak is exercised: 2025-06-18 and 2025-11-25 through the initialize
handshake, 2026-07-28 through `server/discover` and the per-request envelope. Each lists tools,
calls both, follows a fetch continuation, and gets tool errors (isError) for a blocked URL, a
denied tool and an exhausted budget, with the same audit lines as /v1.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import mcp_types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import RequestParamsMeta

from tests.harness.gateway import GatewayProcess
from tests.harness.mcp_gateway import (
    AGENT_TOKEN,
    PRINCIPAL_OF_TOKEN,
    SEARCHER_TOKEN,
    SITE,
    TIGHT_TOKEN,
    new_run,
    page_url,
)
from tests.harness.run_tokens import run_token

REVISIONS = ("2025-06-18", "2025-11-25", "2026-07-28")


@contextlib.asynccontextmanager
async def mcp_session(gateway: GatewayProcess, revision: str, token: str, run: str) -> AsyncIterator[ClientSession]:
    """An SDK client session at `revision`, authenticated as `token`, budgets under run `run`."""
    # The run counts only under a run token (issue 12), minted as the test orchestrator would.
    vouched = run_token(run, principal=PRINCIPAL_OF_TOKEN[token])
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}", "X-Egress-Run-Token": vouched})
    url = f"{gateway.api_url}/mcp"
    async with http:
        if revision == "2026-07-28":
            # mode="auto" probes server/discover and adopts the modern envelope only if it is served.
            async with Client(streamable_http_client(url, http_client=http), mode="auto") as client:
                assert client.session.protocol_version == "2026-07-28"
                yield client.session
            return
        async with (
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            result = await session.send_request(
                types.InitializeRequest(
                    params=types.InitializeRequestParams(
                        protocol_version=revision,
                        capabilities=types.ClientCapabilities(),
                        client_info=types.Implementation(name="conformance-test", version="1"),
                    )
                ),
                types.InitializeResult,
            )
            assert result.protocol_version == revision
            session.adopt(result)
            await session.send_notification(types.InitializedNotification())
            yield session


def text_of(result: types.CallToolResult) -> str:
    assert result.content
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


@pytest.mark.parametrize("revision", REVISIONS)
async def test_sdk_client_lists_both_tools_with_schemas_and_annotations(
    mcp_gateway: GatewayProcess, revision: str
) -> None:
    async with mcp_session(mcp_gateway, revision, AGENT_TOKEN, new_run()) as session:
        listed = await session.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert sorted(tools) == ["web_fetch", "web_search"]
    fetch = tools["web_fetch"]
    assert fetch.input_schema["required"] == ["url"]
    assert fetch.input_schema["properties"]["maxChars"]["maximum"] == 32_000
    assert fetch.output_schema is not None
    assert "contentHash" in fetch.output_schema["properties"]
    assert fetch.annotations is not None
    assert fetch.annotations.read_only_hint is True
    assert fetch.annotations.open_world_hint is True
    assert "untrusted" in (fetch.description or "")


@pytest.mark.parametrize("revision", REVISIONS)
async def test_sdk_client_calls_search_and_reads_a_numbered_list(mcp_gateway: GatewayProcess, revision: str) -> None:
    async with mcp_session(mcp_gateway, revision, AGENT_TOKEN, new_run()) as session:
        result = await session.call_tool("web_search", {"query": f"pinned sockets {revision}", "maxResults": 3})
    assert result.is_error is False, text_of(result)
    text = text_of(result)
    assert f"1. Result 1 for pinned sockets {revision}" in text
    assert f"https://{SITE}/r3" in text
    assert result.structured_content is not None
    assert result.structured_content["provider"] == "template"
    assert len(result.structured_content["results"]) == 3


@pytest.mark.parametrize("revision", REVISIONS)
async def test_sdk_client_follows_a_fetch_continuation_to_the_end(mcp_gateway: GatewayProcess, revision: str) -> None:
    async with mcp_session(mcp_gateway, revision, AGENT_TOKEN, new_run()) as session:
        first = await session.call_tool("web_fetch", {"url": page_url("/long"), "maxChars": 10_000})
        assert first.is_error is False, text_of(first)
        assert first.structured_content is not None
        pieces = [first.structured_content["content"]]
        assert "call web_fetch again" in text_of(first)
        page = first.structured_content
        while page["nextOffset"] is not None:
            following = await session.call_tool(
                "web_fetch",
                {
                    "url": page_url("/long"),
                    "maxChars": 10_000,
                    "offset": page["nextOffset"],
                    "expectedHash": page["contentHash"],
                },
            )
            assert following.is_error is False, text_of(following)
            assert following.structured_content is not None
            page = following.structured_content
            pieces.append(page["content"])
    assert len(pieces) >= 2
    assert len("".join(pieces)) == first.structured_content["totalChars"]
    assert "end of the page" in text_of(following)


@pytest.mark.parametrize("revision", REVISIONS)
async def test_a_blocked_url_is_a_tool_error_naming_the_code_and_what_to_do(
    mcp_gateway: GatewayProcess, revision: str
) -> None:
    async with mcp_session(mcp_gateway, revision, AGENT_TOKEN, new_run()) as session:
        result = await session.call_tool("web_fetch", {"url": "http://169.254.169.254/latest/meta-data/"})
    assert result.is_error is True
    text = text_of(result)
    assert text.startswith("Refused: unsafe_url:") or text.startswith("Refused: blocked_destination:")
    assert "What to do next:" in text
    # The error object rides in _meta: structuredContent would have to match the outputSchema.
    assert result.structured_content is None
    assert result.meta is not None
    assert result.meta["egress-gateway/error"]["code"] in ("unsafe_url", "blocked_destination")


@pytest.mark.parametrize("revision", REVISIONS)
async def test_a_principal_sees_only_its_tools_and_a_denied_tool_is_a_tool_error(
    mcp_gateway: GatewayProcess, revision: str
) -> None:
    async with mcp_session(mcp_gateway, revision, SEARCHER_TOKEN, new_run()) as session:
        listed = await session.list_tools()
        denied = await session.call_tool("web_fetch", {"url": page_url("/short")})
    assert [tool.name for tool in listed.tools] == ["web_search"]
    assert denied.is_error is True
    assert text_of(denied).startswith("Refused: policy_denied: principal 'searcher' may not use web_fetch")
    lines = mcp_gateway.audit_lines()
    assert any(line.get("principal") == "searcher" and line.get("code") == "policy_denied" for line in lines)


@pytest.mark.parametrize("revision", REVISIONS)
async def test_an_exhausted_budget_is_a_tool_error_and_the_run_id_comes_from_the_header(
    mcp_gateway: GatewayProcess, revision: str
) -> None:
    async with mcp_session(mcp_gateway, revision, TIGHT_TOKEN, new_run()) as session:
        first = await session.call_tool("web_fetch", {"url": page_url("/short")})
        second = await session.call_tool("web_fetch", {"url": page_url("/short")})
    assert first.is_error is False, text_of(first)
    assert "pinned connection" in text_of(first)
    assert second.is_error is True
    assert text_of(second).startswith("Refused: quota_exhausted:")
    assert "budget" in text_of(second)


async def test_a_run_id_in_meta_cannot_open_a_fresh_run_budget(mcp_gateway: GatewayProcess) -> None:
    run = new_run()
    async with mcp_session(mcp_gateway, "2025-11-25", TIGHT_TOKEN, run) as session:
        spent = await session.call_tool("web_fetch", {"url": page_url("/short")})
        refused = await session.call_tool("web_fetch", {"url": page_url("/short")})
        other_run = await session.call_tool(
            "web_fetch", {"url": page_url("/short")}, meta=cast(RequestParamsMeta, {"egress-gateway/run": f"{run}-b"})
        )
        same_run = await session.call_tool(
            "web_fetch", {"url": page_url("/short")}, meta=cast(RequestParamsMeta, {"egress-gateway/run": run})
        )
    assert spent.is_error is False
    assert refused.is_error is True
    # The agent names another run: only the orchestrator's token vouches for runs (issue 12).
    assert other_run.is_error is True
    assert text_of(other_run).startswith("Refused: invalid_run_token:"), text_of(other_run)
    assert same_run.is_error is True
    assert text_of(same_run).startswith("Refused: quota_exhausted:"), text_of(same_run)


async def test_stateless_server_issues_no_session_id(mcp_gateway: GatewayProcess) -> None:
    response = httpx.post(
        f"{mcp_gateway.api_url}/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        headers={"Authorization": f"Bearer {AGENT_TOKEN}", "Accept": "application/json, text/event-stream"},
        timeout=10,
    )
    assert response.status_code == 200
    assert "mcp-session-id" not in response.headers
    assert response.headers["Server"] == "egress-gateway"
    assert response.json()["result"]["serverInfo"]["name"] == "egress-gateway"


def _auth_failures(gateway: GatewayProcess, kind: str) -> float:
    metrics = httpx.get(f"{gateway.admin_url}/metrics", timeout=5).text
    prefix = f'egress_gateway_auth_failures_total{{kind="{kind}"}} '
    return next((float(line[len(prefix) :]) for line in metrics.splitlines() if line.startswith(prefix)), 0.0)


def _line_of(gateway: GatewayProcess, response: httpx.Response) -> dict[str, Any]:
    conn = response.headers["X-Egress-Id"]
    lines = gateway.wait_audit(lambda lines: any(line.get("conn") == conn for line in lines))
    (line,) = [line for line in lines if line.get("conn") == conn and line.get("event") == "decision"]
    return line


def _initialize(gateway: GatewayProcess, headers: dict[str, str]) -> httpx.Response:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    sent = {"Accept": "application/json, text/event-stream", **headers}
    return httpx.post(f"{gateway.api_url}/mcp", json=body, headers=sent, timeout=10)


def test_a_guessed_bearer_token_on_mcp_is_audited_and_counted_as_on_v1(mcp_gateway: GatewayProcess) -> None:
    before = _auth_failures(mcp_gateway, "mcp")
    guesses = [_initialize(mcp_gateway, {"Authorization": f"Bearer guess-{n}"}) for n in range(3)]
    assert [response.status_code for response in guesses] == [401] * 3
    assert _auth_failures(mcp_gateway, "mcp") == before + 3
    line = _line_of(mcp_gateway, guesses[0])
    assert (line["kind"], line["decision"], line["code"], line["rule"]) == (
        "mcp",
        "deny",
        "auth_required",
        "credentials",
    )
    assert line["client_ip"] == "127.0.0.1"
    assert all("guess-" not in str(line) for line in mcp_gateway.audit_lines())
    # The same guess on /v1 is a line and a count too (kind fetch): one alert watches both.
    v1_before = _auth_failures(mcp_gateway, "fetch")
    v1 = httpx.post(
        f"{mcp_gateway.api_url}/v1/fetch", json={"url": page_url("/short")}, headers={"Authorization": "Bearer x"}
    )
    assert v1.status_code == 401
    assert _line_of(mcp_gateway, v1)["code"] == "auth_required"
    assert _auth_failures(mcp_gateway, "fetch") == v1_before + 1


def test_a_forged_run_token_on_mcp_is_audited_and_counted(mcp_gateway: GatewayProcess) -> None:
    before = _auth_failures(mcp_gateway, "mcp")
    forged = run_token("run-forged", principal="agent", secret="not-the-gateways-secret-0123456789")
    response = _initialize(mcp_gateway, {"Authorization": f"Bearer {AGENT_TOKEN}", "X-Egress-Run-Token": forged})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "invalid_run_token"
    line = _line_of(mcp_gateway, response)
    assert (line["kind"], line.get("principal"), line["code"]) == ("mcp", None, "invalid_run_token")
    assert _auth_failures(mcp_gateway, "mcp") == before + 1
    assert all(forged not in str(line) for line in mcp_gateway.audit_lines())


async def test_a_meta_run_contradicting_the_run_token_is_audited_and_counted(mcp_gateway: GatewayProcess) -> None:
    before = _auth_failures(mcp_gateway, "fetch")
    run = new_run()
    async with mcp_session(mcp_gateway, "2025-11-25", AGENT_TOKEN, run) as session:
        refused = await session.call_tool(
            "web_fetch", {"url": page_url("/short")}, meta=cast(RequestParamsMeta, {"egress-gateway/run": f"{run}-x"})
        )
    assert refused.is_error is True
    assert _auth_failures(mcp_gateway, "fetch") == before + 1
    lines = [line for line in mcp_gateway.audit_lines() if line.get("run") == run]
    assert [(line["kind"], line["principal"], line["code"]) for line in lines] == [
        ("fetch", "agent", "invalid_run_token")
    ]
