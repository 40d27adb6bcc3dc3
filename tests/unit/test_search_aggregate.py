"""The aggregator's walk: fallback order, key skipping, retries, site, cache and the errors.

Driven through the Transport seam by a small in-process transport that answers prepared replies
per host; no socket is opened (the end-to-end tests over real sockets live in tests/integration).
"""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.search.aggregate import cache_key
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.registry import engines_from_settings
from tests.harness.search_engines import (
    BING,
    BRAVE,
    DDG,
    FREE,
    QUERY,
    Answer,
    MemoryCache,
    ScriptedTransport,
    Sleeps,
    aggregator,
    page,
    status_only,
)


async def test_first_engine_with_results_answers() -> None:
    transport = ScriptedTransport({DDG: [page("duckduckgo_results.html")]})
    result = await aggregator(FREE, transport).search(QUERY)
    assert result.provider == "duckduckgo"
    assert transport.hosts == [DDG]
    assert [a.to_json()["outcome"] for a in result.attempts] == ["ok"]


@pytest.mark.parametrize(
    ("ddg_reply", "ddg_outcome"),
    [
        pytest.param(page("duckduckgo_challenge.html", 202), "rate_limited", id="ddg-challenge"),
        pytest.param(page("unknown_page.html"), "unavailable", id="ddg-unknown-shape"),
        pytest.param(page("duckduckgo_no_results.html"), "no_results", id="ddg-no-results-not-last"),
        pytest.param(status_only(403), "upstream_status", id="ddg-403"),
        pytest.param(GatewayError(ErrorCode.TIMEOUT, "deadline"), "timeout", id="ddg-timeout"),
    ],
)
async def test_a_failed_engine_hands_over_to_the_next(ddg_reply: Answer, ddg_outcome: str) -> None:
    transport = ScriptedTransport({DDG: [ddg_reply], BING: [page("bing_results.html")]})
    result = await aggregator(FREE, transport).search(QUERY)
    assert result.provider == "bing"
    assert [(a.engine, a.outcome) for a in result.attempts] == [
        ("duckduckgo", ddg_outcome),
        ("bing", "ok"),
    ]


async def test_keyed_engines_without_key_are_skipped_without_a_request() -> None:
    engines = engines_from_settings(keys={"exa": "exa-secret"})
    transport = ScriptedTransport({"api.exa.ai": [page("exa_results.json")]})
    result = await aggregator(engines, transport).search(QUERY)
    assert result.provider == "exa"
    assert transport.hosts == ["api.exa.ai"]
    assert [(a.engine, a.tier, a.outcome) for a in result.attempts] == [
        ("tavily", "keyed", "skipped"),
        ("exa", "keyed", "ok"),
    ]


async def test_retry_honours_retry_after_seconds_then_succeeds() -> None:
    sleeps = Sleeps()
    transport = ScriptedTransport(
        {DDG: [status_only(429, retry_after="3"), status_only(503), page("duckduckgo_results.html")]}
    )
    result = await aggregator(FREE, transport, sleeps=sleeps).search(QUERY)
    assert result.provider == "duckduckgo"
    assert sleeps.delays == [3.0, 2.0]
    assert transport.hosts == [DDG, DDG, DDG]


async def test_retry_after_as_http_date() -> None:
    sleeps = Sleeps()
    when = "Fri, 15 May 2026 20:27:00 GMT"  # NOW_S is 2026-05-28; a past date means now
    transport = ScriptedTransport({DDG: [status_only(502, retry_after=when), page("duckduckgo_results.html")]})
    await aggregator(FREE, transport, sleeps=sleeps).search(QUERY)
    assert sleeps.delays == [0.0]


async def test_at_most_two_retries_per_engine() -> None:
    sleeps = Sleeps()
    transport = ScriptedTransport({DDG: [status_only(429, retry_after="1")] * 3, BING: [page("bing_results.html")]})
    result = await aggregator(FREE, transport, sleeps=sleeps).search(QUERY)
    assert transport.hosts == [DDG, DDG, DDG, BING]
    assert sleeps.delays == [1.0, 1.0]
    assert result.attempts[0].outcome == "rate_limited"


async def test_retry_after_beyond_sixty_seconds_fails_the_attempt_at_once() -> None:
    sleeps = Sleeps()
    transport = ScriptedTransport({DDG: [status_only(429, retry_after="120")], BING: [page("bing_results.html")]})
    result = await aggregator(FREE, transport, sleeps=sleeps).search(QUERY)
    assert sleeps.delays == []
    assert [(a.engine, a.outcome) for a in result.attempts] == [
        ("duckduckgo", "rate_limited"),
        ("bing", "ok"),
    ]


async def test_site_is_enforced_on_returned_hosts() -> None:
    # DuckDuckGo ignored the site operator: none of its rows is on the site, so Bing answers.
    transport = ScriptedTransport({DDG: [page("duckduckgo_results.html")], BING: [page("bing_results.html")]})
    result = await aggregator(FREE, transport).search(SearchQuery("asyncio", site="python.org"))
    assert result.provider == "bing"
    assert [h.url for h in result.results] == ["https://docs.python.org/3/library/asyncio.html"]
    assert result.attempts[0].outcome == "no_results"


async def test_results_are_deduped_and_capped() -> None:
    transport = ScriptedTransport({DDG: [page("duckduckgo_results.html")]})
    result = await aggregator(FREE, transport).search(SearchQuery("rust", max_results=1))
    assert len(result.results) == 1
    assert result.truncated is True


