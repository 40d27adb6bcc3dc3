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


def spawn(coro: Coroutine[Any, Any, T], *, name: str, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Task[T]:
    """Start `coro` on `loop` (default: the running loop). A caller on a hot path passes the loop
    it holds: looking it up costs a getpid() syscall on Python 3.11."""
    task = (loop or asyncio.get_running_loop()).create_task(coro, name=name)
    _LIVE_TASKS.add(task)
    task.add_done_callback(_LIVE_TASKS.discard)
    return task
