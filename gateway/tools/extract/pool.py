"""Turns a response body into page text off the event loop, so proxy tunnels keep flowing.

Owns the CPU-heavy part of web_fetch: decoding (charset detection included), bot-challenge
detection and HTML → markdown. Large bodies go to a small process pool (a native parse of 2 MiB
holds the GIL for tens of milliseconds, which a thread would not hide); small ones are handled
inline because the round trip would cost more than the work. The body crosses the process
boundary as bytes, not as a decoded str: pickling 2 MiB of text holds the GIL for ~10 ms in the
sending thread, copying bytes does not. Refusals come back as values (a GatewayError does not
survive pickling). Never touches the network.

Starting the pool is kept off the event loop too: spawning a worker (resource tracker, fork+exec,
pickled preparation data, the manager thread, first imports) held the loop for 7-10 ms, and
ProcessPoolExecutor spawns a worker inside submit() whenever none is idle, so two fetches at once
spawned the second worker on the loop mid-fetch. All workers are started together in a thread,
and run at a lower CPU priority so a conversion yields the core to the loop's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError
from gateway.tasks import spawn
from gateway.tools.extract.challenge import detect_challenge
from gateway.tools.extract.decode import decode_body
from gateway.tools.extract.markdown import Link, html_to_markdown
from gateway.tools.extract.render_options import DEFAULT_RENDER_OPTIONS, RenderOptions

INLINE_MAX_BYTES = 32 * 1024
POOL_WORKERS = 2
# Conversion is batch work: on a small machine (2 cores) the loop's process must win the CPU when
# both are runnable, or a tunnel waits for the scheduler while a page converts.
WORKER_NICE = 10


@dataclass(frozen=True, slots=True)
class RenderedPage:
    """A body as page text, or the refusal (code, message) that stops it."""

    text: str = ""
    title: str = ""
    content_type: str = ""
    links: tuple[Link, ...] = ()
    source_truncated: bool = False
    challenge: str | None = None
    refusal: tuple[ErrorCode, str] | None = None

    def raise_refusal(self) -> None:
        if self.refusal is not None:
            raise GatewayError(*self.refusal)


def render_page(
    body: bytes,
    content_type: str | None,
    status: int,
    headers: Mapping[str, str],
    base_url: str,
    *,
    max_chars: int,
    convert_html: bool,
    options: RenderOptions = DEFAULT_RENDER_OPTIONS,
) -> RenderedPage:
    """Decode, look for a bot challenge, and convert HTML to markdown (pure; runs in a worker)."""
    try:
        try:
            decoded = decode_body(body, content_type)
        except GatewayError:
            if status < 400:
                raise
            # An error page we cannot read is still an error status, not a content problem.
            decoded = decode_body(b"", "text/plain")
        challenge = detect_challenge(status, headers, decoded.text if decoded.kind == "html" else "")
        if challenge is not None:
            return RenderedPage(challenge=challenge)
        if decoded.kind == "html" and convert_html:
            extraction = html_to_markdown(decoded.text, base_url, max_chars=max_chars, options=options)
            return RenderedPage(
                extraction.markdown,
                extraction.title,
                decoded.content_type,
                extraction.links,
                extraction.source_truncated,
            )
        text = decoded.text
        return RenderedPage(text[:max_chars], "", decoded.content_type, (), len(text) > max_chars)
    except GatewayError as exc:
        return RenderedPage(refusal=(exc.code, exc.message))


def _init_worker() -> None:
    # No nice() on this platform, or not permitted: the worker runs at normal priority.
    with contextlib.suppress(AttributeError, OSError):
        os.nice(WORKER_NICE)


def _worker_ready() -> int:
    """A no-op whose import of this module also loads the converter in the worker."""
    return os.getpid()


class ExtractionPool:
    def __init__(self, workers: int = POOL_WORKERS) -> None:
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False
        # Guards _pool between the start thread and close() on the loop.
        self._lock = threading.Lock()
        self._ready: asyncio.Task[ProcessPoolExecutor] | None = None

    def _start_blocking(self) -> ProcessPoolExecutor:
        """Create the pool and start every worker (blocking: run it in a thread, never on the loop)."""
        with self._lock:
            if self._closed:
                raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
            if self._pool is None:
                # spawn, not fork: a forked child would inherit the event loop and open sockets.
                self._pool = ProcessPoolExecutor(
                    self._workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker
                )
            pool = self._pool
        # With spawn, each submit() starts a worker when none is idle: submitting one no-op per
        # worker before any can finish starts them all now, so no later submit() spawns one.
        try:
            for ready in [pool.submit(_worker_ready) for _ in range(self._workers)]:
                ready.result()
        except RuntimeError:
            if not self._closed:  # BrokenProcessPool (a worker died starting) is a RuntimeError too
                raise
            # close() shut the pool down while it was starting.
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down") from None
        return pool

    async def start(self) -> None:
        """Start the workers off the loop; the first large page awaits this if no one called it."""
        await self._executor()

    async def _executor(self) -> ProcessPoolExecutor:
        if self._closed:
            raise GatewayError(ErrorCode.UNAVAILABLE, "the gateway is shutting down")
        ready = self._ready
        if ready is not None and ready.done() and not ready.cancelled() and ready.exception() is None:
            return ready.result()
        if ready is None or ready.done():  # never started, or the last start failed: try again
            # One start shared by concurrent first callers.
            ready = self._ready = spawn(asyncio.to_thread(self._start_blocking), name="extraction-pool-start")
        # Shielded: a caller's deadline must not abandon a start that other callers share.
        return await asyncio.shield(ready)

    async def render(
        self,
        body: bytes,
        content_type: str | None,
        status: int,
        headers: Mapping[str, str],
        base_url: str,
        *,
        max_chars: int,
        convert_html: bool,
        options: RenderOptions = DEFAULT_RENDER_OPTIONS,
    ) -> RenderedPage:
        if len(body) <= INLINE_MAX_BYTES:
            return render_page(
                body, content_type, status, headers, base_url, max_chars=max_chars, convert_html=convert_html,
                options=options,
            )  # fmt: skip
        loop = asyncio.get_running_loop()
        work = functools.partial(
            render_page, body, content_type, status, dict(headers), base_url, max_chars=max_chars,
            convert_html=convert_html, options=options,
        )  # fmt: skip
        pool = await self._executor()
        return await loop.run_in_executor(pool, work)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
