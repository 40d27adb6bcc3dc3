"""Gives the daemon's freed memory back to the kernel once the tools go quiet after a burst.

A tool call allocates response bodies, decoded text, parsed pages and answers in many pieces
below the mmap threshold; freed, they leave holes in the heap that glibc keeps mapped (only the
top of the heap is trimmed on its own), so the daemon would hold a burst's high-water mark for
its whole life. When the last call in flight ends and no other starts for `quiet_s`, one full
garbage collection (cheap: the start-up objects are frozen out of it) frees the cycles the calls
left, and `malloc_trim` returns the free pages (~1 ms). One timer at most, only after tool calls;
the proxy path never touches this. Never raises.
"""

from __future__ import annotations

import asyncio
import gc

from gateway.memory import release_free_memory

QUIET_S = 0.5


class IdleTrim:
    """Counts tool calls in flight; trims once they have all ended and `quiet_s` has passed."""

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self._quiet_s = quiet_s
        self._active = 0
        self._quiet_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0

    def started(self) -> None:
        self._active += 1

    def finished(self) -> None:
        self._active -= 1
        if self._active:
            return
        loop = asyncio.get_running_loop()
        self._quiet_since = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(self._quiet_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._active:
            return  # the call that ends last schedules the next check
        loop = asyncio.get_running_loop()
        remaining = self._quiet_since + self._quiet_s - loop.time()
        if remaining > 0:
            self._timer = loop.call_later(remaining, self._check)
            return
        gc.collect()
        release_free_memory()
        self.trims += 1

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
