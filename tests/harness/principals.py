"""Token principals and tool calls made as them, shared by the permission, reload and proxy tests.

Owns the principal a bearer token names (as the policy stores it: the token's SHA-256), the policy
that lists such principals, a tool call with those credentials, the policy generation a gateway
reports, and a fetch held in flight by a `HoldingSite` origin. No tests live here.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from tests.harness.budget_calls import HoldingSite
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin

FETCHER_TOKEN = "fetcher-token-0123456789"
GENERATION_LINE = re.compile(r"^egress_gateway_policy_generation (\S+)$", re.MULTILINE)
# Bounded wait for the origin to hold the fetch.
HELD_WAIT_S = 10.0


def token_principal(token: str, *, search: bool | None = None, fetch: bool | None = None) -> dict[str, Any]:
    from gateway.policy.decide import token_digest  # noqa: PLC0415 - the gateway's own hashing

    principal: dict[str, Any] = {"token_sha256": token_digest(token), "egress": {"allow_domains": ["*"]}}
    switches = {name: value for name, value in (("search", search), ("fetch", fetch)) if value is not None}
    if switches:
        principal["tools"] = switches
    return principal


def token_policy(*origins_: Origin, principals: Mapping[str, Any]) -> dict[str, Any]:
    return policy_document(
        allow_cidrs=[origin.cidr for origin in origins_],
        ports=[80, 443, *(origin.port for origin in origins_)],
        principals=principals,
    )


def call(
    gateway: GatewayProcess,
    tool: str,
    body: Mapping[str, Any],
    token: str | None = None,
    authorization: str | None = None,
) -> httpx.Response:
    headers = {"X-Egress-Run": "run-perm", "X-Egress-Step": "step-1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if authorization is not None:
        headers["Authorization"] = authorization
    return httpx.post(f"{gateway.api_url}/v1/{tool}", json=dict(body), headers=headers, timeout=20)


def policy_generation(gateway: GatewayProcess) -> float:
    match = GENERATION_LINE.search(httpx.get(f"{gateway.admin_url}/metrics", timeout=5).text)
    assert match is not None
    return float(match.group(1))


def start_held_fetch(
    gateway: GatewayProcess, site: HoldingSite, origin: Origin
) -> tuple[threading.Thread, list[httpx.Response]]:
    """A fetch of `/held` in a thread, returned once the origin holds it (its answer lands in the list)."""
    outcome: list[httpx.Response] = []
    caller = threading.Thread(
        target=lambda: outcome.append(call(gateway, "fetch", {"url": origin.url("/held")}, FETCHER_TOKEN)),
        name="held-fetch",
    )
    caller.start()
    deadline = time.monotonic() + HELD_WAIT_S
    while site.arrived < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert site.arrived == 1
    return caller, outcome
