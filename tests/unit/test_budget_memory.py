"""Budget values and the in-memory store's bookkeeping, on a fake clock (no sleeps, no sockets).

The shared behaviour of both stores lives in tests/integration/test_budget_contract.py; this
file covers what only shows on a controlled clock: that memory stays bounded as time passes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.budget import MemoryBudgetStore, ToolLimits
from gateway.budget.memory import SWEEP_INTERVAL_S
from gateway.budget.model import BudgetCounts
from gateway.budget.store import COUNTER_IDLE_TTL_S
from gateway.errors import ErrorCode, GatewayError


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


BAD_LIMITS: dict[str, dict[str, Any]] = {
    "negative-step": {"per_step": -1},
    "float-run": {"per_run": 1.5},
    "bool-concurrent": {"concurrent": True},
    "nan-interval": {"min_interval_s": math.nan},
    "negative-interval": {"min_interval_s": -1.0},
    "zero-lease": {"lease_ttl_s": 0.0},
    "infinite-lease": {"lease_ttl_s": math.inf},
}


@pytest.mark.parametrize("change", list(BAD_LIMITS.values()), ids=list(BAD_LIMITS))
def test_limits_that_would_disable_a_check_are_refused(change: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"per_step": 1, "per_run": 1, "concurrent": 1, "min_interval_s": 0}
    fields.update(change)
    with pytest.raises(ValueError, match="must be"):
        ToolLimits(**fields)


@pytest.mark.parametrize(
    ("counts", "body"),
    [
        (BudgetCounts(3, 9), {"step": {"remaining": 3}, "run": {"remaining": 9}}),
        (BudgetCounts(None, 9), {"step": None, "run": {"remaining": 9}}),
        (BudgetCounts(None, None), {"step": None, "run": None}),
    ],
    ids=["both", "run-only", "neither"],
)
def test_counts_json_shape_is_stable(counts: BudgetCounts, body: dict[str, Any]) -> None:
    assert counts.to_json() == body


async def test_idle_counters_leases_cooldowns_and_cache_are_swept() -> None:
    clock = FakeClock()
    store = MemoryBudgetStore(clock=clock)
    lim = ToolLimits(per_step=5, per_run=5, concurrent=100, min_interval_s=1.0, lease_ttl_s=45, per_minute=10)
    for i in range(50):
        clock.now += 0.1  # all 50 within one sweep interval, so nothing is swept yet
        await store.reserve(principal=f"p{i}", tool="fetch", run_id=f"r{i}", step_id="s", limits=lim)
        await store.cache_set(f"k{i}", b"v", ttl_s=60)
    # step, run, lease, cooldown, minute window, two live ids (run and step), cache entry each
    assert store.entry_count() == 50 * 8

    clock.now += COUNTER_IDLE_TTL_S + SWEEP_INTERVAL_S
    await store.cache_set("fresh", b"v", ttl_s=60)  # any call past the interval sweeps
    assert store.entry_count() == 1


async def test_an_expired_counter_starts_a_fresh_budget_after_the_idle_ttl() -> None:
    clock = FakeClock()
    store = MemoryBudgetStore(clock=clock, counter_ttl_s=100.0)
    lim = ToolLimits(per_step=1, per_run=10, concurrent=10, min_interval_s=0.0)
    await store.reserve(principal="p", tool="fetch", run_id="r", step_id="s", limits=lim)
    clock.now += 99.0
    with pytest.raises(GatewayError) as caught:
        await store.reserve(principal="p", tool="fetch", run_id="r", step_id="s", limits=lim)
    assert caught.value.code is ErrorCode.QUOTA_EXHAUSTED
    clock.now += 2.0  # the denial above did not refresh the idle deadline
    granted = await store.reserve(principal="p", tool="fetch", run_id="r", step_id="s", limits=lim)
    assert granted.remaining_run == 10 - 1


async def test_the_cache_is_capped_oldest_first() -> None:
    store = MemoryBudgetStore(clock=FakeClock(), max_cache_entries=3)
    for key in ("a", "b", "c", "d"):
        await store.cache_set(key, key.encode(), ttl_s=60)
    assert await store.cache_get("a") is None
    assert [await store.cache_get(k) for k in ("b", "c", "d")] == [b"b", b"c", b"d"]


async def test_cooldown_retry_after_is_the_time_left() -> None:
    clock = FakeClock()
    store = MemoryBudgetStore(clock=clock)
    lim = ToolLimits(per_step=20, per_run=100, concurrent=1, min_interval_s=2.0)
    granted = await store.reserve(principal="p", tool="search", run_id=None, step_id=None, limits=lim)
    await store.release(granted)
    clock.now += 0.5
    with pytest.raises(GatewayError) as caught:
        await store.reserve(principal="p", tool="search", run_id=None, step_id=None, limits=lim)
    assert caught.value.code is ErrorCode.COOLDOWN
    assert caught.value.retry_after_s == 1.5
