"""What the `/v1` API and `/mcp` share at their HTTP edge: the bounded body read and the JSON error body.

Owns `read_body` (the whole body within `MAX_REQUEST_BYTES` and `BODY_TIMEOUT_S`, else a typed
error) and `error_response` (a `GatewayError` as its status, `X-Egress-Code`, `Retry-After` and
the JSON error body). It sits below both `api.py` and `mcp/http.py`, so neither imports the
other for it.

Never authenticates, never runs a tool, never writes an audit line.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import orjson
from aiohttp import web

from gateway.errors import ErrorCode, GatewayError

MAX_REQUEST_BYTES = 64 * 1024
# A request body must arrive within this time once its head is in (a slow body holds a socket).
BODY_TIMEOUT_S = 10.0


def json_response(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)


def error_response(exc: GatewayError) -> web.Response:
    headers = {"X-Egress-Code": str(exc.code)}
    if exc.retry_after_s is not None:
        # Rounded up: a client that waits exactly this long must not be refused again.
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    status = exc.status_on("api")
    if exc.code == ErrorCode.AUTH_REQUIRED:
        headers["WWW-Authenticate"] = 'Bearer realm="egress-gateway"'
    return json_response(exc.to_body(), status, headers)


async def read_body(request: web.Request) -> bytes:
    """The whole body, within MAX_REQUEST_BYTES and BODY_TIMEOUT_S (invalid_input otherwise)."""
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise GatewayError(
            ErrorCode.INVALID_INPUT, f"request body over {MAX_REQUEST_BYTES} bytes", status=413
        ) from None
    except TimeoutError:
        raise GatewayError(ErrorCode.TIMEOUT, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    except ConnectionError:
        # The client reset mid-body: nobody will read the answer, and it is no server fault to log.
        raise GatewayError(
            ErrorCode.INVALID_INPUT, "the client closed the connection before the body arrived"
        ) from None
