"""MCP Streamable HTTP at `/mcp` on the tools API listener, stateless in every revision.

Owns the transport rules: Origin validation (a browser page on a foreign origin, DNS rebinding
included, gets 403), the principal exactly as /v1 reads it (401 with WWW-Authenticate), Accept and
Content-Type, the body bound, JSON-RPC framing (one message per POST; notifications and client
responses 202; GET 405), and the revision: the initialize handshake revisions (2025-06-18,
2025-11-25) or the per-request envelope of 2026-07-28, whose `MCP-Protocol-Version`, `Mcp-Method`
and `Mcp-Name` headers must match the body. No session id is issued and no state kept, so any
replica can answer any request. Never runs a tool itself: ToolsApi does, with its audit line.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Protocol

import orjson
import yarl
from aiohttp import web

from gateway.errors import GatewayError
from gateway.tools.call_guard import CallContext
from gateway.tools.http_edge import error_response, read_body
from gateway.tools.mcp.envelope import (
    ERROR_HTTP_STATUS,
    HEADER_MISMATCH,
    INVALID_REQUEST,
    PARSE_ERROR,
    PROTOCOL_VERSION_META_KEY,
    check_envelope_2026,
    duplicated_routing_header,
    unsupported_version,
)
from gateway.tools.mcp.protocol import (
    HANDSHAKE_VERSIONS,
    MODERN_VERSIONS,
    RUN_META_KEY,
    STEP_META_KEY,
    JsonRpcError,
    McpCaller,
    answer,
    check_envelope,
    error_object,
    is_client_response,
    is_notification,
)
from gateway.tools.schemas import Tool

MCP_PATH = "/mcp"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def _rpc_response(body: dict[str, Any], status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=dict(headers or {})
    )


def _rpc_error(status: int, code: int, message: str, request_id: Any = None, data: Any = None) -> web.Response:
    return _rpc_response(error_object(request_id, code, message, data), status)


def origin_allowed(origin: str | None) -> bool:
    """No Origin (not a browser), or a loopback origin. A page's own host is not enough: after DNS
    rebinding a hostile page is same-origin with its own name, which now points at us."""
    if origin is None:
        return True
    try:
        url = yarl.URL(origin)
    except ValueError:
        return False
    if url.scheme not in ("http", "https") or not url.host:
        return False
    host = url.host
    host = host.lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _accepts_json(accept: str | None) -> bool:
    if accept is None:
        return True
    types = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return bool(types & {"application/json", "application/*", "*/*"})


def _body_version(message: Mapping[str, Any]) -> Any:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None


class ToolInvoker(Protocol):
    """What /mcp needs of the /v1 API (`tools.api.ToolsApi`): the principal read as /v1 reads it,
    the one audited tool call, and the line of a refusal before any call. Named here, so this
    module never imports the API above it."""

    def context_for(self, request: web.Request) -> CallContext: ...

    def meta_context(self, context: CallContext, run_meta: str | None, step_meta: str | None) -> CallContext: ...

    async def call_tool(
        self, tool: Tool, context: CallContext, payload: Any, request: web.Request | None = None
    ) -> dict[str, Any]: ...

    def audit_refusal(
        self, kind: str, request: web.Request, error: GatewayError, context: CallContext | None
    ) -> None: ...


class McpHttpEndpoint:
    def __init__(self, api: ToolInvoker) -> None:
        self._api = api

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(MCP_PATH, self.handle_post)
        app.router.add_route("*", MCP_PATH, self.handle_other)

    async def handle_other(self, request: web.Request) -> web.Response:
        # The server sends no unsolicited messages (no GET stream) and keeps no session (no DELETE).
        return _rpc_response(
            error_object(None, INVALID_REQUEST, f"method {request.method} not allowed: POST JSON-RPC messages"),
            405,
            {"Allow": "POST"},
        )

    def _caller(self, context: CallContext, request: web.Request) -> McpCaller:
        tools: frozenset[Tool] = frozenset(t for t in ("search", "fetch") if getattr(context.principal.tools, t))

        async def run(tool: Tool, arguments: Any, meta: Mapping[str, Any]) -> dict[str, Any]:
            run_id = meta.get(RUN_META_KEY)
            step_id = meta.get(STEP_META_KEY)
            # Agent-named ids count only inside the run its X-Egress-Run-Token vouches for (issue 12).
            try:
                call_context = self._api.meta_context(
                    context,
                    run_id if isinstance(run_id, str) else None,
                    step_id if isinstance(step_id, str) else None,
                )
            except GatewayError as exc:
                # Refused before the call starts (a `_meta` run the run token contradicts): still
                # audited and counted, as the same refusal of an X-Egress-Run header on /v1 is.
                self._api.audit_refusal(tool, request, exc, context)
                raise
            return await self._api.call_tool(tool, call_context, arguments, request)

        return McpCaller(tools=tools, run=run)

    async def handle_post(self, request: web.Request) -> web.StreamResponse:
        if not origin_allowed(request.headers.get("Origin")):
            return _rpc_error(403, INVALID_REQUEST, "Origin not allowed: only loopback origins may call /mcp")
        try:
            context = self._api.context_for(request)
        except GatewayError as exc:
            # A guessed bearer token (401) or a forged run token (403): the line and the
            # auth-failure count /v1 gives the same refusal, so guessing here trips the same alert.
            self._api.audit_refusal("mcp", request, exc, None)
            return error_response(exc)
        if not _accepts_json(request.headers.get("Accept")):
            return _rpc_error(406, INVALID_REQUEST, "Not Acceptable: the client must accept application/json")
        if request.content_type != "application/json":
            return _rpc_error(415, INVALID_REQUEST, "Unsupported Media Type: Content-Type must be application/json")
        try:
            raw = await read_body(request)
        except GatewayError as exc:
            return _rpc_error(exc.status_on("api"), INVALID_REQUEST, exc.message)
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _rpc_error(400, PARSE_ERROR, "Parse error: the body is not valid JSON")
        if isinstance(message, list):
            # Batching was removed in 2025-06-18; every revision served here is one message per POST.
            return _rpc_error(400, INVALID_REQUEST, "batches are not supported: send one JSON-RPC message per POST")
        if isinstance(message, dict) and is_client_response(message):
            return web.Response(status=202)  # the server sends no requests, so there is nothing to match
        try:
            check_envelope(message)
        except JsonRpcError as exc:
            request_id = message.get("id") if isinstance(message, dict) else None
            valid_id = request_id if isinstance(request_id, int | str) and not isinstance(request_id, bool) else None
            return _rpc_error(400, exc.code, exc.message, valid_id)
        header_version = request.headers.get("MCP-Protocol-Version")
        body_version = _body_version(message)
        if header_version in MODERN_VERSIONS or (header_version is None and body_version in MODERN_VERSIONS):
            return await self._modern(request, message, self._caller(context, request))
        if header_version is not None and header_version not in HANDSHAKE_VERSIONS:
            rejection = unsupported_version(header_version[:40], (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS))
            return _rpc_error(400, rejection.code, rejection.message, message.get("id"), rejection.data)
        if is_notification(message):
            return web.Response(status=202)
        return _rpc_response(await answer(self._caller(context, request), message, modern=False))

    async def _modern(self, request: web.Request, message: dict[str, Any], caller: McpCaller) -> web.Response:
        if is_notification(message):
            # 2026-07-28 defines no client-to-server notifications over HTTP: acknowledged, dropped.
            return web.Response(status=202)
        request_id = message["id"]
        duplicated = duplicated_routing_header(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in request.raw_headers
        )
        if duplicated is not None:
            return _rpc_error(400, HEADER_MISMATCH, f"{duplicated} header appears more than once", request_id)
        headers = {name.lower(): value for name, value in request.headers.items()}
        rejection = check_envelope_2026(message, headers, MODERN_VERSIONS)
        if rejection is not None:
            status = ERROR_HTTP_STATUS.get(rejection.code, 400)
            return _rpc_error(status, rejection.code, rejection.message, request_id, rejection.data)
        response = await answer(caller, message, modern=True)
        error = response.get("error")
        status = ERROR_HTTP_STATUS.get(error["code"], 200) if error else 200
        return _rpc_response(response, status)
