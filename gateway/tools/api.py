"""The tools API listener: POST /v1/fetch and POST /v1/search, JSON in and out; /mcp beside them.

Owns the HTTP edge only: the principal from `Authorization: Bearer` (or the default principal),
run and step ids from `X-Egress-Run`/`X-Egress-Step`, argument parsing, and turning every
GatewayError into its status and the JSON error body. One audit line per call, without the
query text, the URL path or any credential. Also serves what describes it: `GET /openapi.json`
and `GET /v1/tools`, both generated from gateway.tools.schemas. Unknown paths and methods get the
JSON error body too, and the `Server` header names no version.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any, cast

import orjson
from aiohttp import web

from gateway.credentials.guard import OutboundGuard
from gateway.credentials.screen import RequestFacts
from gateway.errors import ErrorCode, GatewayError
from gateway.observe import metrics
from gateway.observe.audit import CONNECTION_ID_HEADER, AuditLog
from gateway.observe.audit_fields import client_fields, new_connection_id
from gateway.observe.verdicts import outcome_for_code, rule_for_code, verdict_of_failure
from gateway.peer_uid import loopback_peer_uid
from gateway.policy.decide import authenticate_bound, decide_destination
from gateway.policy.model import LoadedPolicy
from gateway.tools.call_guard import CallContext, ToolCalls, require_tool
from gateway.tools.fetch import FetchTool, parse_fetch_args
from gateway.tools.http_edge import MAX_REQUEST_BYTES, error_response, json_response, read_body
from gateway.tools.mcp.http import McpHttpEndpoint
from gateway.tools.openapi import openapi_document
from gateway.tools.schemas import Tool, ToolFormat, render_tools
from gateway.tools.search.query import parse_search_args
from gateway.tools.search.tool import SearchTool

SERVER_HEADER = "egress-gateway"
TOOL_FORMATS: tuple[ToolFormat, ...] = ("openai", "anthropic", "mcp")
# The request's id (its audit lines' `conn`), kept on the request for the X-Egress-Id header.
REQUEST_ID_KEY = "egress_request_id"
# The budget key a budget refusal names, by code (quota refusals name theirs in `budget`).
_BUDGET_KEYS = MappingProxyType({ErrorCode.CONCURRENCY_LIMITED: "concurrent", ErrorCode.COOLDOWN: "min_interval_s"})


def _request_fields(request: web.Request) -> dict[str, Any]:
    """The audit fields every tool line carries from its HTTP request: its id and the client."""
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    return {"conn": request_id(request), **client_fields(peer)}


def request_id(request: web.Request) -> str:
    """The id of one API request: its audit lines' `conn` and its response's X-Egress-Id."""
    existing = request.get(REQUEST_ID_KEY)
    if isinstance(existing, str):
        return existing
    created = request[REQUEST_ID_KEY] = new_connection_id()
    return created


def _refusal_rule(tool: str, error: GatewayError) -> tuple[str | None, str | None]:
    """The rule a tool refusal names: the error's own, a budget key, or the check of its code."""
    if error.rule is not None:
        return error.rule, error.rule_pattern
    if error.code in (ErrorCode.QUOTA_EXHAUSTED, ErrorCode.CONCURRENCY_LIMITED, ErrorCode.COOLDOWN):
        budget = error.extra.get("budget")
        return f"budgets.{tool}", budget if isinstance(budget, str) else _BUDGET_KEYS.get(error.code)
    return rule_for_code(error.code), None


