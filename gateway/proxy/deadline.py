"""A deadline that moves on every request, kept with one lazily armed timer.

Owns the timing trick that keeps keep-alive connections cheap: moving the deadline later only
records it, and the timer, when it fires early, re-arms for the time left; only a deadline that
must fire sooner than the armed timer re-arms at once. A busy connection then arms no timer per
request. Never decides what a deadline means: the owner's callback does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LazyDeadline:
    """Calls `on_expiry` once the current deadline passes, unless it was cleared or moved on."""

    __slots__ = ("_due", "_loop", "_on_expiry", "_timer")

    def __init__(self, on_expiry: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._on_expiry = on_expiry
        # Kept, not looked up per call: asyncio.get_running_loop() costs a getpid() syscall each time.
        self._loop = loop
        self._due: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def set(self, delay_s: float) -> None:
        """The deadline is now `delay_s` from now (earlier or later than before)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        self._due = due
        timer = self._timer
        if timer is not None:
            if timer.when() <= due:
                return  # fires first and re-arms for the time left
            timer.cancel()
        self._timer = loop.call_at(due, self._fire)

    def clear(self) -> None:
        """No deadline for now; an armed timer stays and finds nothing to do when it fires."""
        self._due = None

    def cancel(self) -> None:
        """No deadline ever again (the connection is closing)."""
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        due = self._due
        if due is None:
            return
        loop = self._loop
        assert loop is not None  # set() ran before the timer existed
        if loop.time() < due:
            self._timer = loop.call_at(due, self._fire)
            return
        self._due = None
        self._on_expiry()
