"""Turns a response body into page text off the event loop, so proxy tunnels keep flowing.

Owns the CPU-heavy part of web_fetch: decoding (charset detection included), bot-challenge
detection and HTML → markdown. Large bodies go to a small process pool (a native parse of 2 MiB
holds the GIL for tens of milliseconds, which a thread would not hide); small ones are handled
inline because the round trip would cost more than the work. The body crosses the process
boundary as bytes, not as a decoded str: pickling 2 MiB of text holds the GIL for ~10 ms in the
sending thread, copying bytes does not. Refusals come back as values (a GatewayError does not
survive pickling). Never touches the network.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from gateway.errors import ErrorCode, GatewayError
from gateway.tools.challenge import detect_challenge
from gateway.tools.decode import decode_body
from gateway.tools.markdown import Link, html_to_markdown

INLINE_MAX_BYTES = 32 * 1024
POOL_WORKERS = 2


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
            extraction = html_to_markdown(decoded.text, base_url, max_chars=max_chars)
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


class ExtractionPool:
    def __init__(self, workers: int = POOL_WORKERS) -> None:
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: a forked child would inherit the event loop and open sockets.
            self._pool = ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

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
    ) -> RenderedPage:
        if len(body) <= INLINE_MAX_BYTES:
            return render_page(
                body, content_type, status, headers, base_url, max_chars=max_chars, convert_html=convert_html
            )
        loop = asyncio.get_running_loop()
        work = functools.partial(
            render_page, body, content_type, status, dict(headers), base_url, max_chars=max_chars,
            convert_html=convert_html,
        )  # fmt: skip
        return await loop.run_in_executor(self._executor(), work)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
