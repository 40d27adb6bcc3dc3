"""web_search wiring: the engines' transport over the guarded client, the cache over the store.

Engine requests go through the same egress core as everything else (policy, DNS, address guard,
pinned TLS) with no redirect followed. The audit line for a search never carries the query.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from gateway.budget import BudgetStore
from gateway.egress.client import GuardedClient, OutboundRequest
from gateway.egress.deadline import Deadline
from gateway.errors import GatewayError
from gateway.observe import metrics
from gateway.policy.decide import vet_url_for
from gateway.policy.model import LoadedPolicy, Principal
from gateway.settings import Settings
from gateway.tools.result_notice import NOTICE, retrieved_at
from gateway.tools.search.aggregate import OUTCOME_CACHED, OUTCOME_SKIPPED, SearchAggregator
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.registry import engines_from_settings
from gateway.tools.search.transport import EngineReply, EngineRequest, make_reply
from gateway.tools.terminal_safe import Stripper

ENGINE_MAX_BYTES = 2 * 1024 * 1024
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "x-subscription-token"})
NO_REQUEST_OUTCOMES = frozenset({OUTCOME_SKIPPED, OUTCOME_CACHED})


class GuardedTransport:
    """Sends one engine request for one principal through the guarded client."""

    def __init__(self, client: GuardedClient, principal: Principal, loaded: LoadedPolicy) -> None:
        self._client = client
        self._principal = principal
        self._loaded = loaded
        self._limits = dataclasses.replace(
            loaded.policy.fetch,
            max_redirects=0,
            max_wire_bytes=ENGINE_MAX_BYTES,
            max_decoded_bytes=ENGINE_MAX_BYTES,
            max_pdf_bytes=ENGINE_MAX_BYTES,
        )

    async def __call__(self, request: EngineRequest, *, deadline_s: float) -> EngineReply:
        carries_credential = any(name.lower() in CREDENTIAL_HEADERS for name, _ in request.headers)
        response = await self._client.fetch(
            OutboundRequest(
                # An engine's own key may ride in its query string: that one is sent on purpose.
                url=vet_url_for(self._loaded.policy, request.url, refuse_secrets=False),
                method=request.method,
                headers=request.headers,
                body=request.body,
                carries_credential=carries_credential,
                refuse_secret_params=False,
                follow_redirects=False,
            ),
            principal=self._principal,
            limits=self._limits,
            deadline=Deadline.after(deadline_s),
            loaded=self._loaded,
        )
        return make_reply(response.status, response.headers.items(), response.body, response.url)


class StoreCache:
    """The search cache on the budget store (memory, or Redis shared by replicas)."""

    def __init__(self, store: BudgetStore) -> None:
        self._store = store

    async def get(self, key: str) -> bytes | None:
        return await self._store.cache_get(key)

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        await self._store.cache_set(key, value, ttl_s)


class SearchTool:
    def __init__(self, client: GuardedClient, store: BudgetStore, settings: Settings) -> None:
        search = settings.search
        self._client = client
        self._cache = StoreCache(store)
        self._engines = engines_from_settings(
            search.engines,
            search.keys,
            search.urls,
            template_url=search.template_url,
            template_key=search.template_key,
            searxng_url=search.urls.get("searxng"),
            mediawiki_url=search.urls.get("mediawiki"),
        )

    async def search(self, query: SearchQuery, principal: Principal, loaded: LoadedPolicy) -> dict[str, Any]:
        settings = loaded.policy.search
        aggregator = SearchAggregator(
            self._engines,
            GuardedTransport(self._client, principal, loaded),
            self._cache,
            cache_ttl_s=settings.cache_ttl_s,
            attempt_deadline_s=settings.deadline_s,
            max_retry_after_s=settings.max_retry_after_s,
        )
        try:
            result = await aggregator.search(query)
        except GatewayError as exc:
            # Failed attempts are the slow ones (timeouts, retries): they count in the latency too.
            _observe_attempts((a["engine"], a["outcome"], a["ms"]) for a in exc.extra.get("attempts", []))
            raise
        _observe_attempts((a.engine, a.outcome, a.ms) for a in result.attempts)
        if result.provider:
            metrics.SEARCH_RESULTS.labels(engine=result.provider).observe(len(result.results))
        body = result.to_json()
        strip = Stripper()
        for hit in body["results"]:
            hit.update(title=strip(hit["title"]), url=strip(hit["url"]), snippet=strip(hit["snippet"]))
        body.update(
            controlCharsRemoved=strip.removed,
            query=query.query,
            retrievedAt=retrieved_at(),
            notice=NOTICE,
        )
        return body


def _observe_attempts(attempts: Iterable[tuple[str, str, float]]) -> None:
    """One count per engine attempt, and its latency when it sent a request (engine, outcome, ms)."""
    for engine, outcome, ms in attempts:
        metrics.SEARCH_ATTEMPTS.labels(engine=engine, outcome=outcome).inc()
        # A skipped or cached attempt sent no request: its 0 ms is no engine latency.
        if outcome not in NO_REQUEST_OUTCOMES:
            metrics.SEARCH_ENGINE_SECONDS.labels(engine=engine).observe(ms / 1000)
