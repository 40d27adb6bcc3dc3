"""Budgets an agent cannot reset (issue 12), through real `egress-gateway serve` processes.

A hostile agent that rotates `X-Egress-Run` / `X-Egress-Step` ids (or sends none) is stopped by
its window quota; only an orchestrator, with its own credential, can mint the run tokens that make
ids count; a forged, expired, foreign or contradicted token is refused with `invalid_run_token`
and costs nothing; the number of live ids per principal is bounded.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx
from aiohttp import web

from tests.conftest import GatewayFactory
from tests.harness.gateway import GatewayProcess, policy_document
from tests.harness.origins import Origin, OriginFactory
from tests.harness.run_tokens import SECRET_ENV, TEST_ORCHESTRATORS, mint, run_token
from tests.harness.windows import MEMORY_CLOCK, wait_for_room_s

ARTICLE = "<html><head><title>Quota</title></head><body><article><h1>Quota</h1><p>Counted.</p></article></body></html>"
ALICE_TOKEN = "alice-agent-token-0001"
BOB_TOKEN = "bob-agent-token-0002"
EXPIRY_WAIT_S = 10.0
# Time the minute-quota test's calls may take on a loaded machine, all inside one window.
WINDOW_CALLS_WITHIN_S = 10.0


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def site() -> web.Application:
    async def article(request: web.Request) -> web.Response:
        return web.Response(text=ARTICLE, content_type="text/html")

    async def robots(request: web.Request) -> web.Response:
        return web.Response(status=404, text="none")

    app = web.Application()
    app.router.add_get("/article", article)
    app.router.add_get("/robots.txt", robots)
    return app


def agents_policy(origin: Origin, fetch: Mapping[str, Any], orchestrators: Mapping[str, Any] | None = None) -> Any:
    agent = {"egress": {"allow_domains": ["*"]}, "tools": {"search": True, "fetch": True}, "budgets": {"fetch": fetch}}
    return policy_document(
        allow_cidrs=[origin.cidr],
        ports=[80, 443, origin.port],
        principals={
            "alice": {"token_sha256": _sha(ALICE_TOKEN), **agent},
            "bob": {"token_sha256": _sha(BOB_TOKEN), **agent},
        },
        orchestrators=dict(orchestrators if orchestrators is not None else TEST_ORCHESTRATORS),
    )


def fetch(gateway: GatewayProcess, url: str, agent_token: str, **headers: str) -> httpx.Response:
    sent = {"Authorization": f"Bearer {agent_token}", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.post(f"{gateway.api_url}/v1/fetch", json={"url": url}, headers=sent, timeout=20)


def code(response: httpx.Response) -> str | None:
    if response.status_code == 200:
        return None
    value: str = response.json()["error"]["code"]
    assert response.headers["X-Egress-Code"] == value
    return value


def test_an_agent_rotating_run_and_step_ids_is_stopped_by_its_minute_quota(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(site(), names=["docs.example.org"])
    fetch_budget = {"per_step": 1000, "per_run": 1000, "per_minute": 5}
    gateway = gateway_factory(agents_policy(origin, fetch_budget), env=SECRET_ENV)
    url = origin.url("/article")
    time.sleep(wait_for_room_s(WINDOW_CALLS_WITHIN_S, MEMORY_CLOCK))

    # Every call a fresh run and step, as a prompt-injected agent would try: a fresh budget each
    # time under the old design.
    responses = [
        fetch(gateway, url, ALICE_TOKEN, X_Egress_Run=f"run-{uuid.uuid4().hex}", X_Egress_Step=f"s{i}")
        for i in range(5)
    ]
    assert [r.status_code for r in responses] == [200] * 5
    assert [r.json()["budget"]["minute"]["remaining"] for r in responses] == [4, 3, 2, 1, 0]
    assert all(r.json()["budget"]["run"] is None for r in responses)

    for headers in ({"X_Egress_Run": "yet-another-run"}, {}, {"X_Egress_Step": "new-step"}):
        refused = fetch(gateway, url, ALICE_TOKEN, **headers)
        assert refused.status_code == 429, refused.text
        assert code(refused) == "quota_exhausted"
        assert refused.json()["error"]["budget"] == "minute"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # A vouched run does not lift the window either: windows come before any id budget.
    vouched = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=run_token("real-run", principal="alice"))
    assert code(vouched) == "quota_exhausted"
    assert vouched.json()["error"]["budget"] == "minute"
    # The quota is alice's: bob is untouched.
    assert fetch(gateway, url, BOB_TOKEN).status_code == 200


def test_only_an_orchestrator_mints_run_tokens_and_they_make_ids_count(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(site(), names=["docs.example.org"])
    orchestrators = {
        **TEST_ORCHESTRATORS,
        "bob-only": {"token_sha256": _sha("bob-only-orchestrator-token"), "principals": ["bob"], "max_ttl_s": 60},
    }
    gateway = gateway_factory(agents_policy(origin, {"per_step": 10, "per_run": 10}, orchestrators))
    url = origin.url("/article")

    # An agent's own credential is not an orchestrator's.
    as_agent = mint(gateway.api_url, {"principal": "alice", "run": "r1"}, token=ALICE_TOKEN)
    assert (as_agent.status_code, code(as_agent)) == (401, "auth_required")
    no_credential = httpx.post(f"{gateway.api_url}/v1/runs", json={"principal": "alice", "run": "r1"}, timeout=10)
    assert code(no_credential) == "auth_required"
    not_for_alice = mint(gateway.api_url, {"principal": "alice", "run": "r1"}, token="bob-only-orchestrator-token")
    assert (not_for_alice.status_code, code(not_for_alice)) == (403, "policy_denied")
    bob_only = "bob-only-orchestrator-token"
    too_long = mint(gateway.api_url, {"principal": "bob", "run": "r1", "ttl_s": 3600}, token=bob_only)
    assert code(too_long) == "invalid_input"
    # Without ttl_s the default hour is clamped to the orchestrator's 60 s cap, not refused.
    unnamed_ttl = mint(gateway.api_url, {"principal": "bob", "run": "r1"}, token=bob_only)
    assert unnamed_ttl.status_code == 200, unnamed_ttl.text
    expires_in_s = datetime.fromisoformat(unnamed_ttl.json()["expiresAt"]).timestamp() - time.time()
    assert 0 < expires_in_s <= 60
    for bad in ({"principal": "nobody", "run": "r1"}, {"principal": "alice"}, {"principal": "alice", "run": "a b"}):
        assert code(mint(gateway.api_url, bad)) == "invalid_input"

    minted = mint(
        gateway.api_url, {"principal": "alice", "run": "run-42", "ttl_s": 600, "limits": {"fetch": {"per_run": 2}}}
    )
    assert minted.status_code == 200, minted.text
    body = minted.json()
    assert (body["principal"], body["run"], body["step"]) == ("alice", "run-42", None)
    assert body["expiresAt"].endswith("Z")
    token = body["token"]

    first = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=token, X_Egress_Step="a")
    second = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=token, X_Egress_Step="b", X_Egress_Run="run-42")
    assert [r.status_code for r in (first, second)] == [200, 200]
    assert [r.json()["budget"]["run"] for r in (first, second)] == [{"remaining": 1}, {"remaining": 0}]
    assert first.json()["budget"]["step"] == {"remaining": 9}
    # The token lowered per_run to 2: a new step id does not get around it.
    third = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=token, X_Egress_Step="c")
    assert code(third) == "quota_exhausted"
    assert third.json()["error"]["budget"] == "run"

    audit = [line for line in gateway.audit_lines() if line.get("kind") == "run_token"]
    assert [line["decision"] for line in audit].count("allow") == 2
    assert all(token not in str(line) for line in gateway.audit_lines())


def test_forged_expired_foreign_and_contradicted_run_tokens_are_refused_and_cost_nothing(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(site(), names=["docs.example.org"])
    gateway = gateway_factory(agents_policy(origin, {"per_minute": 100}), env=SECRET_ENV)
    url = origin.url("/article")
    good = run_token("run-1", principal="alice")
    payload, signature = good.split(".")[1:]
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    # The last assertion counts one minute window exactly, across the expiry wait.
    time.sleep(wait_for_room_s(EXPIRY_WAIT_S + WINDOW_CALLS_WITHIN_S, MEMORY_CLOCK))

    short_lived = mint(gateway.api_url, {"principal": "alice", "run": "run-short", "ttl_s": 1}).json()["token"]
    refusals = {
        "forged-signature": {"X_Egress_Run_Token": f"egr1.{payload}.{flipped}"},
        "other-secret": {"X_Egress_Run_Token": run_token("run-1", principal="alice", secret="another-secret-" * 3)},
        "other-principal": {"X_Egress_Run_Token": run_token("run-1", principal="bob")},
        "unknown-orchestrator": {"X_Egress_Run_Token": run_token("run-1", principal="alice", orchestrator="rogue")},
        "garbage": {"X_Egress_Run_Token": "not-a-token"},
        "run-header-differs": {"X_Egress_Run_Token": good, "X_Egress_Run": "run-2"},
        "step-header-differs": {
            "X_Egress_Run_Token": run_token("run-1", principal="alice", step_id="s1"),
            "X_Egress_Step": "s2",
        },
    }
    for case, headers in refusals.items():
        response = fetch(gateway, url, ALICE_TOKEN, **headers)
        assert (response.status_code, code(response)) == (403, "invalid_run_token"), case
        assert response.json()["error"]["retryable"] is False, case

    deadline = time.monotonic() + EXPIRY_WAIT_S
    granted_while_valid = 0
    expired = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=short_lived)
    while expired.status_code == 200 and time.monotonic() < deadline:
        granted_while_valid += 1
        time.sleep(0.2)
        expired = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=short_lived)
    assert code(expired) == "invalid_run_token"
    assert "expired" in expired.json()["error"]["message"]

    # None of the refusals was counted: the window has spent only the granted calls.
    accepted = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=good)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["budget"]["minute"]["remaining"] == 100 - granted_while_valid - 1


def test_the_number_of_live_run_ids_per_principal_is_bounded(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    origin = origins.start(site(), names=["docs.example.org"])
    gateway = gateway_factory(agents_policy(origin, {"max_live_ids": 3}), env=SECRET_ENV)
    url = origin.url("/article")

    for run_id in ("r1", "r2", "r3"):
        ok = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=run_token(run_id, principal="alice"))
        assert ok.status_code == 200, ok.text
    fourth = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=run_token("r4", principal="alice"))
    assert code(fourth) == "quota_exhausted"
    assert fourth.json()["error"]["budget"] == "live_ids"
    # A step is an id too; live runs keep working, and calls without ids are not affected.
    step = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=run_token("r1", principal="alice"), X_Egress_Step="s")
    assert code(step) == "quota_exhausted"
    again = fetch(gateway, url, ALICE_TOKEN, X_Egress_Run_Token=run_token("r2", principal="alice"))
    assert again.status_code == 200
    assert again.json()["budget"]["run"] == {"remaining": 198}
    assert fetch(gateway, url, ALICE_TOKEN).status_code == 200
    # Bob's ids are his own.
    assert fetch(gateway, url, BOB_TOKEN, X_Egress_Run_Token=run_token("r4", principal="bob")).status_code == 200
