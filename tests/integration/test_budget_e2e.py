"""Budgets end to end: real `egress-gateway serve` processes, a real redis-server, loopback origins.

Two replicas share one Redis and must agree exactly (step budget, concurrency slots); Redis dying
mid-run fails budgeted calls closed and recovers; a restarted gateway keeps a spent step spent;
without Redis the in-memory store counts failed attempts, ignores pre-reservation denials, enforces
the search cooldown and reports `budget` in every result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from tests.conftest import GatewayFactory
from tests.harness.budget_calls import (
    CONCURRENT_FETCHES,
    HoldingSite,
    budgeted_policy,
    concurrent_client,
    error_code,
    fetch,
    new_run,
    outcome_counts,
    serp_app,
    start_fetches,
    step_headers,
)
from tests.harness.dns import FakeDNS
from tests.harness.gateway import GatewayProcess
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.redis_server import RedisServer
from tests.harness.run_tokens import SECRET_ENV, run_token
from tests.harness.windows import MEMORY_CLOCK, wait_for_room_s

# Bounded waits for state another process reaches on its own (the readiness ping loop runs every 2 s).
READINESS_WAIT_S = 10.0
HELD_WAIT_S = 20.0
# Time the four calls that count one minute window exactly may take on a loaded machine.
FOUR_CALLS_WITHIN_S = 10.0


# GatewayProcess picks free ports and releases them before the daemon binds (tests/harness/gateway.py);
# after a burst of 200 client sockets another connection can take one in between. A daemon that
# exits for that reason is started again on fresh ports; any other start failure still fails.


def ids_budget(response: httpx.Response) -> dict[str, Any]:
    """The id-keyed part of a result's `budget` (the window counts move with every call)."""
    budget: dict[str, Any] = response.json()["budget"]
    return {"step": budget["step"], "run": budget["run"]}


def wait_for_readiness(gateway: GatewayProcess, *, ready: bool) -> dict[str, Any]:
    """Waits on the tools' readiness (/readyz/tools), which includes the budget store."""
    deadline = time.monotonic() + READINESS_WAIT_S
    status, body = gateway.readyz("/readyz/tools")
    while (status == 200) != ready and time.monotonic() < deadline:
        time.sleep(0.1)
        status, body = gateway.readyz("/readyz/tools")
    assert (status == 200) == ready, (status, body)
    return body


def start_replicas(gateway_factory: GatewayFactory, policy: Mapping[str, Any], redis_url: str) -> list[GatewayProcess]:
    env = {"EGRESS_REDIS_URL": redis_url, **SECRET_ENV}
    return [gateway_factory(policy, env=env, name=f"replica{i}") for i in range(2)]


# -- two replicas on one Redis ---------------------------------------------------------------


@pytest.mark.serial  # 200 calls at once against 1 s store timeouts: needs the machine to itself
async def test_two_replicas_grant_exactly_the_step_budget_of_200_concurrent_fetches(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop, redis_server: RedisServer
) -> None:
    site = HoldingSite(harness_loop)
    site.release()  # nothing is held here: every granted fetch completes
    origin = origins.start(site.app(), names=["docs.example.org"])
    policy = budgeted_policy(origin, fetch={"per_step": 20, "per_run": 1000, "concurrent": 1000, "min_interval_s": 0})
    replicas = start_replicas(gateway_factory, policy, redis_server.url)
    run_id = new_run()

    async with concurrent_client() as client:
        tasks = start_fetches(client, replicas, origin.url("/article"), step_headers(run_id), CONCURRENT_FETCHES)
        responses = await asyncio.gather(*tasks)

    assert outcome_counts(responses) == {(200, None): 20, (429, "quota_exhausted"): 180}
    # Each grant saw a distinct remaining count: no reservation was lost or counted twice.
    remaining = sorted(r.json()["budget"]["step"]["remaining"] for r in responses if r.status_code == 200)
    assert remaining == list(range(20))
    denied = [r.json()["error"] for r in responses if r.status_code == 429]
    assert all(error["budget"] == "step" for error in denied)
    follow_up = fetch(replicas[1], origin.url("/article"), step_headers(run_id))
    assert error_code(follow_up) == "quota_exhausted"


