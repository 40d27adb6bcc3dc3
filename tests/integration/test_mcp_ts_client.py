"""MCP over Streamable HTTP driven by the TypeScript SDK client (npm), beside the Python SDK's.

The TypeScript SDK v1 client validates every `structuredContent` against the tool's declared
`outputSchema`, error results included, and rejects a result that fails (-32602): the agent then
never sees the refusal. These tests run the real client (node, `@modelcontextprotocol/sdk` pinned
in scripts/install-mcp-ts-client.sh) against a real gateway: results and refusals alike must
reach it as tool results.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.harness.gateway import GatewayProcess
from tests.harness.mcp_gateway import AGENT_TOKEN, SEARCHER_TOKEN, new_run, page_url
from tests.harness.run_tokens import run_token

REPO = Path(__file__).resolve().parents[2]
SDK_DIR = REPO / ".tools" / "mcp-ts-client" / "node_modules" / "@modelcontextprotocol" / "sdk"
CLIENT_SCRIPT = REPO / "tests" / "harness" / "mcp_ts_client.mjs"
INSTALL_TIMEOUT_S = 300
CLIENT_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def ts_sdk() -> Path:
    node = shutil.which("node")
    assert node is not None, "node is needed for the TypeScript SDK client (make system-deps)"
    subprocess.run([REPO / "scripts" / "install-mcp-ts-client.sh"], check=True, timeout=INSTALL_TIMEOUT_S)
    return SDK_DIR


def run_ts_client(sdk: Path, gateway: GatewayProcess, token: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    if token == AGENT_TOKEN:
        # Under a run token, so that a `_meta` run can contradict it.
        headers["X-Egress-Run-Token"] = run_token(new_run(), principal="agent")
    plan = {"url": f"{gateway.api_url}/mcp", "headers": headers, "calls": calls}
    done = subprocess.run(
        ["node", str(CLIENT_SCRIPT), str(sdk), orjson.dumps(plan).decode()],
        capture_output=True,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    answer: dict[str, Any] = orjson.loads(done.stdout)
    return answer


def test_ts_client_validates_results_against_the_output_schemas(ts_sdk: Path, mcp_gateway: GatewayProcess) -> None:
    answer = run_ts_client(
        ts_sdk,
        mcp_gateway,
        AGENT_TOKEN,
        [
            {"name": "web_search", "arguments": {"query": "typed clients", "maxResults": 2}},
            {"name": "web_fetch", "arguments": {"url": page_url("/long"), "maxChars": 1_000}},
            {"name": "web_fetch", "arguments": {"url": page_url("/short")}},
        ],
    )
    assert sorted(tool["name"] for tool in answer["tools"]) == ["web_fetch", "web_search"]
    assert [call["ok"] for call in answer["calls"]] == [True, True, True], answer["calls"]
    search, long_page, short_page = (call["result"] for call in answer["calls"])
    assert len(search["structuredContent"]["results"]) == 2
    # A window with more to read and the last window: nextOffset an integer, then null.
    assert long_page["structuredContent"]["nextOffset"] == 1_000
    assert short_page["structuredContent"]["nextOffset"] is None
    assert all(result.get("isError") is False for result in (search, long_page, short_page))


def test_ts_client_receives_refusals_as_tool_errors(ts_sdk: Path, mcp_gateway: GatewayProcess) -> None:
    answer = run_ts_client(
        ts_sdk,
        mcp_gateway,
        AGENT_TOKEN,
        [
            {"name": "web_fetch", "arguments": {"url": "http://169.254.169.254/latest/meta-data/"}},
            {"name": "web_fetch", "arguments": {"url": page_url("/short")}, "meta": {"egress-gateway/run": "other"}},
        ],
    )
    assert [call["ok"] for call in answer["calls"]] == [True, True], answer["calls"]
    blocked, contradicted = (call["result"] for call in answer["calls"])
    for result, codes in ((blocked, ("unsafe_url", "blocked_destination")), (contradicted, ("invalid_run_token",))):
        assert result["isError"] is True
        assert "structuredContent" not in result
        text = result["content"][0]["text"]
        assert text.startswith("Refused: ")
        assert "What to do next:" in text
        assert result["_meta"]["egress-gateway/error"]["code"] in codes


def test_ts_client_sees_a_denied_tool_as_a_tool_error(ts_sdk: Path, mcp_gateway: GatewayProcess) -> None:
    answer = run_ts_client(ts_sdk, mcp_gateway, SEARCHER_TOKEN, [{"name": "web_fetch", "arguments": {"url": "x"}}])
    assert [tool["name"] for tool in answer["tools"]] == ["web_search"]
    (call,) = answer["calls"]
    assert call["ok"] is True, call
    assert call["result"]["isError"] is True
    assert call["result"]["_meta"]["egress-gateway/error"]["code"] == "policy_denied"
