"""Runs HTML → markdown off the event loop, so proxy tunnels keep flowing during a conversion.

Large pages go to a small process pool (a native parse of 2 MiB holds the GIL for tens of
milliseconds, which a thread would not hide); small pages are converted inline because the
round trip would cost more than the work.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from gateway.tools.markdown import Extraction, html_to_markdown

INLINE_MAX_CHARS = 32 * 1024
POOL_WORKERS = 2


class ExtractionPool:
    def __init__(self, workers: int = POOL_WORKERS) -> None:
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: a forked child would inherit the event loop and open sockets.
            self._pool = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    async def to_markdown(self, html: str, base_url: str, *, max_chars: int) -> Extraction:
        if len(html) <= INLINE_MAX_CHARS:
            return html_to_markdown(html, base_url, max_chars=max_chars)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), _convert, html, base_url, max_chars)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _convert(html: str, base_url: str, max_chars: int) -> Extraction:
    return html_to_markdown(html, base_url, max_chars=max_chars)