async def test_cache_hit_from_a_free_engine_is_used_before_paid_engines() -> None:
    engines = engines_from_settings(keys={"tavily": "tvly-secret"})
    cache = MemoryCache()
    first = ScriptedTransport({"api.tavily.com": [status_only(432)], DDG: [page("duckduckgo_results.html")]})
    answered = await aggregator(engines, first, cache).search(QUERY)
    assert answered.provider == "duckduckgo"
    second = ScriptedTransport({})
    cached = await aggregator(engines, second, cache).search(QUERY)
    assert second.asked == []
    assert cached.provider == "duckduckgo"
    assert cached.results == answered.results
    assert [a.outcome for a in cached.attempts] == ["cached"]
    assert all("tvly-secret" not in key for key in cache.entries)
    assert [ttl for _, ttl in cache.entries.values()] == [900.0]


def test_cache_routes_differ_by_engine_and_arguments_not_by_spacing() -> None:
    assert cache_key("bing", SearchQuery("a  b")) == cache_key("bing", SearchQuery("A b"))
    assert cache_key("bing", QUERY) != cache_key("brave", QUERY)
    assert cache_key("bing", QUERY) != cache_key("bing", SearchQuery(QUERY.query, site="python.org"))


async def test_no_results_is_an_answer_when_every_engine_agrees() -> None:
    transport = ScriptedTransport(
        {
            DDG: [page("duckduckgo_no_results.html")],
            BING: [page("bing_no_results.html")],
            BRAVE: [page("brave_no_results.html")],
        }
    )
    result = await aggregator(FREE, transport).search(QUERY)
    assert result.results == ()
    assert [a.outcome for a in result.attempts] == ["no_results"] * 3


async def test_every_engine_failing_raises_the_last_meaningful_code_with_attempts() -> None:
    engines = engines_from_settings(["tavily", "duckduckgo", "bing", "brave"], keys={"tavily": "tvly-secret"})
    transport = ScriptedTransport(
        {
            "api.tavily.com": [status_only(401)],
            DDG: [page("duckduckgo_challenge.html", 202)],
            BING: [page("bing_no_results.html")],
            BRAVE: [page("brave_captcha.html")],
        }
    )
    with pytest.raises(GatewayError) as caught:
        await aggregator(engines, transport).search(QUERY)
    error = caught.value
    assert error.code is ErrorCode.RATE_LIMITED
    assert [a["outcome"] for a in error.extra["attempts"]] == [
        "upstream_status",
        "rate_limited",
        "no_results",
        "rate_limited",
    ]
    assert "tvly-secret" not in orjson.dumps(error.to_body()).decode()
    assert "tvly-secret" not in error.message


async def test_transport_error_code_is_the_final_code_when_it_is_last() -> None:
    engines = engines_from_settings(["duckduckgo", "bing"])
    transport = ScriptedTransport(
        {DDG: [page("unknown_page.html")], BING: [GatewayError(ErrorCode.DNS_FAILURE, "NXDOMAIN")]}
    )
    with pytest.raises(GatewayError) as caught:
        await aggregator(engines, transport).search(QUERY)
    assert caught.value.code is ErrorCode.DNS_FAILURE
    assert "duckduckgo unavailable" in caught.value.message


async def test_no_engine_enabled_is_invalid_input_and_nothing_is_contacted() -> None:
    engines = engines_from_settings(["tavily", "exa", "brave_api"])
    transport = ScriptedTransport({})
    with pytest.raises(GatewayError) as caught:
        await aggregator(engines, transport).search(QUERY)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    for setting in ("EGRESS_SEARCH_ENGINES", "EGRESS_SEARCH_<ENGINE>_KEY", "EGRESS_SEARCH_URL"):
        assert setting in caught.value.message
    assert transport.asked == []


# --- construction from settings ---------------------------------------------------------------


def test_default_order_and_tiers() -> None:
    engines = engines_from_settings()
    assert [(e.name, e.tier, e.enabled) for e in engines] == [
        ("tavily", "keyed", False),
        ("exa", "keyed", False),
        ("brave_api", "keyed", False),
        ("duckduckgo", "free", True),
        ("bing", "free", True),
        ("brave", "free", True),
    ]


def test_configured_engines_are_added_and_urls_overridden() -> None:
    engines = engines_from_settings(
        ["bing"],
        base_urls={"bing": "https://bing.mirror.example.net/search"},
        template_url="https://s.example.com/?q={query}",
        template_key="tpl-secret",
        searxng_url="https://searx.example.org",
        mediawiki_url="https://de.wikipedia.org/w/api.php",
    )
    assert [(e.name, e.base_url) for e in engines] == [
        ("bing", "https://bing.mirror.example.net/search"),
        ("template", "https://s.example.com/?q={query}"),
        ("searxng", "https://searx.example.org"),
        ("mediawiki", "https://de.wikipedia.org/w/api.php"),
    ]
    assert "tpl-secret" not in repr(engines)


@pytest.mark.parametrize(
    ("order", "setting"),
    [
        pytest.param(["google"], "EGRESS_SEARCH_ENGINES", id="unknown-engine"),
        pytest.param(["searxng"], "EGRESS_SEARCH_SEARXNG_URL", id="searxng-without-url"),
        pytest.param(["template"], "EGRESS_SEARCH_URL", id="template-without-url"),
    ],
)
def test_bad_engine_settings_are_invalid_input(order: list[str], setting: str) -> None:
    with pytest.raises(GatewayError) as caught:
        engines_from_settings(order)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert caught.value.message.startswith(setting)
