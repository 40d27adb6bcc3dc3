"""Owned background tasks.

An unreferenced asyncio task can be garbage-collected mid-flight, so every task the gateway starts
goes through `spawn`, which names it and keeps a strong reference until it finishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_LIVE_TASKS: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    task = asyncio.create_task(coro, name=name)
    _LIVE_TASKS.add(task)
    task.add_done_callback(_LIVE_TASKS.discard)
    return task


def live_task_count() -> int:
    return len(_LIVE_TASKS)
