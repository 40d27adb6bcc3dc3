"""Aggregation of repeated denials: identical denials within a window are written once, then counted.

Owns which denials count as the same (kind, principal, host, port, code, client address, method),
the window's timer, and the fields of the `repeated` line that summarises a window: the first
denial of a key in a window is written as usual, the rest are counted, and when the window ends
one `repeated` line per counted key says how many, so an agent cannot fill the disk by retrying.
Never writes a line itself (`AuditLog.write` does, through the callback it is given), never
holds more than `MAX_AGGREGATED_KEYS` keys (past that, denials are written as they come), and
never aggregates without a running loop (a one-shot command writes every line).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.observe import metrics

MAX_AGGREGATED_KEYS = 4096
DEFAULT_AGGREGATE_S = 10.0
# What a repeat's key holds, in this order (`AuditLog.decision` builds it from its arguments).
KEY_FIELDS = ("kind", "principal", "host", "port", "code", "client_ip", "method")
_AGGREGATED = metrics.AUDIT_AGGREGATED_LINES.labels()
_SUMMARY_FIELDS = ("kind", "principal", "host", "port", "code", "rule")


class DenialAggregator:
    """Counts denials identical to one already written in the current window (`window_s`, 0 is off)."""

    __slots__ = ("_repeats", "_timer", "_write", "window_s")

    def __init__(self, window_s: float, write: Callable[..., None]) -> None:
        self.window_s = window_s
        self._write = write
        self._repeats: dict[tuple[Any, ...], list[Any]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def counted(self, key: tuple[Any, ...]) -> bool:
        """True when a denial with `key` (the values of `KEY_FIELDS`) was already written in this
        window: it is counted instead."""
        entry = self._repeats.get(key)
        if entry is None:
            return False
        entry[1] += 1
        _AGGREGATED.value += 1
        return True

    def first(self, key: tuple[Any, ...], fields: dict[str, Any]) -> None:
        """A denial with `key` that is about to be written: its repeats in this window are counted."""
        if self.window_s <= 0 or len(self._repeats) >= MAX_AGGREGATED_KEYS:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._repeats[key] = [fields, 0]
        if self._timer is None:
            self._timer = loop.call_later(self.window_s, self._summarise)

    def _summarise(self) -> None:
        self._timer = None
        repeats, self._repeats = self._repeats, {}
        for fields, count in repeats.values():
            if count:
                summary = {name: fields.get(name) for name in _SUMMARY_FIELDS}
                self._write(
                    "repeated",
                    **summary,
                    decision="deny",
                    client_ip=fields.get("client_ip"),
                    reason=fields.get("reason"),
                    count=count,
                    window_s=self.window_s,
                )

    def close(self) -> None:
        """Ends the window now (shutdown): its `repeated` lines are written before the log closes."""
        if self._timer is not None:
            self._timer.cancel()
            self._summarise()
