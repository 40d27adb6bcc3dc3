"""The budget store contract: one protocol that `memory.py` and `redis.py` both implement.

It owns the semantics every store must share (the order of checks, what counts, what a denial
looks like), and the errors a denial raises, so that both stores fail identically. It never
touches a clock, a socket or a policy file: limits arrive with each call.

Contract of `reserve`, atomic as a whole and taken before any network access:
1. cooldown: a start less than `min_interval_s` ago for principal+tool -> `cooldown`;
2. concurrency: unexpired leases for principal+tool >= `concurrent` -> `concurrency_limited`;
3. windows, minute then hour then day: reservations of principal+tool in the current window >=
   its limit -> `quota_exhausted` (`budget`: the window's name, `retry_after_s` to its end). No id
   is involved, so no header an agent sends can reset them;
4. live ids: the run or step id is not live yet and principal+tool already has `max_live_ids`
   live ids -> `quota_exhausted` (`budget`: `live_ids`);
5. step, then run: reservations already taken >= the limit -> `quota_exhausted`;
only when all pass: count one against each window, step and run, mark the ids live, record the
start, add a lease expiring after `lease_ttl_s`. A denial consumes nothing. `release` frees the
lease only: the reservation stays counted (failed, cancelled and timed-out attempts count). Runs
are scoped to principal+tool, steps to principal+tool+run, so another principal's ids never
share a budget. An id and its counters stay live `id_ttl_s` after their latest reservation (the
run token's remaining lifetime; `COUNTER_IDLE_TTL_S` when not given), never shortened.
"""

from __future__ import annotations

import math
import re
from typing import Protocol, runtime_checkable

from gateway.budget.model import BudgetCounts, Reservation, ToolLimits
from gateway.errors import ErrorCode, GatewayError

# Counters idle this long are forgotten: longer than any agent run we expect, short enough that
# state stays bounded. Refreshed by every reservation against the counter.
COUNTER_IDLE_TTL_S = 24 * 3600.0


@runtime_checkable
class BudgetStore(Protocol):
    async def reserve(
        self,
        *,
        principal: str,
        tool: str,
        run_id: str | None,
        step_id: str | None,
        limits: ToolLimits,
        id_ttl_s: float | None = None,
    ) -> Reservation: ...

    async def release(self, reservation: Reservation) -> None: ...

    async def counts(
        self,
        *,
        principal: str,
        tool: str,
        run_id: str | None,
        step_id: str | None,
        limits: ToolLimits,
    ) -> BudgetCounts: ...

    async def ping(self) -> bool: ...

    async def cache_get(self, key: str) -> bytes | None: ...

    async def cache_set(self, key: str, value: bytes, ttl_s: float) -> None: ...

    async def close(self) -> None: ...


# Tool names come from code, not from requests; Redis keys show them in clear for operators.
TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def check_tool_name(tool: str) -> None:
    """Both stores refuse the same tool names, so a bad name fails in tests on memory too."""
    if not TOOL_NAME.fullmatch(tool):
        raise ValueError(f"tool name must match {TOOL_NAME.pattern}, got {tool!r}")


def remaining(limit: int, spent: int) -> int:
    return max(0, limit - spent)


def cooldown_denied(tool: str, retry_after_s: float) -> GatewayError:
    # Rounded up to the millisecond so a caller that waits exactly retry_after_s is not refused.
    wait_s = math.ceil(retry_after_s * 1000) / 1000
    return GatewayError(
        ErrorCode.COOLDOWN,
        f"{tool}: minimum interval between starts not yet passed; retry after {wait_s:.3f} s",
        retry_after_s=wait_s,
    )


def concurrency_denied(tool: str, active: int, limits: ToolLimits) -> GatewayError:
    return GatewayError(
        ErrorCode.CONCURRENCY_LIMITED,
        f"{tool}: {active} active requests, limit {limits.concurrent}",
    )


def step_exhausted(tool: str, limits: ToolLimits) -> GatewayError:
    return GatewayError(
        ErrorCode.QUOTA_EXHAUSTED,
        f"{tool}: step budget spent ({limits.per_step} reservations per step)",
        extra={"budget": "step"},
    )


def run_exhausted(tool: str, limits: ToolLimits) -> GatewayError:
    return GatewayError(
        ErrorCode.QUOTA_EXHAUSTED,
        f"{tool}: run budget spent ({limits.per_run} reservations per run)",
        extra={"budget": "run"},
    )


def window_exhausted(tool: str, window: str, limit: int, retry_after_s: float) -> GatewayError:
    wait_s = math.ceil(retry_after_s * 1000) / 1000
    return GatewayError(
        ErrorCode.QUOTA_EXHAUSTED,
        f"{tool}: {window} quota spent ({limit} reservations per {window}); retry after {wait_s:.3f} s",
        retry_after_s=wait_s,
        extra={"budget": window},
    )


def live_ids_exhausted(tool: str, limits: ToolLimits) -> GatewayError:
    return GatewayError(
        ErrorCode.QUOTA_EXHAUSTED,
        f"{tool}: {limits.max_live_ids} run and step ids are live; no new id until one expires",
        extra={"budget": "live_ids"},
    )
