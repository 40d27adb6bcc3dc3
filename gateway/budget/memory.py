"""In-memory budget store: the embedded default for a single gateway process.

Owns reservations, leases, cooldowns and the small cache of one process. Safe within one event
loop because no method awaits inside its critical section: each check-and-update runs to
completion before another task can interleave. Bounded: counters expire after an idle period,
leases and cooldowns at their deadlines, cache entries by TTL and by a size cap, and expired
entries are swept as calls pass by. State dies with the process (that is what Redis is for).
Never does I/O.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.budget.model import BudgetCounts, Reservation, ToolLimits
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

# Sweeping is O(entries); doing it at most this often keeps a hot path O(1) amortised.
SWEEP_INTERVAL_S = 30.0
MAX_CACHE_ENTRIES = 10_000

# Counter keys are tuples, not joined strings, so no id can forge another's key whatever
# characters it holds: ("step", principal, tool, run_id, step_id), ("run", principal, tool, run_id).
_CounterKey = tuple[str | None, ...]
_ToolKey = tuple[str, str]


@dataclass(slots=True)
class _Counter:
    spent: int = 0
    expires_at: float = 0.0


@dataclass(slots=True)
class _Window:
    # Index of the window (clock // length) this count belongs to; an older index counts 0.
    index: int
    spent: int
    ends_at: float


@dataclass(slots=True)
class _Cooldown:
    started_at: float
    expires_at: float


@dataclass(slots=True)
class _CacheEntry:
    value: bytes
    expires_at: float


@dataclass(slots=True)
class _State:
    counters: dict[_CounterKey, _Counter] = field(default_factory=dict)
    # lease_id -> expiry, per principal+tool
    leases: dict[_ToolKey, dict[str, float]] = field(default_factory=dict)
    cooldowns: dict[_ToolKey, _Cooldown] = field(default_factory=dict)
    # (principal, tool, window name) -> that window's count; bounded by the policy's principals.
    windows: dict[tuple[str, str, str], _Window] = field(default_factory=dict)
    # live run and step ids (their counter keys) -> expiry, per principal+tool
    live_ids: dict[_ToolKey, dict[_CounterKey, float]] = field(default_factory=dict)
    cache: dict[str, _CacheEntry] = field(default_factory=dict)


class MemoryBudgetStore:
    """`BudgetStore` held in this process's memory."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        counter_ttl_s: float = COUNTER_IDLE_TTL_S,
        max_cache_entries: int = MAX_CACHE_ENTRIES,
    ) -> None:
        self._clock = clock
        self._counter_ttl_s = counter_ttl_s
        self._max_cache_entries = max_cache_entries
        self._state = _State()
        self._next_sweep_at = clock() + SWEEP_INTERVAL_S

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
        check_tool_name(tool)
        # Critical section: no await from here to the return, so it is atomic on the loop.
        now = self._clock()
        self._maybe_sweep(now)
        state = self._state
        tool_key: _ToolKey = (principal, tool)

        self._check_cooldown(tool_key, limits, now)
        leases = state.leases.get(tool_key, {})
        for lease_id in [lid for lid, expiry in leases.items() if expiry <= now]:
            del leases[lease_id]
        if len(leases) >= limits.concurrent:
            raise concurrency_denied(tool, len(leases), limits)
        windows = self._window_counts(tool_key, limits, now)
        step_key = _step_key(principal, tool, run_id, step_id)
        run_key = _run_key(principal, tool, run_id)
        id_keys = [key for key in (run_key, step_key) if key is not None]
        live = self._check_live_ids(tool_key, id_keys, limits, now)
        step_spent = self._spent(step_key, now)
        if step_key is not None and step_spent >= limits.per_step:
            raise step_exhausted(tool, limits)
        run_spent = self._spent(run_key, now)
        if run_key is not None and run_spent >= limits.per_run:
            raise run_exhausted(tool, limits)

        # Every check passed: only now is anything consumed.
        remaining_windows: dict[str, int] = {}
        for (name, length_s, limit), (index, spent) in zip(limits.window_limits(), windows, strict=True):
            state.windows[(principal, tool, name)] = _Window(index, spent + 1, (index + 1) * length_s)
            remaining_windows[name] = remaining(limit, spent + 1)
        ttl_s = self._counter_ttl_s if id_ttl_s is None else id_ttl_s
        for key in id_keys:
            live[key] = max(live.get(key, 0.0), now + ttl_s)
        if id_keys:
            state.live_ids[tool_key] = live
        remaining_step: int | None = None
        if step_key is not None:
            self._charge(step_key, now, ttl_s)
            remaining_step = remaining(limits.per_step, step_spent + 1)
        remaining_run: int | None = None
        if run_key is not None:
            self._charge(run_key, now, ttl_s)
            remaining_run = remaining(limits.per_run, run_spent + 1)
        if limits.min_interval_s > 0:
            state.cooldowns[tool_key] = _Cooldown(now, now + limits.min_interval_s)
        lease_id = secrets.token_hex(12)
        leases[lease_id] = now + limits.lease_ttl_s
        state.leases[tool_key] = leases
        return Reservation(
            principal=principal,
            tool=tool,
            run_id=run_id,
            step_id=step_id,
            lease_id=lease_id,
            remaining_step=remaining_step,
            remaining_run=remaining_run,
            remaining_windows=remaining_windows,
        )

    def _check_cooldown(self, tool_key: _ToolKey, limits: ToolLimits, now: float) -> None:
        cooldown = self._state.cooldowns.get(tool_key)
        if cooldown is not None and limits.min_interval_s > 0:
            wait_s = cooldown.started_at + limits.min_interval_s - now
            if wait_s > 0:
                raise cooldown_denied(tool_key[1], wait_s)

    def _window_counts(self, tool_key: _ToolKey, limits: ToolLimits, now: float) -> list[tuple[int, int]]:
        """(index, spent) of each current window, shortest first; a spent window refuses."""
        principal, tool = tool_key
        counts: list[tuple[int, int]] = []
        for name, length_s, limit in limits.window_limits():
            index = int(now // length_s)
            window = self._state.windows.get((principal, tool, name))
            spent = window.spent if window is not None and window.index == index else 0
            if spent >= limit:
                raise window_exhausted(tool, name, limit, (index + 1) * length_s - now)
            counts.append((index, spent))
        return counts

    def _check_live_ids(
        self, tool_key: _ToolKey, id_keys: list[_CounterKey], limits: ToolLimits, now: float
    ) -> dict[_CounterKey, float]:
        """The principal's live ids (expired ones dropped); refuses ids that would pass the bound."""
        live = self._state.live_ids.get(tool_key, {})
        if id_keys:
            for key in [k for k, expiry in live.items() if expiry <= now]:
                del live[key]
            new_ids = sum(1 for key in id_keys if key not in live)
            if new_ids and len(live) + new_ids > limits.max_live_ids:
                raise live_ids_exhausted(tool_key[1], limits)
        return live

    async def release(self, reservation: Reservation) -> None:
        tool_key = (reservation.principal, reservation.tool)
        leases = self._state.leases.get(tool_key)
        if leases is not None:
            leases.pop(reservation.lease_id, None)
            if not leases:
                del self._state.leases[tool_key]

    async def counts(
        self,
        *,
        principal: str,
        tool: str,
        run_id: str | None,
        step_id: str | None,
        limits: ToolLimits,
    ) -> BudgetCounts:
        now = self._clock()
        step_key = _step_key(principal, tool, run_id, step_id)
        run_key = _run_key(principal, tool, run_id)
        return BudgetCounts(
            remaining_step=(None if step_key is None else remaining(limits.per_step, self._spent(step_key, now))),
            remaining_run=(None if run_key is None else remaining(limits.per_run, self._spent(run_key, now))),
        )

    async def ping(self) -> bool:
        return True

    async def cache_get(self, key: str) -> bytes | None:
        entry = self._state.cache.get(key)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            del self._state.cache[key]
            return None
        return entry.value

    async def cache_set(self, key: str, value: bytes, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        now = self._clock()
        self._maybe_sweep(now)
        cache = self._state.cache
        cache.pop(key, None)  # re-insert so dict order stays oldest-first for eviction
        while len(cache) >= self._max_cache_entries:
            del cache[next(iter(cache))]
        cache[key] = _CacheEntry(value, now + ttl_s)

    async def close(self) -> None:
        self._state = _State()

    # -- internals ---------------------------------------------------------------------------

    def _spent(self, key: _CounterKey | None, now: float) -> int:
        if key is None:
            return 0
        counter = self._state.counters.get(key)
        return counter.spent if counter is not None and counter.expires_at > now else 0

    def _charge(self, key: _CounterKey, now: float, ttl_s: float) -> None:
        counter = self._state.counters.get(key)
        if counter is None or counter.expires_at <= now:
            counter = _Counter()
            self._state.counters[key] = counter
        counter.spent += 1
        # Idle expiry, as on Redis: each reservation pushes the deadline out again, never in.
        counter.expires_at = max(counter.expires_at, now + ttl_s)

    def _maybe_sweep(self, now: float) -> None:
        if now < self._next_sweep_at:
            return
        self._next_sweep_at = now + SWEEP_INTERVAL_S
        state = self._state
        for key in [k for k, c in state.counters.items() if c.expires_at <= now]:
            del state.counters[key]
        for tool_key, leases in list(state.leases.items()):
            for lease_id in [lid for lid, expiry in leases.items() if expiry <= now]:
                del leases[lease_id]
            if not leases:
                del state.leases[tool_key]
        for tool_key in [k for k, c in state.cooldowns.items() if c.expires_at <= now]:
            del state.cooldowns[tool_key]
        for window_key in [k for k, w in state.windows.items() if w.ends_at <= now]:
            del state.windows[window_key]
        for tool_key, live in list(state.live_ids.items()):
            for id_key in [k for k, expiry in live.items() if expiry <= now]:
                del live[id_key]
            if not live:
                del state.live_ids[tool_key]
        for cache_key in [k for k, e in state.cache.items() if e.expires_at <= now]:
            del state.cache[cache_key]

    def live_id_count(self, principal: str, tool: str) -> int:
        """Live run and step ids of one principal and tool, for tests of the bound."""
        now = self._clock()
        return sum(1 for expiry in self._state.live_ids.get((principal, tool), {}).values() if expiry > now)

    def entry_count(self) -> int:
        """How many entries the store holds, for tests that check it stays bounded."""
        state = self._state
        return (
            len(state.counters)
            + sum(len(leases) for leases in state.leases.values())
            + len(state.cooldowns)
            + len(state.windows)
            + sum(len(live) for live in state.live_ids.values())
            + len(state.cache)
        )


def _step_key(principal: str, tool: str, run_id: str | None, step_id: str | None) -> _CounterKey | None:
    return None if step_id is None else ("step", principal, tool, run_id, step_id)


def _run_key(principal: str, tool: str, run_id: str | None) -> _CounterKey | None:
    return None if run_id is None else ("run", principal, tool, run_id)
