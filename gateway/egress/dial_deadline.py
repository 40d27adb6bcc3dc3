"""The per-attempt timeout of a pinned dial: the protocol a caller's own timer implements, and a loop timer.

`open_pinned_connection` bounds each address it tries by `timeout_s` through a `DialDeadline`.
A caller that already keeps a deadline for the connection being served (the proxy: one entry per
client connection on its listener's deadline wheel) passes itself and no timer is armed per dial;
any other caller gets `LoopTimerDeadline`, one loop timer per attempt. Either way, when an attempt's
time passes, the dialing task is cancelled and `dial_timed_out` says the cancellation was the deadline's.
The deadline also names that task, so the dialer does not look it up (a getpid() per dial on 3.11).

Never dials, never decides what a timeout means to the caller (the dialer turns it into
`connect_failure`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class DialDeadline(Protocol):
    """Bounds one attempt at a time of the dialing task."""

    @property
    def dialing_task(self) -> asyncio.Task[Any]:
        """The task that dials, which a passed deadline cancels (the dialer's own: given here, it
        is not looked up, which costs a getpid() on Python 3.11)."""
        ...

    @property
    def dial_timed_out(self) -> bool:
        """True once the attempt started last passed its time (and the dialing task was cancelled)."""
        ...

    def start_dial_attempt(self, timeout_s: float) -> None:
        """An attempt starts now: cancel the dialing task if it is still running `timeout_s` later."""
        ...

    def end_dial_attempt(self) -> None:
        """The attempt ended (connected, failed or cancelled): nothing is due any more."""
        ...


class LoopTimerDeadline:
    """A `DialDeadline` for callers without a timer of their own: one loop timer per attempt."""

    __slots__ = ("_timer", "dial_timed_out", "dialing_task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.dialing_task = task
        self._timer: asyncio.TimerHandle | None = None
        self.dial_timed_out = False

    def start_dial_attempt(self, timeout_s: float) -> None:
        self.dial_timed_out = False
        self._timer = self.dialing_task.get_loop().call_later(timeout_s, self._expire)

    def end_dial_attempt(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self.dial_timed_out = True
        self.dialing_task.cancel()
