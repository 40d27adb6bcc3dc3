"""`egress-gateway mcp --connect URL`: stdio MCP bridged to a running gateway's `/mcp`.

Owns the translation only: each stdin message becomes one POST with the headers the revision
needs (the negotiated `MCP-Protocol-Version`; for 2026-07-28 also `Mcp-Method` and `Mcp-Name`),
each JSON-RPC answer becomes one stdout line, and an HTTP refusal that carries no JSON-RPC body
(401, 403) becomes a JSON-RPC error for the request it answered. The sidecar's policy, budgets and
audit apply; nothing runs locally. It talks only to the gateway URL it was given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from gateway.tools.mcp.envelope import (
    INTERNAL_ERROR,
    NAME_BEARING_METHODS,
    PROTOCOL_VERSION_META_KEY,
    encode_header_value,
)
from gateway.tools.mcp.protocol import MODERN_VERSIONS, error_object
from gateway.tools.mcp.stdio import LineHandler

BRIDGE_TIMEOUT_S = 120.0


class Bridge:
    def __init__(
        self, session: aiohttp.ClientSession, url: str, token: str | None, run_token: str | None = None
    ) -> None:
        self._session = session
        self._url = url
        self._token = token
        self._run_token = run_token
        self._negotiated: str | None = None

    def _headers(self, message: Mapping[str, Any]) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if self._run_token:
            # The orchestrator's word for the run: only under it do `_meta` run/step ids count.
            headers["X-Egress-Run-Token"] = self._run_token
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
        method = message.get("method")
        if isinstance(version, str) and version in MODERN_VERSIONS and isinstance(method, str):
            headers["MCP-Protocol-Version"] = version
            headers["Mcp-Method"] = method
            name_key = NAME_BEARING_METHODS.get(method)
            name = params.get(name_key) if name_key and isinstance(params, dict) else None
            if isinstance(name, str):
                headers["Mcp-Name"] = encode_header_value(name)
        elif self._negotiated is not None and method != "initialize":
            headers["MCP-Protocol-Version"] = self._negotiated
        return headers

    async def forward(self, line: bytes) -> dict[str, Any] | None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            message = None
        request = message if isinstance(message, dict) else {}
        request_id = request.get("id")
        try:
            async with self._session.post(self._url, data=line, headers=self._headers(request)) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            if request_id is None:
                return None
            return error_object(request_id, INTERNAL_ERROR, f"cannot reach the gateway at {self._url}: {exc}")
        if status == 202 or not body:
            return None
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if isinstance(answer, dict) and answer.get("jsonrpc") == "2.0":
            result = answer.get("result")
            if request.get("method") == "initialize" and isinstance(result, dict):
                version = result.get("protocolVersion")
                self._negotiated = version if isinstance(version, str) else None
            return answer
        if request_id is None:
            return None
        # A gateway refusal at the HTTP layer (401 auth_required, 403 origin): say which, to the client.
        detail = answer.get("error") if isinstance(answer, dict) else None
        reason = f"{detail.get('code')}: {detail.get('message')}" if isinstance(detail, dict) else f"HTTP {status}"
        return error_object(request_id, INTERNAL_ERROR, f"the gateway refused the request: {reason}")


def bridge_handler(
    session: aiohttp.ClientSession, url: str, token: str | None, run_token: str | None = None
) -> LineHandler:
    return Bridge(session, url, token, run_token).forward
