"""Search engines played back in process, for the aggregator's unit tests.

Owns a transport that answers each engine host from a queue of prepared replies (saved result
pages from tests/fixtures/serp, bare statuses, or errors) and records what was asked, an in-memory
cache, a sleep that only records its delays, and the aggregator built on them with a fixed clock.
No socket is opened; the end-to-end tests over real sockets live in tests/integration. No tests
live here.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

from gateway.errors import GatewayError
from gateway.tools.search.aggregate import SearchAggregator
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.registry import ConfiguredEngine, engines_from_settings
from gateway.tools.search.transport import EngineReply, EngineRequest, make_reply

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "serp"


NOW_S = 1_780_000_000.0


Answer = EngineReply | GatewayError


def page(name: str, status: int = 200, **headers: str) -> EngineReply:
    kind = "application/json" if name.endswith(".json") else "text/html"
    return make_reply(status, {"content-type": kind, **headers}, (FIXTURES / name).read_bytes(), "")


def status_only(status: int, **headers: str) -> EngineReply:
    return make_reply(status, {k.replace("_", "-"): v for k, v in headers.items()}, b"", "")


class ScriptedTransport:
    """Answers each host from its queue of prepared replies and records what was asked."""

    def __init__(self, script: dict[str, list[Answer]]) -> None:
        self.script = {host: deque(answers) for host, answers in script.items()}
        self.asked: list[EngineRequest] = []

    async def __call__(self, request: EngineRequest, *, deadline_s: float) -> EngineReply:
        assert deadline_s > 0
        self.asked.append(request)
        host = urlsplit(request.url).hostname or ""
        answer = self.script[host].popleft()
        if isinstance(answer, GatewayError):
            raise answer
        return answer

    @property
    def hosts(self) -> list[str]:
        return [urlsplit(r.url).hostname or "" for r in self.asked]


class MemoryCache:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[bytes, float]] = {}

    async def get(self, key: str) -> bytes | None:
        entry = self.entries.get(key)
        return entry[0] if entry else None

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        self.entries[key] = (value, ttl_s)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)


def aggregator(
    engines: tuple[ConfiguredEngine, ...],
    transport: ScriptedTransport,
    cache: MemoryCache | None = None,
    sleeps: Sleeps | None = None,
) -> SearchAggregator:
    return SearchAggregator(
        engines,
        transport,
        cache or MemoryCache(),
        sleep=sleeps or Sleeps(),
        wall_clock=lambda: NOW_S,
    )


FREE = engines_from_settings(["duckduckgo", "bing", "brave"])


QUERY = SearchQuery("python asyncio")
DDG, BING, BRAVE = "html.duckduckgo.com", "www.bing.com", "search.brave.com"
