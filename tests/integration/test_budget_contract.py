"""The budget store contract, run against both stores (memory, and a real redis-server).

Every test in the first part takes the `store` fixture, parametrized "memory" and "redis", so the
two implementations are held to one behaviour. The Redis-only part covers what only a shared
store has: atomicity across independent clients (stand-ins for replicas), surviving a gateway
restart, failing closed while Redis is down and recovering after, and TTLs on every key.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from gateway.budget import (
    BudgetStore,
    MemoryBudgetStore,
    RedisBudgetStore,
    Reservation,
    ToolLimits,
    open_store,
)
from gateway.errors import ErrorCode, GatewayError
from tests.harness.windows import MEMORY_CLOCK, REDIS_CLOCK, room_in_the_minute

if TYPE_CHECKING:
    from tests.harness.redis_server import RedisServer
    from tests.harness.redis_topologies import ClusterNodes, TlsRedis

# The fixtures come from the plugins the root conftest loads (tests.harness.redis_server and
# redis_topologies); imported here for types only.

# Generous bounds on waits that poll for a state change; they bound a hang, they do not time it.
SETTLE_DEADLINE_S = 5.0

ROOMY = ToolLimits(per_step=1000, per_run=1000, concurrent=1000, min_interval_s=0.0)
# Time a window test's calls may take on a loaded machine, all inside one minute window.
WINDOW_CALLS_WITHIN_S = 5.0


def window_clock(store: BudgetStore) -> Callable[[], float]:
    return MEMORY_CLOCK if isinstance(store, MemoryBudgetStore) else REDIS_CLOCK


def limits(**changes: Any) -> ToolLimits:
    fields: dict[str, Any] = {
        "per_step": ROOMY.per_step,
        "per_run": ROOMY.per_run,
        "concurrent": ROOMY.concurrent,
        "min_interval_s": ROOMY.min_interval_s,
        "lease_ttl_s": ROOMY.lease_ttl_s,
    }
    fields.update(changes)
    return ToolLimits(**fields)


@pytest.fixture
def namespace() -> str:
    # Tests share one session redis-server; a namespace each keeps their keys apart.
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory", "redis", "redis-cluster", "redis-tls"])
async def store(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[BudgetStore]:
    """Each store under the one contract: memory, one server, a three-node cluster (every key of a
    principal in one slot, so the script stays atomic) and a TLS-only server (`rediss://`)."""
    opened: BudgetStore
    if request.param == "memory":
        opened = MemoryBudgetStore()
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        opened = RedisBudgetStore(server.url, namespace=namespace)
    elif request.param == "redis-cluster":
        cluster: ClusterNodes = request.getfixturevalue("redis_cluster")
        opened = RedisBudgetStore(cluster.url, namespace=namespace)
    else:
        tls: TlsRedis = request.getfixturevalue("redis_tls")
        opened = RedisBudgetStore(tls.url, namespace=namespace, ca_bundle=str(tls.ca_path))
    yield opened
    await opened.close()


async def reserve(
    store: BudgetStore,
    lim: ToolLimits,
    *,
    principal: str = "agent",
    tool: str = "fetch",
    run_id: str | None = "run-1",
    step_id: str | None = "step-1",
    id_ttl_s: float | None = None,
) -> Reservation:
    return await store.reserve(
        principal=principal, tool=tool, run_id=run_id, step_id=step_id, limits=lim, id_ttl_s=id_ttl_s
    )


async def denial(awaitable: Awaitable[object]) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await awaitable
    return caught.value


async def eventually_reserve(call: Callable[[], Awaitable[Reservation]]) -> Reservation:
    """Poll until a denial clears (lease expiry, cooldown) or the deadline fails the test."""
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        try:
            return await call()
        except GatewayError as exc:
            if exc.code is ErrorCode.QUOTA_EXHAUSTED or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


# -- the contract, both stores ---------------------------------------------------------------


async def test_step_budget_is_exhausted_after_per_step_reservations(store: BudgetStore) -> None:
    lim = limits(per_step=3)
    for expected_left in (2, 1, 0):
        granted = await reserve(store, lim)
        assert granted.remaining_step == expected_left
        await store.release(granted)

    error = await denial(reserve(store, lim))
    assert error.code is ErrorCode.QUOTA_EXHAUSTED
    assert error.extra == {"budget": "step"}
    assert "step" in error.message
    # Another step of the same run has its own step budget.
    await reserve(store, lim, step_id="step-2")


async def test_run_budget_is_shared_by_the_steps_of_the_run(store: BudgetStore) -> None:
    lim = limits(per_step=10, per_run=4)
    for step in ("a", "a", "b", "b"):
        await store.release(await reserve(store, lim, step_id=step))

    error = await denial(reserve(store, lim, step_id="c"))
    assert error.code is ErrorCode.QUOTA_EXHAUSTED
    assert error.extra == {"budget": "run"}
    # A call without a step id still counts against (and is stopped by) its run.
    error = await denial(reserve(store, lim, step_id=None))
    assert error.extra == {"budget": "run"}
    await reserve(store, lim, run_id="run-2", step_id="c")


async def test_failed_attempts_count_after_release(store: BudgetStore) -> None:
    lim = limits(per_step=5, per_run=7)
    for _ in range(3):
        # reserve then release without success: a failed, cancelled or timed-out attempt
        await store.release(await reserve(store, lim))

    counts = await store.counts(principal="agent", tool="fetch", run_id="run-1", step_id="step-1", limits=lim)
    assert (counts.remaining_step, counts.remaining_run) == (2, 4)


async def test_releasing_twice_is_harmless(store: BudgetStore) -> None:
    lim = limits(concurrent=1)
    granted = await reserve(store, lim)
    await store.release(granted)
    await store.release(granted)
    await store.release(await reserve(store, lim))


async def test_concurrency_denial_consumes_nothing(store: BudgetStore) -> None:
    lim = limits(per_step=5, per_run=5, concurrent=1)
    held = await reserve(store, lim)
    for _ in range(3):
        error = await denial(reserve(store, lim))
        assert error.code is ErrorCode.CONCURRENCY_LIMITED
        assert error.retryable

    counts = await store.counts(principal="agent", tool="fetch", run_id="run-1", step_id="step-1", limits=lim)
    assert (counts.remaining_step, counts.remaining_run) == (4, 4)
    await store.release(held)
    assert (await reserve(store, lim)).remaining_step == 3


async def test_cooldown_denial_consumes_nothing_and_does_not_restart_the_interval(
    store: BudgetStore,
) -> None:
    lim = limits(per_step=5, per_run=5, min_interval_s=0.4)
    await store.release(await reserve(store, lim))
    error = await denial(reserve(store, lim))
    assert error.code is ErrorCode.COOLDOWN

    counts = await store.counts(principal="agent", tool="fetch", run_id="run-1", step_id="step-1", limits=lim)
    assert (counts.remaining_step, counts.remaining_run) == (4, 4)
    # Had denials restarted the interval, this polling would never get through.
    granted = await eventually_reserve(lambda: reserve(store, lim))
    assert granted.remaining_step == 3


async def test_quota_denial_consumes_nothing(store: BudgetStore) -> None:
    lim = limits(per_step=1, per_run=3)
    await store.release(await reserve(store, lim))
    for _ in range(3):
        assert (await denial(reserve(store, lim))).code is ErrorCode.QUOTA_EXHAUSTED
    # The step denials did not leak into the run counter.
    counts = await store.counts(principal="agent", tool="fetch", run_id="run-1", step_id="step-1", limits=lim)
    assert (counts.remaining_step, counts.remaining_run) == (0, 2)


async def test_unreleased_lease_expires_after_lease_ttl(store: BudgetStore) -> None:
    lim = limits(concurrent=1, lease_ttl_s=0.3)
    crashed = await reserve(store, lim)  # never released: its worker "crashed"
    assert (await denial(reserve(store, lim))).code is ErrorCode.CONCURRENCY_LIMITED

    granted = await eventually_reserve(lambda: reserve(store, lim))
    assert granted.lease_id != crashed.lease_id
    assert (await denial(reserve(store, lim))).code is ErrorCode.CONCURRENCY_LIMITED


async def test_cooldown_names_a_retry_after_within_the_interval(store: BudgetStore) -> None:
    lim = limits(min_interval_s=0.5)
    await store.release(await reserve(store, lim, tool="search"))

    error = await denial(reserve(store, lim, tool="search"))
    assert error.code is ErrorCode.COOLDOWN
    assert error.retryable
    assert error.retry_after_s is not None
    assert 0 < error.retry_after_s <= 0.5
    # The interval is per tool: fetch is not cooling down.
    await reserve(store, lim, tool="fetch")
    await eventually_reserve(lambda: reserve(store, lim, tool="search"))


async def test_counts_report_remaining_step_and_run(store: BudgetStore) -> None:
    lim = limits(per_step=20, per_run=100)
    fresh = await store.counts(principal="agent", tool="search", run_id="run-1", step_id="step-1", limits=lim)
    assert fresh.to_json() == {"step": {"remaining": 20}, "run": {"remaining": 100}}

    granted = await reserve(store, lim, tool="search")
    assert granted.counts.to_json() == {"step": {"remaining": 19}, "run": {"remaining": 99}}
    await store.release(granted)
    after = await store.counts(principal="agent", tool="search", run_id="run-1", step_id="step-1", limits=lim)
    assert after == granted.counts

    # Without ids, the budgets do not apply: null, not a number.
    no_ids = await reserve(store, lim, tool="search", run_id=None, step_id=None)
    assert no_ids.counts.to_json() == {"step": None, "run": None}
    unscoped = await store.counts(principal="agent", tool="search", run_id=None, step_id=None, limits=lim)
    assert unscoped.to_json() == {"step": None, "run": None}


async def test_counts_follow_the_limits_of_a_reloaded_policy(store: BudgetStore) -> None:
    await store.release(await reserve(store, limits(per_step=5, per_run=5)))
    await store.release(await reserve(store, limits(per_step=5, per_run=5)))
    smaller = limits(per_step=1, per_run=1)
    counts = await store.counts(principal="agent", tool="fetch", run_id="run-1", step_id="step-1", limits=smaller)
    assert (counts.remaining_step, counts.remaining_run) == (0, 0)
    assert (await denial(reserve(store, smaller))).code is ErrorCode.QUOTA_EXHAUSTED


async def test_principals_and_tools_have_separate_budgets(store: BudgetStore) -> None:
    lim = limits(per_step=1, per_run=1, concurrent=1)
    await reserve(store, lim, principal="alice")
    assert (await denial(reserve(store, lim, principal="alice"))).code in {
        ErrorCode.CONCURRENCY_LIMITED,
        ErrorCode.QUOTA_EXHAUSTED,
    }
    # Same run and step ids, another principal: its own budget and its own slots.
    bob = await reserve(store, lim, principal="bob")
    assert (bob.remaining_step, bob.remaining_run) == (0, 0)
    # Same principal, other tool: separate too.
    await reserve(store, lim, principal="alice", tool="search")


async def test_a_retried_step_does_not_get_a_fresh_budget(store: BudgetStore) -> None:
    lim = limits(per_step=2)
    for _ in range(2):
        await store.release(await reserve(store, lim))
    for _ in range(3):  # the agent retries the same step key
        assert (await denial(reserve(store, lim))).code is ErrorCode.QUOTA_EXHAUSTED


async def test_rotating_run_and_step_ids_is_still_stopped_by_the_minute_window(store: BudgetStore) -> None:
    await room_in_the_minute(WINDOW_CALLS_WITHIN_S, window_clock(store))
    lim = limits(per_minute=3)
    for i in range(3):
        granted = await reserve(store, lim, run_id=f"fresh-run-{i}", step_id=f"fresh-step-{i}")
        assert granted.counts.to_json()["minute"] == {"remaining": 2 - i}
    for run_id, step_id in (("fresh-run-9", "s"), (None, None), ("run-x", None)):
        error = await denial(reserve(store, lim, run_id=run_id, step_id=step_id))
        assert error.code is ErrorCode.QUOTA_EXHAUSTED
        assert error.extra == {"budget": "minute"}
        assert error.retry_after_s is not None
        assert 0 < error.retry_after_s <= 60
    # The window is the principal's and the tool's: another principal and another tool are free.
    await reserve(store, lim, principal="other-agent")
    await reserve(store, lim, tool="search")


@pytest.mark.parametrize("window", ["minute", "hour", "day"])
async def test_each_window_is_enforced_before_the_step_and_run_budgets(store: BudgetStore, window: str) -> None:
    await room_in_the_minute(WINDOW_CALLS_WITHIN_S, window_clock(store))
    lim = limits(per_step=1, per_run=1, **{f"per_{window}": 1})
    await reserve(store, lim)
    # Step, run and window are all spent: the window answers first.
    error = await denial(reserve(store, lim))
    assert error.extra == {"budget": window}


async def test_a_denial_costs_no_window_quota(store: BudgetStore) -> None:
    await room_in_the_minute(WINDOW_CALLS_WITHIN_S, window_clock(store))
    lim = limits(per_minute=3, per_step=1)
    await reserve(store, lim)
    for _ in range(3):
        assert (await denial(reserve(store, lim))).extra == {"budget": "step"}
    assert (await reserve(store, lim, step_id="step-2")).counts.to_json()["minute"] == {"remaining": 1}
    assert (await reserve(store, lim, step_id="step-3")).counts.to_json()["minute"] == {"remaining": 0}
    assert (await denial(reserve(store, lim, step_id="step-4"))).extra == {"budget": "minute"}


async def test_the_number_of_live_ids_per_principal_and_tool_is_bounded(store: BudgetStore) -> None:
    lim = limits(max_live_ids=3)
    await reserve(store, lim, run_id="r1", step_id="s1")  # two ids: the run and its step
    await reserve(store, lim, run_id="r1", step_id="s2")  # one more
    error = await denial(reserve(store, lim, run_id="r1", step_id="s3"))
    assert error.code is ErrorCode.QUOTA_EXHAUSTED
    assert error.extra == {"budget": "live_ids"}
    assert (await denial(reserve(store, lim, run_id="r2", step_id=None))).extra == {"budget": "live_ids"}
    # Live ids keep working, and a call without ids is not affected.
    await reserve(store, lim, run_id="r1", step_id="s1")
    await reserve(store, lim, run_id="r1", step_id=None)
    await reserve(store, lim, run_id=None, step_id=None)
    # The bound is per principal.
    await reserve(store, lim, principal="other-agent", run_id="r2", step_id="s1")


async def test_ids_and_their_counters_are_forgotten_when_their_ttl_passes(store: BudgetStore) -> None:
    lim = limits(max_live_ids=2, per_step=1)
    await reserve(store, lim, run_id="short", step_id="s", id_ttl_s=0.3)
    assert (await denial(reserve(store, lim, run_id="other", step_id=None, id_ttl_s=60))).extra == {
        "budget": "live_ids"
    }
    # Once the token's lifetime is over, the ids leave the live set and their counters go.
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        # The same step again: refused while its counter lives, a fresh budget after.
        outcome = await asyncio.gather(
            reserve(store, lim, run_id="short", step_id="s", id_ttl_s=60), return_exceptions=True
        )
        again = outcome[0]
        if isinstance(again, Reservation):
            break
        assert isinstance(again, GatewayError)
        assert again.extra == {"budget": "step"}
        assert time.monotonic() < deadline, "the ids outlived their ttl"
        await asyncio.sleep(0.05)
    assert again.remaining_step == 0
    assert (await denial(reserve(store, lim, run_id="other", step_id=None, id_ttl_s=60))).extra == {
        "budget": "live_ids"
    }


async def test_a_shorter_ttl_never_cuts_a_longer_one_short(store: BudgetStore) -> None:
    lim = limits(per_step=1)
    await reserve(store, lim, run_id="long", step_id="s", id_ttl_s=60)
    await asyncio.sleep(0)
    await reserve(store, lim, run_id="long", step_id="s2", id_ttl_s=0.1)
    await asyncio.sleep(0.3)
    assert (await denial(reserve(store, lim, run_id="long", step_id="s", id_ttl_s=0.1))).extra == {"budget": "step"}


ODD_VALUES = {
    "colon": "a:b:c",
    "glob": "*",
    "hash-tag": "{x}",
    "newline": "line1\nline2",
    "one-kb": "k" * 1024,
    "empty": "",
    "unicode": "ünïcødé-✓",
    "crlf-injection": "x\r\nFLUSHALL\r\n",
}


@pytest.mark.parametrize("value", list(ODD_VALUES.values()), ids=list(ODD_VALUES))
async def test_odd_principal_and_ids_are_stored_safely(store: BudgetStore, value: str) -> None:
    lim = limits(per_step=1, per_run=2, concurrent=5)
    granted = await reserve(store, lim, principal=value, run_id=value, step_id=value)
    assert (granted.remaining_step, granted.remaining_run) == (0, 1)
    assert (granted.principal, granted.run_id, granted.step_id) == (value, value, value)
    assert (await denial(reserve(store, lim, principal=value, run_id=value, step_id=value))).extra
    await store.release(granted)
    counts = await store.counts(principal=value, tool="fetch", run_id=value, step_id=value, limits=lim)
    assert (counts.remaining_step, counts.remaining_run) == (0, 1)
    # Nobody else's budget moved.
    other = await reserve(store, lim, principal=value + "-other", run_id=value, step_id=value)
    assert (other.remaining_step, other.remaining_run) == (0, 1)


async def test_ids_cannot_be_shifted_into_each_other(store: BudgetStore) -> None:
    """("a:b", run "c") and ("a", run "b:c") must not share a counter, nor must run/step."""
    lim = limits(per_step=1, per_run=1)
    await reserve(store, lim, principal="a:b", run_id="c", step_id="d")
    await reserve(store, lim, principal="a", run_id="b:c", step_id="d")
    await reserve(store, lim, principal="a", run_id="b", step_id="c:d")
    await reserve(store, lim, principal="p", run_id="r:s", step_id=None)
    await reserve(store, lim, principal="p", run_id="r", step_id="s")


async def test_cache_returns_a_value_until_its_ttl_passes(store: BudgetStore) -> None:
    assert await store.cache_get("engine:query") is None
    await store.cache_set("engine:query", b"\x00result bytes\xff", ttl_s=60)
    await store.cache_set("short", b"v", ttl_s=0.2)
    assert await store.cache_get("engine:query") == b"\x00result bytes\xff"
    assert await store.cache_get("short") == b"v"

    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while await store.cache_get("short") is not None:
        assert time.monotonic() < deadline, "cache entry outlived its TTL"
        await asyncio.sleep(0.05)
    assert await store.cache_get("engine:query") == b"\x00result bytes\xff"


async def test_ping_answers_true_while_the_store_is_up(store: BudgetStore) -> None:
    assert await store.ping() is True


@pytest.mark.serial  # 200 calls at once against 1 s store timeouts: needs the machine to itself
@pytest.mark.parametrize(("concurrent", "per_step"), [(1000, 20), (3, 1000)], ids=["step", "slots"])
async def test_concurrent_reservations_on_one_store_are_exact(
    store: BudgetStore, concurrent: int, per_step: int, request: pytest.FixtureRequest
) -> None:
    lim = limits(per_step=per_step, concurrent=concurrent)
    outcomes = await asyncio.gather(*(reserve(store, lim) for _ in range(200)), return_exceptions=True)
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    assert len(granted) == min(concurrent, per_step)
    # Every refusal is the limit's own: a burst never turns into store errors (redis-py's cluster
    # client broke under concurrent first calls until the script was loaded once, up front).
    refusals = [o for o in outcomes if not isinstance(o, Reservation)]
    assert all(isinstance(o, GatewayError) for o in refusals), refusals[:3]
    expected = {ErrorCode.QUOTA_EXHAUSTED, ErrorCode.CONCURRENCY_LIMITED}
    if request.node.callspec.params["store"] == "redis-tls":
        # A cold burst opens up to 32 TLS connections at once; on a loaded 2-core machine some
        # handshakes pass the 1 s connect timeout, and those calls fail closed.
        expected.add(ErrorCode.STORE_UNAVAILABLE)
    assert {o.code for o in refusals if isinstance(o, GatewayError)} <= expected
    assert len({g.lease_id for g in granted}) == len(granted)


# -- Redis only ------------------------------------------------------------------------------


async def close_all(stores: list[RedisBudgetStore]) -> None:
    await asyncio.gather(*(s.close() for s in stores))


@pytest.mark.serial  # 200 calls at once against 1 s store timeouts: needs the machine to itself
@pytest.mark.parametrize(
    ("lim", "expected_code"),
    [
        (limits(per_step=20), ErrorCode.QUOTA_EXHAUSTED),
        (limits(concurrent=3), ErrorCode.CONCURRENCY_LIMITED),
    ],
    ids=["step-budget-20", "concurrency-3"],
)
async def test_replicas_sharing_redis_grant_exactly_the_limit(
    redis_server: RedisServer, namespace: str, lim: ToolLimits, expected_code: ErrorCode
) -> None:
    # Four stores, four connection pools: as independent as four gateway replicas.
    replicas = [RedisBudgetStore(redis_server.url, namespace=namespace) for _ in range(4)]
    try:
        outcomes = await asyncio.gather(*(reserve(replicas[i % 4], lim) for i in range(200)), return_exceptions=True)
    finally:
        await close_all(replicas)

    granted = [o for o in outcomes if isinstance(o, Reservation)]
    denied = [o for o in outcomes if isinstance(o, GatewayError)]
    expected = min(lim.per_step, lim.concurrent)
    assert len(granted) == expected
    assert len({g.lease_id for g in granted}) == expected
    assert len(denied) == 200 - expected
    assert {d.code for d in denied} == {expected_code}

    checker = RedisBudgetStore(redis_server.url, namespace=namespace)
    try:
        counts = await checker.counts(principal="agent", tool="fetch", run_id="run-1", step_id="step-1", limits=lim)
    finally:
        await checker.close()
    # None lost, none doubled: the counter holds exactly the grants.
    assert counts.remaining_step == lim.per_step - expected


async def test_a_restarted_gateway_keeps_the_spent_budget(redis_server: RedisServer, namespace: str) -> None:
    lim = limits(per_step=2, per_run=3)
    first = RedisBudgetStore(redis_server.url, namespace=namespace)
    for _ in range(2):
        await first.release(await reserve(first, lim))
    await first.close()

    restarted = RedisBudgetStore(redis_server.url, namespace=namespace)
    try:
        assert (await denial(reserve(restarted, lim))).code is ErrorCode.QUOTA_EXHAUSTED
        granted = await reserve(restarted, lim, step_id="step-2")
        assert granted.remaining_run == 0
    finally:
        await restarted.close()


async def test_redis_down_fails_closed_then_recovers_with_the_same_store(
    private_redis_server: RedisServer,
) -> None:
    server = private_redis_server
    lim = limits(per_step=100)
    store = RedisBudgetStore(server.url, namespace="outage")
    try:
        held = await reserve(store, lim)
        await store.cache_set("k", b"v", ttl_s=60)

        server.stop()
        # wait_for bounds a hang; a prompt failure is the behaviour under test.
        error = await denial(asyncio.wait_for(reserve(store, lim), timeout=SETTLE_DEADLINE_S))
        assert error.code is ErrorCode.STORE_UNAVAILABLE
        assert error.status_on("api") == 503
        assert error.retryable
        assert await store.ping() is False
        for call in (
            store.counts(principal="agent", tool="fetch", run_id="r", step_id="s", limits=lim),
            store.cache_get("k"),
            store.cache_set("k", b"v", ttl_s=1),
        ):
            assert (await denial(call)).code is ErrorCode.STORE_UNAVAILABLE
        await store.release(held)  # best effort: must not raise while Redis is down

        server.start()  # same port, empty data (no persistence in the fixture)
        assert await store.ping() is True
        granted = await reserve(store, lim)
        assert granted.remaining_step == lim.per_step - 1
    finally:
        await store.close()


async def test_unreachable_redis_fails_closed_from_the_start(
    private_redis_server: RedisServer,
) -> None:
    private_redis_server.stop()
    store = open_store(private_redis_server.url)
    try:
        assert isinstance(store, RedisBudgetStore)
        assert await store.ping() is False
        error = await denial(reserve(store, limits()))
        assert error.code is ErrorCode.STORE_UNAVAILABLE
    finally:
        await store.close()


async def test_every_redis_key_has_a_ttl_and_no_raw_input(redis_server: RedisServer, namespace: str) -> None:
    store = RedisBudgetStore(redis_server.url, namespace=namespace)
    secret_marker = "RAW-INPUT-MARKER"
    try:
        for tool in ("search", "fetch"):
            lim = limits(per_step=1, min_interval_s=30.0 if tool == "search" else 0.0)
            held = await reserve(store, lim, tool=tool, principal=secret_marker, run_id=secret_marker)
            await store.release(held)
            await reserve(store, lim, tool=tool, run_id=None, step_id=secret_marker)
            await reserve(store, lim, tool=tool, principal="p2", run_id=None, step_id=None)
            with pytest.raises(GatewayError):
                await reserve(store, lim, tool=tool, principal=secret_marker, run_id=secret_marker)
        await store.cache_set(secret_marker, b"v", ttl_s=60)
    finally:
        await store.close()

    client: Redis = Redis.from_url(redis_server.url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{namespace}:*")]
        assert keys, "the operations above wrote no keys"
        for key in keys:
            assert await client.pttl(key) > 0, f"{key!r} has no TTL"
            assert secret_marker.encode() not in key
            assert len(key) < 120
        types = {key.rsplit(b":", 2)[-1]: await client.type(key) for key in keys}
        assert types[b"leases"] == b"zset"
        assert types[b"last_start"] == b"string"
    finally:
        await client.aclose()


async def test_a_tls_server_not_trusted_by_the_ca_bundle_fails_closed(redis_tls: TlsRedis) -> None:
    # No CA bundle: the test CA is not among the default roots, so the handshake is refused.
    untrusted = RedisBudgetStore(redis_tls.url, namespace="untrusted")
    try:
        assert await untrusted.ping() is False
        error = await denial(reserve(untrusted, limits()))
        assert error.code is ErrorCode.STORE_UNAVAILABLE
    finally:
        await untrusted.close()
    trusted = RedisBudgetStore(redis_tls.url, namespace="trusted", ca_bundle=str(redis_tls.ca_path))
    try:
        assert await trusted.ping() is True
    finally:
        await trusted.close()


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:6379", "redis+sentinel://127.0.0.1:26379", "redis://a:1,b:2", "redis+cluster://h:x"],
    ids=["scheme", "sentinel-without-service", "two-hosts-single", "bad-port"],
)
async def test_a_malformed_redis_url_is_invalid_input_at_start(url: str) -> None:
    with pytest.raises(GatewayError) as caught:
        open_store(url)
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert "EGRESS_REDIS_URL" in caught.value.message


async def test_open_store_without_a_url_is_in_memory() -> None:
    store = open_store(None)
    assert isinstance(store, MemoryBudgetStore)
    assert await store.ping() is True
    await store.close()


async def test_a_redis_restart_between_calls_needs_no_caller_retry(
    private_redis_server: RedisServer,
) -> None:
    store = RedisBudgetStore(private_redis_server.url, namespace="restart")
    try:
        # Several pooled connections, all of which die with the server.
        await asyncio.gather(*(reserve(store, limits(), step_id=str(i)) for i in range(5)))
        private_redis_server.restart()
        # The first call after the restart meets a dead pooled connection; redis-py reconnects
        # it and the script is reloaded (EVALSHA -> NOSCRIPT -> SCRIPT LOAD).
        outcomes = await asyncio.gather(
            *(reserve(store, limits(), step_id=str(i)) for i in range(5)), return_exceptions=True
        )
        assert all(isinstance(o, Reservation) for o in outcomes), outcomes
    finally:
        await store.close()


async def test_a_stalled_redis_times_out_as_store_unavailable(
    private_redis_server: RedisServer,
) -> None:
    store = RedisBudgetStore(private_redis_server.url, namespace="stall")
    lim = limits(per_step=100)
    try:
        await reserve(store, lim)
        private_redis_server.pause()
        try:
            error = await denial(asyncio.wait_for(reserve(store, lim), timeout=SETTLE_DEADLINE_S))
        finally:
            private_redis_server.resume()
        assert error.code is ErrorCode.STORE_UNAVAILABLE
        granted = await reserve(store, lim)
        # The timed-out script may have run once Redis woke: counted, never granted twice.
        assert granted.remaining_step in {97, 98}
    finally:
        await store.close()


@pytest.mark.parametrize(
    "tool", ["", "Fetch", "fetch:x", "a" * 40, "*"], ids=["empty", "upper", "colon", "long", "glob"]
)
async def test_a_tool_name_that_is_not_an_identifier_is_a_programming_error(store: BudgetStore, tool: str) -> None:
    with pytest.raises(ValueError, match="tool name"):
        await reserve(store, limits(), tool=tool)
