"""MCP Streamable HTTP refusals: each malformed or unauthorised request gets the spec's answer and
nothing reaches the network (the origin sees no request, no tool audit line is written).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.policy.decide import token_digest
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, Origin, OriginFactory

TOKEN = "transport-token-0123456789abcdef0"
SITE = "docs.example.org"
ACCEPT = "application/json, text/event-stream"
HITS: list[str] = []


def site_app() -> web.Application:
    async def any_path(request: web.Request) -> web.Response:
        HITS.append(request.path)
        return web.Response(text="<html><body><p>reached</p></body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", any_path)
    return app


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS
) -> Iterator[tuple[GatewayProcess, Origin]]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    origin = factory.start(site_app(), names=[SITE])
    policy = policy_document(
        allow_cidrs=[origin.cidr],
        ports=[80, 443, origin.port],
        principals={
            "agent": {
                "token_sha256": token_digest(TOKEN),
                "egress": {"allow_domains": [SITE]},
                "tools": {"search": True, "fetch": True},
            }
        },
        fetch={"robots": "ignore"},
    )
    workdir: Path = tmp_path_factory.mktemp("mcp-transport")
    gateway = GatewayProcess(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path)
    gateway.start()
    yield gateway, origin
    gateway.stop()
    factory.stop_all()


def fetch_call(origin: Origin, request_id: Any = 1, **meta: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "web_fetch", "arguments": {"url": origin.url("/page")}}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def post(
    gateway: GatewayProcess,
    body: bytes | dict[str, Any] | list[Any],
    *,
    token: str | None = TOKEN,
    content_type: str = "application/json",
    accept: str = ACCEPT,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    all_headers = {"Content-Type": content_type, "Accept": accept, **(headers or {})}
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(f"{gateway.api_url}/mcp", content=content, headers=all_headers, timeout=10)


@pytest.fixture(autouse=True)
def nothing_reaches_the_network(setup: tuple[GatewayProcess, Origin]) -> Iterator[None]:
    """Every test here sends only requests that must be refused before any tool runs."""
    gateway, _ = setup
    HITS.clear()
    before = [line for line in gateway.audit_lines() if line.get("kind") == "fetch"]
    yield
    assert HITS == []
    after = [line for line in gateway.audit_lines() if line.get("kind") == "fetch"]
    assert after == before


def rpc_error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    error: dict[str, Any] = body["error"]
    return error


def test_foreign_origin_is_forbidden(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    for foreign in ("https://evil.example", f"http://{SITE}:{gateway.api_port}", "null"):
        response = post(gateway, fetch_call(origin), headers={"Origin": foreign})
        assert response.status_code == 403, foreign
        assert "Origin" in rpc_error(response)["message"]


def test_loopback_origin_is_accepted(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, _ = setup
    ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
    for local in (f"http://localhost:{gateway.api_port}", "http://127.0.0.1:3000", "http://[::1]:8080"):
        response = post(gateway, ping, headers={"Origin": local})
        assert response.status_code == 200, local
        assert response.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef"], ids=["missing", "wrong"])
def test_missing_or_wrong_token_is_401_with_www_authenticate(
    setup: tuple[GatewayProcess, Origin], token: str | None
) -> None:
    gateway, origin = setup
    response = post(gateway, fetch_call(origin), token=token)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"]["code"] == "auth_required"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"jsonrpc": "2.0", "id": 1, "method": ', -32700),
        (b"\xff\xfe not json", -32700),
        (b"[]", -32600),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600),
        (b'"tools/call"', -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}', -32600),
    ],
    ids=["truncated", "not-utf8", "empty-batch", "batch", "string", "wrong-version", "method-not-string",
         "bool-id", "params-array"],
)  # fmt: skip
def test_malformed_json_rpc_is_400_with_the_json_rpc_code(
    setup: tuple[GatewayProcess, Origin], body: bytes, code: int
) -> None:
    gateway, _ = setup
    response = post(gateway, body)
    assert response.status_code == 400
    assert rpc_error(response)["code"] == code


def test_unknown_method_and_unknown_tool_are_json_rpc_errors(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, _ = setup
    unknown = post(gateway, {"jsonrpc": "2.0", "id": 3, "method": "resources/list"})
    assert unknown.status_code == 200
    assert unknown.json()["error"]["code"] == -32601
    tool = post(gateway, {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "shell"}})
    assert tool.json()["error"]["code"] == -32602


def test_wrong_content_type_is_415_and_unacceptable_accept_is_406(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    assert post(gateway, fetch_call(origin), content_type="text/plain").status_code == 415
    assert post(gateway, fetch_call(origin), content_type="application/x-www-form-urlencoded").status_code == 415
    assert post(gateway, fetch_call(origin), accept="text/html").status_code == 406


def test_oversized_body_is_413(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    call = fetch_call(origin)
    call["params"]["arguments"]["padding"] = "x" * (80 * 1024)
    response = post(gateway, call)
    assert response.status_code == 413
    assert rpc_error(response)["code"] == -32600


def test_get_and_delete_are_405_with_allow_post(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, _ = setup
    for method in ("GET", "DELETE", "PUT"):
        response = httpx.request(
            method,
            f"{gateway.api_url}/mcp",
            headers={"Accept": "text/event-stream", "Authorization": f"Bearer {TOKEN}"},
        )
        assert response.status_code == 405, method
        assert response.headers["Allow"] == "POST"


def test_notifications_and_client_responses_are_202_without_a_body(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, _ = setup
    for body in (
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
        {"jsonrpc": "2.0", "id": 9, "result": {}},
    ):
        response = post(gateway, body, headers={"MCP-Protocol-Version": "2025-11-25"})
        assert response.status_code == 202
        assert response.content == b""


def test_unsupported_protocol_version_header_is_400(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    response = post(gateway, fetch_call(origin), headers={"MCP-Protocol-Version": "1999-01-01"})
    assert response.status_code == 400
    error = rpc_error(response)
    assert error["code"] == -32022
    assert "2026-07-28" in error["data"]["supported"]


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def modern_headers(method: str = "tools/call", name: str | None = "web_fetch") -> dict[str, str]:
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


@pytest.mark.parametrize(
    "headers",
    [
        modern_headers(method="tools/list"),
        modern_headers(name="web_search"),
        modern_headers(name=None),
        {"MCP-Protocol-Version": "2026-07-28", "Mcp-Name": "web_fetch"},
    ],
    ids=["method-mismatch", "name-mismatch", "name-missing", "method-missing"],
)
def test_modern_header_body_mismatch_is_400_header_mismatch(
    setup: tuple[GatewayProcess, Origin], headers: dict[str, str]
) -> None:
    gateway, origin = setup
    response = post(gateway, fetch_call(origin, **MODERN_META), headers=headers)
    assert response.status_code == 400
    assert rpc_error(response)["code"] == -32020


def test_modern_body_without_the_version_header_is_a_header_mismatch(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    response = post(gateway, fetch_call(origin, **MODERN_META), headers={"Mcp-Method": "tools/call"})
    assert response.status_code == 400
    assert rpc_error(response)["code"] == -32020


def test_modern_request_without_the_envelope_is_400_invalid_params(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    response = post(gateway, fetch_call(origin), headers=modern_headers())
    assert response.status_code == 400
    assert rpc_error(response)["code"] == -32602


def test_modern_unknown_method_is_404(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, _ = setup
    for method in ("initialize", "resources/list"):
        body = {"jsonrpc": "2.0", "id": 5, "method": method, "params": {"_meta": MODERN_META}}
        response = post(gateway, body, headers=modern_headers(method=method, name=None))
        assert response.status_code == 404, method
        assert rpc_error(response)["code"] == -32601


def test_duplicated_routing_header_is_a_header_mismatch(setup: tuple[GatewayProcess, Origin]) -> None:
    gateway, origin = setup
    content = orjson.dumps(fetch_call(origin, **MODERN_META))
    headers = [
        ("Content-Type", "application/json"),
        ("Accept", ACCEPT),
        ("Authorization", f"Bearer {TOKEN}"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "web_fetch"),
        ("Mcp-Name", "web_search"),
    ]
    response = httpx.post(f"{gateway.api_url}/mcp", content=content, headers=headers, timeout=10)
    assert response.status_code == 400
    assert rpc_error(response)["code"] == -32020


def test_api_unknown_paths_and_methods_get_the_json_error_body_and_no_versions(
    setup: tuple[GatewayProcess, Origin],
) -> None:
    gateway, _ = setup
    missing = httpx.get(f"{gateway.api_url}/admin/../etc/passwd", timeout=10)
    wrong = httpx.get(f"{gateway.api_url}/v1/fetch", timeout=10)
    for response, status in ((missing, 404), (wrong, 405)):
        assert response.status_code == status
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.json()["error"]["code"] == "invalid_input"
        assert response.headers["Server"] == "egress-gateway"
        assert "aiohttp" not in str(response.headers)
        assert "Python" not in str(response.headers)
    assert wrong.headers["Allow"] == "POST"
