"""One schema source: MCP, OpenAPI, /v1/tools and the /v1 validators must agree, and the served
OpenAPI document survives a bounded schemathesis run (no 500, every answer as documented).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.errors import HTTP_STATUS, ErrorCode, GatewayError
from gateway.tools.fetch import parse_fetch_args
from gateway.tools.openapi import openapi_document
from gateway.tools.schemas import FETCH_ARGUMENTS, SEARCH_ARGUMENTS, TOOL_SPECS, Tool, thawed
from gateway.tools.search.query import parse_search_args
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document

VALID_BASE: dict[Tool, dict[str, Any]] = {"fetch": {"url": "https://example.com/"}, "search": {"query": "sockets"}}
HEX64 = "ab" * 32
LONG_DOMAIN = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS) -> Iterator[GatewayProcess]:
    # Tools on, but no destination allowed: every generated call ends before any DNS lookup.
    policy = policy_document(
        principals={"default": {"egress": {"allow_domains": []}, "tools": {"search": True, "fetch": True}}}
    )
    process = GatewayProcess(tmp_path_factory.mktemp("openapi"), policy, nameserver=fake_dns.nameserver, ca_bundle=None)
    process.start()
    yield process
    process.stop()


def served(gateway: GatewayProcess) -> dict[str, dict[str, Any]]:
    """Each tool's argument schema as every surface serves it."""
    openapi = httpx.get(f"{gateway.api_url}/openapi.json", timeout=10).json()
    mcp = httpx.post(
        f"{gateway.api_url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Accept": "application/json, text/event-stream"},
        timeout=10,
    ).json()["result"]["tools"]
    openai = httpx.get(f"{gateway.api_url}/v1/tools", timeout=10).json()["tools"]
    anthropic = httpx.get(f"{gateway.api_url}/v1/tools?format=anthropic", timeout=10).json()["tools"]
    surfaces: dict[str, dict[str, Any]] = {}
    for spec in TOOL_SPECS:
        surfaces[spec.name] = {
            "openapi": openapi["paths"][spec.path]["post"]["requestBody"]["content"]["application/json"]["schema"],
            "mcp": next(tool["inputSchema"] for tool in mcp if tool["name"] == spec.name),
            "openai": next(t["function"]["parameters"] for t in openai if t["function"]["name"] == spec.name),
            "anthropic": next(tool["input_schema"] for tool in anthropic if tool["name"] == spec.name),
            "source": thawed(spec.arguments),
        }
    return surfaces


def test_mcp_openapi_and_function_calling_schemas_are_the_same_schema(gateway: GatewayProcess) -> None:
    for name, surfaces in served(gateway).items():
        reference = json.dumps(surfaces["source"], sort_keys=True)
        for surface, schema in surfaces.items():
            assert json.dumps(schema, sort_keys=True) == reference, f"{name}: {surface} differs from the source"


def test_openapi_documents_every_error_code_with_its_status(gateway: GatewayProcess) -> None:
    document = httpx.get(f"{gateway.api_url}/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.1")
    for spec in TOOL_SPECS:
        responses = document["paths"][spec.path]["post"]["responses"]
        for code, table_status in HTTP_STATUS.items():
            status = 401 if code == ErrorCode.AUTH_REQUIRED else table_status
            listed = responses[str(status)]["content"]["application/json"]["schema"]
            assert str(code) in listed["properties"]["error"]["properties"]["code"]["enum"], (spec.path, code)
    assert document == json.loads(json.dumps(openapi_document()))


def test_tools_command_prints_the_same_definitions_offline() -> None:
    for fmt in ("openai", "anthropic", "mcp"):
        printed = subprocess.run(
            [sys.executable, "-m", "gateway", "tools", "--format", fmt],
            capture_output=True,
            check=True,
            timeout=30,
            cwd=Path(__file__).parents[2],
        )
        tools = json.loads(printed.stdout)["tools"]
        assert len(tools) == 2
        if fmt == "mcp":
            assert tools[1]["inputSchema"] == thawed(FETCH_ARGUMENTS)
            assert tools[0]["annotations"]["readOnlyHint"] is True


def boundary_cases(tool: Tool, schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Payloads on each edge the schema draws, generated from the schema itself."""
    base = VALID_BASE[tool]
    yield "base", dict(base)
    yield "unknown-field", {**base, "bogus": 1}
    for required in schema["required"]:
        yield f"missing-{required}", {k: v for k, v in base.items() if k != required}
    yield "not-an-object-field-types", {**base, **{name: [] for name in schema["properties"]}}
    for name, prop in schema["properties"].items():
        values: list[Any] = [None if prop["type"] != "string" else 5]
        if prop["type"] == "integer":
            low, high = prop["minimum"], prop["maximum"]
            values += [low, high, low - 1, high + 1, True, "7", 1.5, prop.get("default", low)]
        elif "enum" in prop:
            values += [*prop["enum"], "z", prop["enum"][0].upper()]
        elif name == "expectedHash":
            values += [HEX64, HEX64.upper(), "g" * 64, "a" * 63, ""]
        elif name == "region":
            values += ["us-en", "WT-WT", "usen", "u1-en", "us-en-gb"]
        elif name == "site":
            values += ["docs.python.org", LONG_DOMAIN, LONG_DOMAIN + "e", ""]
        elif name == "query":
            values += ["x" * prop["maxLength"], "x" * (prop["maxLength"] + 1), "", "   ", " padded "]
        else:
            values += ["", "https://example.org/a"]
        for value in values:
            if value is None:
                continue
            payload = {**base, name: value}
            if tool == "fetch" and name == "offset":
                yield f"offset-{value!r}-with-hash", {**payload, "expectedHash": HEX64}
            yield f"{name}-{value!r}"[:60], payload


def accepts(tool: Tool, payload: dict[str, Any]) -> bool:
    try:
        if tool == "fetch":
            parse_fetch_args(payload)
        else:
            parse_search_args(payload)
    except GatewayError as exc:
        return exc.code != ErrorCode.INVALID_INPUT  # any other refusal is a parser bug: counted as accepted
    return True


@pytest.mark.parametrize(("tool", "schema"), [("fetch", thawed(FETCH_ARGUMENTS)), ("search", thawed(SEARCH_ARGUMENTS))])
def test_the_v1_validator_agrees_with_the_schema_on_every_edge(tool: Tool, schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    disagreements = []
    cases = list(boundary_cases(tool, schema))
    assert len(cases) > 20
    for case_id, payload in cases:
        schema_ok = validator.is_valid(payload)
        if schema_ok != accepts(tool, payload):
            disagreements.append(f"{case_id}: schema says {'valid' if schema_ok else 'invalid'}")
    assert disagreements == []


OPENAPI_SCHEMA = schemathesis.openapi.from_dict(openapi_document())


@OPENAPI_SCHEMA.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(case: Any, gateway: GatewayProcess) -> None:
    case.call_and_validate(
        base_url=gateway.api_url,
        timeout=20,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
    )
