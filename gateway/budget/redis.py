"""Redis budget store: reservations, leases, cooldowns and the cache shared by every replica.

Owns the Redis key layout and the one Lua script that makes `reserve` atomic across replicas:
cooldown, lease purge and count, step and run checks, and the grant all run inside Redis in one
script, timed by the server's own clock (`TIME`) so that replicas with skewed clocks agree. Every
key it writes carries a TTL. Principals and ids are user input: they only ever appear in a key as
a SHA-256 digest, so no character can add structure to a key or reach another principal's state.

Fails closed: any connection or timeout error becomes `store_unavailable`, never a grant. It
recovers by itself when Redis returns (the pool reconnects; EVALSHA reloads the script).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import re
import secrets
from collections.abc import Iterator
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.budget.model import BudgetCounts, Reservation, ToolLimits
from gateway.budget.store import (
    COUNTER_IDLE_TTL_S,
    check_tool_name,
    concurrency_denied,
    cooldown_denied,
    remaining,
    run_exhausted,
    step_exhausted,
)
from gateway.errors import ErrorCode, GatewayError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 1.0
# A budget check sits in front of every tool call: a slow Redis must fail the call, not hang it.
OPERATION_TIMEOUT_S = 2.0
POOL_WAIT_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 64

# KEYS: 1 leases (ZSET lease_id -> expiry ms), 2 last start (STRING ms), 3 step counter,
#       4 run counter. Keys 3 and 4 are passed even when unused so the script declares every key
#       it could touch (and, with the principal hash tag, all four share one cluster slot).
# ARGV: 1 per_step, 2 per_run, 3 concurrent, 4 min_interval_ms, 5 lease_ttl_ms, 6 counter_ttl_ms,
#       7 lease_id, 8 has_step (0/1), 9 has_run (0/1)
# Returns {status, a, b}: {"ok", remaining_step|-1, remaining_run|-1}, {"cooldown", wait_ms},
#       {"concurrency", active}, {"step", spent}, {"run", spent}.
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local per_step = tonumber(ARGV[1])
local per_run = tonumber(ARGV[2])
local concurrent = tonumber(ARGV[3])
local min_interval = tonumber(ARGV[4])
local lease_ttl = tonumber(ARGV[5])
local counter_ttl = tonumber(ARGV[6])
local has_step = ARGV[8] == '1'
local has_run = ARGV[9] == '1'

if min_interval > 0 then
  local last = redis.call('GET', KEYS[2])
  if last then
    local wait = tonumber(last) + min_interval - now
    if wait > 0 then return {'cooldown', wait, 0} end
  end
end

-- A lease whose expiry has passed belongs to a worker that never released it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local active = redis.call('ZCARD', KEYS[1])
if active >= concurrent then return {'concurrency', active, 0} end

local step_spent = 0
if has_step then
  step_spent = tonumber(redis.call('GET', KEYS[3]) or '0')
  if step_spent >= per_step then return {'step', step_spent, 0} end
end
local run_spent = 0
if has_run then
  run_spent = tonumber(redis.call('GET', KEYS[4]) or '0')
  if run_spent >= per_run then return {'run', run_spent, 0} end
end

local remaining_step = -1
if has_step then
  redis.call('INCR', KEYS[3])
  redis.call('PEXPIRE', KEYS[3], counter_ttl)
  remaining_step = per_step - step_spent - 1
end
local remaining_run = -1
if has_run then
  redis.call('INCR', KEYS[4])
  redis.call('PEXPIRE', KEYS[4], counter_ttl)
  remaining_run = per_run - run_spent - 1
end
if min_interval > 0 then
  redis.call('SET', KEYS[2], now, 'PX', min_interval)
end
redis.call('ZADD', KEYS[1], now + lease_ttl, ARGV[7])
-- The set lives as long as its latest lease; a shorter lease_ttl after a policy reload must
-- not cut an older, longer lease short.
local last_lease = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last_lease[2]) + 1000)
return {'ok', remaining_step, remaining_run}
"""


def _digest(*parts: str | None) -> str:
    """A fixed-length key component for user-supplied values.

    Length-prefixed before hashing so ("a:b", "c") and ("a", "b:c") never collide; None is
    distinct from "". Surrogates (undecodable header bytes) are kept rather than rejected.
    """
    h = hashlib.sha256()
    for part in parts:
        if part is None:
            h.update(b"N")
        else:
            raw = part.encode("utf-8", "surrogatepass")
            h.update(b"S%d:" % len(raw))
            h.update(raw)
    return h.hexdigest()[:32]


def _ms_ceil(seconds: float) -> int:
    # Rounded up: a limit must never be enforced for less time than the policy says.
    return max(1, math.ceil(seconds * 1000))


@contextlib.contextmanager
def _store_errors(operation: str) -> Iterator[None]:
    """Translate redis-py and socket failures into `store_unavailable` at this one edge."""
    try:
        yield
    except (RedisError, OSError, TimeoutError) as exc:
        raise GatewayError(
            ErrorCode.STORE_UNAVAILABLE,
            f"budget store unavailable during {operation}: {type(exc).__name__}",
        ) from exc