@pytest.mark.serial  # 200 calls at once against 1 s store timeouts: needs the machine to itself
async def test_two_replicas_hold_exactly_three_concurrency_slots_until_released(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop, redis_server: RedisServer
) -> None:
    site = HoldingSite(harness_loop)
    origin = origins.start(site.app(), names=["docs.example.org"])
    policy = budgeted_policy(origin, fetch={"per_step": 1000, "per_run": 1000, "concurrent": 3, "min_interval_s": 0})
    replicas = start_replicas(gateway_factory, policy, redis_server.url)
    run_id = new_run()

    async with concurrent_client() as client:
        tasks = start_fetches(client, replicas, origin.url("/held"), step_headers(run_id), CONCURRENT_FETCHES)
        try:
            async with asyncio.timeout(HELD_WAIT_S):
                while sum(task.done() for task in tasks) < CONCURRENT_FETCHES - 3 or site.arrived < 3:
                    await asyncio.sleep(0.02)
            refused = [task.result() for task in tasks if task.done()]
            assert outcome_counts(refused) == {(429, "concurrency_limited"): CONCURRENT_FETCHES - 3}
            assert site.arrived == 3
        finally:
            site.release()
        responses = await asyncio.gather(*tasks)

    assert outcome_counts(responses) == {(200, None): 3, (429, "concurrency_limited"): CONCURRENT_FETCHES - 3}
    # Denials cost nothing: only the three grants were counted against the step.
    assert sorted(r.json()["budget"]["step"]["remaining"] for r in responses if r.status_code == 200) == [997, 998, 999]
    # The leases were given back: the next call gets a slot at once.
    after = fetch(replicas[0], origin.url("/held"), step_headers(run_id))
    assert after.status_code == 200, after.text
    assert after.json()["budget"]["step"] == {"remaining": 996}


# -- Redis failure and restarts --------------------------------------------------------------


def test_redis_killed_mid_run_fails_closed_keeps_the_daemon_up_and_recovers(
    gateway_factory: GatewayFactory,
    origins: OriginFactory,
    harness_loop: HarnessLoop,
    private_redis_server: RedisServer,
) -> None:
    site = HoldingSite(harness_loop)
    origin = origins.start(site.app(), names=["docs.example.org"])
    env = {"EGRESS_REDIS_URL": private_redis_server.url, **SECRET_ENV}
    gateway = gateway_factory(budgeted_policy(origin), env=env)
    run_id = new_run()
    before = fetch(gateway, origin.url("/article"), step_headers(run_id))
    assert before.status_code == 200, before.text
    assert before.json()["budget"]["step"] == {"remaining": 39}

    private_redis_server.stop()
    during = [fetch(gateway, origin.url("/article"), step_headers(run_id)) for _ in range(3)]
    for response in during:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "store_unavailable"
        assert response.json()["error"]["retryable"] is True
    assert gateway.process is not None
    assert gateway.process.poll() is None
    assert httpx.get(f"{gateway.admin_url}/healthz", timeout=5).status_code == 200
    body = wait_for_readiness(gateway, ready=False)
    assert body["checks"]["store_reachable"] is False
    assert "store_unavailable" in body["reasons"]["store_reachable"]
    # The proxy does not need the store: its readiness (the Service's probe) stays green.
    proxy_status, proxy_body = gateway.readyz()
    assert proxy_status == 200, proxy_body

    private_redis_server.start()
    wait_for_readiness(gateway, ready=True)
    # The restarted Redis has no persistence, so the step starts over: what matters is that
    # calls are granted again by the same process.
    after = fetch(gateway, origin.url("/article"), step_headers(run_id))
    assert after.status_code == 200, after.text
    assert after.json()["budget"]["step"] == {"remaining": 39}


