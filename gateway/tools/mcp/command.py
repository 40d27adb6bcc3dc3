"""The `egress-gateway mcp` and `egress-gateway tools` commands, given Settings.

`mcp` serves stdio with the tools in-process (one principal of the policy, the default unless
named), or bridges stdio to a running gateway with `--connect`. `tools` prints the tool
definitions offline. Stdout carries only protocol or the requested JSON; the audit log written to
stdout by default is moved to stderr here.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.policy.load import PolicyError
from gateway.settings import Settings
from gateway.tools.schemas import Tool, ToolFormat, render_tools

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def print_tools(fmt: ToolFormat) -> int:
    sys.stdout.write(orjson.dumps({"tools": render_tools(fmt)}, option=orjson.OPT_INDENT_2).decode() + "\n")
    return EXIT_OK


async def serve_stdio(settings: Settings, principal_name: str | None) -> int:
    from gateway.app import Gateway  # noqa: PLC0415 - the daemon's wiring, only for this command
    from gateway.tools.call_guard import CallContext, parse_budget_id  # noqa: PLC0415
    from gateway.tools.mcp.protocol import RUN_META_KEY, STEP_META_KEY, McpCaller  # noqa: PLC0415
    from gateway.tools.mcp.stdio import line_handler, serve_lines  # noqa: PLC0415

    if settings.audit_log == "-":
        settings = dataclasses.replace(settings, audit_log="/dev/stderr")
    try:
        gateway = Gateway(settings)
        gateway.build_core()
        api = gateway.tools_api()
    except PolicyError as exc:
        sys.stderr.write("\n".join(exc.errors) + "\n")
        return EXIT_INVALID
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    try:
        policy = gateway.policy.current.policy
        principal = policy.principals.get(principal_name) if principal_name else policy.default_principal
        if principal is None:
            raise GatewayError(ErrorCode.AUTH_REQUIRED, f"no principal {principal_name or 'default'!r} in the policy")
        tools: frozenset[Tool] = frozenset(t for t in ("search", "fetch") if getattr(principal.tools, t))
        # One stdio process is one agent session, and its launcher (not the agent) names the run:
        # a `_meta` run id would let the agent open a fresh run budget per call (issue 12), so it
        # is checked and ignored; a `_meta` step names a step inside the session's run.
        session_run = f"stdio-{secrets.token_hex(8)}"

        async def run(tool: Tool, arguments: object, meta: Mapping[str, Any]) -> dict[str, Any]:
            run_id, step_id = meta.get(RUN_META_KEY), meta.get(STEP_META_KEY)
            if isinstance(run_id, str):
                parse_budget_id(run_id, "_meta run")
            context = CallContext(
                principal,
                gateway.policy.current,
                session_run,
                parse_budget_id(step_id, "_meta step") if isinstance(step_id, str) else None,
            )
            return await api.call_tool(tool, context, arguments)

        await serve_lines(line_handler(McpCaller(tools=tools, run=run)))
    except GatewayError as exc:
        sys.stderr.write(f"egress-gateway: {exc.message}\n")
        return EXIT_USAGE
    finally:
        await gateway.shutdown()
    return EXIT_OK


async def bridge_stdio(url: str, token: str | None, run_token: str | None = None) -> int:
    from gateway.tools.mcp.bridge import BRIDGE_TIMEOUT_S, bridge_handler  # noqa: PLC0415
    from gateway.tools.mcp.stdio import serve_lines  # noqa: PLC0415

    if not url.startswith(("http://", "https://")):
        sys.stderr.write("egress-gateway: --connect takes the gateway's http(s) URL, e.g. http://gw:8080\n")
        return EXIT_USAGE
    if not url.rstrip("/").endswith("/mcp"):
        url = url.rstrip("/") + "/mcp"
    timeout = aiohttp.ClientTimeout(total=BRIDGE_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await serve_lines(bridge_handler(session, url, token, run_token))
    return EXIT_OK
