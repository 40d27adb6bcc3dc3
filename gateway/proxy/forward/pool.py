"""The upstream keep-alive pool of plain HTTP forwarding, keyed by (principal, vetted address, host, port).

Owns idle upstream connections between requests: a connection is only ever reused for the same
principal and the same vetted address, name and port it was opened for (a pinned decision is
never widened by reuse, and one principal's connection never carries another's request or
response, whatever an origin leaves in it), most recently used first, bounded per key and in
total, and closed once idle too long.

Never dials and never decides: it hands back what a `PinnedTarget` already allows, or nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from gateway.egress.target import PinnedTarget
from gateway.memo import BoundedMemo
from gateway.proxy.deadlines.wheel import DeadlineWheel, LazyDeadline

# (principal, vetted address, host, port)
PoolKey = tuple[str, str, str, int]

MAX_IDLE_PER_KEY = 64
MAX_IDLE_TOTAL = 1024
MAX_CACHED_POOL_KEYS = 4096
POOL_IDLE_TIMEOUT_S = 30.0
# Idle connections are swept in rounds rather than each with its own timer (a timer armed and
# cancelled per request costs more than the request's pool bookkeeping): a connection lives
# between POOL_IDLE_TIMEOUT_S and POOL_IDLE_TIMEOUT_S + POOL_SWEEP_S once idle.
POOL_SWEEP_S = 5.0


class PooledConnection(Protocol):
    """What the pool needs of a connection it keeps (`upstream.UpstreamConnection`)."""

    key: PoolKey
    parked_at: float

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def close(self) -> None: ...


Conn = TypeVar("Conn", bound=PooledConnection)


class UpstreamPool(Generic[Conn]):
    """Idle keep-alive connections by (principal, vetted address, host, port): reuse only what was vetted."""

    def __init__(self, wheel: DeadlineWheel) -> None:
        # The listener's deadline wheel: the pool's sweep and every pooled connection's deadlines.
        self.wheel = wheel
        self._idle: dict[PoolKey, list[Conn]] = {}
        self._count = 0
        self._keys: BoundedMemo[tuple[str, tuple[str, ...], str, int], tuple[PoolKey, ...]] = BoundedMemo(
            MAX_CACHED_POOL_KEYS
        )
        self._sweeper = LazyDeadline(self._sweep, wheel)

    def keys_for(self, principal: str, target: PinnedTarget) -> tuple[PoolKey, ...]:
        """The keys under which a connection of `principal` to `target` may be reused: one per
        vetted address, for `acquire` (a keep-alive connection's kept decision holds them)."""
        # Formatting an IP address is slow in pure Python; a target's keys are formatted once, and
        # looked up by the addresses' text (hashing an `IPv4Address` runs Python code, a str's
        # hash is cached).
        lookup = (principal, target.address_texts, target.name, target.port)
        keys = self._keys.get(lookup)
        if keys is None:
            keys = self._keys.put(
                lookup, tuple((principal, text, target.name, target.port) for text in target.address_texts)
            )
        return keys

    def acquire(self, keys: tuple[PoolKey, ...]) -> Conn | None:
        """An idle connection under one of `keys` (`keys_for`: a principal's and a target's
        vetted addresses), most recently used first."""
        for key in keys:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                self._count -= 1
                if conn.transport is not None and not conn.transport.is_closing():
                    return conn
        return None

    def release(self, conn: Conn) -> None:
        idle = self._idle.get(conn.key)
        if idle is None:  # not `setdefault`: it would build a list per request
            idle = self._idle[conn.key] = []
        if len(idle) >= MAX_IDLE_PER_KEY or self._count >= MAX_IDLE_TOTAL or conn.transport is None:
            conn.close()
            return
        idle.append(conn)
        self._count += 1
        conn.parked_at = time.monotonic()
        if self._sweeper.due is None:
            self._sweeper.set(POOL_SWEEP_S)

    def _sweep(self) -> None:
        """Close connections idle for longer than POOL_IDLE_TIMEOUT_S (the oldest lead each list)."""
        cutoff = time.monotonic() - POOL_IDLE_TIMEOUT_S
        expired = [conn for idle in self._idle.values() for conn in idle if conn.parked_at <= cutoff]
        for conn in expired:
            conn.close()
        if self._count:
            self._sweeper.set(POOL_SWEEP_S)

    def forget(self, conn: Conn) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
            self._count -= 1
            if not idle:
                del self._idle[conn.key]

    def close_where(self, revoked: Callable[[Conn], bool]) -> None:
        """Close the idle connections `revoked` picks (live permission after a policy reload)."""
        for conn in [conn for idle in self._idle.values() for conn in idle if revoked(conn)]:
            conn.close()

    def close(self) -> None:
        self._sweeper.cancel()
        for idle in list(self._idle.values()):
            for conn in list(idle):
                conn.close()
        self._idle.clear()
        self._count = 0
