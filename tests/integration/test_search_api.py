"""web_search end to end: a real gateway process asks engines at their real hostnames.

One loopback origin answers for every engine hostname (html.duckduckgo.com, www.bing.com,
search.brave.com, api.tavily.com, api.exa.ai, api.search.brave.com and the configured engines),
routed there by the fake DNS and trusted through the test CA. The policy's `allow_cidrs` names
only that origin's /32, and `EGRESS_SEARCH_<ENGINE>_URL` keeps each real hostname while pointing
at the origin's random port. The origin is scripted per hostname and records every request, so
tests assert on what reached an engine as well as on what the agent got back.

Gateways are module-scoped and shared: each test uses its own query text, so the search cache
(on, as in production) never answers one test with another's results.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, Origin, OriginFactory

REPO_ROOT = Path(__file__).resolve().parents[2]
SERP_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "serp"
API_TIMEOUT_S = 30.0

DDG = "html.duckduckgo.com"
BING = "www.bing.com"
BRAVE = "search.brave.com"
TAVILY = "api.tavily.com"
EXA = "api.exa.ai"
BRAVE_API = "api.search.brave.com"
TEMPLATE = "search.example.net"
SEARXNG = "searx.example.org"
MEDIAWIKI = "en.wikipedia.org"
ENGINE_HOSTS = (DDG, BING, BRAVE, TAVILY, EXA, BRAVE_API, TEMPLATE, SEARXNG, MEDIAWIKI)
KEYED_HOSTS = (TAVILY, EXA, BRAVE_API)
DEFAULT_ORDER = "tavily,exa,brave_api,duckduckgo,bing,brave"

READER_TOKEN = "reader-token-0123456789abcdef"
HASTY_TOKEN = "hasty-token-0123456789abcdef"
TAVILY_KEY = "tvly-SECRET-tavily-key-7f3a"
EXA_KEY = "exa-SECRET-key-19c2"
BRAVE_API_KEY = "BSA-SECRET-brave-key-55d0"
TEMPLATE_KEY = "tmpl-SECRET-key-a1b2"


def fixture_text(name: str) -> str:
    return (SERP_FIXTURES / name).read_text()


# --- the scripted engine origin -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer from an engine hostname."""

    body: str = ""
    status: int = 200
    content_type: str = "text/html"
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SeenRequest:
    host: str
    method: str
    path: str
    params: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    @property
    def form(self) -> dict[str, list[str]]:
        return parse_qs(self.body.decode())


def page(name: str, status: int = 200) -> Reply:
    return Reply(fixture_text(name), status)


def json_page(name: str) -> Reply:
    return Reply(fixture_text(name), content_type="application/json")


UNSCRIPTED = Reply("no script for this host", status=500, content_type="text/plain")


