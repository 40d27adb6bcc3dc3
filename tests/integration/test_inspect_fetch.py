"""web_fetch meets the same request rules as the proxy (issue 25): a GET the rules deny is refused
before any byte reaches the origin, and a redirect to a denied path stops at that hop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.harness.certs import TestPKI
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import OriginFactory

HOST = "docs.example.org"


def _counting_app(seen: list[str]) -> web.Application:
    async def page(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        if request.path == "/hop":
            raise web.HTTPFound("/private/after-redirect")
        return web.Response(text="<html><body><p>Public page text.</p></body></html>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


def test_a_get_the_rules_deny_is_refused_before_any_byte_is_sent(
    origins: OriginFactory, fake_dns: FakeDNS, pki: TestPKI, tmp_path: Path
) -> None:
    seen: list[str] = []
    origin = origins.start(_counting_app(seen), names=(HOST,))
    policy: dict[str, Any] = policy_document(
        allow_cidrs=[origin.cidr],
        ports=[80, 443, origin.port],
        principals={
            "default": {
                "egress": {"allow_domains": ["*"]},
                "tools": {"fetch": True},
                "inspect": [
                    {
                        "host": HOST,
                        "ports": [origin.port],
                        "access": "read-only",
                        "deny": [{"id": "no-private", "paths": ["/private/**"]}],
                    }
                ],
            }
        },
        fetch={"robots": "ignore"},
    )
    gateway = GatewayProcess(tmp_path, policy, nameserver=fake_dns.nameserver, ca_bundle=pki.ca_path).start()
    try:

        def fetch(path: str) -> httpx.Response:
            return httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": origin.url(path, HOST)}, timeout=30)

        denied = fetch("/private/report")
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "policy_denied"
        assert seen == []  # not a byte of it reached the origin
        allowed = fetch("/public")
        assert allowed.status_code == 200, allowed.text
        assert seen == ["/public"]
        redirected = fetch("/hop")
        assert redirected.status_code == 403
        assert redirected.json()["error"]["code"] == "redirect_blocked"
        assert seen == ["/public", "/hop"]  # the denied hop was never requested
        lines = gateway.wait_audit(lambda ls: any(x.get("rule") == "no-private" for x in ls))
        assert any(x.get("rule") == "no-private" and x.get("kind") == "fetch" for x in lines)
    finally:
        gateway.stop()
