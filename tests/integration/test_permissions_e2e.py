"""Tool permissions end to end: per-principal switches, credentials, and the policy-generation recheck.

Real `egress-gateway serve` processes; principals authenticate with `Authorization: Bearer`; a
fetch held by the origin spans a policy rewrite and must be dropped with `policy_changed`.
"""

from __future__ import annotations

import time

import httpx

from tests.conftest import GatewayFactory
from tests.harness.budget_calls import HoldingSite, serp_app
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.principals import (
    FETCHER_TOKEN,
    call,
    policy_generation,
    start_held_fetch,
    token_policy,
    token_principal,
)

SEARCHER_TOKEN = "searcher-token-0123456789"
BARE_TOKEN = "bare-token-0123456789"
# Bounded waits: the gateway polls its policy file every second.
RELOAD_WAIT_S = 10.0


def error_code(response: httpx.Response) -> str | None:
    return None if response.status_code == 200 else str(response.json()["error"]["code"])


def test_search_and_fetch_are_separate_switches_per_token_principal(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    site = HoldingSite(harness_loop)
    site.release()
    origin = origins.start(site.app(), names=["docs.example.org"])
    engine = origins.start(serp_app(), names=["html.duckduckgo.com"])
    principals = {
        "fetcher": token_principal(FETCHER_TOKEN, fetch=True),
        "searcher": token_principal(SEARCHER_TOKEN, search=True),
        # No tools section at all: both switches default to off.
        "bare": token_principal(BARE_TOKEN),
    }
    gateway = gateway_factory(
        token_policy(origin, engine, principals=principals), env={"EGRESS_SEARCH_DUCKDUCKGO_URL": engine.url("/html/")}
    )
    fetch_body = {"url": origin.url("/article")}
    search_body = {"query": "rust async"}

    outcomes = {
        (name, tool): call(gateway, tool, fetch_body if tool == "fetch" else search_body, token)
        for name, token in (("fetcher", FETCHER_TOKEN), ("searcher", SEARCHER_TOKEN), ("bare", BARE_TOKEN))
        for tool in ("fetch", "search")
    }

    assert {key: (r.status_code, error_code(r)) for key, r in outcomes.items()} == {
        ("fetcher", "fetch"): (200, None),
        ("fetcher", "search"): (403, "policy_denied"),
        ("searcher", "fetch"): (403, "policy_denied"),
        ("searcher", "search"): (200, None),
        ("bare", "fetch"): (403, "policy_denied"),
        ("bare", "search"): (403, "policy_denied"),
    }
    # The window quotas count every granted call (run and step ids count only under a run token).
    assert outcomes[("fetcher", "fetch")].json()["budget"]["minute"] == {"remaining": 119}
    assert outcomes[("searcher", "search")].json()["budget"]["minute"] == {"remaining": 29}
    assert "web_search" in outcomes[("fetcher", "search")].json()["error"]["message"]


def test_a_missing_or_unknown_credential_is_auth_required_without_a_default_principal(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    origin = origins.start(HoldingSite(harness_loop).app(), names=["docs.example.org"])
    principals = {"fetcher": token_principal(FETCHER_TOKEN, search=True, fetch=True)}
    gateway = gateway_factory(token_policy(origin, principals=principals))
    body = {"url": origin.url("/article")}

    refused = {
        "no credential": call(gateway, "fetch", body),
        "unknown token": call(gateway, "fetch", body, token="not-a-principal-token"),
        "unknown token, search": call(gateway, "search", {"query": "rust"}, token="not-a-principal-token"),
        "basic scheme": call(gateway, "fetch", body, authorization="Basic ZmV0Y2hlcjp4"),
        "bearer without a token": call(gateway, "fetch", body, authorization="Bearer"),
    }

    for case, response in refused.items():
        assert (response.status_code, error_code(response)) == (401, "auth_required"), case
        assert response.headers["WWW-Authenticate"].startswith("Bearer"), case
    assert call(gateway, "fetch", body, token=FETCHER_TOKEN).status_code == 200


def test_a_fetch_spanning_a_policy_reload_is_dropped_with_policy_changed(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    site = HoldingSite(harness_loop)
    origin = origins.start(site.app(), names=["docs.example.org"])
    principals = {"fetcher": token_principal(FETCHER_TOKEN, fetch=True)}
    policy = token_policy(origin, principals=principals)
    gateway = gateway_factory(policy)
    generation_before = policy_generation(gateway)

    # Window quotas count in fixed windows of the system's monotonic clock (`clock // 60`, the same
    # clock in this process): the two calls below may fall either side of a minute's end.
    minute_before = time.monotonic() // 60
    caller, outcome = start_held_fetch(gateway, site, origin)
    try:
        # The new policy still allows this principal and host: only the generation changes.
        rewritten = token_policy(origin, principals={**principals, "observer": token_principal(BARE_TOKEN)})
        gateway.write_policy(rewritten)
        deadline = time.monotonic() + RELOAD_WAIT_S
        while policy_generation(gateway) == generation_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert policy_generation(gateway) > generation_before
    finally:
        site.release()
        caller.join(30)

    assert len(outcome) == 1
    dropped = outcome[0]
    assert (dropped.status_code, error_code(dropped)) == (409, "policy_changed"), dropped.text
    assert "content" not in dropped.json()
    # The dropped call still spent its reservation; the next call runs under the new generation.
    again = call(gateway, "fetch", {"url": origin.url("/held")}, FETCHER_TOKEN)
    assert again.status_code == 200, again.text
    spent_in_one_window = {"remaining": 118}
    if time.monotonic() // 60 == minute_before:
        assert again.json()["budget"]["minute"] == spent_in_one_window
    else:  # a new minute began during the test: the dropped call may have counted in the last one
        assert again.json()["budget"]["minute"] in (spent_in_one_window, {"remaining": 119})
