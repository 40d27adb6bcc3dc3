"""web_search argument validation: accepted forms and each refusal naming its field."""

from __future__ import annotations

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.search.query import SearchQuery, parse_search_args


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param({"query": "  rust  "}, SearchQuery("rust"), id="trimmed-defaults"),
        pytest.param(
            {"query": "q", "maxResults": 20, "site": "Docs.RS", "timeRange": "m", "region": "us-en"},
            SearchQuery("q", 20, "docs.rs", "m", "us-en"),
            id="every-field",
        ),
        pytest.param({"query": "q", "maxResults": 1}, SearchQuery("q", 1), id="one-result"),
        pytest.param({"query": "q", "region": "wt-wt"}, SearchQuery("q", region="wt-wt"), id="all-regions"),
        pytest.param({"query": "q", "site": "bücher.de"}, SearchQuery("q", site="xn--bcher-kva.de"), id="idn-site"),
        pytest.param({"query": "x" * 1000}, SearchQuery("x" * 1000), id="thousand-chars"),
        pytest.param({"query": "q", "site": None}, SearchQuery("q"), id="null-site"),
    ],
)
def test_valid_arguments_are_accepted(payload: dict[str, object], expected: SearchQuery) -> None:
    assert parse_search_args(payload) == expected


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        pytest.param({}, "query", id="missing-query"),
        pytest.param({"query": "   "}, "query", id="blank-query"),
        pytest.param({"query": 5}, "query", id="number-query"),
        pytest.param({"query": "x" * 1001}, "query", id="long-query"),
        pytest.param({"query": "a\x00b"}, "query", id="nul-in-query"),
        pytest.param({"query": "a\nb"}, "query", id="newline-in-query"),
        pytest.param({"query": "a\u202eb"}, "query", id="bidi-override-in-query"),
        pytest.param({"query": "a\u200bb"}, "query", id="zero-width-space-in-query"),
        pytest.param({"query": "q", "maxResults": 0}, "maxResults", id="zero-results"),
        pytest.param({"query": "q", "maxResults": 21}, "maxResults", id="too-many-results"),
        pytest.param({"query": "q", "maxResults": "5"}, "maxResults", id="string-count"),
        pytest.param({"query": "q", "maxResults": True}, "maxResults", id="bool-count"),
        pytest.param({"query": "q", "maxResults": 5.0}, "maxResults", id="float-count"),
        pytest.param({"query": "q", "site": "https://docs.rs"}, "site", id="site-with-scheme"),
        pytest.param({"query": "q", "site": "docs.rs/std"}, "site", id="site-with-path"),
        pytest.param({"query": "q", "site": "docs.rs:443"}, "site", id="site-with-port"),
        pytest.param({"query": "q", "site": "*.docs.rs"}, "site", id="site-wildcard"),
        pytest.param({"query": "q", "site": "127.0.0.1"}, "site", id="site-ipv4"),
        pytest.param({"query": "q", "site": "0x7f.1"}, "site", id="site-hex-ip"),
        pytest.param({"query": "q", "site": "[::1]"}, "site", id="site-ipv6"),
        pytest.param({"query": "q", "site": "localhost"}, "site", id="site-localhost"),
        pytest.param({"query": "q", "site": "intranet"}, "site", id="site-single-label"),
        pytest.param({"query": "q", "site": "db.internal"}, "site", id="site-internal"),
        pytest.param({"query": "q", "site": "user@docs.rs"}, "site", id="site-userinfo"),
        pytest.param({"query": "q", "site": "-bad-.com"}, "site", id="site-bad-label"),
        pytest.param({"query": "q", "timeRange": "h"}, "timeRange", id="hour-range"),
        pytest.param({"query": "q", "timeRange": "week"}, "timeRange", id="word-range"),
        pytest.param({"query": "q", "region": "usa"}, "region", id="bad-region"),
        pytest.param({"query": "q", "region": "us_en"}, "region", id="underscore-region"),
        pytest.param({"query": "q", "max_results": 5}, "max_results", id="unknown-snake-case"),
        pytest.param({"query": "q", "engine": "bing"}, "engine", id="unknown-field"),
    ],
)
def test_invalid_arguments_are_refused_naming_the_field(payload: dict[str, object], field: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_search_args(payload)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert caught.value.message.startswith(f"{field}:")
    assert caught.value.extra["field"] == field