class EngineOrigin:
    """Answers every engine hostname from a per-host script (the last reply repeats) and logs requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Reply]] = {}
        self._seen: list[SeenRequest] = []

    def script(self, host: str, *replies: Reply) -> None:
        with self._lock:
            self._scripts[host] = list(replies)

    def reset(self) -> None:
        with self._lock:
            self._scripts.clear()
            self._seen.clear()

    def requests_to(self, host: str) -> list[SeenRequest]:
        with self._lock:
            return [seen for seen in self._seen if seen.host == host]

    def all_requests(self) -> list[SeenRequest]:
        with self._lock:
            return list(self._seen)

    def _next_reply(self, host: str) -> Reply:
        with self._lock:
            script = self._scripts.get(host)
            if not script:
                return UNSCRIPTED
            return script.pop(0) if len(script) > 1 else script[0]

    async def handle(self, request: web.Request) -> web.Response:
        host = request.host.rsplit(":", 1)[0].lower()
        body = await request.read()
        with self._lock:
            self._seen.append(
                SeenRequest(
                    host=host,
                    method=request.method,
                    path=request.path,
                    params={key: request.query.getall(key) for key in request.query},
                    headers=dict(request.headers),
                    body=body,
                )
            )
        reply = self._next_reply(host)
        return web.Response(
            text=reply.body, status=reply.status, content_type=reply.content_type, headers=dict(reply.headers)
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@dataclass(frozen=True, slots=True)
class EngineSite:
    origin: Origin
    engines: EngineOrigin

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.origin.port}{path}"

    def engine_urls(self) -> dict[str, str]:
        """Every engine retargeted to the origin's port, keeping its real hostname."""
        return {
            "EGRESS_SEARCH_DUCKDUCKGO_URL": self.url(DDG, "/html/"),
            "EGRESS_SEARCH_BING_URL": self.url(BING, "/search"),
            "EGRESS_SEARCH_BRAVE_URL": self.url(BRAVE, "/search"),
            "EGRESS_SEARCH_TAVILY_URL": self.url(TAVILY, "/search"),
            "EGRESS_SEARCH_EXA_URL": self.url(EXA, "/search"),
            "EGRESS_SEARCH_BRAVE_API_URL": self.url(BRAVE_API, "/res/v1/web/search"),
        }


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def search_policy(origin: Origin, **sections: Any) -> dict[str, Any]:
    """Default principal may search freely; `reader` may not search; `hasty` has a 60 s cooldown."""

    def budget(min_interval_s: float) -> dict[str, Any]:
        return {"search": {"per_step": 1000, "per_run": 1000, "concurrent": 8, "min_interval_s": min_interval_s}}

    egress = {"allow_domains": ["*"]}
    principals = {
        "default": {"egress": egress, "tools": {"search": True, "fetch": False}, "budgets": budget(0)},
        "reader": {
            "token_sha256": token_hash(READER_TOKEN),
            "egress": egress,
            "tools": {"search": False, "fetch": True},
        },
        "hasty": {
            "token_sha256": token_hash(HASTY_TOKEN),
            "egress": egress,
            "tools": {"search": True},
            "budgets": budget(60),
        },
    }
    return policy_document(allow_cidrs=[origin.cidr], ports=[443, origin.port], principals=principals, **sections)


@pytest.fixture(scope="module")
def engine_site(harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS) -> Iterator[EngineSite]:
    factory = OriginFactory(harness_loop, pki, fake_dns)
    engines = EngineOrigin()
    origin = factory.start(engines.app(), names=ENGINE_HOSTS)
    yield EngineSite(origin, engines)
    factory.stop_all()
    for host in ENGINE_HOSTS:
        fake_dns.remove(host)


@pytest.fixture(autouse=True)
def fresh_scripts(engine_site: EngineSite) -> None:
    engine_site.engines.reset()


def start_gateway(
    tmp_path_factory: pytest.TempPathFactory,
    fake_dns: FakeDNS,
    pki: TestPKI,
    policy: Mapping[str, Any],
    env: Mapping[str, str],
) -> GatewayProcess:
    workdir = tmp_path_factory.mktemp("search-gw")
    return GatewayProcess(workdir, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path, env=env).start()


@pytest.fixture(scope="module")
def free_gateway(
    tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI, engine_site: EngineSite
) -> Iterator[GatewayProcess]:
    """The default engine order with no key set: keyed engines listed but skipped."""
    env = {"EGRESS_SEARCH_ENGINES": DEFAULT_ORDER, **engine_site.engine_urls()}
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, search_policy(engine_site.origin), env)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def keyed_gateway(
    tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI, engine_site: EngineSite
) -> Iterator[GatewayProcess]:
    env = {
        "EGRESS_SEARCH_ENGINES": DEFAULT_ORDER,
        "EGRESS_SEARCH_TAVILY_KEY": TAVILY_KEY,
        "EGRESS_SEARCH_EXA_KEY": EXA_KEY,
        "EGRESS_SEARCH_BRAVE_API_KEY": BRAVE_API_KEY,
        **engine_site.engine_urls(),
    }
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, search_policy(engine_site.origin), env)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def configured_gateway(
    tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI, engine_site: EngineSite
) -> Iterator[GatewayProcess]:
    """Only the configured engines: template, then SearXNG, then MediaWiki; Retry-After capped at 5 s."""
    env = {
        "EGRESS_SEARCH_ENGINES": "template,searxng,mediawiki",
        "EGRESS_SEARCH_URL": engine_site.url(TEMPLATE, "/v2/find?text={query}&size={limit}&lang=en"),
        "EGRESS_SEARCH_KEY": TEMPLATE_KEY,
        "EGRESS_SEARCH_SEARXNG_URL": engine_site.url(SEARXNG, "/"),
        "EGRESS_SEARCH_MEDIAWIKI_URL": engine_site.url(MEDIAWIKI, "/w/api.php"),
    }
    policy = search_policy(engine_site.origin, search={"max_retry_after_s": 5})
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, policy, env)
    yield gateway
    gateway.stop()


