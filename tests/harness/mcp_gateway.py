"""A gateway set up for the MCP tests: a site, its search engine and three token principals.

Owns the site (a short page, a long one, a search endpoint), the policy naming the agent (both
tools), the searcher (search only) and the tight principal (one fetch per run), and
`started_mcp_gateway`, which starts origin and gateway and stops them after, and `mcp_gateway`,
the module-scoped fixture around it (the root conftest loads this module as a pytest plugin).
Shared by the Python SDK tests (test_mcp_http) and the TypeScript SDK ones (test_mcp_ts_client).
No tests live here.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.policy.decide import token_digest
from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.run_tokens import SECRET_ENV, TEST_ORCHESTRATORS

AGENT_TOKEN = "mcp-agent-token-0123456789abcdef"
SEARCHER_TOKEN = "mcp-searcher-token-0123456789abcd"
TIGHT_TOKEN = "mcp-tight-token-0123456789abcdef0"
SITE = "docs.example.org"
SEARCH_HOST = "search.example.net"
LONG_SENTENCE = "Every window of this page continues exactly where the last one stopped. "
# The site's https://docs.example.org:PORT, set once the module's origin is up.
SITE_URL: dict[str, str] = {}
OPEN_BUDGET = {"per_step": 1000, "per_run": 1000, "concurrent": 100, "min_interval_s": 0}


def site_app() -> web.Application:
    async def short(_: web.Request) -> web.Response:
        return web.Response(
            text="<html><head><title>Short page</title></head><body><article><h1>Short page</h1>"
            "<p>The gateway read this page through its pinned connection.</p></article></body></html>",
            content_type="text/html",
        )

    async def long(_: web.Request) -> web.Response:
        body = "".join(f"<p>{LONG_SENTENCE * 4} Paragraph {n}.</p>" for n in range(120))
        return web.Response(
            text=f"<html><head><title>Long page</title></head><body><article><h1>Long page</h1>{body}</article>"
            "</body></html>",
            content_type="text/html",
        )

    async def find(request: web.Request) -> web.Response:
        query = request.query.get("q", "")
        rows = [
            {"title": f"Result {n} for {query}", "url": f"https://{SITE}/r{n}", "content": f"snippet {n}"}
            for n in range(1, 4)
        ]
        return web.json_response({"results": rows})

    async def robots(_: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nAllow: /\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/short", short)
    app.router.add_get("/long", long)
    app.router.add_get("/find", find)
    app.router.add_get("/robots.txt", robots)
    return app


def mcp_policy(origin_cidr: str, origin_port: int) -> dict[str, Any]:
    def principal(token: str, search: bool, fetch: bool, budgets: dict[str, Any]) -> dict[str, Any]:
        return {
            "token_sha256": token_digest(token),
            "egress": {"allow_domains": [SITE, SEARCH_HOST]},
            "tools": {"search": search, "fetch": fetch},
            "budgets": budgets,
        }

    return policy_document(
        allow_cidrs=[origin_cidr],
        ports=[80, 443, origin_port],
        orchestrators=TEST_ORCHESTRATORS,
        # No default principal: a call without a token is refused (401).
        principals={
            "agent": principal(AGENT_TOKEN, True, True, {"search": OPEN_BUDGET, "fetch": OPEN_BUDGET}),
            "searcher": principal(SEARCHER_TOKEN, True, False, {"search": OPEN_BUDGET}),
            "tight": principal(TIGHT_TOKEN, False, True, {"fetch": {**OPEN_BUDGET, "per_step": 1, "per_run": 1}}),
        },
    )


@contextlib.contextmanager
def started_mcp_gateway(
    tmp_path_factory: pytest.TempPathFactory, harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS
) -> Iterator[GatewayProcess]:
    """The site, its search engine and a gateway with the agent, searcher and tight principals."""
    factory = OriginFactory(harness_loop, pki, fake_dns)
    origin = factory.start(site_app(), names=[SITE, SEARCH_HOST])
    env = {
        **SECRET_ENV,
        "EGRESS_SEARCH_ENGINES": "template",
        "EGRESS_SEARCH_URL": origin.url("/find?q={query}&n={limit}", name=SEARCH_HOST),
    }
    workdir: Path = tmp_path_factory.mktemp("mcp-http")
    gateway = GatewayProcess(
        workdir, mcp_policy(origin.cidr, origin.port), nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path, env=env
    )
    gateway.start()
    SITE_URL["base"] = origin.url("/")[:-1]
    try:
        yield gateway
    finally:
        gateway.stop()
        factory.stop_all()


@pytest.fixture(scope="module")
def mcp_gateway(
    tmp_path_factory: pytest.TempPathFactory, harness_loop: HarnessLoop, pki: TestPKI, fake_dns: FakeDNS
) -> Iterator[GatewayProcess]:
    """One MCP gateway a module shares: its tests keep apart by run ids (`new_run`)."""
    with started_mcp_gateway(tmp_path_factory, harness_loop, pki, fake_dns) as gateway:
        yield gateway


def page_url(path: str) -> str:
    return SITE_URL["base"] + path


PRINCIPAL_OF_TOKEN = {AGENT_TOKEN: "agent", SEARCHER_TOKEN: "searcher", TIGHT_TOKEN: "tight"}


def new_run() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"