class RedisBudgetStore:
    """`BudgetStore` on a Redis server shared by every replica."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "egress",
        counter_ttl_s: float = COUNTER_IDLE_TTL_S,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", namespace):
            raise ValueError(f"namespace must be 1-64 of [A-Za-z0-9_.-], got {namespace!r}")
        self._namespace = namespace
        self._counter_ttl_ms = _ms_ceil(counter_ttl_s)
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT_TIMEOUT_S,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=OPERATION_TIMEOUT_S,
            # One immediate retry on a broken connection lets a pooled connection that died with
            # a Redis restart reconnect transparently. Timeouts are not retried: a script that
            # ran but whose reply was slow would be counted twice, and a caller waits long enough.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._redis: Redis = Redis.from_pool(pool)
        self._reserve_script = self._redis.register_script(RESERVE_LUA)

    # -- keys -------------------------------------------------------------------------------

    def _tool_prefix(self, principal: str, tool: str) -> str:
        check_tool_name(tool)
        # {...} is a Redis Cluster hash tag: all of a principal's keys land in one slot, which a
        # multi-key script requires there.
        return f"{self._namespace}:{{{_digest(principal)}}}:{tool}"

    def _keys(self, principal: str, tool: str, run_id: str | None, step_id: str | None) -> tuple[str, str, str, str]:
        prefix = self._tool_prefix(principal, tool)
        return (
            f"{prefix}:leases",
            f"{prefix}:last_start",
            # Steps live inside their run: step "1" of two runs are two budgets.
            f"{prefix}:step:{_digest(run_id, step_id)}",
            f"{prefix}:run:{_digest(run_id)}",
        )

    def _cache_key(self, key: str) -> str:
        return f"{self._namespace}:cache:{_digest(key)}"

    # -- BudgetStore ---------------------------------------------------------------------------

    async def reserve(
        self,
        *,
        principal: str,
        tool: str,
        run_id: str | None,
        step_id: str | None,
        limits: ToolLimits,
    ) -> Reservation:
        keys = self._keys(principal, tool, run_id, step_id)
        lease_id = secrets.token_hex(12)
        args: list[str | int] = [
            limits.per_step,
            limits.per_run,
            limits.concurrent,
            _ms_ceil(limits.min_interval_s) if limits.min_interval_s > 0 else 0,
            _ms_ceil(limits.lease_ttl_s),
            self._counter_ttl_ms,
            lease_id,
            1 if step_id is not None else 0,
            1 if run_id is not None else 0,
        ]
        with _store_errors("reserve"):
            reply: Any = await self._reserve_script(keys=list(keys), args=args)
        status = _text(reply[0])
        first, second = int(reply[1]), int(reply[2])
        if status == "ok":
            return Reservation(
                principal=principal,
                tool=tool,
                run_id=run_id,
                step_id=step_id,
                lease_id=lease_id,
                remaining_step=None if first < 0 else first,
                remaining_run=None if second < 0 else second,
            )
        if status == "cooldown":
            raise cooldown_denied(tool, first / 1000)
        if status == "concurrency":
            raise concurrency_denied(tool, first, limits)
        if status == "step":
            raise step_exhausted(tool, limits)
        if status == "run":
            raise run_exhausted(tool, limits)
        raise GatewayError(ErrorCode.STORE_UNAVAILABLE, f"unexpected reserve reply {status!r}")

    async def release(self, reservation: Reservation) -> None:
        """Free the lease. Best effort by design: callers release in `finally`, and a store
        failure there must not replace the call's own result; an unreleased lease expires after
        `lease_ttl_s` anyway."""
        leases_key = f"{self._tool_prefix(reservation.principal, reservation.tool)}:leases"
        try:
            with _store_errors("release"):
                await self._redis.zrem(leases_key, reservation.lease_id)
        except GatewayError as exc:
            log.warning("lease not released, it will expire by TTL: %s", exc.message)

    async def counts(
        self,
        *,
        principal: str,
        tool: str,
        run_id: str | None,
        step_id: str | None,
        limits: ToolLimits,
    ) -> BudgetCounts:
        _, _, step_key, run_key = self._keys(principal, tool, run_id, step_id)
        with _store_errors("counts"):
            step_raw, run_raw = await self._redis.mget([step_key, run_key])
        return BudgetCounts(
            remaining_step=(None if step_id is None else remaining(limits.per_step, _int(step_raw))),
            remaining_run=None if run_id is None else remaining(limits.per_run, _int(run_raw)),
        )

    async def ping(self) -> bool:
        try:
            with _store_errors("ping"):
                return bool(await self._redis.ping())
        except GatewayError:
            return False

    async def cache_get(self, key: str) -> bytes | None:
        with _store_errors("cache get"):
            value: Any = await self._redis.get(self._cache_key(key))
        return None if value is None else bytes(value)

    async def cache_set(self, key: str, value: bytes, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        with _store_errors("cache set"):
            await self._redis.set(self._cache_key(key), value, px=_ms_ceil(ttl_s))

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    return 0 if value is None else int(value)