class ToolsApi:
    def __init__(
        self,
        policy_source: Callable[[], LoadedPolicy],
        calls: ToolCalls,
        fetch_tool: FetchTool,
        search_tool: SearchTool,
        audit: AuditLog,
        *,
        guard: OutboundGuard | None = None,
    ) -> None:
        self._policy_source = policy_source
        self._calls = calls
        self._fetch = fetch_tool
        self._search = search_tool
        self._audit = audit
        # The outbound secret scan and placeholder check (issue 26), before any byte is sent.
        self._guard = guard

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[json_http_errors])
        app.router.add_post("/v1/fetch", self.handle_fetch)
        app.router.add_post("/v1/search", self.handle_search)
        app.router.add_post("/v1/runs", self.handle_mint_run_token)
        app.router.add_get("/v1/tools", self.handle_tools)
        app.router.add_get("/openapi.json", self.handle_openapi)
        McpHttpEndpoint(self).add_routes(app)
        app.on_response_prepare.append(_plain_server_header)
        return app

    async def _context(self, request: web.Request) -> CallContext:
        return self.context_for(request)

    def context_for(self, request: web.Request) -> CallContext:
        """The principal and budget ids of a request, exactly as /v1 reads them (auth_required if wrong)."""
        loaded = self._policy_source()
        authorization = request.headers.get("Authorization")
        token: str | None = None
        if authorization is not None:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise GatewayError(ErrorCode.AUTH_REQUIRED, "Authorization must be 'Bearer <token>'")
            token = value.strip()
        peer_uid: int | None = None
        if loaded.policy.transparent.principals and request.transport is not None:
            # A uid the policy binds is its principal here too (enforced sidecar, identity).
            transport = request.transport
            peer_uid = loopback_peer_uid(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
        principal = authenticate_bound(loaded.policy, None, token, peer_uid)
        # Run and step ids count only under a run token (issue 12): see tools/run_tokens.py.
        return self._calls.context(principal, loaded, request.headers)

    def meta_context(self, context: CallContext, run_meta: str | None, step_meta: str | None) -> CallContext:
        """An MCP call's `_meta` run and step, counted only under the request's run token."""
        return self._calls.with_meta_ids(context, run_meta, step_meta)

    @staticmethod
    async def _payload(request: web.Request) -> Any:
        if request.content_type != "application/json":
            raise GatewayError(ErrorCode.INVALID_INPUT, "Content-Type must be application/json")
        raw = await read_body(request)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise GatewayError(ErrorCode.INVALID_INPUT, "the request body is not valid JSON") from None

    async def _handle(self, tool: str, request: web.Request) -> web.Response:
        started = time.perf_counter()
        audit: dict[str, Any] = _request_fields(request)
        principal_name: str | None = None
        generation: int | None = None
        try:
            context = await self._context(request)
            principal_name, generation = context.principal.name, context.loaded.generation
            # The ids as the agent sent them, for correlation; `run_vouched` says whether they counted.
            audit.update(
                run=context.run_id or context.vouched.claimed_run,
                step=context.step_id or context.vouched.claimed_step,
                run_vouched=context.vouched.claims is not None,
            )
            payload = await self._payload(request)
            result = await self.invoke(tool, context, payload, audit)
        except GatewayError as exc:
            self._finish(tool, principal=principal_name, generation=generation, started=started, error=exc, audit=audit)
            response = error_response(exc)
        else:
            self._finish(
                tool, principal=principal_name, generation=generation, started=started, error=None, audit=audit
            )
            response = json_response(result)
        return response

    def _finish(
        self,
        tool: str,
        *,
        principal: str | None,
        generation: int | None,
        started: float,
        error: GatewayError | None,
        audit: dict[str, Any],
    ) -> None:
        duration = time.perf_counter() - started
        would_deny = audit.pop("would_deny", None)
        would_deny_reason = audit.pop("would_deny_reason", None)
        if error is not None:
            code, reason = error.code, error.message
            # `none` when no rule had allowed the call yet (a malformed request, a body that never arrived).
            decision, outcome = verdict_of_failure(code, audit.get("rule")), outcome_for_code(code)
            if decision == "deny":
                # The rule that refused, not the allow rule an earlier step recorded.
                audit["rule"], audit["rule_pattern"] = _refusal_rule(tool, error)
            elif decision == "none":
                audit.pop("rule", None)
                audit.pop("rule_pattern", None)
        elif would_deny is not None:
            decision, code, reason, outcome = "would_deny", would_deny, would_deny_reason, "ok"
        else:
            decision, code, reason, outcome = "allow", None, None, "ok"
        metrics.TOOL_CALLS.labels(tool=tool, code=str(error.code) if error else "ok").inc()
        metrics.TOOL_SECONDS.labels(tool=tool).observe(duration)
        metrics.DECISIONS.labels(kind=tool, decision=decision, code=code or "none").inc()
        self._audit.decision(
            kind=tool,
            principal=principal,
            host=audit.pop("host", None),
            port=audit.pop("port", None),
            decision=decision,
            outcome=outcome,
            code=code,
            reason=reason,
            generation=generation,
            duration_s=round(duration, 6),
            **audit,
        )
        # A tool answer never leaves before its audit line is written.
        self._audit.flush()

    def audit_refusal(self, kind: str, request: web.Request, error: GatewayError, context: CallContext | None) -> None:
        """The line and counters of a request refused before any tool ran, as /v1 writes them.

        /mcp refuses a bad bearer token (401) or run token (403) before it reads a message, and a
        `_meta` run that contradicts the run token before the call starts: each gets the same
        audit line and auth-failure count as the refusal on /v1, so guessing against /mcp is seen.
        `kind` is the tool when the message named one, else `mcp`.
        """
        audit: dict[str, Any] = _request_fields(request)
        if context is not None:
            audit.update(
                run=context.run_id or context.vouched.claimed_run,
                step=context.step_id or context.vouched.claimed_step,
                run_vouched=context.vouched.claims is not None,
            )
        principal = context.principal.name if context is not None else None
        generation = context.loaded.generation if context is not None else self._policy_source().generation
        if kind in ("fetch", "search"):
            self._finish(
                kind, principal=principal, generation=generation, started=time.perf_counter(), error=error, audit=audit
            )
            return
        decision = verdict_of_failure(error.code, None)
        metrics.DECISIONS.labels(kind=kind, decision=decision, code=error.code).inc()
        self._audit.decision(
            kind=kind,
            principal=principal,
            host=None,
            port=None,
            decision=decision,
            outcome=outcome_for_code(error.code),
            code=error.code,
            reason=error.message,
            generation=generation,
            duration_s=0.0,
            **audit,
        )
        self._audit.flush()

    async def call_tool(
        self, tool: Tool, context: CallContext, payload: Any, request: web.Request | None = None
    ) -> dict[str, Any]:
        """One audited tool call for a context already authenticated (MCP over HTTP and stdio)."""
        started = time.perf_counter()
        # A call without a listener (MCP over stdio) still gets an id for its line.
        audit: dict[str, Any] = _request_fields(request) if request is not None else {"conn": new_connection_id()}
        audit.update(run=context.run_id, step=context.step_id)
        name, generation = context.principal.name, context.loaded.generation
        try:
            result = await self.invoke(tool, context, payload, audit)
        except GatewayError as exc:
            self._finish(tool, principal=name, generation=generation, started=started, error=exc, audit=audit)
            raise
        self._finish(tool, principal=name, generation=generation, started=started, error=None, audit=audit)
        return result

    async def invoke(self, tool: str, context: CallContext, payload: Any, audit: dict[str, Any]) -> dict[str, Any]:
        """Run one tool call for `context`; shared by the HTTP handlers and the CLI."""
        # The switch first and once: a principal without the tool learns nothing about its arguments.
        require_tool(context.principal, "fetch" if tool == "fetch" else "search")
        # No audit, no egress: refused here with its own code (inside, robots.txt or an engine
        # would see the refusal as an unreachable site and answer with another one).
        refusal = self._audit.refusal()
        if refusal is not None:
            raise refusal
        # The switch that let the call in; a fetch names its destination's rule once decided.
        audit["rule"] = f"tools.{tool}"
        if tool == "fetch":
            return await self._invoke_fetch(context, payload, audit)
        return await self._invoke_search(context, payload, audit)

    async def _invoke_fetch(self, context: CallContext, payload: Any, audit: dict[str, Any]) -> dict[str, Any]:
        args = parse_fetch_args(payload)
        self._screen(context, "fetch", url=args.url)
        vetted = self._fetch.vet(args, context.loaded)
        audit.update(host=vetted.host.name, port=vetted.port)
        # A destination the policy refuses costs no reservation (issue 5): decide before reserving
        # (form, in-cluster names, then the name). The egress core decides again, with
        # DNS, inside the call and on every redirect hop.
        policy = context.loaded.policy
        decision = decide_destination(policy, context.principal, vetted.host, vetted.port)
        audit.update(rule=decision.rule, rule_pattern=decision.pattern)
        if not decision.allowed:
            if policy.mode_for(context.principal) == "enforce":
                raise decision.to_error()
            audit.update(would_deny=decision.code, would_deny_reason=decision.reason)

        async def work() -> dict[str, Any]:
            result = await self._fetch.fetch(args, vetted, context.principal, context.loaded, audit)
            audit.update(chars=len(result["content"]), total_chars=result["totalChars"])
            return result

        return await self._calls.run("fetch", context, work)

    async def _invoke_search(self, context: CallContext, payload: Any, audit: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise GatewayError(ErrorCode.INVALID_INPUT, "the request body must be a JSON object")
        query = parse_search_args(payload)
        self._screen(context, "search", query=query.with_site_operator())

        async def work() -> dict[str, Any]:
            try:
                result = await self._search.search(query, context.principal, context.loaded)
            except GatewayError as exc:
                audit.update(attempts=exc.extra.get("attempts"))
                raise
            audit.update(provider=result["provider"], results=len(result["results"]), attempts=result["attempts"])
            return result

        return await self._calls.run("search", context, work)

    def _screen(self, context: CallContext, tool: str, *, url: str | None = None, query: str | None = None) -> None:
        """Refuse a fetch URL or search query that carries a placeholder (the tools never inject
        one) or a secret the principal's `scan:` section denies."""
        if self._guard is None:
            return
        policy, principal = context.loaded.policy, context.principal
        facts = RequestFacts(tool, principal.name, "", None, None)
        generation = context.loaded.generation
        refusal = (
            self._guard.screen_request(facts, policy, principal, url=url, generation=generation)
            if url is not None
            else self._guard.screen_query(facts, policy, principal, query or "", generation)
        )
        if refusal is not None:
            raise refusal

    async def handle_mint_run_token(self, request: web.Request) -> web.Response:
        """`POST /v1/runs`: an orchestrator mints a run token for one of its principals."""
        started = time.perf_counter()
        loaded = self._policy_source()
        orchestrator: str | None = None
        try:
            minter = self._calls.run_tokens.authenticate_orchestrator(
                loaded.policy, request.headers.get("Authorization")
            )
            orchestrator = minter.name
            minted = self._calls.run_tokens.mint(loaded.policy, minter, await self._payload(request))
        except GatewayError as exc:
            self._audit_mint(request, orchestrator, None, generation=loaded.generation, started=started, error=exc)
            return error_response(exc)
        self._audit_mint(
            request, orchestrator, str(minted["principal"]), generation=loaded.generation, started=started, error=None
        )
        return json_response(minted)

    def _audit_mint(
        self,
        request: web.Request,
        orchestrator: str | None,
        principal: str | None,
        *,
        generation: int,
        started: float,
        error: GatewayError | None,
    ) -> None:
        # The token itself and the run id are never logged: the token is a credential.
        self._audit.decision(
            kind="run_token",
            principal=principal,
            host=None,
            port=None,
            decision="deny" if error else "allow",
            code=str(error.code) if error else None,
            reason=error.message if error else None,
            generation=generation,
            duration_s=round(time.perf_counter() - started, 6),
            orchestrator=orchestrator,
            # An orchestrator refused after it authenticated was refused by its own entry.
            rule="orchestrators" if orchestrator is not None else None,
            **_request_fields(request),
        )
        self._audit.flush()

    async def handle_fetch(self, request: web.Request) -> web.Response:
        return await self._handle("fetch", request)

    async def handle_search(self, request: web.Request) -> web.Response:
        return await self._handle("search", request)

    async def handle_tools(self, request: web.Request) -> web.Response:
        try:
            context = self.context_for(request)
            fmt = request.query.get("format", "openai")
            if fmt not in TOOL_FORMATS:
                raise GatewayError(ErrorCode.INVALID_INPUT, "format must be openai, anthropic or mcp")
        except GatewayError as exc:
            return error_response(exc)
        tools = tuple(tool for tool in ("search", "fetch") if getattr(context.principal.tools, tool))
        return json_response({"tools": render_tools(fmt, cast(tuple[Tool, ...], tools))})

    async def handle_openapi(self, _: web.Request) -> web.Response:
        return json_response(_openapi())


@functools.cache
def _openapi() -> dict[str, Any]:
    """Built on the first GET /openapi.json, not at every start."""
    return openapi_document()


async def _plain_server_header(request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp would announce "Python/3.x aiohttp/3.y": a free fingerprint for an attacker.
    response.headers["Server"] = SERVER_HEADER
    # Every response names its request's id, the `conn` of the audit lines it wrote (if any).
    response.headers[CONNECTION_ID_HEADER] = request_id(request)


@web.middleware
async def json_http_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own 404/405 (and any other HTTP exception) as the JSON error body."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            message = f"no such path: {request.path[:200]}"
        elif exc.status == 405:
            message = f"method {request.method} not allowed on {request.path[:200]}"
        else:
            message = exc.reason
        response = error_response(GatewayError(ErrorCode.INVALID_INPUT, message, status=exc.status))
        allow = exc.headers.get("Allow")
        if allow:
            response.headers["Allow"] = allow
        return response
