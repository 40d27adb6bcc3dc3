"""The tiered walk over search engines: cache, retries, fallback and the final answer or error.

Owns the aggregation rules of issue 4: every configured engine's cache route is checked before any
engine is asked; engines are then asked in the configured order (a keyed engine without a key is
listed as `skipped` and never contacted); 429/502/503/504 are retried at most twice per engine
honouring Retry-After up to 60 s; the first engine with at least one usable row answers; an explicit
no-results page answers only when it is the last word; otherwise the call fails with the last
meaningful code and every attempt listed. Requests leave only through the `Transport` seam; this
module never opens a socket. Keys never reach attempts, errors or cache keys.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.search.engine import EngineOutcome
from gateway.tools.search.normalise import SearchHit, normalise_rows
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.registry import ENABLING_SETTINGS, ConfiguredEngine
from gateway.tools.search.transport import EngineReply, SearchCache, Transport

DEFAULT_CACHE_TTL_S = 900.0
DEFAULT_ATTEMPT_DEADLINE_S = 15.0
MAX_RETRIES = 2
MAX_RETRY_AFTER_S = 60.0
# Without a Retry-After, back off a little before asking again (1 s, then 2 s).
DEFAULT_BACKOFF_S = 1.0
RETRY_STATUSES = frozenset({429, 502, 503, 504})
CACHE_KEY_VERSION = "v1"

OUTCOME_OK = "ok"
OUTCOME_CACHED = "cached"
OUTCOME_SKIPPED = "skipped"
OUTCOME_NO_RESULTS = "no_results"
# Parser conclusions as attempt outcomes (and, for failures, as error codes).
_OUTCOME_FOR_KIND = MappingProxyType(
    {
        "challenge": str(ErrorCode.RATE_LIMITED),
        "refused": str(ErrorCode.UPSTREAM_STATUS),
        "unrecognised": str(ErrorCode.UNAVAILABLE),
    }
)


_ENGINE_ERROR_TEXT = MappingProxyType(
    {
        ErrorCode.DNS_FAILURE: "{host} did not resolve",
        ErrorCode.TIMEOUT: "{host} did not answer in time",
        ErrorCode.TOO_LARGE: "{host} answered with more than the size cap",
        ErrorCode.REDIRECT_BLOCKED: "{host} redirected somewhere the gateway refuses",
    }
)


def describe_engine_error(error: GatewayError, base_url: str) -> str:
    """What went wrong with an engine, for an agent: the host and the reason, never the request
    URL (it carries the query) and never the bare code again."""
    host = urlsplit(base_url).hostname or "the engine"
    template = _ENGINE_ERROR_TEXT.get(error.code)
    if template is not None:
        return template.format(host=host)
    if error.code == ErrorCode.CONNECT_FAILURE:
        # describe_connect_error names the host and the TLS or socket problem, not the URL.
        return error.message
    if error.code in {ErrorCode.POLICY_DENIED, ErrorCode.BLOCKED_DESTINATION, ErrorCode.UNSAFE_URL}:
        return f"{host} is refused by the policy ({error.code})"
    return f"{host}: {str(error.code).replace('_', ' ')}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One engine's part in a search, as listed to the caller and the audit log."""

    engine: str
    tier: str
    outcome: str
    ms: int
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "tier": self.tier, "outcome": self.outcome, "ms": self.ms}


@dataclass(frozen=True, slots=True)
class SearchResult:
    provider: str
    results: tuple[SearchHit, ...]
    truncated: bool
    attempts: tuple[Attempt, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "results": [hit.to_json() for hit in self.results],
            "truncated": self.truncated,
            "attempts": [attempt.to_json() for attempt in self.attempts],
        }


@dataclass(frozen=True, slots=True)
class _EngineAnswer:
    outcome: str
    detail: str
    hits: tuple[SearchHit, ...] = ()
    truncated: bool = False


