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

import asyncio
import contextlib
import hashlib
import logging
import math
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

from gateway.budget.model import BudgetCounts, Reservation, ToolLimits
from gateway.budget.redis_connect import MAX_CONNECTIONS, POOL_WAIT_TIMEOUT_S, close_redis, connect_redis
from gateway.budget.store import (
    COUNTER_IDLE_TTL_S,
    check_tool_name,
    concurrency_denied,
    cooldown_denied,
    live_ids_exhausted,
    remaining,
    run_exhausted,
    step_exhausted,
    window_exhausted,
)
from gateway.errors import ErrorCode, GatewayError

log = logging.getLogger(__name__)

# How long a reservation waits for `min_replicas` replicas to acknowledge it (Redis WAIT); under
# the 2 s operation timeout so a missing replica fails the call rather than the connection.
REPLICA_WAIT_MS = 1000
MAX_IN_FLIGHT = MAX_CONNECTIONS // 2
WINDOW_NAMES = ("minute", "hour", "day")
# The window hash outlives its longest window by a margin, then goes with its principal.
WINDOW_HASH_TTL_MS = 2 * 86_400_000

# KEYS: 1 leases (ZSET lease_id -> expiry ms), 2 last start (STRING ms), 3 step counter,
#       4 run counter, 5 windows (HASH <window>:i -> window index, <window>:n -> spent),
#       6 live ids (ZSET id member -> expiry ms). Every key is passed even when unused so the
#       script declares every key it could touch (and, with the principal hash tag, all six share
#       one cluster slot).
# ARGV: 1 per_step, 2 per_run, 3 concurrent, 4 min_interval_ms, 5 lease_ttl_ms, 6 id_ttl_ms,
#       7 lease_id, 8 has_step (0/1), 9 has_run (0/1), 10 max_live_ids, 11 step member,
#       12 run member, 13-15 per_minute, per_hour, per_day (-1: no such window)
# Returns {"ok", remaining_step|-1, remaining_run|-1, minute|-1, hour|-1, day|-1},
#       {"cooldown", wait_ms}, {"concurrency", active}, {"window", 1-3, wait_ms}, {"live_ids"},
#       {"step", spent}, {"run", spent}.
RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local per_step = tonumber(ARGV[1])
local per_run = tonumber(ARGV[2])
local concurrent = tonumber(ARGV[3])
local min_interval = tonumber(ARGV[4])
local lease_ttl = tonumber(ARGV[5])
local id_ttl = tonumber(ARGV[6])
local has_step = ARGV[8] == '1'
local has_run = ARGV[9] == '1'
local max_live = tonumber(ARGV[10])
local names = {'minute', 'hour', 'day'}
local lengths = {60000, 3600000, 86400000}

-- Pushes a key's expiry out to ttl ms from now, never in: a shorter-lived token for the same
-- run must not cut the counters of a longer one short.
local function extend(key, ttl)
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end

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

-- Window quotas come before anything keyed by an id: no header resets them.
local windows = {}
for i = 1, 3 do
  local limit = tonumber(ARGV[12 + i])
  if limit >= 0 then
    local index = math.floor(now / lengths[i])
    local stored = redis.call('HMGET', KEYS[5], names[i] .. ':i', names[i] .. ':n')
    local spent = 0
    if stored[1] and tonumber(stored[1]) == index then spent = tonumber(stored[2] or '0') end
    if spent >= limit then return {'window', i, (index + 1) * lengths[i] - now} end
    windows[i] = {index, spent, limit}
  end
end

if has_step or has_run then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  local new = 0
  if has_run and not redis.call('ZSCORE', KEYS[6], ARGV[12]) then new = new + 1 end
  if has_step and not redis.call('ZSCORE', KEYS[6], ARGV[11]) then new = new + 1 end
  if new > 0 and redis.call('ZCARD', KEYS[6]) + new > max_live then return {'live_ids', 0, 0} end
end

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

local left = {-1, -1, -1}
local any_window = false
for i = 1, 3 do
  local w = windows[i]
  if w then
    redis.call('HSET', KEYS[5], names[i] .. ':i', w[1], names[i] .. ':n', w[2] + 1)
    left[i] = w[3] - w[2] - 1
    any_window = true
  end
end
if any_window then redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[16])) end
local remaining_step = -1
if has_step then
  redis.call('INCR', KEYS[3])
  extend(KEYS[3], id_ttl)
  redis.call('ZADD', KEYS[6], 'GT', now + id_ttl, ARGV[11])
  remaining_step = per_step - step_spent - 1
