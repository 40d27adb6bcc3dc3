"""web_fetch arguments: defaults, ranges, types, unknown fields, continuation rules; and the window fit."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.fetch import FetchArgs, ReaderService, fit_window, parse_fetch_args

HASH = "a" * 64


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param({"url": "https://e.org/"}, FetchArgs("https://e.org/", 16_000, 0, None), id="defaults"),
        pytest.param({"url": "https://e.org/", "maxChars": 100}, FetchArgs("https://e.org/", 100), id="min-chars"),
        pytest.param(
            {"url": "https://e.org/", "maxChars": 32_000}, FetchArgs("https://e.org/", 32_000), id="max-chars"
        ),
        pytest.param(
            {"url": "https://e.org/", "offset": 5, "expectedHash": HASH.upper()},
            FetchArgs("https://e.org/", 16_000, 5, HASH),
            id="continuation-hash-lowercased",
        ),
        pytest.param(
            {"url": "https://e.org/", "offset": 0, "expectedHash": HASH},
            FetchArgs("https://e.org/", 16_000, 0, HASH),
            id="hash-allowed-at-offset-zero",
        ),
        pytest.param(
            {"url": "https://e.org/", "offset": 5},
            FetchArgs("https://e.org/", 16_000, 5, None),
            id="continuation-no-hash",
        ),
        pytest.param(
            {"url": "https://e.org/", "format": "html", "links": "none"},
            FetchArgs("https://e.org/", format="html", links="none"),
            id="format-and-links",
        ),
        pytest.param(
            {"url": "https://e.org/", "format": "text", "links": "references"},
            FetchArgs("https://e.org/", format="text", links="references"),
            id="text-with-references",
        ),
    ],
)
def test_valid_arguments_are_parsed(payload: dict[str, Any], expected: FetchArgs) -> None:
    assert parse_fetch_args(payload) == expected


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param([], "JSON object", id="not-an-object"),
        pytest.param("https://e.org/", "JSON object", id="bare-string"),
        pytest.param({}, "url is required", id="missing-url"),
        pytest.param({"url": ""}, "url is required", id="empty-url"),
        pytest.param({"url": 42}, "url is required", id="url-not-a-string"),
        pytest.param({"url": "https://e.org/", "bogus": 1}, "unknown field 'bogus'", id="unknown-field"),
        pytest.param({"url": "https://e.org/", "max_chars": 1000}, "unknown field 'max_chars'", id="snake-case-field"),
        pytest.param({"url": "https://e.org/", "maxChars": 99}, "between 100 and 32000", id="max-chars-too-small"),
        pytest.param({"url": "https://e.org/", "maxChars": 32_001}, "between 100 and 32000", id="max-chars-too-big"),
        pytest.param({"url": "https://e.org/", "maxChars": "2000"}, "must be an integer", id="max-chars-string"),
        pytest.param({"url": "https://e.org/", "maxChars": 2000.0}, "must be an integer", id="max-chars-float"),
        pytest.param({"url": "https://e.org/", "maxChars": True}, "must be an integer", id="max-chars-bool"),
        pytest.param({"url": "https://e.org/", "offset": -1}, "between 0", id="negative-offset"),
        pytest.param({"url": "https://e.org/", "format": "pdf"}, "format must be one of", id="unknown-format"),
        pytest.param({"url": "https://e.org/", "format": ["html"]}, "format must be one of", id="format-not-a-string"),
        pytest.param({"url": "https://e.org/", "links": "footnotes"}, "links must be one of", id="unknown-links"),
        pytest.param({"url": "https://e.org/", "links": None}, "links must be one of", id="links-null"),
        pytest.param({"url": "https://e.org/", "offset": 10, "expectedHash": "abc"}, "64-hex-digit", id="short-hash"),
        pytest.param(
            {"url": "https://e.org/", "offset": 10, "expectedHash": 7}, "64-hex-digit", id="hash-not-a-string"
        ),
        pytest.param(
            {"url": "https://e.org/", "offset": 10, "expectedHash": "z" * 64}, "64-hex-digit", id="hash-not-hex"
        ),
    ],
)
def test_invalid_arguments_are_invalid_input(payload: object, message: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_fetch_args(payload)
    assert caught.value.code == ErrorCode.INVALID_INPUT
    assert message in caught.value.message


@pytest.mark.parametrize(
    ("text", "budget", "expected_chars"),
    [
        pytest.param("abc" * 100, 10_000, 300, id="fits-whole"),
        pytest.param("東" * 1_000, 302, 100, id="cjk-three-bytes-each"),
        pytest.param('"' * 100, 42, 20, id="escapes-count"),
    ],
)
def test_fit_window_keeps_the_json_under_budget(text: str, budget: int, expected_chars: int) -> None:
    window = fit_window(text, 0, 1_000, budget)
    assert len(window) == expected_chars
    assert len(orjson.dumps(window)) <= budget


def test_fit_window_starts_at_offset() -> None:
    assert fit_window("0123456789", 4, 3, 1_000) == "456"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param(
            "https://r.example/read?u={url}", "https://r.example/read?u=https%3A%2F%2Fe.org%2Fa%3Fb%3D1", id="template"
        ),
        pytest.param("https://r.example/", "https://r.example/https://e.org/a?b=1", id="appended-to-path"),
    ],
)
def test_reader_service_url(template: str, expected: str) -> None:
    assert ReaderService(template, None).request_url("https://e.org/a?b=1") == expected