def search(gateway: GatewayProcess, payload: Mapping[str, Any], token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{gateway.api_url}/v1/search", json=dict(payload), headers=headers, timeout=API_TIMEOUT_S)


def outcomes(attempts: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(attempt["engine"], attempt["outcome"]) for attempt in attempts]


def search_lines(gateway: GatewayProcess) -> list[dict[str, Any]]:
    return [line for line in gateway.audit_lines() if line.get("kind") == "search"]


MetricSamples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


def metric_samples(gateway: GatewayProcess) -> MetricSamples:
    text = httpx.get(f"{gateway.admin_url}/metrics", timeout=API_TIMEOUT_S).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def attempts_counter(samples: MetricSamples, engine: str, outcome: str) -> float:
    return samples.get(("egress_gateway_search_attempts_total", (("engine", engine), ("outcome", outcome))), 0.0)


SKIPPED_KEYED = [("tavily", "skipped"), ("exa", "skipped"), ("brave_api", "skipped")]


# --- fallback, skipping, keys -----------------------------------------------------------------


def test_challenge_page_from_first_engine_falls_back_to_the_next(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_results.html"))
    response = search(free_gateway, {"query": "python asyncio fallback"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "bing"
    assert outcomes(body["attempts"]) == [*SKIPPED_KEYED, ("duckduckgo", "rate_limited"), ("bing", "ok")]
    assert [a["tier"] for a in body["attempts"]] == ["keyed", "keyed", "keyed", "free", "free"]
    assert body["results"] == [
        {
            "title": "asyncio — Asynchronous I/O — Python 3 documentation",
            "url": "https://docs.python.org/3/library/asyncio.html",
            "snippet": "asyncio is a library to write concurrent code using the async/await syntax »",
        },
        {
            "title": "Async IO in Python: A Complete Walkthrough",
            "url": "https://realpython.com/async-io-python/",
            "snippet": "A hands-on walkthrough.",
        },
    ]
    assert body["query"] == "python asyncio fallback"
    assert "untrusted" in body["notice"]
    assert len(engine_site.engines.requests_to(DDG)) == 1
    assert engine_site.engines.requests_to(BRAVE) == []


def test_keyed_engines_without_a_key_are_skipped_and_never_contacted(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_results.html"))
    response = search(free_gateway, {"query": "rust async skip keyed"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "duckduckgo"
    assert outcomes(body["attempts"]) == [*SKIPPED_KEYED, ("duckduckgo", "ok")]
    assert all(a["ms"] == 0 for a in body["attempts"][:3])
    for host in KEYED_HOSTS:
        assert engine_site.engines.requests_to(host) == [], host
    ddg = engine_site.engines.requests_to(DDG)
    assert len(ddg) == 1
    assert ddg[0].method == "POST"
    assert ddg[0].path == "/html/"
    assert ddg[0].form["q"] == ["rust async skip keyed"]
    assert ddg[0].headers["User-Agent"].startswith("Lynx/")


def test_keyed_engine_with_a_key_answers_first_with_its_key_in_the_bearer_header(
    keyed_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TAVILY, json_page("tavily_results.json"))
    response = search(keyed_gateway, {"query": "pydantic ai keyed first"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "tavily"
    assert outcomes(body["attempts"]) == [("tavily", "ok")]
    assert [r["url"] for r in body["results"]] == [
        "https://ai.pydantic.dev/",
        "https://github.com/pydantic/pydantic-ai",
    ]
    (tavily,) = engine_site.engines.requests_to(TAVILY)
    assert tavily.headers["Authorization"] == f"Bearer {TAVILY_KEY}"
    assert [seen.host for seen in engine_site.engines.all_requests()] == [TAVILY]


def test_refusing_keyed_engines_fall_through_sending_each_key_in_its_own_header(
    keyed_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TAVILY, Reply('{"detail": {"error": "Unauthorized"}}', 401, "application/json"))
    engine_site.engines.script(EXA, Reply('{"error": "forbidden"}', 403, "application/json"))
    engine_site.engines.script(BRAVE_API, json_page("brave_api_results.json"))
    response = search(keyed_gateway, {"query": "brave search keyed fallthrough"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "brave_api"
    assert outcomes(body["attempts"]) == [
        ("tavily", "upstream_status"),
        ("exa", "upstream_status"),
        ("brave_api", "ok"),
    ]
    (exa,) = engine_site.engines.requests_to(EXA)
    assert exa.headers["x-api-key"] == EXA_KEY
    assert "Authorization" not in exa.headers
    (brave_api,) = engine_site.engines.requests_to(BRAVE_API)
    assert brave_api.headers["X-Subscription-Token"] == BRAVE_API_KEY
    assert brave_api.params["q"] == ["brave search keyed fallthrough"]
    assert engine_site.engines.requests_to(DDG) == []


def test_keys_never_appear_in_responses_audit_metrics_or_logs(
    keyed_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TAVILY, Reply("upstream says no", 401, "text/plain"))
    engine_site.engines.script(EXA, Reply("upstream says no", 401, "text/plain"))
    engine_site.engines.script(BRAVE_API, json_page("brave_api_results.json"))
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_captcha.html"))
    engine_site.engines.script(BRAVE, page("brave_captcha.html"))
    answered = search(keyed_gateway, {"query": "keys stay secret answered"})
    assert answered.status_code == 200, answered.text
    engine_site.engines.script(BRAVE_API, Reply("no", 401, "text/plain"))
    failed = search(keyed_gateway, {"query": "keys stay secret failed"})
    assert failed.status_code == 503, failed.text
    metrics_text = httpx.get(f"{keyed_gateway.admin_url}/metrics", timeout=API_TIMEOUT_S).text
    audit_text = keyed_gateway.audit_path.read_text()
    for key in (TAVILY_KEY, EXA_KEY, BRAVE_API_KEY):
        for name, text in (
            ("answer", answered.text),
            ("error", failed.text),
            ("audit", audit_text),
            ("metrics", metrics_text),
            ("stderr", keyed_gateway.stderr()),
        ):
            assert key not in text, f"{key} leaked into the {name}"
            assert "SECRET" not in text, f"part of a key leaked into the {name}"


# --- retries ----------------------------------------------------------------------------------


def test_503_with_retry_after_one_second_is_retried_and_then_answers(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(
        DDG,
        Reply("busy", 503, "text/plain", {"Retry-After": "1"}),
        page("duckduckgo_results.html"),
    )
    response = search(free_gateway, {"query": "rust async retry after"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "duckduckgo"
    assert outcomes(body["attempts"]) == [*SKIPPED_KEYED, ("duckduckgo", "ok")]
    assert len(engine_site.engines.requests_to(DDG)) == 2
    assert engine_site.engines.requests_to(BING) == []


def test_retry_after_beyond_the_cap_fails_that_attempt_at_once(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, Reply("come back later", 503, "text/plain", {"Retry-After": "120"}))
    engine_site.engines.script(BING, page("bing_results.html"))
    response = search(free_gateway, {"query": "python asyncio long retry after"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "bing"
    assert outcomes(body["attempts"]) == [*SKIPPED_KEYED, ("duckduckgo", "unavailable"), ("bing", "ok")]
    assert len(engine_site.engines.requests_to(DDG)) == 1


# --- normalisation ----------------------------------------------------------------------------


def test_site_restriction_is_sent_to_the_engine_and_enforced_on_returned_hosts(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_site_mixed.html"))
    response = search(free_gateway, {"query": "asyncio site enforcement", "site": "python.org"})
    assert response.status_code == 200, response.text
    urls = [r["url"] for r in response.json()["results"]]
    assert urls == ["https://docs.python.org/3/library/asyncio.html", "https://www.python.org/about/"]
    (ddg,) = engine_site.engines.requests_to(DDG)
    assert ddg.form["q"] == ["asyncio site enforcement site:python.org"]


def test_ads_unsafe_links_and_tracking_duplicates_are_dropped(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_dupes_ads_unsafe.html"))
    response = search(free_gateway, {"query": "http caching dedupe"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["results"] == [
        {
            "title": "HTTP caching - MDN",
            "url": "https://developer.mozilla.org/en-US/docs/Web/HTTP/Caching",
            "snippet": "Web sites get faster by reusing previously fetched resources.",
        },
        {
            "title": "RFC 9111: HTTP Caching",
            "url": "https://www.rfc-editor.org/rfc/rfc9111",
            "snippet": "This document defines HTTP caches & the associated header fields.",
        },
    ]
    assert body["truncated"] is False


def test_results_are_cut_to_max_results_and_marked_truncated(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_results.html"))
    response = search(free_gateway, {"query": "rust async truncated", "maxResults": 1})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["url"] for r in body["results"]] == ["https://rust-lang.github.io/async-book/#intro"]
    assert body["truncated"] is True


# --- cache ------------------------------------------------------------------------------------


def test_identical_second_search_is_answered_from_the_cache_without_a_request(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_results.html"))
    first = search(free_gateway, {"query": "rust async cache hit"})
    assert first.status_code == 200, first.text
    second = search(free_gateway, {"query": "  Rust   ASYNC cache hit "})
    assert second.status_code == 200, second.text
    assert outcomes(second.json()["attempts"]) == [("duckduckgo", "cached")]
    assert second.json()["provider"] == "duckduckgo"
    assert second.json()["results"] == first.json()["results"]
    assert len(engine_site.engines.requests_to(DDG)) == 1


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("brave_reply", "code", "status", "brave_outcome"),
    [
        pytest.param(page("brave_captcha.html"), "rate_limited", 503, "rate_limited", id="last-engine-captcha"),
        pytest.param(page("unknown_page.html"), "unavailable", 503, "unavailable", id="last-engine-unknown-page"),
        pytest.param(
            Reply("forbidden", 403, "text/plain"), "upstream_status", 502, "upstream_status", id="last-engine-http-403"
        ),
    ],
)
def test_every_engine_refusing_fails_with_the_last_code_and_lists_every_attempt(
    free_gateway: GatewayProcess,
    engine_site: EngineSite,
    brave_reply: Reply,
    code: str,
    status: int,
    brave_outcome: str,
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_captcha.html"))
    engine_site.engines.script(BRAVE, brave_reply)
    response = search(free_gateway, {"query": f"all engines fail {code}"})
    assert response.status_code == status, response.text
    assert response.headers["X-Egress-Code"] == code
    error = response.json()["error"]
    assert error["code"] == code
    assert outcomes(error["attempts"]) == [
        *SKIPPED_KEYED,
        ("duckduckgo", "rate_limited"),
        ("bing", "rate_limited"),
        ("brave", brave_outcome),
    ]
    assert "brave" in error["message"]


def test_a_no_results_page_from_the_last_engine_is_an_empty_answer(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_no_results.html"))
    engine_site.engines.script(BRAVE, page("brave_no_results.html"))
    response = search(free_gateway, {"query": "qzxv nothing anywhere"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["results"] == []
    assert outcomes(body["attempts"])[-2:] == [("bing", "no_results"), ("brave", "no_results")]


def test_no_engine_enabled_is_invalid_input_naming_the_settings_and_contacts_nothing(
    tmp_path_factory: pytest.TempPathFactory, fake_dns: FakeDNS, pki: TestPKI, engine_site: EngineSite
) -> None:
    env = {"EGRESS_SEARCH_ENGINES": "tavily,exa,brave_api", **engine_site.engine_urls()}
    gateway = start_gateway(tmp_path_factory, fake_dns, pki, search_policy(engine_site.origin), env)
    try:
        response = search(gateway, {"query": "nothing is enabled"})
    finally:
        gateway.stop()
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    for setting in ("EGRESS_SEARCH_ENGINES", "EGRESS_SEARCH_<ENGINE>_KEY", "EGRESS_SEARCH_URL"):
        assert setting in error["message"]
    assert engine_site.engines.all_requests() == []


@pytest.mark.parametrize(
    ("payload", "field_name"),
    [
        pytest.param({"query": "x" * 1001}, "query", id="query-over-1000-chars"),
        pytest.param({"query": "   "}, "query", id="query-blank"),
        pytest.param({"query": "bell\x07inside"}, "query", id="query-control-char"),
        pytest.param({"query": "right\u202eto-left"}, "query", id="query-format-char"),
        pytest.param({"maxResults": 5}, "query", id="query-missing"),
        pytest.param({"query": "ok", "maxResults": 0}, "maxResults", id="max-results-0"),
        pytest.param({"query": "ok", "maxResults": 21}, "maxResults", id="max-results-21"),
        pytest.param({"query": "ok", "maxResults": "5"}, "maxResults", id="max-results-string"),
        pytest.param({"query": "ok", "site": "https://python.org/docs"}, "site", id="site-with-scheme-and-path"),
        pytest.param({"query": "ok", "site": "*.python.org"}, "site", id="site-wildcard"),
        pytest.param({"query": "ok", "site": "python.org:8443"}, "site", id="site-with-port"),
        pytest.param({"query": "ok", "site": "169.254.169.254"}, "site", id="site-ip-literal"),
        pytest.param({"query": "ok", "site": "metadata.internal"}, "site", id="site-special-use-name"),
        pytest.param({"query": "ok", "timeRange": "h"}, "timeRange", id="time-range-hour"),
        pytest.param({"query": "ok", "region": "english"}, "region", id="region-free-text"),
        pytest.param({"query": "ok", "engine": "bing"}, "engine", id="unknown-field"),
    ],
)
def test_bad_arguments_are_invalid_input_naming_the_field_and_contact_nothing(
    free_gateway: GatewayProcess, engine_site: EngineSite, payload: dict[str, Any], field_name: str
) -> None:
    response = search(free_gateway, payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["message"].startswith(f"{field_name}:") or f"'{field_name}'" in error["message"]
    assert error["retryable"] is False
    assert engine_site.engines.all_requests() == []


def test_principal_without_the_search_switch_is_policy_denied(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    response = search(free_gateway, {"query": "reader may not search"}, token=READER_TOKEN)
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "policy_denied"
    assert "reader" in response.json()["error"]["message"]
    assert engine_site.engines.all_requests() == []


def test_second_search_within_the_minimum_interval_is_a_cooldown_with_retry_after(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_results.html"))
    first = search(free_gateway, {"query": "rust async cooldown one"}, token=HASTY_TOKEN)
    assert first.status_code == 200, first.text
    second = search(free_gateway, {"query": "rust async cooldown two"}, token=HASTY_TOKEN)
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "cooldown"
    assert second.json()["error"]["retryable"] is True
    assert 1 <= int(second.headers["Retry-After"]) <= 60
    assert len(engine_site.engines.requests_to(DDG)) == 1


# --- audit and metrics ------------------------------------------------------------------------


def test_audit_line_names_engines_outcomes_counts_and_durations_but_not_the_query(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    marker = "zebrafinch-audit-marker"
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_results.html"))
    engine_site.engines.script(BRAVE, page("brave_captcha.html"))
    answered = search(free_gateway, {"query": f"{marker} answered"})
    assert answered.status_code == 200, answered.text
    engine_site.engines.script(BING, page("bing_captcha.html"))
    failed = search(free_gateway, {"query": f"{marker} failed"})
    assert failed.status_code == 503, failed.text

    ok_line, error_line = search_lines(free_gateway)[-2:]
    assert ok_line["principal"] == "default"
    assert ok_line["decision"] == "allow"
    assert ok_line["provider"] == "bing"
    assert ok_line["results"] == len(answered.json()["results"])
    assert outcomes(ok_line["attempts"]) == [*SKIPPED_KEYED, ("duckduckgo", "rate_limited"), ("bing", "ok")]
    assert all(isinstance(a["ms"], int) for a in ok_line["attempts"])
    assert ok_line["duration_s"] >= 0
    # Engines refusing is not the policy's denial: allowed, with an upstream_error outcome.
    assert (error_line["decision"], error_line["outcome"]) == ("allow", "upstream_error")
    assert error_line["code"] == "rate_limited"
    assert outcomes(error_line["attempts"])[-3:] == [
        ("duckduckgo", "rate_limited"),
        ("bing", "rate_limited"),
        ("brave", "rate_limited"),
    ]
    assert marker not in free_gateway.audit_path.read_text()


def latency_count(samples: MetricSamples, engine: str) -> float:
    return samples.get(("egress_gateway_search_engine_seconds_count", (("engine", engine),)), 0.0)


def test_engine_attempts_are_counted_per_engine_and_outcome_in_metrics(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    before = metric_samples(free_gateway)
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_results.html"))
    response = search(free_gateway, {"query": "python asyncio metrics"})
    assert response.status_code == 200, response.text
    after = metric_samples(free_gateway)
    for engine, outcome in [("tavily", "skipped"), ("duckduckgo", "rate_limited"), ("bing", "ok")]:
        assert attempts_counter(after, engine, outcome) - attempts_counter(before, engine, outcome) == 1, engine
    assert latency_count(after, "bing") - latency_count(before, "bing") == 1
    assert latency_count(after, "tavily") == latency_count(before, "tavily")
    results_sum = ("egress_gateway_search_results_sum", (("engine", "bing"),))
    assert after[results_sum] - before.get(results_sum, 0.0) == len(response.json()["results"])


def test_failed_attempts_count_in_engine_latency_and_cache_hits_do_not(
    free_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_results.html"))
    assert search(free_gateway, {"query": "rust async latency cached"}).status_code == 200
    before = metric_samples(free_gateway)
    cached = search(free_gateway, {"query": "rust async latency cached"})
    assert outcomes(cached.json()["attempts"]) == [("duckduckgo", "cached")]
    engine_site.engines.script(DDG, page("duckduckgo_challenge.html", status=202))
    engine_site.engines.script(BING, page("bing_captcha.html"))
    engine_site.engines.script(BRAVE, page("brave_captcha.html"))
    assert search(free_gateway, {"query": "rust async latency failed"}).status_code == 503
    after = metric_samples(free_gateway)
    assert attempts_counter(after, "duckduckgo", "cached") - attempts_counter(before, "duckduckgo", "cached") == 1
    assert attempts_counter(after, "brave", "rate_limited") - attempts_counter(before, "brave", "rate_limited") == 1
    # One latency sample per engine for the failed search; none for the cache hit.
    for engine in ("duckduckgo", "bing", "brave"):
        assert latency_count(after, engine) - latency_count(before, engine) == 1, engine


# --- configured engines -----------------------------------------------------------------------


def test_template_engine_fills_query_and_limit_and_reads_an_odd_json_shape(
    configured_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TEMPLATE, json_page("template_odd_shape.json"))
    response = search(configured_gateway, {"query": "widget handbook & api", "maxResults": 5})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "template"
    assert outcomes(body["attempts"]) == [("template", "ok")]
    assert body["results"] == [
        {
            "title": "Widget handbook",
            "url": "https://handbook.example.net/widgets",
            "snippet": "How widgets are built & shipped.",
        },
        {
            "title": "Widget API",
            "url": "https://api-docs.example.net/widgets",
            "snippet": "Reference for the widget API.",
        },
    ]
    (template,) = engine_site.engines.requests_to(TEMPLATE)
    assert template.path == "/v2/find"
    assert template.params == {"text": ["widget handbook & api"], "size": ["5"], "lang": ["en"]}
    assert template.headers["Authorization"] == f"Bearer {TEMPLATE_KEY}"
    assert TEMPLATE_KEY not in response.text


def test_searxng_json_answers_when_the_template_engine_fails(
    configured_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TEMPLATE, Reply("internal error", 500, "text/plain"))
    engine_site.engines.script(SEARXNG, json_page("searxng_results.json"))
    response = search(configured_gateway, {"query": "sqlite searxng", "timeRange": "m"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "searxng"
    assert outcomes(body["attempts"]) == [("template", "upstream_status"), ("searxng", "ok")]
    assert body["results"] == [
        {
            "title": "SQLite Home Page",
            "url": "https://www.sqlite.org/index.html",
            "snippet": "SQLite is a C-language library",
        }
    ]
    (searxng,) = engine_site.engines.requests_to(SEARXNG)
    assert searxng.path == "/search"
    assert searxng.params["format"] == ["json"]
    assert searxng.params["q"] == ["sqlite searxng"]
    assert searxng.params["time_range"] == ["month"]


def test_mediawiki_search_links_results_to_their_articles(
    configured_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TEMPLATE, Reply("internal error", 500, "text/plain"))
    engine_site.engines.script(SEARXNG, Reply("internal error", 500, "text/plain"))
    engine_site.engines.script(MEDIAWIKI, json_page("mediawiki_results.json"))
    response = search(configured_gateway, {"query": "ada lovelace mediawiki", "maxResults": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["provider"] == "mediawiki"
    first = body["results"][0]
    assert first["title"] == "Ada Lovelace"
    assert first["url"] == engine_site.url(MEDIAWIKI, "/wiki/Ada_Lovelace")
    assert first["snippet"] == "Ada King, Countess of Lovelace & mathematician"
    (mediawiki,) = engine_site.engines.requests_to(MEDIAWIKI)
    assert mediawiki.path == "/w/api.php"
    assert mediawiki.params["list"] == ["search"]
    assert mediawiki.params["srsearch"] == ["ada lovelace mediawiki"]
    assert mediawiki.params["srlimit"] == ["3"]


def test_policy_retry_after_cap_fails_an_attempt_asking_for_longer(
    configured_gateway: GatewayProcess, engine_site: EngineSite
) -> None:
    engine_site.engines.script(TEMPLATE, Reply("slow down", 429, "text/plain", {"Retry-After": "10"}))
    engine_site.engines.script(SEARXNG, json_page("searxng_results.json"))
    response = search(configured_gateway, {"query": "sqlite retry cap from policy"})
    assert response.status_code == 200, response.text
    assert outcomes(response.json()["attempts"]) == [("template", "rate_limited"), ("searxng", "ok")]
    assert len(engine_site.engines.requests_to(TEMPLATE)) == 1


# --- the CLI ----------------------------------------------------------------------------------


def test_search_command_prints_the_results_as_a_numbered_list(
    free_gateway: GatewayProcess, engine_site: EngineSite, tmp_path: Path
) -> None:
    engine_site.engines.script(DDG, page("duckduckgo_results.html"))
    env = {**free_gateway.env, "EGRESS_AUDIT_LOG": str(tmp_path / "cli-audit.log")}
    completed = subprocess.run(
        [sys.executable, "-m", "gateway", "search", "rust async from the terminal", "--max-results", "2"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=API_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "provider: duckduckgo"
    assert lines[1] == "1. Asynchronous Programming in Rust"
    assert lines[2].strip() == "https://rust-lang.github.io/async-book/#intro"
    assert lines[4].startswith("2. Tokio tutorial")
    (ddg,) = engine_site.engines.requests_to(DDG)
    assert ddg.form["q"] == ["rust async from the terminal"]
