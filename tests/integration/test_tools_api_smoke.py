"""The tools API end to end: a real gateway process, real origins, the fake DNS."""

from __future__ import annotations

import httpx
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.gateway import policy_document
from tests.harness.origins import OriginFactory

ARTICLE = """<html><head><title>Pinned sockets</title></head><body>
<nav><a href="/">Home</a> <a href="/about">About</a></nav>
<article><h1>Pinned sockets</h1><p>The gateway connects only to the address it vetted.</p>
<p>See <a href="/more">the details</a>.</p></article>
<footer>Copyright</footer></body></html>"""


def site_app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=ARTICLE, content_type="text/html")

    async def robots(request: web.Request) -> web.Response:
        return web.Response(text="User-agent: *\nDisallow: /private\n", content_type="text/plain")

    app = web.Application()
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/article", page)
    app.router.add_get("/private/page", page)
    return app


def test_fetch_returns_markdown_with_budget_and_notice(gateway_factory: GatewayFactory, origins: OriginFactory) -> None:
    origin = origins.start(site_app(), names=["docs.example.org"])
    gateway = gateway_factory(policy_document(allow_cidrs=[origin.cidr], ports=[80, 443, origin.port]))
    response = httpx.post(
        f"{gateway.api_url}/v1/fetch",
        json={"url": origin.url("/article")},
        headers={"X-Egress-Run": "run-1", "X-Egress-Step": "step-1"},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["content"].startswith("# Pinned sockets")
    assert "only to the address it vetted" in body["content"]
    assert "Home" not in body["content"]
    assert {"text": "the details", "url": origin.url("/more")} in body["links"]
    # Without a run token the ids count for nothing; the window quotas always count.
    assert body["budget"] == {
        "step": None,
        "run": None,
        "minute": {"remaining": 119},
        "hour": {"remaining": 999},
        "day": {"remaining": 4999},
    }
    assert "untrusted" in body["notice"]
    assert body["nextOffset"] is None


def test_fetch_refuses_a_robots_disallowed_path_naming_the_rule(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(site_app(), names=["docs.example.org"])
    gateway = gateway_factory(policy_document(allow_cidrs=[origin.cidr], ports=[80, 443, origin.port]))
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": origin.url("/private/page")}, timeout=20)
    assert response.status_code == 403
    assert response.headers["X-Egress-Code"] == "robots_disallowed"
    assert "Disallow: /private" in response.json()["error"]["message"]


def test_fetch_of_a_metadata_name_is_blocked_and_audited_without_the_path(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    response = httpx.post(
        f"{gateway.api_url}/v1/fetch", json={"url": "http://metadata.google.internal/secret?x=1"}, timeout=20
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsafe_url"
    lines = [line for line in gateway.audit_lines() if line.get("kind") == "fetch"]
    assert lines
    assert lines[-1]["decision"] == "deny"
    assert "secret" not in str(lines[-1])


def test_unknown_field_is_invalid_input(gateway_factory: GatewayFactory) -> None:
    gateway = gateway_factory(policy_document())
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": "https://example.com/", "bogus": 1}, timeout=20)
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "invalid_input", "message": "unknown field 'bogus'", "retryable": False}


def test_report_mode_allows_a_denied_host_and_audits_would_deny(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(site_app(), names=["docs.example.org"])
    principal = {
        "egress": {"allow_domains": ["*"], "deny_domains": ["docs.example.org"]},
        "tools": {"search": False, "fetch": True},
    }
    policy = policy_document(
        allow_cidrs=[origin.cidr],
        ports=[80, 443, origin.port],
        principals={"default": principal},
        defaults={"mode": "report"},
    )
    gateway = gateway_factory(policy)
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": origin.url("/article")}, timeout=20)
    assert response.status_code == 200, response.text
    line = [entry for entry in gateway.audit_lines() if entry.get("kind") == "fetch"][-1]
    assert line["decision"] == "would_deny"
    assert line["code"] == "policy_denied"
