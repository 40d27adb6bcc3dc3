"""The per-attempt timeout of a pinned dial: the protocol a caller's own timer implements, and a loop timer.

`PinnedDial` bounds each address it tries by `timeout_s` through a `DialDeadline`. A caller that
already keeps a deadline for the connection being served (the proxy: one entry per client
connection on its listener's deadline wheel) passes itself and no timer is armed per dial; any
other caller gets `LoopTimerDeadline`, one loop timer per attempt. Either way, when an attempt's
time passes, the deadline calls the dial's `attempt_timed_out`, which ends that attempt as
timed out and goes on to the next address.

Never dials, never decides what a timeout means to the caller (the dialer turns it into
`connect_failure`).
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class TimedDial(Protocol):
    """What a deadline ends when an attempt's time passes (`connect.PinnedDial`)."""

    def attempt_timed_out(self) -> None: ...


class DialDeadline(Protocol):
    """Bounds one attempt at a time of a dial."""

    def start_dial_attempt(self, timeout_s: float) -> None:
        """An attempt starts now: call the dial's `attempt_timed_out` if it still runs `timeout_s` later."""
        ...

    def end_dial_attempt(self) -> None:
        """The attempt ended (connected, failed or cancelled): nothing is due any more."""
        ...


class LoopTimerDeadline:
    """A `DialDeadline` for callers without a timer of their own: one loop timer per attempt."""

    __slots__ = ("_dial", "_loop", "_timer")

    def __init__(self, dial: TimedDial, loop: asyncio.AbstractEventLoop) -> None:
        self._dial: TimedDial | None = dial
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None

    def start_dial_attempt(self, timeout_s: float) -> None:
        self._timer = self._loop.call_later(timeout_s, self._expire)

    def end_dial_attempt(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def release(self) -> None:
        """The dial is over: let go of it (it holds this deadline, a cycle otherwise)."""
        self.end_dial_attempt()
        self._dial = None

    def _expire(self) -> None:
        self._timer = None
        if self._dial is not None:
            self._dial.attempt_timed_out()
