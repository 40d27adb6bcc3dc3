"""The MCP wire constants and the 2026-07-28 per-request envelope check.

Owns the JSON-RPC error codes MCP uses, the `_meta` keys, the HTTP status each code maps to, and
the validation ladder of a 2026-07-28 request: the `_meta` envelope, then the routing headers
(`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`) against the body, then the revision. The rules
and codes are those of the official SDK (mcp 2.3.0, `mcp.shared.inbound`); a test checks this
ladder against the SDK's own on a table of requests. The SDK is not imported here because
importing it (or `mcp_types`, which builds pydantic models for the whole schema) costs about a
second of start-up for a handful of constants. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022

PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"

VERSION_HEADER = "mcp-protocol-version"
METHOD_HEADER = "mcp-method"
NAME_HEADER = "mcp-name"
ROUTING_HEADERS = frozenset({VERSION_HEADER, METHOD_HEADER, NAME_HEADER})
# Which params field `Mcp-Name` mirrors, per method.
NAME_BEARING_METHODS: Mapping[str, str] = MappingProxyType(
    {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
)

# The HTTP status of a JSON-RPC error on the 2026-07-28 wire; unlisted codes travel with 200.
ERROR_HTTP_STATUS: Mapping[int, int] = MappingProxyType(
    {
        PARSE_ERROR: 400,
        INVALID_REQUEST: 400,
        INVALID_PARAMS: 400,
        HEADER_MISMATCH: 400,
        UNSUPPORTED_PROTOCOL_VERSION: 400,
        METHOD_NOT_FOUND: 404,
    }
)

_HEADER_SAFE = re.compile(r"^[\x20-\x7e]*$")
_B64_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


@dataclass(frozen=True, slots=True)
class EnvelopeRejection:
    code: int
    message: str
    data: Any = None


def encode_header_value(value: str) -> str:
    """A value as it can travel in a header: verbatim if printable ASCII, else `=?base64?...?=`."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not _B64_SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def decode_header_value(value: str | None) -> str | None:
    """Inverse of encode_header_value; a malformed sentinel is None, so it never matches a body."""
    if value is None:
        return None
    match = _B64_SENTINEL.fullmatch(value)
    if match is None:
        return value
    payload = match.group("payload")
    try:
        decoded = base64.b64decode(payload, validate=True)
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def duplicated_routing_header(raw_headers: Iterable[tuple[str, str]]) -> str | None:
    """A routing header sent twice: first-copy and last-copy readers would disagree."""
    seen: set[str] = set()
    for name, _ in raw_headers:
        key = name.lower()
        if key in ROUTING_HEADERS:
            if key in seen:
                return key
            seen.add(key)
    return None


def unsupported_version(requested: str, supported: tuple[str, ...]) -> EnvelopeRejection:
    return EnvelopeRejection(
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        {"supported": list(supported), "requested": requested},
    )


def check_envelope_2026(
    body: Mapping[str, Any], headers: Mapping[str, str] | None, supported: tuple[str, ...]
) -> EnvelopeRejection | None:
    """The first rung a 2026-07-28 request fails, or None. `headers` lowercased; None on stdio."""
    params = body.get("params")
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    if not isinstance(meta, Mapping):
        return EnvelopeRejection(
            INVALID_PARAMS,
            f"params._meta must be an object carrying {PROTOCOL_VERSION_META_KEY!r} and "
            f"{CLIENT_CAPABILITIES_META_KEY!r}",
        )
    missing = [key for key in (PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY) if key not in meta]
    if missing:
        return EnvelopeRejection(INVALID_PARAMS, f"params._meta is missing {', '.join(missing)}")
    version = meta[PROTOCOL_VERSION_META_KEY]
    if headers is not None:
        # Header rungs come before the revision rung: a client that disagrees with itself is told so.
        if headers.get(VERSION_HEADER) is None or headers.get(VERSION_HEADER) != version:
            return EnvelopeRejection(HEADER_MISMATCH, "MCP-Protocol-Version header does not match _meta")
        method = body.get("method")
        if headers.get(METHOD_HEADER) != method:
            return EnvelopeRejection(HEADER_MISMATCH, "Mcp-Method header does not match the body's method")
        name_key = NAME_BEARING_METHODS.get(method) if isinstance(method, str) else None
        if name_key is not None and isinstance(params, Mapping):
            named = params.get(name_key)
            if named is not None and decode_header_value(headers.get(NAME_HEADER)) != named:
                return EnvelopeRejection(HEADER_MISMATCH, f"Mcp-Name header does not match the body's {name_key!r}")
    if not isinstance(version, str):
        return EnvelopeRejection(INVALID_PARAMS, "the protocol version in _meta must be a string")
    if version not in supported:
        return unsupported_version(version, supported)
    return None
