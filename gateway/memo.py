"""A bounded memo: a dict that forgets everything at once when it reaches its size.

Owns the one "clear the cache when full" rule the decision caches share: agents reuse few hosts,
so a full memo is rare and starting over is cheaper (and simpler to reason about) than an LRU
on every hit. Holds values only; never decides what may be remembered (a denial never is: the
callers only put allowed outcomes here).
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(dict[K, V]):
    """`put` stores a value, first clearing the memo when it already holds `max_entries`."""

    __slots__ = ("max_entries",)

    def __init__(self, max_entries: int) -> None:
        super().__init__()
        self.max_entries = max_entries

    def put(self, key: K, value: V) -> V:
        if len(self) >= self.max_entries:
            self.clear()
        self[key] = value
        return value
