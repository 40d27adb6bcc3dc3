"""MCP over stdio (`egress-gateway mcp`): newline-delimited JSON-RPC on stdin and stdout.

Owns the framing: one message per line in, one response per line out, requests answered
concurrently (a slow fetch does not hold a ping), writes serialised. The revision is read from the
message: the initialize handshake, or the 2026-07-28 `_meta` envelope. The tools run in-process
through ToolsApi (full egress core, policy, in-memory budgets, audit log). Never writes anything
but JSON-RPC to stdout: logs and the audit log go to stderr or a file.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.tasks import spawn
from gateway.tools.mcp.envelope import INVALID_REQUEST, PARSE_ERROR, PROTOCOL_VERSION_META_KEY, check_envelope_2026
from gateway.tools.mcp.line_framing import LineFramer, Oversized
from gateway.tools.mcp.protocol import (
    MODERN_VERSIONS,
    JsonRpcError,
    McpCaller,
    answer,
    check_envelope,
    error_object,
    is_client_response,
    is_notification,
)

MAX_LINE_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024
OVERSIZED_MESSAGE = f"message over {MAX_LINE_BYTES} bytes: discarded up to its newline"

LineHandler = Callable[[bytes], Awaitable[dict[str, Any] | None]]


def _is_modern(message: dict[str, Any]) -> bool:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get(PROTOCOL_VERSION_META_KEY) in MODERN_VERSIONS


def line_handler(caller: McpCaller) -> LineHandler:
    """Answer one stdin line with the caller's tools: a response object, or None for none owed."""

    async def handle(line: bytes) -> dict[str, Any] | None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            return error_object(None, PARSE_ERROR, "Parse error: the line is not valid JSON")
        if isinstance(message, list):
            return error_object(None, INVALID_REQUEST, "batches are not supported: one JSON-RPC message per line")
        if isinstance(message, dict) and is_client_response(message):
            return None
        try:
            check_envelope(message)
        except JsonRpcError as exc:
            return error_object(None, exc.code, exc.message)
        if is_notification(message):
            return None
        modern = _is_modern(message)
        if modern:
            rejection = check_envelope_2026(message, None, MODERN_VERSIONS)
            if rejection is not None:
                return error_object(message["id"], rejection.code, rejection.message, rejection.data)
        return await answer(caller, message, modern=modern)

    return handle


async def _stdio_streams() -> tuple[asyncio.StreamReader, asyncio.WriteTransport]:
    loop = asyncio.get_running_loop()
    # The reader's limit only bounds what it buffers before pausing the pipe; lines are cut by LineFramer.
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
    return reader, transport


async def serve_lines(handle: LineHandler) -> None:
    """Read stdin until EOF, answering each line; wait for the answers in flight before returning."""
    reader, out = await _stdio_streams()
    pending: set[asyncio.Task[None]] = set()

    def write(response: dict[str, Any] | None) -> None:
        if response is not None and not out.is_closing():
            # One write per message: a line is never interleaved with another.
            out.write(orjson.dumps(response) + b"\n")

    async def respond(line: bytes) -> None:
        write(await handle(line))

    framer = LineFramer(MAX_LINE_BYTES)
    while True:
        chunk = await reader.read(READ_CHUNK_BYTES)
        events = framer.feed(chunk) if chunk else framer.finish()
        for event in events:
            if isinstance(event, Oversized):
                # Discarded to its newline: the rest of the line is never read as a message, and
                # the request (when its id could be read) gets exactly one answer.
                write(error_object(event.request_id, INVALID_REQUEST, OVERSIZED_MESSAGE))
            elif event.strip():
                task = spawn(respond(event), name="mcp-stdio-request")
                pending.add(task)
                task.add_done_callback(pending.discard)
        if not chunk:
            break
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    out.close()
