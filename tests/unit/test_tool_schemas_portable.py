"""Every schema a client reads (MCP tools, /v1/tools in each format, the OpenAPI document) is
written in the portable subset: no `"type": [...]` arrays, which some dialects refuse."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.tools.openapi import openapi_document
from gateway.tools.schemas import render_tools


def type_arrays(node: Any, where: str = "$") -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("type"), list):
            yield where
        for key, value in node.items():
            yield from type_arrays(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from type_arrays(value, f"{where}[{index}]")


@pytest.mark.parametrize(
    "document",
    [
        pytest.param(lambda: render_tools("mcp"), id="mcp-tools"),
        pytest.param(lambda: render_tools("openai"), id="openai-tools"),
        pytest.param(lambda: render_tools("anthropic"), id="anthropic-tools"),
        pytest.param(openapi_document, id="openapi"),
    ],
)
def test_no_schema_uses_a_type_array(document: Any) -> None:
    assert list(type_arrays(document())) == []
