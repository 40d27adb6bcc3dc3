"""The engine contract: what every engine module exports and what its parser may conclude.

An engine is a value (`EngineSpec`) holding a pure request builder and a pure parser. The parser
turns one `EngineReply` into an `EngineOutcome` that keeps apart the shapes the aggregator must
treat differently: rows, an explicit no-results page, a challenge (status codes lie: 202 and 200
challenge pages exist), a refusal by HTTP status, and a page it does not recognise. Also owns the
small readers every engine shares (JSON loading, element text). Never opens a socket.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

if TYPE_CHECKING:
    from selectolax.lexbor import LexborNode

Tier = Literal["keyed", "free", "configured"]
OutcomeKind = Literal["results", "no_results", "challenge", "refused", "unrecognised"]

# A text-mode browser: DuckDuckGo's no-JS page is made for it, and it is honest about being no
# full browser. Engines reject library default agents (curl, aiohttp) outright.
TEXT_BROWSER_USER_AGENT = "Lynx/2.9.0dev.12 libwww-FM/2.14 SSL-MM/1.4.1 OpenSSL/3.0.13"
# Wikimedia's policy asks API clients for a descriptive agent with a contact.
API_USER_AGENT = "egress-gateway/0.1 (+https://github.com/egress-gateway; web_search tool)"


@dataclass(frozen=True, slots=True)
class RawRow:
    """One row as the engine presented it, before normalisation."""

    title: str
    url: str
    snippet: str = ""
    sponsored: bool = False


@dataclass(frozen=True, slots=True)
class EngineOutcome:
    """What one reply says. `detail` is a short reason for attempts and errors, never page text."""

    kind: OutcomeKind
    rows: tuple[RawRow, ...] = ()
    detail: str = ""
    status: int | None = None

    @classmethod
    def results(cls, rows: list[RawRow]) -> EngineOutcome:
        return cls("results", tuple(rows))

    @classmethod
    def no_results(cls, detail: str = "no results page") -> EngineOutcome:
        return cls("no_results", detail=detail)

    @classmethod
    def challenge(cls, detail: str) -> EngineOutcome:
        return cls("challenge", detail=detail)

    @classmethod
    def refused(cls, status: int, detail: str = "") -> EngineOutcome:
        return cls("refused", detail=detail or f"HTTP {status}", status=status)

    @classmethod
    def unrecognised(cls, detail: str) -> EngineOutcome:
        return cls("unrecognised", detail=detail)


class RequestBuilder(Protocol):
    """Pure: same arguments, same request. `today` feeds engines that take absolute dates."""

    def __call__(self, query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest: ...


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One engine: name, tier, whether it needs a key, public address, builder and parser."""

    name: str
    tier: Tier
    needs_key: bool
    default_url: str
    build_request: RequestBuilder
    parse: Callable[[EngineReply], EngineOutcome]


def status_outcome(reply: EngineReply) -> EngineOutcome | None:
    """The outcome an HTTP error status implies on its own, or None for a 2xx/3xx answer."""
    if reply.status == 429:
        return EngineOutcome.challenge("HTTP 429")
    if reply.status >= 400:
        return EngineOutcome.refused(reply.status)
    return None


def load_json(reply: EngineReply) -> object | None:
    """The reply body as JSON, or None when it is not JSON at all."""
    try:
        data: object = orjson.loads(reply.body)
        return data
    except orjson.JSONDecodeError:
        return None


def rows_from_results_array(reply: EngineReply, snippet: Callable[[dict[str, Any]], str]) -> EngineOutcome:
    """Rows from the top-level `results` list of a JSON answer (Tavily, Exa, SearXNG), or the
    outcome when the reply failed or has no such list."""
    failed = status_outcome(reply)
    if failed is not None:
        return failed
    data = load_json(reply)
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        return EngineOutcome.unrecognised("no results array")
    return rows_from_items(data["results"], snippet, empty="empty results array")


def rows_from_items(items: list[object], snippet: Callable[[dict[str, Any]], str], *, empty: str) -> EngineOutcome:
    """Rows from JSON objects naming `url` and `title` (a missing title falls back to the host later)."""
    rows = [
        RawRow(title=str(item.get("title") or ""), url=str(item["url"]), snippet=snippet(item))
        for item in items
        if isinstance(item, dict) and item.get("url")
    ]
    return EngineOutcome.results(rows) if rows else EngineOutcome.no_results(empty)


def node_text(node: LexborNode | None) -> str:
    """An element's visible text with whitespace collapsed ("" for a missing element)."""
    if node is None:
        return ""
    return " ".join((node.text(deep=True) or "").split())


def days_for(time_range: str) -> int:
    """The length of a d/w/m/y window in days, for engines that want absolute dates."""
    return {"d": 1, "w": 7, "m": 31, "y": 365}[time_range]