end
local remaining_run = -1
if has_run then
  redis.call('INCR', KEYS[4])
  extend(KEYS[4], id_ttl)
  redis.call('ZADD', KEYS[6], 'GT', now + id_ttl, ARGV[12])
  remaining_run = per_run - run_spent - 1
end
if has_step or has_run then extend(KEYS[6], id_ttl + 1000) end
if min_interval > 0 then
  redis.call('SET', KEYS[2], now, 'PX', min_interval)
end
redis.call('ZADD', KEYS[1], now + lease_ttl, ARGV[7])
-- The set lives as long as its latest lease; a shorter lease_ttl after a policy reload must
-- not cut an older, longer lease short.
local last_lease = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last_lease[2]) + 1000)
return {'ok', remaining_step, remaining_run, left[1], left[2], left[3]}
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


def _unavailable(operation: str, exc: BaseException) -> GatewayError:
    return GatewayError(
        ErrorCode.STORE_UNAVAILABLE, f"budget store unavailable during {operation}: {type(exc).__name__}"
    )


class RedisBudgetStore:
    """`BudgetStore` on a Redis server shared by every replica."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "egress",
        counter_ttl_s: float = COUNTER_IDLE_TTL_S,
        ca_bundle: str | None = None,
        min_replicas: int = 0,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", namespace):
            raise ValueError(f"namespace must be 1-64 of [A-Za-z0-9_.-], got {namespace!r}")
        if min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {min_replicas!r}")
        self._namespace = namespace
        self._counter_ttl_ms = _ms_ceil(counter_ttl_s)
        self._min_replicas = min_replicas
        self._redis: Redis | RedisCluster = connect_redis(url, ca_bundle=ca_bundle)
        self._reserve_script = self._redis.register_script(RESERVE_LUA)
        # Commands in flight are capped below the client's connection bound, for every form: the
        # Sentinel and Cluster pools refuse (rather than wait) past it, and redis-py's cluster
        # client fails in odd ways (MaxConnectionsError, a half-set-up connection) when it is hit.
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._script_lock = asyncio.Lock()
        self._script_loaded = False

    @contextlib.asynccontextmanager
    async def _store_errors(self, operation: str) -> AsyncIterator[None]:
        """One command slot, and redis-py and socket failures as `store_unavailable`: the one edge."""
        try:
            async with asyncio.timeout(POOL_WAIT_TIMEOUT_S):
                await self._in_flight.acquire()
        except TimeoutError as exc:
            raise _unavailable(operation, exc) from None
        try:
            yield
        except (RedisError, OSError, TimeoutError) as exc:
            raise _unavailable(operation, exc) from exc
        finally:
            self._in_flight.release()

    # -- keys -------------------------------------------------------------------------------

    def _tool_prefix(self, principal: str, tool: str) -> str:
        check_tool_name(tool)
        # {...} is a Redis Cluster hash tag: all of a principal's keys land in one slot, which a
        # multi-key script requires there.
        return f"{self._namespace}:{{{_digest(principal)}}}:{tool}"

    def _keys(self, principal: str, tool: str, run_id: str | None, step_id: str | None) -> tuple[str, ...]:
        prefix = self._tool_prefix(principal, tool)
        return (
            f"{prefix}:leases",
            f"{prefix}:last_start",
            # Steps live inside their run: step "1" of two runs are two budgets.
            f"{prefix}:step:{_digest(run_id, step_id)}",
            f"{prefix}:run:{_digest(run_id)}",
            f"{prefix}:windows",
            f"{prefix}:ids",
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
        id_ttl_s: float | None = None,
    ) -> Reservation:
        keys = self._keys(principal, tool, run_id, step_id)
        lease_id = secrets.token_hex(12)
        args: list[str | int] = [
            limits.per_step,
            limits.per_run,
            limits.concurrent,
            _ms_ceil(limits.min_interval_s) if limits.min_interval_s > 0 else 0,
            _ms_ceil(limits.lease_ttl_s),
            self._counter_ttl_ms if id_ttl_s is None else _ms_ceil(id_ttl_s),
            lease_id,
            1 if step_id is not None else 0,
            1 if run_id is not None else 0,
            limits.max_live_ids,
            f"s:{_digest(run_id, step_id)}",
            f"r:{_digest(run_id)}",
            *(-1 if value is None else value for value in (limits.per_minute, limits.per_hour, limits.per_day)),
            WINDOW_HASH_TTL_MS,
        ]
        reply = await self._run_reserve(list(keys), args)
        status = _text(reply[0])
        if status == "ok":
            granted = Reservation(
                principal=principal,
                tool=tool,
                run_id=run_id,
                step_id=step_id,
                lease_id=lease_id,
                remaining_step=_optional(reply[1]),
                remaining_run=_optional(reply[2]),
                remaining_windows={
                    name: int(value) for name, value in zip(WINDOW_NAMES, reply[3:6], strict=True) if int(value) >= 0
                },
            )
            if self._min_replicas and int(reply[-1]) < self._min_replicas:
                # Counted on the primary but not yet on a replica: a failover now could forget
                # it and grant it again, so this call is refused (fail closed) and its slot freed.
                await self.release(granted)
                raise GatewayError(
                    ErrorCode.STORE_UNAVAILABLE,
                    f"budget store unavailable during reserve: {int(reply[-1])} of {self._min_replicas} "
                    "replicas acknowledged",
                )
            return granted
        first, second = int(reply[1]), int(reply[2])
        if status == "cooldown":
            raise cooldown_denied(tool, first / 1000)
        if status == "concurrency":
            raise concurrency_denied(tool, first, limits)
        if status == "window":
            name = WINDOW_NAMES[first - 1]
            limit = getattr(limits, f"per_{name}")
            raise window_exhausted(tool, name, int(limit), second / 1000)
        if status == "live_ids":
            raise live_ids_exhausted(tool, limits)
        if status == "step":
            raise step_exhausted(tool, limits)
        if status == "run":
            raise run_exhausted(tool, limits)
        raise GatewayError(ErrorCode.STORE_UNAVAILABLE, f"unexpected reserve reply {status!r}")

    async def _run_reserve(self, keys: list[str], args: list[str | int]) -> list[Any]:
        """The script's reply; with `min_replicas`, the replica count of WAIT appended to it.

        WAIT must follow the script on the same connection, hence one non-transactional
        pipeline (the script is atomic on its own). A server that lost the script (a restart, a
        failover to a replica that never saw it) answers NOSCRIPT without running anything, so
        loading it and sending again cannot count twice.
        """
        async with self._store_errors("reserve"):
            for attempt in (1, 2):
                await self._load_script()
                try:
                    return await self._send_reserve(keys, args)
                except NoScriptError:
                    self._script_loaded = False
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    async def _send_reserve(self, keys: list[str], args: list[str | int]) -> list[Any]:
        sha = self._reserve_script.sha
        if not self._min_replicas:
            reply: Any = await self._redis.evalsha(sha, len(keys), *keys, *args)
            return list(reply)
        pipe = self._redis.pipeline(transaction=False)
        pipe.evalsha(sha, len(keys), *keys, *args)
        pipe.execute_command("WAIT", self._min_replicas, REPLICA_WAIT_MS)
        script_reply, acked = await pipe.execute()
        return [*script_reply, acked]

    async def _load_script(self) -> None:
        """SCRIPT LOAD once (on every primary of a cluster) before the first EVALSHA.

        Left to redis-py, a burst of first calls each meets NOSCRIPT and loads the script
        concurrently, which its cluster client does not survive (connections torn down under
        other commands). One load under a lock, again after any NOSCRIPT.
        """
        if self._script_loaded:
            return
        async with self._script_lock:
            if not self._script_loaded:
                await self._redis.script_load(RESERVE_LUA)
                self._script_loaded = True

    async def release(self, reservation: Reservation) -> None:
        """Free the lease. Best effort by design: callers release in `finally`, and a store
        failure there must not replace the call's own result; an unreleased lease expires after
        `lease_ttl_s` anyway."""
        leases_key = f"{self._tool_prefix(reservation.principal, reservation.tool)}:leases"
        try:
            async with self._store_errors("release"):
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
        _, _, step_key, run_key, _, _ = self._keys(principal, tool, run_id, step_id)
        async with self._store_errors("counts"):
            step_raw, run_raw = await self._redis.mget([step_key, run_key])
        return BudgetCounts(
            remaining_step=(None if step_id is None else remaining(limits.per_step, _int(step_raw))),
            remaining_run=None if run_id is None else remaining(limits.per_run, _int(run_raw)),
        )

    async def ping(self) -> bool:
        try:
            async with self._store_errors("ping"):
                return bool(await self._redis.ping())
        except GatewayError:
            return False

    async def cache_get(self, key: str) -> bytes | None:
        async with self._store_errors("cache get"):
            value: Any = await self._redis.get(self._cache_key(key))
        return None if value is None else bytes(value)

    async def cache_set(self, key: str, value: bytes, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        async with self._store_errors("cache set"):
            await self._redis.set(self._cache_key(key), value, px=_ms_ceil(ttl_s))

    async def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await close_redis(self._redis)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: Any) -> int:
    return 0 if value is None else int(value)


def _optional(value: Any) -> int | None:
    number = int(value)
    return None if number < 0 else number