def cache_key(engine: str, query: SearchQuery) -> str:
    """The cache route: engine plus normalised arguments, hashed so no query text sits in Redis."""
    route = {
        "q": " ".join(query.query.split()).casefold(),
        "n": query.max_results,
        "site": query.site,
        "t": query.time_range,
        "r": query.region,
    }
    digest = hashlib.sha256(orjson.dumps(route, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return f"search:{CACHE_KEY_VERSION}:{engine}:{digest}"


def retry_after_s(reply: EngineReply, now_s: float) -> float | None:
    """Retry-After as seconds from now (RFC 9110 10.2.3: delay-seconds or an HTTP date)."""
    raw = (reply.header("retry-after") or "").strip()
    if not raw:
        return None
    if raw.isdigit():
        return float(raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, when.timestamp() - now_s)


class SearchAggregator:
    """Answers a `SearchQuery` from the configured engines; see the module docstring for rules."""

    def __init__(
        self,
        engines: Sequence[ConfiguredEngine],
        transport: Transport,
        cache: SearchCache,
        *,
        cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
        attempt_deadline_s: float = DEFAULT_ATTEMPT_DEADLINE_S,
        max_retry_after_s: float = MAX_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._engines = tuple(engines)
        self._transport = transport
        self._cache = cache
        self._cache_ttl_s = cache_ttl_s
        self._attempt_deadline_s = attempt_deadline_s
        self._max_retry_after_s = max_retry_after_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep

    @property
    def engines(self) -> tuple[ConfiguredEngine, ...]:
        return self._engines

    async def search(self, query: SearchQuery) -> SearchResult:
        enabled = [engine for engine in self._engines if engine.enabled]
        if not enabled:
            settings = ", ".join(ENABLING_SETTINGS)
            raise GatewayError(
                ErrorCode.INVALID_INPUT,
                f"no search engine is enabled; set one of {settings}",
                extra={"settings": list(ENABLING_SETTINGS)},
            )
        cached = await self._from_cache(enabled, query)
        if cached is not None:
            return cached
        attempts: list[Attempt] = []
        for engine in self._engines:
            if not engine.enabled:
                attempts.append(Attempt(engine.name, engine.tier, OUTCOME_SKIPPED, 0, "no key"))
                continue
            started = self._clock()
            answer = await self._ask(engine, query)
            ms = round((self._clock() - started) * 1000)
            attempts.append(Attempt(engine.name, engine.tier, answer.outcome, ms, answer.detail))
            if answer.outcome == OUTCOME_OK:
                await self._remember(engine, query, answer)
                return SearchResult(engine.name, answer.hits, answer.truncated, tuple(attempts))
        return self._conclude(attempts)

    async def _from_cache(self, enabled: list[ConfiguredEngine], query: SearchQuery) -> SearchResult | None:
        # A cached answer from a free engine beats asking a paid one again.
        for engine in enabled:
            try:
                raw = await self._cache.get(cache_key(engine.name, query))
            except GatewayError:
                # A cache is an optimisation: a store outage must not fail the search.
                return None
            if raw is None:
                continue
            try:
                stored = orjson.loads(raw)
                hits = tuple(SearchHit(title=h["title"], url=h["url"], snippet=h["snippet"]) for h in stored["results"])
                truncated = bool(stored["truncated"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            attempt = Attempt(engine.name, engine.tier, OUTCOME_CACHED, 0)
            return SearchResult(engine.name, hits, truncated, (attempt,))
        return None

    async def _remember(self, engine: ConfiguredEngine, query: SearchQuery, answer: _EngineAnswer) -> None:
        value = orjson.dumps({"results": [h.to_json() for h in answer.hits], "truncated": answer.truncated})
        try:
            await self._cache.set(cache_key(engine.name, query), value, self._cache_ttl_s)
        except GatewayError:
            return

    async def _ask(self, engine: ConfiguredEngine, query: SearchQuery) -> _EngineAnswer:
        today = dt.datetime.fromtimestamp(self._wall_clock(), tz=dt.UTC).date()
        request = engine.spec.build_request(query, engine.key, engine.base_url, today=today)
        retries = 0
        while True:
            try:
                reply = await self._transport(request, deadline_s=self._attempt_deadline_s)
            except GatewayError as error:
                # The transport's own code (timeout, dns_failure, ...) names what went wrong;
                # its message may quote the request URL, so the detail is written from the host.
                return _EngineAnswer(str(error.code), describe_engine_error(error, engine.base_url))
            if reply.status not in RETRY_STATUSES:
                break
            refusal = ErrorCode.RATE_LIMITED if reply.status == 429 else ErrorCode.UNAVAILABLE
            if retries >= MAX_RETRIES:
                return _EngineAnswer(str(refusal), f"HTTP {reply.status} after {retries} retries")
            delay = retry_after_s(reply, self._wall_clock())
            if delay is None:
                delay = DEFAULT_BACKOFF_S * (retries + 1)
            elif delay > self._max_retry_after_s:
                return _EngineAnswer(str(refusal), f"HTTP {reply.status}, Retry-After {delay:.0f} s")
            retries += 1
            await self._sleep(delay)
        return self._judge(engine.spec.parse(reply), query)

    @staticmethod
    def _judge(outcome: EngineOutcome, query: SearchQuery) -> _EngineAnswer:
        if outcome.kind == "results":
            normalised = normalise_rows(outcome.rows, max_results=query.max_results, site=query.site)
            if normalised.hits:
                return _EngineAnswer(OUTCOME_OK, "", normalised.hits, normalised.truncated)
            # Rows that were all ads, unsafe or off-site: nothing usable, so the walk moves on.
            return _EngineAnswer(OUTCOME_NO_RESULTS, f"{normalised.dropped} rows dropped")
        if outcome.kind == "no_results":
            return _EngineAnswer(OUTCOME_NO_RESULTS, outcome.detail)
        return _EngineAnswer(_OUTCOME_FOR_KIND[outcome.kind], outcome.detail)

    @staticmethod
    def _conclude(attempts: list[Attempt]) -> SearchResult:
        asked = [a for a in attempts if a.outcome != OUTCOME_SKIPPED]
        last = asked[-1]
        # "No results" is an answer only when it is the last word: every engine agreed, or the
        # last engine said so. Otherwise a refusal further down hides what the query would find.
        if last.outcome == OUTCOME_NO_RESULTS:
            return SearchResult(last.engine, (), False, tuple(attempts))
        failures = [a for a in asked if a.outcome != OUTCOME_NO_RESULTS]
        code = ErrorCode(failures[-1].outcome)
        summary = "; ".join(
            f"{a.engine} {a.outcome.replace('_', ' ')}"
            + (f": {a.detail}" if a.detail and a.detail != a.outcome else "")
            for a in asked
        )
        skipped = [a.engine for a in attempts if a.outcome == OUTCOME_SKIPPED]
        hint = ""
        if skipped:
            keys = ", ".join(f"EGRESS_SEARCH_{name.upper()}_KEY" for name in skipped)
            hint = (
                f" (skipped for want of a key: {', '.join(skipped)}; set {keys}, or add a self-hosted engine"
                " with EGRESS_SEARCH_SEARXNG_URL or EGRESS_SEARCH_URL)"
            )
        raise GatewayError(
            code,
            f"no search engine answered: {summary}{hint}",
            extra={"attempts": [a.to_json() for a in attempts]},
        )
