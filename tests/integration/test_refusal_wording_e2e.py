"""A TLS failure on a CA the gateway does not trust says how to trust it, and is not retryable."""

from __future__ import annotations

import httpx
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.gateway import policy_document
from tests.harness.origins import OriginFactory


def _app() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<p>private CA page</p>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    return app


def test_an_untrusted_ca_names_egress_ca_bundle_and_is_not_retryable(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(_app(), names=["docs.example.org"])
    # The test CA is not given to this gateway: its origins' certificates are from an unknown CA.
    gateway = gateway_factory(
        policy_document(allow_cidrs=[origin.cidr], ports=[80, 443, origin.port]), env={"EGRESS_CA_BUNDLE": ""}
    )
    response = httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": origin.url("/page")}, timeout=20)
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "connect_failure"
    assert "docs.example.org" in error["message"]
    assert "EGRESS_CA_BUNDLE" in error["message"]
    assert error["retryable"] is False
    line = gateway.wait_audit(bool)[-1]
    assert (line["decision"], line["outcome"], line["code"]) == ("allow", "connect_error", "connect_failure")
