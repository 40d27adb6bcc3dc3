"""Budgeted tool calls against real gateways, shared by the budget, permission and reload tests.

Owns the origin that holds calls in flight (`HoldingSite`), the policy that budgets the default
principal, run ids and the run-token headers of a vouched step, and the calls themselves (one
fetch, or a burst of them started at once) with their outcomes counted by status and error code.
No tests live here.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, Origin
from tests.harness.run_tokens import TEST_ORCHESTRATORS, run_token

ARTICLE = (
    "<html><head><title>Budgets</title></head><body><article><h1>Budgets</h1><p>Counted.</p></article></body></html>"
)


SERP_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "serp" / "duckduckgo_results.html"


CONCURRENT_FETCHES = 200


class HoldingSite:
    """An origin app: `/article` answers at once, `/held` waits until the test calls `release()`.

    The handlers run on the harness loop (another thread); `arrived` counts requests that reached
    `/held`, i.e. calls that got past the reservation and are in flight.
    """

    def __init__(self, harness_loop: HarnessLoop) -> None:
        self._loop = harness_loop.loop
        self._released = asyncio.Event()
        self.arrived = 0

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._released.set)

    def app(self) -> web.Application:
        async def article(request: web.Request) -> web.Response:
            return web.Response(text=ARTICLE, content_type="text/html")

        async def held(request: web.Request) -> web.Response:
            self.arrived += 1
            await self._released.wait()
            return web.Response(text=ARTICLE, content_type="text/html")

        async def robots(request: web.Request) -> web.Response:
            return web.Response(status=404, text="none")

        app = web.Application()
        app.router.add_get("/article", article)
        app.router.add_get("/held", held)
        app.router.add_get("/robots.txt", robots)
        return app


def budgeted_policy(
    origin: Origin,
    *,
    fetch: Mapping[str, Any] | None = None,
    search: Mapping[str, Any] | None = None,
    deny_domains: Sequence[str] = (),
) -> dict[str, Any]:
    budgets: dict[str, Any] = {}
    if fetch is not None:
        budgets["fetch"] = dict(fetch)
    if search is not None:
        budgets["search"] = dict(search)
    principal: dict[str, Any] = {
        "egress": {"allow_domains": ["*"], "deny_domains": list(deny_domains)},
        "tools": {"search": True, "fetch": True},
        "budgets": budgets,
    }
    return policy_document(
        allow_cidrs=[origin.cidr],
        ports=[80, 443, origin.port],
        principals={"default": principal},
        orchestrators=TEST_ORCHESTRATORS,
    )


def new_run() -> str:
    """A run id of this test's own: the session Redis is shared by every test."""
    return f"run-{uuid.uuid4().hex}"


def step_headers(run_id: str, step_id: str = "step-1") -> dict[str, str]:
    """Headers of a call in a vouched run: a run token for `run_id` (as the test orchestrator
    holding the gateways' secret would mint it) and the step id."""
    return {"X-Egress-Run-Token": run_token(run_id), "X-Egress-Step": step_id}


def fetch(
    gateway: GatewayProcess,
    url: str,
    headers: Mapping[str, str] | None = None,
    payload: Mapping[str, Any] | None = None,
) -> httpx.Response:
    return httpx.post(
        f"{gateway.api_url}/v1/fetch", json=dict(payload or {"url": url}), headers=dict(headers or {}), timeout=20
    )


def error_code(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    code: str = response.json()["error"]["code"]
    assert response.headers["X-Egress-Code"] == code
    return code


def outcome_counts(responses: Sequence[httpx.Response]) -> Counter[tuple[int, str | None]]:
    return Counter((response.status_code, error_code(response)) for response in responses)


def start_fetches(
    client: httpx.AsyncClient, gateways: Sequence[GatewayProcess], url: str, headers: Mapping[str, str], count: int
) -> list[asyncio.Task[httpx.Response]]:
    """Start `count` fetches at once, alternating between the replicas; return the running tasks."""

    async def one(index: int) -> httpx.Response:
        gateway = gateways[index % len(gateways)]
        return await client.post(f"{gateway.api_url}/v1/fetch", json={"url": url}, headers=dict(headers))

    loop = asyncio.get_running_loop()
    return [loop.create_task(one(i), name=f"fetch-{i}") for i in range(count)]


def concurrent_client() -> httpx.AsyncClient:
    # One connection per request: the point is that all of them reach the gateways together.
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=0), timeout=30)


def serp_app() -> web.Application:
    page = SERP_FIXTURE.read_text()

    async def results(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_post("/html/", results)
    return app
