"""Budgets on Redis Sentinel (issue 17): one primary, one replica, three sentinels, all real.

A reservation that no replica acknowledges is refused with `store_unavailable` when the gateway
asks for `EGRESS_REDIS_MIN_REPLICAS`; and a gateway process whose primary is killed mid-run
fails closed during the failover, recovers by itself once the sentinels promote the replica, and
never grants more than the budget across the failover. The failover test kills the module's
primary, so it runs last here.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from gateway.budget import RedisBudgetStore, Reservation, ToolLimits
from gateway.errors import ErrorCode, GatewayError
from tests.conftest import GatewayFactory
from tests.harness.budget_calls import HoldingSite, budgeted_policy, error_code, fetch
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.redis_topologies import FAILOVER_TIMEOUT_S, SentinelGroup
from tests.harness.run_tokens import SECRET_ENV, run_token

STEP_BUDGET = 30
CALLS_BEFORE_KILL = 10


async def test_a_reservation_no_replica_acknowledges_is_refused(redis_sentinel: SentinelGroup) -> None:
    store = RedisBudgetStore(redis_sentinel.url, namespace=f"wait{uuid.uuid4().hex[:8]}", min_replicas=1)
    lim = ToolLimits(per_step=5, per_run=5, concurrent=1, min_interval_s=0.0)

    async def reserve() -> Reservation:
        return await store.reserve(principal="agent", tool="fetch", run_id="r", step_id="s", limits=lim)

    try:
        granted = await reserve()
        await store.release(granted)
        redis_sentinel.replica.pause()
        try:
            with pytest.raises(GatewayError) as caught:
                await reserve()
        finally:
            redis_sentinel.replica.resume()
        assert caught.value.code is ErrorCode.STORE_UNAVAILABLE
        assert "replicas acknowledged" in caught.value.message
        redis_sentinel.wait_replica_in_sync()
        # The refused reservation gave its concurrency slot back (concurrent is 1) and stayed
        # counted (a failover could not forget it and grant it twice): 5 - 2 - 1 left.
        after = await reserve()
        assert after.remaining_step == 2
    finally:
        await store.close()


def test_a_primary_killed_mid_run_fails_closed_then_recovers_without_over_spending(
    gateway_factory: GatewayFactory,
    origins: OriginFactory,
    harness_loop: HarnessLoop,
    redis_sentinel: SentinelGroup,
) -> None:
    site = HoldingSite(harness_loop)
    site.release()
    origin = origins.start(site.app(), names=["docs.example.org"])
    policy = budgeted_policy(origin, fetch={"per_step": STEP_BUDGET, "per_run": 1000})
    gateway = gateway_factory(policy, env={"EGRESS_REDIS_URL": redis_sentinel.url, **SECRET_ENV})
    headers = {"X-Egress-Run-Token": run_token(f"run-{uuid.uuid4().hex}"), "X-Egress-Step": "step-1"}
    url = origin.url("/article")

    before = [fetch(gateway, url, headers) for _ in range(CALLS_BEFORE_KILL)]
    assert [r.status_code for r in before] == [200] * CALLS_BEFORE_KILL
    old_primary = redis_sentinel.primary.port

    redis_sentinel.primary.kill()
    during: list[httpx.Response] = []
    deadline = time.monotonic() + FAILOVER_TIMEOUT_S
    while time.monotonic() < deadline:
        response = fetch(gateway, url, headers)
        if response.status_code == 200:
            break
        during.append(response)
        time.sleep(0.05)
    else:
        pytest.fail(f"calls did not recover within {FAILOVER_TIMEOUT_S} s")
    assert during, "the failover was not observed: no call failed while the primary was gone"
    assert {(r.status_code, error_code(r)) for r in during} == {(503, "store_unavailable")}
    assert all(r.json()["error"]["retryable"] for r in during)
    assert gateway.process is not None
    assert gateway.process.poll() is None
    # The sentinel that led the failover can answer before the others have taken in the new
    # primary's announcement; until they agree, primary_port() is None. Bounded wait for that.
    deadline = time.monotonic() + 10
    while (new_primary := redis_sentinel.primary_port()) in (None, old_primary) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert new_primary not in (None, old_primary)

    # Spend the rest: the budget holds exactly across the failover, none granted twice or lost.
    granted_after = 1
    while True:
        response = fetch(gateway, url, headers)
        if response.status_code != 200:
            break
        granted_after += 1
        assert granted_after <= STEP_BUDGET, "over-spent across the failover"
    assert error_code(response) == "quota_exhausted"
    assert CALLS_BEFORE_KILL + granted_after == STEP_BUDGET
