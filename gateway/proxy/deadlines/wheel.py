"""One coarse timer for the deadlines of every proxy connection: a deadline wheel and its entries.

Owns how the proxy waits for time: a connection keeps one `LazyDeadline` entry, and every entry of
a listener sits in one `DeadlineWheel`, slots of `TICK_S` each, with one loop timer armed for the
earliest slot. Filing an entry is a set insertion; moving a deadline later only records it (the
slot it sits in, when due, finds the new time and files it again), so a connection that is set,
moved and cleared on every request arms no timer of its own, and a tunnel setup arms none. A
deadline fires in the slot after it passes: at most `TICK_S` late, never early.

Never decides what a deadline means (the owner's callback asks its sans-I/O state object,
`limits.py`), never reads a socket.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

# The proxy's shortest limits are whole seconds or a few tenths of one: 50 ms late is nothing to
# them, and it bounds the wheel's wake-ups to 20 a second however many connections are open.
TICK_S = 0.05
_SLOTS_PER_S = 1 / TICK_S
_TICKING = -1


class DeadlineWheel:
    """The listener's deadlines, filed by slot, behind one loop timer."""

    __slots__ = ("_heap", "_loop", "_slots", "_timer", "_timer_slot")

    def __init__(self) -> None:
        self._slots: dict[int, set[LazyDeadline]] = {}
        self._heap: list[int] = []  # slot numbers that have (or had) a set in `_slots`
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot: int | None = None

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._slots.values())

    def file(self, entry: LazyDeadline, slot: int) -> None:
        entries = self._slots.get(slot)
        if entries is None:
            entries = self._slots[slot] = set()
            heapq.heappush(self._heap, slot)
            if self._timer_slot is None or slot < self._timer_slot:
                self._arm(slot)
        entries.add(entry)

    def unfile(self, entry: LazyDeadline, slot: int) -> None:
        entries = self._slots.get(slot)
        if entries is not None:
            entries.discard(entry)

    def expire(self, now: float) -> None:
        """Fire every entry whose deadline has passed by `now`; file again those moved later."""
        ready = now * _SLOTS_PER_S
        heap = self._heap
        slots = self._slots
        while heap and heap[0] <= ready:
            entries = slots.pop(heapq.heappop(heap), None)
            if not entries:
                continue
            # Detached from `_slots`: a callback that moves or cancels another entry of this slot
            # cannot change the set being walked (the entry's own state says what is left to do).
            for entry in entries:
                entry.slot = None
                due = entry.due
                if due is None:
                    continue
                if due > now:
                    entry.set_at(due)
                    continue
                entry.due = None
                # One connection's failure must not stall the deadlines of the others.
                try:
                    entry.on_expiry()
                except Exception as exc:
                    self._loop_or_running().call_exception_handler(
                        {"message": "deadline callback failed", "exception": exc}
                    )

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_slot = None
        self._slots.clear()
        self._heap.clear()

    def _loop_or_running(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            # Kept, not looked up per call: asyncio.get_running_loop() costs a getpid() each time.
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = slot * TICK_S - time.monotonic()
        self._timer = self._loop_or_running().call_later(delay if delay > 0 else 0, self._tick)
        self._timer_slot = slot

    def _tick(self) -> None:
        self._timer = None
        # No slot compares below this: entries filed by the callbacks below arm nothing, the
        # timer is armed once after them.
        self._timer_slot = _TICKING
        self.expire(time.monotonic())
        self._timer_slot = None
        heap, slots = self._heap, self._slots
        while heap and not slots.get(heap[0]):
            slots.pop(heapq.heappop(heap), None)
        if heap:
            # The loop's clock may run a little behind time.monotonic(): a slot not yet due is
            # armed again rather than fired early.
            self._arm(heap[0])


class LazyDeadline:
    """A connection's one deadline: calls `on_expiry` once it passes, unless cleared or moved on.

    Times are `time.monotonic()` seconds."""

    __slots__ = ("due", "on_expiry", "slot", "wheel")

    def __init__(self, on_expiry: Callable[[], None], wheel: DeadlineWheel) -> None:
        self.on_expiry = on_expiry
        self.wheel = wheel
        self.due: float | None = None
        self.slot: int | None = None  # the wheel slot this entry is filed in

    def set(self, delay_s: float) -> None:
        """The deadline is now `delay_s` from now (earlier or later than before)."""
        self.set_at(time.monotonic() + delay_s)

    def set_at(self, at: float | None) -> None:
        """The deadline is now `at` (None: no deadline for now)."""
        self.due = at
        if at is None:
            return
        slot = int(at * _SLOTS_PER_S) + 1
        filed = self.slot
        if filed is not None:
            if filed <= slot:
                return  # its slot comes first and files it again for the time left
            self.wheel.unfile(self, filed)
        self.slot = slot
        self.wheel.file(self, slot)

    def clear(self) -> None:
        """No deadline for now; the entry stays filed and finds nothing to do when its slot comes."""
        self.due = None

    def cancel(self) -> None:
        """No deadline ever again (the connection is closing): the wheel lets go of it."""
        self.due = None
        if self.slot is not None:
            self.wheel.unfile(self, self.slot)
            self.slot = None

    def release(self) -> None:
        """`cancel`, and let go of the owner's callback: the owner is gone. The callback (a bound
        method) and the owner's reference to this entry form a cycle, which only the garbage
        collector would free; broken here, the connection is freed as soon as it is dropped."""
        self.cancel()
        self.on_expiry = _no_expiry


def _no_expiry() -> None:
    return None
