"""Keeping a test's quota calls inside one fixed window.

Window quotas count in fixed windows: the memory store's of the monotonic clock, Redis's of the
server's wall clock (`TIME`, the same clock as this machine's). A test that expects exact counts
and happens to run across a window's end sees a fresh window halfway (twice the grants, a
`remaining` one higher): correct behaviour, and a false failure. Tests that count a window start
with enough of it left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

MINUTE_S = 60.0
MEMORY_CLOCK: Callable[[], float] = time.monotonic
REDIS_CLOCK: Callable[[], float] = time.time


def wait_for_room_s(needed_s: float, clock: Callable[[], float]) -> float:
    """How long to wait until `clock` has `needed_s` left in its current minute."""
    left = MINUTE_S - clock() % MINUTE_S
    return 0.0 if left >= needed_s else left + 0.05


async def room_in_the_minute(needed_s: float, clock: Callable[[], float]) -> None:
    """Sleep, if needed, until the calls of the next `needed_s` all fall in one minute window."""
    await asyncio.sleep(wait_for_room_s(needed_s, clock))