def test_restarted_gateway_on_the_same_redis_keeps_a_spent_step_spent(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop, redis_server: RedisServer
) -> None:
    site = HoldingSite(harness_loop)
    origin = origins.start(site.app(), names=["docs.example.org"])
    policy = budgeted_policy(origin, fetch={"per_step": 2, "per_run": 10})
    env = {"EGRESS_REDIS_URL": redis_server.url, **SECRET_ENV}
    first = gateway_factory(policy, env=env, name="first")
    run_id = new_run()
    assert [fetch(first, origin.url("/article"), step_headers(run_id)).status_code for _ in range(2)] == [200, 200]
    assert first.stop() == 0

    second = gateway_factory(policy, env=env, name="second")
    retried = fetch(second, origin.url("/article"), step_headers(run_id))
    assert error_code(retried) == "quota_exhausted"
    next_step = fetch(second, origin.url("/article"), step_headers(run_id, "step-2"))
    assert next_step.status_code == 200, next_step.text
    assert ids_budget(next_step) == {"step": {"remaining": 1}, "run": {"remaining": 7}}


# -- memory store (no EGRESS_REDIS_URL) ------------------------------------------------------


def test_memory_store_spends_the_step_then_the_run_through_the_api(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    origin = origins.start(HoldingSite(harness_loop).app(), names=["docs.example.org"])
    gateway = gateway_factory(budgeted_policy(origin, fetch={"per_step": 3, "per_run": 4}), env=SECRET_ENV)
    run_id = new_run()

    step_one = [fetch(gateway, origin.url("/article"), step_headers(run_id)) for _ in range(4)]
    assert [r.status_code for r in step_one] == [200, 200, 200, 429]
    assert [ids_budget(r) for r in step_one[:3]] == [
        {"step": {"remaining": 2}, "run": {"remaining": 3}},
        {"step": {"remaining": 1}, "run": {"remaining": 2}},
        {"step": {"remaining": 0}, "run": {"remaining": 1}},
    ]
    assert step_one[3].json()["error"]["code"] == "quota_exhausted"
    assert step_one[3].json()["error"]["budget"] == "step"

    step_two = [fetch(gateway, origin.url("/article"), step_headers(run_id, "step-2")) for _ in range(2)]
    assert step_two[0].status_code == 200, step_two[0].text
    assert ids_budget(step_two[0]) == {"step": {"remaining": 2}, "run": {"remaining": 0}}
    assert error_code(step_two[1]) == "quota_exhausted"
    assert step_two[1].json()["error"]["budget"] == "run"


def test_memory_store_counts_fetches_that_fail_with_dns_failure(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop, fake_dns: FakeDNS
) -> None:
    origin = origins.start(HoldingSite(harness_loop).app(), names=["docs.example.org"])
    fake_dns.fail("missing.example.org", "NXDOMAIN")
    gateway = gateway_factory(budgeted_policy(origin, fetch={"per_step": 5, "per_run": 50}), env=SECRET_ENV)
    run_id = new_run()

    failed = [fetch(gateway, "https://missing.example.org/page", step_headers(run_id)) for _ in range(2)]
    assert [(r.status_code, error_code(r)) for r in failed] == [(502, "dns_failure")] * 2
    ok = fetch(gateway, origin.url("/article"), step_headers(run_id))
    assert ok.status_code == 200, ok.text
    assert ids_budget(ok) == {"step": {"remaining": 2}, "run": {"remaining": 47}}


def test_memory_store_does_not_count_denials_before_the_reservation(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    origin = origins.start(HoldingSite(harness_loop).app(), names=["docs.example.org"])
    gateway = gateway_factory(budgeted_policy(origin, fetch={"per_step": 5, "per_run": 50}), env=SECRET_ENV)
    run_id = new_run()
    headers = step_headers(run_id)

    denials = [
        fetch(gateway, "", headers, payload={"url": origin.url("/article"), "bogus": 1}),
        fetch(gateway, "", headers, payload={}),
        fetch(gateway, f"https://user:secret@{origin.name}:{origin.port}/article", headers),
        fetch(gateway, "ftp://docs.example.org/file", headers),
        fetch(gateway, origin.url("/article"), {"X-Egress-Run": run_id, "X-Egress-Step": "has space"}),
    ]
    assert [error_code(r) for r in denials] == [
        "invalid_input",
        "invalid_input",
        "unsafe_url",
        "unsafe_url",
        "invalid_input",
    ]
    ok = fetch(gateway, origin.url("/article"), headers)
    assert ok.status_code == 200, ok.text
    assert ids_budget(ok) == {"step": {"remaining": 4}, "run": {"remaining": 49}}


def test_memory_store_does_not_count_a_policy_denied_destination(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    origin = origins.start(HoldingSite(harness_loop).app(), names=["docs.example.org", "blocked.example.org"])
    policy = budgeted_policy(origin, fetch={"per_step": 5, "per_run": 50}, deny_domains=["blocked.example.org"])
    gateway = gateway_factory(policy, env=SECRET_ENV)
    run_id = new_run()

    denied = fetch(gateway, origin.url("/article", name="blocked.example.org"), step_headers(run_id))
    assert error_code(denied) == "policy_denied"
    ok = fetch(gateway, origin.url("/article"), step_headers(run_id))
    assert ok.status_code == 200, ok.text
    assert ids_budget(ok) == {"step": {"remaining": 4}, "run": {"remaining": 49}}


def test_memory_store_refuses_a_search_started_within_min_interval_with_cooldown(
    gateway_factory: GatewayFactory, origins: OriginFactory
) -> None:
    engine = origins.start(serp_app(), names=["html.duckduckgo.com"])
    policy = budgeted_policy(engine, search={"per_step": 10, "per_run": 10, "concurrent": 1, "min_interval_s": 60})
    gateway = gateway_factory(policy, env={"EGRESS_SEARCH_DUCKDUCKGO_URL": engine.url("/html/"), **SECRET_ENV})
    run_id = new_run()

    def search(query: str) -> httpx.Response:
        return httpx.post(
            f"{gateway.api_url}/v1/search", json={"query": query}, headers=step_headers(run_id), timeout=20
        )

    first = search("rust async")
    assert first.status_code == 200, first.text
    assert first.json()["results"]
    assert ids_budget(first) == {"step": {"remaining": 9}, "run": {"remaining": 9}}
    second = search("rust tokio")
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "cooldown"
    assert second.json()["error"]["retryable"] is True
    assert 1 <= int(second.headers["Retry-After"]) <= 60
    # The refused start cost nothing and did not restart the interval; fetch has no interval.
    third = search("rust tokio")
    assert error_code(third) == "cooldown"
    assert int(third.headers["Retry-After"]) <= int(second.headers["Retry-After"])


def test_every_result_carries_budget_with_null_for_an_unvouched_id(
    gateway_factory: GatewayFactory, origins: OriginFactory, harness_loop: HarnessLoop
) -> None:
    origin = origins.start(HoldingSite(harness_loop).app(), names=["docs.example.org"])
    gateway = gateway_factory(budgeted_policy(origin), env=SECRET_ENV)
    run_id = new_run()
    # The minute counts below are exact: all four calls in one window (a clean-clone run that
    # crossed a minute's end saw `remaining` 119 twice).
    time.sleep(wait_for_room_s(FOUR_CALLS_WITHIN_S, MEMORY_CLOCK))

    no_ids = fetch(gateway, origin.url("/article"))
    # The agent's own headers vouch for nothing: only the windows count.
    unvouched = fetch(gateway, origin.url("/article"), {"X-Egress-Run": run_id, "X-Egress-Step": "s"})
    run_only = fetch(gateway, origin.url("/article"), {"X-Egress-Run-Token": run_token(run_id)})
    both = fetch(gateway, origin.url("/article"), step_headers(run_id))
    assert [r.status_code for r in (no_ids, unvouched, run_only, both)] == [200, 200, 200, 200]
    windows = {"hour": {"remaining": 999}, "day": {"remaining": 4999}}
    assert no_ids.json()["budget"] == {"step": None, "run": None, "minute": {"remaining": 119}, **windows}
    assert unvouched.json()["budget"]["step"] is None
    assert unvouched.json()["budget"]["run"] is None
    assert unvouched.json()["budget"]["minute"] == {"remaining": 118}
    assert run_only.json()["budget"]["step"] is None
    assert run_only.json()["budget"]["run"] == {"remaining": 199}
    assert both.json()["budget"]["step"] == {"remaining": 39}
    assert both.json()["budget"]["run"] == {"remaining": 198}
    assert both.json()["budget"]["minute"] == {"remaining": 116}
