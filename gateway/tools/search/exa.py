"""Exa's search API (`POST api.exa.ai/search`, `x-api-key`), asked and read.

Owns the JSON body (numResults, includeDomains for the site, startPublishedDate for the time range,
userLocation from the region, highlights as snippets) and the reading of
`results[].{title,url,highlights|text}`. Exa takes absolute dates, hence `today`. Pure; never
opens a socket.
"""

from __future__ import annotations

import datetime as dt

import orjson

from gateway.tools.search.engine import (
    API_USER_AGENT,
    EngineOutcome,
    EngineSpec,
    days_for,
    rows_from_results_array,
)
from gateway.tools.search.query import SearchQuery
from gateway.tools.search.transport import EngineReply, EngineRequest

NAME = "exa"
DEFAULT_URL = "https://api.exa.ai/search"
SNIPPET_CHARS = 400


def build_request(query: SearchQuery, key: str | None, base_url: str, *, today: dt.date) -> EngineRequest:
    body: dict[str, object] = {
        "query": query.query,
        "type": "auto",
        "numResults": query.max_results,
        "contents": {"highlights": {"maxCharacters": SNIPPET_CHARS}},
    }
    if query.site:
        body["includeDomains"] = [query.site]
    if query.time_range:
        start = today - dt.timedelta(days=days_for(query.time_range))
        body["startPublishedDate"] = f"{start.isoformat()}T00:00:00.000Z"
    if query.region and not query.region.startswith("wt-"):
        body["userLocation"] = query.region.split("-")[0].upper()
    headers = (
        ("x-api-key", key or ""),
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
        ("User-Agent", API_USER_AGENT),
    )
    return EngineRequest("POST", base_url, headers, orjson.dumps(body))


def _snippet(item: dict[str, object]) -> str:
    highlights = item.get("highlights")
    if isinstance(highlights, list) and highlights:
        return " … ".join(str(h) for h in highlights if h)
    text = item.get("text") or item.get("summary") or ""
    return str(text)[:SNIPPET_CHARS]


def parse(reply: EngineReply) -> EngineOutcome:
    return rows_from_results_array(reply, _snippet)


ENGINE = EngineSpec(
    name=NAME,
    tier="keyed",
    needs_key=True,
    default_url=DEFAULT_URL,
    build_request=build_request,
    parse=parse,
)
