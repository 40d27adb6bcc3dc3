"""Parser tests: every engine on small fixtures shaped like the real pages (tests/fixtures/serp)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from gateway.tools.search import (
    bing,
    brave,
    brave_api,
    duckduckgo,
    exa,
    mediawiki,
    searxng,
    tavily,
    template,
)
from gateway.tools.search.engine import EngineOutcome, EngineSpec
from gateway.tools.search.normalise import normalise_rows
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import make_reply

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "serp"
TODAY = dt.date(2026, 3, 1)


def _type_of(name: str) -> str:
    return "application/json" if name.endswith(".json") else "text/html; charset=utf-8"


def outcome_of(spec: EngineSpec, name: str, status: int = 200, url: str = "") -> EngineOutcome:
    body = (FIXTURES / name).read_bytes()
    reply = make_reply(status, {"Content-Type": _type_of(name)}, body, url or spec.default_url)
    return spec.parse(reply)


def urls_of(outcome: EngineOutcome) -> list[str]:
    return [hit.url for hit in normalise_rows(outcome.rows, max_results=20, site=None).hits]


SHAPES = [
    pytest.param(duckduckgo.ENGINE, "duckduckgo_results.html", 200, "results", id="ddg-results"),
    pytest.param(duckduckgo.ENGINE, "duckduckgo_no_results.html", 200, "no_results", id="ddg-end-block-is-no-results"),
    pytest.param(duckduckgo.ENGINE, "duckduckgo_challenge.html", 202, "challenge", id="ddg-202-anomaly-page"),
    pytest.param(duckduckgo.ENGINE, "duckduckgo_challenge.html", 200, "challenge", id="ddg-anomaly-page-even-at-200"),
    pytest.param(duckduckgo.ENGINE, "unknown_page.html", 200, "unrecognised", id="ddg-unknown-page"),
    pytest.param(bing.ENGINE, "bing_results.html", 200, "results", id="bing-results"),
    pytest.param(bing.ENGINE, "bing_no_results.html", 200, "no_results", id="bing-b_no"),
    pytest.param(bing.ENGINE, "bing_captcha.html", 200, "challenge", id="bing-200-one-last-step"),
    pytest.param(bing.ENGINE, "unknown_page.html", 200, "unrecognised", id="bing-unknown-page"),
    pytest.param(brave.ENGINE, "brave_results.html", 200, "results", id="brave-results"),
    pytest.param(brave.ENGINE, "brave_no_results.html", 200, "no_results", id="brave-no-matches"),
    pytest.param(brave.ENGINE, "brave_captcha.html", 200, "challenge", id="brave-solve-the-captcha"),
    pytest.param(brave.ENGINE, "brave_captcha.html", 429, "challenge", id="brave-captcha-429"),
    pytest.param(brave.ENGINE, "unknown_page.html", 200, "unrecognised", id="brave-unknown-page"),
    pytest.param(tavily.ENGINE, "tavily_results.json", 200, "results", id="tavily-results"),
    pytest.param(tavily.ENGINE, "unknown_page.html", 200, "unrecognised", id="tavily-html-answer"),
    pytest.param(tavily.ENGINE, "tavily_results.json", 401, "refused", id="tavily-401-key-refused"),
    pytest.param(exa.ENGINE, "exa_results.json", 200, "results", id="exa-results"),
    pytest.param(exa.ENGINE, "template_nested.json", 200, "unrecognised", id="exa-other-json"),
    pytest.param(brave_api.ENGINE, "brave_api_results.json", 200, "results", id="brave-api-results"),
    pytest.param(brave_api.ENGINE, "brave_api_no_results.json", 200, "no_results", id="brave-api-no-web-section"),
    pytest.param(brave_api.ENGINE, "brave_api_error.json", 429, "challenge", id="brave-api-429"),
    pytest.param(brave_api.ENGINE, "template_nested.json", 200, "unrecognised", id="brave-api-other-json"),
    pytest.param(searxng.ENGINE, "searxng_results.json", 200, "results", id="searxng-results"),
    pytest.param(searxng.ENGINE, "unknown_page.html", 403, "refused", id="searxng-json-disabled-403"),
    pytest.param(mediawiki.ENGINE, "mediawiki_results.json", 200, "results", id="mediawiki-results"),
    pytest.param(mediawiki.ENGINE, "mediawiki_no_results.json", 200, "no_results", id="mediawiki-empty"),
    pytest.param(mediawiki.ENGINE, "unknown_page.html", 200, "unrecognised", id="mediawiki-html"),
    pytest.param(template.ENGINE, "template_nested.json", 200, "results", id="template-json"),
    pytest.param(template.ENGINE, "duckduckgo_results.html", 200, "results", id="template-html-like-ddg"),
    pytest.param(template.ENGINE, "brave_api_error.json", 200, "unrecognised", id="template-json-no-array"),
]


@pytest.mark.parametrize(("spec", "fixture", "status", "kind"), SHAPES)
def test_parser_tells_page_shapes_apart(spec: EngineSpec, fixture: str, status: int, kind: str) -> None:
    assert outcome_of(spec, fixture, status).kind == kind


EXPECTED_URLS = [
    pytest.param(
        duckduckgo.ENGINE,
        "duckduckgo_results.html",
        ["https://rust-lang.github.io/async-book/#intro", "https://tokio.rs/tokio/tutorial"],
        id="ddg-ad-dropped-uddg-decoded-duplicate-removed",
    ),
    pytest.param(
        bing.ENGINE,
        "bing_results.html",
        ["https://docs.python.org/3/library/asyncio.html", "https://realpython.com/async-io-python/"],
        id="bing-ck-a-decoded-ad-and-vertical-dropped",
    ),
    pytest.param(
        brave.ENGINE,
        "brave_results.html",
        ["https://www.sqlite.org/wal.html", "https://fly.io/blog/sqlite-internals-wal/"],
        id="brave-both-layouts-no-sitelinks-no-videos",
    ),
    pytest.param(
        tavily.ENGINE,
        "tavily_results.json",
        ["https://ai.pydantic.dev/", "https://github.com/pydantic/pydantic-ai"],
        id="tavily-private-address-dropped",
    ),
    pytest.param(
        exa.ENGINE,
        "exa_results.json",
        ["https://arxiv.org/abs/2307.06435", "https://example.org/llm-survey"],
        id="exa",
    ),
    pytest.param(
        brave_api.ENGINE,
        "brave_api_results.json",
        ["https://search.brave.com/", "https://brave.com/search/api/"],
        id="brave-api",
    ),
    pytest.param(
        searxng.ENGINE,
        "searxng_results.json",
        ["https://www.sqlite.org/index.html"],
        id="searxng-ftp-dropped",
    ),
    pytest.param(
        mediawiki.ENGINE,
        "mediawiki_results.json",
        ["https://en.wikipedia.org/wiki/Ada_Lovelace", "https://en.wikipedia.org/wiki/Analytical_Engine"],
        id="mediawiki-article-urls-redirect-skipped",
    ),
    pytest.param(
        template.ENGINE,
        "template_nested.json",
        ["https://nested.example.net/page"],
        id="template-first-array-naming-an-address",
    ),
]


@pytest.mark.parametrize(("spec", "fixture", "urls"), EXPECTED_URLS)
def test_parser_and_normalisation_yield_the_organic_links(spec: EngineSpec, fixture: str, urls: list[str]) -> None:
    outcome = outcome_of(spec, fixture, url="https://en.wikipedia.org/w/api.php")
    assert urls_of(outcome) == urls


def test_ddg_ad_row_is_marked_sponsored() -> None:
    outcome = outcome_of(duckduckgo.ENGINE, "duckduckgo_results.html")
    assert [row.sponsored for row in outcome.rows] == [True, False, False, False]


def test_snippets_are_plain_text() -> None:
    outcome = outcome_of(duckduckgo.ENGINE, "duckduckgo_results.html")
    hits = normalise_rows(outcome.rows, max_results=5, site=None).hits
    assert hits[0].title == "Asynchronous Programming in Rust"
    assert hits[0].snippet == "Getting started with async & await in Rust."


def test_brave_snippet_loses_its_age_prefix() -> None:
    outcome = outcome_of(brave.ENGINE, "brave_results.html")
    assert outcome.rows[1].snippet == "How the WAL works & why."


def test_mediawiki_snippet_highlights_become_text() -> None:
    outcome = outcome_of(mediawiki.ENGINE, "mediawiki_results.json")
    hit = normalise_rows(outcome.rows, max_results=5, site=None).hits[0]
    assert hit.snippet == "Ada King, Countess of Lovelace & mathematician"


@pytest.mark.parametrize(
    ("body", "content_type", "urls"),
    [
        pytest.param(
            b"Rust book - https://doc.rust-lang.org/book/ the official book\n",
            "text/plain",
            ["https://doc.rust-lang.org/book/"],
            id="text-with-links-one-row-per-line",
        ),
        pytest.param(
            b"The answer is 42.",
            "text/plain",
            ["https://answers.example.com/q"],
            id="text-without-links-is-one-result",
        ),
        pytest.param(
            b'[{"href": "https://a.example.com/", "title": "A", "snippet": "s"}]',
            "application/json",
            ["https://a.example.com/"],
            id="top-level-json-array",
        ),
    ],
)
def test_template_reads_any_shape(body: bytes, content_type: str, urls: list[str]) -> None:
    reply = make_reply(200, {"content-type": content_type}, body, "https://answers.example.com/q")
    assert urls_of(template.parse(reply)) == urls


# --- request builders -----------------------------------------------------------------------

FULL_QUERY = SearchQuery("rust async", max_results=5, site="docs.rs", time_range="w", region="us-en")


def _params(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_ddg_request_is_a_form_post_with_a_text_browser_agent() -> None:
    request = duckduckgo.build_request(FULL_QUERY, None, duckduckgo.DEFAULT_URL, today=TODAY)
    assert request.method == "POST"
    assert request.url == "https://html.duckduckgo.com/html/"
    assert (request.header("user-agent") or "").startswith("Lynx/")
    form = parse_qs((request.body or b"").decode(), keep_blank_values=True)
    assert form == {"q": ["rust async site:docs.rs"], "b": [""], "kl": ["us-en"], "df": ["w"]}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            bing.ENGINE,
            {"q": ["rust async site:docs.rs"], "mkt": ["en-US"], "filters": ['ex1:"ez2"']},
            id="bing",
        ),
        pytest.param(
            brave.ENGINE,
            {"q": ["rust async site:docs.rs"], "source": ["web"], "tf": ["pw"]},
            id="brave",
        ),
        pytest.param(
            brave_api.ENGINE,
            {
                "q": ["rust async site:docs.rs"],
                "count": ["5"],
                "text_decorations": ["false"],
                "result_filter": ["web"],
                "freshness": ["pw"],
                "country": ["US"],
                "search_lang": ["en"],
            },
            id="brave-api",
        ),
    ],
)
def test_get_engines_put_arguments_in_their_own_parameters(spec: EngineSpec, expected: dict[str, list[str]]) -> None:
    request = spec.build_request(FULL_QUERY, "k", spec.default_url, today=TODAY)
    assert request.method == "GET"
    assert request.url.startswith(spec.default_url + "?")
    assert _params(request.url) == expected


def test_bing_year_filter_is_an_absolute_day_range() -> None:
    query = SearchQuery("x", time_range="y")
    request = bing.build_request(query, None, bing.DEFAULT_URL, today=TODAY)
    day = (TODAY - dt.date(1970, 1, 1)).days
    assert _params(request.url)["filters"] == [f'ex1:"ez5_{day - 365}_{day}"']


def test_tavily_body_and_bearer_key() -> None:
    request = tavily.build_request(FULL_QUERY, "tvly-secret", tavily.DEFAULT_URL, today=TODAY)
    assert request.header("authorization") == "Bearer tvly-secret"
    body = orjson.loads(request.body or b"")
    assert body["include_domains"] == ["docs.rs"]
    assert body["time_range"] == "week"
    assert body["max_results"] == 5
    assert "tvly-secret" not in request.url


def test_exa_body_and_api_key_header() -> None:
    request = exa.build_request(FULL_QUERY, "exa-secret", exa.DEFAULT_URL, today=TODAY)
    assert request.header("x-api-key") == "exa-secret"
    body = orjson.loads(request.body or b"")
    assert body["includeDomains"] == ["docs.rs"]
    assert body["numResults"] == 5
    assert body["startPublishedDate"] == "2026-02-22T00:00:00.000Z"


def test_brave_api_key_is_a_header_not_a_parameter() -> None:
    request = brave_api.build_request(FULL_QUERY, "bsa-secret", brave_api.DEFAULT_URL, today=TODAY)
    assert request.header("x-subscription-token") == "bsa-secret"
    assert "bsa-secret" not in request.url


@pytest.mark.parametrize(
    ("setting", "endpoint"),
    [
        pytest.param("https://searx.example.org", "https://searx.example.org/search", id="instance"),
        pytest.param("https://searx.example.org/search", "https://searx.example.org/search", id="endpoint"),
    ],
)
def test_searxng_asks_for_json(setting: str, endpoint: str) -> None:
    request = searxng.build_request(FULL_QUERY, None, setting, today=TODAY)
    assert request.url.split("?")[0] == endpoint
    params = _params(request.url)
    assert params["format"] == ["json"]
    assert params["time_range"] == ["week"]


def test_mediawiki_uses_list_search() -> None:
    request = mediawiki.build_request(FULL_QUERY, None, mediawiki.DEFAULT_URL, today=TODAY)
    params = _params(request.url)
    assert params["list"] == ["search"]
    assert params["srsearch"] == ["rust async"]


@pytest.mark.parametrize(
    ("template_url", "expected"),
    [
        pytest.param(
            "https://s.example.com/api?query={query}&n={limit}",
            "https://s.example.com/api?query=rust%20async%20site%3Adocs.rs&n=5",
            id="placeholders",
        ),
        pytest.param(
            "https://s.example.com/api?n={limit}",
            "https://s.example.com/api?n=5&q=rust%20async%20site%3Adocs.rs",
            id="no-query-placeholder-adds-q",
        ),
    ],
)
def test_template_fills_its_url(template_url: str, expected: str) -> None:
    request = template.build_request(FULL_QUERY, "tok", template_url, today=TODAY)
    assert request.url == expected
    assert request.header("authorization") == "Bearer tok"
