"""What a model reads from a tool call: the text content beside the structured `/v1` object.

A search becomes a numbered list; a fetch becomes the markdown window and a line saying how to
continue; a gateway refusal becomes a tool error naming its code, the reason and what the agent
can do next. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.schemas import Tool

# Where a tool error carries the `/v1` error object (code, message, retryable, ...) for programs.
ERROR_META_KEY = "egress-gateway/error"

NEXT_STEP: Mapping[ErrorCode, str] = MappingProxyType(
    {
        ErrorCode.INVALID_INPUT: "fix the argument named in the reason and call again",
        ErrorCode.UNSAFE_URL: "use a plain public http(s) URL without credentials or secret parameters",
        ErrorCode.BLOCKED_DESTINATION: (
            "this address is private or internal and will never be fetched; use another source"
        ),
        ErrorCode.POLICY_DENIED: "this site or tool is not allowed for you; do not retry, use an allowed source",
        ErrorCode.AUTH_REQUIRED: "the gateway needs a valid token; ask the operator",
        ErrorCode.DNS_FAILURE: "check the host name; retry later if it should exist",
        ErrorCode.CONNECT_FAILURE: "the site could not be reached; retry later or use another source",
        ErrorCode.REDIRECT_BLOCKED: "the page redirects somewhere not allowed; use another source",
        ErrorCode.TOO_LARGE: "the page is too large; use a more specific page",
        ErrorCode.UNSUPPORTED_CONTENT: "the content is not text; look for an HTML or text version",
        ErrorCode.CHALLENGED: "the site blocks automated readers; use another source",
        ErrorCode.ROBOTS_DISALLOWED: "the site does not allow this page to be fetched; use another source",
        ErrorCode.UPSTREAM_STATUS: "the site answered with an error; check the URL or retry later",
        ErrorCode.TIMEOUT: "the site was too slow; retry once or use another source",
        ErrorCode.CONTENT_CHANGED: "the page changed; fetch it again from offset 0",
        ErrorCode.QUOTA_EXHAUSTED: "the budget for this run or step is spent; work with what you have",
        ErrorCode.CONCURRENCY_LIMITED: "wait for your other calls to finish, then retry",
        ErrorCode.COOLDOWN: "wait the retry-after time, then retry",
        ErrorCode.RATE_LIMITED: "the search engine is refusing requests; retry later",
        ErrorCode.UNAVAILABLE: "no engine answered; retry later or rephrase the query",
        ErrorCode.STORE_UNAVAILABLE: "the gateway's budget store is down; retry later",
        ErrorCode.POLICY_CHANGED: "the policy changed during the call; retry",
    }
)


def error_text(error: GatewayError) -> str:
    retry = f" (retry after {error.retry_after_s:.0f} s)" if error.retry_after_s else ""
    next_step = NEXT_STEP.get(error.code, "do not retry this call unchanged")
    return f"Refused: {error.code}: {error.message}{retry}\nWhat to do next: {next_step}."


def _removed_line(result: dict[str, Any]) -> list[str]:
    removed = result.get("controlCharsRemoved") or 0
    return [f"[{removed} control or hidden characters were removed from this result.]"] if removed else []


def search_text(result: dict[str, Any]) -> str:
    rows = result.get("results") or []
    lines = [f"Search results for {result.get('query', '')!r} ({len(rows)} from {result.get('provider', '?')}):", ""]
    for index, hit in enumerate(rows, 1):
        lines += [f"{index}. {hit.get('title', '')}", f"   {hit.get('url', '')}", f"   {hit.get('snippet', '')}"]
    if not rows:
        lines.append("No results.")
    lines += ["", *_removed_line(result), "Read a result with web_fetch.", str(result.get("notice", ""))]
    return "\n".join(lines).rstrip() + "\n"


def fetch_text(result: dict[str, Any]) -> str:
    offset, total = int(result.get("offset", 0)), int(result.get("totalChars", 0))
    content = str(result.get("content", ""))
    head = f"# {result.get('title') or result.get('finalUrl', '')}\nURL: {result.get('finalUrl', result.get('url'))}\n"
    end = offset + len(content)
    if result.get("nextOffset") is not None:
        tail = (
            f"[Characters {offset}-{end} of {total}. The page continues: call web_fetch again with "
            f"url={result.get('url')!r}, offset={result['nextOffset']} and "
            f"expectedHash={result.get('contentHash')!r} to read on.]"
        )
    else:
        tail = f"[Characters {offset}-{end} of {total}: end of the page.]"
    removed = "".join(f"{line}\n" for line in _removed_line(result))
    return f"{head}\n{content}\n\n{tail}\n{removed}{result.get('notice', '')}".rstrip() + "\n"


def tool_result(tool: Tool, result: dict[str, Any]) -> dict[str, Any]:
    text = search_text(result) if tool == "search" else fetch_text(result)
    return {"content": [{"type": "text", "text": text}], "structuredContent": result, "isError": False}


def tool_error(error: GatewayError) -> dict[str, Any]:
    """A refusal as a tool error every client accepts: text for the model, the `/v1` error object
    under `_meta` for programs. Never `structuredContent`: strict clients (the TypeScript SDK v1,
    the MCP Inspector) validate it against the tool's `outputSchema` even on `isError` and reject
    the whole result (-32602), so the model would never read the refusal; widening each output
    schema to admit the error shape instead would make every client's typed result a union."""
    return {
        "content": [{"type": "text", "text": error_text(error)}],
        "isError": True,
        "_meta": {ERROR_META_KEY: error.to_body()["error"]},
    }
