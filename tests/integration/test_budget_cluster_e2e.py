"""Budgets on a three-node Redis Cluster (issue 17), through two real gateway replicas.

Every key of one principal carries the same hash tag, so the reservation script runs atomically
on the node that owns the slot: 200 concurrent calls spread over two replicas are granted exactly
the budget, for a vouched step and for a window quota alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest

from tests.conftest import GatewayFactory
from tests.harness.budget_calls import (
    CONCURRENT_FETCHES,
    HoldingSite,
    budgeted_policy,
    concurrent_client,
    new_run,
    outcome_counts,
    start_fetches,
    step_headers,
)
from tests.harness.origins import HarnessLoop, OriginFactory
from tests.harness.redis_topologies import ClusterNodes
from tests.harness.run_tokens import SECRET_ENV, run_token
from tests.harness.windows import REDIS_CLOCK, room_in_the_minute

BUDGET = 20
# Time the 200 fetches may take on a loaded machine, all inside one minute window.
FETCHES_WITHIN_S = 15.0


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.serial  # 200 calls at once against 1 s store timeouts: needs the machine to itself
@pytest.mark.parametrize("budget", ["step", "minute"])
async def test_two_replicas_on_a_cluster_grant_exactly_the_budget_of_200_concurrent_fetches(
    gateway_factory: GatewayFactory,
    origins: OriginFactory,
    harness_loop: HarnessLoop,
    redis_cluster: ClusterNodes,
    budget: str,
) -> None:
    site = HoldingSite(harness_loop)
    site.release()
    origin = origins.start(site.app(), names=["docs.example.org"])
    limits = {"per_step": 1000, "per_run": 1000, "concurrent": 1000, "min_interval_s": 0, "per_minute": 1000}
    limits["per_step" if budget == "step" else "per_minute"] = BUDGET
    policy = budgeted_policy(origin, fetch=limits)
    # A principal of this test's own: window counts are the principal's, and the session cluster
    # is shared by every test.
    name, token = f"agent-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    policy["principals"] = {name: {**policy["principals"]["default"], "token_sha256": _sha(token)}}
    env = {"EGRESS_REDIS_URL": redis_cluster.url, **SECRET_ENV}
    replicas = [gateway_factory(policy, env=env, name=f"cluster-replica{i}") for i in range(2)]
    headers = {"Authorization": f"Bearer {token}"}
    if budget == "step":
        headers.update(step_headers(new_run()))
        headers["X-Egress-Run-Token"] = run_token(new_run(), principal=name)
    else:
        # No run token: nothing but the principal's window counts these calls.
        await room_in_the_minute(FETCHES_WITHIN_S, REDIS_CLOCK)

    async with concurrent_client() as client:
        tasks = start_fetches(client, replicas, origin.url("/article"), headers, CONCURRENT_FETCHES)
        responses = await asyncio.gather(*tasks)

    assert outcome_counts(responses) == {(200, None): BUDGET, (429, "quota_exhausted"): CONCURRENT_FETCHES - BUDGET}
    remaining = sorted(r.json()["budget"][budget]["remaining"] for r in responses if r.status_code == 200)
    assert remaining == list(range(BUDGET))
    assert {r.json()["error"]["budget"] for r in responses if r.status_code == 429} == {budget}
