"""Our 2026-07-28 envelope ladder against the official SDK's own (mcp.shared.inbound).

The daemon does not import the SDK (start-up cost), so this table keeps the two in step: for each
request, both must accept it, or both reject it with the same JSON-RPC code, and the header-value
codec must round-trip the SDK's encoding.
"""

from __future__ import annotations

from typing import Any

import pytest
from mcp.shared import inbound
from mcp_types import jsonrpc
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.tools.mcp import envelope
from gateway.tools.mcp.protocol import MODERN_VERSIONS

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
HEADERS = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "web_fetch"}


def call(meta: Any = META, name: Any = "web_fetch", method: str = "tools/call") -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": {"url": "https://example.org/"}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


CASES: list[tuple[str, dict[str, Any], dict[str, str] | None]] = [
    ("valid", call(), HEADERS),
    ("valid-stdio", call(), None),
    ("no-meta", call(meta=None), HEADERS),
    ("meta-not-object", call(meta=[1]), HEADERS),
    ("meta-missing-capabilities", call(meta={"io.modelcontextprotocol/protocolVersion": "2026-07-28"}), HEADERS),
    ("version-header-missing", call(), {k: v for k, v in HEADERS.items() if k != "mcp-protocol-version"}),
    ("version-header-differs", call(), {**HEADERS, "mcp-protocol-version": "2025-11-25"}),
    ("method-header-differs", call(), {**HEADERS, "mcp-method": "tools/list"}),
    ("method-header-missing", call(), {k: v for k, v in HEADERS.items() if k != "mcp-method"}),
    ("name-header-differs", call(), {**HEADERS, "mcp-name": "web_search"}),
    ("name-header-missing", call(), {k: v for k, v in HEADERS.items() if k != "mcp-name"}),
    ("name-header-base64", call(name="wéb"), {**HEADERS, "mcp-name": "=?base64?d8OpYg==?="}),
    ("name-header-bad-base64", call(name="wéb"), {**HEADERS, "mcp-name": "=?base64?%%%?="}),
    ("unserved-version", call(meta={**META, "io.modelcontextprotocol/protocolVersion": "2027-01-01"}), None),
    ("version-not-string", call(meta={**META, "io.modelcontextprotocol/protocolVersion": 5}), None),
    (
        "list-without-name",
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": META}},
        {**HEADERS, "mcp-method": "tools/list"},
    ),
]


@pytest.mark.parametrize(("body", "headers"), [(b, h) for _, b, h in CASES], ids=[c[0] for c in CASES])
def test_our_envelope_ladder_agrees_with_the_sdk(body: dict[str, Any], headers: dict[str, str] | None) -> None:
    ours = envelope.check_envelope_2026(body, headers, MODERN_VERSIONS)
    theirs = inbound.classify_inbound_request(body, headers=headers, supported_modern_versions=MODERN_VERSIONS)
    if isinstance(theirs, inbound.InboundLadderRejection):
        assert ours is not None
        assert ours.code == theirs.code
        if theirs.data is not None:
            assert ours.data == theirs.data
    else:
        assert ours is None


def test_constants_and_statuses_match_the_sdk() -> None:
    assert MODERN_VERSIONS == MODERN_PROTOCOL_VERSIONS
    for name in ("PARSE_ERROR", "INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS", "INTERNAL_ERROR",
                 "HEADER_MISMATCH", "UNSUPPORTED_PROTOCOL_VERSION"):  # fmt: skip
        assert getattr(envelope, name) == getattr(jsonrpc, name), name
    assert dict(envelope.ERROR_HTTP_STATUS) == {
        code: status
        for code, status in inbound.ERROR_CODE_HTTP_STATUS.items()
        if code != jsonrpc.MISSING_REQUIRED_CLIENT_CAPABILITY
    }
    assert dict(envelope.NAME_BEARING_METHODS) == dict(inbound.NAME_BEARING_METHODS)


@pytest.mark.parametrize("value", ["web_fetch", "wéb fetch", " padded ", "=?base64?abc?=", "line\nbreak", ""])
def test_header_value_codec_round_trips_the_sdk_encoding(value: str) -> None:
    assert envelope.encode_header_value(value) == inbound.encode_header_value(value)
    assert envelope.decode_header_value(inbound.encode_header_value(value)) == value
    assert envelope.decode_header_value("=?base64?not base64?=") == inbound.decode_header_value("=?base64?not base64?=")
