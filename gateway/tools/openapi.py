"""`GET /openapi.json`: the OpenAPI 3.1 document of the tools API, generated, never hand-written.

Request and result bodies come from gateway.tools.schemas, error statuses from the code table in
gateway.errors, so the document cannot drift from what the handlers do. Pure: no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gateway.errors import HTTP_STATUS, ErrorCode
from gateway.tools.schemas import ERROR_BODY, TOOL_SPECS, thawed

API_VERSION = "1"
# Codes a tool call can answer with; 401 is auth_required on this API (407 belongs to the proxy).
API_STATUS: Mapping[ErrorCode, int] = MappingProxyType({**HTTP_STATUS, ErrorCode.AUTH_REQUIRED: 401})
# Answers the HTTP layer gives before any tool runs (an unknown path, a wrong method).
_EDGE_STATUSES = MappingProxyType(
    {404: "no such path", 405: "method not allowed on this path", 413: "request body too large"}
)


def _error_response(codes: list[ErrorCode] | None, description: str) -> dict[str, Any]:
    schema = thawed(ERROR_BODY)
    if codes:
        schema["properties"]["error"]["properties"]["code"]["enum"] = sorted(str(code) for code in codes)
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error_responses() -> dict[str, Any]:
    by_status: dict[int, list[ErrorCode]] = defaultdict(list)
    for code, status in API_STATUS.items():
        by_status[status].append(code)
    responses = {
        str(status): _error_response(codes, "; ".join(sorted(str(code) for code in codes)))
        for status, codes in sorted(by_status.items())
    }
    for status, description in _EDGE_STATUSES.items():
        responses.setdefault(str(status), _error_response(None, description))
    return responses


def _budget_headers() -> list[dict[str, Any]]:
    header = {"type": "string", "pattern": "^[\\x21-\\x7e]{1,128}$"}
    return [
        {"name": "X-Egress-Run", "in": "header", "required": False, "schema": header},
        {"name": "X-Egress-Step", "in": "header", "required": False, "schema": header},
    ]


def openapi_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for spec in TOOL_SPECS:
        responses = {
            "200": {
                "description": f"the {spec.name} result",
                "content": {"application/json": {"schema": thawed(spec.result)}},
            },
            **_error_responses(),
        }
        paths[spec.path] = {
            "post": {
                "operationId": spec.name,
                "summary": spec.title,
                "description": spec.description,
                "parameters": _budget_headers(),
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": thawed(spec.arguments)}},
                },
                "responses": responses,
            }
        }
    paths["/v1/tools"] = {
        "get": {
            "operationId": "list_tools",
            "summary": "The tool definitions for function calling",
            "parameters": [
                {
                    "name": "format",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": ["openai", "anthropic", "mcp"], "default": "openai"},
                }
            ],
            "responses": {
                "200": {
                    "description": "the tools this principal may use",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"tools": {"type": "array", "items": {"type": "object"}}},
                                "required": ["tools"],
                            }
                        }
                    },
                },
                "400": _error_response([ErrorCode.INVALID_INPUT], "invalid_input"),
                "401": _error_response([ErrorCode.AUTH_REQUIRED], "auth_required"),
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "egress-gateway tools API",
            "version": API_VERSION,
            "description": "web_search and web_fetch behind the gateway's address guard, policy and budgets.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": thawed(ERROR_BODY)},
        },
        "security": [{}, {"bearer": []}],
    }
